//! The sandbox operations of the public API: a tenant's definitions, and
//! ensuring, describing and destroying its sandboxes. A live sandbox's
//! processes and files are in `process.rs` and `files.rs`, saving its
//! checkpoint in `checkpoint.rs`.

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use shared::proto::v1 as api;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;

use super::lifecycle::Live;
use super::{Error, Lifecycle, definition, ensure_input};
use crate::lease::Leases;
use crate::provider;
use crate::provision::{InvalidField, Progress};
use crate::store::{Stores, Tenant};

/// An operation of a live sandbox that not every provider offers.
#[derive(Debug, Clone, Copy)]
pub(super) enum Optional {
    /// `ConnectPort`.
    Ports,
    /// `OpenTerminal`.
    Terminal,
}

/// An ensure's progress events, then exactly one `ready` or error.
pub type EnsureStream = BoxStream<'static, Result<api::EnsureSandboxResponse, Error>>;

/// Built from the stores, the leases, the lifecycle, and the server's task
/// set and shutdown signal (for the work a call leaves running). Cheap to
/// clone.
#[derive(Clone)]
pub struct Sandboxes {
    pub(super) stores: Stores,
    leases: Leases,
    pub(super) lifecycle: Lifecycle,
    /// Tasks that outlive the call that started them; shutdown waits for
    /// them before the stores close.
    tasks: TaskTracker,
    /// Ends the request-stream forwarders of `ExecStream` and `WriteFile`.
    shutdown: CancellationToken,
}

impl Sandboxes {
    pub fn new(
        stores: Stores,
        leases: Leases,
        lifecycle: Lifecycle,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self { stores, leases, lifecycle, tasks, shutdown }
    }

