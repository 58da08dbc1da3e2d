//! Ensuring a sandbox: resume → restore the native snapshot → create and
//! provision, under a lease on the sandbox key; and the sandboxes this
//! replica has live agents for.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shared::proto::v1 as api;
use shared::proto::v1::{EnsureOutcome, EnsurePhase};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, warn};

use super::Error;
use super::key::{KeyInput, sandbox_key};
use super::policy::OperatorPolicy;
use super::quota::SandboxQuota;
use super::warm_held::WarmPools;
use crate::agent::AgentClient;
use crate::egress::{EgressLimits, Limits};
use crate::lease::Leases;
use crate::provider::{Provider, ProviderKind, SandboxSpec, Snapshot};
use crate::provision::Progress;
use crate::provision::{InvalidField, ProvisionContext, Provisioner, Secrets};
use crate::store::{self, Instance, NewInstance, Stores, Tenant, Timestamp};

/// How long a resumed or created sandbox's agent may take to answer.
const AGENT_DEADLINE: Duration = Duration::from_secs(60);

/// The providers this server can use, by kind, and why the others are off
/// (so a request for one says what to fix, not only "see the log").
#[derive(Debug, Clone, Default)]
pub struct Providers(HashMap<ProviderKind, Arc<dyn Provider>>, HashMap<ProviderKind, String>);

impl Providers {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, provider: Arc<dyn Provider>) -> Self {
        self.0.insert(provider.kind(), provider);
        self
    }

    /// Record why `kind` is off.
    pub fn without(mut self, kind: ProviderKind, reason: impl Into<String>) -> Self {
        self.1.insert(kind, reason.into());
        self
    }

    pub fn get(&self, kind: ProviderKind) -> Result<&Arc<dyn Provider>, Error> {
        self.0.get(&kind).ok_or_else(|| {
            let why = self.1.get(&kind).map(String::as_str).unwrap_or("see the server's startup log");
            Error::ProviderOff { kind, why: why.to_string() }
        })
    }

    /// Every provider of this server.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.0.values()
    }

    pub fn by_name(&self, name: &str) -> Result<&Arc<dyn Provider>, Error> {
        match ProviderKind::named(name) {
            Some(kind) => self.get(kind),
            None => Err(Error::UnknownProvider(name.to_string())),
        }
    }
}

/// A sandbox this replica holds a connected agent for. The secrets of its
/// last ensure live here (memory only) so later calls run with them.
#[derive(Clone)]
pub(crate) struct Live {
    pub agent: AgentClient,
    pub secrets: Arc<Secrets>,
    pub provider: ProviderKind,
    /// The node it lives on (`""`: this server's own providers).
    pub node: String,
    /// What its provider can do.
    pub capabilities: crate::provider::Capabilities,
    /// Where its agent answers, its token, id and runtime, as the provider
    /// last said.
    pub sandbox: crate::provider::Sandbox,
    pub keep_alive: Duration,
    pub last_used: Instant,
    /// The sandbox's `SetEnv` variables, as last read from its record
    /// ([`Lifecycle::agent`] refreshes them on every call).
    pub env: BTreeMap<String, String>,
    /// Secrets only the agent holds (model keys): never in a process's
    /// environment.
    pub withheld: Arc<BTreeSet<String>>,
}

impl Live {
    /// The secrets a process in the sandbox may be given.
    pub fn process_secrets(&self) -> impl Iterator<Item = (&String, &shared::secret::Secret)> {
        self.secrets.iter().filter(|(name, _)| !self.withheld.contains(*name))
    }
}

/// Times an ensure starts again after its sandbox lease lapsed.
const LEASE_LAPSES: u32 = 3;

/// What an ensure was asked for, validated.
pub struct EnsureInput {
    pub tenant: Tenant,
    pub definition: api::SandboxDefinition,
    pub thread_id: String,
    pub run_id: String,
    pub secrets: Secrets,
}

/// Everything the lifecycle needs. Cheap to clone.
#[derive(Clone)]
pub struct Lifecycle {
    pub(crate) providers: Providers,
    /// What tenants' definitions may ask for; checked again at every
    /// ensure (a stored definition may predate a stricter policy).
    pub(crate) policy: OperatorPolicy,
    /// How many sandboxes one tenant may hold.
    pub(super) quota: SandboxQuota,
    /// How large a portable snapshot's file, and a snapshot, may be.
    snapshot_limits: crate::config::SnapshotLimits,
    /// Harness CLIs runs find on their `PATH` (`sandhold harness install`).
    pub(crate) toolchains: Option<crate::toolchain::Toolchains>,
    pub(super) provisioner: Arc<dyn Provisioner>,
    live: Arc<Mutex<HashMap<String, Live>>>,
    /// The warm pools' sandboxes this replica made, and their keeper.
    pub(super) warm: WarmPools,
    /// The egress connections this server's sandboxes hold open, within
    /// the policy's limits.
    egress: EgressLimits,
    /// The fleet's nodes, once the stores are open; `None`: every sandbox
    /// is on this server's own providers.
    pub(super) fleet: Option<crate::node::Fleet>,
}

