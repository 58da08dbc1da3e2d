//! Becoming ready: open the stores and the leases (retrying while they are
//! unreachable), register the configured tokens (or, without any, make the
//! local token file), build the context and the
//! services from it, open the gates, start the background loops on the
//! server's task set, report SERVING, then keep health in step with the
//! database.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use backon::{ExponentialBuilder, Retryable};
use futures::TryFutureExt;
use shared::proto::v1::admin_service_server::AdminServiceServer;
use shared::proto::v1::node_registry_server::NodeRegistryServer;
use shared::proto::v1::run_service_server::RunServiceServer;
use shared::proto::v1::sandbox_service_server::SandboxServiceServer;
use shared::proto::v1::snapshot_service_server::SnapshotServiceServer;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{debug, info, warn};

use super::built::{Built, BuiltCell, Slots};
use super::health::set_health;
use crate::api::{AdminApi, NodeRegistryApi, RunApi, SandboxApi, SnapshotApi};
use crate::auth::{self, Authenticator};
use crate::config::{ServeConfig, redact_url};
use crate::context::Context;
use crate::lease::{self, CancelBus, LeaseError, Leases};
use crate::reaper::Reaper;
use crate::runs::{RunOptions, Runs};
use crate::sandbox::{Lifecycle, SandboxQuota};
use crate::store::{self, Presence, Stores, Tenant};

/// How often a ready server re-checks its database for health.
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Bound for the database sample taken at each metrics scrape: a slow
/// database must not make the scrape itself time out (the gauges keep
/// their last value).
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why one attempt to open a store or the leases failed.
#[derive(Debug, thiserror::Error)]
enum OpenError {
    /// Retrying cannot fix it (a bad URL, bad options).
    #[error("{0:#}")]
    Fatal(anyhow::Error),
    /// Not reachable yet.
    #[error("{0}")]
    Transient(String),
}

pub(super) struct Readiness {
    pub config: ServeConfig,
    pub auth: Authenticator,
    pub health: HealthReporter,
    pub shutdown: CancellationToken,
    pub slots: Slots,
    pub built: Arc<BuiltCell>,
    pub loops: TaskTracker,
}

impl Readiness {
    /// Returns `Err` only for what retrying cannot fix.
    pub async fn run(self) -> anyhow::Result<()> {
        let config = &self.config;
        // The providers are built while the stores open: both are on the
        // path of a start (a cold `sandhold run` waits for its server).
        let (opened, providers) = tokio::join!(self.open_stores(), super::providers_from_config(config));
        let Some((stores, leases, presence)) = opened? else { return Ok(()) };
        let providers = providers?;
        let cancels = CancelBus::new(config.redis_url.as_deref(), "sandhold")
            .context("the Redis URL for cancel notifications")?;
        let lifecycle = Lifecycle::new(providers, Arc::new(crate::workspace::WorkspaceProvisioner))
            .with_policy(super::providers::policy_from_config(config))
            .with_quota(SandboxQuota::new(config.quotas.sandboxes()))
            .with_snapshot_limits(config.snapshot_limits)
            .with_fleet(crate::node::Fleet::new(stores.clone(), fleet_options(config)?));
        let lifecycle = match &config.toolchain_dir {
            Some(dir) => lifecycle.with_toolchains(crate::toolchain::Toolchains::new(dir)),
            None => lifecycle,
        };
        let cx = Context {
            replica_id: config.replica_id.clone(),
            stores: stores.clone(),
            leases,
            presence,
            lifecycle,
            cancels,
            // The server's own set: shutdown waits for it after the drives.
            tasks: self.loops.clone(),
            shutdown: self.shutdown.clone(),
        };
        self.build(cx);
        self.keep_health(stores).await;
        Ok(())
    }

