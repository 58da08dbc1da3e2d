//! One conformance suite for every store trait, instantiated for both
//! backends at the bottom. PostgreSQL cases get a fresh database each and
//! skip when the service is absent (unless SANDHOLD_REQUIRE_SERVICES=1).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sqlx::Connection;

use super::*;
use sandhold_tests::database::ScratchDatabase;

/// Generous: the box is small and shared; waits end as soon as the
/// condition holds.
const DEADLINE: Duration = Duration::from_secs(60);

pub(super) struct Backend {
    pub(super) stores: Stores,
    url: String,
    _dir: Option<tempfile::TempDir>,
    scratch: Option<ScratchDatabase>,
}

impl Backend {
    pub(super) async fn sqlite() -> Option<Backend> {
        let dir = tempfile::tempdir().unwrap();
        let url = default_database_url(&dir.path().join("data"));
        let stores = Stores::open(&url).await.unwrap();
        assert_eq!(stores.backend_name(), "sqlite");
        Some(Backend { stores, url, _dir: Some(dir), scratch: None })
    }

    pub(super) async fn postgres() -> Option<Backend> {
        let admin_url = sandhold_tests::services::postgres_url()?;
        let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
        let url = scratch.url().to_owned();
        let stores = Stores::open(&url).await.unwrap();
        assert_eq!(stores.backend_name(), "postgres");
        Some(Backend { stores, url, _dir: None, scratch: Some(scratch) })
    }

    pub(super) async fn finish(self) {
        self.stores.close().await;
        if let Some(scratch) = self.scratch {
            scratch.drop_database().await.unwrap();
        }
    }

    /// Another handle on the same database, as another replica would open.
    async fn reopen(&self) -> Stores {
        Stores::open(&self.url).await.unwrap()
    }

    /// Everything the database holds for `table`, as text: the raw file
    /// bytes for SQLite (main file and WAL), every row cast to text for
    /// PostgreSQL.
    pub(super) async fn raw_dump(&self, table: &str) -> String {
        match self.stores.backend_name() {
            "sqlite" => {
                let path = self.url.trim_start_matches("sqlite://");
                let mut bytes = std::fs::read(path).unwrap();
                bytes.extend(std::fs::read(format!("{path}-wal")).unwrap_or_default());
                String::from_utf8_lossy(&bytes).into_owned()
            }
            _ => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::query_scalar::<_, Option<String>>(&format!(
                    "SELECT string_agg(t::text, E'\\n') FROM {table} AS t"
                ))
                .fetch_one(&mut conn)
                .await
                .unwrap()
                .unwrap_or_default()
            }
        }
    }

    /// Hold the run row's write lock in another connection, as a claim in
    /// progress would, until the returned guard is dropped.
    async fn hold_run_row(&self, run: &RunId) -> RowHold {
        let sql = "UPDATE runs SET updated_at = updated_at WHERE run_id = $1";
        match self.stores.backend_name() {
            "sqlite" => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await.unwrap();
                sqlx::query(sql).bind(run.as_str()).execute(&mut conn).await.unwrap();
                RowHold::Sqlite(conn)
            }
            _ => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
                sqlx::query(sql).bind(run.as_str()).execute(&mut conn).await.unwrap();
                RowHold::Postgres(conn)
            }
        }
    }
}

