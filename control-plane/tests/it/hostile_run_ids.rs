//! Run ids played as a hostile tenant would use them: run ids are a
//! namespace per tenant, so tenant B starting a run with an id tenant A
//! uses gets a run of its own (no `ALREADY_EXISTS` oracle, no squatting),
//! and every call of B on an id only A holds answers exactly what an
//! unknown id answers (a delete included). A's runs are untouched by
//! anything B does; A removes its own ended runs, never a live one. Real
//! `sandhold` server with API tokens, on SQLite with in-process leases and
//! on PostgreSQL with Redis.

use sandhold_tests::database::ScratchDatabase;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::server::*;
use shared::error::Error as WireError;
use shared::proto::v1 as api;

/// What a client can learn of a run id from the server's refusal (code,
/// message, details, headers), with the id itself replaced: two ids are
/// indistinguishable when these are equal.
fn refusal(status: tonic::Status, run_id: &str) -> String {
    let wire = WireError::from_status(&status);
    let mut headers = status.metadata().clone().into_headers();
    headers.remove("date");
    // The details as bytes: equal for ids of one length (lengths are encoded).
    let details = String::from_utf8_lossy(status.details());
    format!("{:?} {wire:?} {details:?} {headers:?}", status.code()).replace(run_id, "<id>")
}

/// Every RunService call naming `run_id`, as `runs` sees it: the answer of
/// each, with the id replaced (`ok` for a success).
async fn answers(runs: &mut Runs, run_id: &str) -> Vec<String> {
    let id = || run_id.to_owned();
    let mut out = Vec::new();
    let get = runs.get_run(api::GetRunRequest { run_id: id() }).await;
    out.push(get.map_or_else(|e| refusal(e, run_id), |_| "ok".into()));
    for stored_only in [false, true] {
        let request = api::AttachRunRequest { run_id: id(), stored_only, ..Default::default() };
        let attach = runs.attach_run(request).await;
        out.push(attach.map_or_else(|e| refusal(e, run_id), |_| "ok".into()));
    }
    let from_offset = api::AttachRunRequest { run_id: id(), after_offset: "1".into(), ..Default::default() };
    out.push(runs.attach_run(from_offset).await.map_or_else(|e| refusal(e, run_id), |_| "ok".into()));
    let of_thread =
        api::AttachRunRequest { run_id: id(), thread_id: "thread-a".into(), ..Default::default() };
    out.push(runs.attach_run(of_thread).await.map_or_else(|e| refusal(e, run_id), |_| "ok".into()));
    let cancel = runs.cancel_run(api::CancelRunRequest { run_id: id() }).await;
    out.push(cancel.map_or_else(|e| refusal(e, run_id), |_| "ok".into()));
    let delete = runs.delete_run(api::DeleteRunRequest { run_id: id() }).await;
    out.push(delete.map_or_else(|e| refusal(e, run_id), |_| "ok".into()));
    out
}

