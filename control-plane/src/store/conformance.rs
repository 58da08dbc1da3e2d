//! One conformance suite for every store trait, instantiated for both
//! backends at the bottom. PostgreSQL cases get a fresh database each and
//! skip when the service is absent (unless SANDHOLD_REQUIRE_SERVICES=1).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
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
    /// Run `sql` with `$1` the run's tenant and `$2` its id, on a
    /// connection of its own (what no store call does: a test's setup).
    async fn execute_on_run(&self, sql: &str, run: &RunKey) {
        let (tenant, id) = (run.tenant.as_str(), run.run.as_str());
        match self.stores.backend_name() {
            "sqlite" => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                sqlx::query(sql).bind(tenant).bind(id).execute(&mut conn).await.unwrap();
            }
            _ => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::query(sql).bind(tenant).bind(id).execute(&mut conn).await.unwrap();
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

fn key(tenant_name: &str, id: &str) -> RunKey {
    RunKey::new(tenant(tenant_name), run_id(id))
}

/// A run of `acme`, the tenant [`create`] makes runs for.
fn acme(id: &str) -> RunKey {
    key("acme", id)
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
        definition_id: None,
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
    chunks.iter().map(|c| String::from_utf8(c.payload.to_vec()).unwrap()).collect()
}

async fn collect_until_end(stream: ChunkStream) -> Vec<StoredChunk> {
    tokio::time::timeout(DEADLINE, stream.map(|c| c.unwrap()).collect::<Vec<_>>())
        .await
        .expect("a read of a closed log ends")
}

fn finish_completed() -> RunFinish {
    RunFinish {
        session_id: Some("session-7".into()),
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
            &acme("r1"),
            RunUpdate { detached_since: Some(Some(Timestamp::from_millis(5))), ..Default::default() },
        )
        .await
        .unwrap();
    let mut other_args = new_run("r1", "acme", "t1", 2_000);
    other_args.sandbox_key = Some("other".into());
    let again = runs.create_or_resume(other_args).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.record, changed, "an existing record comes back unchanged");

    // Run ids are per tenant: another tenant's `r1` is a run of its own.
    let foreign = runs.create_or_resume(new_run("r1", "globex", "t1", 3_000)).await.unwrap();
    assert!(foreign.created, "{foreign:?}");
    assert_eq!(foreign.record.tenant, tenant("globex"));
    assert_eq!(runs.get(&acme("r1")).await.unwrap(), changed);
}

async fn runs_create_within_counts_the_tenants_unfinished_runs(b: &Backend) {
    let runs = &b.stores.runs;
    let admit = |id: &str, owner: &str| runs.create_within(new_run(id, owner, "t", 1), Some(2));
    for id in ["q1", "q2"] {
        assert!(matches!(admit(id, "acme").await.unwrap(), Admitted::Run(CreatedRun { created: true, .. })));
    }
    assert_eq!(admit("q3", "acme").await.unwrap(), Admitted::Full { unfinished: 2 });
    assert!(matches!(runs.get(&acme("q3")).await, Err(Error::NotFound(_))), "nothing written");
    // An existing run comes back as it is, full or not; another tenant has its own count.
    assert!(matches!(admit("q2", "acme").await.unwrap(), Admitted::Run(CreatedRun { created: false, .. })));
    assert!(matches!(admit("q4", "globex").await.unwrap(), Admitted::Run(CreatedRun { created: true, .. })));
    // A run that ends frees its slot; no limit admits any number.
    let finish = RunFinish {
        session_id: None,
        status: RunStatus::Completed,
        error: None,
        usage: None,
        finished_at: Timestamp::from_millis(2),
    };
    runs.finish(&acme("q1"), FIRST_EPOCH, finish).await.unwrap();
    assert!(matches!(admit("q3", "acme").await.unwrap(), Admitted::Run(CreatedRun { created: true, .. })));
    let unlimited = runs.create_within(new_run("q5", "acme", "t", 1), None).await.unwrap();
    assert!(matches!(unlimited, Admitted::Run(CreatedRun { created: true, .. })));

    // Racing for the last slot through two store handles (two replicas): one wins.
    let other = b.reopen().await;
    let (x, y) = tokio::join!(
        runs.create_within(new_run("race-a", "initech", "t", 1), Some(1)),
        other.runs.create_within(new_run("race-b", "initech", "t", 1), Some(1)),
    );
    let won = [x.unwrap(), y.unwrap()].iter().filter(|a| matches!(a, Admitted::Run(_))).count();
    assert_eq!(won, 1, "exactly one start takes the last slot");
    other.close().await;
}

async fn runs_are_tenant_scoped(b: &Backend) {
    let runs = &b.stores.runs;
    let events = &b.stores.events;
    create(&b.stores, "r1").await;
    let globex = tenant("globex");
    let theirs = key("globex", "r1");
    let unknown = key("globex", "nope");
    // Another tenant's id answers exactly what an unknown id answers.
    for run in [&theirs, &unknown] {
        let not_found = format!("run {}", run.run);
        let expect = |e: Error| assert!(matches!(&e, Error::NotFound(m) if *m == not_found), "{e:?}");
        expect(runs.get(run).await.unwrap_err());
        expect(runs.request_cancel(run).await.unwrap_err());
        expect(runs.claim(run).await.unwrap_err());
        expect(runs.update(run, RunUpdate::default()).await.unwrap_err());
        expect(runs.finish(run, FIRST_EPOCH, finish_completed()).await.unwrap_err());
        expect(events.append(run, FIRST_EPOCH, &chunks("x", 1)).await.unwrap_err());
        expect(events.snapshot(run).await.err().unwrap());
        expect(events.read(run, &Offset::start()).await.err().unwrap());
        expect(events.close(run).await.unwrap_err());
    }
    assert_eq!(runs.active_run(&globex, "thread-1").await.unwrap(), None);
    assert!(runs.list_by_thread(&globex, "thread-1").await.unwrap().is_empty());
    assert!(runs.list_recent(&globex, 10).await.unwrap().is_empty());
    let record = runs.get(&acme("r1")).await.unwrap();
    assert!(!record.cancel_requested && !record.log_closed);
    assert_eq!(record.driver_epoch, FIRST_EPOCH);
    assert!(events.snapshot(&acme("r1")).await.unwrap().chunks.is_empty());
}

/// Run ids are a namespace per tenant: two tenants' runs of one id are two
/// records and two logs, and nothing done to one reaches the other.
async fn runs_and_logs_of_one_id_are_per_tenant(b: &Backend) {
    let (runs, events) = (&b.stores.runs, &b.stores.events);
    let (a, g) = (acme("same"), key("globex", "same"));
    let mut globex_run = new_run("same", "globex", "thread-g", 2_000);
    globex_run.sentinel_key = SentinelKey::new("globex-key");
    assert!(runs.create_or_resume(new_run("same", "acme", "thread-a", 1_000)).await.unwrap().created);
    assert!(runs.create_or_resume(globex_run).await.unwrap().created);
    // Within a tenant the id is still taken.
    assert!(!runs.create_or_resume(new_run("same", "acme", "thread-x", 5_000)).await.unwrap().created);

    events.append(&a, FIRST_EPOCH, &chunks("acme", 3)).await.unwrap();
    let offsets = events.append(&g, FIRST_EPOCH, &chunks("globex", 2)).await.unwrap();
    assert_eq!(offsets.len(), 2);
    assert_eq!(offsets[0].to_string(), "1", "each log mints its own offsets");

    // Claims, updates, cancels and the terminal write are per tenant.
    assert_eq!(runs.claim(&g).await.unwrap().driver_epoch, FIRST_EPOCH + 1);
    let detached = RunUpdate { detached_since: Some(Some(Timestamp::from_millis(7))), ..Default::default() };
    runs.update(&g, detached).await.unwrap();
    runs.request_cancel(&g).await.unwrap();
    let stale = events.append(&g, FIRST_EPOCH, &chunks("stale", 1)).await;
    assert!(matches!(stale, Err(Error::Fenced { .. })), "{stale:?}");
    // acme's run, still at FIRST_EPOCH, is not fenced by globex's claim.
    events.append(&a, FIRST_EPOCH, &chunks("acme-more", 1)).await.unwrap();
    runs.finish(&g, FIRST_EPOCH + 1, finish_completed()).await.unwrap();
    events.close(&g).await.unwrap();

    let acme_record = runs.get(&a).await.unwrap();
    assert_eq!(acme_record.tenant, tenant("acme"));
    assert_eq!(acme_record.thread_id, "thread-a");
    assert_eq!(acme_record.status, RunStatus::Running);
    assert_eq!(acme_record.driver_epoch, FIRST_EPOCH);
    assert!(!acme_record.cancel_requested && !acme_record.log_closed);
    assert_eq!(acme_record.detached_since, None);
    assert_eq!(acme_record.sentinel_key.expose(), "key-of-same");
    let globex_record = runs.get(&g).await.unwrap();
    assert_eq!(globex_record.status, RunStatus::Completed);
    assert_eq!(globex_record.sentinel_key.expose(), "globex-key");
    assert!(globex_record.cancel_requested && globex_record.log_closed);

    let acme_log = events.snapshot(&a).await.unwrap();
    assert_eq!(payloads(&acme_log.chunks), ["acme-0", "acme-1", "acme-2", "acme-more-0"]);
    assert!(!acme_log.closed);
    let globex_log = collect_until_end(events.read(&g, &Offset::start()).await.unwrap()).await;
    assert_eq!(payloads(&globex_log), ["globex-0", "globex-1"]);

    // A tail of acme's log is not ended by globex's close and sees acme's appends.
    let mut tail = events.read(&a, &acme_log.chunks[3].offset).await.unwrap();
    events.append(&a, FIRST_EPOCH, &chunks("later", 1)).await.unwrap();
    assert_eq!(payloads(&take(&mut tail, 1).await), ["later-0"]);
    events.close(&a).await.unwrap();
    assert!(tokio::time::timeout(DEADLINE, tail.next()).await.unwrap().is_none());

    // Listings show each tenant its own.
    let threads = |records: Vec<RunRecord>| records.into_iter().map(|r| r.thread_id).collect::<Vec<_>>();
    assert_eq!(threads(runs.list_recent(&tenant("acme"), 10).await.unwrap()), ["thread-a"]);
    assert_eq!(threads(runs.list_recent(&tenant("globex"), 10).await.unwrap()), ["thread-g"]);
}