impl Lifecycle {
    /// Under the built-in policy of a single-user server; a server with a
    /// configuration sets its own with [`with_policy`](Self::with_policy).
    pub fn new(providers: Providers, provisioner: Arc<dyn Provisioner>) -> Self {
        let policy = OperatorPolicy::default();
        Self {
            providers,
            egress: egress_limits(&policy),
            policy,
            quota: SandboxQuota::default(),
            snapshot_limits: Default::default(),
            toolchains: None,
            provisioner,
            live: Arc::default(),
            warm: WarmPools::default(),
            fleet: None,
        }
    }

    /// Sandboxes may live on the nodes of `fleet`.
    pub fn with_fleet(mut self, fleet: crate::node::Fleet) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// The fleet's nodes.
    pub fn fleet(&self) -> Result<&crate::node::Fleet, crate::node::Error> {
        self.fleet.as_ref().ok_or(crate::node::Error::Closed("this server has no fleet"))
    }

    pub fn with_quota(mut self, quota: SandboxQuota) -> Self {
        self.quota = quota;
        self
    }

    /// Under `policy`; its egress limits count from nothing (call before
    /// any sandbox is used).
    pub fn with_policy(mut self, policy: OperatorPolicy) -> Self {
        self.egress = egress_limits(&policy);
        self.policy = policy;
        self
    }

    /// The egress limits of one of `tenant`'s sandboxes, counted with the
    /// rest of this server's.
    pub(crate) fn egress_limits(&self, tenant: &str) -> Limits {
        self.egress.sandbox(tenant)
    }

    pub fn with_toolchains(mut self, toolchains: crate::toolchain::Toolchains) -> Self {
        self.toolchains = Some(toolchains);
        self
    }

    pub fn with_snapshot_limits(mut self, limits: crate::config::SnapshotLimits) -> Self {
        self.snapshot_limits = limits;
        self
    }

    /// The operator's maxima of portable snapshots (a definition may lower them).
    pub fn snapshot_limits(&self) -> crate::config::SnapshotLimits {
        self.snapshot_limits
    }

    pub(crate) fn live(&self, key: &str) -> Option<Live> {
        let mut live = self.live.lock().expect("live sandboxes poisoned");
        let entry = live.get_mut(key)?;
        entry.last_used = Instant::now();
        Some(entry.clone())
    }

    /// The live entry of `key` as it is: looking (describing a sandbox)
    /// is not using it, so its idle clock goes on.
    fn peek_live(&self, key: &str) -> Option<Live> {
        self.live.lock().expect("live sandboxes poisoned").get(key).cloned()
    }

    fn set_live(&self, key: &str, entry: Live) {
        self.live.lock().expect("live sandboxes poisoned").insert(key.to_string(), entry);
    }

    pub(crate) fn forget(&self, key: &str) {
        self.live.lock().expect("live sandboxes poisoned").remove(key);
    }

    /// Resume, restore or create the sandbox of `input`. Counted in
    /// `sandhold_sandbox_ensures_total` by outcome (`failed` for any error).
    #[tracing::instrument(name = "sandbox.ensure", skip_all, fields(thread_id = %input.thread_id))]
    pub async fn ensure(
        &self,
        stores: &Stores,
        leases: &Leases,
        input: EnsureInput,
        progress: &Progress,
    ) -> Result<api::EnsureReady, Error> {
        let result = self.ensure_uncounted(stores, leases, input, progress).await;
        match &result {
            Ok(ready) => crate::metrics::sandboxes().ensured(ready.outcome()),
            Err(_) => crate::metrics::sandboxes().ensure_failed(),
        }
        result
    }

