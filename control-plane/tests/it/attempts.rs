//! Attempts end to end on a real server: a task fanned out to N runs from
//! the thread's checkpoint, each attempt's diff and `scripts.test` recorded,
//! the winner promoted into the thread (whose next run sees its files and
//! not the others'), promotes that repeat or compete, and sets refused
//! whole at the operator's and the tenant's limits.

use std::time::Duration;

use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::server::*;
use sandhold_tests::wait::{PATIENCE, eventually};
use shared::proto::v1 as api;

/// A local definition with portable snapshots whose `scripts.test` passes
/// when `pass.txt` exists.
fn comparable(id: &str) -> api::SandboxDefinition {
    let mut def = definition(id, Kind::Local);
    def.workspace = Some(api::WorkspaceDefinition {
        scripts: [("test".to_string(), "echo testing; test -f pass.txt".to_string())].into(),
        ..Default::default()
    });
    def.lifecycle = Some(api::Lifecycle {
        portable_snapshots: Some(api::PortableSnapshots { enabled: true, ..Default::default() }),
        ..Default::default()
    });
    def
}

/// The attempts' command: each attempt does something else, by its
/// SANDHOLD_ATTEMPT.
const BY_ATTEMPT: &str = "case $SANDHOLD_ATTEMPT in \
     0) printf 'one\\ntwo\\n' > a.txt;; \
     1) echo pass > pass.txt;; \
     2) rm base.txt;; \
     esac; echo attempt $SANDHOLD_ATTEMPT done";

fn attempts_request(thread: &str, count: u32) -> api::StartAttemptsRequest {
    let mut run = command_run("ignored", thread, "def", BY_ATTEMPT);
    run.durable = true;
    api::StartAttemptsRequest { run: Some(run), count, attempts: Vec::new() }
}

async fn wait_evaluated(server: &ServerProcess, runs: &mut Runs, set: &str) -> api::AttemptSet {
    let get = |mut runs: Runs| async move {
        let request = api::GetAttemptSetRequest { attempt_set_id: set.to_string() };
        runs.get_attempt_set(request).await.unwrap().into_inner().set.unwrap()
    };
    let done = eventually(PATIENCE * 2, || {
        let runs = runs.clone();
        async move { get(runs).await.attempts.iter().all(|a| a.evaluated) }
    })
    .await;
    let set = get(runs.clone()).await;
    assert!(done, "the attempts were never all evaluated: {set:?}\n{}", server.log_text());
    set
}