async fn runs_update_round_trips_non_terminal_fields(b: &Backend) {
    let runs = &b.stores.runs;
    create(&b.stores, "r1").await;
    let usage = serde_json::json!({"input_tokens": 3, "model": "m"});
    let updated = runs
        .update(
            &acme("r1"),
            RunUpdate {
                status: Some(RunStatus::Interrupted),
                sandbox_key: Some(Some("sbx-2".into())),
                detached_since: Some(Some(Timestamp::from_millis(4_242))),
                usage: Some(usage.clone()),
            },
        )
        .await
        .unwrap();
    let stored = runs.get(&acme("r1")).await.unwrap();
    assert_eq!(stored, updated);
    assert_eq!(stored.status, RunStatus::Interrupted);
    assert_eq!(stored.sandbox_key.as_deref(), Some("sbx-2"));
    assert_eq!(stored.detached_since, Some(Timestamp::from_millis(4_242)));
    assert_eq!(stored.usage, Some(usage.clone()));

    // None leaves fields alone; Some(None) clears them.
    let cleared = runs
        .update(
            &acme("r1"),
            RunUpdate { detached_since: Some(None), sandbox_key: Some(None), ..Default::default() },
        )
        .await
        .unwrap();
    assert_eq!(cleared.detached_since, None);
    assert_eq!(cleared.sandbox_key, None);
    assert_eq!(cleared.usage, Some(usage));
    assert_eq!(cleared.status, RunStatus::Interrupted);

    let terminal = runs
        .update(&acme("r1"), RunUpdate { status: Some(RunStatus::Completed), ..Default::default() })
        .await;
    assert!(matches!(terminal, Err(Error::Invalid { .. })), "{terminal:?}");
    let unknown = runs.update(&acme("nope"), RunUpdate::default()).await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
}

async fn runs_claim_bumps_the_epoch_and_refuses_terminal_or_unknown(b: &Backend) {
    let runs = &b.stores.runs;
    create(&b.stores, "r1").await;
    assert_eq!(runs.claim(&acme("r1")).await.unwrap().driver_epoch, FIRST_EPOCH + 1);
    assert_eq!(runs.claim(&acme("r1")).await.unwrap().driver_epoch, FIRST_EPOCH + 2);
    assert_eq!(runs.get(&acme("r1")).await.unwrap().driver_epoch, FIRST_EPOCH + 2);
    assert!(matches!(runs.claim(&acme("nope")).await, Err(Error::NotFound(_))));

    runs.finish(&acme("r1"), FIRST_EPOCH + 2, finish_completed()).await.unwrap();
    let terminal = runs.claim(&acme("r1")).await;
    assert!(matches!(terminal, Err(Error::RunTerminal { status: RunStatus::Completed, .. })), "{terminal:?}");
    assert_eq!(runs.get(&acme("r1")).await.unwrap().driver_epoch, FIRST_EPOCH + 2);

    // A detached mark that lost the race with the run's end does not land.
    let late = RunUpdate { detached_since: Some(Some(Timestamp::from_millis(9))), ..Default::default() };
    let late = runs.update(&acme("r1"), late).await;
    assert!(matches!(late, Err(Error::RunTerminal { .. })), "{late:?}");
    assert_eq!(runs.get(&acme("r1")).await.unwrap().detached_since, None);
}