    async fn ensure_uncounted(
        &self,
        stores: &Stores,
        leases: &Leases,
        input: EnsureInput,
        progress: &Progress,
    ) -> Result<api::EnsureReady, Error> {
        progress.phase(EnsurePhase::Resolving, "resolving the sandbox key");
        let definition = &input.definition;
        let lifecycle = definition.lifecycle.clone().unwrap_or_default();
        let reuse_none = lifecycle.reuse == api::Reuse::None as i32;
        if reuse_none && input.run_id.is_empty() {
            return Err(InvalidField::new("run_id", "required: the definition has `reuse: none`").into());
        }
        let key = sandbox_key(
            definition,
            KeyInput {
                tenant: input.tenant.as_str(),
                thread_id: &input.thread_id,
                run_id: reuse_none.then_some(input.run_id.as_str()),
            },
        );
        let kind = provider_kind(definition)?;
        self.policy.check_on_host(definition, input.tenant.as_str())?;
        if self.fleet.is_none() {
            // Refused before waiting for the lease (with a fleet, which
            // provider is known only under it).
            self.providers.get(kind)?;
        }
        let workspace = definition.workspace.clone().unwrap_or_default();
        // Refused before anything is made.
        self.provisioner.check(&workspace)?;
        let spec = spec_for(definition, &key, &input.tenant, &self.policy);

        // One ensure per key at a time: concurrent callers wait here and then
        // find the sandbox the first one made. A lease that lapses while the
        // sandbox is made (its renewals starved on an overloaded host) makes
        // the record refuse, so nothing another holder made is overwritten;
        // what this one made is removed, and the ensure starts again under
        // a new lease.
        let cancel = CancellationToken::new();
        let mut lapses = 0;
        let (lease, result) = loop {
            let lease = leases
                .acquire(&format!("sandbox:{key}"), &cancel)
                .await?
                .ok_or(Error::Cancelled("ensure cancelled while waiting for the sandbox lease"))?;
            let result = self
                .ensure_locked(stores, &input, &key, &spec, kind, &workspace, &lifecycle, progress, &lease)
                .await;
            match result {
                Err(Error::LeaseLost(_)) if lapses < LEASE_LAPSES => {
                    lapses += 1;
                    let _ = lease.release().await;
                    warn!(sandbox_key = %key, lapses, "the sandbox lease lapsed while ensuring it; starting again");
                    progress.phase(
                        EnsurePhase::Resolving,
                        "the sandbox lease lapsed while ensuring it; starting again",
                    );
                }
                result => break (lease, result),
            }
        };
        // A new sandbox (not a resumed one: that is never overwritten) of a
        // thread with portable snapshots starts from its latest checkpoint.
        let result = match result {
            Ok(Located { sandbox, outcome, instance, provider, capabilities, .. })
                if outcome != EnsureOutcome::Resumed =>
            {
                match self.restore_checkpoint(stores, &input, &sandbox, progress).await {
                    Ok(restored) => Ok((sandbox, outcome, instance, None, restored, capabilities)),
                    Err(e) => {
                        if let Err(d) = provider.destroy(&sandbox.provider_id).await {
                            warn!(sandbox_key = %key, error = %d, "destroying a sandbox whose restore failed");
                        }
                        let _ = stores.instances.delete(&key).await;
                        Err(e)
                    }
                }
            }
            other => other.map(|l| (l.sandbox, l.outcome, l.instance, l.held, None, l.capabilities)),
        };
        let _ = lease.release().await;
        let (sandbox, outcome, instance, held, restored, capabilities) = result?;
        let agent = match held {
            Some(agent) => agent,
            None => connect(&sandbox.address, &sandbox.token).await?,
        };
        // Every ensure hands the values over again: an agent restarted
        // since the last one lost them (and refuses to serve runs that had
        // them until then).
        crate::provision::hand_over(&agent, &input.secrets).await?;
        let withheld = Arc::new(withheld(&input.definition));
        let secrets = Arc::new(input.secrets);
        self.set_live(
            &key,
            Live {
                agent,
                secrets,
                provider: kind,
                node: instance.node.clone(),
                capabilities,
                keep_alive: Duration::from_millis(lifecycle.keep_alive_ms),
                last_used: Instant::now(),
                env: BTreeMap::new(),
                withheld,
                sandbox,
            },
        );
        info!(sandbox_key = %key, tenant = %input.tenant, outcome = ?outcome, provider = %kind, "sandbox ready");
        Ok(api::EnsureReady {
            sandbox_id: key.clone(),
            outcome: outcome as i32,
            sandbox: Some(self.describe(&instance)),
            restored_checkpoint_id: restored.unwrap_or_default(),
        })
    }

    /// Restore the thread's latest portable checkpoint into the new
    /// `sandbox` when the definition enables portable snapshots.
    async fn restore_checkpoint(
        &self,
        stores: &Stores,
        input: &EnsureInput,
        sandbox: &crate::provider::Sandbox,
        progress: &Progress,
    ) -> Result<Option<String>, Error> {
        if !crate::snapshot::enabled(&input.definition)
            || stores.checkpoints.head(&input.tenant, &input.thread_id).await?.is_none()
        {
            return Ok(None);
        }
        progress.phase(EnsurePhase::RestoringCheckpoint, "restoring the thread's latest checkpoint");
        let agent = connect(&sandbox.address, &sandbox.token).await?;
        Ok(crate::snapshot::restore_latest(
            stores,
            &agent,
            &input.tenant,
            &input.thread_id,
            &input.definition,
        )
        .await?)
    }

