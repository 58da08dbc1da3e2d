//! The control plane's gRPC server: health, reflection, the public
//! services behind tenant auth, readiness, and graceful shutdown.
//!
//! Lifecycle: bind (refusing a non-loopback address without tokens), serve
//! at once with health NOT_SERVING, open the stores and leases in the
//! background (retrying), then SERVING. On shutdown: NOT_SERVING, release
//! leases, stop accepting, drain in-flight calls within a time box, close
//! the stores.

mod gate;
mod providers;
mod ready;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, bail};
use shared::proto::v1::admin_service_server::AdminServiceServer;
use shared::proto::v1::run_service_server::RunServiceServer;
use shared::proto::v1::sandbox_service_server::SandboxServiceServer;
use shared::proto::v1::snapshot_service_server::SnapshotServiceServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

pub use providers::providers_from_config;

use crate::auth::{AuthLayer, Authenticator, SINGLE_USER_TENANT};
use crate::config::{ServeConfig, redact_url};
use crate::context::Context;
use crate::runs::Runs;
use gate::{Slot, gate};

/// How long shutdown waits for the background loops to stop.
const LOOPS_GRACE: Duration = Duration::from_secs(5);

/// Where the built services go once the stores are open.
struct Slots {
    admin: Slot<AdminServiceServer<crate::api::AdminApi>>,
    snapshot: Slot<SnapshotServiceServer<crate::api::SnapshotApi>>,
    sandbox: Slot<SandboxServiceServer<crate::api::SandboxApi>>,
    runs: Slot<RunServiceServer<crate::api::RunApi>>,
}

/// What exists once the server is ready: the context and the run driver
/// (shutdown drains its drives).
struct Built {
    cx: Context,
    runs: Runs,
}

/// A server started with [`start`].
pub struct RunningServer {
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    built: Arc<OnceLock<Built>>,
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

    /// What the services share, once the stores are open.
    pub fn context(&self) -> Option<Context> {
        self.built.get().map(|b| b.cx.clone())
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
/// The public services answer UNAVAILABLE until the stores and leases are
/// open and the services are built, in the background.
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

    // Every background loop runs on this set; shutdown waits for it.
    let loops = TaskTracker::new();
    let built: Arc<OnceLock<Built>> = Arc::default();
    let metrics_addr = match config.metrics_listen {
        Some(addr) => {
            let sampler = ready::run_count_sampler(built.clone());
            let endpoint = crate::metrics::serve_endpoint(addr, sampler, shutdown.clone(), &loops).await?;
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

    let (admin, admin_slot) = gate();
    let (snapshot, snapshot_slot) = gate();
    let (sandbox, sandbox_slot) = gate();
    let (runs, runs_slot) = gate();
    let slots = Slots { admin: admin_slot, snapshot: snapshot_slot, sandbox: sandbox_slot, runs: runs_slot };
    let router = tonic::transport::Server::builder()
        .layer(AuthLayer::new(auth.clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(admin)
        .add_service(snapshot)
        .add_service(sandbox)
        .add_service(runs);

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
    let readiness = ready::Readiness {
        config: config.clone(),
        auth,
        health: health.clone(),
        shutdown: shutdown.clone(),
        slots,
        built: built.clone(),
        loops: loops.clone(),
    };
    let task = tokio::spawn(supervise(
        config,
        readiness,
        health,
        shutdown.clone(),
        Serving { stop_accepting, task: serving },
        loops,
    ));
    Ok(RunningServer { local_addr, metrics_addr, shutdown, built, task })
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
    readiness: ready::Readiness,
    health: HealthReporter,
    shutdown: CancellationToken,
    serving: Serving,
    loops: TaskTracker,
) -> anyhow::Result<()> {
    let Serving { stop_accepting, task: mut serving } = serving;
    let grace = config.shutdown_grace;
    let built = readiness.built.clone();
    let mut readiness = tokio::spawn(readiness.run());

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
                tracing::error!(error = format!("{e:#}"), "cannot become ready; shutting down");
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
    if let Some(b) = built.get() {
        b.cx.leases.release_all().await;
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
    if let Some(b) = built.get() {
        b.runs.drain(Duration::from_secs(5)).await;
    }
    loops.close();
    if tokio::time::timeout(LOOPS_GRACE, loops.wait()).await.is_err() {
        warn!(still_running = loops.len(), "background loops did not stop in time at shutdown");
    }
    if let Some(b) = built.get() {
        let _ = tokio::time::timeout(Duration::from_secs(5), b.cx.stores.close()).await;
    }
    outcome
}
