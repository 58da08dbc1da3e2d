//! RunService end to end: the real `sandhold` binary driving real
//! `sandhold-agent`s on the local provider and on Docker.

use std::time::{Duration, Instant};

use rand::Rng;
use sandhold_tests::docker::{self, DockerCleanup};
use sandhold_tests::local::*;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::runtime::Runtime;
use sandhold_tests::server::*;
use sandhold_tests::under_each_runtime;
use sandhold_tests::wait::*;
use shared::proto::v1 as api;

type Setup = TenantServer;

/// A server with definition `def` of `kind` (Docker: under runc).
async fn setup(kind: Kind) -> Setup {
    setup_under(kind, Runtime::Runc).await
}

/// A server with definition `def` of `kind` (Docker: under `runtime`).
async fn setup_under(kind: Kind, runtime: Runtime) -> Setup {
    let mut def = definition("def", kind);
    if kind == Kind::Docker {
        sandhold_tests::docker::ensure_test_image();
        runtime.apply(&mut def);
    }
    let s = TenantServer::start("runs", &["other"]).await;
    put_definition(&mut s.server.sandboxes(&s.token).await, def).await;
    s
}

/// A durable run of 5,000 numbered lines; the client drops at a random
/// point and attaches again from the last offset it received: the union is
/// every line exactly once, in order.
async fn disconnect_and_reattach(kind: Kind, runtime: Runtime) {
    let s = setup_under(kind, runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut runs = s.server.runs(&s.token).await;
    let run_id = format!("run-{}", s.nonce);
    let script = numbered_lines(5000, 100, "0.05");
    let drop_after = rand::thread_rng().gen_range(50..4500usize);

    let mut first = Seen::default();
    {
        let mut stream =
            runs.start_run(command_run(&run_id, "thread-1", "def", &script)).await.unwrap().into_inner();
        let ended = read_until(&mut stream, &mut first, |seen| seen.line_numbers().len() >= drop_after)
            .await
            .unwrap_or_else(|e| panic!("start stream failed: {e}\n{}", s.server.log_text()));
        assert!(!ended, "the run ended before the client dropped");
    } // the stream (the client) is gone here
    let first_lines = first.line_numbers();
    assert_eq!(first.chunks[0].1.name, "run.accepted", "a durable run starts with run.accepted");

    // Disconnecting never cancels: the record says running and detached.
    let detached = eventually(Duration::from_secs(20), || {
        let mut runs = runs.clone();
        let run_id = run_id.clone();
        async move {
            let r = runs.get_run(api::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
            r.detached_since_ms.is_some() || r.status != api::RunStatus::Running as i32
        }
    })
    .await;
    assert!(detached, "the record was never marked detached");

    // A read-only look ends by itself with what is stored now, and drives
    // nothing.
    let mut stored = Seen::default();
    let mut look = runs
        .attach_run(api::AttachRunRequest {
            run_id: run_id.clone(),
            after_offset: first.last_offset().unwrap(),
            thread_id: String::new(),
            stored_only: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(read_until(&mut look, &mut stored, |_| false).await.unwrap(), "stored_only ends by itself");
    if let Some(n) = stored.line_numbers().first() {
        assert_eq!(*n as usize, first_lines.len() + 1, "stored_only starts right after the offset");
    }

    let mut second = Seen::default();
    let mut stream = runs
        .attach_run(api::AttachRunRequest {
            run_id: run_id.clone(),
            after_offset: first.last_offset().unwrap(),
            thread_id: "thread-1".into(),
            stored_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(read_until(&mut stream, &mut second, |_| false).await.unwrap(), "attach ends with the run");

    let mut all = first_lines.clone();
    all.extend(second.line_numbers());
    let expected: Vec<u32> = (1..=5000).collect();
    assert_eq!(all.len(), 5000, "every line exactly once (dropped after {})", first_lines.len());
    assert_eq!(all, expected, "in order");
    let offsets: Vec<&String> = first.chunks.iter().chain(&second.chunks).map(|(o, _)| o).collect();
    let mut unique = offsets.clone();
    unique.dedup();
    assert_eq!(unique.len(), offsets.len(), "no chunk delivered twice");
    let terminal = second.terminal().expect("a terminal chunk");
    assert_eq!(terminal.r#type(), api::ChunkType::RunFinished);
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    assert!(record.finished_at_ms.is_some());

    // Attaching from the start replays the same log, then ends.
    let mut replay = Seen::default();
    let mut stream = runs
        .attach_run(api::AttachRunRequest { run_id: run_id.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(read_until(&mut stream, &mut replay, |_| false).await.unwrap());
    assert_eq!(replay.line_numbers(), expected);
    assert_eq!(replay.chunks.len(), first.chunks.len() + second.chunks.len());

    cancel_stops_at_once(&s, &mut runs, kind).await;
}

/// `CancelRun` on a second run: its process is gone within a second, the
/// container removed, the record `aborted`, a RUN_ERROR at the end.
async fn cancel_stops_at_once(s: &Setup, runs: &mut Runs, kind: Kind) {
    let run_id = format!("cancel-{}", s.nonce);
    let marker = format!("marker{}", s.nonce);
    let script = sleeper(&marker);
    let mut stream =
        runs.start_run(command_run(&run_id, "thread-2", "def", &script)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |seen| seen.has_text("started")).await.unwrap();
    let sandbox = runs.get_run(api::GetRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner();
    let sandbox_id = sandbox.run.unwrap().sandbox_id;
    assert!(!sandbox_id.is_empty(), "the record names its sandbox");
    let tenant_label = format!("dev.sandhold.sandbox-key={sandbox_id}");
    match kind {
        Kind::Local => assert!(process_with_marker(&marker), "the run's shell is running"),
        Kind::Docker => assert!(!docker::running(&tenant_label).is_empty(), "the container runs"),
    }

    let cancelled_at = Instant::now();
    runs.cancel_run(api::CancelRunRequest { run_id: run_id.clone() }).await.unwrap();
    let stopped = eventually(Duration::from_secs(5), || {
        let gone = match kind {
            Kind::Local => !process_with_marker(&marker),
            Kind::Docker => docker::running(&tenant_label).is_empty(),
        };
        async move { gone }
    })
    .await;
    let took = cancelled_at.elapsed();
    assert!(stopped, "the run's process survived the cancel:\n{}", tail(&s.server.log_text()));
    assert!(took <= Duration::from_secs(1), "the cancel took {took:?} to stop the process");
    if kind == Kind::Docker {
        let removed =
            eventually(Duration::from_secs(30), || async { docker::containers(&tenant_label).is_empty() })
                .await;
        assert!(removed, "the container was not removed");
    }

    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap(), "the stream ends");
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.r#type(), api::ChunkType::RunError);
    assert_eq!(terminal.error_code, "CANCELLED");
    let record = wait_terminal(runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32);
    assert!(record.cancel_requested);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_durable_run_disconnect_reattach_and_cancel() {
    disconnect_and_reattach(Kind::Local, Runtime::Runc).await;
}

under_each_runtime! {
#[tokio_test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_durable_run_disconnect_reattach_and_cancel(runtime) {
    disconnect_and_reattach(Kind::Docker, runtime).await;
}
}

/// A cancel that lands while the run's sandbox is still being set up (the
/// drive registered, the command not started): the run ends cancelled,
/// with its terminal chunk written by the driver that was cancelled, its
/// command never started, and its sandbox gone. Before the fix the drive
/// went on to follow a journal that never existed and ended
/// FAILED_PRECONDITION, and an `attach` then took over a run nobody
/// concluded. (Cancels before the drive exists and after the start are
/// the takeover tests' and `cancel_stops_at_once`'s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_during_setup_ends_the_run_cancelled_and_starts_nothing() {
    let s = TenantServer::start("cancel-setup", &[]).await;
    let in_setup = s.server.log.with_file_name("in-setup");
    let go = s.server.log.with_file_name("setup-go");
    let mut def = definition("def", Kind::Local);
    def.workspace = Some(api::WorkspaceDefinition {
        setup: vec![api::SetupStep {
            step: Some(api::setup_step::Step::Serial(format!(
                "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
                in_setup.display(),
                go.display()
            ))),
        }],
        ..Default::default()
    });
    put_definition(&mut s.server.sandboxes(&s.token).await, def).await;
    let mut runs = s.server.runs(&s.token).await;
    let run_id = format!("run-{}", s.nonce);
    let marker = format!("never{}", s.nonce);
    let script = format!("echo {marker} > {}", s.server.log.with_file_name("ran").display());
    let mut stream =
        runs.start_run(command_run(&run_id, "thread-1", "def", &script)).await.unwrap().into_inner();
    let in_setup_seen = eventually(PATIENCE, || async { in_setup.exists() }).await;
    assert!(in_setup_seen, "setup never began:\n{}", tail(&s.server.log_text()));

    runs.cancel_run(api::CancelRunRequest { run_id: run_id.clone() }).await.unwrap();
    std::fs::write(&go, "").unwrap();

    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap(), "the stream ends");
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.r#type(), api::ChunkType::RunError, "{terminal:?}");
    assert_eq!(terminal.error_code, "CANCELLED", "{terminal:?}");
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32, "{record:?}");
    assert!(!s.server.log.with_file_name("ran").exists(), "the cancelled run's command ran");

    // An attach later finds a concluded run: it replays the cancel and
    // takes nothing over.
    let mut replay = Seen::default();
    let mut attach = runs
        .attach_run(api::AttachRunRequest {
            run_id: run_id.clone(),
            thread_id: "thread-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(read_until(&mut attach, &mut replay, |_| false).await.unwrap());
    assert_eq!(replay.terminal().map(|t| t.error_code.clone()), Some("CANCELLED".into()));
    let after = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(after.status, api::RunStatus::Aborted as i32, "{after:?}");
}

/// The pids of a Docker sandbox's agent daemon, read from the container's
/// `/proc` (its init runs it as `/.sandhold/sandhold-agent serve …`; the
/// images have no `pgrep`).
fn agent_daemon_pids(container: &str) -> String {
    let script = "for p in /proc/[0-9]*; do \
                  case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in \
                  '/.sandhold/sandhold-agent serve '*) echo ${p#/proc/};; esac; done";
    let out =
        std::process::Command::new("docker").args(["exec", container, "sh", "-c", script]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

under_each_runtime! {
/// A run in a Docker sandbox outlives its agent daemon: the daemon is
/// SIGKILLed while the command waits, the container's init starts another,
/// the server follows the journal again through it, and the command (kept
/// by its supervisor, not by the daemon) goes on when told to: every line
/// once, in order, and the run completes.
///
/// Under gVisor a connect in the moment between the old daemon's death and
/// the new one's bind succeeds and is never answered (runc refuses it):
/// the server's channels give such a connection up by HTTP/2 keepalive.
#[tokio_test(flavor = "multi_thread", worker_threads = 4)]
async fn a_docker_run_goes_on_through_a_restart_of_its_agent(runtime) {
    let s = setup_under(Kind::Docker, runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut runs = s.server.runs(&s.token).await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let run_id = format!("agent-{}", s.nonce);
    let script = "i=1; while [ $i -le 50 ]; do echo \"line $i\"; i=$((i+1)); done; \
                  while [ ! -e /tmp/go ]; do sleep 0.05; done; \
                  while [ $i -le 100 ]; do echo \"line $i\"; i=$((i+1)); done";
    let mut stream =
        runs.start_run(command_run(&run_id, "thread-1", "def", script)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.line_numbers().len() >= 50)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", s.server.log_text()));
    let record = runs.get_run(api::GetRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner();
    let sandbox = record.run.unwrap().sandbox_id;
    let container =
        docker::running(&format!("dev.sandhold.sandbox-key={sandbox}")).pop().expect("the container");

    let before = agent_daemon_pids(&container);
    assert!(!before.is_empty() && !before.contains('\n'), "one agent daemon: {before:?}");
    let killed = std::process::Command::new("docker")
        .args(["exec", &container, "kill", "-9", &before])
        .output()
        .unwrap();
    assert!(killed.status.success(), "{killed:?}");
    let restarted = eventually(PATIENCE, || {
        let now = agent_daemon_pids(&container);
        std::future::ready(!now.is_empty() && now != before)
    })
    .await;
    assert!(restarted, "no new agent daemon after {before}");

    // Through the new daemon: the command is still waiting for this. Until
    // the daemon listens again a call is refused UNAVAILABLE (retryable),
    // never an unknown failure.
    let touch = api::ExecRequest {
        sandbox_id: sandbox.clone(),
        command: Some(api::Command { kind: Some(api::command::Kind::Shell("touch /tmp/go".into())) }),
        ..Default::default()
    };
    let deadline = Instant::now() + PATIENCE;
    let done = loop {
        match sandboxes.exec(touch.clone()).await {
            Ok(done) => break done.into_inner(),
            Err(e) => assert!(
                e.code() == tonic::Code::Unavailable && Instant::now() < deadline,
                "{e:?}\n{}",
                s.server.log_text()
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done.status.and_then(|s| s.status), Some(api::exit_status::Status::Code(0)));
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap(), "the stream ends");
    assert_eq!(seen.line_numbers(), (1..=100).collect::<Vec<_>>(), "every line once, in order");
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", s.server.log_text());
}
}

/// Bad requests are refused before anything is created; another tenant's
/// run does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_requests_are_validated_and_tenant_scoped() {
    let s = setup(Kind::Local).await;
    let mut runs = s.server.runs(&s.token).await;

    let mut durable_without_id = command_run("", "thread", "def", "true");
    durable_without_id.run_id.clear();
    let err = runs.start_run(durable_without_id).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(err.message().contains("run_id"), "{err}");

    let mut no_harness = command_run("r-x", "thread", "def", "true");
    no_harness.harness = "nope".into();
    assert_eq!(runs.start_run(no_harness).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let mut no_command = command_run("r-y", "thread", "def", "true");
    no_command.options = None;
    assert_eq!(runs.start_run(no_command).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let unknown_def = command_run("r-z", "thread", "missing", "true");
    assert_eq!(runs.start_run(unknown_def).await.unwrap_err().code(), tonic::Code::NotFound);

    // A run that completes; its id cannot be used again.
    let run_id = format!("once-{}", s.nonce);
    let mut stream =
        runs.start_run(command_run(&run_id, "thread", "def", "echo hello")).await.unwrap().into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    assert!(seen.has_text("hello"));
    wait_terminal(&mut runs, &run_id).await;
    let again = runs.start_run(command_run(&run_id, "thread", "def", "echo again")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists);

    // Wrong thread on attach: INVALID_ARGUMENT; unknown run: NOT_FOUND.
    let wrong_thread = api::AttachRunRequest {
        run_id: run_id.clone(),
        after_offset: String::new(),
        thread_id: "another-thread".into(),
        stored_only: false,
    };
    assert_eq!(runs.attach_run(wrong_thread).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let unknown = api::AttachRunRequest { run_id: "nope".into(), ..Default::default() };
    assert_eq!(runs.attach_run(unknown).await.unwrap_err().code(), tonic::Code::NotFound);

    // Another tenant sees nothing.
    let mut other = s.server.runs(&s.token_of("other")).await;
    let get = other.get_run(api::GetRunRequest { run_id: run_id.clone() }).await.unwrap_err();
    assert_eq!(get.code(), tonic::Code::NotFound);
    let attach =
        other.attach_run(api::AttachRunRequest { run_id: run_id.clone(), ..Default::default() }).await;
    assert_eq!(attach.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(
        other.cancel_run(api::CancelRunRequest { run_id: run_id.clone() }).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    let listed = other.list_runs(api::ListRunsRequest::default()).await.unwrap().into_inner();
    assert!(listed.runs.is_empty());

    // Listing and the active run.
    let listed = runs
        .list_runs(api::ListRunsRequest { thread_id: "thread".into(), ..Default::default() })
        .await
        .unwrap();
    let ids: Vec<String> = listed.into_inner().runs.into_iter().map(|r| r.run_id).collect();
    assert_eq!(ids, std::slice::from_ref(&run_id));
    let active = runs.get_active_run(api::GetActiveRunRequest { thread_id: "thread".into() }).await.unwrap();
    assert!(active.into_inner().run.is_none(), "the only run completed");
}

/// A failing command fails the run with its exit code; a non-durable run
/// whose client leaves is aborted and its sandbox destroyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_and_non_durable_disconnects_end_the_run() {
    let s = setup(Kind::Local).await;
    let mut runs = s.server.runs(&s.token).await;

    let failing = format!("fail-{}", s.nonce);
    let mut stream = runs
        .start_run(command_run(&failing, "thread", "def", "echo about to fail; exit 3"))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let terminal = seen.terminal().unwrap();
    assert_eq!(terminal.r#type(), api::ChunkType::RunError, "{terminal:?}");
    // The stream ends at the terminal chunk; the record follows it.
    let record = wait_terminal(&mut runs, &failing).await;
    assert_eq!(record.status, api::RunStatus::Failed as i32);

    let marker = format!("nd{}", s.nonce);
    let mut request = command_run("", "thread-nd", "def", &sleeper(&marker));
    request.durable = false;
    let mut stream = runs.start_run(request).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |seen| seen.has_text("started")).await.unwrap();
    let run_id = seen.chunks[0].1.run_id.clone();
    assert!(run_id.starts_with("run-"), "a generated id: {run_id}");
    assert!(process_with_marker(&marker));
    drop(stream);
    let gone = process_gone_within(&marker, Duration::from_secs(20)).await;
    assert!(gone, "a non-durable run survived its client");
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32);
    assert_eq!(record.error.unwrap().code, "CLIENT_DISCONNECTED");
    assert!(!record.cancel_requested, "a disconnect is never recorded as a cancel");
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// File events while the run is active (`sandbox.file`), the workspace's
/// git diff after it (`file.changed`), both before the terminal chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_events_and_changes_are_reported() {
    if sandhold_tests::services::program("git").is_none() {
        return;
    }
    let s = setup(Kind::Local).await;
    let mut runs = s.server.runs(&s.token).await;
    let script = "git init -q . && git -c user.email=t@example.com -c user.name=t commit -q --allow-empty -m init \
                  && echo first; sleep 0.5; echo hello > notes.txt; sleep 1; echo done";
    let run_id = format!("files-{}", s.nonce);
    let mut stream =
        runs.start_run(command_run(&run_id, "thread", "def", script)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let custom = |name: &str| -> Vec<serde_json::Value> {
        seen.chunks
            .iter()
            .filter(|(_, c)| c.r#type() == api::ChunkType::Custom && c.name == name)
            .map(|(_, c)| serde_json::from_str(&c.value_json).unwrap())
            .collect()
    };
    let files = custom("sandbox.file");
    assert!(
        files.iter().any(|v| v["path"].as_str().is_some_and(|p| p.ends_with("notes.txt"))),
        "no sandbox.file event for notes.txt: {files:?}"
    );
    let changed = custom("file.changed");
    let notes: Vec<_> = changed.iter().filter(|v| v["path"] == "notes.txt").collect();
    assert_eq!(notes.len(), 1, "{changed:?}");
    assert!(notes[0]["diff"].as_str().unwrap().contains("+hello"), "{changed:?}");
    let last = &seen.chunks.last().unwrap().1;
    assert_eq!(last.r#type(), api::ChunkType::RunFinished, "the terminal chunk comes last");
}

/// A skill the run's harness cannot use becomes a `harness.warning` chunk
/// of the run, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skills_a_harness_lacks_are_warnings_of_the_run() {
    let s = setup(Kind::Local).await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let mut def = definition("with-skill", Kind::Local);
    def.workspace = Some(api::WorkspaceDefinition {
        skills: vec![api::Skill { skill: Some(api::skill::Skill::Named("pdf-tools".into())) }],
        ..Default::default()
    });
    put_definition(&mut sandboxes, def).await;
    let mut runs = s.server.runs(&s.token).await;
    // The Claude Code adapter with `true` standing in for the CLI: the run
    // itself is empty; the warning comes from projecting its skills.
    let request = api::StartRunRequest {
        thread_id: "thread".into(),
        run_id: format!("skills-{}", s.nonce),
        definition_id: "with-skill".into(),
        harness: "claude-code".into(),
        options: Some(api::HarnessOptions { program: "true".into(), ..Default::default() }),
        prompt: "hello".into(),
        durable: true,
        ..Default::default()
    };
    let mut stream = runs.start_run(request).await.unwrap().into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    let warnings: Vec<&api::Chunk> =
        seen.chunks.iter().map(|(_, c)| c).filter(|c| c.name == "harness.warning").collect();
    assert!(warnings.iter().any(|w| w.value_json.contains("pdf-tools")), "{:?}", seen.chunks);
    assert!(seen.terminal().is_some());
}

/// `SetEnv`: later execs and runs of the sandbox see the variables (a
/// call's own env still wins); `GetSandbox` shows them and the definition's
/// secrets by name only; a secret's name is refused; another tenant's
/// sandbox is as if it did not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn set_env_reaches_later_execs_and_runs_of_the_sandbox() {
    let s = setup(Kind::Local).await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let mut def = definition("env-def", Kind::Local);
    def.secret_names = vec!["API_TOKEN".into()];
    put_definition(&mut sandboxes, def).await;
    let mut runs = s.server.runs(&s.token).await;
    let with_secret = |mut r: api::StartRunRequest| {
        r.secrets.insert("API_TOKEN".into(), "value-of-the-token".into());
        r
    };
    let first = command_run(&format!("env1-{}", s.nonce), "env", "env-def", "true");
    let mut stream = runs.start_run(with_secret(first)).await.unwrap().into_inner();
    assert!(read_until(&mut stream, &mut Seen::default(), |_| false).await.unwrap());
    let sandbox_id = wait_terminal(&mut runs, &format!("env1-{}", s.nonce)).await.sandbox_id;

    let set = |set: &[(&str, &str)], unset: &[&str]| api::SetEnvRequest {
        sandbox_id: sandbox_id.clone(),
        set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        unset: unset.iter().map(|k| k.to_string()).collect(),
    };
    let shown = sandboxes.set_env(set(&[("STAGE", "two"), ("OTHER", "x")], &[])).await.unwrap().into_inner();
    assert_eq!(shown.sandbox.unwrap().env.len(), 2);
    sandboxes.set_env(set(&[], &["OTHER"])).await.unwrap();
    let got = sandboxes.get_sandbox(api::GetSandboxRequest { sandbox_id: sandbox_id.clone() }).await.unwrap();
    let got = got.into_inner().sandbox.unwrap();
    assert_eq!(got.env, [("STAGE".to_string(), "two".to_string())].into());
    assert_eq!(got.secret_names, ["API_TOKEN"], "secrets by name, never a value");
    let secret = sandboxes.set_env(set(&[("API_TOKEN", "stored?")], &[])).await.unwrap_err();
    assert_eq!(secret.code(), tonic::Code::InvalidArgument, "{secret:?}");
    assert!(secret.message().contains("set[API_TOKEN]"), "{secret:?}");
    let bad = sandboxes.set_env(set(&[("1X", "v")], &[])).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");

    let exec = |env: &[(&str, &str)]| api::ExecRequest {
        sandbox_id: sandbox_id.clone(),
        command: Some(api::Command { kind: Some(api::command::Kind::Shell("echo $STAGE".into())) }),
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    assert_eq!(sandboxes.exec(exec(&[])).await.unwrap().into_inner().stdout, b"two\n");
    assert_eq!(sandboxes.exec(exec(&[("STAGE", "call")])).await.unwrap().into_inner().stdout, b"call\n");

    let second = command_run(&format!("env2-{}", s.nonce), "env", "env-def", "echo stage=$STAGE");
    let mut stream = runs.start_run(with_secret(second)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    assert!(seen.has_text("stage=two"), "{:?}", seen.chunks);

    let mut other = s.server.sandboxes(&s.token_of("other")).await;
    let theirs = other.set_env(set(&[("STAGE", "theirs")], &[])).await.unwrap_err();
    assert_eq!(theirs.code(), tonic::Code::NotFound, "{theirs:?}");
    let theirs =
        other.get_sandbox(api::GetSandboxRequest { sandbox_id: sandbox_id.clone() }).await.unwrap_err();
    assert_eq!(theirs.code(), tonic::Code::NotFound, "{theirs:?}");
    let got = sandboxes.get_sandbox(api::GetSandboxRequest { sandbox_id }).await.unwrap().into_inner();
    assert_eq!(got.sandbox.unwrap().env, [("STAGE".to_string(), "two".to_string())].into());
}
