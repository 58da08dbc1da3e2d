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

async fn wait_evaluated(s: &TenantServer, runs: &mut Runs, set: &str) -> api::AttemptSet {
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
    assert!(done, "the attempts were never all evaluated: {set:?}\n{}", s.server.log_text());
    set
}

/// A thread's run writes `base.txt` (and the checkpoint after it is the
/// set's base).
async fn thread_with_a_checkpoint(s: &TenantServer, runs: &mut Runs, thread: &str) {
    let mut stream = runs
        .start_run(command_run("base-run", thread, "def", "printf 'x\\ny\\nz\\n' > base.txt"))
        .await
        .unwrap()
        .into_inner();
    read_until(&mut stream, &mut Seen::default(), |_| false).await.unwrap();
    s.wait_checkpoint(thread, "base-run").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_attempts_are_compared_and_the_passing_one_becomes_the_threads() {
    let s = TenantServer::start("attempts", &[]).await;
    put_definition(&mut s.server.sandboxes(&s.token).await, comparable("def")).await;
    let mut runs = s.server.runs(&s.token).await;
    thread_with_a_checkpoint(&s, &mut runs, "task").await;

    let started = runs.start_attempts(attempts_request("task", 3)).await.unwrap().into_inner().set.unwrap();
    assert_eq!(started.attempts.len(), 3);
    let set_id = started.attempt_set_id.clone();
    let set = wait_evaluated(&s, &mut runs, &set_id).await;
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
