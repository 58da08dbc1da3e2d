//! The Prometheus endpoint of the real `sandhold serve` binary: off unless
//! asked for, on its own port, and its series move with what the server does
//! (sandbox ensures through the API, runs in the database it samples).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use control_plane::metrics::sample;
use control_plane::store::{NewRun, RunId, Stores};
use sandhold_tests::auth::{Bearer, bearer};
use sandhold_tests::wait::PATIENCE;
use shared::proto::v1 as api;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

type Client = SandboxServiceClient<InterceptedService<Channel, Bearer>>;

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `sandhold serve` on loopback, single-user, with its log in the data dir.
struct Server {
    child: Child,
    grpc: SocketAddr,
    dir: sandhold_tests::local::TestDir,
}

impl Server {
    fn start(metrics: Option<SocketAddr>) -> Self {
        let dir = sandhold_tests::local::TestDir::new("shm");
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let agent = sandhold_tests::agent::static_agent();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandhold"));
        for (k, _) in std::env::vars() {
            if k.starts_with("SANDHOLD_") {
                cmd.env_remove(k);
            }
        }
        cmd.args(["serve", "--listen", &grpc.to_string(), "--shutdown-grace-ms", "3000"])
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--agent-binary")
            .arg(&agent)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(addr) = metrics {
            // Through the variable, so the env half of the flag is covered too.
            cmd.env("SANDHOLD_METRICS_LISTEN", addr.to_string());
        }
        let child = cmd.spawn().expect("starting sandhold serve");
        Self { child, grpc, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// A client once the server answers, with the local token a server
    /// without API tokens writes into its data dir when it is ready.
    async fn client(&mut self) -> Client {
        let deadline = Instant::now() + PATIENCE;
        let token_file = control_plane::auth::local::path(self.dir.path());
        loop {
            if let Ok(token) = std::fs::read_to_string(&token_file)
                && let Ok(channel) =
                    Channel::from_shared(format!("http://{}", self.grpc)).unwrap().connect().await
            {
                let mut client = SandboxServiceClient::with_interceptor(channel, bearer(token.trim()));
                match client.list_definitions(api::ListDefinitionsRequest {}).await {
                    Ok(_) => return client,
                    Err(s) if s.code() == tonic::Code::Unavailable => {}
                    Err(s) => panic!("list_definitions: {s}\n{}", self.log()),
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sandhold exited with {status}:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "server never became ready:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "sandhold exited with {status} after SIGTERM:\n{}", self.log());
    }
}

/// One HTTP/1.1 request; the status code and the body.
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let content_type =
        head.lines().find_map(|l| l.strip_prefix("content-type: ")).unwrap_or_default().to_string();
    (code, content_type, body.to_string())
}

pub(crate) fn scrape(addr: SocketAddr) -> String {
    let (code, content_type, body) = http(addr, "GET", "/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    body
}

pub(crate) fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("{series} missing in:\n{text}"))
}

fn ensures(text: &str, outcome: &str) -> f64 {
    value(text, &format!("sandhold_sandbox_ensures_total{{outcome=\"{outcome}\"}}"))
}

async fn ensure(
    client: &mut Client,
    definition: &str,
    thread: &str,
) -> Result<api::EnsureReady, tonic::Status> {
    let req = api::EnsureSandboxRequest {
        definition_id: definition.into(),
        thread_id: thread.into(),
        ..Default::default()
    };
    let mut stream = client.ensure_sandbox(req).await?.into_inner();
    loop {
        match tokio::time::timeout(PATIENCE, stream.message()).await.expect("ensure stalled")? {
            Some(api::EnsureSandboxResponse {
                event: Some(api::ensure_sandbox_response::Event::Ready(r)),
            }) => {
                return Ok(r);
            }
            Some(_) => {}
            None => panic!("ensure ended without ready"),
        }
    }
}

async fn put_definition(client: &mut Client, id: &str, setup: &str) {
    let definition = api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec {
            provider: Some(api::provider_spec::Provider::Local(api::LocalProvider {})),
        }),
        workspace: Some(api::WorkspaceDefinition {
            setup: vec![api::SetupStep { step: Some(api::setup_step::Step::Serial(setup.into())) }],
            ..Default::default()
        }),
        ..Default::default()
    };
    client.put_definition(api::PutDefinitionRequest { definition: Some(definition) }).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_move_with_activity() {
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut server = Server::start(Some(metrics));
    let mut client = server.client().await;

    let before = scrape(metrics);
    assert_eq!(value(&before, "sandhold_drives_active"), 0.0);
    assert_eq!(value(&before, "sandhold_runs{status=\"running\"}"), 0.0);
    for outcome in ["created", "resumed", "failed"] {
        assert_eq!(ensures(&before, outcome), 0.0, "fresh process: {outcome}");
    }

    put_definition(&mut client, "ok", "echo ready").await;
    put_definition(&mut client, "broken", "exit 3").await;
    let first = ensure(&mut client, "ok", "t1").await.unwrap();
    assert_eq!(first.outcome(), api::EnsureOutcome::Created);
    let again = ensure(&mut client, "ok", "t1").await.unwrap();
    assert_eq!(again.outcome(), api::EnsureOutcome::Resumed);
    let status = ensure(&mut client, "broken", "t2").await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status}");

    // A run in the database the server samples (runs are not served over
    // the API yet): SQLite lets this process write the server's file.
    let stores =
        Stores::open(&format!("sqlite://{}/sandhold.db", server.dir.path().display())).await.unwrap();
    stores
        .runs
        .create_or_resume(NewRun::bare(RunId::parse("metrics-e2e").unwrap(), "default", "t1"))
        .await
        .unwrap();
    stores.close().await;

    let after = scrape(metrics);
    assert_eq!(ensures(&after, "created"), 1.0, "{after}");
    assert_eq!(ensures(&after, "resumed"), 1.0, "{after}");
    assert_eq!(ensures(&after, "failed"), 1.0, "{after}");
    assert_eq!(ensures(&after, "snapshot_restored"), 0.0, "{after}");
    assert_eq!(value(&after, "sandhold_runs{status=\"running\"}"), 1.0, "{after}");
    assert_eq!(value(&after, "sandhold_runs{status=\"interrupted\"}"), 0.0, "{after}");
    // The series the run pump records exist before their first event.
    for series in [
        "sandhold_runs_started_total",
        "sandhold_runs_finished_total{status=\"completed\"}",
        "sandhold_takeovers_total",
        "sandhold_fencing_refusals_total{write=\"append\"}",
        "sandhold_journal_read_bytes_total",
        "sandhold_event_log_append_seconds_count",
        "sandhold_sweep_outcomes_total{outcome=\"finalized\"}",
    ] {
        assert_eq!(value(&after, series), 0.0, "{series}");
    }

    // Only /metrics, only GET; the gRPC port does not serve it.
    assert_eq!(http(metrics, "GET", "/").0, 404);
    assert_eq!(http(metrics, "POST", "/metrics").0, 405);
    assert_ne!(metrics.port(), server.grpc.port());

    client.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: first.sandbox_id }).await.unwrap();
    server.stop();
}

/// TCP ports `pid` listens on (its sockets in LISTEN state, from /proc).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(String::from))
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEX_IP:HEX_PORT, st 0A is LISTEN, field 9 the inode.
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                ports.push(u16::from_str_radix(f[1].rsplit(':').next().unwrap(), 16).unwrap());
            }
        }
    }
    ports
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoint_unless_configured() {
    let mut server = Server::start(None);
    server.client().await;
    assert_eq!(listening_ports(server.child.id()), [server.grpc.port()], "only the gRPC port");

    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut with = Server::start(Some(metrics));
    with.client().await;
    let mut ports = listening_ports(with.child.id());
    ports.sort_unstable();
    let mut want = vec![with.grpc.port(), metrics.port()];
    want.sort_unstable();
    assert_eq!(ports, want);
    server.stop();
    with.stop();
}
