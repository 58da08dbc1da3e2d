//! Real `sandhold serve` processes and RunService clients for the run tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use shared::proto::v1 as api;
use shared::proto::v1::admin_service_client::AdminServiceClient;
use shared::proto::v1::run_service_client::RunServiceClient;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub const PATIENCE: Duration = Duration::from_secs(180);
pub const IMAGE: &str = "sandhold-test-busybox:latest";

pub use sandhold_tests::auth::{Bearer, bearer};

pub type Runs = RunServiceClient<InterceptedService<Channel, Bearer>>;
pub type Sandboxes = SandboxServiceClient<InterceptedService<Channel, Bearer>>;
pub type Admin = AdminServiceClient<InterceptedService<Channel, Bearer>>;

/// Options of one server process.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// Shared by replicas; each test gets its own.
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
}

/// A `sandhold serve` child process on a loopback port, killed on drop. Its
/// log is kept in `<data_dir>/<replica>.log` and printed when a test fails.
pub struct ServerProcess {
    pub addr: String,
    pub log: PathBuf,
    child: tokio::process::Child,
}

impl ServerProcess {
    pub async fn start(opts: &ServerOptions) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let replica = opts.replica_id.clone().unwrap_or_else(|| format!("replica-{port}"));
        std::fs::create_dir_all(&opts.data_dir).unwrap();
        let log = opts.data_dir.join(format!("{replica}.log"));
        let agent = crate::provider_support::static_agent();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sandhold"));
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
        cmd.args(&opts.extra_args);
        let child = cmd.spawn().expect("spawning sandhold serve");
        let mut server = Self { addr, log, child };
        server.wait_ready().await;
        server
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("server still running")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(ch) = Channel::from_shared(format!("http://{}", self.addr)).unwrap().connect().await {
                let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
                if let Ok(r) =
                    health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await
                    && r.into_inner().status
                        == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return;
                }
            }
            assert!(self.child.try_wait().unwrap().is_none(), "server exited early:\n{}", self.log_text());
            assert!(Instant::now() < deadline, "server never became ready:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr)).unwrap().connect().await.unwrap()
    }

    pub async fn runs(&self, token: &str) -> Runs {
        RunServiceClient::with_interceptor(self.channel().await, bearer(token))
            .max_decoding_message_size(64 << 20)
    }

    pub async fn sandboxes(&self, token: &str) -> Sandboxes {
        SandboxServiceClient::with_interceptor(self.channel().await, bearer(token))
    }

    pub async fn admin(&self, token: &str) -> Admin {
        AdminServiceClient::with_interceptor(self.channel().await, bearer(token))
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

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Local,
    Docker,
}

pub fn definition(id: &str, kind: Kind) -> api::SandboxDefinition {
    let provider = match kind {
        Kind::Local => api::provider_spec::Provider::Local(api::LocalProvider {}),
        Kind::Docker => api::provider_spec::Provider::Docker(api::DockerProvider {
            image: IMAGE.into(),
            ..Default::default()
        }),
    };
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec { provider: Some(provider) }),
        ..Default::default()
    }
}

pub async fn put_definition(sandboxes: &mut Sandboxes, def: api::SandboxDefinition) {
    sandboxes
        .put_definition(api::PutDefinitionRequest { definition: Some(def) })
        .await
        .expect("put definition");
}

