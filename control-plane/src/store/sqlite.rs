//! The SQLite backend: the embedded default, one file in WAL mode.
//!
//! Fencing: SQLite runs one writer at a time, across processes. An append
//! opens its transaction with `BEGIN IMMEDIATE`, which takes the write lock
//! before the epoch is read, so no claim (an `UPDATE` of the run row, itself
//! a writer) can commit between the check and the insert.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::checkpoint_sql::{
    CheckpointRow, REFS_PER_INSERT, checkpoint_columns, checkpoint_not_found, impl_checkpoint_store,
    new_checkpoint_id, to_db,
};
use super::requests_sql::{RequestRow, impl_request_index, index_marks, index_requests, request_select};
use super::sql::{
    DefinitionRow, EventRow, InstanceRow, RunRow, epoch_to_db, explain_refusal, impl_shared_stores,
    instance_columns, json_to_db, not_terminal, run_columns, run_not_found, terminal,
};
use super::tail::{self, LogPages, Wakes};
use super::{
    Admitted, CreatedRun, Definition, DefinitionStore, Epoch, Error, EventLog, FIRST_EPOCH, IndexedRequest,
    Instance, InstanceStore, LogSnapshot, NewChunk, NewInstance, NewRun, Offset, Pool, RequestFilter, Result,
    RunFinish, RunKey, RunRecord, RunStore, RunUpdate, StoredChunk, Stores, TAIL_POLL_INTERVAL, Tenant,
    Timestamp, TokenStore, token_hash,
};

/// Rows per INSERT statement; SQLite caps bound parameters per statement.
const ROWS_PER_INSERT: usize = 1000;

#[derive(Clone)]
pub(super) struct SqliteStore {
    pool: SqlitePool,
    /// In-process wake-ups; other processes' appends are seen by the poll.
    wakes: Wakes,
}

pub(super) async fn open(database_url: &str) -> Result<Stores> {
    let options = SqliteConnectOptions::from_str(database_url)
        .map_err(|e| Error::invalid("database_url", e.to_string()))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // Every committed append survives a power loss, not only a crash.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(30))
        .foreign_keys(true);
    let path = options.get_filename().to_path_buf();
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
        && !path.to_string_lossy().contains(":memory:")
    {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::Unavailable(format!("creating {}: {e}", parent.display())))?;
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await?;
    sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
    let store = Arc::new(SqliteStore { pool: pool.clone(), wakes: tail::wakes() });
    // Blobs live beside the database file, under the data dir.
    let blob_dir = if path.to_string_lossy().contains(":memory:") || path.as_os_str().is_empty() {
        std::env::temp_dir().join(format!("sandhold-snapshot-blobs-{}", uuid::Uuid::new_v4().simple()))
    } else {
        path.parent().unwrap_or(std::path::Path::new(".")).join("snapshot-blobs")
    };
    let blobs = super::DirBlobStore::open(&blob_dir)?;
    if blobs.has_legacy_blobs()? {
        adopt_legacy_blobs(&pool, &blobs).await?;
    }
    let blobs: Arc<dyn super::BlobStore> = Arc::new(blobs);
    Ok(Stores {
        runs: store.clone(),
        events: store.clone(),
        instances: store.clone(),
        definitions: store.clone(),
        tokens: store.clone(),
        checkpoints: store,
        blobs,
        pool: Pool::Sqlite(pool),
    })
}

/// Blobs of the global layout (before blobs were per tenant) go to the
/// tenants whose checkpoints reference them (see `0014_tenant_blobs.sql`).
async fn adopt_legacy_blobs(pool: &SqlitePool, blobs: &super::DirBlobStore) -> Result<()> {
    let owners: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT c.tenant, r.sha256 FROM snapshot_blob_refs r \
         JOIN snapshot_checkpoints c ON c.checkpoint_id = r.checkpoint_id",
    )
    .fetch_all(pool)
    .await?;
    let owners: Vec<super::BlobKey> = owners
        .into_iter()
        .map(|(tenant, sha256)| super::BlobKey { tenant: Tenant::new(tenant), sha256 })
        .collect();
    let adopted = blobs.adopt_legacy(&owners).await?;
    tracing::info!(blobs = adopted, "snapshot blobs moved to per-tenant directories");
    Ok(())
}

impl_shared_stores!(SqliteStore, sqlx::Sqlite);
impl_request_index!(SqliteStore, begin: "BEGIN IMMEDIATE", for_update: "");

impl SqliteStore {
    /// Nothing to take: the count and the insert are one write statement,
    /// and SQLite runs one writer at a time.
    async fn lock_tenant_runs(_tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>, _tenant: &Tenant) -> Result<()> {
        Ok(())
    }
}
impl_checkpoint_store!(SqliteStore, sqlx::Sqlite, begin: "BEGIN IMMEDIATE", for_update: "",
    sweep_lock: "SELECT 1", pin_lock: "SELECT 1");