    /// Forward on the task set what the caller's `inbound` stream still
    /// sends, as `to_agent` maps it (`None`: nothing to send), into `tx`.
    /// Ends with the caller's stream (its end or first error), with the
    /// agent's (`tx` closed), or at shutdown.
    pub(super) fn forward<T, U, S>(
        &self,
        mut inbound: S,
        tx: mpsc::Sender<U>,
        to_agent: impl Fn(T) -> Option<U> + Send + 'static,
    ) where
        T: Send + 'static,
        U: Send + 'static,
        S: Stream<Item = Result<T, Status>> + Send + Unpin + 'static,
    {
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tx.closed() => return,
                    message = inbound.next() => match message {
                        Some(Ok(message)) => message,
                        Some(Err(_)) | None => return,
                    },
                };
                if let Some(request) = to_agent(message)
                    && tx.send(request).await.is_err()
                {
                    return;
                }
            }
        });
    }

    /// A connected agent for the tenant's sandbox `sandbox_id`.
    pub(super) async fn live(&self, tenant: &Tenant, sandbox_id: &str) -> Result<Live, Error> {
        self.lifecycle.agent(&self.stores, tenant, sandbox_id).await
    }

    /// As [`Sandboxes::live`], for an operation that both the sandbox's
    /// provider and its agent must offer (an older agent may not).
    pub(super) async fn live_for(
        &self,
        tenant: &Tenant,
        sandbox_id: &str,
        what: Optional,
    ) -> Result<Live, Error> {
        let live = self.live(tenant, sandbox_id).await?;
        let provider = live.capabilities;
        let agent = live.agent.handshake().capabilities.unwrap_or_default();
        let (capability, offered) = match what {
            Optional::Ports => ("ports", provider.ports && agent.ports),
            Optional::Terminal => ("terminal", provider.terminal && agent.pty),
        };
        if !offered {
            return Err(
                provider::Error::Unsupported { kind: live.provider, capability: capability.into() }.into()
            );
        }
        Ok(live)
    }

    /// Validate and store `definition` as the tenant's (replacing one of
    /// its id).
    pub async fn put_definition(
        &self,
        tenant: &Tenant,
        definition: Option<api::SandboxDefinition>,
    ) -> Result<api::SandboxDefinition, Error> {
        let mut definition =
            definition.ok_or_else(|| Error::from(InvalidField::new("definition", "required")))?;
        definition::settle(&mut definition)?;
        definition::validate(&definition)?;
        self.lifecycle.policy.check(&definition, tenant.as_str())?;
        let warm = super::warm::check(&definition, self.lifecycle.policy.settings().max_warm_per_definition)?;
        // What the host cannot make (gVisor where the engine has no runsc) is
        // refused now, not at the first ensure; a provider that is down
        // now is not (the ensure says so then).
        if let Some((kind, _)) = crate::provider::ProviderKind::of(&definition)
            && let Ok(provider) = self.lifecycle.providers.get(kind)
        {
            let spec = super::lifecycle::spec_for(&definition, "", tenant, &self.lifecycle.policy);
            provider.supports(&spec).await?;
        }
        self.stores.definitions.put(tenant, &definition.id, definition::to_stored(&definition)).await?;
        // The pool follows the definition: filled, resized, or emptied (a
        // changed definition's pooled sandboxes are replaced).
        self.stores.warm.set_pool(tenant, &definition.id, warm).await?;
        self.lifecycle.wake_keeper();
        Ok(definition)
    }

    pub async fn get_definition(&self, tenant: &Tenant, id: &str) -> Result<api::SandboxDefinition, Error> {
        let stored = self.stores.definitions.get(tenant, InvalidField::required("id", id)?).await?;
        definition::from_stored(&stored.body)
    }

    pub async fn list_definitions(&self, tenant: &Tenant) -> Result<Vec<api::SandboxDefinition>, Error> {
        let stored = self.stores.definitions.list(tenant).await?;
        stored.iter().map(|d| definition::from_stored(&d.body)).collect()
    }

    /// The tenant's warm pools.
    pub async fn warm_pools(&self, tenant: &Tenant) -> Result<Vec<api::WarmPool>, Error> {
        self.lifecycle.list_pools(&self.stores, tenant).await
    }

    pub async fn delete_definition(&self, tenant: &Tenant, id: &str) -> Result<(), Error> {
        if !self.stores.definitions.delete(tenant, InvalidField::required("id", id)?).await? {
            return Err(Error::DefinitionNotFound(id.to_string()));
        }
        self.stores.warm.set_pool(tenant, id, 0).await?;
        self.lifecycle.wake_keeper();
        Ok(())
    }

    /// Resume, restore or create the sandbox of the request's thread under
    /// the tenant's definition it names, with exactly the secrets that
    /// declares. The request is checked before this returns; the ensure
    /// itself runs on the task set, detached from the call: a client that
    /// leaves mid-ensure must not leave a half-made sandbox behind.
    pub async fn ensure(
        &self,
        tenant: Tenant,
        req: api::EnsureSandboxRequest,
    ) -> Result<EnsureStream, Error> {
        let input =
            ensure_input(&self.stores, tenant, &req.definition_id, req.thread_id, req.run_id, req.secrets)
                .await?;
        let (progress, outcome, rx) = Progress::channel();
        let (stores, leases, lifecycle) = (self.stores.clone(), self.leases.clone(), self.lifecycle.clone());
        self.tasks.spawn(async move {
            let last = lifecycle.ensure(&stores, &leases, input, &progress).await.map(|ready| {
                api::EnsureSandboxResponse { event: Some(api::ensure_sandbox_response::Event::Ready(ready)) }
            });
            let _ = outcome.send(last).await;
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }

    /// The tenant's sandbox `sandbox_id`, described.
    pub async fn get(&self, tenant: &Tenant, sandbox_id: &str) -> Result<api::Sandbox, Error> {
        let instance = self
            .lifecycle
            .instance(&self.stores, tenant, InvalidField::required("sandbox_id", sandbox_id)?)
            .await?;
        let definition = self.definition_of(tenant, &instance.definition_id).await?;
        let observed =
            self.lifecycle.observe(std::slice::from_ref(&instance)).await.pop().unwrap_or_default();
        Ok(api::Sandbox {
            secret_names: definition.as_ref().map(|d| d.secret_names.clone()).unwrap_or_default(),
            keep_alive_ms: keep_alive_of(definition.as_ref()),
            state: observed.state as i32,
            usage: observed.usage,
            ..self.lifecycle.describe(&instance)
        })
    }

    /// Set and unset variables of the tenant's sandbox for its later execs
    /// and runs. A secret of its definition is refused: secret values come
    /// with each call and are never stored.
    pub async fn set_env(&self, tenant: &Tenant, req: api::SetEnvRequest) -> Result<api::Sandbox, Error> {
        let key = InvalidField::required("sandbox_id", &req.sandbox_id)?;
        let instance = self.lifecycle.instance(&self.stores, tenant, key).await?;
        let secret_names = self.secret_names(tenant, &instance.definition_id).await?;
        let named = req.set.keys().map(|k| ("set", k)).chain(req.unset.iter().map(|k| ("unset", k)));
        for (field, name) in named {
            if !crate::provision::valid_env_name(name) {
                return Err(InvalidField::new(format!("{field}[{name}]"), "not a valid variable name").into());
            }
            if secret_names.contains(name) {
                return Err(InvalidField::new(
                    format!("{field}[{name}]"),
                    "a secret of the sandbox's definition: its value comes with each call and is never stored",
                )
                .into());
            }
        }
        let mut env = instance.env;
        env.extend(req.set);
        for name in &req.unset {
            env.remove(name);
        }
        let instance = self.stores.instances.set_env(key, &env).await?;
        Ok(api::Sandbox { secret_names, ..self.lifecycle.describe(&instance) })
    }

    /// The tenant's definition `id`, `None` once it was deleted.
    async fn definition_of(
        &self,
        tenant: &Tenant,
        id: &str,
    ) -> Result<Option<api::SandboxDefinition>, Error> {
        match self.stores.definitions.get(tenant, id).await {
            Ok(stored) => Ok(Some(definition::from_stored(&stored.body)?)),
            Err(crate::store::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The secret names of the tenant's definition `id` (none once it was
    /// deleted).
    async fn secret_names(&self, tenant: &Tenant, id: &str) -> Result<Vec<String>, Error> {
        Ok(self.definition_of(tenant, id).await?.map(|d| d.secret_names).unwrap_or_default())
    }

    /// The tenant's sandboxes, of `thread_id` only unless it is empty; with
    /// `with_state`, what their providers say of them too.
    pub async fn list(
        &self,
        tenant: &Tenant,
        thread_id: &str,
        with_state: bool,
    ) -> Result<Vec<api::Sandbox>, Error> {
        let instances: Vec<_> = self
            .stores
            .instances
            .list(Some(tenant))
            .await?
            .into_iter()
            .filter(|i| thread_id.is_empty() || i.thread_id == thread_id)
            .collect();
        // Only the definitions these sandboxes name, each read once.
        let mut definitions = std::collections::HashMap::new();
        for i in &instances {
            if !definitions.contains_key(&i.definition_id) {
                let definition = self.definition_of(tenant, &i.definition_id).await?;
                definitions.insert(i.definition_id.clone(), definition);
            }
        }
        let observed = if with_state {
            self.lifecycle.observe(&instances).await
        } else {
            vec![Default::default(); instances.len()]
        };
        Ok(instances
            .iter()
            .zip(observed)
            .map(|(i, observed)| api::Sandbox {
                keep_alive_ms: keep_alive_of(definitions.get(&i.definition_id).and_then(Option::as_ref)),
                state: observed.state as i32,
                usage: observed.usage,
                ..self.lifecycle.describe(i)
            })
            .collect())
    }

    pub async fn destroy(&self, tenant: &Tenant, sandbox_id: &str) -> Result<(), Error> {
        let key = InvalidField::required("sandbox_id", sandbox_id)?;
        self.lifecycle.destroy(&self.stores, &self.leases, tenant, key).await
    }
}

/// A definition's keep-alive; `None` for a definition that is gone.
fn keep_alive_of(definition: Option<&api::SandboxDefinition>) -> Option<u64> {
    definition.map(|d| d.lifecycle.as_ref().map(|l| l.keep_alive_ms).unwrap_or(0))
}
