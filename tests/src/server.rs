//! Servers for the tests: real `sandhold serve` child processes
//! ([`ServerProcess`]) and servers embedded in the test process
//! ([`embedded`], [`Harness`]), with typed, authenticated clients.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use control_plane::config::{ConfigLayer, ServeConfig};
use control_plane::server::RunningServer;
use shared::proto::v1 as api;
use shared::proto::v1::admin_service_client::AdminServiceClient;
use shared::proto::v1::run_service_client::RunServiceClient;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::agent::static_agent;
use crate::auth::{Bearer, bearer};
use crate::local::TestDir;
use crate::wait::PATIENCE;

pub type Runs = RunServiceClient<InterceptedService<Channel, Bearer>>;
pub type Sandboxes = SandboxServiceClient<InterceptedService<Channel, Bearer>>;
pub type Admin = AdminServiceClient<InterceptedService<Channel, Bearer>>;
pub type Snapshots =
    shared::proto::v1::snapshot_service_client::SnapshotServiceClient<InterceptedService<Channel, Bearer>>;

/// Options of one server process.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// Shared by replicas; each test gets its own, inside a [`TestDir`]
    /// (which kills the local sandboxes in it when the test ends).
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub redis_url: Option<String>,
    pub replica_id: Option<String>,
    pub lease_ttl_ms: Option<u64>,
    pub lease_renew_ms: Option<u64>,
    /// `tenant=token` pairs.
    pub tokens: Vec<String>,
    /// More `sandhold serve` flags (e.g. the reaper's).
    pub extra_args: Vec<String>,
    /// More environment (e.g. `DOCKER_HOST`).
    pub env: Vec<(String, String)>,
    /// Listen on this address instead of loopback (a fleet's control plane,
    /// reached from nodes in other network namespaces).
    pub listen_ip: Option<std::net::IpAddr>,
    /// The operator policy as shipped. Otherwise (the default) the server
    /// keeps the local provider on with tokens (`--allow-local-with-tokens`),
    /// which the tests of runs and takeovers sandbox in.
    pub operator_defaults: bool,
}

/// A server with API tokens in a fresh data dir: one tenant whose token the
/// test uses (`t<nonce>`, `tok-<nonce>`), and `others` more tenants
/// (`<name><nonce>`, token `<name>-<nonce>`) that only exist.
pub struct TenantServer {
    pub server: ServerProcess,
    pub tenant: String,
    pub token: String,
    pub nonce: String,
    _dir: TestDir,
}

impl TenantServer {
    /// On the embedded stores (SQLite, in-process leases).
    pub async fn start(prefix: &str, others: &[&str]) -> Self {
        Self::start_on(prefix, others, None, None).await
    }

    /// On the embedded stores, with more `sandhold serve` flags.
    pub async fn start_with_args(prefix: &str, others: &[&str], extra_args: &[&str]) -> Self {
        Self::start_full(prefix, others, None, None, extra_args).await
    }

    /// On the given database and Redis (`None`: the embedded ones).
    pub async fn start_on(
        prefix: &str,
        others: &[&str],
        database_url: Option<String>,
        redis_url: Option<String>,
    ) -> Self {
        Self::start_full(prefix, others, database_url, redis_url, &[]).await
    }

    /// On the given stores, with more `sandhold serve` flags.
    pub async fn start_full(
        prefix: &str,
        others: &[&str],
        database_url: Option<String>,
        redis_url: Option<String>,
        extra_args: &[&str],
    ) -> Self {
        let dir = TestDir::new(prefix);
        let nonce = crate::nonce();
        let tenant = format!("t{nonce}");
        let token = format!("tok-{nonce}");
        let mut tokens = vec![format!("{tenant}={token}")];
        tokens.extend(others.iter().map(|o| format!("{o}{nonce}={o}-{nonce}")));
        let opts = ServerOptions {
            data_dir: dir.path().join("data"),
            tokens,
            database_url,
            redis_url,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        };
        let server = ServerProcess::start(&opts).await;
        Self { server, tenant, token, nonce, _dir: dir }
    }

    /// The token of `other`, one of the `others` it was started with.
    pub fn token_of(&self, other: &str) -> String {
        format!("{other}-{}", self.nonce)
    }

    /// Waits for the checkpoint of `thread` saved after `run` (once the run
    /// is terminal).
    pub async fn wait_checkpoint(&self, thread: &str, run: &str) {
        self.server.wait_checkpoint(&self.token, thread, run).await;
    }
}

/// A `sandhold serve` child process on a loopback port, killed on drop. Its
/// log is kept in `<data_dir>/<replica>.log` and printed when a test fails.
/// The local sandboxes it makes outlive it by design: put its data dir in
/// a [`TestDir`].
pub struct ServerProcess {
    pub addr: String,
    pub log: PathBuf,
    data_dir: PathBuf,
    child: tokio::process::Child,
}

