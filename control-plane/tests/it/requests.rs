//! Policies and durable requests with the REAL Claude Code
//! (`scripts/install-agent-clis`) in local sandboxes, driven through
//! `StartRun`, against the fake model API on 127.0.0.1: the model calls the
//! CLI's shell tool (which writes hello.txt) or a client tool, the policy
//! decides, a request waits in the run's log until a client answers it on
//! any replica, and the answer is what happens: an allowed command ran, a
//! denied one did not. The asked-and-allowed body runs once more with its
//! sandbox on a fleet node in another network namespace.

use std::path::Path;

use sandhold_tests::cluster::Cluster;
use sandhold_tests::fleet::{Place, Served, served};
use sandhold_tests::model::{FakeModel, FakeOptions, cli};
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::sandbox::sh;
use sandhold_tests::server::*;
use shared::proto::v1 as api;

fn claude_options(bin: &Path, home: &Path, port: u16) -> api::HarnessOptions {
    let mut options = api::HarnessOptions { program: bin.display().to_string(), ..Default::default() };
    options.env.insert("HOME".into(), home.display().to_string());
    options.env.insert("ANTHROPIC_BASE_URL".into(), format!("http://127.0.0.1:{port}"));
    options.env.insert("ANTHROPIC_API_KEY".into(), "x".into());
    options
}

/// Codex with the fake model as its provider, in its own config (read by
/// `codex exec` and by codex-acp alike).
fn codex_options(bin: &Path, home: &Path, port: u16) -> api::HarnessOptions {
    std::fs::write(
        home.join("config.toml"),
        format!(
            "model = \"fake-model\"\nmodel_provider = \"fake\"\n[model_providers.fake]\nname = \"fake\"\n\
             base_url = \"http://127.0.0.1:{port}/v1\"\nenv_key = \"FAKE_API_KEY\"\nwire_api = \"responses\"\n"
        ),
    )
    .unwrap();
    let mut options = api::HarnessOptions { program: bin.display().to_string(), ..Default::default() };
    options.env.insert("HOME".into(), home.display().to_string());
    options.env.insert("CODEX_HOME".into(), home.display().to_string());
    options.env.insert("FAKE_API_KEY".into(), "x".into());
    options
}

/// OpenCode with the fake model as an Anthropic provider in the user's config.
fn opencode_options(bin: &Path, home: &Path, port: u16) -> api::HarnessOptions {
    let config = serde_json::json!({
        "provider": {"fake": {"npm": "@ai-sdk/anthropic", "name": "Fake",
            "options": {"baseURL": format!("http://127.0.0.1:{port}/v1"), "apiKey": "x"},
            "models": {"fake-model": {"name": "Fake model"}}}},
        "autoupdate": false,
        "share": "disabled"
    });
    std::fs::create_dir_all(home.join(".config/opencode")).unwrap();
    std::fs::write(home.join(".config/opencode/opencode.json"), config.to_string()).unwrap();
    let mut options = api::HarnessOptions {
        program: bin.display().to_string(),
        model: "fake/fake-model".into(),
        ..Default::default()
    };
    options.env.insert("HOME".into(), home.display().to_string());
    options
}

/// The CLIs the tests run: (harness, binary, options).
#[derive(Clone, Copy, Debug)]
enum Cli {
    ClaudeCode,
    Codex,
    OpenCode,
}

impl Cli {
    fn harness(self) -> &'static str {
        match self {
            Cli::ClaudeCode => "claude-code",
            Cli::Codex => "codex",
            Cli::OpenCode => "opencode",
        }
    }

    /// The CLI's options against the fake model, or None when it is not
    /// installed (the test skips, unless services are required).
    fn options(self, home: &Path, port: u16) -> Option<api::HarnessOptions> {
        Some(match self {
            Cli::ClaudeCode => claude_options(&cli("claude")?, home, port),
            Cli::Codex => codex_options(&cli("codex")?, home, port),
            Cli::OpenCode => opencode_options(&cli("opencode")?, home, port),
        })
    }
}

fn rule(action: api::PolicyAction, pattern: &str, effect: api::PolicyEffect) -> api::PolicyRule {
    api::PolicyRule { action: action as i32, pattern: pattern.into(), effect: effect as i32 }
}

/// Shell commands ask; everything else is allowed.
fn ask_commands() -> api::SandboxPolicy {
    api::SandboxPolicy {
        default: api::PolicyEffect::Allow as i32,
        rules: vec![rule(api::PolicyAction::Command, "*", api::PolicyEffect::Ask)],
        request_timeout_ms: 0,
    }
}