/// A's run as stored: its record and its whole log.
async fn stored(runs: &mut Runs, run_id: &str) -> (api::Run, Seen) {
    let run =
        runs.get_run(api::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap();
    let request = api::AttachRunRequest { run_id: run_id.into(), stored_only: true, ..Default::default() };
    let mut stream = runs.attach_run(request).await.unwrap().into_inner();
    let mut log = Seen::default();
    read_until(&mut stream, &mut log, |_| false).await.unwrap();
    (run, log)
}

async fn another_tenants_run_id(s: &TenantServer) {
    let (token_a, token_b) = (s.token.clone(), s.token_of("b"));
    for token in [&token_a, &token_b] {
        put_definition(&mut s.server.sandboxes(token).await, definition("def", Kind::Local)).await;
    }
    let mut runs_a = s.server.runs(&token_a).await;
    let mut runs_b = s.server.runs(&token_b).await;
    let nonce = &s.nonce;

    // A's ended run, and one still running.
    let shared_id = format!("shared-{nonce}");
    let seen_a = run_to_end(&mut runs_a, &shared_id, "thread-a", "def", "echo from-a").await;
    assert!(seen_a.has_text("from-a"));
    wait_terminal(&mut runs_a, &shared_id).await;
    let before = stored(&mut runs_a, &shared_id).await;
    let live_id = format!("live-{nonce}");
    let (_live_stream, _) =
        start_and_read(&mut runs_a, &live_id, "thread-a", "echo line 1; sleep 600", 1).await;

    // B reuses A's ids: each is a run of B's own, not ALREADY_EXISTS.
    let seen_b = run_to_end(&mut runs_b, &shared_id, "thread-b", "def", "echo from-b").await;
    assert!(seen_b.has_text("from-b") && !seen_b.has_text("from-a"), "{seen_b:?}");
    let b_run = wait_terminal(&mut runs_b, &shared_id).await;
    assert_eq!((b_run.thread_id.as_str(), b_run.status), ("thread-b", api::RunStatus::Completed as i32));
    assert_ne!(b_run.sandbox_id, before.0.sandbox_id, "B's run ran in B's sandbox");
    let (_, b_log) = stored(&mut runs_b, &shared_id).await;
    assert!(b_log.has_text("from-b") && !b_log.has_text("from-a"));
    // Within B's namespace the id is now taken, as it is within A's.
    let again = runs_b.start_run(command_run(&shared_id, "thread-b", "def", "true")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists, "{again:?}");
    let again = runs_a.start_run(command_run(&shared_id, "thread-a", "def", "true")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists, "{again:?}");

    // B's calls on ids only A holds answer what an unknown id answers.
    // Of the length of A's ids, so that even the details' bytes compare.
    let unknown = format!("nope-{nonce}");
    let for_unknown = answers(&mut runs_b, &unknown).await;
    assert!(for_unknown.iter().all(|a| a.contains("NotFound")), "{for_unknown:#?}");
    for a_only in [format!("live-{nonce}"), format!("only-{nonce}")] {
        if a_only.starts_with("only") {
            run_to_end(&mut runs_a, &a_only, "thread-a", "def", "echo only-a").await;
        }
        assert_eq!(answers(&mut runs_b, &a_only).await, for_unknown, "B learns nothing of A's {a_only}");
    }
    let listed = runs_b.list_runs(api::ListRunsRequest::default()).await.unwrap().into_inner().runs;
    assert_eq!(listed.iter().map(|r| r.thread_id.as_str()).collect::<Vec<_>>(), ["thread-b"]);
    let active = runs_b.get_active_run(api::GetActiveRunRequest { thread_id: "thread-a".into() }).await;
    assert!(active.unwrap().into_inner().run.is_none());

    // A's runs are untouched: the ended one's record and log as before,
    // the live one still running (B's cancel reached nothing) and writing.
    let after = stored(&mut runs_a, &shared_id).await;
    assert_eq!(after.0, before.0, "A's record of {shared_id}");
    assert_eq!(after.1.chunks, before.1.chunks, "A's log of {shared_id}");
    let live = runs_a.get_run(api::GetRunRequest { run_id: live_id.clone() }).await.unwrap();
    let live = live.into_inner().run.unwrap();
    assert_eq!(live.status, api::RunStatus::Running as i32, "{live:?}\n{}", s.server.log_text());
    assert!(!live.cancel_requested, "B's cancel was recorded on A's run");
    let only_a = format!("only-{nonce}");
    let kept = runs_a.get_run(api::GetRunRequest { run_id: only_a.clone() }).await;
    assert!(kept.is_ok(), "B's delete removed A's ended run: {kept:?}");

    // A removes its own runs: not while one still runs, an ended one with
    // its log; B's run of the same id stays.
    let refused = runs_a.delete_run(api::DeleteRunRequest { run_id: live_id.clone() }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    runs_a.delete_run(api::DeleteRunRequest { run_id: shared_id.clone() }).await.unwrap();
    let gone = runs_a.get_run(api::GetRunRequest { run_id: shared_id.clone() }).await.unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    let replay = api::AttachRunRequest { run_id: shared_id.clone(), stored_only: true, ..Default::default() };
    assert_eq!(runs_a.attach_run(replay).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(stored(&mut runs_b, &shared_id).await.1.chunks, b_log.chunks, "B's run of the id stays");

    runs_a.cancel_run(api::CancelRunRequest { run_id: live_id.clone() }).await.unwrap();
    let cancelled = wait_terminal(&mut runs_a, &live_id).await;
    assert_eq!(cancelled.status, api::RunStatus::Aborted as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_run_id_on_sqlite() {
    let s = TenantServer::start("runids", &["b"]).await;
    another_tenants_run_id(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_run_id_on_postgres_and_redis() {
    let (Some(admin_url), Some(redis_url)) =
        (sandhold_tests::services::postgres_url(), sandhold_tests::services::redis_url())
    else {
        return;
    };
    let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
    let s =
        TenantServer::start_on("runids-pg", &["b"], Some(scratch.url().to_owned()), Some(redis_url)).await;
    another_tenants_run_id(&s).await;
    drop(s);
    scratch.drop_database().await.unwrap();
}