impl ServerProcess {
    /// Waits for the checkpoint of `thread` saved after `run` (once the run
    /// is terminal), as the tenant of `token` sees it.
    pub async fn wait_checkpoint(&self, token: &str, thread: &str, run: &str) {
        let snapshots = self.snapshots(token).await;
        let saved = crate::wait::eventually(crate::wait::PATIENCE, || {
            let mut snapshots = snapshots.clone();
            let request = api::ListSnapshotsRequest { thread_id: thread.into() };
            async move {
                let listed = snapshots.list_snapshots(request).await;
                listed.is_ok_and(|l| l.into_inner().checkpoints.iter().any(|c| c.run_id == run))
            }
        })
        .await;
        assert!(saved, "no checkpoint after {run}:\n{}", self.log_text());
    }

    pub async fn start(opts: &ServerOptions) -> Self {
        let mut server = Self::spawn(opts);
        if let Some(status) = server.ready_or_exit().await {
            panic!("server exited early ({status}):\n{}", server.log_text());
        }
        server
    }

    /// A server that must refuse to start: its exit (a failure) is waited
    /// for, and its log returned for the test to read why. Panics if it
    /// becomes ready instead.
    pub async fn refused(opts: &ServerOptions) -> String {
        let mut server = Self::spawn(opts);
        match server.ready_or_exit().await {
            Some(status) => {
                assert!(!status.success(), "server exited with success:\n{}", server.log_text());
                server.log_text()
            }
            None => panic!("server became ready where it must refuse to start:\n{}", server.log_text()),
        }
    }

    fn spawn(opts: &ServerOptions) -> Self {
        let ip = opts.listen_ip.unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
        let port = std::net::TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port();
        let addr = std::net::SocketAddr::new(ip, port).to_string();
        let replica = opts.replica_id.clone().unwrap_or_else(|| format!("replica-{port}"));
        std::fs::create_dir_all(&opts.data_dir).unwrap();
        let log = opts.data_dir.join(format!("{replica}.log"));
        let agent = static_agent();
        let mut cmd = tokio::process::Command::new(crate::cli::sandhold_bin());
        cmd.args(["serve", "--listen", &addr, "--replica-id", &replica, "--shutdown-grace-ms", "5000"])
            .arg("--data-dir")
            .arg(&opts.data_dir)
            .arg("--agent-binary")
            .arg(&agent)
            .arg("--agent-static-binary")
            .arg(&agent)
            .env("SANDHOLD_LOG", "info,control_plane=debug")
            .env_remove("SANDHOLD_DATABASE_URL")
            .env_remove("SANDHOLD_REDIS_URL")
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap())
            .kill_on_drop(true);
        if let Some(url) = &opts.database_url {
            cmd.args(["--database-url", url]);
        }
        if let Some(url) = &opts.redis_url {
            cmd.args(["--redis-url", url]);
        }
        if let Some(ms) = opts.lease_ttl_ms {
            cmd.args(["--lease-ttl-ms", &ms.to_string()]);
        }
        if let Some(ms) = opts.lease_renew_ms {
            cmd.args(["--lease-renew-ms", &ms.to_string()]);
        }
        if !opts.tokens.is_empty() {
            cmd.env("SANDHOLD_TOKENS", opts.tokens.join(","));
        }
        if !opts.operator_defaults {
            cmd.arg("--allow-local-with-tokens");
        }
        cmd.args(&opts.extra_args).envs(opts.env.iter().map(|(k, v)| (k, v)));
        let child = cmd.spawn().expect("spawning sandhold serve");
        Self { addr, log, data_dir: opts.data_dir.clone(), child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("server still running")
    }

    /// The token of a server without API tokens (its data dir's
    /// `local-token` file), as the operator's CLI reads it.
    pub fn local_token(&self) -> String {
        local_token(&self.data_dir)
    }