    /// The stores and the leases open (retried while unreachable), the
    /// configured tokens registered, this replica's presence joined;
    /// `None` when shut down meanwhile.
    async fn open_stores(&self) -> anyhow::Result<Option<(Stores, Leases, Option<Presence>)>> {
        let config = &self.config;
        let database = redact_url(&config.database_url);
        let Some(stores) = retry("stores", &self.shutdown, || async {
            Stores::open(&config.database_url).await.map_err(|e| match e {
                store::Error::Invalid { field, reason } => {
                    OpenError::Fatal(anyhow::anyhow!("{field}: {reason} ({database})"))
                }
                e => OpenError::Transient(e.to_string()),
            })
        })
        .await?
        else {
            return Ok(None);
        };
        let Some(leases) = retry("leases", &self.shutdown, || async {
            lease::open(
                config.redis_url.as_deref(),
                config.lease_options(),
                stores.backend_name(),
                &config.replica_id,
            )
            .await
            .map_err(|e| match e {
                LeaseError::Invalid(e) => OpenError::Fatal(anyhow::anyhow!(e)),
                e => OpenError::Transient(e.to_string()),
            })
        })
        .await?
        else {
            return Ok(None);
        };
        for t in config.all_tokens() {
            stores
                .tokens
                .put_token(&Tenant::new(&t.tenant), t.token.expose())
                .await
                .with_context(|| format!("registering the API token of tenant {:?}", t.tenant))?;
        }
        // The configuration is the list of valid tokens: one taken out of
        // it (a leaked token rotated away) must stop working, not live on
        // in the database.
        let configured: Vec<&str> = config.all_tokens().map(|t| t.token.expose()).collect();
        let revoked =
            stores.tokens.keep_only(&configured).await.context("revoking unconfigured API tokens")?;
        if revoked > 0 {
            warn!(revoked, "API tokens no longer in the configuration were revoked");
        }
        if self.auth.single_user() {
            let Some(token) = retry("local token", &self.shutdown, || async {
                auth::local::ensure(&config.data_dir).map_err(|e| match e {
                    e @ auth::local::Error::Unsafe { .. } => OpenError::Fatal(e.into()),
                    e => OpenError::Transient(e.to_string()),
                })
            })
            .await?
            else {
                return Ok(None);
            };
            self.auth.set_local_token(token);
        }
        self.auth.set_token_store(stores.tokens.clone());
        // Before any run is driven here: a lease naming this replica must
        // never be seen without the replica's presence.
        let Some(joined) = retry("replica presence", &self.shutdown, || {
            Presence::join(&stores, &config.database_url, &config.replica_id, self.shutdown.clone())
                .map_err(|e| OpenError::Transient(e.to_string()))
        })
        .await?
        else {
            return Ok(None);
        };
        let presence = joined.map(|(presence, keep)| {
            self.loops.spawn(keep);
            presence
        });
        info!(
            store_backend = stores.backend_name(),
            lease_backend = leases.backend_name(),
            tenants = config.all_tokens().count(),
            "stores ready"
        );
        Ok(Some((stores, leases, presence)))
    }

    /// The services from the context, the gates opened, the loops started.
    fn build(&self, cx: Context) {
        let config = &self.config;
        let runs = Runs::new(
            cx.clone(),
            RunOptions {
                quiet: config.takeover_quiet,
                running_runs: config.quotas.running_runs(),
                tenant_daily_tokens: config.quotas.tenant_daily_tokens,
                sandboxes: config.quotas.sandboxes(),
                max_attempts: config.quotas.max_attempts,
                ..Default::default()
            },
        );
        let reaper = Reaper::new(cx.clone(), runs.clone(), config.reaper.clone(), config.single_user());
        let admin =
            AdminApi::new(cx.clone(), reaper.clone(), config.operator_tenants.clone(), config.single_user());
        self.slots.admin.fill(shared::sized!(AdminServiceServer::new(admin)));
        self.slots.snapshot.fill(shared::sized!(SnapshotServiceServer::new(SnapshotApi::new(cx.clone()))));
        self.slots.sandbox.fill(shared::sized!(SandboxServiceServer::new(SandboxApi::new(cx.clone()))));
        self.slots.runs.fill(shared::sized!(RunServiceServer::new(RunApi::new(runs.clone()))));
        if let Ok(fleet) = cx.lifecycle.fleet() {
            self.slots.nodes.fill(NodeRegistryServer::new(NodeRegistryApi::new(fleet.clone())));
        }

        let shutdown = &self.shutdown;
        self.loops.spawn(crate::sandbox::run_idle_sweeper(cx.lifecycle.clone(), shutdown.clone()));
        let (lifecycle, stores, leases) = (cx.lifecycle.clone(), cx.stores.clone(), cx.leases.clone());
        self.loops.spawn(crate::sandbox::run_warm_keeper(lifecycle, stores, leases, shutdown.clone()));
        self.loops.spawn(crate::snapshot::run_gc_sweeper(cx.stores.clone(), shutdown.clone()));
        self.loops.spawn(reaper.run(shutdown.clone()));
        self.loops.spawn(crate::runs::run_attempt_keeper(runs.clone(), shutdown.clone()));
        let listener = runs.clone();
        let (cancels, token) = (cx.cancels.clone(), shutdown.clone());
        self.loops.spawn(async move {
            let (announced, resubscribed) =
                (|run: &str| listener.cancel_announced(run), || listener.recheck_cancels());
            cancels.listen(token, announced, resubscribed).await
        });
        self.built.set(Built { cx, runs });
    }

