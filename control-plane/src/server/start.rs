//! Binding and serving: refuse an exposed server without tokens (or with
//! tokens in plain text), bind (with TLS when configured),
//! mount health, reflection and the four gated public services (also as
//! gRPC-Web, behind the console and the origin gate), start the metrics
//! endpoint, then hand readiness and shutdown to the supervisor.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use shared::secret::Secret;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic_health::ServingStatus;
use tracing::{info, warn};

use super::activity::{Activity, ActivityLayer};
use super::built::{BuiltCell, Slots};
use super::gate::gate;
use super::health::set_health;
use super::ready;
use super::shutdown::{Serving, supervise};
use super::tls::{self, Certificate};
use super::web::{Hosts, Origins, WebLayer};
use crate::auth::{self, AuthLayer, Authenticator, SINGLE_USER_TENANT};
use crate::config::{ServeConfig, redact_url};
use crate::context::Context;

/// A server started with [`start`].
pub struct RunningServer {
    listening: Listening,
    metrics_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    built: Arc<BuiltCell>,
    auth: Authenticator,
    activity: Activity,
    task: JoinHandle<anyhow::Result<()>>,
}

/// Where a server accepts calls.
#[derive(Debug, Clone)]
pub enum Listening {
    Tcp(SocketAddr),
    /// `ServeConfig::listen_unix`: only the server's own user may connect.
    Unix(PathBuf),
}