/// An open write transaction; dropping the connection rolls it back.
enum RowHold {
    Sqlite(#[allow(dead_code)] sqlx::SqliteConnection),
    Postgres(#[allow(dead_code)] sqlx::PgConnection),
}

fn tenant(name: &str) -> Tenant {
    Tenant::new(name)
}

fn run_id(name: &str) -> RunId {
    RunId::parse(name).unwrap()
}

pub(super) fn new_run(id: &str, tenant_name: &str, thread: &str, started_at: i64) -> NewRun {
    NewRun {
        run_id: run_id(id),
        thread_id: thread.into(),
        tenant: tenant(tenant_name),
        sentinel_key: SentinelKey::new(format!("key-of-{id}")),
        sandbox_key: Some(format!("sbx-{id}")),
        started_at: Timestamp::from_millis(started_at),
        spec: Some(serde_json::json!({"harness": "command", "n": started_at})),
    }
}

async fn create(stores: &Stores, id: &str) -> RunRecord {
    let created = stores.runs.create_or_resume(new_run(id, "acme", "thread-1", 1_000)).await.unwrap();
    assert!(created.created);
    created.record
}

pub(super) fn chunks(prefix: &str, n: usize) -> Vec<NewChunk> {
    (0..n).map(|i| NewChunk::new(format!("{prefix}.kind"), format!("{prefix}-{i}").into_bytes())).collect()
}

fn payloads(chunks: &[StoredChunk]) -> Vec<String> {
    chunks.iter().map(|c| String::from_utf8(c.payload.clone()).unwrap()).collect()
}

async fn collect_until_end(stream: ChunkStream) -> Vec<StoredChunk> {
    tokio::time::timeout(DEADLINE, stream.map(|c| c.unwrap()).collect::<Vec<_>>())
        .await
        .expect("a read of a closed log ends")
}

fn finish_completed() -> RunFinish {
    RunFinish {
        status: RunStatus::Completed,
        error: None,
        usage: Some(serde_json::json!({"output_tokens": 7})),
        finished_at: Timestamp::from_millis(9_000),
    }
}

// ---------------------------------------------------------------- Stores

async fn stores_answer_ping(b: &Backend) {
    b.stores.ping().await.unwrap();
    // Opening again re-applies nothing and works.
    let again = b.reopen().await;
    again.ping().await.unwrap();
    again.close().await;
}

// ---------------------------------------------------------------- RunStore

async fn runs_create_or_resume_returns_existing_unchanged(b: &Backend) {
    let runs = &b.stores.runs;
    let first = runs.create_or_resume(new_run("r1", "acme", "t1", 1_000)).await.unwrap();
    assert!(first.created);
    assert_eq!(first.record.status, RunStatus::Running);
    assert_eq!(first.record.driver_epoch, FIRST_EPOCH);
    assert_eq!(first.record.tenant, tenant("acme"));
    assert_eq!(first.record.sentinel_key.expose(), "key-of-r1");
    assert_eq!(first.record.started_at, Timestamp::from_millis(1_000));
    assert!(!first.record.cancel_requested && !first.record.log_closed);

    let changed = runs
        .update(
            &run_id("r1"),
            RunUpdate { detached_since: Some(Some(Timestamp::from_millis(5))), ..Default::default() },
        )
        .await
        .unwrap();
    let mut other_args = new_run("r1", "acme", "t1", 2_000);
    other_args.sandbox_key = Some("other".into());
    let again = runs.create_or_resume(other_args).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.record, changed, "an existing record comes back unchanged");

    let foreign = runs.create_or_resume(new_run("r1", "globex", "t1", 1_000)).await;
    assert!(matches!(foreign, Err(Error::AlreadyExists(_))), "{foreign:?}");
}

async fn runs_are_tenant_scoped(b: &Backend) {
    let runs = &b.stores.runs;
    create(&b.stores, "r1").await;
    let globex = tenant("globex");
    assert!(matches!(runs.get(&globex, &run_id("r1")).await, Err(Error::NotFound(_))));
    assert!(matches!(runs.request_cancel(&globex, &run_id("r1")).await, Err(Error::NotFound(_))));
    assert_eq!(runs.active_run(&globex, "thread-1").await.unwrap(), None);
    assert!(runs.list_by_thread(&globex, "thread-1").await.unwrap().is_empty());
    assert!(!runs.get_unscoped(&run_id("r1")).await.unwrap().cancel_requested);
    assert_eq!(runs.get(&tenant("acme"), &run_id("r1")).await.unwrap().run_id, run_id("r1"));
    assert!(matches!(runs.get(&tenant("acme"), &run_id("nope")).await, Err(Error::NotFound(_))));
    assert!(matches!(runs.get_unscoped(&run_id("nope")).await, Err(Error::NotFound(_))));
}

async fn runs_update_round_trips_non_terminal_fields(b: &Backend) {
    let runs = &b.stores.runs;
    create(&b.stores, "r1").await;
    let usage = serde_json::json!({"input_tokens": 3, "model": "m"});
    let updated = runs
        .update(
            &run_id("r1"),
            RunUpdate {
                status: Some(RunStatus::Interrupted),
                sandbox_key: Some(Some("sbx-2".into())),
                detached_since: Some(Some(Timestamp::from_millis(4_242))),
                usage: Some(usage.clone()),
            },
        )
        .await
        .unwrap();
    let stored = runs.get(&tenant("acme"), &run_id("r1")).await.unwrap();
    assert_eq!(stored, updated);
    assert_eq!(stored.status, RunStatus::Interrupted);
    assert_eq!(stored.sandbox_key.as_deref(), Some("sbx-2"));
    assert_eq!(stored.detached_since, Some(Timestamp::from_millis(4_242)));
    assert_eq!(stored.usage, Some(usage.clone()));

    // None leaves fields alone; Some(None) clears them.
    let cleared = runs
        .update(
            &run_id("r1"),
            RunUpdate { detached_since: Some(None), sandbox_key: Some(None), ..Default::default() },
        )
        .await
        .unwrap();
    assert_eq!(cleared.detached_since, None);
    assert_eq!(cleared.sandbox_key, None);
    assert_eq!(cleared.usage, Some(usage));
    assert_eq!(cleared.status, RunStatus::Interrupted);

    let terminal = runs
        .update(&run_id("r1"), RunUpdate { status: Some(RunStatus::Completed), ..Default::default() })
        .await;
    assert!(matches!(terminal, Err(Error::Invalid { .. })), "{terminal:?}");
    let unknown = runs.update(&run_id("nope"), RunUpdate::default()).await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
}

async fn runs_claim_bumps_the_epoch_and_refuses_terminal_or_unknown(b: &Backend) {
    let runs = &b.stores.runs;
    create(&b.stores, "r1").await;
    assert_eq!(runs.claim(&run_id("r1")).await.unwrap().driver_epoch, FIRST_EPOCH + 1);
    assert_eq!(runs.claim(&run_id("r1")).await.unwrap().driver_epoch, FIRST_EPOCH + 2);
    assert_eq!(runs.get_unscoped(&run_id("r1")).await.unwrap().driver_epoch, FIRST_EPOCH + 2);
    assert!(matches!(runs.claim(&run_id("nope")).await, Err(Error::NotFound(_))));

    runs.finish(&run_id("r1"), FIRST_EPOCH + 2, finish_completed()).await.unwrap();
    let terminal = runs.claim(&run_id("r1")).await;
    assert!(matches!(terminal, Err(Error::RunTerminal { status: RunStatus::Completed, .. })), "{terminal:?}");
    assert_eq!(runs.get_unscoped(&run_id("r1")).await.unwrap().driver_epoch, FIRST_EPOCH + 2);
}

async fn runs_racing_claims_get_distinct_epochs_and_losers_append_nothing(b: &Backend) {
    const CLAIMERS: usize = 8;
    create(&b.stores, "r1").await;
    let claims = futures::future::join_all((0..CLAIMERS).map(|_| {
        let runs = b.stores.runs.clone();
        async move { runs.claim(&run_id("r1")).await.unwrap().driver_epoch }
    }))
    .await;
    let distinct: BTreeSet<Epoch> = claims.iter().copied().collect();
    assert_eq!(distinct.len(), CLAIMERS, "every claim gets its own epoch: {claims:?}");
    let expected: BTreeSet<Epoch> = (FIRST_EPOCH + 1..=FIRST_EPOCH + CLAIMERS as Epoch).collect();
    assert_eq!(distinct, expected);

    // Every claimer now tries to write; only the last claim may.
    let winner = *distinct.last().unwrap();
    let outcomes = futures::future::join_all(claims.iter().map(|&epoch| {
        let writer = LogWriter::new(b.stores.events.clone(), run_id("r1"), epoch);
        async move { (epoch, writer.append(&chunks(&format!("e{epoch}"), 3)).await) }
    }))
    .await;
    for (epoch, outcome) in outcomes {
        if epoch == winner {
            assert_eq!(outcome.unwrap().len(), 3);
        } else {
            assert!(
                matches!(outcome, Err(Error::Fenced { held, current, .. }) if held == epoch && current == winner),
                "epoch {epoch}"
            );
        }
    }
    let log = b.stores.events.snapshot(&run_id("r1")).await.unwrap();
    assert_eq!(log.chunks.len(), 3);
    assert!(log.chunks.iter().all(|c| c.epoch == winner));

    // Claims racing appenders: whatever interleaving, the log's epochs never
    // decrease, and a writer refused once is refused for good.
    create(&b.stores, "r2").await;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let stores = b.stores.clone();
            tokio::spawn(async move {
                let epoch = stores.runs.claim(&run_id("r2")).await.unwrap().driver_epoch;
                let writer = LogWriter::new(stores.events.clone(), run_id("r2"), epoch);
                let mut refused = false;
                for i in 0..20 {
                    match writer.append(&chunks(&format!("e{epoch}-{i}"), 2)).await {
                        Ok(_) => assert!(!refused, "an append after a refusal went through"),
                        Err(Error::Fenced { .. }) => refused = true,
                        Err(other) => panic!("{other}"),
                    }
                }
                assert_eq!(writer.is_fenced().await, refused);
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let log = b.stores.events.snapshot(&run_id("r2")).await.unwrap();
    assert!(!log.chunks.is_empty());
    assert!(log.chunks.windows(2).all(|w| w[0].epoch <= w[1].epoch), "epochs in log order never decrease");
}

async fn runs_terminal_write_from_a_stale_epoch_is_suppressed(b: &Backend) {
    let runs = &b.stores.runs;
    create(&b.stores, "r1").await;
    let successor = runs.claim(&run_id("r1")).await.unwrap().driver_epoch;
    let failed = RunFinish {
        status: RunStatus::Failed,
        error: Some(RunError { code: "CLAIM_LOST".into(), message: "old driver".into() }),
        usage: None,
        finished_at: Timestamp::from_millis(8_000),
    };
    let stale = runs.finish(&run_id("r1"), FIRST_EPOCH, failed).await;
    assert!(
        matches!(stale, Err(Error::Fenced { held: FIRST_EPOCH, current, .. }) if current == successor),
        "{stale:?}"
    );
    let record = runs.get_unscoped(&run_id("r1")).await.unwrap();
    assert_eq!(record.status, RunStatus::Running);
    assert_eq!(record.error, None);
    assert_eq!(record.finished_at, None);

    let done = runs.finish(&run_id("r1"), successor, finish_completed()).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.finished_at, Some(Timestamp::from_millis(9_000)));
    assert_eq!(done.usage, Some(serde_json::json!({"output_tokens": 7})));
    assert_eq!(runs.get_unscoped(&run_id("r1")).await.unwrap(), done);

    let twice = runs.finish(&run_id("r1"), successor, finish_completed()).await;
    assert!(matches!(twice, Err(Error::RunTerminal { .. })), "{twice:?}");
    let not_terminal = runs
        .finish(&run_id("r1"), successor, RunFinish { status: RunStatus::Running, ..finish_completed() })
        .await;
    assert!(matches!(not_terminal, Err(Error::Invalid { .. })), "{not_terminal:?}");
    let revive = runs
        .update(&run_id("r1"), RunUpdate { status: Some(RunStatus::Running), ..Default::default() })
        .await;
    assert!(matches!(revive, Err(Error::RunTerminal { .. })), "{revive:?}");
    // Non-terminal fields of a terminal run may still change (the reaper
    // clears the sandbox key after reclaiming it).
    let reclaimed =
        runs.update(&run_id("r1"), RunUpdate { sandbox_key: Some(None), ..Default::default() }).await;
    assert_eq!(reclaimed.unwrap().status, RunStatus::Completed);
    assert!(matches!(runs.finish(&run_id("nope"), 1, finish_completed()).await, Err(Error::NotFound(_))));
}

async fn runs_request_cancel_records_intent_only(b: &Backend) {
    let runs = &b.stores.runs;
    let created = create(&b.stores, "r1").await;
    let cancelled = runs.request_cancel(&tenant("acme"), &run_id("r1")).await.unwrap();
    assert!(cancelled.cancel_requested);
    assert_eq!(cancelled.status, RunStatus::Running);
    assert_eq!(cancelled.driver_epoch, created.driver_epoch);
    assert!(runs.get_unscoped(&run_id("r1")).await.unwrap().cancel_requested);

    create(&b.stores, "r2").await;
    let done = runs.finish(&run_id("r2"), FIRST_EPOCH, finish_completed()).await.unwrap();
    let after = runs.request_cancel(&tenant("acme"), &run_id("r2")).await.unwrap();
    assert_eq!(after, done, "a terminal run is returned unchanged");
}

async fn runs_active_run_and_list_by_thread(b: &Backend) {
    let runs = &b.stores.runs;
    for (id, started) in [("a", 1_000), ("b", 2_000), ("c", 3_000), ("d", 4_000)] {
        runs.create_or_resume(new_run(id, "acme", "t1", started)).await.unwrap();
    }
    runs.create_or_resume(new_run("other-thread", "acme", "t2", 5_000)).await.unwrap();
    runs.finish(&run_id("d"), FIRST_EPOCH, finish_completed()).await.unwrap();
    runs.finish(&run_id("a"), FIRST_EPOCH, finish_completed()).await.unwrap();

    let active = runs.active_run(&tenant("acme"), "t1").await.unwrap().unwrap();
    assert_eq!(active.run_id, run_id("c"), "the newest non-terminal run");
    let listed: Vec<String> = runs
        .list_by_thread(&tenant("acme"), "t1")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id.to_string())
        .collect();
    assert_eq!(listed, ["a", "b", "c", "d"]);
    let recent: Vec<String> = runs
        .list_recent(&tenant("acme"), 3)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id.to_string())
        .collect();
    assert_eq!(recent, ["other-thread", "d", "c"], "newest first, every thread, limited");
    assert!(runs.list_recent(&tenant("globex"), 10).await.unwrap().is_empty(), "another tenant's runs");
    let d = runs.get(&tenant("acme"), &run_id("d")).await.unwrap();
    assert_eq!(d.spec, Some(serde_json::json!({"harness": "command", "n": 4_000})), "the spec round-trips");

