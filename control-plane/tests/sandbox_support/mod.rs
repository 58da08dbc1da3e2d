//! Shared pieces of the `SandboxService` tests: a real server on a random
//! port with two tenants, ensure and exec helpers, captured logs to search
//! for secrets, and Docker cleanup by tenant label.

#![allow(dead_code)]

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use control_plane::config::{ConfigLayer, ServeConfig};
use control_plane::server::RunningServer;
use shared::proto::v1 as api;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::provider_support;

pub const PATIENCE: Duration = Duration::from_secs(180);
pub const BUSYBOX: &str = "sandhold-test-busybox:latest";

pub type Client = SandboxServiceClient<InterceptedService<Channel, Bearer>>;

pub use sandhold_tests::auth::{Bearer, bearer};

/// Everything the server logs in this test binary, to search for secrets.
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

pub struct Harness {
    pub server: Option<RunningServer>,
    pub dir: tempfile::TempDir,
    pub nonce: String,
    pub tenant: String,
    pub acme: Client,
    pub other: Client,
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    pub async fn start_with(database_url: Option<String>) -> Self {
        captured_logs();
        let dir = tempfile::Builder::new().prefix("sh").tempdir_in("/tmp").unwrap();
        let nonce = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
        let tenant = format!("acme{nonce}");
        let agent = provider_support::static_agent();
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
            ..Default::default()
        };
        let config = ServeConfig::resolve(layer).unwrap();
        let server = control_plane::server::start(config, CancellationToken::new()).await.unwrap();
        let addr = server.local_addr();
        let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let client = |token: String| SandboxServiceClient::with_interceptor(channel.clone(), bearer(&token));
        let acme = client(format!("tok-a-{nonce}"));
        let other = client(format!("tok-b-{nonce}"));
        let mut h = Self { server: Some(server), dir, nonce, tenant, acme, other };
        // Wait for readiness (stores open in the background).
        let until = std::time::Instant::now() + PATIENCE;
        loop {
            match h.acme.list_definitions(api::ListDefinitionsRequest {}).await {
                Ok(_) => break,
                Err(s) if s.code() == tonic::Code::Unavailable && std::time::Instant::now() < until => {
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

/// Removes every container and snapshot image of the test's tenant, also
/// when the test fails.
pub struct DockerCleanup {
    pub tenant: String,
}

impl Drop for DockerCleanup {
    fn drop(&mut self) {
        let ids = docker_ids("ps", &format!("label=dev.sandhold.tenant={}", self.tenant));
        if !ids.is_empty() {
            let _ = std::process::Command::new("docker").arg("rm").arg("-f").args(&ids).output();
        }
        let images = docker_ids("images", &format!("label=dev.sandhold.tenant={}", self.tenant));
        if !images.is_empty() {
            let _ = std::process::Command::new("docker").args(["rmi", "-f"]).args(&images).output();
        }
    }
}

pub fn docker_ids(what: &str, filter: &str) -> Vec<String> {
    let mut cmd = std::process::Command::new("docker");
    cmd.arg(what);
    if what == "ps" {
        cmd.arg("-a");
    }
    let out = cmd.args(["-q", "--filter", filter]).output().expect("docker");
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Local,
    Docker,
}

/// All events of one ensure: the progress in order, then the ready or the
/// error that ended the stream. Panics if anything follows the end.
pub async fn ensure(
    client: &mut Client,
    req: api::EnsureSandboxRequest,
) -> (Vec<api::EnsureProgress>, Result<api::EnsureReady, tonic::Status>) {
    let mut stream =
        tokio::time::timeout(PATIENCE, client.ensure_sandbox(req)).await.unwrap().unwrap().into_inner();
    let mut progress = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, stream.message()).await.expect("ensure stalled") {
            Ok(Some(m)) => match m.event.unwrap() {
                api::ensure_sandbox_response::Event::Progress(p) => progress.push(p),
                api::ensure_sandbox_response::Event::Ready(r) => {
                    assert!(stream.message().await.unwrap().is_none(), "nothing after ready");
                    return (progress, Ok(r));
                }
            },
            Ok(None) => panic!("ensure stream ended without ready or error"),
            Err(status) => return (progress, Err(status)),
        }
    }
}

pub fn phases(progress: &[api::EnsureProgress]) -> Vec<api::EnsurePhase> {
    let mut out: Vec<api::EnsurePhase> = Vec::new();
    for p in progress {
        let phase = api::EnsurePhase::try_from(p.phase).unwrap();
        if out.last() != Some(&phase) {
            out.push(phase);
        }
    }
    out
}

pub async fn sh(client: &mut Client, sandbox: &str, script: &str) -> (i32, String) {
    let resp = client
        .exec(api::ExecRequest {
            sandbox_id: sandbox.into(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell(script.into())) }),
            timeout_ms: Some(60_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let code = match resp.status.and_then(|s| s.status) {
        Some(api::exit_status::Status::Code(c)) => c,
        other => panic!("no exit code: {other:?}"),
    };
    (code, String::from_utf8_lossy(&resp.stdout).into_owned())
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every row of every table of the public schema, as text.
pub async fn table_dump(url: &str) -> String {
    use sqlx::{Connection, Row};
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let tables: Vec<String> =
        sqlx::query("SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.get::<String, _>(0))
            .collect();
    let mut dump = String::new();
    for table in tables {
        let rows =
            sqlx::query(&format!("SELECT t::text FROM \"{table}\" t")).fetch_all(&mut conn).await.unwrap();
        for r in rows {
            dump.push_str(&r.get::<String, _>(0));
            dump.push('\n');
        }
    }
    dump
}
