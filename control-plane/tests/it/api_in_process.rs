//! Every public gRPC service in-process: built from a context with real
//! SQLite stores and the local provider, called through the real tonic
//! stack over a duplex pipe (no `server::start`, no port).

use sandhold_tests::in_process::InProcess;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::{Seen, command_run, definition, numbered_lines, read_until};
use sandhold_tests::wait::{PATIENCE, eventually};
use shared::proto::v1 as api;
use tonic::Code;

async fn put_local_definition(ip: &InProcess, id: &str) {
    ip.sandboxes()
        .put_definition(api::PutDefinitionRequest { definition: Some(definition(id, Kind::Local)) })
        .await
        .expect("put definition");
}

#[tokio::test]
async fn sandbox_service_keeps_definitions_and_runs_commands() {
    let ip = InProcess::start().await;
    let mut sandboxes = ip.sandboxes();
    put_local_definition(&ip, "def").await;

    let got = sandboxes
        .get_definition(api::GetDefinitionRequest { id: "def".into(), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(got.into_inner().definition.unwrap().id, "def");
    let listed = sandboxes.list_definitions(api::ListDefinitionsRequest {}).await.unwrap().into_inner();
    assert_eq!(listed.definitions.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["def"]);
    let missing = sandboxes
        .get_definition(api::GetDefinitionRequest { id: "nope".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");

    let request = api::EnsureSandboxRequest {
        definition_id: "def".into(),
        thread_id: "t1".into(),
        ..Default::default()
    };
    let (_, ready) = sandhold_tests::sandbox::ensure(&mut sandboxes, request).await;
    let sandbox = ready.expect("the sandbox is ready").sandbox.expect("a sandbox").sandbox_id;
    let exec = sandboxes
        .exec(api::ExecRequest {
            sandbox_id: sandbox.clone(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell("echo in-process".into())) }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(exec.stdout, b"in-process\n");
    assert_eq!(exec.status.and_then(|s| s.status), Some(api::exit_status::Status::Code(0)));

    let no_command = sandboxes
        .exec(api::ExecRequest { sandbox_id: sandbox.clone(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(no_command.code(), Code::InvalidArgument, "{no_command:?}");

    sandboxes.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: sandbox.clone() }).await.unwrap();
    let gone = sandboxes.get_sandbox(api::GetSandboxRequest { sandbox_id: sandbox }).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    sandboxes.delete_definition(api::DeleteDefinitionRequest { id: "def".into() }).await.unwrap();
    let deleted = sandboxes
        .get_definition(api::GetDefinitionRequest { id: "def".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(deleted.code(), Code::NotFound);
}

#[tokio::test]
async fn run_service_streams_a_run_and_answers_for_its_record() {
    let ip = InProcess::start().await;
    put_local_definition(&ip, "def").await;
    let mut runs = ip.runs();

    let script = numbered_lines(3, 100, "0");
    let mut stream =
        runs.start_run(command_run("ip-run-1", "t1", "def", &script)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    let ended = read_until(&mut stream, &mut seen, |_| false).await.expect("the run streams");
    assert!(ended, "the stream ends after the terminal chunk");
    assert_eq!(seen.line_numbers(), [1, 2, 3]);
    assert_eq!(seen.terminal().map(|c| c.r#type()), Some(api::ChunkType::RunFinished));

    // The status is written right after the terminal chunk.
    let get = || {
        let mut runs = runs.clone();
        async move {
            let request = api::GetRunRequest { run_id: "ip-run-1".into() };
            runs.get_run(request).await.unwrap().into_inner().run.unwrap()
        }
    };
    let terminal =
        eventually(PATIENCE, || async { get().await.status != api::RunStatus::Running as i32 }).await;
    assert!(terminal, "the run's record stayed running");
    let record = get().await;
    assert_eq!(record.status, api::RunStatus::Completed as i32);
    assert_eq!(record.harness, "command");
    let listed =
        runs.list_runs(api::ListRunsRequest { thread_id: "t1".into(), ..Default::default() }).await.unwrap();
    assert_eq!(listed.into_inner().runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), ["ip-run-1"]);
    let active = runs.get_active_run(api::GetActiveRunRequest { thread_id: "t1".into() }).await.unwrap();
    assert!(active.into_inner().run.is_none(), "a finished run is not active");

    // The stored log replays exactly what the live stream delivered.
    let request =
        api::AttachRunRequest { run_id: "ip-run-1".into(), stored_only: true, ..Default::default() };
    let mut stored = runs.attach_run(request).await.unwrap().into_inner();
    let mut replay = Seen::default();
    read_until(&mut stored, &mut replay, |_| false).await.unwrap();
    let offsets = |s: &Seen| s.chunks.iter().map(|(o, _)| o.clone()).collect::<Vec<_>>();
    assert_eq!(offsets(&replay), offsets(&seen));

    let again = runs.start_run(command_run("ip-run-1", "t1", "def", "true")).await.unwrap_err();
    assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");
    let bad = runs.get_run(api::GetRunRequest { run_id: "no spaces".into() }).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    let unknown = runs.get_run(api::GetRunRequest { run_id: "ip-run-unknown".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let no_thread =
        runs.get_active_run(api::GetActiveRunRequest { thread_id: String::new() }).await.unwrap_err();
    assert_eq!(no_thread.code(), Code::InvalidArgument);
    let mut no_id = command_run("", "t1", "def", "true");
    no_id.durable = true;
    let refused = runs.start_run(no_id).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "a durable run needs an id: {refused:?}");
    // A token budget is counted by the model broker: refused for a run
    // without brokered model access, never accepted and left unenforced.
    let mut budgeted = command_run("ip-run-2", "t1", "def", "true");
    budgeted.budget = Some(api::Budget { max_tokens: 100, ..Default::default() });
    let refused = runs.start_run(budgeted).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("budget") && refused.message().contains("model_access"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn snapshot_service_refuses_a_thread_without_a_sandbox() {
    let ip = InProcess::start().await;
    let mut snapshots = ip.snapshots();
    let listed =
        snapshots.list_snapshots(api::ListSnapshotsRequest { thread_id: "t1".into() }).await.unwrap();
    assert!(listed.into_inner().checkpoints.is_empty());
    let save = api::SaveSnapshotRequest { thread_id: "t1".into(), ..Default::default() };
    let refused = snapshots.save_snapshot(save).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("has no sandbox"), "{refused:?}");
    let unnamed =
        snapshots.list_snapshots(api::ListSnapshotsRequest { thread_id: String::new() }).await.unwrap_err();
    assert_eq!(unnamed.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn admin_service_describes_the_context_and_sweeps() {
    let ip = InProcess::start().await;
    let mut admin = ip.admin();
    let info = admin.get_server_info(api::GetServerInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.replica_id, ip.cx.replica_id);
    assert_eq!(info.tenant, control_plane::auth::SINGLE_USER_TENANT);
    assert_eq!(info.store_backend, ip.cx.stores.backend_name());
    assert_eq!(info.lease_backend, ip.cx.leases.backend_name());
    let swept = admin.sweep(api::SweepRequest {}).await.unwrap().into_inner();
    assert_eq!(swept.scope, "all", "the single user sweeps everything");
    assert!(swept.runs.is_empty());
}

async fn ensure_local(ip: &InProcess, thread: &str) -> String {
    put_local_definition(ip, "def").await;
    let request = api::EnsureSandboxRequest {
        definition_id: "def".into(),
        thread_id: thread.into(),
        ..Default::default()
    };
    let (_, ready) = sandhold_tests::sandbox::ensure(&mut ip.sandboxes(), request).await;
    ready.expect("the sandbox is ready").sandbox_id
}

async fn read_all(ip: &InProcess, sandbox: &str, path: &str) -> Vec<u8> {
    let request =
        api::ReadFileRequest { sandbox_id: sandbox.into(), path: path.into(), ..Default::default() };
    let mut chunks = ip.sandboxes().read_file(request).await.unwrap().into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = chunks.message().await.unwrap() {
        data.extend(chunk.data);
    }
    data
}

fn upload(sandbox: &str, path: &str, size: Option<u64>, data: &[u8]) -> Vec<api::WriteFileRequest> {
    let header = api::WriteFileHeader {
        sandbox_id: sandbox.into(),
        path: path.into(),
        size,
        make_parents: true,
        ..Default::default()
    };
    vec![
        api::WriteFileRequest { request: Some(api::write_file_request::Request::Header(header)) },
        api::WriteFileRequest { request: Some(api::write_file_request::Request::Data(data.to_vec())) },
    ]
}

#[tokio::test]
async fn sandbox_service_streams_files_and_processes() {
    let ip = InProcess::start().await;
    let sandbox = ensure_local(&ip, "t1").await;
    let mut sandboxes = ip.sandboxes();

    let sized = upload(&sandbox, "up/sized.txt", Some(5), b"hello");
    let written = sandboxes.write_file(futures::stream::iter(sized)).await.unwrap().into_inner();
    assert_eq!(written.bytes_written, 5);
    let unsized_upload = upload(&sandbox, "up/unsized.txt", None, b"no size given");
    let written = sandboxes.write_file(futures::stream::iter(unsized_upload)).await.unwrap().into_inner();
    assert_eq!(written.bytes_written, 13);
    assert_eq!(read_all(&ip, &sandbox, "up/sized.txt").await, b"hello");
    assert_eq!(read_all(&ip, &sandbox, "up/unsized.txt").await, b"no size given");
    let short = upload(&sandbox, "up/short.txt", Some(50), b"cut off");
    let refused = sandboxes.write_file(futures::stream::iter(short)).await.unwrap_err();
    assert_ne!(refused.code(), Code::Ok, "an upload shorter than its size is refused");

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let start = api::ExecStreamStart {
        sandbox_id: sandbox.clone(),
        command: Some(api::Command { kind: Some(api::command::Kind::Shell("cat; exit 3".into())) }),
        ..Default::default()
    };
    let message = |r| api::ExecStreamRequest { request: Some(r) };
    tx.send(message(api::exec_stream_request::Request::Start(start))).await.unwrap();
    let mut out =
        sandboxes.exec_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    tx.send(message(api::exec_stream_request::Request::Stdin(b"ping".to_vec()))).await.unwrap();
    tx.send(message(api::exec_stream_request::Request::CloseStdin(api::CloseStdin {}))).await.unwrap();
    let (stdout, exit) = sandhold_tests::sandbox::exec_stream_output(&mut out).await;
    assert_eq!(stdout, b"ping");
    assert_eq!(exit, Some(api::exit_status::Status::Code(3)));
}

#[tokio::test]
async fn sandbox_service_forwarders_end_with_their_call_and_at_shutdown() {
    let ip = InProcess::start().await;
    let sandbox = ensure_local(&ip, "t1").await;
    let message = |r| api::ExecStreamRequest { request: Some(r) };
    // The forwarder of a request stream ends when its client leaves
    // mid-process, and at shutdown while the client stays.
    let tasks = ip.cx.tasks.clone();
    let sleeper = || async {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let start = api::ExecStreamStart {
            sandbox_id: sandbox.clone(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell("sleep 600".into())) }),
            ..Default::default()
        };
        tx.send(message(api::exec_stream_request::Request::Start(start))).await.unwrap();
        let mut out = ip
            .sandboxes()
            .exec_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first = tokio::time::timeout(PATIENCE, out.message()).await.unwrap().unwrap().unwrap();
        assert!(matches!(first.event, Some(api::exec_stream_response::Event::StartedPid(_))), "{first:?}");
        (tx, out)
    };
    let gone = |what: &'static str| {
        let tasks = tasks.clone();
        async move {
            let ended = eventually(PATIENCE, || std::future::ready(tasks.is_empty())).await;
            assert!(ended, "{} tasks still running {what}", tasks.len());
        }
    };
    let (tx, out) = sleeper().await;
    drop((tx, out));
    gone("after their client left").await;
    let (tx, out) = sleeper().await;
    assert!(!tasks.is_empty(), "the forwarder of a live call is on the task set");
    ip.cx.shutdown.cancel();
    gone("at shutdown").await;
    drop((tx, out));
}

#[tokio::test]
async fn snapshot_service_saves_lists_reads_forks_and_deletes_a_checkpoint() {
    let ip = InProcess::start().await;
    let sandbox = ensure_local(&ip, "t1").await;
    let file = upload(&sandbox, "notes/a.txt", Some(6), b"saved\n");
    ip.sandboxes().write_file(futures::stream::iter(file)).await.unwrap();
    let mut snapshots = ip.snapshots();

    let save =
        api::SaveSnapshotRequest { thread_id: "t1".into(), label: "first".into(), ..Default::default() };
    let saved = snapshots.save_snapshot(save).await.unwrap().into_inner().checkpoint.unwrap();
    assert!(saved.head);
    assert_eq!(saved.label, "first");
    let listed = snapshots
        .list_snapshots(api::ListSnapshotsRequest { thread_id: "t1".into() })
        .await
        .unwrap()
        .into_inner()
        .checkpoints;
    assert_eq!(
        listed.iter().map(|c| (c.checkpoint_id.as_str(), c.head)).collect::<Vec<_>>(),
        [(saved.checkpoint_id.as_str(), true)]
    );

    let read = api::ReadArtifactRequest {
        thread_id: "t1".into(),
        checkpoint_id: saved.checkpoint_id.clone(),
        path: "./notes/a.txt".into(),
    };
    let mut artifact = snapshots.read_artifact(read.clone()).await.unwrap().into_inner();
    let (mut info, mut data) = (None, Vec::new());
    while let Some(m) = artifact.message().await.unwrap() {
        info = info.or(m.info);
        data.extend(m.data);
    }
    assert_eq!(data, b"saved\n");
    assert_eq!(info.map(|i| (i.path, i.size)), Some(("notes/a.txt".to_string(), 6)));
    let missing = api::ReadArtifactRequest { path: "notes/none.txt".into(), ..read };
    let refused = snapshots.read_artifact(missing).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");

    let fork = api::ForkSnapshotRequest {
        thread_id: "t1".into(),
        checkpoint_id: saved.checkpoint_id.clone(),
        new_thread_id: "t2".into(),
    };
    let forked = snapshots.fork_snapshot(fork).await.unwrap().into_inner();
    let copy = forked.checkpoint.unwrap();
    assert_eq!((copy.thread_id.as_str(), copy.forked_from.as_str()), ("t2", saved.checkpoint_id.as_str()));

    let delete = api::DeleteSnapshotRequest { thread_id: "t2".into(), checkpoint_id: copy.checkpoint_id };
    snapshots.delete_snapshot(delete).await.unwrap();
    let left = snapshots.list_snapshots(api::ListSnapshotsRequest { thread_id: "t2".into() }).await.unwrap();
    assert!(left.into_inner().checkpoints.is_empty());
}

/// Reads `run_id`'s stream to its end and returns its record.
async fn finished_record(ip: &InProcess, request: api::StartRunRequest) -> api::Run {
    let mut runs = ip.runs();
    let run_id = request.run_id.clone();
    let mut stream = runs.start_run(request).await.expect("the run starts").into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.expect("the run streams"));
    let request = api::GetRunRequest { run_id };
    runs.get_run(request).await.unwrap().into_inner().run.unwrap()
}

#[tokio::test]
async fn a_run_that_names_no_definition_keeps_its_threads() {
    let ip = InProcess::start().await;
    put_local_definition(&ip, "first").await;
    put_local_definition(&ip, "second").await;

    // A thread with neither a run nor a sandbox has no definition to keep.
    let none = ip.runs().start_run(command_run("ip-keep-0", "t-new", "", "true")).await.unwrap_err();
    assert_eq!(none.code(), Code::InvalidArgument, "{none:?}");
    assert!(none.message().contains("definition_id"), "{none:?}");

    // The thread's newest run decides ...
    let named = finished_record(&ip, command_run("ip-keep-1", "t1", "first", "echo one")).await;
    assert_eq!(named.definition_id, "first");
    let kept = finished_record(&ip, command_run("ip-keep-2", "t1", "", "echo two")).await;
    assert_eq!(kept.definition_id, "first", "the run took the thread's definition");
    assert_eq!(kept.sandbox_id, named.sandbox_id, "and so kept the thread's sandbox");

    // ... else the thread's newest sandbox (ensured through the API, never run).
    let request = api::EnsureSandboxRequest {
        definition_id: "second".into(),
        thread_id: "t2".into(),
        ..Default::default()
    };
    let (_, ready) = sandhold_tests::sandbox::ensure(&mut ip.sandboxes(), request).await;
    let sandbox = ready.expect("the sandbox is ready").sandbox.expect("a sandbox").sandbox_id;
    let kept = finished_record(&ip, command_run("ip-keep-3", "t2", "", "echo three")).await;
    assert_eq!(kept.definition_id, "second");
    assert_eq!(kept.sandbox_id, sandbox);

    // A client asks the same question of the server instead of repeating
    // the rule.
    let of_thread = |thread: &str| {
        let mut sandboxes = ip.sandboxes();
        let request = api::GetDefinitionRequest { thread_id: thread.into(), ..Default::default() };
        async move { sandboxes.get_definition(request).await.map(|r| r.into_inner().definition.unwrap().id) }
    };
    assert_eq!(of_thread("t1").await.unwrap(), "first");
    assert_eq!(of_thread("t2").await.unwrap(), "second");
    assert_eq!(of_thread("t-new").await.unwrap_err().code(), Code::NotFound);
    let both = api::GetDefinitionRequest { id: "first".into(), thread_id: "t1".into() };
    assert_eq!(ip.sandboxes().get_definition(both).await.unwrap_err().code(), Code::InvalidArgument);
}

/// What every client would otherwise decide for itself: a definition's id
/// when it brings none, and which secret is a harness's model key.
#[tokio::test]
async fn the_server_settles_a_definitions_id_and_its_model_key() {
    let ip = InProcess::start().await;
    let put = |d: api::SandboxDefinition| {
        let mut sandboxes = ip.sandboxes();
        async move {
            let request = api::PutDefinitionRequest { definition: Some(d) };
            sandboxes.put_definition(request).await.map(|r| r.into_inner().definition.unwrap())
        }
    };
    let unnamed = |setup: &str| {
        let mut d = definition("", Kind::Local);
        d.workspace.get_or_insert_with(Default::default).setup =
            vec![api::SetupStep { step: Some(api::setup_step::Step::Serial(setup.into())) }];
        d
    };
    let a = put(unnamed("echo a")).await.unwrap();
    assert!(a.id.starts_with("def-") && a.id.len() == 20, "{}", a.id);
    assert_eq!(put(unnamed("echo a")).await.unwrap().id, a.id, "the same content, the same id");
    assert_ne!(put(unnamed("echo b")).await.unwrap().id, a.id);
    let request = api::GetDefinitionRequest { id: a.id.clone(), ..Default::default() };
    let got = ip.sandboxes().get_definition(request).await.unwrap().into_inner().definition.unwrap();
    assert_eq!(got, a, "stored under it");

    let access = |harness: &str, upstream: &str| api::ModelAccess {
        harness: harness.into(),
        upstream: upstream.into(),
        key_secret: String::new(),
    };
    let mut d = definition("keyed", Kind::Local);
    d.secret_names = vec!["OTHER".into(), "GOOGLE_API_KEY".into(), "OPENAI_API_KEY".into()];
    d.model_access = vec![access("codex", ""), access("gemini", "")];
    let keyed = put(d).await.unwrap();
    let keys: Vec<_> =
        keyed.model_access.iter().map(|m| (m.harness.as_str(), m.key_secret.as_str())).collect();
    assert_eq!(keys, [("codex", "OPENAI_API_KEY"), ("gemini", "GOOGLE_API_KEY")]);

    // No key among the secrets: nothing to broker, unless an upstream is
    // named, which then cannot work.
    let mut d = definition("keyless", Kind::Local);
    d.model_access = vec![access("claude-code", "")];
    assert!(put(d.clone()).await.unwrap().model_access.is_empty());
    d.model_access = vec![access("claude-code", "http://127.0.0.1:9/")];
    let refused = put(d).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("ANTHROPIC_API_KEY"), "{refused:?}");
}

/// A run's record says what it ran (the command, the prompt), and ListRuns
/// narrows by search text and status, a page at a time.
#[tokio::test]
async fn list_runs_searches_filters_and_pages_and_a_run_says_what_it_ran() {
    let ip = InProcess::start().await;
    put_local_definition(&ip, "def").await;
    let prompted = api::StartRunRequest {
        prompt: "Fix the FLAKY test".into(),
        ..command_run("ip-list-1", "t1", "def", "cat >/dev/null; echo read")
    };
    let first = finished_record(&ip, prompted).await;
    assert_eq!(first.command, ["sh", "-c", "cat >/dev/null; echo read"]);
    assert_eq!((first.prompt.as_str(), first.prompt_truncated), ("Fix the FLAKY test", false));
    finished_record(&ip, command_run("ip-list-2", "t1", "def", "exit 3")).await;
    finished_record(&ip, command_run("ip-list-3", "t2", "def", "echo third")).await;

    let mut runs = ip.runs();
    let list = |request: api::ListRunsRequest| {
        let mut runs = runs.clone();
        async move {
            let page = runs.list_runs(request).await.unwrap().into_inner();
            (page.runs.into_iter().map(|r| r.run_id).collect::<Vec<_>>(), page.next_page_token)
        }
    };
    let query = |q: &str| api::ListRunsRequest { query: q.into(), ..Default::default() };
    assert_eq!(list(query("flaky")).await.0, ["ip-list-1"], "the prompt, case ignored");
    assert_eq!(list(query("echo third")).await.0, ["ip-list-3"], "the command");
    assert_eq!(list(query("LIST-2")).await.0, ["ip-list-2"], "the run id");
    let failed = api::ListRunsRequest { status: api::RunStatus::Failed as i32, ..Default::default() };
    assert_eq!(list(failed).await.0, ["ip-list-2"]);
    let t1 = api::ListRunsRequest { thread_id: "t1".into(), query: "ip-list".into(), ..Default::default() };
    assert_eq!(list(t1).await.0, ["ip-list-2", "ip-list-1"]);

    // Pages of two, newest first, then the rest; the last page has no token.
    let (page, token) = list(api::ListRunsRequest { limit: 2, ..Default::default() }).await;
    assert_eq!(page, ["ip-list-3", "ip-list-2"]);
    assert!(!token.is_empty());
    let (rest, end) = list(api::ListRunsRequest { limit: 2, page_token: token, ..Default::default() }).await;
    assert_eq!((rest, end), (vec!["ip-list-1".to_string()], String::new()));

    let forged = api::ListRunsRequest { page_token: "not a token".into(), ..Default::default() };
    let refused = runs.list_runs(forged).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("page_token"), "{refused:?}");
    let bad_status = api::ListRunsRequest { status: 99, ..Default::default() };
    assert_eq!(runs.list_runs(bad_status).await.unwrap_err().code(), Code::InvalidArgument);
}

/// A sandbox's state, keep-alive and resource use, as the local provider
/// measures them from /proc: only when asked, and never made up for a
/// sandbox that is not running.
#[tokio::test]
async fn sandboxes_say_their_state_keep_alive_and_resource_use() {
    let ip = InProcess::start().await;
    let mut sandboxes = ip.sandboxes();
    let mut def = definition("kept", Kind::Local);
    def.lifecycle = Some(api::Lifecycle { keep_alive_ms: 1, ..Default::default() });
    sandhold_tests::run::put_definition(&mut sandboxes, def).await;
    let request = api::EnsureSandboxRequest {
        definition_id: "kept".into(),
        thread_id: "t-state".into(),
        ..Default::default()
    };
    let (_, ready) = sandhold_tests::sandbox::ensure(&mut sandboxes, request).await;
    let sandbox_id = ready.expect("the sandbox is ready").sandbox_id;

    let lister = sandboxes.clone();
    let listed = |with_state: bool| {
        let mut sandboxes = lister.clone();
        async move {
            let request = api::ListSandboxesRequest { thread_id: "t-state".into(), with_state };
            let mut all = sandboxes.list_sandboxes(request).await.unwrap().into_inner().sandboxes;
            assert_eq!(all.len(), 1);
            all.remove(0)
        }
    };
    let plain = listed(false).await;
    assert_eq!(plain.state(), api::SandboxState::Unspecified, "not asked");
    assert_eq!((plain.keep_alive_ms, plain.usage), (Some(1), None));

    let before = listed(true).await;
    assert_eq!(before.state(), api::SandboxState::Running);
    let used = before.usage.expect("a running local sandbox is measured");
    assert!(used.memory_bytes.unwrap() > 1024 * 1024, "{used:?}");
    assert_eq!(used.memory_limit_bytes, None, "a local sandbox has no limit");
    // Work in the sandbox shows as CPU time.
    let busy = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";
    sandboxes
        .exec(api::ExecRequest {
            sandbox_id: sandbox_id.clone(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell(busy.into())) }),
            ..Default::default()
        })
        .await
        .unwrap();
    let after = listed(true).await.usage.unwrap();
    assert!(
        after.cpu_time_ms.unwrap() >= used.cpu_time_ms.unwrap() + 100,
        "the busy loop's CPU time counts: {used:?} then {after:?}"
    );
    let got = sandboxes.get_sandbox(api::GetSandboxRequest { sandbox_id: sandbox_id.clone() }).await.unwrap();
    assert_eq!(got.into_inner().sandbox.unwrap().state(), api::SandboxState::Running);

    // Idle past its keep-alive: stopped, and nothing measured.
    ip.cx.lifecycle.stop_idle().await;
    let stopped = listed(true).await;
    assert_eq!(stopped.state(), api::SandboxState::Stopped);
    assert_eq!(stopped.usage, None);
    // Its definition gone: the keep-alive is unknown.
    sandboxes.delete_definition(api::DeleteDefinitionRequest { id: "kept".into() }).await.unwrap();
    assert_eq!(listed(false).await.keep_alive_ms, None);
    sandboxes.destroy_sandbox(api::DestroySandboxRequest { sandbox_id }).await.unwrap();
}