async fn runs_racing_claims_get_distinct_epochs_and_losers_append_nothing(b: &Backend) {
    const CLAIMERS: usize = 8;
    create(&b.stores, "r1").await;
    let claims = futures::future::join_all((0..CLAIMERS).map(|_| {
        let runs = b.stores.runs.clone();
        async move { runs.claim(&acme("r1")).await.unwrap().driver_epoch }
    }))
    .await;
    let distinct: BTreeSet<Epoch> = claims.iter().copied().collect();
    assert_eq!(distinct.len(), CLAIMERS, "every claim gets its own epoch: {claims:?}");
    let expected: BTreeSet<Epoch> = (FIRST_EPOCH + 1..=FIRST_EPOCH + CLAIMERS as Epoch).collect();
    assert_eq!(distinct, expected);

    // Every claimer now tries to write; only the last claim may.
    let winner = *distinct.last().unwrap();
    let outcomes = futures::future::join_all(claims.iter().map(|&epoch| {
        let writer = LogWriter::new(b.stores.events.clone(), acme("r1"), epoch);
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
    let log = b.stores.events.snapshot(&acme("r1")).await.unwrap();
    assert_eq!(log.chunks.len(), 3);
    assert!(log.chunks.iter().all(|c| c.epoch == winner));

    // Claims racing appenders: whatever interleaving, the log's epochs never
    // decrease, and a writer refused once is refused for good.
    create(&b.stores, "r2").await;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let stores = b.stores.clone();
            tokio::spawn(async move {
                let epoch = stores.runs.claim(&acme("r2")).await.unwrap().driver_epoch;
                let writer = LogWriter::new(stores.events.clone(), acme("r2"), epoch);
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
    let log = b.stores.events.snapshot(&acme("r2")).await.unwrap();
    assert!(!log.chunks.is_empty());
    assert!(log.chunks.windows(2).all(|w| w[0].epoch <= w[1].epoch), "epochs in log order never decrease");
}

async fn runs_terminal_write_from_a_stale_epoch_is_suppressed(b: &Backend) {
    let runs = &b.stores.runs;
    create(&b.stores, "r1").await;
    let successor = runs.claim(&acme("r1")).await.unwrap().driver_epoch;
    let failed = RunFinish {
        session_id: None,
        status: RunStatus::Failed,
        error: Some(RunError { code: "CLAIM_LOST".into(), message: "old driver".into() }),
        usage: None,
        finished_at: Timestamp::from_millis(8_000),
    };
    let stale = runs.finish(&acme("r1"), FIRST_EPOCH, failed).await;
    assert!(
        matches!(stale, Err(Error::Fenced { held: FIRST_EPOCH, current, .. }) if current == successor),
        "{stale:?}"
    );
    let record = runs.get(&acme("r1")).await.unwrap();
    assert_eq!(record.status, RunStatus::Running);
    assert_eq!(record.error, None);
    assert_eq!(record.finished_at, None);

    let done = runs.finish(&acme("r1"), successor, finish_completed()).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.finished_at, Some(Timestamp::from_millis(9_000)));
    assert_eq!(done.usage, Some(serde_json::json!({"output_tokens": 7})));
    assert_eq!(done.session_id.as_deref(), Some("session-7"), "the session is recorded with the end");
    assert_eq!(runs.get(&acme("r1")).await.unwrap(), done);

    let twice = runs.finish(&acme("r1"), successor, finish_completed()).await;
    assert!(matches!(twice, Err(Error::RunTerminal { .. })), "{twice:?}");
    let not_terminal = runs
        .finish(&acme("r1"), successor, RunFinish { status: RunStatus::Running, ..finish_completed() })
        .await;
    assert!(matches!(not_terminal, Err(Error::Invalid { .. })), "{not_terminal:?}");
    let revive =
        runs.update(&acme("r1"), RunUpdate { status: Some(RunStatus::Running), ..Default::default() }).await;
    assert!(matches!(revive, Err(Error::RunTerminal { .. })), "{revive:?}");
    // Non-terminal fields of a terminal run may still change (the reaper
    // clears the sandbox key after reclaiming it).
    let reclaimed =
        runs.update(&acme("r1"), RunUpdate { sandbox_key: Some(None), ..Default::default() }).await;
    assert_eq!(reclaimed.unwrap().status, RunStatus::Completed);
    assert!(matches!(runs.finish(&acme("nope"), 1, finish_completed()).await, Err(Error::NotFound(_))));
}

async fn runs_request_cancel_records_intent_only(b: &Backend) {
    let runs = &b.stores.runs;
    let created = create(&b.stores, "r1").await;
    let cancelled = runs.request_cancel(&acme("r1")).await.unwrap();
    assert!(cancelled.cancel_requested);
    assert_eq!(cancelled.status, RunStatus::Running);
    assert_eq!(cancelled.driver_epoch, created.driver_epoch);
    assert!(runs.get(&acme("r1")).await.unwrap().cancel_requested);

    create(&b.stores, "r2").await;
    let done = runs.finish(&acme("r2"), FIRST_EPOCH, finish_completed()).await.unwrap();
    let after = runs.request_cancel(&acme("r2")).await.unwrap();
    assert_eq!(after, done, "a terminal run is returned unchanged");
}

async fn runs_delete_only_ended_runs_with_their_logs(b: &Backend) {
    let stores = &b.stores;
    let runs = &stores.runs;
    create(stores, "done").await;
    stores.events.append(&acme("done"), FIRST_EPOCH, &chunks("done", 3)).await.unwrap();
    runs.finish(&acme("done"), FIRST_EPOCH, finish_completed()).await.unwrap();
    create(stores, "live").await;
    stores.events.append(&acme("live"), FIRST_EPOCH, &chunks("live", 2)).await.unwrap();
    // Another tenant's run of the same id, ended: not ours to remove.
    runs.create_or_resume(new_run("done", "other", "t1", 1_000)).await.unwrap();
    runs.finish(&key("other", "done"), FIRST_EPOCH, finish_completed()).await.unwrap();

    let refused = runs.delete_ended(&acme("live")).await.unwrap_err();
    assert!(matches!(refused, Error::RunNotEnded { status: RunStatus::Running, .. }), "{refused:?}");
    assert_eq!(stores.events.snapshot(&acme("live")).await.unwrap().chunks.len(), 2);

    runs.delete_ended(&acme("done")).await.unwrap();
    assert!(matches!(runs.get(&acme("done")).await, Err(Error::NotFound(_))));
    assert!(matches!(runs.delete_ended(&acme("done")).await, Err(Error::NotFound(_))));
    // The log went with the run: a run made later under the same id starts
    // with an empty one.
    create(stores, "done").await;
    let left = stores.events.page(&acme("done"), &Offset::start(), 100).await.unwrap();
    assert!(left.is_empty(), "the log went with the run: {left:?}");
    assert_eq!(runs.get(&key("other", "done")).await.unwrap().status, RunStatus::Completed);
}

async fn runs_delete_ended_before_takes_the_oldest_ends_first(b: &Backend) {
    let runs = &b.stores.runs;
    for (id, ended) in [("e1", 5_000), ("e2", 6_000), ("e3", 7_000), ("late", 9_000)] {
        runs.create_or_resume(new_run(id, if id == "e2" { "other" } else { "acme" }, "t1", 1_000))
            .await
            .unwrap();
        let run = key(if id == "e2" { "other" } else { "acme" }, id);
        b.stores.events.append(&run, FIRST_EPOCH, &chunks(id, 3)).await.unwrap();
        let finish = RunFinish { finished_at: Timestamp::from_millis(ended), ..finish_completed() };
        runs.finish(&run, FIRST_EPOCH, finish).await.unwrap();
    }
    create(&b.stores, "running").await;
    runs.create_or_resume(new_run("e0", "acme", "t1", 1_000)).await.unwrap();
    b.stores.events.append(&acme("e0"), FIRST_EPOCH, &chunks("e0", 3)).await.unwrap();
    let finish = RunFinish { finished_at: Timestamp::from_millis(4_000), ..finish_completed() };
    runs.finish(&acme("e0"), FIRST_EPOCH, finish).await.unwrap();
    assert_eq!(runs.delete_ended_before(Timestamp::from_millis(4_500), 10).await.unwrap(), vec![acme("e0")]);
    // Its log went with it: a run made later under the same id starts empty.
    runs.create_or_resume(new_run("e0", "acme", "t1", 1_000)).await.unwrap();
    let left = b.stores.events.page(&acme("e0"), &Offset::start(), 100).await.unwrap();
    assert!(left.is_empty(), "the log went with the run: {left:?}");

    let first = runs.delete_ended_before(Timestamp::from_millis(8_000), 2).await.unwrap();
    assert_eq!(first, vec![acme("e1"), key("other", "e2")], "oldest first, every tenant, at most the limit");
    // The logs of a batch go with its runs (each tenant's), and only theirs.
    for run in &first {
        runs.create_or_resume(NewRun {
            tenant: run.tenant.clone(),
            ..new_run(run.run.as_str(), "acme", "t1", 1_000)
        })
        .await
        .unwrap();
        let left = b.stores.events.page(run, &Offset::start(), 100).await.unwrap();
        assert!(left.is_empty(), "{run:?}'s log went with it: {left:?}");
    }
    assert_eq!(
        b.stores.events.page(&acme("e3"), &Offset::start(), 100).await.unwrap().len(),
        3,
        "e3 keeps its log"
    );
    let rest = runs.delete_ended_before(Timestamp::from_millis(8_000), 10).await.unwrap();
    assert_eq!(rest, vec![acme("e3")], "the cutoff is exclusive of later ends");
    assert!(
        runs.delete_ended_before(Timestamp::from_millis(i64::MAX), 10).await.unwrap().contains(&acme("late"))
    );
    assert_eq!(runs.get(&acme("running")).await.unwrap().status, RunStatus::Running, "a live run stays");
}

/// A page of runs: thread, status and text narrow it, a cursor moves past
/// the previous page (ties of one start broken by run id), and a pattern's
/// own `%`, `_` and quotes match only themselves.
async fn runs_list_page_filters_searches_and_pages(b: &Backend) {
    let runs = &b.stores.runs;
    let with_spec = |id: &str, thread: &str, started: i64, prompt: &str| NewRun {
        spec: Some(
            serde_json::json!({"harness": "command", "command": ["sh", "-c", "make check"], "prompt": prompt}),
        ),
        ..new_run(id, "acme", thread, started)
    };
    runs.create_or_resume(with_spec("r1", "t1", 1_000, "Fix the Flaky test")).await.unwrap();
    runs.create_or_resume(with_spec("r2", "t1", 2_000, "say \"hi\" 100% of the time")).await.unwrap();
    // Two runs of one millisecond: the run id orders them.
    runs.create_or_resume(with_spec("r3a", "t2", 3_000, "")).await.unwrap();
    runs.create_or_resume(with_spec("r3b", "t2", 3_000, "")).await.unwrap();
    let globex = NewRun { tenant: tenant("globex"), ..with_spec("g1", "t1", 9_000, "fix the flaky test") };
    runs.create_or_resume(globex).await.unwrap();
    runs.finish(&acme("r2"), FIRST_EPOCH, finish_completed()).await.unwrap();

    let ids = |records: Vec<RunRecord>| records.into_iter().map(|r| r.run_id.to_string()).collect::<Vec<_>>();
    let page = |filter: RunFilter, limit: u32| async move {
        ids(runs.list_page(&tenant("acme"), &filter, limit).await.unwrap())
    };
    let text = |t: &str| RunFilter { text: Some(t.into()), ..Default::default() };

    assert_eq!(page(RunFilter::default(), 10).await, ["r3b", "r3a", "r2", "r1"]);
    assert_eq!(
        page(RunFilter { thread_id: Some("t1".into()), ..Default::default() }, 10).await,
        ["r2", "r1"]
    );
    assert_eq!(
        page(RunFilter { status: Some(RunStatus::Completed), ..Default::default() }, 10).await,
        ["r2"]
    );
    assert_eq!(
        page(RunFilter { status: Some(RunStatus::Running), ..Default::default() }, 10).await,
        ["r3b", "r3a", "r1"]
    );
    assert_eq!(page(text("FLAKY"), 10).await, ["r1"], "the prompt, case ignored, the tenant's own only");
    assert_eq!(page(text("make check"), 10).await, ["r3b", "r3a", "r2", "r1"], "the command");
    assert_eq!(page(text("R3"), 10).await, ["r3b", "r3a"], "the run id");
    assert_eq!(page(text("say \"hi\""), 10).await, ["r2"], "a quote matches a quote");
    assert_eq!(page(text("100%"), 10).await, ["r2"]);
    assert!(page(text("1_0"), 10).await.is_empty(), "`_` is no wildcard");
    assert_eq!(page(text("%"), 10).await, ["r2"], "`%` is no wildcard");

    // Pages of two: each starts after the last run of the one before.
    let first = runs.list_page(&tenant("acme"), &RunFilter::default(), 2).await.unwrap();
    assert_eq!(ids(first.clone()), ["r3b", "r3a"]);
    let last = first.last().unwrap();
    let after = Some((last.started_at, last.run_id.clone()));
    assert_eq!(page(RunFilter { after: after.clone(), ..Default::default() }, 2).await, ["r2", "r1"]);
    assert_eq!(
        page(RunFilter { after, thread_id: Some("t1".into()), ..Default::default() }, 2).await,
        ["r2", "r1"]
    );
    let end = Some((Timestamp::from_millis(1_000), run_id("r1")));
    assert!(page(RunFilter { after: end, ..Default::default() }, 2).await.is_empty());
}

async fn runs_active_run_and_list_by_thread(b: &Backend) {
    let runs = &b.stores.runs;
    for (id, started) in [("a", 1_000), ("b", 2_000), ("c", 3_000), ("d", 4_000)] {
        runs.create_or_resume(new_run(id, "acme", "t1", started)).await.unwrap();
    }
    runs.create_or_resume(new_run("other-thread", "acme", "t2", 5_000)).await.unwrap();
    runs.finish(&acme("d"), FIRST_EPOCH, finish_completed()).await.unwrap();
    runs.finish(&acme("a"), FIRST_EPOCH, finish_completed()).await.unwrap();

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
    let d = runs.get(&acme("d")).await.unwrap();
    assert_eq!(d.spec, Some(serde_json::json!({"harness": "command", "n": 4_000})), "the spec round-trips");

    runs.finish(&acme("c"), FIRST_EPOCH, finish_completed()).await.unwrap();
    runs.finish(&acme("b"), FIRST_EPOCH, finish_completed()).await.unwrap();
    assert_eq!(runs.active_run(&tenant("acme"), "t1").await.unwrap(), None);
    assert_eq!(runs.active_run(&tenant("acme"), "t2").await.unwrap().unwrap().run_id, run_id("other-thread"));
}

async fn runs_reclaimable_cutoff_is_inclusive(b: &Backend) {
    let runs = &b.stores.runs;
    let cutoff = 100_000;
    let owner = |id: &str| if id == "globex" { "globex" } else { "acme" };
    let detach = |id: &'static str, at: i64| {
        let runs = runs.clone();
        async move {
            runs.update(
                &key(owner(id), id),
                RunUpdate { detached_since: Some(Some(Timestamp::from_millis(at))), ..Default::default() },
            )
            .await
            .unwrap();
        }
    };
    for id in ["before", "at", "after", "attached", "finished", "interrupted", "globex"] {
        runs.create_or_resume(new_run(id, owner(id), "t", 1)).await.unwrap();
    }
    detach("before", cutoff - 10).await;
    detach("at", cutoff).await;
    detach("after", cutoff + 1).await;
    detach("finished", cutoff - 20).await;
    detach("interrupted", cutoff - 20).await;
    detach("globex", cutoff - 5).await;
    runs.finish(&acme("finished"), FIRST_EPOCH, finish_completed()).await.unwrap();
    runs.update(
        &acme("interrupted"),
        RunUpdate { status: Some(RunStatus::Interrupted), ..Default::default() },
    )
    .await
    .unwrap();

    let reclaimable: Vec<String> = runs
        .list_reclaimable(Timestamp::from_millis(cutoff), None)
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
    let of_globex =
        runs.list_reclaimable(Timestamp::from_millis(cutoff), Some(&tenant("globex"))).await.unwrap();
    assert_eq!(
        of_globex.iter().map(|r| r.run_id.to_string()).collect::<Vec<_>>(),
        ["globex"],
        "one tenant's"
    );

    let undetached: Vec<String> = runs
        .list_undetached_running(10, None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id.to_string())
        .collect();
    assert_eq!(undetached, ["attached"], "running and not detached, any tenant");
    runs.create_or_resume(new_run("attached-too", "globex", "t", 0)).await.unwrap();
    let first: Vec<String> = runs
        .list_undetached_running(1, None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id.to_string())
        .collect();
    assert_eq!(first, ["attached-too"], "oldest start first, at most the limit");
    let of_acme = runs.list_undetached_running(1, Some(&tenant("acme"))).await.unwrap();
    assert_eq!(
        of_acme.iter().map(|r| r.run_id.to_string()).collect::<Vec<_>>(),
        ["attached"],
        "one tenant's"
    );
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
    runs.finish(&acme("done"), FIRST_EPOCH, finish_completed()).await.unwrap();
    let ids = |records: Vec<RunRecord>| records.into_iter().map(|r| r.run_id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(runs.unfinished_in_sandbox("box").await.unwrap()), ["first", "second"]);
    assert!(runs.unfinished_in_sandbox("no-such-box").await.unwrap().is_empty());
}

// ---------------------------------------------------------------- EventLog

async fn log_append_mints_ordered_offsets_and_snapshot_returns_them(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let writer = LogWriter::new(b.stores.events.clone(), acme("r1"), record.driver_epoch);
    let mut all_offsets = Vec::new();
    let mut expected = Vec::new();
    for (batch, size) in [("one", 1), ("sixteen", 16), ("big", 256), ("huge", 1_200)] {
        let batch_chunks = chunks(batch, size);
        let offsets = writer.append(&batch_chunks).await.unwrap();
        assert_eq!(offsets.len(), size);
        all_offsets.extend(offsets);
        expected.extend(batch_chunks.iter().map(|c| String::from_utf8(c.payload.to_vec()).unwrap()));
    }
    assert!(writer.append(&[]).await.unwrap().is_empty());
    let distinct: BTreeSet<&Offset> = all_offsets.iter().collect();
    assert_eq!(distinct.len(), all_offsets.len());

    let log = b.stores.events.snapshot(&acme("r1")).await.unwrap();
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

async fn log_requests_are_indexed_by_the_append(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let run = acme("r1");
    let writer = LogWriter::new(b.stores.events.clone(), run.clone(), record.driver_epoch);
    let mark =
        |payload: &str, m: RequestMark| NewChunk::new("k", payload.as_bytes().to_vec()).with_request(Some(m));
    let asked = |id: &str| RequestMark::Asked(id.into());
    let answered = |id: &str| RequestMark::Answered(id.into());
    let offsets = writer
        .append(&[
            NewChunk::new("k", b"plain".to_vec()),
            mark("ask a", asked("a")),
            mark("ask b", asked("b")),
            mark("answer a", answered("a")),
            mark("ask a again", asked("a")), // a record repeated after an agent crash
            mark("answer nobody", answered("zz")),
        ])
        .await
        .unwrap();
    let payload = |c: &StoredChunk| String::from_utf8(c.payload.to_vec()).unwrap();
    let seen = |list: &[IndexedRequest]| {
        list.iter()
            .map(|r| (r.request_id.clone(), payload(&r.asked), r.answered.as_ref().map(payload)))
            .collect::<Vec<_>>()
    };
    let events = &b.stores.events;
    let all = events.requests(&run, RequestFilter::All).await.unwrap();
    assert_eq!(
        seen(&all),
        [("a".into(), "ask a".into(), Some("answer a".into())), ("b".into(), "ask b".into(), None)]
    );
    assert_eq!(all[0].asked.offset, offsets[1]);
    assert_eq!(all[0].answered.as_ref().unwrap().offset, offsets[3]);
    assert_eq!(
        seen(&events.requests(&run, RequestFilter::Pending).await.unwrap()),
        [("b".into(), "ask b".into(), None)]
    );
    assert_eq!(events.request(&run, "a").await.unwrap().unwrap(), all[0]);
    assert!(events.request(&run, "zz").await.unwrap().is_none());

    // The first answer stands; a later batch answers the rest.
    writer.append(&[mark("answer b", answered("b")), mark("answer a twice", answered("a"))]).await.unwrap();
    let all = events.requests(&run, RequestFilter::All).await.unwrap();
    assert_eq!(
        seen(&all),
        [
            ("a".into(), "ask a".into(), Some("answer a".into())),
            ("b".into(), "ask b".into(), Some("answer b".into()))
        ]
    );
    assert!(events.requests(&run, RequestFilter::Pending).await.unwrap().is_empty());

    // A fenced append indexes nothing, and another tenant's run of the same id has its own.
    b.stores.runs.claim(&run).await.unwrap();
    assert!(matches!(writer.append(&[mark("ask c", asked("c"))]).await, Err(Error::Fenced { .. })));
    assert!(events.request(&run, "c").await.unwrap().is_none());
    let other = RunKey::new(Tenant::new("globex"), RunId::parse("r1").unwrap());
    assert!(events.requests(&other, RequestFilter::All).await.unwrap().is_empty());
    assert!(events.request(&other, "a").await.unwrap().is_none());
}

/// `ask:ID:N` asks ID, `answer:ID:N` answers it: what the event model
/// would read in a stored chunk.
fn test_mark(stored: &StoredChunk) -> Option<RequestMark> {
    let text = std::str::from_utf8(&stored.payload).ok()?;
    let mut parts = text.split(':');
    match (parts.next()?, parts.next()?) {
        ("ask", id) => Some(RequestMark::Asked(id.into())),
        ("answer", id) => Some(RequestMark::Answered(id.into())),
        _ => None,
    }
}

/// The requests of `run` as `(id, asked payload, answered payload)`.
async fn request_payloads(
    stores: &Stores,
    run: &RunKey,
    filter: RequestFilter,
) -> Vec<(String, String, Option<String>)> {
    let text = |c: &StoredChunk| String::from_utf8(c.payload.to_vec()).unwrap();
    let listed = stores.events.requests(run, filter).await.unwrap();
    listed.iter().map(|r| (r.request_id.clone(), text(&r.asked), r.answered.as_ref().map(text))).collect()
}

fn req(id: &str, asked: &str, answered: Option<&str>) -> (String, String, Option<String>) {
    (id.into(), asked.into(), answered.map(str::to_string))
}

async fn log_requests_older_than_the_index_are_built_from_the_log_once(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let run = acme("r1");
    let writer = LogWriter::new(b.stores.events.clone(), run.clone(), record.driver_epoch);
    let plain = |payload: &str| NewChunk::new("k", payload.as_bytes().to_vec());
    let marked = |payload: &str| {
        plain(payload).with_request(test_mark(&StoredChunk {
            offset: Offset::start(),
            epoch: 0,
            kind: "k".into(),
            payload: payload.as_bytes().to_vec().into(),
            appended_at: Timestamp::from_millis(0),
        }))
    };
    let events = &b.stores.events;
    // A new run is indexed: nothing to build.
    assert!(!events.backfill_requests(&run, &test_mark).await.unwrap());
    // Appended before the index existed: nothing indexed them.
    writer
        .append(&[plain("ask:a:1"), plain("ask:b:1"), plain("answer:a:1"), plain("ask:a:2")])
        .await
        .unwrap();
    b.execute_on_run("UPDATE runs SET requests_indexed = FALSE WHERE tenant = $1 AND run_id = $2", &run)
        .await;
    // Since: the answer to b finds no row to mark; c is indexed.
    writer.append(&[marked("answer:b:1"), marked("ask:c:1")]).await.unwrap();
    assert_eq!(request_payloads(&b.stores, &run, RequestFilter::All).await, [req("c", "ask:c:1", None)]);

    assert!(events.backfill_requests(&run, &test_mark).await.unwrap());
    assert_eq!(
        request_payloads(&b.stores, &run, RequestFilter::All).await,
        [
            req("a", "ask:a:1", Some("answer:a:1")),
            req("b", "ask:b:1", Some("answer:b:1")),
            req("c", "ask:c:1", None)
        ]
    );
    assert_eq!(request_payloads(&b.stores, &run, RequestFilter::Pending).await, [req("c", "ask:c:1", None)]);
    // Once: later appends index as always, and nothing is built again.
    writer.append(&[marked("answer:c:1")]).await.unwrap();
    assert!(!events.backfill_requests(&run, &test_mark).await.unwrap());
    assert!(request_payloads(&b.stores, &run, RequestFilter::Pending).await.is_empty());
    assert!(!events.backfill_requests(&acme("unknown"), &test_mark).await.unwrap());
}

async fn log_pages_through_a_log_longer_than_a_page(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    create(&b.stores, "empty").await;
    let events = &b.stores.events;
    let n = PAGE_CHUNKS * 2 + 3;
    let offsets = events.append(&acme("r1"), record.driver_epoch, &chunks("c", n)).await.unwrap();
    let expected: Vec<String> = (0..n).map(|i| format!("c-{i}")).collect();

    let first = events.page(&acme("r1"), &Offset::start(), 5).await.unwrap();
    assert_eq!(payloads(&first), expected[..5]);
    let next = events.page(&acme("r1"), &first[4].offset, 5).await.unwrap();
    assert_eq!(payloads(&next), expected[5..10]);
    let tail = events.page(&acme("r1"), &offsets[n - 2], 5).await.unwrap();
    assert_eq!(payloads(&tail), expected[n - 1..], "a short page: nothing more is stored");
    assert!(events.page(&acme("r1"), &offsets[n - 1], 5).await.unwrap().is_empty());

    // Page after page, in order, ending at what is stored (never waiting:
    // the log is not closed).
    let stored = stored_after(events.clone(), acme("r1"), Offset::start());
    let all: Vec<StoredChunk> = tokio::time::timeout(DEADLINE, stored.try_collect()).await.unwrap().unwrap();
    assert_eq!(payloads(&all), expected);
    assert_eq!(all.iter().map(|c| c.offset.clone()).collect::<Vec<_>>(), offsets);
    let after: Vec<StoredChunk> =
        stored_after(events.clone(), acme("r1"), offsets[PAGE_CHUNKS].clone()).try_collect().await.unwrap();
    assert_eq!(payloads(&after), expected[PAGE_CHUNKS + 1..]);

    assert_eq!(events.last(&acme("r1")).await.unwrap().map(|c| c.offset), Some(offsets[n - 1].clone()));
    assert_eq!(events.last(&acme("empty")).await.unwrap(), None);
    assert!(events.page(&acme("empty"), &Offset::start(), 5).await.unwrap().is_empty());
    // Another tenant's run of the same id is unknown, like any unknown run.
    let other = key("other", "r1");
    assert!(matches!(events.page(&other, &Offset::start(), 5).await, Err(Error::NotFound(_))));
    assert!(matches!(events.last(&other).await, Err(Error::NotFound(_))));
    let unknown: Result<Vec<StoredChunk>> =
        stored_after(events.clone(), acme("nope"), Offset::start()).try_collect().await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
}

async fn log_read_from_first_and_middle_offsets(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let events = &b.stores.events;
    let offsets = events.append(&acme("r1"), record.driver_epoch, &chunks("c", 10)).await.unwrap();
    events.close(&acme("r1")).await.unwrap();
    events.close(&acme("r1")).await.unwrap();

    let first = Offset::parse(FIRST_OFFSET).unwrap();
    assert_eq!(first, Offset::start());
    let whole = collect_until_end(events.read(&acme("r1"), &first).await.unwrap()).await;
    assert_eq!(payloads(&whole), (0..10).map(|i| format!("c-{i}")).collect::<Vec<_>>());

    let middle = Offset::parse(&offsets[4].to_string()).unwrap();
    let rest = collect_until_end(events.read(&acme("r1"), &middle).await.unwrap()).await;
    assert_eq!(payloads(&rest), (5..10).map(|i| format!("c-{i}")).collect::<Vec<_>>());
    assert_eq!(rest[0].offset, offsets[5]);

    let at_end = collect_until_end(events.read(&acme("r1"), &offsets[9]).await.unwrap()).await;
    assert!(at_end.is_empty());

    assert!(matches!(events.read(&acme("nope"), &first).await, Err(Error::NotFound(_))));
    assert!(matches!(events.snapshot(&acme("nope")).await, Err(Error::NotFound(_))));
    assert!(matches!(events.close(&acme("nope")).await, Err(Error::NotFound(_))));
    for bad in ["", "-1", "abc", "1.5", "99999999999999999999"] {
        assert!(matches!(Offset::parse(bad), Err(Error::Invalid { .. })), "{bad:?}");
    }
}

async fn log_stale_append_is_refused_after_a_claim_and_stays_refused(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let events = &b.stores.events;
    let old = LogWriter::new(events.clone(), acme("r1"), record.driver_epoch);
    old.append(&chunks("old", 2)).await.unwrap();
    assert!(!old.is_fenced().await);

    let successor = b.stores.runs.claim(&acme("r1")).await.unwrap().driver_epoch;
    let refused = old.append(&chunks("stale", 2)).await;
    assert!(
        matches!(refused, Err(Error::Fenced { held, current, .. }) if held == FIRST_EPOCH && current == successor)
    );
    assert!(old.is_fenced().await);
    // The store refuses that epoch by itself too, not only the latch.
    let direct = events.append(&acme("r1"), FIRST_EPOCH, &chunks("direct", 1)).await;
    assert!(matches!(direct, Err(Error::Fenced { .. })), "{direct:?}");

    let new = LogWriter::new(events.clone(), acme("r1"), successor);
    new.append(&chunks("new", 2)).await.unwrap();
    let still = old.append(&chunks("stale-again", 1)).await;
    assert!(matches!(still, Err(Error::Fenced { .. })), "{still:?}");

    let log = events.snapshot(&acme("r1")).await.unwrap();
    assert_eq!(payloads(&log.chunks), ["old-0", "old-1", "new-0", "new-1"]);
    assert_eq!(
        log.chunks.iter().map(|c| c.epoch).collect::<Vec<_>>(),
        [FIRST_EPOCH, FIRST_EPOCH, successor, successor]
    );

    events.close(&acme("r1")).await.unwrap();
    let closed = new.append(&chunks("late", 1)).await;
    assert!(matches!(closed, Err(Error::LogClosed(_))), "{closed:?}");
    assert!(!new.is_fenced().await, "a closed log is not a lost claim");
    let unknown = events.append(&acme("nope"), 1, &chunks("x", 1)).await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
}

/// What another replica commits to a run (an append, a claim, a close, the
/// run deleted and made again) is what this store's next append is checked
/// against, however many appends it made before (SQLite's committer keeps
/// the fences it read between groups; they must not outlive such a write).
async fn log_fences_follow_what_another_replica_commits(b: &Backend) {
    let replica = b.reopen().await;
    let (ours, theirs) = (&b.stores.events, &replica.events);
    create(&b.stores, "r1").await;
    ours.append(&acme("r1"), FIRST_EPOCH, &chunks("ours", 2)).await.unwrap();
    theirs.append(&acme("r1"), FIRST_EPOCH, &chunks("theirs", 1)).await.unwrap();
    let next = ours.append(&acme("r1"), FIRST_EPOCH, &chunks("ours-again", 1)).await.unwrap();
    assert_eq!(next[0].to_string(), "4", "after the replica's append");

    let successor = replica.runs.claim(&acme("r1")).await.unwrap().driver_epoch;
    let stale = ours.append(&acme("r1"), FIRST_EPOCH, &chunks("stale", 1)).await;
    assert!(
        matches!(stale, Err(Error::Fenced { held, current, .. }) if held == FIRST_EPOCH && current == successor),
        "{stale:?}"
    );
    ours.append(&acme("r1"), successor, &chunks("successor", 1)).await.unwrap();
    theirs.close(&acme("r1")).await.unwrap();
    let late = ours.append(&acme("r1"), successor, &chunks("late", 1)).await;
    assert!(matches!(late, Err(Error::LogClosed(_))), "{late:?}");
    let log = ours.snapshot(&acme("r1")).await.unwrap();
    assert_eq!(payloads(&log.chunks), ["ours-0", "ours-1", "theirs-0", "ours-again-0", "successor-0"]);

    // Deleted and made again under the same id: a new log from 1.
    replica.runs.finish(&acme("r1"), successor, finish_completed()).await.unwrap();
    replica.runs.delete_ended(&acme("r1")).await.unwrap();
    // Gone under the fence this store kept: refused, and nothing left
    // behind for the run made again under its id (below, from 1).
    let gone = ours.append(&acme("r1"), successor, &chunks("gone", 1)).await;
    assert!(matches!(gone, Err(Error::NotFound(_))), "{gone:?}");
    replica.runs.create_or_resume(new_run("r1", "acme", "thread-1", 1_000)).await.unwrap();
    let first = ours.append(&acme("r1"), FIRST_EPOCH, &chunks("new", 1)).await.unwrap();
    assert_eq!(first[0].to_string(), "1", "the new run's log starts over");
    replica.close().await;
}

async fn log_snapshot_never_blocks(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let events = &b.stores.events;
    events.append(&acme("r1"), record.driver_epoch, &chunks("c", 3)).await.unwrap();
    // A live tailer, an open log, and a claim holding the run row's write
    // lock in another connection: a snapshot still answers at once.
    let tail = events.read(&acme("r1"), &Offset::start()).await.unwrap();
    let hold = b.hold_run_row(&run_id("r1")).await;
    let log = tokio::time::timeout(DEADLINE, events.snapshot(&acme("r1")))
        .await
        .expect("snapshot does not wait")
        .unwrap();
    drop(hold);
    assert!(!log.closed);
    assert_eq!(payloads(&log.chunks), ["c-0", "c-1", "c-2"]);
    drop(tail);

    create(&b.stores, "empty").await;
    let empty = tokio::time::timeout(DEADLINE, events.snapshot(&acme("empty"))).await.unwrap().unwrap();
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
    let writer = LogWriter::new(events.clone(), acme("r1"), record.driver_epoch);
    writer.append(&chunks("before", 2)).await.unwrap();

    let mut tail = events.read(&acme("r1"), &Offset::start()).await.unwrap();
    assert_eq!(payloads(&take(&mut tail, 2).await), ["before-0", "before-1"]);
    writer.append(&chunks("later", 3)).await.unwrap();
    assert_eq!(payloads(&take(&mut tail, 3).await), ["later-0", "later-1", "later-2"]);
    writer.append(&chunks("last", 1)).await.unwrap();
    events.close(&acme("r1")).await.unwrap();
    assert_eq!(payloads(&collect_until_end(tail).await), ["last-0"], "then the stream ends");
}

async fn log_tail_sees_appends_through_another_store_instance(b: &Backend) {
    // Another replica: its own pool and (PostgreSQL) its own listener.
    let replica = b.reopen().await;
    let record = create(&b.stores, "r1").await;
    let mut tail = replica.events.read(&acme("r1"), &Offset::start()).await.unwrap();
    let writer = LogWriter::new(b.stores.events.clone(), acme("r1"), record.driver_epoch);
    for round in 0..3 {
        writer.append(&chunks(&format!("round{round}"), 2)).await.unwrap();
        let got = take(&mut tail, 2).await;
        assert_eq!(payloads(&got), [format!("round{round}-0"), format!("round{round}-1")]);
    }
    b.stores.events.close(&acme("r1")).await.unwrap();
    assert!(collect_until_end(tail).await.is_empty());
    replica.close().await;
}

/// A thousand streams' catch-up pages can take every connection of the
/// store's pool; a run's appends must still land (they have connections of
/// their own), and not end the run on the pool's acquire timeout.
async fn log_appends_land_while_readers_hold_every_pooled_connection(b: &Backend) {
    let record = create(&b.stores, "r1").await;
    let writer = LogWriter::new(b.stores.events.clone(), acme("r1"), record.driver_epoch);
    let held = match &b.stores.pool {
        Pool::Sqlite(pool) => (hold_every_connection(pool).await, Vec::new()),
        Pool::Postgres(pool) => (Vec::new(), hold_every_connection(pool).await),
    };
    let appended = writer.append(&chunks("busy", 3)).await;
    drop(held);
    appended.expect("the append lands while readers hold the pool");
    let snapshot = b.stores.events.snapshot(&acme("r1")).await.unwrap();
    assert_eq!(payloads(&snapshot.chunks), ["busy-0", "busy-1", "busy-2"]);
}

/// Many streams over many runs, attached at different offsets, each get
/// every chunk of their run once and in order, and end at the close.
async fn log_many_streams_of_many_runs_each_get_their_whole_log(b: &Backend) {
    const RUNS: usize = 8;
    const STREAMS: usize = 25;
    const ROUNDS: usize = 10;
    let mut writers = Vec::new();
    for i in 0..RUNS {
        let id = format!("s{i}");
        let record = create(&b.stores, &id).await;
        let writer = LogWriter::new(b.stores.events.clone(), acme(&id), record.driver_epoch);
        writer.append(&chunks("early", 3)).await.unwrap();
        writers.push((id, writer));
    }
    let mut streams = Vec::new();
    for (id, _) in &writers {
        for s in 0..STREAMS {
            // From the start, after the first chunk, and at the end.
            let after = Offset::from_seq((s % 4) as i64).unwrap();
            let skipped = (s % 4).min(3);
            streams.push((id.clone(), skipped, b.stores.events.read(&acme(id), &after).await.unwrap()));
        }
    }
    for round in 0..ROUNDS {
        for (_, writer) in &writers {
            writer.append(&chunks(&format!("round{round}"), 2)).await.unwrap();
        }
    }
    for (id, _) in &writers {
        b.stores.events.close(&acme(id)).await.unwrap();
    }
    let mut expected_all: Vec<String> = payloads_of(&chunks("early", 3));
    for round in 0..ROUNDS {
        expected_all.extend(payloads_of(&chunks(&format!("round{round}"), 2)));
    }
    let reads = streams
        .into_iter()
        .map(|(id, skipped, stream)| async move { (id, skipped, collect_until_end(stream).await) });
    for (id, skipped, got) in futures::future::join_all(reads).await {
        assert_eq!(payloads(&got), expected_all[skipped..], "stream of run {id} after {skipped}");
    }
}

async fn hold_every_connection<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
) -> Vec<sqlx::pool::PoolConnection<DB>> {
    let mut held = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        held.push(pool.acquire().await.unwrap());
    }
    held
}

fn payloads_of(chunks: &[NewChunk]) -> Vec<String> {
    chunks.iter().map(|c| String::from_utf8(c.payload.to_vec()).unwrap()).collect()
}

// ---------------------------------------------------------------- group commit

async fn log_many_runs_appending_at_once_keep_their_own_order(b: &Backend) {
    const RUNS: usize = 40;
    const APPENDS: usize = 25;
    for i in 0..RUNS {
        create(&b.stores, &format!("g{i}")).await;
    }
    // Every run appends as fast as its store answers: the appends of many
    // runs meet in the committer and share transactions.
    let writers = (0..RUNS).map(|i| {
        let writer = LogWriter::new(b.stores.events.clone(), acme(&format!("g{i}")), FIRST_EPOCH);
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for round in 0..APPENDS {
                let batch = chunks(&format!("g{i}-{round}"), 1 + (i + round) % 3);
                let offsets = writer.append(&batch).await.unwrap();
                assert_eq!(offsets.len(), batch.len());
                acknowledged.extend(offsets.into_iter().zip(batch.into_iter().map(|c| c.payload.to_vec())));
            }
            acknowledged
        })
    });
    let acknowledged = futures::future::join_all(writers).await;
    for (i, acknowledged) in acknowledged.into_iter().enumerate() {
        let acknowledged = acknowledged.unwrap();
        let log = b.stores.events.snapshot(&acme(&format!("g{i}"))).await.unwrap();
        let stored: Vec<(Offset, Vec<u8>)> =
            log.chunks.into_iter().map(|c| (c.offset, c.payload.to_vec())).collect();
        assert_eq!(stored, acknowledged, "run g{i}: every acknowledged chunk, in order, nothing else");
        let seqs: Vec<String> = stored.iter().map(|(offset, _)| offset.to_string()).collect();
        let contiguous: Vec<String> = (1..=stored.len()).map(|n| n.to_string()).collect();
        assert_eq!(seqs, contiguous, "run g{i}: offsets contiguous from the first");
    }
}

