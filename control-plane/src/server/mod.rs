//! The control plane's gRPC server: health, reflection, the public
//! services behind tenant auth, readiness, and graceful shutdown.
//!
//! Lifecycle: bind (refusing a non-loopback address without tokens), serve
//! at once with health NOT_SERVING, open the stores and leases in the
//! background (retrying), then SERVING. On shutdown: NOT_SERVING, release
//! leases, stop accepting, drain in-flight calls within a time box, close
//! the stores.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use shared::error::{Error, ErrorCode};
use shared::proto::v1::admin_service_server::AdminServiceServer;
use shared::proto::v1::run_service_server::RunServiceServer;
use shared::proto::v1::sandbox_service_server::SandboxServiceServer;
use shared::proto::v1::snapshot_service_server::SnapshotServiceServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{error, info, warn};

use crate::admin::AdminApi;
use crate::auth::{AuthLayer, Authenticator, SINGLE_USER_TENANT};
use crate::config::{ServeConfig, redact_url};
use crate::lease::{self, LeaseError, Leases};
use crate::store::{self, Stores, Tenant};

/// How often a ready server re-checks its database for health.
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(5);

/// What exists once the server is ready.
pub struct Ready {
    pub stores: Stores,
    pub leases: Leases,
}

/// State shared by the services. Cheap to clone.
#[derive(Clone)]
pub struct ServerState {
    inner: Arc<StateInner>,
}

struct StateInner {
    replica_id: String,
    ready: OnceLock<Ready>,
}

impl ServerState {
    fn new(replica_id: String) -> Self {
        Self { inner: Arc::new(StateInner { replica_id, ready: OnceLock::new() }) }
    }

    pub fn replica_id(&self) -> &str {
        &self.inner.replica_id
    }

    /// The stores and leases, or UNAVAILABLE while the server is starting.
    pub fn ready(&self) -> Result<&Ready, Error> {
        self.inner.ready.get().ok_or_else(|| {
            Error::new(ErrorCode::Unavailable, "the server is starting: stores are not ready yet")
        })
    }
}

/// A server started with [`start`].
pub struct RunningServer {
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    state: ServerState,
    task: JoinHandle<anyhow::Result<()>>,
}

impl RunningServer {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where `/metrics` is served, when `metrics_listen` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// What the services share: the stores and leases once ready.
    pub fn state(&self) -> ServerState {
        self.state.clone()
    }

    /// Cancelling it begins graceful shutdown.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Until the server has stopped (after shutdown, or a fatal error).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("server task panicked")?
    }

    /// Begin graceful shutdown and wait for it to finish.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// Start and run until `shutdown` fires and the server has drained.
pub async fn serve(config: ServeConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    start(config, shutdown).await?.wait().await
}

/// Refuse to expose a server without authentication.
fn check_exposure(config: &ServeConfig) -> anyhow::Result<()> {
    if config.single_user() && !config.listen.ip().is_loopback() {
        bail!(
            "refusing to listen on {} without API tokens: anyone who can reach it would act as one tenant. \
             Configure tokens (--token TENANT=TOKEN, SANDHOLD_TOKENS, or [[tokens]] in the config file) \
             or listen on a loopback address such as 127.0.0.1",
            config.listen
        );
    }
    Ok(())
}