    runs.finish(&run_id("c"), FIRST_EPOCH, finish_completed()).await.unwrap();
    runs.finish(&run_id("b"), FIRST_EPOCH, finish_completed()).await.unwrap();
    assert_eq!(runs.active_run(&tenant("acme"), "t1").await.unwrap(), None);
    assert_eq!(runs.active_run(&tenant("acme"), "t2").await.unwrap().unwrap().run_id, run_id("other-thread"));
}

async fn runs_reclaimable_cutoff_is_inclusive(b: &Backend) {
    let runs = &b.stores.runs;
    let cutoff = 100_000;
    let detach = |id: &'static str, at: i64| {
        let runs = runs.clone();
        async move {
            runs.update(
                &run_id(id),
                RunUpdate { detached_since: Some(Some(Timestamp::from_millis(at))), ..Default::default() },
            )
            .await
            .unwrap();
        }
    };
    for id in ["before", "at", "after", "attached", "finished", "interrupted", "globex"] {
        let owner = if id == "globex" { "globex" } else { "acme" };
        runs.create_or_resume(new_run(id, owner, "t", 1)).await.unwrap();
    }
    detach("before", cutoff - 10).await;
    detach("at", cutoff).await;
    detach("after", cutoff + 1).await;
    detach("finished", cutoff - 20).await;
    detach("interrupted", cutoff - 20).await;
    detach("globex", cutoff - 5).await;
    runs.finish(&run_id("finished"), FIRST_EPOCH, finish_completed()).await.unwrap();
    runs.update(
        &run_id("interrupted"),
        RunUpdate { status: Some(RunStatus::Interrupted), ..Default::default() },
    )
    .await
    .unwrap();

    let reclaimable: Vec<String> = runs
        .list_reclaimable(Timestamp::from_millis(cutoff))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id.to_string())
        .collect();
    assert_eq!(
        reclaimable,
        ["before", "globex", "at"],
        "running, detached at or before the cutoff, oldest first"
    );

    let undetached: Vec<String> =
        runs.list_undetached_running(10).await.unwrap().into_iter().map(|r| r.run_id.to_string()).collect();
    assert_eq!(undetached, ["attached"], "running and not detached, any tenant");
    runs.create_or_resume(new_run("attached-too", "globex", "t", 0)).await.unwrap();
    let first: Vec<String> =
        runs.list_undetached_running(1).await.unwrap().into_iter().map(|r| r.run_id.to_string()).collect();
    assert_eq!(first, ["attached-too"], "oldest start first, at most the limit");
}