/// A durable `command` run of `sh -c script`.
pub fn command_run(run_id: &str, thread: &str, definition: &str, script: &str) -> api::StartRunRequest {
    api::StartRunRequest {
        thread_id: thread.into(),
        run_id: run_id.into(),
        definition_id: definition.into(),
        harness: "command".into(),
        options: Some(api::HarnessOptions {
            command: vec!["sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        durable: true,
        ..Default::default()
    }
}

/// A shell loop printing `line 1` .. `line n`, pausing `pause` every
/// `every` lines.
pub fn numbered_lines(n: u32, every: u32, pause: &str) -> String {
    format!(
        "i=1; while [ $i -le {n} ]; do echo \"line $i\"; if [ $((i % {every})) -eq 0 ]; then sleep {pause}; fi; i=$((i+1)); done"
    )
}

/// What a client saw of a run: chunks with their offsets, in order.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub chunks: Vec<(String, api::Chunk)>,
}

impl Seen {
    pub fn last_offset(&self) -> Option<String> {
        self.chunks.last().map(|(o, _)| o.clone())
    }

    /// `N` of every text line `line N`, in the order seen.
    pub fn line_numbers(&self) -> Vec<u32> {
        self.chunks
            .iter()
            .filter(|(_, c)| c.r#type() == api::ChunkType::TextMessageContent)
            .filter_map(|(_, c)| c.delta.trim_end().strip_prefix("line ")?.parse().ok())
            .collect()
    }

    pub fn terminal(&self) -> Option<&api::Chunk> {
        self.chunks
            .iter()
            .map(|(_, c)| c)
            .find(|c| matches!(c.r#type(), api::ChunkType::RunFinished | api::ChunkType::RunError))
    }

    pub fn has_text(&self, needle: &str) -> bool {
        self.chunks.iter().any(|(_, c)| c.delta.contains(needle))
    }
}

/// Read a run stream until it ends, `stop` says so, or it fails. Returns
/// what was seen and whether the stream ended by itself.
pub async fn read_until(
    stream: &mut tonic::Streaming<api::RunEvent>,
    seen: &mut Seen,
    mut stop: impl FnMut(&Seen) -> bool,
) -> Result<bool, tonic::Status> {
    loop {
        let message = tokio::time::timeout(PATIENCE, stream.message()).await.expect("run stream stalled")?;
        let Some(event) = message else { return Ok(true) };
        if let Some(api::run_event::Event::Chunk(c)) = event.event {
            seen.chunks.push((c.offset, c.chunk.expect("a chunk")));
            if stop(seen) {
                return Ok(false);
            }
        }
    }
}

/// Poll `cond` every 20 ms until it holds or `within` passed.
pub async fn eventually<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether any process's command line contains `marker`.
pub fn process_with_marker(marker: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().any(|e| {
        let cmdline = Path::new("/proc").join(e.file_name()).join("cmdline");
        std::fs::read(cmdline).is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
    })
}

/// A command that says `started` and then sleeps, its command line marked
/// with `marker` so the test can find its process.
pub fn sleeper(marker: &str) -> String {
    format!("echo started; sleep 1000; echo {marker}")
}

/// Whether the process marked `marker` is gone within `within`.
pub async fn process_gone_within(marker: &str, within: Duration) -> bool {
    eventually(within, || {
        let gone = !process_with_marker(marker);
        async move { gone }
    })
    .await
}

/// A lease holder of its own on the Redis lease store the servers share,
/// taking leases the way any replica does.
pub async fn lease_holder(redis_url: &str, ttl_ms: u64, renew_ms: u64) -> control_plane::lease::Leases {
    use control_plane::lease::{LeaseOptions, Leases, RedisLockStore};
    let store = RedisLockStore::connect(redis_url, Duration::from_millis(ttl_ms)).await.unwrap();
    let options = LeaseOptions {
        ttl: Duration::from_millis(ttl_ms),
        renew_every: Duration::from_millis(renew_ms),
        ..Default::default()
    };
    Leases::new(std::sync::Arc::new(store), options).unwrap()
}

pub fn docker_containers(label: &str) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-a", "-q", "--filter", &format!("label={label}")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

pub fn docker_running(label: &str) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label={label}")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

/// Removes a tenant's containers, also when the test fails.
pub struct DockerCleanup(pub String);

impl Drop for DockerCleanup {
    fn drop(&mut self) {
        let ids = docker_containers(&format!("dev.sandhold.tenant={}", self.0));
        if !ids.is_empty() {
            let _ = std::process::Command::new("docker").arg("rm").arg("-f").args(&ids).output();
        }
    }
}

/// The run's record once it is terminal (panics after [`PATIENCE`]).
pub async fn wait_terminal(runs: &mut Runs, run_id: &str) -> api::Run {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let run = runs
            .get_run(api::GetRunRequest { run_id: run_id.into() })
            .await
            .unwrap()
            .into_inner()
            .run
            .unwrap();
        if run.status != api::RunStatus::Running as i32 {
            return run;
        }
        assert!(Instant::now() < deadline, "run {run_id} stayed running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Attach to `run_id` right after the last chunk `seen` holds.
pub async fn attach_after(
    runs: &mut Runs,
    run_id: &str,
    seen: &Seen,
) -> Result<tonic::Streaming<api::RunEvent>, tonic::Status> {
    let request = api::AttachRunRequest {
        run_id: run_id.into(),
        after_offset: seen.last_offset().unwrap_or_default(),
        ..Default::default()
    };
    Ok(runs.attach_run(request).await?.into_inner())
}

/// Start a durable `command` run of `script` on thread `thread` and read
/// until it has printed `lines` numbered lines.
pub async fn start_and_read(
    runs: &mut Runs,
    run_id: &str,
    thread: &str,
    script: &str,
    lines: usize,
) -> (tonic::Streaming<api::RunEvent>, Seen) {
    let mut stream = runs.start_run(command_run(run_id, thread, "def", script)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.line_numbers().len() >= lines).await.unwrap();
    (stream, seen)
}

/// Processes whose command line or working directory lies under `dir`,
/// with their arguments (this test process excluded).
fn processes_under(dir: &Path) -> Vec<(i32, Vec<String>)> {
    let needle = dir.to_string_lossy().into_owned();
    let own = std::process::id() as i32;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let in_dir = std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir));
        if pid != own && (in_dir || args.iter().any(|a| a.contains(&needle))) {
            found.push((pid, args));
        }
    }
    found
}

/// Pids of agent daemons (`sandhold-agent serve`, not `init`) of sandboxes
/// under `data_dir`.
pub fn agent_daemons(data_dir: &Path) -> Vec<i32> {
    processes_under(data_dir)
        .into_iter()
        .filter(|(_, args)| {
            args.first().is_some_and(|a| a.ends_with("sandhold-agent"))
                && args.get(1).is_some_and(|a| a == "serve")
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Kills whatever local sandboxes under a data dir left running (their
/// agents and commands outlive the servers that started them), also when
/// the test fails. Drop it before the directory goes.
pub struct LocalCleanup(pub PathBuf);

impl Drop for LocalCleanup {
    fn drop(&mut self) {
        // Again while supervisors restart what was killed under them.
        for _ in 0..5 {
            let left = processes_under(&self.0);
            if left.is_empty() {
                return;
            }
            for (pid, _) in left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