/// Appends queued behind a held write lock (SQLite) or run row
/// (PostgreSQL), so the committer finds them waiting together and writes
/// them in one group once the hold is released. The gate's own append goes
/// first and alone.
async fn appends_held_together(
    b: &Backend,
    appends: Vec<(RunKey, Epoch, Vec<NewChunk>)>,
) -> Vec<Result<Vec<Offset>>> {
    create(&b.stores, "gate").await;
    let hold = b.hold_run_row(&run_id("gate")).await;
    let events = b.stores.events.clone();
    let gate =
        tokio::spawn(async move { events.append(&acme("gate"), FIRST_EPOCH, &chunks("gate", 1)).await });
    // The committer is now waiting on the hold with the gate's append.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Polled in order from one task, the appends are queued in this order.
    let queued = futures::future::join_all(appends.iter().map(|(run, epoch, batch)| {
        let events = b.stores.events.clone();
        async move {
            tokio::time::timeout(DEADLINE, events.append(run, *epoch, batch))
                .await
                .expect("the group commits")
        }
    }));
    let release = async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(hold);
    };
    let (results, ()) = tokio::join!(queued, release);
    gate.await.unwrap().unwrap();
    results
}

async fn log_group_refuses_a_fenced_or_closed_member_alone(b: &Backend) {
    for id in ["healthy", "claimed", "closed", "also-healthy"] {
        create(&b.stores, id).await;
    }
    let successor = b.stores.runs.claim(&acme("claimed")).await.unwrap().driver_epoch;
    b.stores.events.close(&acme("closed")).await.unwrap();
    let results = appends_held_together(
        b,
        vec![
            (acme("healthy"), FIRST_EPOCH, chunks("healthy-a", 2)),
            (acme("claimed"), FIRST_EPOCH, chunks("stale", 2)),
            (acme("closed"), FIRST_EPOCH, chunks("late", 1)),
            (acme("nope"), FIRST_EPOCH, chunks("unknown", 1)),
            (acme("claimed"), successor, chunks("current", 2)),
            (acme("healthy"), FIRST_EPOCH, chunks("healthy-b", 1)),
            (acme("also-healthy"), FIRST_EPOCH, chunks("also", 3)),
            (acme("also-healthy"), FIRST_EPOCH, Vec::new()),
        ],
    )
    .await;
    let mut results = results.into_iter();
    let mut next = || results.next().unwrap();
    assert_eq!(next().unwrap().len(), 2, "healthy");
    let stale = next();
    assert!(
        matches!(stale, Err(Error::Fenced { held, current, .. }) if held == FIRST_EPOCH && current == successor),
        "{stale:?}"
    );
    let closed = next();
    assert!(matches!(closed, Err(Error::LogClosed(_))), "{closed:?}");
    let unknown = next();
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
    assert_eq!(next().unwrap().len(), 2, "the successor's append beside the refused one");
    assert_eq!(next().unwrap().len(), 1, "healthy, second");
    assert_eq!(next().unwrap().len(), 3, "also healthy");
    assert!(next().unwrap().is_empty(), "an empty append");

    let log = |id: &'static str| {
        let events = b.stores.events.clone();
        async move { payloads(&events.snapshot(&acme(id)).await.unwrap().chunks) }
    };
    assert_eq!(log("healthy").await, ["healthy-a-0", "healthy-a-1", "healthy-b-0"]);
    assert_eq!(log("claimed").await, ["current-0", "current-1"]);
    assert!(log("closed").await.is_empty());
    assert_eq!(log("also-healthy").await, ["also-0", "also-1", "also-2"]);
    let claimed = b.stores.events.snapshot(&acme("claimed")).await.unwrap();
    assert!(claimed.chunks.iter().all(|c| c.epoch == successor));
}