struct Setup {
    s: Box<dyn Served>,
    home: std::path::PathBuf,
    model: FakeModel,
    bin: std::path::PathBuf,
}

async fn setup(prefix: &str, scenario: &str) -> Option<Setup> {
    setup_at(Place::SingleHost, prefix, scenario).await
}

/// A server whose sandboxes live at `place`, the local definition `def`,
/// and the fake model where those sandboxes reach it on their loopback.
async fn setup_at(place: Place, prefix: &str, scenario: &str) -> Option<Setup> {
    let bin = cli("claude")?;
    let s = served(place, prefix, &[]).await?;
    put_definition(&mut s.server().sandboxes(s.token()).await, definition("def", Kind::Local)).await;
    let home = s.server().log.with_file_name("home");
    std::fs::create_dir_all(&home).unwrap();
    let options = FakeOptions {
        log: Some(s.server().log.with_file_name("model.log")),
        netns: s.sandbox_netns().map(str::to_string),
        ..Default::default()
    };
    let model = FakeModel::with(scenario, options);
    Some(Setup { s, home, model, bin })
}

fn start_request(
    run_id: &str,
    options: api::HarnessOptions,
    policy: Option<api::SandboxPolicy>,
    tools: Vec<api::ClientTool>,
) -> api::StartRunRequest {
    start_request_of(Cli::ClaudeCode, run_id, options, policy, tools)
}

fn start_request_of(
    cli: Cli,
    run_id: &str,
    options: api::HarnessOptions,
    policy: Option<api::SandboxPolicy>,
    tools: Vec<api::ClientTool>,
) -> api::StartRunRequest {
    api::StartRunRequest {
        thread_id: format!("th-{run_id}"),
        run_id: run_id.into(),
        definition_id: "def".into(),
        harness: cli.harness().into(),
        options: Some(options),
        prompt: "write hello.txt".into(),
        durable: true,
        policy,
        client_tools: tools,
        ..Default::default()
    }
}

