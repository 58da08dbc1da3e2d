//! Real agent CLIs in Docker sandboxes with no network (issue #18): the
//! model reached only through the sandbox agent's broker, the key never in
//! the sandbox; egress for setup through the allowlisted proxy; a model
//! that cannot be reached is said so, then ends the run; a run survives
//! the death of the replica carrying its model traffic.
//!
//! Everything is real (Docker engine, the CLIs from the toolchain dir, the
//! agent, PostgreSQL and Redis for the takeover) but the model API, which
//! is the fake on the host's 127.0.0.1 (`tests/fake-model`).

use std::path::Path;
use std::time::Duration;

use sandhold_tests::cli::toolchains;
use sandhold_tests::docker::{DEBIAN_IMAGE, DockerCleanup, ensure_debian_image};
use sandhold_tests::fleet::{Place, served_with};
use sandhold_tests::git_remote::HostServer;
use sandhold_tests::local::TestDir;
use sandhold_tests::model::{
    ANSWER_USAGE, BrokeredCli, CLAUDE, CODEX, FakeModel, OPENCODE, broker_server, broker_server_args,
};
use sandhold_tests::run::{Seen, attach_after, put_definition, read_until, wait_terminal};
use sandhold_tests::runtime::Runtime;
use sandhold_tests::sandbox::of_thread;
use sandhold_tests::server::Sandboxes;
use sandhold_tests::under_each_runtime;
use shared::proto::v1 as api;