    #[allow(clippy::too_many_arguments)]
    async fn ensure_locked(
        &self,
        stores: &Stores,
        input: &EnsureInput,
        key: &str,
        spec: &SandboxSpec,
        kind: ProviderKind,
        workspace: &api::WorkspaceDefinition,
        lifecycle: &api::Lifecycle,
        progress: &Progress,
        lease: &crate::lease::Lease,
    ) -> Result<Located, Error> {
        let existing = match stores.instances.get(key).await {
            Ok(i) => Some(i),
            Err(store::Error::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let existing_key = existing.is_some();
        let placed = self.place(existing.as_ref(), kind, &input.definition).await?;
        // The reservation counts the new sandbox on its node until recorded.
        let (node, provider_arc, _reserved) = (placed.node, placed.provider, placed.reservation);
        let provider = provider_arc.as_ref();
        provider.supports(spec).await?;
        let located = |sandbox, outcome, instance, held| Located {
            sandbox,
            outcome,
            instance,
            held,
            provider: provider_arc.clone(),
            capabilities: provider_arc.capabilities(),
        };
        let mut snapshot = None;
        // A sandbox on a node that is gone is not resumed: a new one is
        // placed (and restored from the thread's checkpoint).
        if let Some(instance) = existing.filter(|i| i.node == node) {
            progress.phase(EnsurePhase::Resuming, "resuming the thread's sandbox");
            // Held by this replica and its agent answers: running, nothing
            // to ask the provider (a `docker inspect` and a second agent
            // connection were most of a warm ensure).
            if let Some(live) = self.peek_live(key)
                && live.sandbox.provider_id == instance.provider_sandbox_id
                && answers(&live.agent).await
            {
                let instance = self
                    .record(
                        stores,
                        key,
                        input,
                        (&node, provider),
                        &live.sandbox,
                        instance.native_snapshot,
                        lease,
                    )
                    .await?;
                return Ok(located(live.sandbox, EnsureOutcome::Resumed, instance, Some(live.agent)));
            }
            if let Some(sandbox) = provider.resume(&instance.provider_sandbox_id).await? {
                let instance = self
                    .record(stores, key, input, (&node, provider), &sandbox, instance.native_snapshot, lease)
                    .await?;
                return Ok(located(sandbox, EnsureOutcome::Resumed, instance, None));
            }
            snapshot = instance.native_snapshot.as_deref().and_then(NativeSnapshot::parse);
        }
        if let Some(snap) = snapshot {
            let max_age = Duration::from_millis(lifecycle.snapshot_max_age_ms);
            let age = Duration::from_millis(
                u64::try_from(Timestamp::now().as_millis() - snap.taken_at_ms).unwrap_or_default(),
            );
            if lifecycle.snapshot_max_age_ms > 0 && age > max_age {
                info!(sandbox_key = %key, age_ms = age.as_millis() as u64, "native snapshot too old; creating anew");
                if let Err(e) = provider.delete_snapshot(&Snapshot { id: snap.id.clone() }).await {
                    warn!(sandbox_key = %key, error = %e, "could not delete an expired snapshot");
                }
            } else {
                progress.phase(EnsurePhase::RestoringSnapshot, "restoring the sandbox from its snapshot");
                match provider.restore(&Snapshot { id: snap.id.clone() }, spec).await {
                    Ok(sandbox) => {
                        let recorded = self
                            .record(
                                stores,
                                key,
                                input,
                                (&node, provider),
                                &sandbox,
                                Some(snap.encode()),
                                lease,
                            )
                            .await;
                        return match recorded {
                            Ok(instance) => {
                                Ok(located(sandbox, EnsureOutcome::SnapshotRestored, instance, None))
                            }
                            Err(failed) => Err(discard(provider, &node, key, &sandbox, failed).await),
                        };
                    }
                    Err(e) => {
                        warn!(sandbox_key = %key, error = %e, "restoring the native snapshot failed; creating anew")
                    }
                }
            }
        }

        // A new sandbox from the definition's warm pool, when it has one
        // ready: made and set up already, and counted in the quota since.
        if let Some(claimed) = self.claim_warm(stores, input, key, kind, lease).await? {
            return Ok(claimed);
        }
        // A new sandbox of the tenant (not the key's own, replaced) counts
        // against its quota from here until recorded.
        let slot = if existing_key { None } else { self.quota.admit(stores, &input.tenant).await? };
        // A sandbox of this key the store does not point at was never
        // finished (a replica died between create and record): remove it
        // rather than leave an orphan next to the new one.
        let labels = BTreeMap::from([(crate::provider::LABEL_SANDBOX_KEY.to_string(), key.to_string())]);
        for orphan in provider.list(&labels).await? {
            warn!(sandbox_key = %key, provider_id = %orphan.provider_id, "removing an unrecorded sandbox of this key");
            provider.destroy(&orphan.provider_id).await?;
        }
        progress.phase(EnsurePhase::Creating, format!("creating a {} sandbox", provider.kind()));
        if !provider.kind().kind().isolated() {
            progress.warning(EnsurePhase::Creating, crate::provider::NO_ISOLATION);
        }
        let created = tracing::info_span!("provider.create", provider = %provider.kind());
        // A node that stops answering meanwhile is the cause, and said so;
        // what it may have kept of the sandbox is unrecorded, and removed by
        // the key's next ensure there (above).
        let sandbox = match provider.create(spec).instrument(created).await {
            Ok(sandbox) => sandbox,
            Err(e) if !node.is_empty() && provider.list(&labels).await.is_err() => {
                return Err(Error::node_failed(&node, &e));
            }
            Err(e) => return Err(e.into()),
        };
        let failed = match self.provision(input, provider, &sandbox, workspace, lifecycle, progress).await {
            Ok(native) => {
                let recorded = self.record(stores, key, input, (&node, provider), &sandbox, native, lease);
                match self.quota.settle(slot, recorded).await {
                    Ok(instance) => return Ok(located(sandbox, EnsureOutcome::Created, instance, None)),
                    // Not recorded: another holder may own the key now.
                    Err(e @ Error::LeaseLost(_)) => e,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => e,
        };
        Err(discard(provider, &node, key, &sandbox, failed).await)
    }

    /// The egress of a definition that wants it, for its setup: the
    /// agent's listener configured, carriers open (dropped with the
    /// returned guard) and each connection shown as progress; returns the
    /// proxy environment for setup steps.
    async fn setup_egress(
        &self,
        agent: &AgentClient,
        definition: &api::SandboxDefinition,
        tenant: &Tenant,
        progress: &Progress,
    ) -> Result<(BTreeMap<String, String>, Option<crate::egress::Carriers>), Error> {
        if !crate::egress::wanted(definition) {
            return Ok((BTreeMap::new(), None));
        }
        let listening = crate::egress::configure(agent, definition, Vec::new()).await?;
        let env = listening.env(definition).into_iter().collect();
        let private_ok = self.policy.egress_private_addresses();
        let plan =
            Arc::new(crate::egress::Plan::of(definition, private_ok, self.egress_limits(tenant.as_str())));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<crate::egress::Connection>();
        let carriers = crate::egress::Carriers::open(agent.clone(), plan, tx);
        let progress = progress.clone();
        tokio::spawn(async move {
            while let Some(connection) = rx.recv().await {
                // Recorded once it ended (with its bytes), or was refused.
                if !connection.ended {
                    continue;
                }
                progress.send(api::EnsureProgress {
                    phase: EnsurePhase::Setup as i32,
                    message: connection.summary(),
                    network: connection.to_json().to_string(),
                    ..Default::default()
                });
            }
        });
        Ok((env, Some(carriers)))
    }

    /// Provision a created sandbox, then take the native snapshot when the
    /// lifecycle asks and the provider can. Returns the snapshot, encoded.
    #[tracing::instrument(name = "sandbox.provision", skip_all)]
    pub(super) async fn provision(
        &self,
        input: &EnsureInput,
        provider: &dyn Provider,
        sandbox: &crate::provider::Sandbox,
        workspace: &api::WorkspaceDefinition,
        lifecycle: &api::Lifecycle,
        progress: &Progress,
    ) -> Result<Option<String>, Error> {
        let agent = connect(&sandbox.address, &sandbox.token).await?;
        crate::provision::hand_over(&agent, &input.secrets).await?;
        let withheld = withheld(&input.definition);
        let (egress_env, _carriers) =
            self.setup_egress(&agent, &input.definition, &input.tenant, progress).await?;
        self.provisioner
            .provision(ProvisionContext {
                agent: &agent,
                workspace,
                secrets: &input.secrets,
                withheld: &withheld,
                env: &egress_env,
                progress,
            })
            .await?;
        // Only a provisioned workspace is worth capturing: restoring a
        // snapshot of an untouched sandbox is just a slower create.
        let wants = lifecycle.snapshot != api::SnapshotPolicy::Never as i32
            && crate::workspace::provisions_anything(workspace);
        if !(wants && provider.capabilities().snapshots) {
            return Ok(None);
        }
        if let Some(why) = secret_in_file_system(provider, sandbox, &agent, &input.secrets).await? {
            // An image commit would keep the value: no native snapshot (the
            // sandbox itself is fine; later ensures create it anew).
            warn!(provider_id = %sandbox.provider_id, "{why}");
            progress.phase(EnsurePhase::Snapshotting, why);
            return Ok(None);
        }
        progress.phase(EnsurePhase::Snapshotting, "taking a native snapshot of the provisioned sandbox");
        let snap = provider.snapshot(&sandbox.provider_id).await?;
        Ok(Some(NativeSnapshot { taken_at_ms: Timestamp::now().as_millis(), id: snap.id }.encode()))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn record(
        &self,
        stores: &Stores,
        key: &str,
        input: &EnsureInput,
        (node, provider): (&str, &dyn Provider),
        sandbox: &crate::provider::Sandbox,
        native_snapshot: Option<String>,
        lease: &crate::lease::Lease,
    ) -> Result<Instance, Error> {
        // Another replica may own the key by now; recording would overwrite
        // its sandbox. An unrecorded sandbox is removed by the next ensure.
        if lease.is_lost() {
            return Err(Error::LeaseLost(key.to_string()));
        }
        Ok(stores
            .instances
            .put(NewInstance {
                sandbox_key: key.to_string(),
                tenant: input.tenant.clone(),
                provider: provider.kind().as_str().to_string(),
                provider_sandbox_id: sandbox.provider_id.clone(),
                native_snapshot,
                definition_id: input.definition.id.clone(),
                thread_id: input.thread_id.clone(),
                node: node.to_string(),
            })
            .await?)
    }

    /// The public view of an instance (with what this replica knows of it).
    pub(crate) fn describe(&self, instance: &Instance) -> api::Sandbox {
        // What confines the run user is the agent's to say (its kernel's):
        // known while this replica holds the sandbox's agent.
        let live = self.peek_live(&instance.sandbox_key);
        let confined = live.as_ref().and_then(|l| l.agent.handshake().capabilities);
        let own = || self.providers.by_name(&instance.provider).ok().map(|p| p.capabilities());
        let known = match &live {
            Some(l) => Some(l.capabilities),
            None if instance.node.is_empty() => own(),
            None => None,
        };
        let capabilities = known.map(|c| {
            crate::provider::with_capability_flags!(
                api::Capabilities,
                c,
                landlock: confined.is_some_and(|a| a.landlock),
                seccomp: confined.is_some_and(|a| a.seccomp),
                runtime: live.as_ref().map(|l| l.sandbox.runtime.clone()).unwrap_or_default(),
            )
        });
        api::Sandbox {
            sandbox_id: instance.sandbox_key.clone(),
            definition_id: instance.definition_id.clone(),
            thread_id: instance.thread_id.clone(),
            provider: instance.provider.clone(),
            provider_sandbox_id: instance.provider_sandbox_id.clone(),
            created_at_ms: instance.created_at.as_millis(),
            updated_at_ms: instance.updated_at.as_millis(),
            capabilities,
            env: instance.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            secret_names: Vec::new(),
            // What the definition and the provider say: `Sandboxes` adds it.
            state: api::SandboxState::Unspecified as i32,
            keep_alive_ms: None,
            usage: None,
            node: instance.node.clone(),
        }
    }

    /// The tenant's instance `key`, or NOT_FOUND (also for another
    /// tenant's).
    pub(crate) async fn instance(
        &self,
        stores: &Stores,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Instance, Error> {
        match stores.instances.get(key).await {
            Ok(i) if &i.tenant == tenant => Ok(i),
            Ok(_) | Err(store::Error::NotFound(_)) => Err(Error::NotFound(key.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    /// A connected agent for the tenant's sandbox `key`: the live one, else
    /// the provider resumes it (after a server restart; its secrets are then
    /// gone until the next ensure).
    pub(crate) async fn agent(&self, stores: &Stores, tenant: &Tenant, key: &str) -> Result<Live, Error> {
        let instance = self.instance(stores, tenant, key).await?;
        self.check_node(&instance).await?;
        if let Some(mut live) = self.live(key)
            && live.sandbox.provider_id == instance.provider_sandbox_id
        {
            // From the record, not the cache: another replica may have set it.
            live.env = instance.env;
            return Ok(live);
        }
        let provider = self.provider_on(&instance.node, kind_named(&instance.provider)?).await?;
        let sandbox = provider
            .resume(&instance.provider_sandbox_id)
            .await?
            .ok_or_else(|| Error::NotRunning(key.to_string()))?;
        let agent = connect(&sandbox.address, &sandbox.token).await?;
        let live = Live {
            agent,
            secrets: Arc::default(),
            provider: provider.kind(),
            node: instance.node.clone(),
            capabilities: provider.capabilities(),
            sandbox,
            keep_alive: Duration::ZERO,
            last_used: Instant::now(),
            env: instance.env,
            withheld: Arc::default(),
        };
        self.set_live(key, live.clone());
        Ok(live)
    }

    /// Destroy the tenant's sandbox `key`: the provider's sandbox, its
    /// native snapshot, and the instance record.
    pub async fn destroy(
        &self,
        stores: &Stores,
        leases: &Leases,
        tenant: &Tenant,
        key: &str,
    ) -> Result<(), Error> {
        self.instance(stores, tenant, key).await?;
        let cancel = CancellationToken::new();
        let lease = leases
            .acquire(&format!("sandbox:{key}"), &cancel)
            .await?
            .ok_or(Error::Cancelled("destroy cancelled while waiting for the lease"))?;
        let result = async {
            // Re-read under the lease: an ensure may have replaced it.
            let instance = self.instance(stores, tenant, key).await?;
            // Its node is gone: nothing to ask it, the record goes.
            if self.node_gone(&instance.node, &instance.provider).await {
                return self.forget_gone(stores, &instance).await;
            }
            let provider = self.provider_on(&instance.node, kind_named(&instance.provider)?).await?;
            provider.destroy(&instance.provider_sandbox_id).await?;
            if let Some(snap) = instance.native_snapshot.as_deref().and_then(NativeSnapshot::parse)
                && let Err(e) = provider.delete_snapshot(&Snapshot { id: snap.id }).await
            {
                warn!(sandbox_key = %key, error = %e, "could not delete the native snapshot");
            }
            stores.instances.delete(key).await?;
            self.forget(key);
            info!(sandbox_key = %key, tenant = %tenant, "sandbox destroyed");
            Ok::<_, Error>(())
        }
        .await;
        let _ = lease.release().await;
        result
    }

    /// Live sandboxes idle past their `keep_alive`: forgotten here and
    /// stopped through their provider, so the next ensure resumes them.
    pub async fn stop_idle(&self) {
        let idle: Vec<(String, Live)> = {
            let live = self.live.lock().expect("live sandboxes poisoned");
            live.iter()
                .filter(|(_, l)| !l.keep_alive.is_zero() && l.last_used.elapsed() > l.keep_alive)
                .map(|(k, l)| (k.clone(), l.clone()))
                .collect()
        };
        for (key, live) in idle {
            self.forget(&key);
            let Ok(provider) = self.provider_on(&live.node, live.provider).await else { continue };
            match provider.stop(&live.sandbox.provider_id).await {
                Ok(()) => info!(sandbox_key = %key, "idle sandbox stopped (keep_alive passed)"),
                Err(e) => warn!(sandbox_key = %key, error = %e, "stopping an idle sandbox failed"),
            }
        }
    }
}

/// The agent of a resumed or created sandbox, once it answers.
/// Why a native snapshot of `sandbox` must not be taken, if it must not:
/// a file it holds beyond its image holds a secret value (setup wrote one),
/// or the provider cannot say which files those are.
async fn secret_in_file_system(
    provider: &dyn Provider,
    sandbox: &crate::provider::Sandbox,
    agent: &AgentClient,
    secrets: &Secrets,
) -> Result<Option<String>, Error> {
    if secrets.is_empty() {
        return Ok(None);
    }
    let Some(paths) = provider.changed_paths(&sandbox.provider_id).await? else {
        return Ok(Some(
            "no native snapshot: the provider cannot list the files it would hold, so they cannot be checked \
             for secret values"
                .into(),
        ));
    };
    let request = shared::proto::agent::v1::ScanFilesRequest { paths };
    let scanned = agent.secrets().scan_files(request).await?.into_inner();
    Ok(scanned.hits.first().map(|hit| {
        format!(
            "no native snapshot: {} holds the value of secret {} (written by setup), which an image commit would keep \
             ({} file(s) in all)",
            hit.path,
            hit.names.join(", "),
            scanned.hits.len()
        )
    }))
}

/// What [`Lifecycle::ensure_locked`] found or made.
pub(super) struct Located {
    pub sandbox: crate::provider::Sandbox,
    pub outcome: EnsureOutcome,
    pub instance: Instance,
    /// The agent this replica already held, when it answered.
    pub held: Option<AgentClient>,
    /// Its provider (on its node), and what that can do.
    pub provider: Arc<dyn Provider>,
    pub capabilities: crate::provider::Capabilities,
}

/// How long a held agent has to answer before the provider is asked to
/// resume its sandbox: a live connection answers in well under a
/// millisecond; one to an agent that restarted fails at once, except under
/// gVisor, where it can hang (see `shared::transport`'s keepalive).
const HELD_ANSWER: Duration = Duration::from_secs(1);

pub(super) async fn answers(agent: &AgentClient) -> bool {
    matches!(tokio::time::timeout(HELD_ANSWER, agent.refresh_info()).await, Ok(Ok(_)))
}

pub(super) async fn connect(
    address: &shared::transport::Address,
    token: &shared::secret::Secret,
) -> Result<AgentClient, Error> {
    AgentClient::connect_with_deadline(address, token, AGENT_DEADLINE).await.map_err(Error::Agent)
}

/// A sandbox this ensure made (created, or restored from a snapshot) and
/// could not finish (set up, recorded): removed, so nothing half-made
/// survives a failed ensure, and `failed` returned. When even that fails on
/// a node, the node is named as the cause (what it kept is unrecorded, and
/// removed by the key's next ensure there).
async fn discard(
    provider: &dyn Provider,
    node: &str,
    key: &str,
    sandbox: &crate::provider::Sandbox,
    failed: Error,
) -> Error {
    match provider.destroy(&sandbox.provider_id).await {
        Ok(()) => failed,
        Err(d) => {
            warn!(sandbox_key = %key, error = %d, "destroying a half-made sandbox failed");
            if node.is_empty() { failed } else { Error::node_failed(node, &failed) }
        }
    }
}

/// The provider an instance record names.
fn kind_named(name: &str) -> Result<ProviderKind, Error> {
    ProviderKind::named(name).ok_or_else(|| Error::UnknownProvider(name.to_string()))
}

pub(super) fn provider_kind(definition: &api::SandboxDefinition) -> Result<ProviderKind, Error> {
    match ProviderKind::of(definition) {
        Some((kind, _)) => Ok(kind),
        None => Err(InvalidField::new("definition.provider", "required").into()),
    }
}

/// What the provider is asked to create: the definition's provider section
/// as its provider reads it, under `policy`'s default limits. Holds no secret.
pub(crate) fn spec_for(
    definition: &api::SandboxDefinition,
    key: &str,
    tenant: &Tenant,
    policy: &OperatorPolicy,
) -> SandboxSpec {
    let mut spec = SandboxSpec {
        key: key.to_string(),
        tenant: tenant.as_str().to_string(),
        definition_id: definition.id.clone(),
        env: definition.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<BTreeMap<_, _>>(),
        ..Default::default()
    };
    policy.configure(definition, &mut spec);
    spec
}

/// A native snapshot as the instance store keeps it: `<taken at, unix
/// ms>|<provider snapshot id>`, so `snapshot_max_age` can be judged without
/// asking the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NativeSnapshot {
    taken_at_ms: i64,
    id: String,
}

impl NativeSnapshot {
    fn encode(&self) -> String {
        format!("{}|{}", self.taken_at_ms, self.id)
    }

    fn parse(s: &str) -> Option<Self> {
        let (at, id) = s.split_once('|')?;
        Some(Self { taken_at_ms: at.parse().ok()?, id: id.to_string() })
    }
}

/// Secrets no process of the sandbox is given: the model keys (only the
/// agent's broker adds them) and git's auth secrets (only the agent's own
/// git sends them).
fn withheld(definition: &api::SandboxDefinition) -> BTreeSet<String> {
    let mut names = crate::egress::withheld(definition);
    names.extend(crate::workspace::git_auth_secrets(definition));
    names
}

/// The egress limits `policy` sets, counting from nothing.
fn egress_limits(policy: &OperatorPolicy) -> EgressLimits {
    let settings = policy.settings();
    EgressLimits::new(
        settings.egress_max_connections_per_sandbox as usize,
        settings.egress_max_connections_per_tenant as usize,
    )
}

#[cfg(test)]
mod tests {
    use shared::proto::v1::provider_spec;

    use super::*;

    #[test]
    fn the_operators_egress_limits_hold_and_each_lifecycle_counts_its_own() {
        let policy = crate::config::Policy {
            egress_max_connections_per_sandbox: 2,
            egress_max_connections_per_tenant: 3,
            ..Default::default()
        };
        let lifecycle = || {
            Lifecycle::new(Providers::new(), Arc::new(crate::workspace::WorkspaceProvisioner))
                .with_policy(OperatorPolicy::new(policy.clone(), true))
        };
        let (server, other) = (lifecycle(), lifecycle());
        let sandbox = server.egress_limits("acme");
        let _held = [sandbox.admit().unwrap(), sandbox.admit().unwrap()];
        assert!(sandbox.admit().unwrap_err().contains("holds 2 egress connections open"));
        let _third = server.egress_limits("acme").admit().unwrap();
        assert!(server.egress_limits("acme").admit().unwrap_err().contains("hold 3 egress connections open"));
        // Another server in the same process counts its own.
        let _there = other.egress_limits("acme").admit().unwrap();
        // The built-in policy's limits.
        let default = Lifecycle::new(Providers::new(), Arc::new(crate::workspace::WorkspaceProvisioner));
        let sandbox = default.egress_limits("acme");
        let held: Vec<_> = (0..crate::config::DEFAULT_EGRESS_MAX_CONNECTIONS_PER_SANDBOX)
            .map(|_| sandbox.admit().unwrap())
            .collect();
        assert!(sandbox.admit().is_err(), "{} held", held.len());
    }

    #[test]
    fn native_snapshots_round_trip_through_their_encoding() {
        let s = NativeSnapshot { taken_at_ms: 1_700_000_000_123, id: "sandhold-snapshot:abc".into() };
        assert_eq!(NativeSnapshot::parse(&s.encode()), Some(s));
        assert_eq!(NativeSnapshot::parse("no-separator"), None);
    }

    #[test]
    fn the_spec_carries_docker_options_and_no_secret() {
        let def = api::SandboxDefinition {
            id: "d".into(),
            provider: Some(api::ProviderSpec {
                provider: Some(provider_spec::Provider::Docker(api::DockerProvider {
                    image: "img".into(),
                    memory_bytes: 1 << 20,
                    ..Default::default()
                })),
            }),
            env: [("A".to_string(), "1".to_string())].into(),
            secret_names: vec!["TOKEN".into()],
            ..Default::default()
        };
        let spec = spec_for(&def, "k", &Tenant::new("t"), &OperatorPolicy::default());
        assert_eq!(spec.docker.image.as_deref(), Some("img"));
        assert_eq!(spec.docker.memory_bytes, Some(1 << 20));
        assert_eq!(spec.docker.network, None, "no network unless asked");
        assert_eq!(spec.env.len(), 1);
    }
}
