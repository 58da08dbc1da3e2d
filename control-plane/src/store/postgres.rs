//! The PostgreSQL backend, shared by any number of replicas.
//!
//! Fencing an append against a claim, the argument: the append is one
//! statement (so one transaction) whose first step locks the run row
//! `FOR SHARE` *on the condition* that `driver_epoch` equals the writer's
//! epoch; rows are inserted only if that lock was granted. A claim is an
//! `UPDATE` of the same row, which takes a lock (`FOR NO KEY UPDATE`) that
//! conflicts with `FOR SHARE`. So the two serialize on the row:
//!
//! - append first: the claim's UPDATE waits until the append commits. Every
//!   row of the old epoch is in before the new epoch exists.
//! - claim first: the append's `FOR SHARE` waits for the claim to commit, then
//!   (READ COMMITTED) re-evaluates its condition on the new row version,
//!   finds the bumped epoch, locks nothing, and inserts nothing.
//!
//! There is no third order, so no row of a superseded epoch lands after the
//! claim that superseded it. (`FOR KEY SHARE` would NOT do: it does not
//! conflict with a non-key UPDATE.) A writer paused anywhere - before sending,
//! or between statements - changes nothing: the check and the insert are the
//! same statement on the server.
//!
//! Tailing: a statement trigger on `run_events` calls `pg_notify` with the
//! run's key (`<tenant>:<run id>`, [`RunKey::encode`]); one listener connection per process relays notifications to the
//! local tailers, which then read the table.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::checkpoint_sql::{
    CheckpointRow, REFS_PER_INSERT, checkpoint_columns, checkpoint_not_found, copy_checkpoint_as_head,
    copy_run, impl_checkpoint_store, lock_thread_head, new_checkpoint_id, to_db,
};
use super::group::{Committer, Fence, GroupCommit, GroupLog, Member, Written, refusal, write_group};
use super::requests_sql::{RequestRow, impl_request_index, index_marks, index_requests, request_select};
use super::sql::{
    DefinitionRow, EventRow, InstanceRow, NodeRow, RunRow, epoch_to_db, explain_refusal, impl_shared_stores,
    instance_columns, json_to_db, node_columns, not_terminal, run_columns, run_not_found, terminal,
};
use super::tail::{self, LogPages, Tails, Wake, Wakes};
use super::{
    Admitted, CreatedRun, Definition, DefinitionStore, Epoch, Error, EventLog, FIRST_EPOCH, IndexedRequest,
    Instance, InstanceStore, LogSnapshot, NewChunk, NewInstance, NewNode, NewRun, NodeRecord, NodeStore,
    Offset, Pool, RequestFilter, Result, RunFinish, RunKey, RunRecord, RunStore, RunUpdate, StoredChunk,
    Stores, TAIL_POLL_INTERVAL, Tenant, Timestamp, TokenStore, token_hash,
};

/// The NOTIFY channel of event-log wake-ups (payload: [`RunKey::encode`]).
const CHANNEL: &str = "sandhold_run_events";

/// How often a racing same-epoch append (a caller bug, not a takeover)
/// retries after losing the race for the next sequence number.
const SEQ_CONFLICT_RETRIES: usize = 8;

#[derive(Clone)]
pub(super) struct PgStore {
    pool: PgPool,
    wakes: Wakes,
    tails: Tails,
    appends: Committer<PgAppends>,
    /// Stops the notification relay when the last clone goes away.
    _relay: Arc<DropGuard>,
}

/// Connections of the store's pool, and of the appends' own: readers (a
/// thousand streams' catch-up pages) cannot take the ones runs' appends
/// need. The committer writes one group at a time; the second connection
/// is slack for one being replaced.
const POOL_CONNECTIONS: u32 = 10;
const APPEND_CONNECTIONS: u32 = 2;