async fn runs_unfinished_in_sandbox_across_tenants(b: &Backend) {
    let runs = &b.stores.runs;
    let in_box = |id: &str, owner: &str, key: &str, at: i64| {
        let mut new = new_run(id, owner, "t", at);
        new.sandbox_key = Some(key.to_string());
        new
    };
    runs.create_or_resume(in_box("first", "acme", "box", 1)).await.unwrap();
    runs.create_or_resume(in_box("second", "globex", "box", 2)).await.unwrap();
    runs.create_or_resume(in_box("done", "acme", "box", 3)).await.unwrap();
    runs.create_or_resume(in_box("elsewhere", "acme", "other-box", 4)).await.unwrap();
    runs.finish(&run_id("done"), FIRST_EPOCH, finish_completed()).await.unwrap();
    let ids = |records: Vec<RunRecord>| records.into_iter().map(|r| r.run_id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(runs.unfinished_in_sandbox("box").await.unwrap()), ["first", "second"]);
    assert!(runs.unfinished_in_sandbox("no-such-box").await.unwrap().is_empty());
}

// ---------------------------------------------------------------- EventLog

async fn log_append_mints_ordered_offsets_and_snapshot_returns_them(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let writer = LogWriter::new(b.stores.events.clone(), run_id("r1"), record.driver_epoch);
    let mut all_offsets = Vec::new();
    let mut expected = Vec::new();
    for (batch, size) in [("one", 1), ("sixteen", 16), ("big", 256), ("huge", 1_200)] {
        let batch_chunks = chunks(batch, size);
        let offsets = writer.append(&batch_chunks).await.unwrap();
        assert_eq!(offsets.len(), size);
        all_offsets.extend(offsets);
        expected.extend(batch_chunks.iter().map(|c| String::from_utf8(c.payload.clone()).unwrap()));
    }
    assert!(writer.append(&[]).await.unwrap().is_empty());
    let distinct: BTreeSet<&Offset> = all_offsets.iter().collect();
    assert_eq!(distinct.len(), all_offsets.len());

    let log = b.stores.events.snapshot(&run_id("r1")).await.unwrap();
    assert!(!log.closed);
    assert_eq!(payloads(&log.chunks), expected, "order preserved within and across batches");
    assert_eq!(log.chunks.iter().map(|c| c.offset.clone()).collect::<Vec<_>>(), all_offsets);
    assert!(log.chunks.iter().all(|c| c.epoch == record.driver_epoch));
    assert_eq!(log.chunks[1].kind, "sixteen.kind");
    // Offsets survive the trip to a client and back.
    for offset in &all_offsets {
        assert_eq!(&Offset::parse(&offset.to_string()).unwrap(), offset);
    }
}