/// Bind and begin serving; returns once the socket accepts connections.
/// Readiness (stores, leases) follows in the background.
pub async fn start(config: ServeConfig, shutdown: CancellationToken) -> anyhow::Result<RunningServer> {
    check_exposure(&config)?;
    let listener =
        TcpListener::bind(config.listen).await.with_context(|| format!("listening on {}", config.listen))?;
    let local_addr = listener.local_addr()?;

    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::NotServing).await;

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(shared::PUBLIC_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    // grpcio's reflection client still speaks v1alpha.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(shared::PUBLIC_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("building the reflection service")?;

    let state = ServerState::new(config.replica_id.clone());
    let metrics_addr = match config.metrics_listen {
        Some(addr) => {
            let endpoint = crate::metrics::serve_endpoint(addr, state.clone(), shutdown.clone()).await?;
            Some(endpoint.local_addr())
        }
        None => None,
    };
    let auth = Authenticator::new(config.single_user());
    if config.single_user() {
        info!(
            listen = %local_addr,
            tenant = SINGLE_USER_TENANT,
            "no API tokens configured: single-user mode, every caller is tenant {SINGLE_USER_TENANT:?}"
        );
    }

    let lifecycle = crate::sandbox::Lifecycle::new(
        crate::sandbox::providers_from_config(&config).await,
        Arc::new(crate::workspace::WorkspaceProvisioner),
    );
    tokio::spawn(crate::sandbox::run_idle_sweeper(lifecycle.clone(), shutdown.clone()));
    tokio::spawn(crate::snapshot::run_gc_sweeper(state.clone(), shutdown.clone()));

    let runs = crate::runs::Runs::new(
        state.clone(),
        lifecycle.clone(),
        shutdown.clone(),
        crate::runs::RunOptions { quiet: config.takeover_quiet, ..Default::default() },
        crate::runs::CancelBus::new(config.redis_url.as_deref(), "sandhold")
            .context("the Redis URL for cancel notifications")?,
    );
    runs.listen_for_cancels(shutdown.clone());
    let reaper = crate::reaper::Reaper::new(
        state.clone(),
        lifecycle.clone(),
        runs.clone(),
        config.reaper.clone(),
        config.single_user(),
    );
    tokio::spawn(reaper.clone().run(shutdown.clone()));
    let admin = AdminApi::new(state.clone(), reaper, config.operator_tenants.clone(), config.single_user());
    let router = tonic::transport::Server::builder()
        .layer(AuthLayer::new(auth.clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(AdminServiceServer::new(admin))
        .add_service(SnapshotServiceServer::new(crate::snapshot::SnapshotApi::new(
            state.clone(),
            lifecycle.clone(),
        )))
        .add_service(SandboxServiceServer::new(crate::sandbox::SandboxApi::new(
            state.clone(),
            lifecycle.clone(),
        )))
        .add_service(RunServiceServer::new(crate::runs::RunApi::new(runs.clone())));

    info!(
        listen = %local_addr,
        replica_id = %config.replica_id,
        metrics = metrics_addr.map(|a| format!("http://{a}/metrics")).unwrap_or_else(|| "off".into()),
        database = %redact_url(&config.database_url),
        redis = config.redis_url.as_deref().map(redact_url).unwrap_or_else(|| "none (in-process leases)".into()),
        "sandhold serving"
    );
    let stop_accepting = CancellationToken::new();
    let serving = tokio::spawn(router.serve_with_incoming_shutdown(
        TcpListenerStream::new(listener),
        stop_accepting.clone().cancelled_owned(),
    ));
    let task = tokio::spawn(supervise(
        config,
        state.clone(),
        auth,
        health,
        shutdown.clone(),
        Serving { stop_accepting, task: serving },
        runs,
    ));
    Ok(RunningServer { local_addr, metrics_addr, shutdown, state, task })
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    // "" is the whole server (what a bare `grpc_health_probe` asks).
    health.set_service_status("", status).await;
    health.set_service_status("sandhold.v1.AdminService", status).await;
    health.set_service_status("sandhold.v1.SandboxService", status).await;
    health.set_service_status("sandhold.v1.RunService", status).await;
    health.set_service_status("sandhold.v1.SnapshotService", status).await;
}

/// The gRPC server task and the token that stops it accepting.
struct Serving {
    stop_accepting: CancellationToken,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Readiness, then the wait for shutdown, then the shutdown sequence.
async fn supervise(
    config: ServeConfig,
    state: ServerState,
    auth: Authenticator,
    health: HealthReporter,
    shutdown: CancellationToken,
    serving: Serving,
    runs: crate::runs::Runs,
) -> anyhow::Result<()> {
    let Serving { stop_accepting, task: mut serving } = serving;
    let grace = config.shutdown_grace;
    let mut readiness =
        tokio::spawn(become_ready(config, state.clone(), auth, health.clone(), shutdown.clone()));

    let mut outcome: anyhow::Result<()> = Ok(());
    let mut readiness_done = false;
    tokio::select! {
        _ = shutdown.cancelled() => {}
        r = &mut serving => {
            // The server stopped by itself: nothing left to drain.
            return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::Error::new(e).context("gRPC server failed")),
                Err(e) => Err(anyhow::Error::new(e).context("gRPC server task")),
            };
        }
        r = &mut readiness => {
            readiness_done = true;
            if let Ok(Err(e)) | Err(e) = r.map_err(anyhow::Error::new) {
                error!(error = format!("{e:#}"), "cannot become ready; shutting down");
                outcome = Err(e);
            }
        }
    }

    info!("shutdown: health NOT_SERVING, releasing leases, draining calls");
    // Stop the readiness/health loop first so it cannot flip health back.
    if !readiness_done {
        readiness.abort();
        let _ = readiness.await;
    }
    set_health(&health, ServingStatus::NotServing).await;
    if let Ok(ready) = state.ready() {
        ready.leases.release_all().await;
    }
    stop_accepting.cancel();
    match tokio::time::timeout(grace, &mut serving).await {
        Ok(Ok(Err(e))) => warn!(error = %e, "gRPC server ended with an error while draining"),
        Ok(_) => info!("drained"),
        Err(_) => {
            warn!(grace_ms = grace.as_millis() as u64, "drain time box expired; cutting remaining calls");
            serving.abort();
        }
    }
    // Drives detach on the shutdown token; they need the stores to say so.
    runs.drain(Duration::from_secs(5)).await;
    if let Ok(ready) = state.ready() {
        let _ = tokio::time::timeout(Duration::from_secs(5), ready.stores.close()).await;
    }
    outcome
}

/// Open the stores and the leases (retrying while they are unreachable),
/// register the configured tokens, report SERVING, then keep health in step
/// with the database. Returns `Err` only for what retrying cannot fix.
async fn become_ready(
    config: ServeConfig,
    state: ServerState,
    auth: Authenticator,
    health: HealthReporter,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let database = redact_url(&config.database_url);
    let Some(stores) = retry("stores", &shutdown, || async {
        match Stores::open(&config.database_url).await {
            Ok(s) => Ok(Ok(s)),
            Err(store::Error::Invalid { field, reason }) => {
                Err(anyhow::anyhow!("{field}: {reason} ({database})"))
            }
            Err(e) => Ok(Err(e.to_string())),
        }
    })
    .await?
    else {
        return Ok(());
    };
    let Some(leases) = retry("leases", &shutdown, || async {
        match lease::open(config.redis_url.as_deref(), config.lease_options(), stores.backend_name()).await {
            Ok(l) => Ok(Ok(l)),
            Err(LeaseError::Invalid(e)) => Err(anyhow::anyhow!(e)),
            Err(e) => Ok(Err(e.to_string())),
        }
    })
    .await?
    else {
        return Ok(());
    };
    for t in &config.tokens {
        stores
            .tokens
            .put_token(&Tenant::new(&t.tenant), t.token.expose())
            .await
            .with_context(|| format!("registering the API token of tenant {:?}", t.tenant))?;
    }
    auth.set_token_store(stores.tokens.clone());
    info!(
        store_backend = stores.backend_name(),
        lease_backend = leases.backend_name(),
        tenants = config.tokens.len(),
        "stores ready"
    );
    let stores_for_health = stores.clone();
    let _ = state.inner.ready.set(Ready { stores, leases });

    let mut serving = false;
    loop {
        let ok = stores_for_health.ping().await.is_ok();
        if ok != serving {
            if ok {
                info!("health SERVING");
            } else {
                warn!("database stopped answering; health NOT_SERVING");
            }
            set_health(&health, if ok { ServingStatus::Serving } else { ServingStatus::NotServing }).await;
            serving = ok;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(HEALTH_CHECK_EVERY) => {}
        }
    }
}

/// Call `attempt` until it yields a value, backing off between transient
/// failures (`Ok(Err(why))`); `Err` is fatal. `Ok(None)` if shut down first.
async fn retry<T, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> anyhow::Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Result<T, String>>>,
{
    let mut delay = Duration::from_millis(100);
    loop {
        match attempt().await? {
            Ok(value) => return Ok(Some(value)),
            Err(why) => {
                warn!(what, error = %why, retry_in_ms = delay.as_millis() as u64, "not reachable yet, retrying")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
