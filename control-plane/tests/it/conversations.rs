//! A thread is a conversation: the next run of a thread continues the
//! harness session the previous one ended with, unless it asks for a new
//! one. With the REAL Claude Code, Codex, OpenCode and Gemini CLIs (`scripts/install-agent-clis`)
//! in a local sandbox, driven through `StartRun`, against the fake model API
//! on 127.0.0.1, which logs every request it is sent: what the model
//! receives is the proof that the earlier turns were carried over.

use std::path::{Path, PathBuf};

use sandhold_tests::docker::DockerCleanup;
use sandhold_tests::model::{FakeModel, cli};
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::server::*;
use shared::proto::v1 as api;

/// A harness run of `prompt` on `thread`, read to its end; its record and
/// what its client saw.
async fn turn(
    runs: &mut Runs,
    run_id: &str,
    thread: &str,
    harness: &str,
    options: &api::HarnessOptions,
    prompt: &str,
    new_session: bool,
) -> (api::Run, Seen) {
    let request = api::StartRunRequest {
        thread_id: thread.into(),
        run_id: run_id.into(),
        definition_id: "def".into(),
        harness: harness.into(),
        options: Some(options.clone()),
        prompt: prompt.into(),
        durable: true,
        new_session,
        ..Default::default()
    };
    let mut stream = runs.start_run(request).await.unwrap().into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let record = wait_terminal(runs, run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{:?}", seen.chunks);
    (record, seen)
}

/// The requests the model received that carry `needle`.
fn sent_with<'a>(requests: &'a [String], needle: &str) -> Vec<&'a String> {
    requests.iter().filter(|r| r.contains(needle)).collect()
}