async fn log_group_keeps_the_request_index_of_each_member(b: &Backend) {
    for id in ["asks", "answers"] {
        create(&b.stores, id).await;
    }
    let asked = |tag: &str, id: &str| {
        NewChunk::new("ask", tag.as_bytes().to_vec()).with_request(Some(RequestMark::Asked(id.into())))
    };
    let answered = |tag: &str, id: &str| {
        NewChunk::new("answer", tag.as_bytes().to_vec()).with_request(Some(RequestMark::Answered(id.into())))
    };
    let results = appends_held_together(
        b,
        vec![
            (acme("asks"), FIRST_EPOCH, vec![asked("q1", "req-1"), NewChunk::new("k", b"plain".to_vec())]),
            (acme("answers"), FIRST_EPOCH, vec![asked("q2", "req-2")]),
            (acme("answers"), FIRST_EPOCH, vec![answered("a2", "req-2")]),
        ],
    )
    .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let pending = b.stores.events.requests(&acme("asks"), RequestFilter::Pending).await.unwrap();
    assert_eq!(pending.iter().map(|r| r.request_id.as_str()).collect::<Vec<_>>(), ["req-1"]);
    let answered = b.stores.events.request(&acme("answers"), "req-2").await.unwrap().unwrap();
    assert_eq!(answered.asked.payload, &b"q2"[..]);
    assert_eq!(answered.answered.unwrap().payload, &b"a2"[..]);
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
        node: String::new(),
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
    assert!(snap.env.is_empty(), "no variables until set");
    let env = std::collections::BTreeMap::from([
        ("A".to_string(), "1".to_string()),
        ("B".to_string(), "2 2".to_string()),
    ]);
    assert_eq!(instances.set_env("k1", &env).await.unwrap().env, env);
    assert_eq!(instances.put(new("k1", "acme", "c-1c")).await.unwrap().env, env, "a replace keeps them");
    assert!(matches!(instances.set_env("nope", &env).await, Err(Error::NotFound(_))));

    let keys = |list: Vec<Instance>| list.into_iter().map(|i| i.sandbox_key).collect::<Vec<_>>();
    assert_eq!(keys(instances.list(Some(&tenant("acme"))).await.unwrap()), ["k0", "k1"]);
    assert_eq!(keys(instances.list(None).await.unwrap()), ["k0", "k1", "k2"]);

    assert!(instances.delete("k1").await.unwrap());
    assert!(!instances.delete("k1").await.unwrap());
    assert!(matches!(instances.get("k1").await, Err(Error::NotFound(_))));
    assert!(matches!(instances.set_native_snapshot("k1", None).await, Err(Error::NotFound(_))));
}

