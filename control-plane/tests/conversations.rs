//! A thread is a conversation: the next run of a thread continues the
//! harness session the previous one ended with, unless it asks for a new
//! one. With the REAL Claude Code, Codex and Gemini CLIs (`scripts/install-agent-clis`)
//! in a local sandbox, driven through `StartRun`, against the fake model API
//! on 127.0.0.1, which logs every request it is sent: what the model
//! receives is the proof that the earlier turns were carried over.

use std::path::Path;

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
    let listed = runs.list_runs(api::ListRunsRequest { thread_id: "chat".into(), limit: 10 }).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_continues_the_threads_session() {
    let Some(bin) = cli("claude") else { return };
    a_thread_continues_its_session("claude-code", |home, port| {
        let mut options = api::HarnessOptions { program: bin.display().to_string(), ..Default::default() };
        options.env.insert("HOME".into(), home.display().to_string());
        options.env.insert("ANTHROPIC_BASE_URL".into(), format!("http://127.0.0.1:{port}"));
        options.env.insert("ANTHROPIC_API_KEY".into(), "x".into());
        options
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_continues_the_threads_session() {
    let Some(bin) = cli("codex") else { return };
    a_thread_continues_its_session("codex", |home, port| {
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
        options.env.insert("HOME".into(), home.display().to_string());
        options.env.insert("CODEX_HOME".into(), home.display().to_string());
        options.env.insert("FAKE_API_KEY".into(), "x".into());
        options
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_continues_the_threads_session() {
    let Some(bin) = cli("gemini") else { return };
    a_thread_continues_its_session("gemini", |home, port| {
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
    })
    .await;
}