/// How long the first connection of [`open`] may take before the server
/// says the database does not answer (and tries again).
const FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) async fn open(database_url: &str, grouping: GroupCommit) -> Result<Stores> {
    // One direct attempt first: the pool retries a refused connection
    // quietly until its acquire timeout, 30 s of silence for an operator
    // whose database is down.
    use sqlx::Connection;
    let probe = tokio::time::timeout(FIRST_CONNECT_TIMEOUT, sqlx::PgConnection::connect(database_url))
        .await
        .map_err(|_| {
            Error::Unavailable(format!(
                "PostgreSQL did not answer within {}s",
                FIRST_CONNECT_TIMEOUT.as_secs()
            ))
        })??;
    let _ = probe.close().await;
    let connect = |connections| {
        PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect(database_url)
    };
    let pool = connect(POOL_CONNECTIONS).await?;
    // sqlx takes an advisory lock, so replicas starting together migrate once.
    sqlx::migrate!("./migrations/postgres").run(&pool).await?;
    let wakes = tail::wakes();
    let stop = CancellationToken::new();
    tokio::spawn(relay_notifications(database_url.to_owned(), wakes.clone(), stop.clone()));
    let blobs: Arc<dyn super::BlobStore> = Arc::new(super::PgBlobStore::new(pool.clone()));
    let tails = Tails::new(&wakes, TAIL_POLL_INTERVAL);
    // Without grouping every append is a transaction in its caller's task,
    // as before group commit (the benchmarks' baseline): the store's pool.
    let append_pool = match grouping {
        GroupCommit::Off => pool.clone(),
        GroupCommit::Grouped { .. } => connect(APPEND_CONNECTIONS).await?,
    };
    let appends = Committer::start(PgAppends { pool: append_pool.clone() }, tails.clone(), grouping);
    let store =
        Arc::new(PgStore { pool: pool.clone(), wakes, tails, appends, _relay: Arc::new(stop.drop_guard()) });
    Ok(Stores {
        runs: store.clone(),
        events: store.clone(),
        instances: store.clone(),
        definitions: store.clone(),
        tokens: store.clone(),
        warm: store.clone(),
        attempts: store.clone(),
        nodes: store.clone(),
        checkpoints: store,
        blobs,
        pool: Pool::Postgres(pool),
        append_pool: Pool::Postgres(append_pool),
    })
}

/// LISTEN on [`CHANNEL`] and wake local tailers. Whenever notifications may
/// have been missed (connecting, reconnecting) it wakes everyone; the tailers'
/// one-second poll covers the time the listener is down.
async fn relay_notifications(database_url: String, wakes: Wakes, stop: CancellationToken) {
    loop {
        let listening = async {
            let mut listener = PgListener::connect(&database_url).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            () = stop.cancelled() => return,
            listening = listening => match listening {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::warn!(%error, "event log listener cannot connect; tailers fall back to polling");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(TAIL_POLL_INTERVAL) => continue,
                    }
                }
            },
        };
        let _ = wakes.send(Wake::All);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                received = listener.try_recv() => match received {
                    Ok(Some(notification)) => {
                        let _ = wakes.send(Wake::Run(Arc::from(notification.payload())));
                    }
                    // Connection lost; the next call reconnects and re-listens.
                    Ok(None) => {
                        let _ = wakes.send(Wake::All);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "event log listener failed; reconnecting");
                        let _ = wakes.send(Wake::All);
                        break;
                    }
                },
            }
        }
    }
}

super::attempts::impl_attempt_store!(PgStore, begin: "BEGIN");
super::warm::impl_warm_store!(PgStore, skip_locked: " FOR UPDATE SKIP LOCKED");
impl_shared_stores!(PgStore, sqlx::Postgres);
impl_request_index!(PgStore, begin: "BEGIN", for_update: " FOR UPDATE");

impl PgStore {
    /// Serializes every quota-checked run creation of `tenant` across
    /// replicas until the transaction ends: under READ COMMITTED two
    /// concurrent counts would otherwise both see the last free slot.
    async fn lock_tenant_runs(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, tenant: &Tenant) -> Result<()> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("sandhold:runs-of:{}", tenant.as_str()))
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}
// Pinning takes the snapshot GC lock shared, a sweep exclusively (both for
// the transaction only): pins never wait for each other, and a sweep's
// deletions and a pin never interleave.
impl_checkpoint_store!(PgStore, sqlx::Postgres, begin: "BEGIN", for_update: " FOR UPDATE",
    sweep_lock: "SELECT pg_advisory_xact_lock(91570100388176)",
    pin_lock: "SELECT pg_advisory_xact_lock_shared(91570100388176)");

fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("23505"))
}

/// The appends of a PostgreSQL store ([`group`](super::group)).
///
/// A group of several appends is one transaction: `read_fences!` locks the
/// members' run rows `FOR SHARE` and reads their epochs under that lock,
/// then the admitted rows are inserted and the transaction commits. A claim
/// (`UPDATE` of a run row) conflicts with `FOR SHARE`, so it either
/// committed before the lock was granted (the member sees the new epoch and
/// is refused) or waits until the group committed (every row of the old
/// epoch is in before the new epoch exists): the module's argument, with
/// the lock held to the group's COMMIT. An append alone keeps the one
/// statement that checks and inserts (nothing held between round trips).
/// How long a group's transaction may sit idle before PostgreSQL ends it
/// (a group runs in milliseconds; see [`PgAppends`]'s `begin`).
const GROUP_IDLE_LIMIT: Duration = Duration::from_secs(5);

pub(super) struct PgAppends {
    pool: PgPool,
}