/// Live network rules: a change lands only on the version it was made
/// from (two changes never lose one), a replace keeps them, a missing
/// sandbox is NOT_FOUND.
async fn instances_keep_live_network_rules(b: &Backend) {
    let instances = &b.stores.instances;
    let new = NewInstance {
        sandbox_key: "kw".into(),
        tenant: tenant("acme"),
        provider: "local".into(),
        provider_sandbox_id: "p".into(),
        native_snapshot: None,
        definition_id: "d".into(),
        thread_id: "t".into(),
        node: String::new(),
    };
    assert_eq!(instances.put(new.clone()).await.unwrap().network, LiveNetwork::default());
    let rules = LiveNetwork {
        allow_hosts: vec!["a.example".into()],
        deny_hosts: vec!["*.b.example".into()],
        changed_by: "acme".into(),
        changed_at_ms: 7,
        history: vec![LiveChange {
            version: 1,
            changed_by: "acme".into(),
            changed_at_ms: 7,
            change: NetworkChange { allow_hosts: vec!["a.example".into()], ..Default::default() },
        }],
        ..Default::default()
    };
    let changed = instances.set_network("kw", 0, &rules).await.unwrap().expect("at version 0");
    assert_eq!(changed.network, LiveNetwork { version: 1, ..rules.clone() });
    assert_eq!(
        instances.set_network("kw", 0, &LiveNetwork::default()).await.unwrap(),
        None,
        "a stale version"
    );
    assert_eq!(instances.get("kw").await.unwrap().network.allow_hosts, ["a.example"]);
    assert_eq!(instances.put(new).await.unwrap().network.version, 1, "a replace keeps them");
    let again = instances.set_network("kw", 1, &LiveNetwork::default()).await.unwrap().unwrap();
    assert_eq!((again.network.version, again.network.allow_hosts.len()), (2, 0));
    assert!(matches!(instances.set_network("nope", 0, &rules).await, Err(Error::NotFound(_))));
}

/// A sandbox on a node says so; a replace may move it to another.
async fn instances_carry_their_node(b: &Backend) {
    let instances = &b.stores.instances;
    let new = |node: &str| NewInstance {
        sandbox_key: "kn".into(),
        tenant: tenant("acme"),
        provider: "docker".into(),
        provider_sandbox_id: "c".into(),
        native_snapshot: None,
        definition_id: "d".into(),
        thread_id: "t".into(),
        node: node.into(),
    };
    assert_eq!(instances.put(new("node-a")).await.unwrap().node, "node-a");
    assert_eq!(instances.get("kn").await.unwrap().node, "node-a");
    assert_eq!(instances.put(new("")).await.unwrap().node, "", "back on the server's own providers");
}

/// What is placed on each node: its instances and its unclaimed warm
/// sandboxes (a claimed one is counted as the instance it became).
async fn nodes_count_what_is_placed_on_each(b: &Backend) {
    let s = &b.stores;
    let instance = |key: &str, node: &str| NewInstance {
        sandbox_key: key.into(),
        tenant: tenant("acme"),
        provider: "docker".into(),
        provider_sandbox_id: format!("c-{key}"),
        native_snapshot: None,
        definition_id: "d".into(),
        thread_id: key.into(),
        node: node.into(),
    };
    for (key, node) in [("i1", "node-a"), ("i2", "node-a"), ("i3", "node-b"), ("i4", "")] {
        s.instances.put(instance(key, node)).await.unwrap();
    }
    for (key, node) in [("w1", "node-b"), ("w2", "node-c"), ("w3", "")] {
        s.warm.add(&WarmSandbox { node: node.into(), ..warm(key, "acme", "d1", 1) }).await.unwrap();
        assert!(s.warm.ready(key, &format!("p-{key}")).await.unwrap());
    }
    s.warm.set_pool(&Tenant::new("acme"), "def", 3).await.unwrap();
    let claimed = s.warm.claim(&Tenant::new("acme"), "def", "d1", "thread-x").await.unwrap().unwrap();
    let placed = |rows: Vec<(String, u32)>| rows.into_iter().collect::<std::collections::BTreeMap<_, _>>();
    let expected = |claimed_node: &str| {
        let mut counts = std::collections::BTreeMap::from([
            ("node-a".to_string(), 2),
            ("node-b".to_string(), 2),
            ("node-c".to_string(), 1),
        ]);
        if let Some(n) = counts.get_mut(claimed_node) {
            *n -= 1;
            if *n == 0 {
                counts.remove(claimed_node);
            }
        }
        counts
    };
    assert_eq!(
        placed(s.nodes.placed().await.unwrap()),
        expected(&claimed.node),
        "claimed {}",
        claimed.pool_key
    );
}

// ---------------------------------------------------------------- NodeStore

/// Register, heartbeat, drain and remove; a removed name cannot come back.
async fn nodes_register_heartbeat_drain_and_remove(b: &Backend) {
    let nodes = &b.stores.nodes;
    let new = |name: &str, address: &str| NewNode {
        name: name.into(),
        address: address.into(),
        labels: r#"{"docker":"true"}"#.into(),
        providers: "[]".into(),
        memory_bytes: 8 << 30,
        cpus: 4,
        sandbox_slots: 10,
        version: "1".into(),
    };
    let a = nodes.register(new("a", "https://10.0.0.1:1")).await.unwrap().unwrap();
    assert_eq!((a.node.sandbox_slots, a.free_memory_bytes, a.draining), (10, 8 << 30, false));
    nodes.register(new("b", "https://10.0.0.2:1")).await.unwrap().unwrap();
    let beat = nodes.heartbeat("a", 1 << 30, 3).await.unwrap().unwrap();
    assert_eq!((beat.free_memory_bytes, beat.sandboxes), (1 << 30, 3));
    assert!(beat.last_heartbeat >= a.last_heartbeat);
    assert!(nodes.heartbeat("nobody", 1, 1).await.unwrap().is_none());
    assert!(nodes.set_draining("a", true).await.unwrap().unwrap().draining);
    let again = nodes.register(new("a", "https://10.0.0.9:1")).await.unwrap().unwrap();
    assert!(again.draining, "registering again keeps the drain");
    assert_eq!(again.node.address, "https://10.0.0.9:1");
    assert_eq!(again.registered_at, a.registered_at);
    let names = |list: Vec<NodeRecord>| list.into_iter().map(|n| n.node.name).collect::<Vec<_>>();
    assert_eq!(names(nodes.list().await.unwrap()), ["a", "b"]);
    assert!(nodes.remove("b").await.unwrap());
    assert!(!nodes.remove("b").await.unwrap());
    assert_eq!(names(nodes.list().await.unwrap()), ["a"]);
    assert!(nodes.register(new("b", "https://10.0.0.2:1")).await.unwrap().is_none(), "removed stays out");
    assert!(nodes.heartbeat("b", 1, 1).await.unwrap().is_none());
    assert!(nodes.get("b").await.unwrap().unwrap().removed);
}