async fn log_read_from_first_and_middle_offsets(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let events = &b.stores.events;
    let offsets = events.append(&run_id("r1"), record.driver_epoch, &chunks("c", 10)).await.unwrap();
    events.close(&run_id("r1")).await.unwrap();
    events.close(&run_id("r1")).await.unwrap();

    let first = Offset::parse(FIRST_OFFSET).unwrap();
    assert_eq!(first, Offset::start());
    let whole = collect_until_end(events.read(&run_id("r1"), &first).await.unwrap()).await;
    assert_eq!(payloads(&whole), (0..10).map(|i| format!("c-{i}")).collect::<Vec<_>>());

    let middle = Offset::parse(&offsets[4].to_string()).unwrap();
    let rest = collect_until_end(events.read(&run_id("r1"), &middle).await.unwrap()).await;
    assert_eq!(payloads(&rest), (5..10).map(|i| format!("c-{i}")).collect::<Vec<_>>());
    assert_eq!(rest[0].offset, offsets[5]);

    let at_end = collect_until_end(events.read(&run_id("r1"), &offsets[9]).await.unwrap()).await;
    assert!(at_end.is_empty());

    assert!(matches!(events.read(&run_id("nope"), &first).await, Err(Error::NotFound(_))));
    assert!(matches!(events.snapshot(&run_id("nope")).await, Err(Error::NotFound(_))));
    assert!(matches!(events.close(&run_id("nope")).await, Err(Error::NotFound(_))));
    for bad in ["", "-1", "abc", "1.5", "99999999999999999999"] {
        assert!(matches!(Offset::parse(bad), Err(Error::Invalid { .. })), "{bad:?}");
    }
}