impl PgAppends {
    /// One fenced INSERT of the whole batch (see the module docs). Returns
    /// the sequence numbers it minted, or nothing when the fence refused.
    async fn insert_fenced<'e>(
        executor: impl sqlx::PgExecutor<'e>,
        run: &RunKey,
        held: i64,
        chunks: &[NewChunk],
        at: i64,
    ) -> sqlx::Result<Vec<i64>> {
        let kinds: Vec<&str> = chunks.iter().map(|c| c.kind.as_ref()).collect();
        let payloads: Vec<&[u8]> = chunks.iter().map(|c| c.payload.as_ref()).collect();
        sqlx::query_scalar(
            "WITH fence AS ( \
                 SELECT tenant, run_id FROM runs \
                 WHERE tenant = $6 AND run_id = $1 AND driver_epoch = $2 AND NOT log_closed \
                 FOR SHARE \
             ), last AS ( \
                 SELECT COALESCE(MAX(seq), 0) AS seq FROM run_events WHERE tenant = $6 AND run_id = $1 \
             ) \
             INSERT INTO run_events (tenant, run_id, seq, epoch, kind, payload, appended_at) \
             SELECT fence.tenant, fence.run_id, last.seq + batch.ordinal, $2, batch.kind, batch.payload, $5 \
             FROM fence, last, UNNEST($3::text[], $4::bytea[]) WITH ORDINALITY \
                 AS batch(kind, payload, ordinal) \
             ORDER BY batch.ordinal \
             RETURNING seq",
        )
        .bind(run.run.as_str())
        .bind(held)
        .bind(kinds)
        .bind(payloads)
        .bind(at)
        .bind(run.tenant.as_str())
        .fetch_all(executor)
        .await
    }

    /// The fenced INSERT and, when the batch asks or answers requests, their
    /// index rows, in one transaction (the fence's row lock held to the end).
    async fn insert_indexed(
        &self,
        run: &RunKey,
        held: i64,
        chunks: &[NewChunk],
        at: i64,
    ) -> sqlx::Result<Vec<i64>> {
        if chunks.iter().all(|c| c.request.is_none()) {
            return Self::insert_fenced(&self.pool, run, held, chunks, at).await;
        }
        let mut tx = self.pool.begin().await?;
        let mut seqs = Self::insert_fenced(&mut *tx, run, held, chunks, at).await?;
        if seqs.len() == chunks.len() {
            seqs.sort_unstable();
            index_requests!(tx, run, chunks, seqs.iter().copied());
            tx.commit().await?;
        }
        Ok(seqs)
    }
}

#[async_trait]
impl GroupLog for PgAppends {
    type Tx = sqlx::Transaction<'static, sqlx::Postgres>;

    async fn begin(&self) -> Result<Self::Tx> {
        let mut tx = self.pool.begin().await?;
        // A group holds its runs' rows `FOR SHARE` to its COMMIT: a replica
        // stopped or cut off inside it would hold up every claim of those
        // runs for as long as its connection lives. PostgreSQL ends such a
        // transaction (and its session) after this much idleness; its
        // members were never acknowledged, so nothing is lost.
        sqlx::query(&format!(
            "SET LOCAL idle_in_transaction_session_timeout = '{}ms'",
            GROUP_IDLE_LIMIT.as_millis()
        ))
        .execute(&mut *tx)
        .await?;
        Ok(tx)
    }

    async fn write(&self, tx: &mut Self::Tx, members: &[Member<'_>]) -> Result<Vec<Written>> {
        Ok(write_group!(sqlx::Postgres, tx, members, lock: " FOR SHARE OF r"))
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        Ok(tx.commit().await?)
    }

    async fn abandon(&self, tx: Self::Tx) {
        // A connection that cannot roll back is closed by sqlx.
        let _ = tx.rollback().await;
    }

    async fn alone(&self, member: &Member<'_>) -> Result<Written> {
        let Member { run, held, chunks, .. } = *member;
        let mut seqs = Vec::new();
        let at = Timestamp::now().as_millis();
        if !chunks.is_empty() {
            let mut attempt = 0;
            seqs = loop {
                match self.insert_indexed(run, held, chunks, at).await {
                    // Two appends of one epoch raced for the same sequence
                    // numbers; the loser inserted nothing and tries again.
                    Err(error) if is_unique_violation(&error) && attempt < SEQ_CONFLICT_RETRIES => {
                        attempt += 1;
                    }
                    other => break other?,
                }
            };
        }
        if seqs.len() == chunks.len() && !chunks.is_empty() {
            seqs.sort_unstable();
            return Ok(Written::Stored { seqs, at });
        }
        // Refused (or an empty batch): say why, from the current row.
        let fence: Option<(i64, bool)> =
            sqlx::query_as("SELECT driver_epoch, log_closed FROM runs WHERE tenant = $1 AND run_id = $2")
                .bind(run.tenant.as_str())
                .bind(run.run.as_str())
                .fetch_optional(&self.pool)
                .await?;
        let fence = fence.map(|(epoch, closed)| Fence { epoch, closed, last: 0 });
        match refusal(member, fence) {
            Some(refused) => Ok(Written::Refused(refused)),
            None if chunks.is_empty() => Ok(Written::Stored { seqs: Vec::new(), at }),
            None => Err(Error::Corrupt(format!(
                "run {}: append stored {} of {} chunks",
                run.run,
                seqs.len(),
                chunks.len()
            ))),
        }
    }
}

#[async_trait]
impl EventLog for PgStore {
    async fn append(&self, run: &RunKey, epoch: Epoch, chunks: &[NewChunk]) -> Result<Vec<Offset>> {
        // Local tailers are woken at once, not after the NOTIFY round trip.
        self.appends.append(run, epoch, chunks).await
    }