impl SqliteStore {
    /// The body of [`EventLog::append`] inside its transaction, COMMIT
    /// included: the sequence number the appended chunks follow.
    async fn append_in(
        &self,
        conn: &mut sqlx::pool::PoolConnection<sqlx::Sqlite>,
        run: &RunKey,
        held: i64,
        epoch: Epoch,
        chunks: &[NewChunk],
    ) -> Result<i64> {
        let fence: Option<(i64, bool)> =
            sqlx::query_as("SELECT driver_epoch, log_closed FROM runs WHERE tenant = $1 AND run_id = $2")
                .bind(run.tenant.as_str())
                .bind(run.run.as_str())
                .fetch_optional(&mut **conn)
                .await?;
        match fence {
            None => return Err(run_not_found(run)),
            Some((current, _)) if current != held => {
                return Err(Error::Fenced {
                    run: run.run.to_string(),
                    held: epoch,
                    current: current as Epoch,
                });
            }
            Some((_, true)) => return Err(Error::LogClosed(run.run.to_string())),
            Some(_) => {}
        }
        let last: i64 = sqlx::query_scalar(
            "SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE tenant = $1 AND run_id = $2",
        )
        .bind(run.tenant.as_str())
        .bind(run.run.as_str())
        .fetch_one(&mut **conn)
        .await?;
        let now = Timestamp::now().as_millis();
        for (group_index, group) in chunks.chunks(ROWS_PER_INSERT).enumerate() {
            let first_seq = last + 1 + (group_index * ROWS_PER_INSERT) as i64;
            let mut insert = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                "INSERT INTO run_events (tenant, run_id, seq, epoch, kind, payload, appended_at) ",
            );
            insert.push_values(group.iter().enumerate(), |mut row, (i, chunk)| {
                row.push_bind(run.tenant.as_str())
                    .push_bind(run.run.as_str())
                    .push_bind(first_seq + i as i64)
                    .push_bind(held)
                    .push_bind(chunk.kind.as_str())
                    .push_bind(chunk.payload.as_slice())
                    .push_bind(now);
            });
            insert.build().execute(&mut **conn).await?;
        }
        index_requests!((*conn), run, chunks, (1..=chunks.len() as i64).map(|i| last + i));
        sqlx::query("COMMIT").execute(&mut **conn).await?;
        Ok(last)
    }
}

/// After a failed step of a transaction begun by hand: roll it back, and
/// if even that fails (other than because SQLite rolled it back itself, as
/// it does on a full disk), close the connection rather than hand the pool
/// one in an unknown state.
async fn end_failed_transaction(mut conn: sqlx::pool::PoolConnection<sqlx::Sqlite>) {
    if let Err(e) = sqlx::query("ROLLBACK").execute(&mut *conn).await
        && !e.to_string().contains("no transaction is active")
    {
        tracing::debug!(error = %e, "closing a connection whose transaction could not be rolled back");
        let _ = conn.close().await;
    }
}

#[async_trait]
impl EventLog for SqliteStore {
    async fn append(&self, run: &RunKey, epoch: Epoch, chunks: &[NewChunk]) -> Result<Vec<Offset>> {
        let held = epoch_to_db(epoch)?;
        // The transaction by hand, not sqlx's: a COMMIT that fails on a
        // full disk leaves sqlx's count of open transactions at one on a
        // connection SQLite has already rolled back, and every later
        // `begin` on it fails ("non-zero transaction depth").
        let mut conn = self.pool.acquire().await?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
        match self.append_in(&mut conn, run, held, epoch, chunks).await {
            Ok(last) => {
                if !chunks.is_empty() {
                    tail::wake_run(&self.wakes, run);
                }
                (1..=chunks.len() as i64).map(|i| Offset::from_seq(last + i)).collect()
            }
            Err(e) => {
                end_failed_transaction(conn).await;
                Err(e)
            }
        }
    }

    async fn read(&self, run: &RunKey, after: &Offset) -> Result<super::ChunkStream> {
        // Unknown runs fail here rather than inside the stream.
        self.log_closed_flag(run).await?;
        Ok(tail::follow(
            Arc::new(self.clone()) as Arc<dyn LogPages>,
            &self.wakes,
            run.clone(),
            after.clone(),
            TAIL_POLL_INTERVAL,
        ))
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
        let closed = sqlx::query(
            "UPDATE runs SET log_closed = TRUE, updated_at = $2 WHERE tenant = $3 AND run_id = $1",
        )
        .bind(run.run.as_str())
        .bind(Timestamp::now().as_millis())
        .bind(run.tenant.as_str())
        .execute(&self.pool)
        .await?
        .rows_affected();
        if closed == 0 {
            return Err(run_not_found(run));
        }
        tail::wake_run(&self.wakes, run);
        Ok(())
    }
}