async fn log_stale_append_is_refused_after_a_claim_and_stays_refused(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let events = &b.stores.events;
    let old = LogWriter::new(events.clone(), run_id("r1"), record.driver_epoch);
    old.append(&chunks("old", 2)).await.unwrap();
    assert!(!old.is_fenced().await);

    let successor = b.stores.runs.claim(&run_id("r1")).await.unwrap().driver_epoch;
    let refused = old.append(&chunks("stale", 2)).await;
    assert!(
        matches!(refused, Err(Error::Fenced { held, current, .. }) if held == FIRST_EPOCH && current == successor)
    );
    assert!(old.is_fenced().await);
    // The store refuses that epoch by itself too, not only the latch.
    let direct = events.append(&run_id("r1"), FIRST_EPOCH, &chunks("direct", 1)).await;
    assert!(matches!(direct, Err(Error::Fenced { .. })), "{direct:?}");

    let new = LogWriter::new(events.clone(), run_id("r1"), successor);
    new.append(&chunks("new", 2)).await.unwrap();
    let still = old.append(&chunks("stale-again", 1)).await;
    assert!(matches!(still, Err(Error::Fenced { .. })), "{still:?}");

    let log = events.snapshot(&run_id("r1")).await.unwrap();
    assert_eq!(payloads(&log.chunks), ["old-0", "old-1", "new-0", "new-1"]);
    assert_eq!(
        log.chunks.iter().map(|c| c.epoch).collect::<Vec<_>>(),
        [FIRST_EPOCH, FIRST_EPOCH, successor, successor]
    );

    events.close(&run_id("r1")).await.unwrap();
    let closed = new.append(&chunks("late", 1)).await;
    assert!(matches!(closed, Err(Error::LogClosed(_))), "{closed:?}");
    assert!(!new.is_fenced().await, "a closed log is not a lost claim");
    let unknown = events.append(&run_id("nope"), 1, &chunks("x", 1)).await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
}

async fn log_snapshot_never_blocks(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let events = &b.stores.events;
    events.append(&run_id("r1"), record.driver_epoch, &chunks("c", 3)).await.unwrap();
    // A live tailer, an open log, and a claim holding the run row's write
    // lock in another connection: a snapshot still answers at once.
    let tail = events.read(&run_id("r1"), &Offset::start()).await.unwrap();
    let hold = b.hold_run_row(&run_id("r1")).await;
    let log = tokio::time::timeout(DEADLINE, events.snapshot(&run_id("r1")))
        .await
        .expect("snapshot does not wait")
        .unwrap();
    drop(hold);
    assert!(!log.closed);
    assert_eq!(payloads(&log.chunks), ["c-0", "c-1", "c-2"]);
    drop(tail);

    create(&b.stores, "empty").await;
    let empty = tokio::time::timeout(DEADLINE, events.snapshot(&run_id("empty"))).await.unwrap().unwrap();
    assert!(empty.chunks.is_empty() && !empty.closed);
}

/// Read `stream` until `want` chunks arrived or it ends.
async fn take(stream: &mut ChunkStream, want: usize) -> Vec<StoredChunk> {
    let mut got = Vec::new();
    while got.len() < want {
        match tokio::time::timeout(DEADLINE, stream.next()).await.expect("tailer sees the append") {
            Some(chunk) => got.push(chunk.unwrap()),
            None => break,
        }
    }
    got
}

async fn log_tail_sees_later_appends_and_ends_at_close(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let events = &b.stores.events;
    let writer = LogWriter::new(events.clone(), run_id("r1"), record.driver_epoch);
    writer.append(&chunks("before", 2)).await.unwrap();

    let mut tail = events.read(&run_id("r1"), &Offset::start()).await.unwrap();
    assert_eq!(payloads(&take(&mut tail, 2).await), ["before-0", "before-1"]);
    writer.append(&chunks("later", 3)).await.unwrap();
    assert_eq!(payloads(&take(&mut tail, 3).await), ["later-0", "later-1", "later-2"]);
    writer.append(&chunks("last", 1)).await.unwrap();
    events.close(&run_id("r1")).await.unwrap();
    assert_eq!(payloads(&collect_until_end(tail).await), ["last-0"], "then the stream ends");
}