/// The fake model's log lines (JSON).
fn requests(model: &FakeModel) -> Vec<serde_json::Value> {
    model.requests().iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

async fn wait_for_a_request(model: &FakeModel) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while requests(model).iter().all(|r| r["body"].is_null()) {
        assert!(tokio::time::Instant::now() < deadline, "the CLI never reached the fake model");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) async fn exec(sandboxes: &mut Sandboxes, sandbox: &str, script: &str, stdin: &[u8]) -> String {
    let out = sandboxes
        .exec(api::ExecRequest {
            sandbox_id: sandbox.into(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell(script.into())) }),
            stdin: stdin.to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `script`'s stdout, run by the run user in `container` beside the agent
/// (`docker exec`), not through it: Landlock keeps an exec the agent starts
/// from reading the environment of the run's processes (another domain),
/// so a search from there would find nothing whether the key is there or
/// not.
pub(crate) fn as_run_user_beside_the_agent(container: &str, script: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["exec", "--user", "sandhold", container, "sh", "-c", script])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `secret` is in no process's environment or argv and no file the run
/// user can read, while `placeholder` (what processes have instead) is in
/// a process's environment or argv.
pub(crate) async fn assert_nowhere_in_the_sandbox(
    sandboxes: &mut Sandboxes,
    container: &api::Sandbox,
    secret: &str,
    placeholder: &str,
) {
    let dump = "for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f 2>/dev/null; done";
    let seen_by_processes = as_run_user_beside_the_agent(&container.provider_sandbox_id, dump);
    assert!(!seen_by_processes.contains(secret), "the secret is in a process's environment or argv");
    assert!(seen_by_processes.contains(placeholder), "processes have the placeholder: {seen_by_processes}");
    let files = "grep -rlsF -f /dev/stdin / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev \
                 --exclude-dir=toolchains --exclude-dir=usr; echo scanned";
    let holding = exec(sandboxes, &container.sandbox_id, files, secret.as_bytes()).await;
    assert_eq!(holding.trim(), "scanned", "files the run user can read hold the secret: {holding}");
}

pub(crate) fn customs(seen: &Seen, name: &str) -> Vec<serde_json::Value> {
    seen.chunks
        .iter()
        .filter(|(_, c)| c.r#type() == api::ChunkType::Custom && c.name == name)
        .map(|(_, c)| serde_json::from_str(&c.value_json).unwrap())
        .collect()
}

/// One CLI's brokered run in a Docker sandbox with no network: while the
/// model stalls, the sandbox is searched for the key as the run user would;
/// then the run completes with the tool's file.
async fn brokered_run_in_docker(cli: BrokeredCli, runtime: Runtime) {
    if !sandhold_tests::services::docker() || sandhold_tests::model::cli("claude").is_none() {
        return;
    }
    ensure_debian_image();
    let s = broker_server(&format!("broker-{}", cli.harness)).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let dir = TestDir::new("broker-model");
    let stall = dir.path().join("stall");
    std::fs::write(&stall, b"").unwrap();
    let model = FakeModel::stalling("tool", dir.path().join("model.log"), stall.clone());
    let key = format!("sk-real-{}", uuid::Uuid::new_v4().simple());

    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let mut definition = cli.definition("def", (cli.upstream)(model.port));
    runtime.apply(&mut definition);
    put_definition(&mut sandboxes, definition).await;
    let run_id = format!("r-{}", s.nonce);
    let mut runs = s.server.runs(&s.token).await;
    let mut stream = runs.start_run(cli.start_request(&run_id, "t", "def", &key)).await.unwrap().into_inner();

    // The CLI is waiting on the model: look for the key as the run user.
    wait_for_a_request(&model).await;
    let container = of_thread(&mut sandboxes, "t").await;
    let sandbox = container.sandbox_id.clone();
    assert_nowhere_in_the_sandbox(&mut sandboxes, &container, &key, "sandhold-placeholder-").await;

    std::fs::remove_file(&stall).unwrap();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", s.server.log_text()));
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.r#type(), api::ChunkType::RunFinished, "{:?}\n{}", seen.chunks, s.server.log_text());
    assert!(terminal.usage.as_ref().is_some_and(|u| u.input_tokens > 0), "usage: {terminal:?}");
    let written = exec(&mut sandboxes, &sandbox, "cat hello.txt", b"").await;
    assert_eq!(written, "hello from the tool\n");
    let files: Vec<_> = customs(&seen, "sandbox.file");
    assert!(files.iter().any(|f| f["path"].as_str().is_some_and(|p| p.ends_with("hello.txt"))), "{files:?}");
    let changed = customs(&seen, "file.changed");
    assert!(changed.iter().any(|f| f["path"] == "hello.txt"), "{changed:?}");
    let network = customs(&seen, "sandbox.network");
    assert!(
        network.iter().any(|n| n["purpose"] == "model"
            && n["allowed"] == true
            && n["bytes_received"].as_u64() > Some(0)),
        "{network:?}"
    );
    // The model got the real key, and never the placeholder.
    let received = requests(&model);
    let posts: Vec<_> = received.iter().filter(|r| !r["body"].is_null()).collect();
    assert!(!posts.is_empty());
    for r in &posts {
        let auth = r["auth"][cli.auth_header].as_str().unwrap_or_default();
        assert_eq!(auth, format!("{}{key}", cli.auth_prefix), "{r}");
    }
}

// Under each runtime: the most telling brokered run (egress through the
// broker, file watching, the run user, the key never in the sandbox); the
// other CLIs differ only in their adapters and stay on runc.
under_each_runtime! {
async fn claude_code_in_docker_without_network_reaches_the_model_through_the_broker(runtime) {
    brokered_run_in_docker(CLAUDE, runtime).await;
}
}

#[tokio::test]
async fn codex_in_docker_without_network_reaches_the_model_through_the_broker() {
    brokered_run_in_docker(CODEX, Runtime::Runc).await;
}

#[tokio::test]
async fn opencode_in_docker_without_network_reaches_the_model_through_the_broker() {
    brokered_run_in_docker(OPENCODE, Runtime::Runc).await;
}

#[tokio::test]
async fn setup_reaches_an_allowed_host_through_the_proxy_and_nothing_else() {
    setup_through_the_proxy(Place::SingleHost).await;
}

/// The same with the sandbox on a node in another network namespace: its
/// proxy's carriers reach the control plane through the node's tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setup_on_a_node_reaches_an_allowed_host_through_the_proxy_and_nothing_else() {
    setup_through_the_proxy(Place::OnANode).await;
}

async fn setup_through_the_proxy(place: Place) {
    if !sandhold_tests::services::docker() {
        return;
    }
    ensure_debian_image();
    let args = broker_server_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let Some(s) = served_with(place, "broker-setup", &[], &args).await else { return };
    let s = s.as_ref();
    let _cleanup = DockerCleanup { tenant: s.tenant().to_string() };
    let dir = TestDir::new("broker-setup-www");
    // Two servers on this machine; only the first is on the list.
    let allowed = HostServer::start(dir.path(), "127.0.0.2", "served-to-the-sandbox");
    let other = HostServer::start(dir.path(), "127.0.0.3", "never-served");
    let fetch = |addr: &str, port: u16| {
        format!(
            "python3 -c \"import urllib.request as u; print(u.urlopen('http://{addr}:{port}/', timeout=20).read().decode())\""
        )
    };
    let docker = api::DockerProvider { image: DEBIAN_IMAGE.into(), ..Default::default() };
    let definition = api::SandboxDefinition {
        id: "setup".into(),
        provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
        workspace: Some(api::WorkspaceDefinition {
            setup: vec![
                api::SetupStep {
                    step: Some(api::setup_step::Step::Serial(fetch("127.0.0.2", allowed.port))),
                },
                api::SetupStep {
                    step: Some(api::setup_step::Step::Serial(format!(
                        "{} || echo refused-as-expected",
                        fetch("127.0.0.3", other.port)
                    ))),
                },
            ],
            ..Default::default()
        }),
        network: Some(api::Network {
            allow_hosts: vec![format!("127.0.0.2:{}", allowed.port)],
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut sandboxes = s.server().sandboxes(s.token()).await;
    put_definition(&mut sandboxes, definition).await;
    let mut stream = sandboxes
        .ensure_sandbox(api::EnsureSandboxRequest {
            definition_id: "setup".into(),
            thread_id: "t".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut lines = Vec::new();
    let mut network = Vec::new();
    let mut ready = false;
    while let Some(message) = stream.message().await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs())) {
        match message.event {
            Some(api::ensure_sandbox_response::Event::Progress(p)) => {
                lines.push(p.output_line.clone());
                if !p.network.is_empty() {
                    network.push(serde_json::from_str::<serde_json::Value>(&p.network).unwrap());
                }
            }
            Some(api::ensure_sandbox_response::Event::Ready(_)) => ready = true,
            _ => {}
        }
    }
    assert!(ready, "{lines:?}\n{}", s.logs());
    if place == Place::OnANode {
        assert_eq!(of_thread(&mut sandboxes, "t").await.node, "node-1");
    }
    assert!(lines.iter().any(|l| l.contains("served-to-the-sandbox")), "{lines:?}");
    assert!(!lines.iter().any(|l| l.contains("never-served")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("refused-as-expected")), "{lines:?}");
    let to = |port: u16| network.iter().find(|n| n["port"] == port).cloned();
    let ok = to(allowed.port).unwrap_or_else(|| panic!("{network:?}"));
    assert_eq!((ok["allowed"].as_bool(), ok["purpose"].as_str()), (Some(true), Some("proxy")), "{ok}");
    assert!(ok["bytes_received"].as_u64() > Some(0), "{ok}");
    let refused = to(other.port).unwrap_or_else(|| panic!("{network:?}"));
    assert_eq!(refused["allowed"], false, "{refused}");
    assert!(refused["error"].as_str().is_some_and(|e| e.contains("allowlist")), "{refused}");
}

#[tokio::test]
async fn an_unreachable_model_is_said_as_it_happens_then_ends_the_run() {
    if sandhold_tests::model::cli("claude").is_none() {
        return;
    }
    let s = broker_server("broker-unreachable").await;
    // Nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let definition = api::SandboxDefinition {
        id: "gone".into(),
        provider: Some(api::ProviderSpec {
            provider: Some(api::provider_spec::Provider::Local(api::LocalProvider {})),
        }),
        secret_names: vec!["ANTHROPIC_API_KEY".into()],
        model_access: vec![api::ModelAccess {
            harness: "claude-code".into(),
            upstream: format!("http://127.0.0.1:{closed}"),
            key_secret: "ANTHROPIC_API_KEY".into(),
        }],
        network: Some(api::Network { model_unreachable_ms: 4000, ..Default::default() }),
        ..Default::default()
    };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, definition).await;
    let mut runs = s.server.runs(&s.token).await;
    let run_id = format!("gone-{}", s.nonce);
    let key = format!("sk-real-{}", s.nonce);
    let mut stream =
        runs.start_run(CLAUDE.start_request(&run_id, "t", "gone", &key)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap();
    let unavailable = customs(&seen, "model.unavailable");
    assert!(
        unavailable
            .first()
            .is_some_and(|u| u["upstream"].as_str().is_some_and(|x| x.contains(&closed.to_string()))),
        "{:?}",
        seen.chunks
    );
    let terminal = seen.terminal().unwrap();
    assert_eq!(terminal.r#type(), api::ChunkType::RunError, "{terminal:?}");
    assert_eq!(terminal.error_code, "MODEL_UNREACHABLE", "{terminal:?}");
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Failed as i32);
}

#[tokio::test]
async fn a_run_survives_kill_9_of_the_replica_carrying_its_model_traffic() {
    let Some(mut held) = HeldRun::start("broker-kill", FakeModel::stalling).await else { return };
    // The CLI waits on the model, through replica 0's carrier.
    wait_for_a_request(&held.model).await;
    let before_the_kill = requests(&held.model).len();
    let mut runs1 = held.finish_on_the_successor().await;
    let (replicas, token, run_id) = (&held.replicas, &held.token, &held.run_id);
    let record = wait_terminal(&mut runs1, run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", replicas[1].log_text());
    // The model was asked again after the kill: through the successor's
    // carriers (the key still added by the agent).
    let after = requests(&held.model);
    assert!(after.len() > before_the_kill, "{after:?}");
    assert!(
        after[before_the_kill..]
            .iter()
            .all(|r| r["body"].is_null() || r["auth"]["x-api-key"] == held.key.as_str())
    );
    // Every chunk once: offsets and translated chunks never repeat.
    let seen = &held.seen;
    let mut offsets: Vec<_> = seen.chunks.iter().map(|(o, _)| o.clone()).collect();
    offsets.sort();
    offsets.dedup();
    assert_eq!(offsets.len(), seen.chunks.len(), "a chunk came twice");
    let starts = seen.chunks.iter().filter(|(_, c)| c.r#type() == api::ChunkType::RunStarted).count();
    assert_eq!(starts, 1);
    let mut sandboxes = replicas[1].sandboxes(token).await;
    let sandbox = of_thread(&mut sandboxes, "t").await.sandbox_id;
    assert_eq!(exec(&mut sandboxes, &sandbox, "cat hello.txt", b"").await, "hello from the tool\n");
    held.tear_down().await;
}

/// A Claude Code run started on replica 0 of two broker replicas of a
/// fresh cluster, against a fake model that holds answers while its hold
/// file exists: the tests kill replica 0 mid-run and finish on replica 1.
struct HeldRun {
    cluster: sandhold_tests::cluster::Cluster,
    replicas: Vec<sandhold_tests::server::ServerProcess>,
    token: String,
    run_id: String,
    /// The model key the run was given.
    key: String,
    model: FakeModel,
    hold: std::path::PathBuf,
    seen: Seen,
    stream: tonic::Streaming<api::RunEvent>,
    _cleanup: DockerCleanup,
    _dir: TestDir,
}

impl HeldRun {
    /// `None` where Docker or the Claude Code CLI is missing (skipped, or
    /// failed under `SANDHOLD_REQUIRE_SERVICES`). The first chunk has come.
    async fn start(
        name: &str,
        model: fn(&str, std::path::PathBuf, std::path::PathBuf) -> FakeModel,
    ) -> Option<Self> {
        if !sandhold_tests::services::docker() || sandhold_tests::model::cli("claude").is_none() {
            return None;
        }
        let cluster = sandhold_tests::cluster::Cluster::create(name).await?;
        ensure_debian_image();
        let nonce = cluster.nonce.clone();
        let token = format!("tok-{nonce}");
        let tenant = format!("t{nonce}");
        let cleanup = DockerCleanup { tenant: tenant.clone() };
        let mut replicas = Vec::new();
        for i in 0..2 {
            let tokens = vec![format!("{tenant}={token}")];
            replicas.push(cluster.replica(&format!("r{i}"), tokens, (2000, 500), broker_server_args()).await);
        }
        let dir = TestDir::new(&format!("{name}-model"));
        let hold = dir.path().join("hold");
        std::fs::write(&hold, b"").unwrap();
        let model = model("tool", dir.path().join("model.log"), hold.clone());
        let mut sandboxes = replicas[0].sandboxes(&token).await;
        put_definition(&mut sandboxes, CLAUDE.definition("def", (CLAUDE.upstream)(model.port))).await;
        let run_id = format!("k-{nonce}");
        let key = format!("sk-real-{nonce}");
        let mut runs0 = replicas[0].runs(&token).await;
        let mut stream =
            runs0.start_run(CLAUDE.start_request(&run_id, "t", "def", &key)).await.unwrap().into_inner();
        let mut seen = Seen::default();
        read_until(&mut stream, &mut seen, |s| !s.chunks.is_empty()).await.unwrap();
        Some(Self {
            cluster,
            replicas,
            token,
            run_id,
            key,
            model,
            hold,
            seen,
            stream,
            _cleanup: cleanup,
            _dir: dir,
        })
    }

    /// Kill replica 0 (SIGKILL), let the model answer, and read the run to
    /// its end through replica 1, after what was seen; replica 1's client.
    async fn finish_on_the_successor(&mut self) -> sandhold_tests::server::Runs {
        self.replicas[0].kill9().await;
        std::fs::remove_file(&self.hold).unwrap();
        let mut runs1 = self.replicas[1].runs(&self.token).await;
        self.stream = attach_after(&mut runs1, &self.run_id, &self.seen).await.unwrap();
        read_until(&mut self.stream, &mut self.seen, |_| false)
            .await
            .unwrap_or_else(|e| panic!("{e:?}\n{}", self.replicas[1].log_text()));
        runs1
    }

    async fn tear_down(self) {
        drop(self.replicas);
        self.cluster.tear_down().await;
    }
}

/// The Messages requests the fake model received (each answered with
/// [`ANSWER_USAGE`] unless its connection died first).
fn messages(model: &FakeModel) -> Vec<serde_json::Value> {
    requests(model)
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/messages")) && !r["body"].is_null())
        .collect()
}

/// The run's `model.usage` records, each checked to be one fake answer's,
/// numbered 1..=n once each; n.
fn metered_answers(seen: &Seen) -> u64 {
    let usage = customs(seen, "model.usage");
    let (input, output, read, write) = ANSWER_USAGE;
    for (i, u) in usage.iter().enumerate() {
        assert_eq!(u["seq"], i as u64 + 1, "{usage:?}");
        assert_eq!(u["api"], "anthropic", "{u}");
        let tokens = |k: &str| u[k].as_u64().unwrap();
        assert_eq!(
            (
                tokens("input_tokens"),
                tokens("output_tokens"),
                tokens("cache_read_tokens"),
                tokens("cache_write_tokens")
            ),
            (input, output, read, write),
            "{u}"
        );
    }
    usage.len() as u64
}

/// `n` answers' worth of usage, as the API's `Usage`.
fn usage_of(n: u64) -> (u64, u64, u64, u64) {
    let (input, output, read, write) = ANSWER_USAGE;
    (n * input, n * output, n * read, n * write)
}

fn tokens(u: Option<&api::Usage>) -> (u64, u64, u64, u64) {
    let u = u.cloned().unwrap_or_default();
    (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens)
}

/// A Claude Code run `run_id` on `s` (definition `def`, thread `t`, key
/// `sk-real-<nonce>`) against a new fake model logging under `dir`, with
/// `budget`: the model, the runs client and the run's stream.
async fn claude_run(
    s: &sandhold_tests::server::TenantServer,
    dir: &TestDir,
    run_id: &str,
    budget: Option<api::Budget>,
) -> (FakeModel, sandhold_tests::server::Runs, tonic::Streaming<api::RunEvent>) {
    let model = FakeModel::logging("tool", dir.path().join("model.log"));
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, CLAUDE.definition("def", (CLAUDE.upstream)(model.port))).await;
    let key = format!("sk-real-{}", s.nonce);
    let mut runs = s.server.runs(&s.token).await;
    let start = api::StartRunRequest { budget, ..CLAUDE.start_request(run_id, "t", "def", &key) };
    let stream = runs.start_run(start).await.unwrap().into_inner();
    (model, runs, stream)
}

/// Issue 38: the broker reads the usage of every answer Claude Code gets
/// (streamed, with cache reads and writes) and the run ends with exactly
/// the fake model's numbers, per answer and in total, on RUN_FINISHED and
/// on its record.
#[tokio::test]
async fn a_claude_code_run_ends_with_the_exact_token_totals_the_model_reported() {
    if !sandhold_tests::services::docker() || sandhold_tests::model::cli("claude").is_none() {
        return;
    }
    ensure_debian_image();
    let s = broker_server("broker-usage").await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let dir = TestDir::new("broker-usage-model");
    let run_id = format!("u-{}", s.nonce);
    let (model, mut runs, mut stream) = claude_run(&s, &dir, &run_id, None).await;
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", s.server.log_text()));
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.r#type(), api::ChunkType::RunFinished, "{:?}\n{}", seen.chunks, s.server.log_text());
    let n = metered_answers(&seen);
    // Two turns at least (the tool call, the final text), and every
    // Messages request the model answered is metered.
    assert!(n >= 2, "{:?}", seen.chunks);
    assert_eq!(n, messages(&model).len() as u64, "{:?}", requests(&model));
    assert_eq!(tokens(terminal.usage.as_ref()), usage_of(n), "{terminal:?}");
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(tokens(record.usage.as_ref()), usage_of(n), "{record:?}");
}

/// Issue 38: with `--max-tokens` below one answer's usage, the first
/// answer reaches the budget: `budget.exceeded`, then RUN_ERROR
/// BUDGET_EXCEEDED within seconds, and the model never gets the second
/// turn (the broker refuses it, or the run ended first).
#[tokio::test]
async fn a_budget_below_one_answer_ends_the_run_budget_exceeded() {
    if !sandhold_tests::services::docker() || sandhold_tests::model::cli("claude").is_none() {
        return;
    }
    ensure_debian_image();
    let s = broker_server("broker-budget").await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let dir = TestDir::new("broker-budget-model");
    let run_id = format!("b-{}", s.nonce);
    let budget = api::Budget { max_tokens: 10, ..Default::default() };
    let (model, mut runs, mut stream) = claude_run(&s, &dir, &run_id, Some(budget)).await;
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", s.server.log_text()));
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.r#type(), api::ChunkType::RunError, "{:?}\n{}", seen.chunks, s.server.log_text());
    assert_eq!(terminal.error_code, "BUDGET_EXCEEDED", "{terminal:?}");
    let n = metered_answers(&seen);
    assert!(n >= 1);
    let (input, output, read, write) = usage_of(n);
    let exceeded = customs(&seen, "budget.exceeded");
    assert_eq!(exceeded.len(), 1, "{:?}", seen.chunks);
    assert_eq!(exceeded[0]["limit"], "max_tokens");
    assert_eq!(exceeded[0]["max"], 10);
    assert_eq!(exceeded[0]["used"], input + output + read + write);
    // Once the budget was reached nothing more reached the model.
    assert!(
        messages(&model).iter().all(|r| !r["body"].to_string().contains("tool_result")),
        "{:?}",
        requests(&model)
    );
    assert_eq!(messages(&model).len() as u64, n);
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Failed as i32);
    assert_eq!(record.error.as_ref().map(|e| e.code.as_str()), Some("BUDGET_EXCEEDED"), "{record:?}");
    assert_eq!(tokens(record.usage.as_ref()), usage_of(n), "{record:?}");
}

/// Issue 38: the operator's daily budget of a tenant, summed from the
/// stored records of the runs it started today: a Claude Code run whose
/// second answer reaches it ends BUDGET_EXCEEDED (`tenant_daily_tokens`),
/// and the tenant's next brokered run is refused at its start.
#[tokio::test]
async fn the_tenants_daily_budget_ends_a_run_and_refuses_the_next() {
    if !sandhold_tests::services::docker() || sandhold_tests::model::cli("claude").is_none() {
        return;
    }
    ensure_debian_image();
    let mut args = broker_server_args();
    args.extend(["--tenant-daily-tokens".to_string(), "30".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = sandhold_tests::server::TenantServer::start_with_args("broker-daily", &[], &args).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let dir = TestDir::new("broker-daily-model");
    let run_id = format!("d-{}", s.nonce);
    let (_model, mut runs, mut stream) = claude_run(&s, &dir, &run_id, None).await;
    let key = format!("sk-real-{}", s.nonce);
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", s.server.log_text()));
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.error_code, "BUDGET_EXCEEDED", "{:?}\n{}", seen.chunks, s.server.log_text());
    let n = metered_answers(&seen);
    let (input, output, read, write) = usage_of(n);
    let exceeded = customs(&seen, "budget.exceeded");
    assert_eq!(exceeded.len(), 1, "{:?}", seen.chunks);
    assert_eq!(
        (exceeded[0]["limit"].as_str(), exceeded[0]["max"].as_u64()),
        (Some("tenant_daily_tokens"), Some(30))
    );
    assert_eq!(exceeded[0]["used"], input + output + read + write);
    assert!(n >= 2, "one answer (27 tokens) stays within 30: {:?}", seen.chunks);
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(tokens(record.usage.as_ref()), usage_of(n), "{record:?}");
    // The tenant's day is spent: the next brokered run is refused.
    let refused = runs
        .start_run(CLAUDE.start_request(&format!("d2-{}", s.nonce), "t2", "def", &key))
        .await
        .expect_err("the tenant's daily budget is used up");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("tenant_daily_tokens = 30"), "{refused:?}");
}

/// Issue 38: `sandhold run --max-tokens N` is the run's budget: below one
/// answer's usage the command says so and exits 1 with BUDGET_EXCEEDED.
#[test]
fn sandhold_run_max_tokens_ends_the_run_with_budget_exceeded() {
    if sandhold_tests::model::cli("claude").is_none() {
        return;
    }
    let dir = TestDir::new("broker-cli-budget");
    let model = FakeModel::logging("tool", dir.path().join("model.log"));
    let key = format!("sk-ant-real-{}", uuid::Uuid::new_v4().simple());
    let out = sandhold_tests::cli::sandhold(&dir.path().join("data"))
        .args([
            "run",
            "--local",
            "--harness",
            "claude-code",
            "--secret",
            "ANTHROPIC_API_KEY=ANTHROPIC_API_KEY",
        ])
        .args(["--max-tokens", "10", "--", "write hello.txt"])
        .current_dir(dir.path())
        .env("SANDHOLD_TOOLCHAIN_DIR", toolchains())
        .env("SANDHOLD_MODEL_UPSTREAM", format!("http://127.0.0.1:{}", model.port))
        .env("ANTHROPIC_API_KEY", &key)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("token budget reached: max_tokens = 10"), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("BUDGET_EXCEEDED"), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(!messages(&model).is_empty());
    assert!(messages(&model).iter().all(|r| !r["body"].to_string().contains("tool_result")));
}

/// Issue 38: the run's totals come from its stored `model.usage` chunks,
/// not from a driver's memory: the replica driving a Claude Code run is
/// killed (SIGKILL) after the first answer was metered, while the second
/// turn waits on the model; the replica that takes the run over delivers
/// each usage record once and ends the run with the exact totals.
#[tokio::test]
async fn model_usage_totals_survive_kill_9_of_the_driving_replica() {
    let Some(mut held) = HeldRun::start("broker-usage-kill", FakeModel::holding_tool_results).await else {
        return;
    };
    // The first answer is metered and delivered by replica 0 ...
    read_until(&mut held.stream, &mut held.seen, |s| !customs(s, "model.usage").is_empty())
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", held.replicas[0].log_text()));
    // ... and the second turn waits on the model.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !messages(&held.model).iter().any(|r| r["body"].to_string().contains("tool_result")) {
        assert!(tokio::time::Instant::now() < deadline, "the CLI never sent the tool's result");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut runs1 = held.finish_on_the_successor().await;
    let (seen, run_id) = (&held.seen, &held.run_id);
    let terminal = seen.terminal().expect("a terminal chunk").clone();
    assert_eq!(
        terminal.r#type(),
        api::ChunkType::RunFinished,
        "{:?}\n{}",
        seen.chunks,
        held.replicas[1].log_text()
    );
    // Every record once, in order, before and after the kill.
    let n = metered_answers(seen);
    assert!(n >= 2, "{:?}", seen.chunks);
    assert_eq!(tokens(terminal.usage.as_ref()), usage_of(n), "{terminal:?}");
    let record = wait_terminal(&mut runs1, run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    assert_eq!(tokens(record.usage.as_ref()), usage_of(n), "{record:?}");
    // The stored log says the same to a reader from the start.
    let mut stored = Seen::default();
    let mut from_start = attach_after(&mut runs1, run_id, &Seen::default()).await.unwrap();
    read_until(&mut from_start, &mut stored, |_| false).await.unwrap();
    assert_eq!(metered_answers(&stored), n);
    held.tear_down().await;
}

/// The README's blocks fenced ```` ```sh quickstart ````.
fn quickstarts() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```sh quickstart" {
            blocks.push(lines.by_ref().take_while(|l| l.trim() != "```").collect::<Vec<_>>().join("\n"));
        }
    }
    blocks
}

/// The README's Claude Code quickstarts, run as written (the key from the
/// environment, the fake model as the upstream through
/// `SANDHOLD_MODEL_UPSTREAM`, the shared toolchain dir), locally and in
/// Docker: the model's tool call writes the file, its final text is shown.
#[test]
fn the_readme_quickstarts_work_as_written() {
    if !sandhold_tests::services::docker() || sandhold_tests::model::cli("claude").is_none() {
        return;
    }
    let blocks = quickstarts();
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert!(
        blocks[0].contains("--local") && blocks[1].contains("--image debian:bookworm-slim"),
        "{blocks:?}"
    );
    ensure_debian_image();
    // No registry here: the Debian test image (a bookworm rootfs) is what
    // `debian:bookworm-slim` names, unless the engine has the real one.
    let has =
        std::process::Command::new("docker").args(["image", "inspect", "debian:bookworm-slim"]).output();
    if !has.is_ok_and(|o| o.status.success()) {
        let tag =
            std::process::Command::new("docker").args(["tag", DEBIAN_IMAGE, "debian:bookworm-slim"]).status();
        assert!(tag.is_ok_and(|s| s.success()));
    }
    let dir = TestDir::new("broker-quickstart");
    // Dropped first: the runs' sandboxes, should the servers the directory
    // holds be killed before they destroyed them.
    let _containers = sandhold_tests::docker::DockerUnder { dir: dir.path().to_path_buf() };
    let model = FakeModel::logging("tool", dir.path().join("model.log"));
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sandhold"), bin.join("sandhold")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let key = format!("sk-ant-real-{}", uuid::Uuid::new_v4().simple());
    for (i, body) in blocks.iter().enumerate() {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg("-euo").arg("pipefail").arg("-c").arg(body);
        for (k, _) in std::env::vars() {
            if k.starts_with("SANDHOLD_") && k != "SANDHOLD_REQUIRE_SERVICES" {
                cmd.env_remove(k);
            }
        }
        let out = cmd
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("SANDHOLD_DATA_DIR", dir.path().join(format!("data-{i}")))
            .env("SANDHOLD_TOOLCHAIN_DIR", toolchains())
            .env("SANDHOLD_MODEL_UPSTREAM", format!("http://127.0.0.1:{}", model.port))
            .env("ANTHROPIC_API_KEY", &key)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "quickstart {i} failed:\n{body}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        assert!(stdout.contains("I wrote hello.txt."), "quickstart {i}:\n{stdout}\n{stderr}");
    }
    let posts: Vec<_> = requests(&model).into_iter().filter(|r| !r["body"].is_null()).collect();
    assert!(posts.len() >= 4, "two runs, a tool call each: {posts:?}");
    assert!(posts.iter().all(|r| r["auth"]["x-api-key"] == key.as_str()), "{posts:?}");
}