async fn a_thread_continues_its_session(harness: &str, options: impl Fn(&Path, u16) -> api::HarnessOptions) {
    let s = TenantServer::start("conv", &[]).await;
    put_definition(&mut s.server.sandboxes(&s.token).await, definition("def", Kind::Local)).await;
    let home = s.server.log.with_file_name("home");
    std::fs::create_dir_all(&home).unwrap();
    let model = FakeModel::logging("plain", s.server.log.with_file_name("model.log"));
    let options = options(&home, model.port);
    let mut runs = s.server.runs(&s.token).await;
    let (fact, question, fresh) = (
        format!("The code word is plum-{}.", s.nonce),
        format!("What was the code word, {}?", s.nonce),
        format!("A new question, {}.", s.nonce),
    );

    let (first, _) =
        turn(&mut runs, &format!("t1-{}", s.nonce), "chat", harness, &options, &fact, false).await;
    assert!(!first.session_id.is_empty(), "the run records its session: {first:?}");
    let listed = runs
        .list_runs(api::ListRunsRequest { thread_id: "chat".into(), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(listed.into_inner().runs[0].session_id, first.session_id, "ListRuns shows it too");

    // The next run of the thread: the model is sent the earlier turn.
    let _ = turn(&mut runs, &format!("t2-{}", s.nonce), "chat", harness, &options, &question, false).await;
    let requests = model.requests();
    let asked = sent_with(&requests, &question);
    assert!(!asked.is_empty(), "the question reached the model");
    assert!(asked.iter().any(|r| r.contains(&fact)), "the second turn was sent without the first: {asked:?}");

    // `new_session`: a fresh conversation, without the earlier turns.
    let _ = turn(&mut runs, &format!("t3-{}", s.nonce), "chat", harness, &options, &fresh, true).await;
    let requests = model.requests();
    let asked = sent_with(&requests, &fresh);
    assert!(!asked.is_empty(), "the new question reached the model");
    assert!(asked.iter().all(|r| !r.contains(&fact)), "a new session carried the old turns: {asked:?}");

    // The session's files lived in the sandbox: once it is destroyed, the
    // next run cannot continue it, says so, and starts a new one.
    let sandbox_id = first.sandbox_id.clone();
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    sandboxes.destroy_sandbox(api::DestroySandboxRequest { sandbox_id }).await.unwrap();
    let after = format!("After the sandbox, {}.", s.nonce);
    let (_, seen) =
        turn(&mut runs, &format!("t4-{}", s.nonce), "chat", harness, &options, &after, false).await;
    let warned = seen.chunks.iter().any(|(_, c)| {
        c.name == "harness.warning" && c.value_json.contains("lived in a sandbox that is gone")
    });
    assert!(warned, "no warning of the lost session: {:?}", seen.chunks);
    let requests = model.requests();
    let asked = sent_with(&requests, &after);
    assert!(!asked.is_empty(), "the run reached the model");
    assert!(asked.iter().all(|r| !r.contains(&fresh)), "a lost session was resumed: {asked:?}");
}

/// With portable snapshots, the session travels in the thread's checkpoint:
/// run 1 tells a fact, its sandbox is destroyed, and run 2, in a new
/// sandbox whose CLI home never held the session, still sends the model
/// the earlier turn.
async fn a_session_survives_its_sandbox(harness: &str, options: impl Fn(&Path, u16) -> api::HarnessOptions) {
    let s = TenantServer::start("carry", &[]).await;
    let mut def = definition("def", Kind::Local);
    let portable = api::PortableSnapshots { enabled: true, ..Default::default() };
    def.lifecycle = Some(api::Lifecycle { portable_snapshots: Some(portable), ..Default::default() });
    put_definition(&mut s.server.sandboxes(&s.token).await, def).await;
    let (home1, home2) = (s.server.log.with_file_name("home1"), s.server.log.with_file_name("home2"));
    std::fs::create_dir_all(&home1).unwrap();
    std::fs::create_dir_all(&home2).unwrap();
    let model = FakeModel::logging("plain", s.server.log.with_file_name("model.log"));
    let mut runs = s.server.runs(&s.token).await;
    let fact = format!("The code word is quince-{}.", s.nonce);
    let question = format!("Which code word did I give, {}?", s.nonce);

    let run1 = format!("c1-{}", s.nonce);
    let (first, _) =
        turn(&mut runs, &run1, "chat", harness, &options(&home1, model.port), &fact, false).await;
    assert!(!first.session_id.is_empty(), "{first:?}");
    s.wait_checkpoint("chat", &run1).await;

    let mut sandboxes = s.server.sandboxes(&s.token).await;
    sandboxes
        .destroy_sandbox(api::DestroySandboxRequest { sandbox_id: first.sandbox_id.clone() })
        .await
        .unwrap();

    let run2 = format!("c2-{}", s.nonce);
    let (second, seen) =
        turn(&mut runs, &run2, "chat", harness, &options(&home2, model.port), &question, false).await;
    assert!(!second.session_id.is_empty());
    assert_carried(&s.server.log_text(), &seen, &model, &fact, &question);
}

/// The run `seen` continued the session: no warning of a lost one, and the
/// model was sent the earlier `fact` with the `question`.
/// `logs`: what to print when it was not.
pub(crate) fn assert_carried(logs: &str, seen: &Seen, model: &FakeModel, fact: &str, question: &str) {
    let lost: Vec<_> = seen
        .chunks
        .iter()
        .filter(|(_, c)| c.name == "harness.warning" && c.value_json.contains("session"))
        .collect();
    assert!(lost.is_empty(), "the session was carried, yet: {lost:?}");
    let requests = model.requests();
    let asked = sent_with(&requests, question);
    assert!(!asked.is_empty(), "the question reached the model");
    assert!(
        asked.iter().any(|r| r.contains(fact)),
        "the run in the new sandbox was sent without the earlier turn: {asked:?}\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_session_survives_its_sandbox() {
    let Some(bin) = cli("claude") else { return };
    a_session_survives_its_sandbox("claude-code", |home, port| claude_options(&bin, home, port)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_session_survives_its_sandbox() {
    let Some(bin) = cli("codex") else { return };
    a_session_survives_its_sandbox("codex", |home, port| codex_options(&bin, home, port)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_session_survives_its_sandbox() {
    let Some(bin) = cli("opencode") else { return };
    a_session_survives_its_sandbox("opencode", |home, port| opencode_options(&bin, home, port)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_session_survives_its_sandbox() {
    let Some(bin) = cli("gemini") else { return };
    a_session_survives_its_sandbox("gemini", |home, port| gemini_options(&bin, home, port)).await;
}

/// Across providers: run 1 in a Docker sandbox (the real CLI from a
/// read-only bind of the installed CLIs, talking to a fake model started
/// inside the container, which has no network), its sandbox destroyed, the
/// thread's definition moved to the local provider, and run 2 in a local
/// sandbox, whose workspace is another path, still sends the model the
/// turn told in the container. `in_box` sets the run's options for the CLI
/// in the container (its program is set here), `local` for the local run;
/// `needs` mounts more host files into the container, and `prelude` is a
/// shell line (without single quotes) the CLI's wrapper runs first.
async fn a_session_moves_from_docker_to_local(
    harness: &str,
    bin: &Path,
    needs: &[(&Path, &str)],
    prelude: &str,
    in_box: impl Fn(&mut api::HarnessOptions),
    local: impl Fn(&Path, u16) -> api::HarnessOptions,
) {
    let Some(InBox { s, docker, fake, _cleanup }) = InBox::start("carry-docker", bin, needs).await else {
        return;
    };
    let portable = api::PortableSnapshots { enabled: true, ..Default::default() };
    let lifecycle = api::Lifecycle { portable_snapshots: Some(portable), ..Default::default() };
    // The CLI in the container, with the fake model it talks to (started
    // once: OpenCode's session export runs the program again).
    let wrapper = format!(
        "printf '%s\\n' '#!/bin/sh' '{prelude}' \
           'grep -qs PORT= /tmp/fake-model.out || python3 {fake}/fake_model.py --port 8765 >/tmp/fake-model.out 2>&1 &' \
           'for i in $(seq 100); do grep -qs PORT= /tmp/fake-model.out && break; sleep 0.1; done' \
           'exec {bin} \"$@\"' > /tmp/cli-in-box && chmod +x /tmp/cli-in-box",
        fake = fake.display(),
        bin = bin.display()
    );
    let def = api::SandboxDefinition {
        id: "def".into(),
        provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
        workspace: Some(api::WorkspaceDefinition {
            setup: vec![api::SetupStep { step: Some(api::setup_step::Step::Serial(wrapper)) }],
            ..Default::default()
        }),
        lifecycle: Some(lifecycle.clone()),
        ..Default::default()
    };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, def).await;
    let mut runs = s.server.runs(&s.token).await;
    let fact = format!("The code word is medlar-{}.", s.nonce);
    let question = format!("Which code word was it, {}?", s.nonce);

    let mut options = api::HarnessOptions { program: "/tmp/cli-in-box".into(), ..Default::default() };
    in_box(&mut options);
    let run1 = format!("d1-{}", s.nonce);
    let (first, _) = turn(&mut runs, &run1, "chat", harness, &options, &fact, false).await;
    assert!(!first.session_id.is_empty(), "{first:?}");
    s.wait_checkpoint("chat", &run1).await;
    sandboxes
        .destroy_sandbox(api::DestroySandboxRequest { sandbox_id: first.sandbox_id.clone() })
        .await
        .unwrap();

    // The same thread, now on the local provider.
    let local_def = api::SandboxDefinition { lifecycle: Some(lifecycle), ..definition("def", Kind::Local) };
    put_definition(&mut sandboxes, local_def).await;
    let home = s.server.log.with_file_name("home-local");
    std::fs::create_dir_all(&home).unwrap();
    let model = FakeModel::logging("plain", s.server.log.with_file_name("model.log"));
    let run2 = format!("d2-{}", s.nonce);
    let (second, seen) =
        turn(&mut runs, &run2, "chat", harness, &local(&home, model.port), &question, false).await;
    assert_ne!(second.sandbox_id, first.sandbox_id, "a new sandbox of the local provider");
    assert_carried(&s.server.log_text(), &seen, &model, &fact, &question);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_session_moves_from_docker_to_local() {
    let Some(bin) = cli("claude") else { return };
    let in_box = |o: &mut api::HarnessOptions| {
        o.env.insert("ANTHROPIC_BASE_URL".into(), "http://127.0.0.1:8765".into());
        o.env.insert("ANTHROPIC_API_KEY".into(), "x".into());
    };
    a_session_moves_from_docker_to_local("claude-code", &bin, &[], ":", in_box, |home, port| {
        claude_options(&bin, home, port)
    })
    .await;
}

/// OpenCode's native build runs in the Debian image as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_session_moves_from_docker_to_local() {
    let Some(bin) = cli("opencode") else { return };
    let in_box = |o: &mut api::HarnessOptions| {
        o.model = "fake/fake-model".into();
        o.env.insert("OPENCODE_CONFIG_CONTENT".into(), opencode_config(8765).to_string());
    };
    a_session_moves_from_docker_to_local("opencode", &bin, &[], ":", in_box, |home, port| {
        opencode_options(&bin, home, port)
    })
    .await;
}

/// Gemini CLI is a node program and the Debian image has no node: the
/// host's (which links only the C and C++ runtimes the image has) is
/// mounted for it. Its home is `GEMINI_CLI_HOME`, whose settings choose the
/// API-key auth (see `gemini_options`), written by the wrapper as the run
/// user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_session_moves_from_docker_to_local() {
    let Some(bin) = cli("gemini") else { return };
    let node = Path::new("/usr/bin/node");
    if !node.is_file() {
        panic!("the test mounts the host's node, and there is none at {}", node.display());
    }
    let prelude = r#"mkdir -p "$GEMINI_CLI_HOME/.gemini" && echo {\"security\":{\"auth\":{\"selectedType\":\"gemini-api-key\"}}} > "$GEMINI_CLI_HOME/.gemini/settings.json""#;
    let in_box = |o: &mut api::HarnessOptions| {
        o.model = "fake-model".into();
        o.env.insert("PATH".into(), "/opt/node/bin:/usr/local/bin:/usr/bin:/bin".into());
        o.env.insert("GEMINI_CLI_HOME".into(), "/tmp/gemini-home".into());
        o.env.insert("GOOGLE_GEMINI_BASE_URL".into(), "http://127.0.0.1:8765".into());
        o.env.insert("GEMINI_API_KEY".into(), "x".into());
    };
    let needs = [(node, "/opt/node/bin/node")];
    a_session_moves_from_docker_to_local("gemini", &bin, &needs, prelude, in_box, |home, port| {
        gemini_options(&bin, home, port)
    })
    .await;
}

/// A server whose Docker sandboxes of the Debian test image get the
/// installed CLIs (the folder `bin` is in) and the fake model's folder
/// `fake`, read-only at the same paths, and each of `needs` (a host path
/// and where it goes). `None` without Docker.
struct InBox {
    s: TenantServer,
    docker: api::DockerProvider,
    fake: PathBuf,
    _cleanup: DockerCleanup,
}

impl InBox {
    async fn start(prefix: &str, bin: &Path, needs: &[(&Path, &str)]) -> Option<Self> {
        if !sandhold_tests::services::docker() {
            return None;
        }
        ensure_debian_image();
        let clis = bin.parent().unwrap().parent().unwrap().parent().unwrap().to_path_buf();
        let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-model").canonicalize().unwrap();
        let mut binds =
            vec![(clis.as_path(), clis.to_str().unwrap()), (fake.as_path(), fake.to_str().unwrap())];
        binds.extend_from_slice(needs);
        let args: Vec<&str> =
            binds.iter().flat_map(|(source, _)| ["--docker-bind-prefix", source.to_str().unwrap()]).collect();
        let s = TenantServer::start_with_args(prefix, &[], &args).await;
        let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
        let mounts = binds
            .iter()
            .map(|(source, target)| api::Mount {
                source: source.display().to_string(),
                target: (*target).to_owned(),
                read_only: true,
            })
            .collect();
        let docker =
            api::DockerProvider { image: "sandhold-test-debian:latest".into(), mounts, ..Default::default() };
        Some(Self { s, docker, fake, _cleanup })
    }
}

fn ensure_debian_image() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-test-images");
    let out =
        std::process::Command::new(&script).arg("--debian").output().expect("scripts/build-test-images");
    assert!(out.status.success(), "build-test-images --debian: {}", String::from_utf8_lossy(&out.stderr));
}

pub(crate) fn claude_options(bin: &Path, home: &Path, port: u16) -> api::HarnessOptions {
    let mut options = api::HarnessOptions { program: bin.display().to_string(), ..Default::default() };
    options.env.insert("HOME".into(), home.display().to_string());
    options.env.insert("ANTHROPIC_BASE_URL".into(), format!("http://127.0.0.1:{port}"));
    options.env.insert("ANTHROPIC_API_KEY".into(), "x".into());
    options
}

fn codex_options(bin: &Path, home: &Path, port: u16) -> api::HarnessOptions {
    let provider = format!(
        "{{ name = \"fake\", base_url = \"http://127.0.0.1:{port}/v1\", env_key = \"FAKE_API_KEY\", wire_api = \"responses\" }}"
    );
    let mut options = api::HarnessOptions {
        program: bin.display().to_string(),
        model: "fake-model".into(),
        config_overrides: vec![
            api::ConfigOverride { key: "model_provider".into(), value: "\"fake\"".into() },
            api::ConfigOverride { key: "model_providers.fake".into(), value: provider },
        ],
        ..Default::default()
    };
    codex_env(&mut options, home);
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_continues_the_threads_session() {
    let Some(bin) = cli("claude") else { return };
    a_thread_continues_its_session("claude-code", |home, port| claude_options(&bin, home, port)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_continues_the_threads_session() {
    let Some(bin) = cli("codex") else { return };
    a_thread_continues_its_session("codex", |home, port| codex_options(&bin, home, port)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_continues_the_threads_session() {
    let Some(bin) = cli("gemini") else { return };
    a_thread_continues_its_session("gemini", |home, port| gemini_options(&bin, home, port)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_continues_the_threads_session() {
    let Some(bin) = cli("opencode") else { return };
    a_thread_continues_its_session("opencode", |home, port| opencode_options(&bin, home, port)).await;
}

fn gemini_options(bin: &Path, home: &Path, port: u16) -> api::HarnessOptions {
    // With a base URL Gemini CLI picks its `gateway` auth, which headless
    // mode refuses; the API-key auth is chosen in the user's settings.
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    let settings = r#"{"security":{"auth":{"selectedType":"gemini-api-key"}}}"#;
    std::fs::write(home.join(".gemini/settings.json"), settings).unwrap();
    let mut options = api::HarnessOptions {
        program: bin.display().to_string(),
        model: "fake-model".into(),
        ..Default::default()
    };
    options.env.insert("HOME".into(), home.display().to_string());
    options.env.insert("GOOGLE_GEMINI_BASE_URL".into(), format!("http://127.0.0.1:{port}"));
    options.env.insert("GEMINI_API_KEY".into(), "x".into());
    options
}

fn opencode_config(port: u16) -> serde_json::Value {
    serde_json::json!({
        "provider": {"fake": {"npm": "@ai-sdk/anthropic", "name": "Fake",
            "options": {"baseURL": format!("http://127.0.0.1:{port}/v1"), "apiKey": "x"},
            "models": {"fake-model": {"name": "Fake model"}}}},
        "autoupdate": false,
        "share": "disabled"
    })
}

/// OpenCode with the fake model as an Anthropic provider, configured in the
/// user's config (the workspace is the sandbox's, made anew).
fn opencode_options(bin: &Path, home: &Path, port: u16) -> api::HarnessOptions {
    std::fs::create_dir_all(home.join(".config/opencode")).unwrap();
    std::fs::write(home.join(".config/opencode/opencode.json"), opencode_config(port).to_string()).unwrap();
    let mut options = api::HarnessOptions {
        program: bin.display().to_string(),
        model: "fake/fake-model".into(),
        ..Default::default()
    };
    options.env.insert("HOME".into(), home.display().to_string());
    options
}

/// The `acp` harness with a real ACP agent: through `StartRun`, under the
/// run journal, the sandbox agent's ACP client drives the agent against the
/// fake model's tool scenario (a shell call that writes hello.txt, then an
/// answer).
async fn an_acp_agent_runs_the_tool_scenario(
    options: impl Fn(&Path, u16) -> api::HarnessOptions,
    tool: &str,
) {
    let s = TenantServer::start("acp", &[]).await;
    put_definition(&mut s.server.sandboxes(&s.token).await, definition("def", Kind::Local)).await;
    let home = s.server.log.with_file_name("home");
    std::fs::create_dir_all(&home).unwrap();
    let model = FakeModel::start("tool");
    let mut runs = s.server.runs(&s.token).await;
    let run = format!("a1-{}", s.nonce);
    let (record, seen) =
        turn(&mut runs, &run, "acp", "acp", &options(&home, model.port), "write hello", false).await;
    assert_tool_scenario(&s, &record, &seen, tool).await;
}

/// The run followed the fake model's tool scenario: the agent's shell tool
/// (`tool`) wrote hello.txt in the sandbox, then it answered.
async fn assert_tool_scenario(s: &TenantServer, record: &api::Run, seen: &Seen, tool: &str) {
    assert!(!record.session_id.is_empty(), "{record:?}");
    let chunks: Vec<&api::Chunk> = seen.chunks.iter().map(|(_, c)| c).collect();
    let start = chunks.iter().find(|c| c.r#type() == api::ChunkType::ToolCallStart);
    assert_eq!(start.map(|c| c.tool_name.as_str()), Some(tool), "{chunks:?}");
    let args = chunks.iter().find(|c| c.r#type() == api::ChunkType::ToolCallArgs).unwrap();
    assert!(args.delta.contains("hello.txt"), "{}", args.delta);
    let result = chunks.iter().find(|c| c.r#type() == api::ChunkType::ToolCallResult).unwrap();
    assert!(!result.is_error, "{result:?}");
    let text: String = chunks
        .iter()
        .filter(|c| c.r#type() == api::ChunkType::TextMessageContent)
        .map(|c| c.delta.as_str())
        .collect();
    assert!(text.ends_with("I wrote hello.txt."), "{text:?}");
    assert_eq!(chunks.last().unwrap().r#type(), api::ChunkType::RunFinished);
    // The call really ran in the sandbox.
    assert_eq!(sandbox_file(s, &record.sandbox_id, "hello.txt").await, "hello from the tool\n");
}

async fn sandbox_file(s: &TenantServer, sandbox_id: &str, path: &str) -> String {
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let read = sandboxes
        .exec(api::ExecRequest {
            sandbox_id: sandbox_id.into(),
            command: Some(api::Command {
                kind: Some(api::command::Kind::Argv(api::Argv { args: vec!["cat".into(), path.into()] })),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    String::from_utf8_lossy(&read.stdout).into_owned()
}

/// ACP in a Docker sandbox (network none), through `StartRun`: codex-acp
/// against the fake model's tool scenario, both inside the container. The
/// agent is codex-acp's native build (glibc, from a read-only bind of the
/// installed CLIs): the npm package's `codex-acp` is a node launcher for
/// it, and the Debian image has no node (claude-code-acp, a node program,
/// needs an image with node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_runs_the_tool_scenario_in_docker() {
    let Some(bin) = cli("codex-acp-linux-x64") else { return };
    let Some(InBox { s, docker, fake, _cleanup }) = InBox::start("acp-docker", &bin, &[]).await else {
        return;
    };
    // Started by the run, as the run user: the fake model inside the
    // container, Codex's config pointing at it, then the agent.
    let wrapper = format!(
        r#"#!/bin/sh
python3 {fake}/fake_model.py --scenario tool --port 8765 >/tmp/fake-model.out 2>&1 &
for i in $(seq 100); do grep -q PORT= /tmp/fake-model.out && break; sleep 0.1; done
mkdir -p "$CODEX_HOME" && cat >"$CODEX_HOME/config.toml" <<EOF
model = "fake-model"
model_provider = "fake"
[model_providers.fake]
name = "fake"
base_url = "http://127.0.0.1:8765/v1"
env_key = "FAKE_API_KEY"
wire_api = "responses"
EOF
exec "$@"
"#,
        fake = fake.display()
    );
    let skill = api::Skill {
        skill: Some(api::skill::Skill::File(api::FileSkill {
            path: "acp-in-box.sh".into(),
            content: wrapper,
        })),
    };
    let def = api::SandboxDefinition {
        id: "def".into(),
        provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
        workspace: Some(api::WorkspaceDefinition { skills: vec![skill], ..Default::default() }),
        ..Default::default()
    };
    put_definition(&mut s.server.sandboxes(&s.token).await, def).await;
    let mut options = api::HarnessOptions {
        command: vec!["sh".into(), "acp-in-box.sh".into(), bin.display().to_string()],
        sandbox_mode: "full-access".into(),
        ..Default::default()
    };
    options.env.insert("CODEX_HOME".into(), "/tmp/codex-home".into());
    options.env.insert("FAKE_API_KEY".into(), "x".into());
    let mut runs = s.server.runs(&s.token).await;
    let run = format!("ad1-{}", s.nonce);
    let (record, seen) = turn(&mut runs, &run, "acp", "acp", &options, "write hello", false).await;
    assert_tool_scenario(&s, &record, &seen, "execute").await;
}

/// The workspace's MCP servers reach an ACP agent's `session/new`: an MCP
/// skill whose header is drawn from a secret, a run in a folder below the
/// workspace root, and the fake ACP agent, which logs what it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_agent_gets_the_workspaces_mcp_servers() {
    let s = TenantServer::start("acp-mcp", &[]).await;
    let header = api::HeaderValue { value: Some(api::header_value::Value::BearerSecret("MCP_TOKEN".into())) };
    let mcp = api::McpSkill {
        name: "docs".into(),
        url: "https://mcp.example/docs".into(),
        headers: [("Authorization".to_string(), header)].into(),
    };
    let mut def = definition("def", Kind::Local);
    def.secret_names = vec!["MCP_TOKEN".into()];
    def.workspace = Some(api::WorkspaceDefinition {
        setup: vec![api::SetupStep { step: Some(api::setup_step::Step::Serial("mkdir -p sub/dir".into())) }],
        skills: vec![api::Skill { skill: Some(api::skill::Skill::Mcp(mcp)) }],
        ..Default::default()
    });
    put_definition(&mut s.server.sandboxes(&s.token).await, def).await;
    let log = s.server.log.with_file_name("acp-agent.log");
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-acp/fake_acp_agent.py");
    let options = api::HarnessOptions {
        command: vec![
            "python3".into(),
            agent.display().to_string(),
            "--log".into(),
            log.display().to_string(),
        ],
        ..Default::default()
    };
    let token = format!("mcp-token-{}", s.nonce);
    let request = api::StartRunRequest {
        thread_id: "chat".into(),
        run_id: format!("m1-{}", s.nonce),
        definition_id: "def".into(),
        harness: "acp".into(),
        options: Some(options),
        prompt: "which servers?".into(),
        durable: true,
        cwd: "sub/dir".into(),
        secrets: [("MCP_TOKEN".to_string(), token.clone())].into(),
        ..Default::default()
    };
    let mut runs = s.server.runs(&s.token).await;
    let mut stream = runs.start_run(request).await.unwrap().into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let text: String = seen
        .chunks
        .iter()
        .filter(|(_, c)| c.r#type() == api::ChunkType::TextMessageContent)
        .map(|(_, c)| c.delta.as_str())
        .collect();
    assert_eq!(text, "1 MCP servers: docs", "{:?}", seen.chunks);
    let sent: Vec<serde_json::Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let new = sent.iter().find(|m| m["method"] == "session/new").expect("session/new");
    let want = serde_json::json!([{
        "type": "http", "name": "docs", "url": "https://mcp.example/docs",
        "headers": [{ "name": "Authorization", "value": format!("Bearer {token}") }],
    }]);
    assert_eq!(new["params"]["mcpServers"], want);
    assert!(new["params"]["cwd"].as_str().unwrap().ends_with("/sub/dir"), "{new}");
}

fn codex_acp_options(bin: &Path, home: &Path, port: u16) -> api::HarnessOptions {
    let config = format!(
        "model = \"fake-model\"\nmodel_provider = \"fake\"\n[model_providers.fake]\nname = \"fake\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nenv_key = \"FAKE_API_KEY\"\nwire_api = \"responses\"\n"
    );
    std::fs::write(home.join("config.toml"), config).unwrap();
    let mut options = api::HarnessOptions {
        command: vec![bin.display().to_string()],
        // Codex's own sandbox (bubblewrap) is off: the sandbox is the isolation.
        sandbox_mode: "full-access".into(),
        ..Default::default()
    };
    codex_env(&mut options, home);
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_runs_the_tool_scenario() {
    let Some(bin) = cli("codex-acp") else { return };
    an_acp_agent_runs_the_tool_scenario(|home, port| codex_acp_options(&bin, home, port), "execute").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_acp_runs_the_tool_scenario() {
    let Some(bin) = cli("claude-code-acp") else { return };
    // Its default mode asks before running Bash: the permission is answered
    // allow (the default `permission_mode`).
    an_acp_agent_runs_the_tool_scenario(
        |home, port| api::HarnessOptions {
            command: vec![bin.display().to_string()],
            ..claude_options(&bin, home, port)
        },
        "Bash",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_continues_the_threads_session() {
    let Some(bin) = cli("codex-acp") else { return };
    a_thread_continues_its_session("acp", |home, port| codex_acp_options(&bin, home, port)).await;
}

/// Codex's home (its config and sessions) and the fake model's key.
fn codex_env(options: &mut api::HarnessOptions, home: &Path) {
    options.env.insert("HOME".into(), home.display().to_string());
    options.env.insert("CODEX_HOME".into(), home.display().to_string());
    options.env.insert("FAKE_API_KEY".into(), "x".into());
}