/// A thread's run writes `base.txt` (and the checkpoint after it is the
/// set's base).
async fn thread_with_a_checkpoint(server: &ServerProcess, token: &str, runs: &mut Runs, thread: &str) {
    let mut stream = runs
        .start_run(command_run("base-run", thread, "def", "printf 'x\\ny\\nz\\n' > base.txt"))
        .await
        .unwrap()
        .into_inner();
    read_until(&mut stream, &mut Seen::default(), |_| false).await.unwrap();
    server.wait_checkpoint(token, thread, "base-run").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_attempts_are_compared_and_the_passing_one_becomes_the_threads() {
    let s = TenantServer::start("attempts", &[]).await;
    put_definition(&mut s.server.sandboxes(&s.token).await, comparable("def")).await;
    let mut runs = s.server.runs(&s.token).await;
    thread_with_a_checkpoint(&s.server, &s.token, &mut runs, "task").await;

    let started = runs.start_attempts(attempts_request("task", 3)).await.unwrap().into_inner().set.unwrap();
    assert_eq!(started.attempts.len(), 3);
    let set_id = started.attempt_set_id.clone();
    let set = wait_evaluated(&s.server, &mut runs, &set_id).await;
    let by = |n: u32| set.attempts.iter().find(|a| a.attempt == n).unwrap().clone();
    let (zero, one, two) = (by(0), by(1), by(2));
    for a in [&zero, &one, &two] {
        assert_eq!(a.status(), api::RunStatus::Completed, "{a:?}");
        assert!(!a.checkpoint_id.is_empty(), "{a:?}");
        assert!(a.duration_ms > 0, "{a:?}");
    }
    let changes = |a: &api::Attempt| -> Vec<(String, String)> {
        a.files.iter().map(|f| (f.path.clone(), f.change.clone())).collect()
    };
    assert_eq!(changes(&zero), [("a.txt".to_string(), "added".to_string())]);
    assert_eq!((zero.lines_added, zero.lines_removed), (2, 0));
    assert_eq!(changes(&one), [("pass.txt".to_string(), "added".to_string())]);
    assert_eq!(changes(&two), [("base.txt".to_string(), "removed".to_string())]);
    assert_eq!((two.lines_added, two.lines_removed), (0, 3));
    assert_eq!(one.test_exit_code, Some(0), "{one:?}");
    assert_eq!(zero.test_exit_code, Some(1), "{zero:?}");
    assert!(zero.test_output_tail.contains("testing"), "{zero:?}");

    let patch = runs
        .get_attempt_patch(api::GetAttemptPatchRequest {
            attempt_set_id: set_id.clone(),
            run_id: zero.run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(patch.patch.contains("+++ b/a.txt") && patch.patch.contains("+two"), "{}", patch.patch);

    // Promote the passing attempt; again is the same; another is refused.
    let promote =
        |run_id: &str| api::PromoteAttemptRequest { attempt_set_id: set_id.clone(), run_id: run_id.into() };
    let promoted = runs.promote_attempt(promote(&one.run_id)).await.unwrap().into_inner();
    assert_eq!(promoted.set.as_ref().unwrap().promoted_run_id, one.run_id);
    let again = runs.promote_attempt(promote(&one.run_id)).await.unwrap().into_inner();
    assert_eq!(
        again.checkpoint_id, promoted.checkpoint_id,
        "a second promote of the winner changed something"
    );
    let refused = runs.promote_attempt(promote(&zero.run_id)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains(&one.run_id), "{}", refused.message());

    // The thread's next run sees the winner's workspace, none of the others'.
    let mut stream = runs
        .start_run(command_run("after", "task", "def", "ls -1 | sort | tr '\\n' ' '"))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap();
    let listed: String = seen.chunks.iter().map(|(_, c)| c.delta.clone()).collect();
    assert!(listed.contains("pass.txt") && listed.contains("base.txt"), "{listed}");
    assert!(!listed.contains("a.txt"), "a losing attempt's file reached the thread: {listed}");
    // And the winner's run is in the thread's conversation.
    let thread_runs = runs
        .list_runs(api::ListRunsRequest { thread_id: "task".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .runs;
    assert!(thread_runs.iter().any(|r| r.forked_from_run == one.run_id), "{thread_runs:?}");
    // The losers' sandboxes are gone.
    let sandboxes = s.server.sandboxes(&s.token).await;
    for loser in [&zero, &two] {
        let gone = eventually(Duration::from_secs(30), || {
            let mut sandboxes = sandboxes.clone();
            let thread = loser.thread_id.clone();
            async move {
                let list = sandboxes.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap();
                !list.into_inner().sandboxes.iter().any(|s| s.thread_id == thread)
            }
        })
        .await;
        assert!(gone, "attempt {} kept its sandbox", loser.attempt);
    }
}

/// An attempt is evaluated with the checkpoint its run's end saved (which
/// carries the harness session), not with one the keeper takes: the run
/// is terminal before its driver has exported the session and saved that
/// checkpoint, and the keeper waits for the driver to let go of the run.
/// Many files make that checkpoint outlast the keeper's 2 s pass; before,
/// the keeper took a second checkpoint of its own meanwhile (without the
/// session: a promoted winner whose conversation did not continue).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attempt_is_evaluated_with_the_checkpoint_its_runs_end_saved() {
    let s = TenantServer::start("attempts-concluded", &[]).await;
    put_definition(&mut s.server.sandboxes(&s.token).await, comparable("def")).await;
    let mut runs = s.server.runs(&s.token).await;
    let mut run = command_run(
        "ignored",
        "task",
        "def",
        "mkdir many && cd many && for i in $(seq 1 3000); do echo $i > $i; done",
    );
    run.durable = true;
    let request = api::StartAttemptsRequest { run: Some(run), count: 2, attempts: Vec::new() };
    let set = runs.start_attempts(request).await.unwrap().into_inner().set.unwrap();
    let set = wait_evaluated(&s.server, &mut runs, &set.attempt_set_id).await;
    let mut snapshots = s.server.snapshots(&s.token).await;
    for a in &set.attempts {
        assert_eq!(a.status(), api::RunStatus::Completed, "{a:?}");
        let listed = snapshots
            .list_snapshots(api::ListSnapshotsRequest { thread_id: a.thread_id.clone() })
            .await
            .unwrap()
            .into_inner()
            .checkpoints;
        let own: Vec<_> = listed.iter().filter(|c| c.forked_from.is_empty()).collect();
        assert_eq!(own.len(), 1, "attempt {}: not one checkpoint of its own: {own:?}", a.attempt);
        assert_eq!(own[0].label, "after run", "{own:?}");
        assert_eq!(a.checkpoint_id, own[0].checkpoint_id, "attempt {}: {a:?}", a.attempt);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_set_past_a_limit_is_refused_whole_and_starts_nothing() {
    let s =
        TenantServer::start_with_args("attempts-quota", &[], &["--max-running-runs-per-tenant", "2"]).await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, comparable("def")).await;
    let mut runs = s.server.runs(&s.token).await;

    let refused = runs.start_attempts(attempts_request("task", 3)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("room for 2"), "{}", refused.message());
    let listed = runs.list_runs(api::ListRunsRequest::default()).await.unwrap().into_inner().runs;
    assert!(listed.is_empty(), "a refused set started runs: {listed:?}");
    let made = sandboxes.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner();
    assert!(made.sandboxes.is_empty(), "a refused set made sandboxes: {made:?}");

    let refused = runs.start_attempts(attempts_request("task", 9)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("at most 8"), "{}", refused.message());

    let mut plain = definition("plain", Kind::Local);
    plain.id = "plain".into();
    put_definition(&mut sandboxes, plain).await;
    let mut request = attempts_request("task", 2);
    request.run.as_mut().unwrap().definition_id = "plain".into();
    let refused = runs.start_attempts(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("portable snapshots"), "{}", refused.message());
}

/// Three real Claude Code attempts against the fake model, whose shell tool
/// call writes `attempt-$SANDHOLD_ATTEMPT.txt` and prints it: the set
/// records three different files and that only attempt 1 passes
/// `scripts.test`; promoting attempt 1 gives the thread its file and not
/// the others', and the thread's next run sends the model the winner's
/// conversation (its tool result), not a loser's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claude_code_attempts_are_compared_and_the_winners_conversation_continues() {
    let Some(bin) = sandhold_tests::model::cli("claude") else { return };
    let s = TenantServer::start("attempts-claude", &[]).await;
    let mut def = comparable("def");
    def.workspace.as_mut().unwrap().scripts.insert("test".into(), "test -f attempt-1.txt".into());
    put_definition(&mut s.server.sandboxes(&s.token).await, def).await;
    let home = s.server.log.with_file_name("home");
    std::fs::create_dir_all(&home).unwrap();
    let model = sandhold_tests::model::FakeModel::with(
        "tool",
        sandhold_tests::model::FakeOptions {
            log: Some(s.server.log.with_file_name("model.log")),
            tool_command: Some(
                "echo \"wrote by attempt $SANDHOLD_ATTEMPT\" | tee attempt-$SANDHOLD_ATTEMPT.txt".into(),
            ),
            ..Default::default()
        },
    );
    let options = crate::conversations::claude_options(&bin, &home, model.port);
    let run = api::StartRunRequest {
        thread_id: "task".into(),
        definition_id: "def".into(),
        harness: "claude-code".into(),
        options: Some(options.clone()),
        prompt: format!("Write your file, {}.", s.nonce),
        ..Default::default()
    };
    let mut runs = s.server.runs(&s.token).await;
    let request = api::StartAttemptsRequest { run: Some(run), count: 3, attempts: Vec::new() };
    let set = runs.start_attempts(request).await.unwrap().into_inner().set.unwrap();
    let set = wait_evaluated(&s.server, &mut runs, &set.attempt_set_id).await;
    for a in &set.attempts {
        assert_eq!(a.status(), api::RunStatus::Completed, "{a:?}");
        let mine = format!("attempt-{}.txt", a.attempt);
        assert!(a.files.iter().any(|f| f.path == mine && f.change == "added"), "{a:?}");
        assert!(
            a.files.iter().all(|f| !f.path.starts_with("attempt-") || f.path == mine),
            "an attempt saw another's file: {a:?}"
        );
        let passes = if a.attempt == 1 { Some(0) } else { Some(1) };
        assert_eq!(a.test_exit_code, passes, "{a:?}");
    }
    let winner = set.attempts.iter().find(|a| a.attempt == 1).unwrap();
    runs.promote_attempt(api::PromoteAttemptRequest {
        attempt_set_id: set.attempt_set_id.clone(),
        run_id: winner.run_id.clone(),
    })
    .await
    .unwrap();

    let question = format!("What did you write, {}?", s.nonce);
    let next = api::StartRunRequest {
        thread_id: "task".into(),
        run_id: format!("next-{}", s.nonce),
        harness: "claude-code".into(),
        options: Some(options),
        prompt: question.clone(),
        durable: true,
        ..Default::default()
    };
    let mut stream = runs.start_run(next).await.unwrap().into_inner();
    read_until(&mut stream, &mut Seen::default(), |_| false).await.unwrap();
    let record = wait_terminal(&mut runs, &format!("next-{}", s.nonce)).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    let requests = model.requests();
    let asked: Vec<&String> = requests.iter().filter(|r| r.contains(&question)).collect();
    assert!(!asked.is_empty(), "the question reached the model");
    assert!(
        asked.iter().any(|r| r.contains("wrote by attempt 1")),
        "the winner's conversation was not continued"
    );
    assert!(
        asked.iter().all(|r| !r.contains("wrote by attempt 0") && !r.contains("wrote by attempt 2")),
        "a losing attempt's conversation reached the model"
    );
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let (_, listed) =
        sandhold_tests::sandbox::sh(&mut sandboxes, &record.sandbox_id, "ls attempt-*.txt").await;
    assert_eq!(listed, "attempt-1.txt\n", "the thread's workspace is not the winner's");
}

/// Two replicas on PostgreSQL: the one driving a set's runs is killed with
/// SIGKILL while they print; attaching through the other, every attempt
/// completes with every line exactly once, and the survivor evaluates them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_attempt_completes_once_when_its_replica_is_killed() {
    // `None`: the services are missing and not required (a skip).
    let Some(cluster) = sandhold_tests::cluster::Cluster::create("attempts-kill").await else { return };
    let (tenant, token) = (format!("t{}", cluster.nonce), format!("tok-{}", cluster.nonce));
    let tokens = vec![format!("{tenant}={token}")];
    let mut a = cluster.replica("a", tokens.clone(), (3000, 500), Vec::new()).await;
    let b = cluster.replica("b", tokens, (3000, 500), Vec::new()).await;
    put_definition(&mut a.sandboxes(&token).await, comparable("def")).await;
    let mut runs_a = a.runs(&token).await;
    let script =
        "for i in $(seq 1 40); do echo \"line $i\"; sleep 0.1; done; echo $SANDHOLD_ATTEMPT > done.txt";
    let mut run = command_run("ignored", "task", "def", script);
    run.durable = true;
    let request = api::StartAttemptsRequest { run: Some(run), count: 3, attempts: Vec::new() };
    let set = runs_a.start_attempts(request).await.unwrap().into_inner().set.unwrap();
    // Some lines in, the driving replica dies.
    let mut first = Seen::default();
    let mut stream = runs_a
        .attach_run(api::AttachRunRequest { run_id: set.attempts[0].run_id.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    read_until(&mut stream, &mut first, |seen| seen.has_text("line 5")).await.unwrap();
    a.kill9().await;

    let mut runs_b = b.runs(&token).await;
    for attempt in &set.attempts {
        let mut seen = Seen::default();
        let mut stream = runs_b
            .attach_run(api::AttachRunRequest {
                run_id: attempt.run_id.clone(),
                thread_id: attempt.thread_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            read_until(&mut stream, &mut seen, |_| false).await.unwrap(),
            "attempt {} never ended",
            attempt.attempt
        );
        let text: String = seen.chunks.iter().map(|(_, c)| c.delta.clone()).collect();
        for i in 1..=40 {
            assert_eq!(
                text.matches(&format!("line {i}\n")).count(),
                1,
                "attempt {}: line {i} not once:\n{text}",
                attempt.attempt
            );
        }
        assert_eq!(
            seen.terminal().map(|t| t.r#type()),
            Some(api::ChunkType::RunFinished),
            "{:?}",
            seen.chunks.last()
        );
    }
    let set = wait_evaluated(&b, &mut runs_b, &set.attempt_set_id).await;
    for attempt in &set.attempts {
        assert!(attempt.files.iter().any(|f| f.path == "done.txt"), "{attempt:?}");
    }
    drop((a, b));
    cluster.tear_down().await;
}

/// A set started on a fleet spreads its attempts over the nodes: three
/// attempts on three like nodes (each in its own network namespace) land
/// one on each. Placement counts the sandboxes it is still making, so the
/// burst does not all go to the node whose heartbeat reported a few MiB
/// more free memory (which is what it did before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_set_on_a_fleet_spreads_its_attempts_over_the_nodes() {
    use sandhold_tests::fleet::{Fleet, NodeSpec};
    let Some(mut fleet) = Fleet::start("fleet-attempts", &[]).await else { return };
    let names = ["node-a", "node-b", "node-c"];
    for name in names {
        fleet.add_node(NodeSpec { name: name.into(), slots: Some(10), ..Default::default() });
    }
    fleet.wait_state(&names, "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, comparable("def")).await;
    let mut runs = fleet.server.runs(&fleet.token).await;
    thread_with_a_checkpoint(&fleet.server, &fleet.token, &mut runs, "task").await;
    // The set starts from the checkpoint on an empty fleet: the thread's
    // own sandbox is destroyed first.
    let listed = |mut sandboxes: Sandboxes| async move {
        sandboxes.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner().sandboxes
    };
    for sandbox in listed(sandboxes.clone()).await {
        let request = api::DestroySandboxRequest { sandbox_id: sandbox.sandbox_id };
        sandboxes.destroy_sandbox(request).await.unwrap();
    }

    let set = runs.start_attempts(attempts_request("task", 3)).await.unwrap().into_inner().set.unwrap();
    let set = wait_evaluated(&fleet.server, &mut runs, &set.attempt_set_id).await;
    assert!(set.attempts.iter().all(|a| a.status() == api::RunStatus::Completed), "{set:?}");
    let on: std::collections::BTreeMap<String, String> = listed(sandboxes.clone())
        .await
        .into_iter()
        .filter(|s| s.thread_id.starts_with(&set.attempt_set_id))
        .map(|s| (s.thread_id, s.node))
        .collect();
    let nodes: std::collections::BTreeSet<&str> = on.values().map(String::as_str).collect();
    assert_eq!((on.len(), nodes), (3, names.into_iter().collect()), "{on:?}\n{}", fleet.logs());
}

/// `attempts promote SET RUN --push BRANCH` (the CLI): the winner's
/// changes are committed, as the author given, on BRANCH, which is pushed
/// to the workspace's origin; the branch there has the winner's file and
/// none of the other attempts'.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn promote_push_commits_the_winners_changes_on_its_branch_at_the_origin() {
    use sandhold_tests::local::{TestDir, bare_origin, git};
    let s = TenantServer::start("attempts-push", &[]).await;
    let dir = TestDir::new("attempts-origin");
    let bare = bare_origin(dir.path());
    let mut def = comparable("def");
    let source = api::GitSource {
        url: bare.display().to_string(),
        history: Some(api::git_source::History::Full(true)),
        ..Default::default()
    };
    def.workspace.as_mut().unwrap().source =
        Some(api::Source { source: Some(api::source::Source::Git(source)) });
    put_definition(&mut s.server.sandboxes(&s.token).await, def).await;
    let mut runs = s.server.runs(&s.token).await;
    thread_with_a_checkpoint(&s.server, &s.token, &mut runs, "task").await;
    let set = runs.start_attempts(attempts_request("task", 3)).await.unwrap().into_inner().set.unwrap();
    let set = wait_evaluated(&s.server, &mut runs, &set.attempt_set_id).await;
    let winner = set.attempts.iter().find(|a| a.test_exit_code == Some(0)).expect("a passing attempt");

    let data = TestDir::new("attempts-push-cli");
    let out = sandhold_tests::cli::sandhold(data.path())
        .args(["attempts", "promote", &set.attempt_set_id, &winner.run_id, "--push", "fix/winner"])
        .args(["--author", "Ada Lovelace <ada@example.com>", "--output", "json"])
        .env("SANDHOLD_SERVER", &s.server.addr)
        .env("SANDHOLD_TOKEN", &s.token)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}\n{}", String::from_utf8_lossy(&out.stderr), s.server.log_text());
    let pushed: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(pushed["pushed"], "fix/winner", "{text}");

    let head = git(&bare, &["log", "-1", "--format=%H|%an|%ae", "fix/winner"]);
    assert_eq!(head, format!("{}|Ada Lovelace|ada@example.com", pushed["commit"].as_str().unwrap()));
    let files = git(&bare, &["ls-tree", "-r", "--name-only", "fix/winner"]);
    let files: Vec<&str> = files.lines().collect();
    assert_eq!(files, ["app.txt", "base.txt", "pass.txt"], "{files:?}");
    assert_eq!(git(&bare, &["branch", "--list", "main", "fix/winner"]).lines().count(), 2);
}