impl std::fmt::Display for Listening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listening::Tcp(addr) => write!(f, "{addr}"),
            Listening::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl RunningServer {
    /// The bound TCP address (useful with port 0).
    ///
    /// # Panics
    /// On a server listening on a Unix socket (see [`RunningServer::listening`]).
    pub fn local_addr(&self) -> SocketAddr {
        match &self.listening {
            Listening::Tcp(addr) => *addr,
            Listening::Unix(path) => panic!("the server listens on the Unix socket {}", path.display()),
        }
    }

    /// Where the server accepts calls.
    pub fn listening(&self) -> &Listening {
        &self.listening
    }

    /// How long the server has driven no run and had no call in flight
    /// (streams count until they end); zero while it does either. The
    /// background server stops after a long enough quiet.
    pub fn quiet_for(&self) -> std::time::Duration {
        if self.built.get().is_some_and(|b| b.runs.driving() > 0) {
            return std::time::Duration::ZERO;
        }
        self.activity.quiet_for()
    }

    /// Where `/metrics` is served, when `metrics_listen` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The token every call needs in single-user mode (the data dir's
    /// `local-token` file), once ready; `None` with API tokens.
    pub fn local_token(&self) -> Option<&Secret> {
        self.auth.local_token()
    }

    /// What the services share, once the stores are open.
    pub fn context(&self) -> Option<Context> {
        self.built.get().map(|b| b.cx.clone())
    }

    /// Wait until the stores are open and the services built; `None` if
    /// that takes longer than `within`.
    pub async fn ready(&self, within: std::time::Duration) -> Option<Context> {
        tokio::time::timeout(within, self.built.filled().cancelled()).await.ok()?;
        self.context()
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

/// Refuse to expose a server without authentication, or its tokens in
/// plain text (unless the operator says a layer below protects them).
fn check_exposure(config: &ServeConfig) -> anyhow::Result<()> {
    if config.listen_unix.is_some() || config.listen.ip().is_loopback() {
        return Ok(());
    }
    if config.single_user() {
        bail!(
            "refusing to listen on {} without API tokens: anyone who can reach it would act as one tenant. \
             Configure tokens (--tokens-file FILE, SANDHOLD_TOKENS, or [[tokens]] in the config file) \
             or listen on a loopback address such as 127.0.0.1",
            config.listen
        );
    }
    if config.tls().is_none() && !config.insecure_listen {
        bail!(
            "refusing to serve API tokens in plain text on {}: anyone on the network path could read them. \
             Configure TLS (--tls-cert FILE --tls-key FILE), listen on a loopback address, or pass \
             --insecure-listen if something else protects the traffic (a TLS-terminating proxy, a private link)",
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
    let tls = config.tls().map(Certificate::load).transpose()?;
    let listener = match &config.listen_unix {
        Some(path) => {
            if tls.is_some() {
                bail!("TLS is for TCP listeners; a Unix socket is reached only on this machine");
            }
            Listener::Unix(bind_unix(path)?)
        }
        None => Listener::Tcp(
            TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("listening on {}", config.listen))?,
        ),
    };
    let listening = match &listener {
        Listener::Tcp(l) => Listening::Tcp(l.local_addr()?),
        Listener::Unix(_) => {
            Listening::Unix(config.listen_unix.clone().expect("a Unix listener has its path"))
        }
    };
    let local_addr = &listening;

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
    let built: Arc<BuiltCell> = Arc::default();
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
            token_file = %auth::local::path(&config.data_dir).display(),
            "no API tokens configured: single-user mode, every caller with the token of the token file is \
             tenant {SINGLE_USER_TENANT:?}"
        );
    }
    // Without tokens, a request named for another host is a DNS-rebinding
    // page (or a proxy) relaying to loopback: refused before anything else.
    // No browser reaches a Unix socket.
    let hosts = (config.single_user() && config.listen_unix.is_none())
        .then(|| Hosts::new(config.allowed_hosts.clone()));
    let activity = Activity::default();

    let (admin, admin_slot) = gate();
    let (snapshot, snapshot_slot) = gate();
    let (sandbox, sandbox_slot) = gate();
    let (runs, runs_slot) = gate();
    let (nodes, nodes_slot) = gate();
    let slots = Slots {
        admin: admin_slot,
        snapshot: snapshot_slot,
        sandbox: sandbox_slot,
        runs: runs_slot,
        nodes: nodes_slot,
    };
    // HTTP/1.1 too: browsers speak gRPC-Web over it on a plain-text port.
    // Outermost first: the console and the origin gate, CORS headers,
    // gRPC-Web translation, then the same auth and deadlines as native gRPC.
    let origins = Origins::new(config.cors_origins.clone());
    let router = tonic::transport::Server::builder()
        .accept_http1(true)
        .max_concurrent_streams(Some(shared::limits::MAX_STREAMS_PER_CONNECTION))
        .http2_keepalive_interval(Some(shared::limits::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(shared::limits::KEEPALIVE_TIMEOUT))
        .layer(WebLayer::new(origins.clone(), hosts))
        .layer(origins.cors_layer())
        .layer(tonic_web::GrpcWebLayer::new())
        .layer(ActivityLayer(activity.clone()))
        .layer(super::spans::SpanLayer)
        .layer(AuthLayer::new(auth.clone()))
        .layer(super::deadline::DeadlineLayer::new(super::deadline::Deadlines::default()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(admin)
        .add_service(snapshot)
        .add_service(sandbox)
        .add_service(runs)
        .add_service(nodes);

    if config.listen_unix.is_none() && !config.listen.ip().is_loopback() && tls.is_none() {
        warn!(listen = %local_addr, "--insecure-listen: API tokens travel in plain text");
    }
    info!(
        listen = %local_addr,
        tls = tls.is_some(),
        replica_id = %config.replica_id,
        metrics = metrics_addr.map(|a| format!("http://{a}/metrics")).unwrap_or_else(|| "off".into()),
        console = %match local_addr {
            Listening::Tcp(addr) => format!("{}://{addr}/", if tls.is_some() { "https" } else { "http" }),
            Listening::Unix(_) => "none (a Unix socket)".into(),
        },
        database = %redact_url(&config.database_url),
        redis = config.redis_url.as_deref().map(redact_url).unwrap_or_else(|| "none (in-process leases)".into()),
        "sandhold serving"
    );
    let stop_accepting = CancellationToken::new();
    let serving = match (listener, tls) {
        (Listener::Tcp(listener), Some(certificate)) => {
            let acceptor = certificate.acceptor()?;
            certificate.watch(shutdown.clone(), &loops)?;
            let incoming = tls::incoming(listener, acceptor, stop_accepting.clone(), &loops);
            tokio::spawn(
                router.serve_with_incoming_shutdown(incoming, stop_accepting.clone().cancelled_owned()),
            )
        }
        (Listener::Tcp(listener), None) => tokio::spawn(router.serve_with_incoming_shutdown(
            // tonic sets TCP_NODELAY only on the listener it binds itself;
            // without it a small answer after another (a stream's last
            // message, its trailers) waits for the client's delayed ACK:
            // 40 ms of every warm EnsureSandbox.
            TcpListenerStream::new(listener).map(|accepted| {
                if let Ok(tcp) = &accepted {
                    let _ = tcp.set_nodelay(true);
                }
                accepted
            }),
            stop_accepting.clone().cancelled_owned(),
        )),
        (Listener::Unix(listener), _) => tokio::spawn(router.serve_with_incoming_shutdown(
            UnixListenerStream::new(listener).filter(same_user),
            stop_accepting.clone().cancelled_owned(),
        )),
    };
    let readiness = ready::Readiness {
        config: config.clone(),
        auth: auth.clone(),
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
    Ok(RunningServer { listening, metrics_addr, shutdown, built, auth, activity, task })
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// The longest path a Unix socket address holds (`sun_path`, less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Bind `path` for this user alone: its folder is made (or must already
/// be) this user's with mode 0700, the socket 0600; a socket file left by
/// a server that is gone is replaced. Connections are checked again as
/// they come ([`same_user`]).
fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        bail!(
            "the socket path {} is longer than a Unix socket address holds ({MAX_SOCKET_PATH} bytes): \
             use a shorter --data-dir",
            path.display()
        );
    }
    let dir = path.parent().context("a socket path has a folder")?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let meta = std::fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        bail!(
            "{} belongs to another user (uid {}): refusing to put this user's socket in it",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the old socket {}", path.display())),
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("listening on unix:{}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} private (0600)", path.display()))?;
    Ok(listener)
}

/// A connection to the Unix socket from another user is dropped unserved,
/// whatever the file modes say.
fn same_user(conn: &std::io::Result<tokio::net::UnixStream>) -> bool {
    let Ok(stream) = conn else { return true };
    let me = nix::unistd::geteuid().as_raw();
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == me => true,
        Ok(cred) => {
            warn!(peer_uid = cred.uid(), peer_pid = ?cred.pid(), "refused a connection from another user");
            false
        }
        Err(e) => {
            warn!(error = %e, "refused a connection whose peer is unknown");
            false
        }
    }
}