async fn log_tail_sees_appends_through_another_store_instance(b: &Backend) {
    // Another replica: its own pool and (PostgreSQL) its own listener.
    let replica = b.reopen().await;
    let record = create(&b.stores, "r1").await;
    let mut tail = replica.events.read(&run_id("r1"), &Offset::start()).await.unwrap();
    let writer = LogWriter::new(b.stores.events.clone(), run_id("r1"), record.driver_epoch);
    for round in 0..3 {
        writer.append(&chunks(&format!("round{round}"), 2)).await.unwrap();
        let got = take(&mut tail, 2).await;
        assert_eq!(payloads(&got), [format!("round{round}-0"), format!("round{round}-1")]);
    }
    b.stores.events.close(&run_id("r1")).await.unwrap();
    assert!(collect_until_end(tail).await.is_empty());
    replica.close().await;
}

// ---------------------------------------------------------------- InstanceStore

async fn instances_put_get_list_and_delete(b: &Backend) {
    let instances = &b.stores.instances;
    let new = |key: &str, owner: &str, id: &str| NewInstance {
        sandbox_key: key.into(),
        tenant: tenant(owner),
        provider: "docker".into(),
        provider_sandbox_id: id.into(),
        native_snapshot: None,
        definition_id: format!("def-{id}"),
        thread_id: format!("thread-{id}"),
    };
    let first = instances.put(new("k1", "acme", "c-1")).await.unwrap();
    assert_eq!(instances.get("k1").await.unwrap(), first);
    assert_eq!(first.provider_sandbox_id, "c-1");
    assert_eq!((first.definition_id.as_str(), first.thread_id.as_str()), ("def-c-1", "thread-c-1"));
    instances.put(new("k2", "globex", "c-2")).await.unwrap();
    instances.put(new("k0", "acme", "c-0")).await.unwrap();

    let replaced = instances.put(new("k1", "acme", "c-1b")).await.unwrap();
    assert_eq!(replaced.created_at, first.created_at, "created_at survives a replace");
    assert_eq!(replaced.provider_sandbox_id, "c-1b");
    assert_eq!(replaced.thread_id, "thread-c-1b", "a replace updates the thread too");
    let snap = instances.set_native_snapshot("k1", Some("image:abc".into())).await.unwrap();
    assert_eq!(snap.native_snapshot.as_deref(), Some("image:abc"));
    assert_eq!(instances.get("k1").await.unwrap().native_snapshot.as_deref(), Some("image:abc"));

    let keys = |list: Vec<Instance>| list.into_iter().map(|i| i.sandbox_key).collect::<Vec<_>>();
    assert_eq!(keys(instances.list(Some(&tenant("acme"))).await.unwrap()), ["k0", "k1"]);
    assert_eq!(keys(instances.list(None).await.unwrap()), ["k0", "k1", "k2"]);

    assert!(instances.delete("k1").await.unwrap());
    assert!(!instances.delete("k1").await.unwrap());
    assert!(matches!(instances.get("k1").await, Err(Error::NotFound(_))));
    assert!(matches!(instances.set_native_snapshot("k1", None).await, Err(Error::NotFound(_))));
}

// ---------------------------------------------------------------- DefinitionStore

async fn definitions_round_trip_per_tenant(b: &Backend) {
    let definitions = &b.stores.definitions;
    let body = serde_json::json!({"image": "rust:1", "setup": [{"run": "cargo build"}], "env": {"A": "1"}});
    let stored = definitions.put(&tenant("acme"), "web", body.clone()).await.unwrap();
    assert_eq!(stored.body, body);
    assert_eq!(definitions.get(&tenant("acme"), "web").await.unwrap(), stored);
    assert!(matches!(definitions.get(&tenant("globex"), "web").await, Err(Error::NotFound(_))));
    assert!(definitions.list(&tenant("globex")).await.unwrap().is_empty());

    let body2 = serde_json::json!({"image": "rust:2"});
    let replaced = definitions.put(&tenant("acme"), "web", body2.clone()).await.unwrap();
    assert_eq!(replaced.body, body2);
    assert_eq!(replaced.created_at, stored.created_at);
    definitions.put(&tenant("acme"), "api", serde_json::json!({})).await.unwrap();
    definitions.put(&tenant("globex"), "web", serde_json::json!({"theirs": true})).await.unwrap();
    let ids: Vec<String> =
        definitions.list(&tenant("acme")).await.unwrap().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, ["api", "web"]);

    assert!(!definitions.delete(&tenant("globex"), "api").await.unwrap());
    assert!(definitions.delete(&tenant("acme"), "web").await.unwrap());
    assert!(matches!(definitions.get(&tenant("acme"), "web").await, Err(Error::NotFound(_))));
    assert_eq!(definitions.get(&tenant("globex"), "web").await.unwrap().body["theirs"], true);
}

// ---------------------------------------------------------------- TokenStore

