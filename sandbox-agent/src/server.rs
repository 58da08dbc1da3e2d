//! The agent's gRPC server: assembly, listening and shutdown.
//!
//! The only module that knows every service: it builds the
//! [`AgentContext`], each service from it and the router, and nothing
//! imports it back.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use shared::proto::agent::v1::egress_service_server::EgressServiceServer;
use shared::proto::agent::v1::fs_service_server::FsServiceServer;
use shared::proto::agent::v1::info_service_server::InfoServiceServer;
use shared::proto::agent::v1::journal_service_server::JournalServiceServer;
use shared::proto::agent::v1::port_service_server::PortServiceServer;
use shared::proto::agent::v1::process_service_server::ProcessServiceServer;
use shared::proto::agent::v1::request_service_server::RequestServiceServer;
use shared::proto::agent::v1::secret_service_server::SecretServiceServer;
use shared::proto::agent::v1::shell_service_server::ShellServiceServer;
use shared::proto::agent::v1::snapshot_service_server::SnapshotServiceServer;
use shared::proto::agent::v1::watch_service_server::WatchServiceServer;
use shared::secret::Secret;
use shared::transport::Address;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::service::InterceptorLayer;
use tonic::transport::Server;

use crate::auth::TokenCheck;
use crate::context::AgentContext;
pub use crate::options::{AgentOptions, default_journal_dir};

/// How long in-flight streams (follows, spawns) may take to finish after a
/// shutdown signal before the server stops anyway.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Resolves on the first SIGTERM or SIGINT. A second signal exits at once.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("sigterm received, shutting down"),
        _ = int.recv() => tracing::info!("sigint received, shutting down"),
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal, exiting now");
        std::process::exit(130);
    });
}

/// The router with every service, behind the token check.
fn router(
    ctx: &AgentContext,
    token: Secret,
    egress: crate::egress::Egress,
) -> anyhow::Result<
    tonic::transport::server::Router<
        tower::layer::util::Stack<InterceptorLayer<TokenCheck>, tower::layer::util::Identity>,
    >,
> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(shared::AGENT_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let (health_reporter, health) = tonic_health::server::health_reporter();
    drop(health_reporter);
    let router = Server::builder()
        .max_concurrent_streams(Some(shared::limits::MAX_STREAMS_PER_CONNECTION))
        .http2_keepalive_interval(Some(shared::limits::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(shared::limits::KEEPALIVE_TIMEOUT))
        .layer(InterceptorLayer::new(TokenCheck::new(token)))
        .add_service(health)
        .add_service(reflection)
        .add_service(shared::sized!(InfoServiceServer::new(crate::info::Info::new(ctx))))
        .add_service(shared::sized!(ProcessServiceServer::new(crate::process::Processes::new(ctx))))
        .add_service(shared::sized!(PortServiceServer::new(crate::port::Ports::new(ctx))))
        .add_service(shared::sized!(ShellServiceServer::new(crate::shell::Shells::new(ctx))))
        .add_service(shared::sized!(FsServiceServer::new(crate::fs::Files::new(ctx))))
        .add_service(shared::sized!(JournalServiceServer::new(crate::journal::Journal::new(ctx))))
        .add_service(shared::sized!(RequestServiceServer::new(crate::requests::Requests::new(ctx))))
        .add_service(shared::sized!(WatchServiceServer::new(crate::watch::Watch::new(ctx))))
        .add_service(shared::sized!(SnapshotServiceServer::new(crate::snapshot::Snapshots::new(ctx))))
        .add_service(shared::sized!(SecretServiceServer::new(crate::secrets::Secrets::new(ctx))))
        .add_service(shared::sized!(EgressServiceServer::new(egress)));
    Ok(router)
}

/// Serve until `shutdown` resolves, then drain in-flight calls for at most
/// [`DRAIN_TIMEOUT`].
pub async fn serve(
    options: AgentOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let ctx = AgentContext::new(&options)?;
    // Lives as long as the agent: it listens again on what the journal dir
    // keeps, and closes when serving ends.
    let egress = crate::egress::Egress::new(&ctx);
    let router = router(&ctx, options.token.clone(), egress.clone())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let stopping = egress.clone();
    tokio::spawn(async move {
        shutdown.await;
        // Idle carriers would hold the drain up until its timeout.
        stopping.stop();
        let _ = stop_tx.send(true);
    });

    let serving = async {
        match &options.listen {
            Address::Unix(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                }
                // A socket left by a previous agent (killed or crashed) would
                // make bind fail; nobody can be listening on it any more.
                let _ = std::fs::remove_file(path);
                let listener = tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("binding unix socket {}", path.display()))?;
                tracing::info!(listen = %options.listen, root = %ctx.root.path().display(), journal_dir = %ctx.journal_dir.display(), "agent listening");
                router
                    .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped)
                    .await
                    .context("serving")
            }
            Address::Node { .. } => {
                anyhow::bail!("the agent listens on a unix socket or loopback, not {}", options.listen)
            }
            Address::Tcp(addr) => {
                anyhow::ensure!(
                    addr.ip().is_loopback(),
                    "the agent listens on loopback only (got {addr}); use a unix socket for anything else"
                );
                let listener =
                    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
                tracing::info!(listen = %options.listen, local = %listener.local_addr()?, root = %ctx.root.path().display(), "agent listening");
                router
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopped)
                    .await
                    .context("serving")
            }
        }
    };
    let mut drain_rx = stop_rx;
    let drain_deadline = async move {
        let _ = drain_rx.wait_for(|s| *s).await;
        tokio::time::sleep(DRAIN_TIMEOUT).await;
        tracing::warn!("drain timeout reached, closing remaining streams");
    };
    let result = tokio::select! {
        r = serving => r,
        _ = drain_deadline => Ok(()),
    };
    egress.stop();
    if let Address::Unix(path) = &options.listen {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("agent stopped");
    result
}