/// The count a tenant's sandbox quota reads: its own records, once each.
async fn instances_count_per_tenant(b: &Backend) {
    let instances = &b.stores.instances;
    let new = |key: &str, owner: &str| NewInstance {
        sandbox_key: key.into(),
        tenant: tenant(owner),
        provider: "local".into(),
        provider_sandbox_id: format!("id-{key}"),
        native_snapshot: None,
        definition_id: "def".into(),
        thread_id: "t".into(),
        node: String::new(),
    };
    let count = |owner: &'static str| async move { instances.count(&tenant(owner)).await.unwrap() };
    assert_eq!(count("acme").await, 0);
    for (key, owner) in [("a1", "acme"), ("a2", "acme"), ("g1", "globex")] {
        instances.put(new(key, owner)).await.unwrap();
    }
    instances.put(new("a1", "acme")).await.unwrap();
    assert_eq!((count("acme").await, count("globex").await, count("initech").await), (2, 1, 0));
    instances.delete("a2").await.unwrap();
    assert_eq!((count("acme").await, count("globex").await), (1, 1));
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

/// A run of `tenant` on `thread` under `definition`, started at `at`,
/// ended unless `running`.
async fn run_under(
    stores: &Stores,
    (tenant_name, id, thread): (&str, &str, &str),
    definition: &str,
    at: i64,
    running: bool,
) {
    let new = NewRun { definition_id: Some(definition.into()), ..new_run(id, tenant_name, thread, at) };
    stores.runs.create_or_resume(new).await.unwrap();
    if !running {
        stores.runs.finish(&key(tenant_name, id), FIRST_EPOCH, finish_completed()).await.unwrap();
    }
}

/// Only definitions the server derived from content, put before the
/// cutoff, that nothing of their own tenant names are removed: a sandbox,
/// an unfinished run or a thread's newest run keeps one; a name of the
/// tenant's own is never touched; at most the limit per call.
async fn definitions_unused_derived_are_removed(b: &Backend) {
    let stores = &b.stores;
    let definitions = &stores.definitions;
    for (owner, id) in [
        ("acme", "def-unused1"),
        ("acme", "def-unused2"),
        ("acme", "mine"),
        ("acme", "def-sandbox"),
        ("acme", "def-live"),
        ("acme", "def-older"),
        ("acme", "def-newest"),
        ("acme", "def-theirs"),
        ("globex", "def-theirs"),
    ] {
        definitions.put(&tenant(owner), id, serde_json::json!({})).await.unwrap();
    }
    stores
        .instances
        .put(NewInstance {
            sandbox_key: "k-sandbox".into(),
            tenant: tenant("acme"),
            provider: "local".into(),
            provider_sandbox_id: "p".into(),
            native_snapshot: None,
            definition_id: "def-sandbox".into(),
            thread_id: "t-sandbox".into(),
            node: String::new(),
        })
        .await
        .unwrap();
    run_under(stores, ("acme", "r-live", "t-live"), "def-live", 1_000, true).await;
    run_under(stores, ("acme", "r-old", "t-2"), "def-older", 1_000, false).await;
    run_under(stores, ("acme", "r-new", "t-2"), "def-newest", 2_000, false).await;
    // globex's newest run names its own def-theirs, not acme's.
    run_under(stores, ("globex", "r-g", "t-g"), "def-theirs", 1_000, false).await;

    let past = Timestamp::from_millis(Timestamp::now().as_millis() - 60_000);
    assert!(definitions.delete_unused_derived(past, 100).await.unwrap().is_empty(), "within the grace");

    let later = Timestamp::from_millis(Timestamp::now().as_millis() + 60_000);
    let mut removed = definitions.delete_unused_derived(later, 2).await.unwrap();
    assert_eq!(removed.len(), 2, "at most the limit: {removed:?}");
    removed.extend(definitions.delete_unused_derived(later, 100).await.unwrap());
    let mut removed: Vec<_> = removed.into_iter().map(|(t, id)| format!("{t}/{id}")).collect();
    removed.sort();
    assert_eq!(removed, ["acme/def-older", "acme/def-theirs", "acme/def-unused1", "acme/def-unused2"]);
    let ids = |list: Vec<Definition>| list.into_iter().map(|d| d.id).collect::<Vec<_>>();
    assert_eq!(
        ids(definitions.list(&tenant("acme")).await.unwrap()),
        ["def-live", "def-newest", "def-sandbox", "mine"]
    );
    assert_eq!(ids(definitions.list(&tenant("globex")).await.unwrap()), ["def-theirs"]);
    assert!(
        definitions.delete_unused_derived(later, 100).await.unwrap().is_empty(),
        "the same however often"
    );

    // Once the live run ends and a newer run of its thread names another
    // definition, nothing names def-live any more.
    stores.runs.finish(&acme("r-live"), FIRST_EPOCH, finish_completed()).await.unwrap();
    assert!(
        definitions.delete_unused_derived(later, 100).await.unwrap().is_empty(),
        "still the thread's newest"
    );
    run_under(stores, ("acme", "r-live2", "t-live"), "mine", 5_000, false).await;
    let removed = definitions.delete_unused_derived(later, 100).await.unwrap();
    assert_eq!(removed, [(tenant("acme"), "def-live".to_string())]);
}

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

    // Keeping a set deletes the rest; keeping none deletes all.
    tokens.put_token(&tenant("initech"), "initech-token").await.unwrap();
    assert_eq!(tokens.keep_only(&[raw, "initech-token"]).await.unwrap(), 1);
    assert_eq!(tokens.tenant_for_token("second-token").await.unwrap(), None);
    assert_eq!(tokens.tenant_for_token(raw).await.unwrap(), Some(tenant("acme")));
    assert_eq!(tokens.tenant_for_token("initech-token").await.unwrap(), Some(tenant("initech")));
    assert_eq!(tokens.keep_only(&[]).await.unwrap(), 2);
    assert!(tokens.list_tenants().await.unwrap().is_empty());
}

// ---------------------------------------------------------------- upgrades

/// Rows as a server before `0015_tenant_runs` (run ids global) wrote them:
/// acme's ended run `old` with two events, globex's running `other`.
macro_rules! write_before_tenant_runs {
    ($pool:expr, $migrations:literal) => {{
        let pool = $pool;
        let mut migrator = sqlx::migrate!($migrations);
        let before: Vec<_> = migrator.migrations.iter().filter(|m| m.version < 15).cloned().collect();
        migrator.migrations = std::borrow::Cow::Owned(before);
        migrator.run(&pool).await.unwrap();
        for (run, tenant, status, epoch) in [("old", "acme", "completed", 3), ("other", "globex", "running", 1)] {
            sqlx::query(
                "INSERT INTO runs (run_id, thread_id, tenant, status, started_at, driver_epoch, sentinel_key, \
                 log_closed, updated_at) VALUES ($1, $2, $3, $4, 1000, $5, $6, $7, 1000)",
            )
            .bind(run)
            .bind(format!("thread-{run}"))
            .bind(tenant)
            .bind(status)
            .bind(epoch as i64)
            .bind(format!("key-{run}"))
            .bind(status == "completed")
            .execute(&pool)
            .await
            .unwrap();
        }
        for (run, seq, payload) in [("old", 1, "e1"), ("old", 2, "e2"), ("other", 1, "g1")] {
            sqlx::query(
                "INSERT INTO run_events (run_id, seq, epoch, kind, payload, appended_at) \
                 VALUES ($1, $2, 1, 'k', $3, 1000)",
            )
            .bind(run)
            .bind(seq as i64)
            .bind(payload.as_bytes().to_vec())
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }};
}

/// After the upgrade every run keeps its tenant and its log; the ids are
/// per tenant from then on.
async fn runs_written_before_tenant_runs_keep_their_tenant(url: &str) {
    let stores = Stores::open(url).await.unwrap();
    let old = stores.runs.get(&acme("old")).await.unwrap();
    assert_eq!((old.tenant.as_str(), old.thread_id.as_str()), ("acme", "thread-old"));
    assert_eq!((old.status, old.driver_epoch, old.log_closed), (RunStatus::Completed, 3, true));
    assert_eq!(old.sentinel_key.expose(), "key-old");
    let log = stores.events.snapshot(&acme("old")).await.unwrap();
    assert_eq!(payloads(&log.chunks), ["e1", "e2"]);
    assert_eq!(log.chunks.iter().map(|c| c.offset.to_string()).collect::<Vec<_>>(), ["1", "2"]);
    assert!(matches!(stores.runs.get(&key("globex", "old")).await, Err(Error::NotFound(_))));
    let other = key("globex", "other");
    assert_eq!(payloads(&stores.events.snapshot(&other).await.unwrap().chunks), ["g1"]);
    stores.events.append(&other, 1, &chunks("after", 1)).await.unwrap();
    // globex may now take the id acme used; acme's run stays as it was.
    assert!(stores.runs.create_or_resume(new_run("old", "globex", "t", 5_000)).await.unwrap().created);
    stores.events.append(&key("globex", "old"), FIRST_EPOCH, &chunks("g", 1)).await.unwrap();
    assert_eq!(stores.runs.get(&acme("old")).await.unwrap(), old);
    assert_eq!(stores.events.snapshot(&acme("old")).await.unwrap(), log);
    stores.close().await;
}

#[tokio::test]
async fn sqlite_upgrade_keeps_runs_and_their_tenants() {
    use std::str::FromStr;
    let dir = tempfile::tempdir().unwrap();
    let url = default_database_url(dir.path());
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url).unwrap().create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    write_before_tenant_runs!(pool, "./migrations/sqlite");
    runs_written_before_tenant_runs_keep_their_tenant(&url).await;
}

#[tokio::test]
async fn postgres_upgrade_keeps_runs_and_their_tenants() {
    let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
    let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
    let pool = sqlx::PgPool::connect(scratch.url()).await.unwrap();
    write_before_tenant_runs!(pool, "./migrations/postgres");
    runs_written_before_tenant_runs_keep_their_tenant(scratch.url()).await;
    scratch.drop_database().await.unwrap();
}