async fn tokens_map_to_tenants_and_are_stored_hashed(b: &Backend) {
    let tokens = &b.stores.tokens;
    let raw = "sh_live_7f3c9a1e5b2d4c6f8a0b";
    tokens.put_token(&tenant("acme"), raw).await.unwrap();
    tokens.put_token(&tenant("acme"), raw).await.unwrap();
    tokens.put_token(&tenant("acme"), "second-token").await.unwrap();
    tokens.put_token(&tenant("globex"), "globex-token").await.unwrap();
    assert_eq!(tokens.tenant_for_token(raw).await.unwrap(), Some(tenant("acme")));
    assert_eq!(tokens.tenant_for_token("globex-token").await.unwrap(), Some(tenant("globex")));
    assert_eq!(tokens.tenant_for_token("sh_live_7f3c9a1e5b2d4c6f8a0").await.unwrap(), None);
    assert_eq!(tokens.list_tenants().await.unwrap(), [tenant("acme"), tenant("globex")]);
    let taken = tokens.put_token(&tenant("globex"), raw).await;
    assert!(matches!(taken, Err(Error::AlreadyExists(_))), "{taken:?}");
    assert!(matches!(tokens.put_token(&tenant("acme"), "").await, Err(Error::Invalid { .. })));

    let dump = b.raw_dump("api_tokens").await;
    assert!(dump.contains(&token_hash(raw)), "the hash is what is stored");
    assert!(!dump.contains(raw), "the raw token must not be stored");
    assert!(!dump.contains("globex-token"));

    assert!(tokens.delete_token("globex-token").await.unwrap());
    assert!(!tokens.delete_token("globex-token").await.unwrap());
    assert_eq!(tokens.tenant_for_token("globex-token").await.unwrap(), None);
    assert_eq!(tokens.list_tenants().await.unwrap(), [tenant("acme")]);
}

// ---------------------------------------------------------------- instantiation

macro_rules! instantiate {
    ($backend:ident: $($case:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(backend) = super::Backend::$backend().await else { return };
                    super::$case(&backend).await;
                    backend.finish().await;
                }
            )*
        }
    };
}

macro_rules! conformance_suite {
    ($($case:ident),* $(,)?) => {
        instantiate!(sqlite: $($case),*);
        instantiate!(postgres: $($case),*);
    };
}

conformance_suite!(
    stores_answer_ping,
    runs_create_or_resume_returns_existing_unchanged,
    runs_are_tenant_scoped,
    runs_update_round_trips_non_terminal_fields,
    runs_claim_bumps_the_epoch_and_refuses_terminal_or_unknown,
    runs_racing_claims_get_distinct_epochs_and_losers_append_nothing,
    runs_terminal_write_from_a_stale_epoch_is_suppressed,
    runs_request_cancel_records_intent_only,
    runs_active_run_and_list_by_thread,
    runs_reclaimable_cutoff_is_inclusive,
    runs_unfinished_in_sandbox_across_tenants,
    log_append_mints_ordered_offsets_and_snapshot_returns_them,
    log_read_from_first_and_middle_offsets,
    log_stale_append_is_refused_after_a_claim_and_stays_refused,
    log_snapshot_never_blocks,
    log_tail_sees_later_appends_and_ends_at_close,
    log_tail_sees_appends_through_another_store_instance,
    instances_put_get_list_and_delete,
    definitions_round_trip_per_tenant,
    tokens_map_to_tenants_and_are_stored_hashed,
);

#[test]
fn store_errors_map_to_shared_codes() {
    use shared::error::ErrorCode;
    let cases = [
        (Error::NotFound("run x".into()), ErrorCode::NotFound),
        (Error::AlreadyExists("run x".into()), ErrorCode::AlreadyExists),
        (Error::Fenced { run: "x".into(), held: 1, current: 2 }, ErrorCode::ClaimLost),
        (Error::RunTerminal { run: "x".into(), status: RunStatus::Failed }, ErrorCode::RunTerminal),
        (Error::LogClosed("x".into()), ErrorCode::FailedPrecondition),
        (Error::invalid("offset", "bad"), ErrorCode::InvalidArgument),
        (Error::Unavailable("down".into()), ErrorCode::Unavailable),
        (Error::Corrupt("x".into()), ErrorCode::Internal),
    ];
    for (err, code) in cases {
        let api: shared::error::Error = err.into();
        assert_eq!(api.code, code);
    }
    let fenced: shared::error::Error = Error::Fenced { run: "x".into(), held: 1, current: 2 }.into();
    assert_eq!(fenced.metadata.get("current_epoch").map(String::as_str), Some("2"));
    let internal: shared::error::Error = Error::Corrupt("secret detail".into()).into();
    assert!(!internal.message.contains("secret detail"));
}

#[test]
fn timestamps_round_trip_through_system_time() {
    for millis in [0, 1, 1_700_000_000_123, -5] {
        let t = Timestamp::from_millis(millis);
        assert_eq!(Timestamp::from(t.to_system_time()), t);
    }
}

#[test]
fn sentinel_keys_do_not_print() {
    let record_key = SentinelKey::new("very-secret");
    assert_eq!(format!("{record_key:?}"), "[redacted]");
    let _ = Arc::new(record_key);
}