    /// Report SERVING while the database answers, until shutdown.
    async fn keep_health(&self, stores: Stores) {
        let mut serving = false;
        loop {
            let ok = stores.ping().await.is_ok();
            if ok != serving {
                if ok {
                    info!("health SERVING");
                } else {
                    warn!("database stopped answering; health NOT_SERVING");
                }
                set_health(&self.health, if ok { ServingStatus::Serving } else { ServingStatus::NotServing })
                    .await;
                serving = ok;
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(HEALTH_CHECK_EVERY) => {}
            }
        }
    }
}

/// The fleet's settings of a configuration: the join token (read from its
/// file, which must be the owner's alone), the identity towards nodes.
fn fleet_options(config: &ServeConfig) -> anyhow::Result<crate::node::FleetOptions> {
    let join_token = match &config.node_join_token_file {
        Some(path) => {
            let text = crate::provider::read_private_file(path, &[crate::provider::own_uid()])
                .with_context(|| format!("the node join token file {}", path.display()))?;
            let token = text.trim().to_string();
            anyhow::ensure!(!token.is_empty(), "the node join token file {} is empty", path.display());
            Some(shared::secret::Secret::new(token))
        }
        None => None,
    };
    let tls = match (&config.node_tls_cert, &config.node_tls_key, &config.node_tls_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(crate::node::NodeTls::load(cert, key, ca)?),
        _ => None,
    };
    Ok(crate::node::FleetOptions { join_token, tls, grace: config.node_grace })
}

/// Call `attempt` until it yields a value, backing off (100 ms doubling to
/// 5 s) between transient failures; a fatal one ends it. `Ok(None)` if shut
/// down first.
async fn retry<T, F, Fut>(what: &str, shutdown: &CancellationToken, attempt: F) -> anyhow::Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, OpenError>>,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .without_max_times();
    let retried = attempt
        .retry(backoff)
        .when(|e| matches!(e, OpenError::Transient(_)))
        .notify(|e, delay| {
            warn!(what, error = %e, retry_in_ms = delay.as_millis() as u64, "not reachable yet, retrying")
        });
    tokio::select! {
        _ = shutdown.cancelled() => Ok(None),
        r = retried => match r {
            Ok(value) => Ok(Some(value)),
            Err(OpenError::Fatal(e)) => Err(e),
            Err(OpenError::Transient(why)) => Err(anyhow::anyhow!(why)),
        },
    }
}

/// What a metrics scrape samples from the database: runs by unfinished
/// status, once the stores are open.
pub(super) fn run_count_sampler(built: Arc<BuiltCell>) -> crate::metrics::Sampler {
    Arc::new(move || {
        let built = built.clone();
        Box::pin(async move {
            let Some(b) = built.get() else { return };
            match tokio::time::timeout(SAMPLE_TIMEOUT, b.cx.stores.count_unfinished_runs()).await {
                Ok(Ok(counts)) => {
                    for (status, n) in counts {
                        crate::metrics::runs().set_current(status.as_str(), n);
                    }
                }
                Ok(Err(e)) => debug!(error = %e, "metrics: counting runs failed; keeping the last sample"),
                Err(_) => debug!("metrics: counting runs timed out; keeping the last sample"),
            }
            if let Ok(fleet) = b.cx.lifecycle.fleet()
                && let Ok(Ok(nodes)) = tokio::time::timeout(SAMPLE_TIMEOUT, fleet.list()).await
            {
                let now = crate::store::Timestamp::now().as_millis();
                let samples: Vec<crate::metrics::NodeSample<'_>> = nodes
                    .iter()
                    .map(|n| crate::metrics::NodeSample {
                        node: &n.record.node.name,
                        sandboxes: n.placed,
                        slots: n.record.node.sandbox_slots,
                        free_memory_bytes: n.record.free_memory_bytes,
                        heartbeat_age: Duration::from_millis(
                            u64::try_from(now - n.record.last_heartbeat.as_millis()).unwrap_or(0),
                        ),
                    })
                    .collect();
                crate::metrics::sandboxes().nodes(&samples);
            }
        })
    })
}