/// Migrate `$pool` to just before the request backfill (0021) and write a
/// run whose log asks `a` and `b` and answers `a`, as the index's
/// predecessors did: no index rows.
macro_rules! write_before_request_backfill {
    ($pool:expr, $migrations:literal) => {{
        let pool = $pool;
        let mut migrator = sqlx::migrate!($migrations);
        let before: Vec<_> = migrator.migrations.iter().filter(|m| m.version < 21).cloned().collect();
        migrator.migrations = std::borrow::Cow::Owned(before);
        migrator.run(&pool).await.unwrap();
        sqlx::query(
            "INSERT INTO runs (run_id, thread_id, tenant, status, started_at, driver_epoch, sentinel_key, \
             log_closed, updated_at) VALUES ('old', 'thread-old', 'acme', 'running', 1000, 1, 'key-old', FALSE, 1000)",
        )
        .execute(&pool)
        .await
        .unwrap();
        for (seq, payload) in [(1, "ask:a:1"), (2, "ask:b:1"), (3, "answer:a:1")] {
            sqlx::query(
                "INSERT INTO run_events (tenant, run_id, seq, epoch, kind, payload, appended_at) \
                 VALUES ('acme', 'old', $1, 1, 'k', $2, 1000)",
            )
            .bind(seq as i64)
            .bind(payload.as_bytes().to_vec())
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }};
}

/// After the upgrade the old run's requests are built from its log on the
/// first call; a run created since needs nothing built.
async fn runs_written_before_the_request_index_get_theirs_built(url: &str) {
    let stores = Stores::open(url).await.unwrap();
    let old = acme("old");
    assert!(stores.events.requests(&old, RequestFilter::All).await.unwrap().is_empty());
    assert!(stores.events.backfill_requests(&old, &test_mark).await.unwrap());
    assert_eq!(
        request_payloads(&stores, &old, RequestFilter::All).await,
        [req("a", "ask:a:1", Some("answer:a:1")), req("b", "ask:b:1", None)]
    );
    assert!(!stores.events.backfill_requests(&old, &test_mark).await.unwrap());
    create(&stores, "new").await;
    assert!(!stores.events.backfill_requests(&acme("new"), &test_mark).await.unwrap());
    stores.close().await;
}

#[tokio::test]
async fn sqlite_upgrade_builds_the_request_index_of_older_runs() {
    use std::str::FromStr;
    let dir = tempfile::tempdir().unwrap();
    let url = default_database_url(dir.path());
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url).unwrap().create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    write_before_request_backfill!(pool, "./migrations/sqlite");
    runs_written_before_the_request_index_get_theirs_built(&url).await;
}

#[tokio::test]
async fn postgres_upgrade_builds_the_request_index_of_older_runs() {
    let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
    let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
    let pool = sqlx::PgPool::connect(scratch.url()).await.unwrap();
    write_before_request_backfill!(pool, "./migrations/postgres");
    runs_written_before_the_request_index_get_theirs_built(scratch.url()).await;
    scratch.drop_database().await.unwrap();
}

/// Migrate `$pool` to just before runs got their definition column (0023)
/// and write an ended run whose spec names `def-kept`, beside an unused
/// `def-gone`, both put long ago.
macro_rules! write_before_run_definitions {
    ($pool:expr, $migrations:literal) => {{
        let pool = $pool;
        let mut migrator = sqlx::migrate!($migrations);
        let before: Vec<_> = migrator.migrations.iter().filter(|m| m.version < 23).cloned().collect();
        migrator.migrations = std::borrow::Cow::Owned(before);
        migrator.run(&pool).await.unwrap();
        sqlx::query(
            "INSERT INTO runs (run_id, thread_id, tenant, status, started_at, driver_epoch, sentinel_key, \
             log_closed, updated_at, spec) VALUES ('old', 'thread-old', 'acme', 'completed', 1000, 1, 'key-old', \
             TRUE, 1000, '{\"harness\":\"command\",\"definition_id\":\"def-kept\"}')",
        )
        .execute(&pool)
        .await
        .unwrap();
        for id in ["def-kept", "def-gone"] {
            sqlx::query(
                "INSERT INTO definitions (tenant, id, body, created_at, updated_at) VALUES ('acme', $1, '{}', 1000, 1000)",
            )
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }};
}

/// The upgrade reads each older run's definition from its spec: the
/// definition its thread would run under again stays.
async fn runs_written_before_their_definition_column_keep_it(url: &str) {
    let stores = Stores::open(url).await.unwrap();
    let now = Timestamp::now();
    let removed = stores.definitions.delete_unused_derived(now, 100).await.unwrap();
    assert_eq!(removed, [(tenant("acme"), "def-gone".to_string())]);
    assert!(stores.definitions.get(&tenant("acme"), "def-kept").await.is_ok());
    stores.close().await;
}

#[tokio::test]
async fn sqlite_upgrade_reads_older_runs_definitions() {
    use std::str::FromStr;
    let dir = tempfile::tempdir().unwrap();
    let url = default_database_url(dir.path());
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url).unwrap().create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    write_before_run_definitions!(pool, "./migrations/sqlite");
    runs_written_before_their_definition_column_keep_it(&url).await;
}

#[tokio::test]
async fn postgres_upgrade_reads_older_runs_definitions() {
    let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
    let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
    let pool = sqlx::PgPool::connect(scratch.url()).await.unwrap();
    write_before_run_definitions!(pool, "./migrations/postgres");
    runs_written_before_their_definition_column_keep_it(scratch.url()).await;
    scratch.drop_database().await.unwrap();
}

// ---------------------------------------------------------------- warm pools

fn warm(key: &str, tenant: &str, digest: &str, created_at: i64) -> WarmSandbox {
    WarmSandbox {
        pool_key: key.into(),
        tenant: Tenant::new(tenant),
        definition_id: "def".into(),
        digest: digest.into(),
        provider: "local".into(),
        node: String::new(),
        provider_sandbox_id: String::new(),
        state: WarmState::Creating,
        claimed_key: None,
        created_at: Timestamp::from_millis(created_at),
        claimed_at: None,
    }
}

/// Claims take ready sandboxes of the pool's tenant, definition and digest,
/// oldest first, each once, even from many claims at once through two
/// store handles (two replicas); a sandbox being made is never claimed.
async fn warm_claims_take_each_ready_sandbox_once(b: &Backend) {
    let s = &b.stores;
    let acme = Tenant::new("acme");
    s.warm.set_pool(&acme, "def", 3).await.unwrap();
    assert_eq!(s.warm.pools().await.unwrap().len(), 1);
    for (key, tenant, digest, at) in [
        ("k1", "acme", "d1", 10),
        ("k2", "acme", "d1", 20),
        ("k3", "acme", "d0", 5),
        ("k4", "other", "d1", 1),
    ] {
        s.warm.add(&warm(key, tenant, digest, at)).await.unwrap();
        assert!(s.warm.ready(key, &format!("p-{key}")).await.unwrap());
        assert!(!s.warm.ready(key, "again").await.unwrap(), "ready twice");
    }
    s.warm.add(&warm("k5", "acme", "d1", 0)).await.unwrap();
    assert_eq!(s.warm.count_unclaimed(&acme).await.unwrap(), 4, "k1, k2, k3 and k5 (creating)");

    let other = b.reopen().await;
    let claims = (0..6).map(|i| {
        let store = if i % 2 == 0 { s.warm.clone() } else { other.warm.clone() };
        async move { store.claim(&Tenant::new("acme"), "def", "d1", &format!("thread-{i}")).await.unwrap() }
    });
    let claimed: Vec<WarmSandbox> = futures::future::join_all(claims).await.into_iter().flatten().collect();
    let keys: BTreeSet<&str> = claimed.iter().map(|c| c.pool_key.as_str()).collect();
    assert_eq!(keys, BTreeSet::from(["k1", "k2"]), "each ready sandbox of the digest exactly once");
    assert!(claimed.iter().all(|c| c.state == WarmState::Claimed && c.claimed_key.is_some()));
    let k1 = s.warm.get("k1").await.unwrap().unwrap();
    assert_eq!((k1.state, k1.provider_sandbox_id.as_str()), (WarmState::Claimed, "p-k1"));
    // Claimed a moment ago with no thread's record yet: still counted.
    assert_eq!(s.warm.count_unclaimed(&acme).await.unwrap(), 4);
    for c in &claimed {
        let key = c.claimed_key.clone().unwrap();
        s.instances
            .put(NewInstance {
                sandbox_key: key.clone(),
                tenant: acme.clone(),
                provider: "local".into(),
                provider_sandbox_id: c.provider_sandbox_id.clone(),
                native_snapshot: None,
                definition_id: "def".into(),
                thread_id: key,
                node: String::new(),
            })
            .await
            .unwrap();
    }
    assert_eq!(s.warm.count_unclaimed(&acme).await.unwrap(), 2, "k3 and k5");
    assert!(s.instances.points_at("local", "p-k1").await.unwrap());
    assert!(!s.instances.points_at("local", "p-k3").await.unwrap());
    assert!(!s.instances.points_at("docker", "p-k1").await.unwrap());
    // Another digest, another tenant, a sandbox being made: none to claim.
    assert!(s.warm.claim(&acme, "def", "d1", "late").await.unwrap().is_none());
    assert!(s.warm.claim(&acme, "def", "d9", "late").await.unwrap().is_none());
    assert_eq!(s.warm.claim(&Tenant::new("other"), "def", "d1", "t").await.unwrap().unwrap().pool_key, "k4");

    s.warm.set_pool_error(&acme, "def", "quota").await.unwrap();
    assert_eq!(s.warm.pools().await.unwrap()[0].last_error, "quota");
    assert!(s.warm.remove("k3").await.unwrap());
    assert!(!s.warm.remove("k3").await.unwrap());
    assert_eq!(s.warm.list(Some(&acme)).await.unwrap().len(), 3);
    s.warm.set_pool(&acme, "def", 0).await.unwrap();
    assert!(s.warm.pools().await.unwrap().is_empty());
    other.close().await;
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
    runs_create_within_counts_the_tenants_unfinished_runs,
    runs_are_tenant_scoped,
    runs_update_round_trips_non_terminal_fields,
    runs_claim_bumps_the_epoch_and_refuses_terminal_or_unknown,
    runs_racing_claims_get_distinct_epochs_and_losers_append_nothing,
    runs_terminal_write_from_a_stale_epoch_is_suppressed,
    runs_request_cancel_records_intent_only,
    runs_and_logs_of_one_id_are_per_tenant,
    runs_active_run_and_list_by_thread,
    runs_list_page_filters_searches_and_pages,
    runs_reclaimable_cutoff_is_inclusive,
    runs_unfinished_in_sandbox_across_tenants,
    runs_delete_only_ended_runs_with_their_logs,
    runs_delete_ended_before_takes_the_oldest_ends_first,
    log_append_mints_ordered_offsets_and_snapshot_returns_them,
    log_read_from_first_and_middle_offsets,
    log_pages_through_a_log_longer_than_a_page,
    log_requests_are_indexed_by_the_append,
    log_requests_older_than_the_index_are_built_from_the_log_once,
    log_stale_append_is_refused_after_a_claim_and_stays_refused,
    log_fences_follow_what_another_replica_commits,
    log_snapshot_never_blocks,
    log_tail_sees_later_appends_and_ends_at_close,
    log_tail_sees_appends_through_another_store_instance,
    log_appends_land_while_readers_hold_every_pooled_connection,
    log_many_streams_of_many_runs_each_get_their_whole_log,
    log_many_runs_appending_at_once_keep_their_own_order,
    log_group_refuses_a_fenced_or_closed_member_alone,
    log_group_keeps_the_request_index_of_each_member,
    instances_put_get_list_and_delete,
    instances_count_per_tenant,
    instances_carry_their_node,
    instances_keep_live_network_rules,
    nodes_register_heartbeat_drain_and_remove,
    nodes_count_what_is_placed_on_each,
    definitions_round_trip_per_tenant,
    definitions_unused_derived_are_removed,
    tokens_map_to_tenants_and_are_stored_hashed,
    warm_claims_take_each_ready_sandbox_once,
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
        (Error::RunNotEnded { run: "x".into(), status: RunStatus::Running }, ErrorCode::FailedPrecondition),
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