    /// Its data dir (with the embedded SQLite database, when it has no
    /// other).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `None` once it reports SERVING, or how it exited before.
    async fn ready_or_exit(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(ch) = Channel::from_shared(format!("http://{}", self.addr)).unwrap().connect().await {
                let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
                if let Ok(r) =
                    health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await
                    && r.into_inner().status
                        == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return None;
                }
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            assert!(Instant::now() < deadline, "server never became ready:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr)).unwrap().connect().await.unwrap()
    }

    pub async fn runs(&self, token: &str) -> Runs {
        shared::sized!(RunServiceClient::with_interceptor(self.channel().await, bearer(token)))
            .max_decoding_message_size(64 << 20)
    }

    pub async fn sandboxes(&self, token: &str) -> Sandboxes {
        shared::sized!(SandboxServiceClient::with_interceptor(self.channel().await, bearer(token)))
    }

    pub async fn snapshots(&self, token: &str) -> Snapshots {
        use shared::proto::v1::snapshot_service_client::SnapshotServiceClient;
        shared::sized!(SnapshotServiceClient::with_interceptor(self.channel().await, bearer(token)))
    }

    pub async fn admin(&self, token: &str) -> Admin {
        shared::sized!(AdminServiceClient::with_interceptor(self.channel().await, bearer(token)))
    }

    /// SIGKILL, no goodbye.
    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    pub fn signal(&self, signal: &str) {
        let status =
            std::process::Command::new("kill").args([signal, &self.pid().to_string()]).status().unwrap();
        assert!(status.success());
    }

    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(PATIENCE, self.child.wait()).await.expect("server exits").unwrap()
    }
}

/// The token in `data_dir`'s `local-token` file (written by a server
/// without API tokens, mode 600).
pub fn local_token(data_dir: &Path) -> String {
    let path = control_plane::auth::local::path(data_dir);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading the local token {}: {e}", path.display()))
        .trim()
        .to_string()
}

/// An embedded server on a loopback port, its data under `dir` (and in
/// `database_url`; default: SQLite there), the static agent for local and
/// Docker sandboxes; with a channel to it (calls need its
/// [`RunningServer::local_token`]). Dropping the handle stops it;
/// `dir` should be a [`TestDir`]'s, so its local sandboxes go with it.
pub async fn embedded(dir: &Path, database_url: Option<String>) -> (RunningServer, Channel) {
    let agent = static_agent();
    let layer = ConfigLayer {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: Some(dir.to_path_buf()),
        database_url,
        agent_binary: Some(agent.clone()),
        agent_static_binary: Some(agent),
        ..Default::default()
    };
    let config = ServeConfig::resolve(layer).unwrap();
    let server = control_plane::server::start(config, CancellationToken::new()).await.unwrap();
    // Ready, so its local token is there to be read.
    server.ready(Duration::from_secs(60)).await.expect("the embedded server became ready");
    let channel =
        Channel::from_shared(format!("http://{}", server.local_addr())).unwrap().connect().await.unwrap();
    (server, channel)
}

/// Everything the embedded servers log in this test binary, to search for
/// secrets.
pub fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter("debug,h2=info,hyper=info,tower=info,sqlx=info,bollard=info")
            .with_writer(move || Capture(sink.clone()))
            .try_init();
        logs
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An embedded server with two tenants (`acme...` and `other...`), a
/// SandboxService client for each, and its logs captured. Its data dir is
/// a [`TestDir`]: the local sandboxes it made die with the harness.
pub struct Harness {
    pub server: Option<RunningServer>,
    pub dir: TestDir,
    pub nonce: String,
    pub tenant: String,
    pub acme: Sandboxes,
    pub other: Sandboxes,
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    pub async fn start_with(database_url: Option<String>) -> Self {
        captured_logs();
        let dir = TestDir::new("sh");
        let nonce = crate::nonce();
        let tenant = format!("acme{nonce}");
        let agent = static_agent();
        let layer = ConfigLayer {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            data_dir: Some(dir.path().to_path_buf()),
            database_url,
            shutdown_grace_ms: Some(5_000),
            tokens: Some(vec![
                format!("{tenant}=tok-a-{nonce}").parse().unwrap(),
                format!("other{nonce}=tok-b-{nonce}").parse().unwrap(),
            ]),
            agent_binary: Some(agent.clone()),
            agent_static_binary: Some(agent),
            // Opt-ins of the fixtures: local sandboxes beside Docker ones
            // and read-only binds of test repositories (all under /tmp).
            allow_local_with_tokens: Some(true),
            docker_bind_prefixes: Some(vec!["/tmp".into()]),
            ..Default::default()
        };
        let config = ServeConfig::resolve(layer).unwrap();
        let server = control_plane::server::start(config, CancellationToken::new()).await.unwrap();
        let addr = server.local_addr();
        let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let client = |token: String| {
            shared::sized!(SandboxServiceClient::with_interceptor(channel.clone(), bearer(&token)))
        };
        let acme = client(format!("tok-a-{nonce}"));
        let other = client(format!("tok-b-{nonce}"));
        let mut h = Self { server: Some(server), dir, nonce, tenant, acme, other };
        // Wait for readiness (stores open in the background).
        let until = Instant::now() + PATIENCE;
        loop {
            match h.acme.list_definitions(api::ListDefinitionsRequest {}).await {
                Ok(_) => break,
                Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(s) => panic!("server never became ready: {s}"),
            }
        }
        h
    }

    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop().await.unwrap();
        }
    }
}