    async fn read(&self, run: &RunKey, after: &Offset) -> Result<super::ChunkStream> {
        self.log_closed_flag(run).await?;
        Ok(self.tails.follow(Arc::new(self.clone()) as Arc<dyn LogPages>, run.clone(), after.clone()))
    }

    async fn snapshot(&self, run: &RunKey) -> Result<LogSnapshot> {
        let closed = self.log_closed_flag(run).await?;
        Ok(LogSnapshot { chunks: self.snapshot_chunks(run).await?, closed })
    }

    async fn page(&self, run: &RunKey, after: &Offset, limit: usize) -> Result<Vec<StoredChunk>> {
        self.page_chunks(run, after, limit).await
    }

    async fn last(&self, run: &RunKey) -> Result<Option<StoredChunk>> {
        self.last_chunk(run).await
    }

    async fn requests(&self, run: &RunKey, filter: RequestFilter) -> Result<Vec<IndexedRequest>> {
        self.indexed_requests(run, filter).await
    }

    async fn request(&self, run: &RunKey, request_id: &str) -> Result<Option<IndexedRequest>> {
        self.indexed_request(run, request_id).await
    }

    async fn backfill_requests(&self, run: &RunKey, mark_of: &super::MarkOf) -> Result<bool> {
        self.backfill_request_index(run, mark_of).await
    }

    async fn close(&self, run: &RunKey) -> Result<()> {
        // The NOTIFY is part of the same statement, so it is sent at commit.
        let closed: Option<String> = sqlx::query_scalar(
            "WITH closed AS ( \
                 UPDATE runs SET log_closed = TRUE, updated_at = $2 WHERE tenant = $4 AND run_id = $1 \
                 RETURNING tenant, run_id \
             ) \
             SELECT run_id FROM closed, \
                 LATERAL (SELECT pg_notify($3, closed.tenant || ':' || closed.run_id)) AS notified",
        )
        .bind(run.run.as_str())
        .bind(Timestamp::now().as_millis())
        .bind(CHANNEL)
        .bind(run.tenant.as_str())
        .fetch_optional(&self.pool)
        .await?;
        if closed.is_none() {
            return Err(run_not_found(run));
        }
        tail::wake_run(&self.wakes, run);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sandhold_tests::database::ScratchDatabase;

    use super::*;
    use crate::store::{NewRun, RunId, Stores};

    /// A group whose replica stops inside its transaction (SIGSTOP, a
    /// partition) holds its runs' rows: PostgreSQL ends it after
    /// [`GROUP_IDLE_LIMIT`], so another replica's claim goes through, and
    /// the stalled group can no longer commit (nothing of it was
    /// acknowledged). Without the limit the claim waits for as long as the
    /// stopped replica's connection lives.
    #[tokio::test]
    async fn a_group_left_hanging_lets_a_claim_of_its_runs_through() {
        let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
        let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
        let stores = Stores::open(scratch.url()).await.unwrap();
        let new = NewRun::bare(RunId::parse("hang").unwrap(), "acme", "t");
        let key = new.key();
        stores.runs.create_or_resume(new).await.unwrap();

        let appends = PgAppends { pool: PgPool::connect(scratch.url()).await.unwrap() };
        let mut tx = appends.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM runs r WHERE tenant = $1 AND run_id = $2 FOR SHARE OF r")
            .bind(key.tenant.as_str())
            .bind(key.run.as_str())
            .execute(&mut *tx)
            .await
            .unwrap();
        // The group's replica stops here.
        let claimed = tokio::time::timeout(Duration::from_secs(60), stores.runs.claim(&key)).await;
        assert!(matches!(claimed, Ok(Ok(_))), "a claim waited on a stopped group: {claimed:?}");
        assert!(appends.commit(tx).await.is_err(), "the stalled group committed after the claim");

        appends.pool.close().await;
        stores.close().await;
        scratch.drop_database().await.unwrap();
    }
}