fn chunks_of(seen: &Seen, ty: api::ChunkType) -> Vec<&api::Chunk> {
    seen.chunks.iter().map(|(_, c)| c).filter(|c| c.r#type() == ty).collect()
}

fn requested(seen: &Seen) -> bool {
    !chunks_of(seen, api::ChunkType::PermissionRequested).is_empty()
}

fn permission(allow: bool, message: &str) -> Option<api::respond_to_request_request::Answer> {
    Some(api::respond_to_request_request::Answer::Permission(api::PermissionAnswer {
        allow,
        message: message.into(),
        ..Default::default()
    }))
}

async fn respond(
    runs: &mut Runs,
    run_id: &str,
    request_id: &str,
    answer: Option<api::respond_to_request_request::Answer>,
) -> Result<api::RunRequest, tonic::Status> {
    let request =
        api::RespondToRequestRequest { run_id: run_id.into(), request_id: request_id.into(), answer };
    Ok(runs.respond_to_request(request).await?.into_inner().request.unwrap_or_default())
}

async fn hello_exists(s: &dyn Served, run: &api::Run) -> bool {
    let mut sandboxes = s.server().sandboxes(s.token()).await;
    let (_, out) = sh(&mut sandboxes, &run.sandbox_id, "test -e hello.txt && echo yes || echo no").await;
    out.trim() == "yes"
}

/// Ask, answer with `allow`, and read the run to its end, the sandbox at
/// `place`.
async fn asked_and_answered(cli: Cli, allow: bool, place: Place) {
    let prefix = if allow { "req-allow" } else { "req-deny" };
    let Some(t) = setup_at(place, prefix, "tool").await else { return };
    let Some(options) = cli.options(&t.home, t.model.port) else { return };
    let mut runs = t.s.server().runs(t.s.token()).await;
    let run_id = if allow { "ask-allow" } else { "ask-deny" };
    let mut stream = runs
        .start_run(start_request_of(cli, run_id, options, Some(ask_commands()), vec![]))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    let ended = read_until(&mut stream, &mut seen, requested).await.unwrap();
    assert!(!ended, "the run ended without asking: {:?}\n{}", seen.chunks, t.s.logs());
    let asked = chunks_of(&seen, api::ChunkType::PermissionRequested)[0].clone();
    let request = asked.request.clone().unwrap();
    assert!(!asked.tool_name.is_empty(), "{asked:?}");
    assert_eq!(request.kind, "permission");
    assert_eq!(request.rule, "ask command:*");
    assert!(request.input_json.contains("hello.txt"), "{request:?}");
    // While it waits, the command has not run, and the request is listed.
    let record =
        runs.get_run(api::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap();
    assert!(!hello_exists(t.s.as_ref(), &record).await, "the command ran before it was allowed");
    if place == Place::OnANode {
        let mut sandboxes = t.s.server().sandboxes(t.s.token()).await;
        let sandbox = sandhold_tests::sandbox::of_thread(&mut sandboxes, &format!("th-{run_id}")).await;
        assert_eq!(sandbox.node, "node-1", "{sandbox:?}");
    }
    let listed = runs
        .list_requests(api::ListRequestsRequest { run_id: run_id.into(), include_answered: false })
        .await
        .unwrap()
        .into_inner()
        .requests;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].request_id, request.request_id);
    assert!(listed[0].answer.is_none());

    let answered =
        respond(&mut runs, run_id, &request.request_id, permission(allow, "not this one")).await.unwrap();
    assert_eq!(answered.answer.as_ref().map(|a| a.allowed), Some(allow));
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let record = wait_terminal(&mut runs, run_id).await;
    // Codex ends its turn when a command is declined (ACP stopReason
    // "cancelled"); the others go on and finish.
    if allow || !matches!(cli, Cli::Codex) {
        assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{:?}", seen.chunks);
    }
    assert!(seen.terminal().is_some(), "{:?}", seen.chunks);
    let resolved = chunks_of(&seen, api::ChunkType::PermissionResolved);
    assert_eq!(resolved.len(), 1, "{:?}", seen.chunks);
    let r = resolved[0].request.as_ref().unwrap();
    assert_eq!(
        (r.request_id.as_str(), r.allowed, r.answered_by.as_str()),
        (request.request_id.as_str(), allow, "client")
    );
    assert_eq!(chunks_of(&seen, api::ChunkType::PermissionRequested).len(), 1);
    assert_eq!(hello_exists(t.s.as_ref(), &record).await, allow, "{:?}", seen.chunks);
    if !allow && matches!(cli, Cli::ClaudeCode) {
        // The CLI was told: its tool call failed with the client's message.
        let results = chunks_of(&seen, api::ChunkType::ToolCallResult);
        assert!(
            results.iter().any(|c| c.is_error && c.content.contains("not this one")),
            "the CLI was not told: {results:?}"
        );
    }
    // A second answer is refused: the first one stands.
    let again = respond(&mut runs, run_id, &request.request_id, permission(!allow, "")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_asks_and_an_allowed_command_runs() {
    asked_and_answered(Cli::ClaudeCode, true, Place::SingleHost).await;
}

/// The same with the sandbox on a node in another network namespace: the
/// CLI's permission hook reaches the control plane through the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_on_a_node_asks_and_an_allowed_command_runs() {
    asked_and_answered(Cli::ClaudeCode, true, Place::OnANode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_asks_and_a_denied_command_never_runs() {
    asked_and_answered(Cli::ClaudeCode, false, Place::SingleHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_asks_and_an_allowed_command_runs() {
    asked_and_answered(Cli::Codex, true, Place::SingleHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_asks_and_a_denied_command_never_runs() {
    asked_and_answered(Cli::Codex, false, Place::SingleHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_asks_and_an_allowed_command_runs() {
    asked_and_answered(Cli::OpenCode, true, Place::SingleHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_asks_and_a_denied_command_never_runs() {
    asked_and_answered(Cli::OpenCode, false, Place::SingleHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_denies_by_rule_without_asking() {
    denied_by_rule(Cli::ClaudeCode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_denies_by_rule_without_asking() {
    denied_by_rule(Cli::Codex).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_denies_by_rule_without_asking() {
    denied_by_rule(Cli::OpenCode).await;
}

/// A deny rule over the command: no request at all, and no file.
async fn denied_by_rule(cli: Cli) {
    let Some(t) = setup("req-rule", "tool").await else { return };
    let Some(options) = cli.options(&t.home, t.model.port) else { return };
    let mut runs = t.s.server().runs(t.s.token()).await;
    let policy = api::SandboxPolicy {
        default: api::PolicyEffect::Ask as i32,
        rules: vec![rule(api::PolicyAction::Command, "*hello.txt*", api::PolicyEffect::Deny)],
        request_timeout_ms: 0,
    };
    let mut stream = runs
        .start_run(start_request_of(cli, "deny-rule", options, Some(policy), vec![]))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let record = wait_terminal(&mut runs, "deny-rule").await;
    assert!(seen.terminal().is_some(), "{record:?}\n{:?}", seen.chunks);
    assert!(!requested(&seen), "a denied command asked: {:?}", seen.chunks);
    assert!(!hello_exists(t.s.as_ref(), &record).await, "a denied command ran: {:?}", seen.chunks);
    if !matches!(cli, Cli::ClaudeCode) {
        return;
    }
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{:?}", seen.chunks);
    let results = chunks_of(&seen, api::ChunkType::ToolCallResult);
    assert!(results.iter().any(|c| c.is_error), "the CLI was not told: {:?}", seen.chunks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_answers_at_once_one_wins() {
    let Some(t) = setup("req-race", "tool").await else { return };
    let mut runs = t.s.server().runs(t.s.token()).await;
    let options = claude_options(&t.bin, &t.home, t.model.port);
    let mut stream = runs
        .start_run(start_request("race", options, Some(ask_commands()), vec![]))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    assert!(!read_until(&mut stream, &mut seen, requested).await.unwrap());
    let id = chunks_of(&seen, api::ChunkType::PermissionRequested)[0].request.clone().unwrap().request_id;
    let (mut a, mut b) = (t.s.server().runs(t.s.token()).await, t.s.server().runs(t.s.token()).await);
    let (ra, rb) = tokio::join!(
        respond(&mut a, "race", &id, permission(true, "")),
        respond(&mut b, "race", &id, permission(false, "no"))
    );
    let (won, lost) = match (&ra, &rb) {
        (Ok(_), Err(e)) => (true, e),
        (Err(e), Ok(_)) => (false, e),
        other => panic!("exactly one answer must win: {other:?}"),
    };
    assert_eq!(lost.code(), tonic::Code::FailedPrecondition, "{lost:?}");
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let resolved = chunks_of(&seen, api::ChunkType::PermissionResolved);
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0].request.as_ref().unwrap().allowed, won, "the log records the winner");
    let record = wait_terminal(&mut runs, "race").await;
    assert_eq!(hello_exists(t.s.as_ref(), &record).await, won);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_is_denied_at_its_deadline() {
    let Some(t) = setup("req-deadline", "tool").await else { return };
    let mut runs = t.s.server().runs(t.s.token()).await;
    let mut policy = ask_commands();
    policy.request_timeout_ms = 1500;
    let options = claude_options(&t.bin, &t.home, t.model.port);
    let mut stream =
        runs.start_run(start_request("deadline", options, Some(policy), vec![])).await.unwrap().into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let resolved = chunks_of(&seen, api::ChunkType::PermissionResolved);
    assert_eq!(resolved.len(), 1, "{:?}", seen.chunks);
    let r = resolved[0].request.as_ref().unwrap();
    assert_eq!((r.allowed, r.answered_by.as_str()), (false, "deadline"));
    let record = wait_terminal(&mut runs, "deadline").await;
    assert!(!hello_exists(t.s.as_ref(), &record).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_denies_what_waits_and_records_it() {
    let Some(t) = setup("req-cancel", "tool").await else { return };
    let mut runs = t.s.server().runs(t.s.token()).await;
    let options = claude_options(&t.bin, &t.home, t.model.port);
    let mut stream = runs
        .start_run(start_request("cancel", options, Some(ask_commands()), vec![]))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    assert!(!read_until(&mut stream, &mut seen, requested).await.unwrap());
    runs.cancel_run(api::CancelRunRequest { run_id: "cancel".into() }).await.unwrap();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let types: Vec<_> = seen.chunks.iter().map(|(_, c)| c.r#type()).collect();
    let resolved = types.iter().position(|t| *t == api::ChunkType::PermissionResolved);
    let error = types.iter().position(|t| *t == api::ChunkType::RunError);
    assert!(resolved.is_some() && resolved < error, "{types:?}");
    let r = chunks_of(&seen, api::ChunkType::PermissionResolved)[0].request.clone().unwrap();
    assert_eq!((r.allowed, r.answered_by.as_str()), (false, "cancel"));
    let id = r.request_id;
    let late = respond(&mut runs, "cancel", &id, permission(true, "")).await.unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tool_is_called_by_claude_code_and_its_result_reaches_the_model() {
    let Some(t) = setup("req-tool", "client-tool").await else { return };
    let mut runs = t.s.server().runs(t.s.token()).await;
    let tool = api::ClientTool {
        name: "lookup".into(),
        description: "Looks the answer up in the client's own records".into(),
        input_schema_json:
            r#"{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}"#.into(),
    };
    let options = claude_options(&t.bin, &t.home, t.model.port);
    let mut stream =
        runs.start_run(start_request("client-tool", options, None, vec![tool])).await.unwrap().into_inner();
    let mut seen = Seen::default();
    let awaiting = |s: &Seen| {
        chunks_of(s, api::ChunkType::ToolCallStart)
            .iter()
            .any(|c| c.request.as_ref().is_some_and(|r| r.awaiting_client))
    };
    assert!(!read_until(&mut stream, &mut seen, awaiting).await.unwrap(), "{:?}", seen.chunks);
    let start = chunks_of(&seen, api::ChunkType::ToolCallStart)
        .into_iter()
        .find(|c| c.request.as_ref().is_some_and(|r| r.awaiting_client))
        .unwrap()
        .clone();
    let request = start.request.clone().unwrap();
    assert_eq!((start.tool_name.as_str(), request.kind.as_str()), ("lookup", "client_tool"));
    assert!(request.input_json.contains("the question"), "{request:?}");
    let result = Some(api::respond_to_request_request::Answer::ToolResult(api::ToolResult {
        content: "forty-two, from the client's database".into(),
        is_error: false,
    }));
    respond(&mut runs, "client-tool", &request.request_id, result).await.unwrap();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let record = wait_terminal(&mut runs, "client-tool").await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{:?}", seen.chunks);
    let results = chunks_of(&seen, api::ChunkType::ToolCallResult);
    assert!(results.iter().any(|c| c.tool_call_id == start.tool_call_id && c.content.contains("forty-two")));
    assert!(
        seen.has_text("The client tool said: forty-two, from the client's database"),
        "the model did not quote the result: {:?}",
        seen.chunks
    );
}

/// A request waits while its client is gone; another client attaches
/// through another replica, sees it, answers it there; the first replica
/// (the driver) is killed; the run finishes under a successor with the
/// request and its answer in the log once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pending_request_survives_its_client_and_its_driver() {
    let Some(bin) = cli("claude") else { return };
    let Some(cluster) = Cluster::create("req-takeover").await else { return };
    let token = format!("tok-{}", cluster.nonce);
    let tokens = vec![format!("t{}={token}", cluster.nonce)];
    let mut first = cluster.replica("a", tokens.clone(), (2000, 500), vec![]).await;
    let second = cluster.replica("b", tokens, (2000, 500), vec![]).await;
    put_definition(&mut first.sandboxes(&token).await, definition("def", Kind::Local)).await;
    let home = cluster.dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let model = FakeModel::logging("tool", cluster.dir.path().join("model.log"));
    let options = claude_options(&bin, &home, model.port);

    let mut runs_a = first.runs(&token).await;
    let mut stream = runs_a
        .start_run(start_request("takeover", options, Some(ask_commands()), vec![]))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    assert!(!read_until(&mut stream, &mut seen, requested).await.unwrap());
    drop(stream); // the client goes away; the run is durable and waits

    let mut runs_b = second.runs(&token).await;
    let mut attached = attach_after(&mut runs_b, "takeover", &Seen::default()).await.unwrap();
    let mut again = Seen::default();
    assert!(!read_until(&mut attached, &mut again, requested).await.unwrap());
    let pending = runs_b
        .list_requests(api::ListRequestsRequest { run_id: "takeover".into(), include_answered: false })
        .await
        .unwrap()
        .into_inner()
        .requests;
    assert_eq!(pending.len(), 1);
    respond(&mut runs_b, "takeover", &pending[0].request_id, permission(true, "")).await.unwrap();
    first.kill9().await;

    assert!(read_until(&mut attached, &mut again, |_| false).await.unwrap(), "{:?}", again.chunks);
    let record = wait_terminal(&mut runs_b, "takeover").await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", second.log_text());
    assert_eq!(chunks_of(&again, api::ChunkType::PermissionRequested).len(), 1, "{:?}", again.chunks);
    assert_eq!(chunks_of(&again, api::ChunkType::PermissionResolved).len(), 1, "{:?}", again.chunks);
    let mut offsets: Vec<&String> = again.chunks.iter().map(|(o, _)| o).collect();
    let n = offsets.len();
    offsets.dedup();
    assert_eq!(offsets.len(), n, "no chunk twice");
    let mut sandboxes = second.sandboxes(&token).await;
    let (_, written) = sh(&mut sandboxes, &record.sandbox_id, "cat hello.txt").await;
    assert_eq!(written, "hello from the tool\n");
    drop(second);
    cluster.tear_down().await;
}
