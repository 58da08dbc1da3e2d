//! The SQLite backend: the embedded default, one file in WAL mode.
//!
//! Fencing: SQLite runs one writer at a time, across processes. A group of
//! appends ([`group`](super::group)) opens its transaction with `BEGIN
//! IMMEDIATE`, which takes the write lock before the epochs are read, so no
//! claim (an `UPDATE` of a run row, itself a writer) can commit between the
//! checks and the inserts.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::checkpoint_sql::{
    CheckpointRow, REFS_PER_INSERT, checkpoint_columns, checkpoint_not_found, copy_checkpoint_as_head,
    copy_run, impl_checkpoint_store, lock_thread_head, new_checkpoint_id, to_db,
};
use super::group::{
    Committer, Fence, GroupCommit, GroupLog, Member, RUNS_PER_QUERY, Written, read_fences, runs_of,
    write_group, write_planned,
};
use super::requests_sql::{RequestRow, impl_request_index, index_marks, index_requests, request_select};
use super::sql::{
    DefinitionRow, EventRow, InstanceRow, NodeRow, RunRow, epoch_to_db, explain_refusal, impl_shared_stores,
    instance_columns, json_to_db, node_columns, not_terminal, run_columns, run_not_found, terminal,
};
use super::tail::{self, LogPages, Tails, Wakes};
use super::{
    Admitted, CreatedRun, Definition, DefinitionStore, Epoch, Error, EventLog, FIRST_EPOCH, IndexedRequest,
    Instance, InstanceStore, LogSnapshot, NewChunk, NewInstance, NewNode, NewRun, NodeRecord, NodeStore,
    Offset, Pool, RequestFilter, Result, RunFinish, RunKey, RunRecord, RunStore, RunUpdate, StoredChunk,
    Stores, TAIL_POLL_INTERVAL, Tenant, Timestamp, TokenStore, token_hash,
};

#[derive(Clone)]
pub(super) struct SqliteStore {
    pool: SqlitePool,
    /// In-process wake-ups; other processes' appends are seen by the poll.
    wakes: Wakes,
    tails: Tails,
    appends: Committer<SqliteAppends>,
}

/// Connections of the store's pool. The appends have one of their own:
/// readers (a thousand streams' catch-up pages) cannot take it, the
/// committer writes one group at a time, and its page cache and its
/// [`FenceCache`] stay warm from one group to the next.
const POOL_CONNECTIONS: u32 = 8;

/// The appends' connection's page cache (KiB): a group of 500 runs touches
/// a leaf page of `run_events` per run, and their parents (SQLite's default
/// of 2 MiB would evict them between groups).
const APPEND_CACHE_KIB: u32 = 8 << 10;

pub(super) async fn open(database_url: &str, grouping: GroupCommit) -> Result<Stores> {
    let options = SqliteConnectOptions::from_str(database_url)
        .map_err(|e| Error::invalid("database_url", e.to_string()))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // Every committed append survives a power loss, not only a crash.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(30))
        .foreign_keys(true)
        // A group of appends to many runs dirties a page per run; a longer
        // WAL between checkpoints writes a hot page back once, not per group.
        .pragma("wal_autocheckpoint", "16384");
    let path = options.get_filename().to_path_buf();
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
        && !path.to_string_lossy().contains(":memory:")
    {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::Unavailable(format!("creating {}: {e}", parent.display())))?;
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(POOL_CONNECTIONS)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options.clone())
        .await?;
    sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
    // Without grouping every append is a transaction in its caller's task,
    // as before group commit (the benchmarks' baseline): the store's pool.
    let (append_pool, cache) = match grouping {
        GroupCommit::Off => (pool.clone(), None),
        GroupCommit::Grouped { .. } => {
            let cache = CachedFences::default();
            let connections = cache.connections.clone();
            let append_pool = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(30))
                .after_connect(move |_, _| {
                    connections.fetch_add(1, Ordering::AcqRel);
                    Box::pin(async { Ok(()) })
                })
                .connect_with(
                    options
                        .clone()
                        // No foreign-key lookup of the run per inserted
                        // row: a group reads (or keeps, until another
                        // connection commits) every member's run row under
                        // the write lock and refuses a run that is not
                        // there, which is the same check once a member.
                        .foreign_keys(false)
                        .pragma("cache_size", format!("-{APPEND_CACHE_KIB}"))
                        // A group's INSERT keeps its statement journal (a
                        // page per run) in memory, not in a temporary file.
                        .pragma("temp_store", "MEMORY"),
                )
                .await?;
            (append_pool, Some(cache))
        }
    };
    let wakes = tail::wakes();
    let tails = Tails::new(&wakes, TAIL_POLL_INTERVAL);
    let appends =
        Committer::start(SqliteAppends { pool: append_pool.clone(), cache }, tails.clone(), grouping);
    let store = Arc::new(SqliteStore { pool: pool.clone(), wakes, tails, appends });
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
        warm: store.clone(),
        attempts: store.clone(),
        nodes: store.clone(),
        checkpoints: store,
        blobs,
        pool: Pool::Sqlite(pool),
        append_pool: Pool::Sqlite(append_pool),
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

super::attempts::impl_attempt_store!(SqliteStore, begin: "BEGIN IMMEDIATE");
super::warm::impl_warm_store!(SqliteStore, skip_locked: "");
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

/// The appends of a SQLite store ([`group`](super::group)): the group's
/// transaction under `BEGIN IMMEDIATE`, which takes the database's one write
/// lock before any fence is read, so no claim (an `UPDATE` of a run row,
/// itself a writer) commits between a member's check and its insert.
pub(super) struct SqliteAppends {
    pool: SqlitePool,
    /// Grouped: the fences of the committer's one connection. `None` when
    /// every append is a transaction of its own on the shared pool.
    cache: Option<CachedFences>,
}

/// The fences a group read or wrote, for the next group on the same
/// connection: they hold as long as no other connection committed, which
/// is when SQLite's `PRAGMA data_version` on this connection changes (a
/// claim bumping an epoch, a close, a delete, another process's append all
/// commit on other connections). Read under the write lock, so nothing can
/// commit between that check and the group's COMMIT. A group then reads
/// only the fences of runs it has not seen, instead of every member's
/// (half of a group's statements' time with 500 runs).
#[derive(Default)]
struct CachedFences {
    /// Connections the appends' pool has opened: a replaced connection
    /// counts its `data_version` anew, so a fence seen on the last one is
    /// not trusted on it.
    connections: Arc<AtomicU64>,
    cache: std::sync::Mutex<FenceCache>,
}

#[derive(Default)]
struct FenceCache {
    /// The connection and its `data_version` the fences hold for.
    seen: Option<(u64, i64)>,
    fences: HashMap<RunKey, Fence>,
}

/// Runs whose fences are kept at most; past that the cache starts over
/// (runs end, and their entries would otherwise stay).
const CACHED_FENCES: usize = 16_384;

impl CachedFences {
    /// The fences that hold at `seen`, taken out: a write that fails
    /// half-way leaves the cache empty.
    fn take(&self, seen: (u64, i64)) -> HashMap<RunKey, Fence> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let fences = std::mem::take(&mut cache.fences);
        if cache.seen.replace(seen) == Some(seen) { fences } else { HashMap::new() }
    }

    /// The fences after a written group, good once it commits.
    fn keep(&self, fences: HashMap<RunKey, Fence>) {
        if fences.len() <= CACHED_FENCES {
            self.cache.lock().unwrap_or_else(|e| e.into_inner()).fences = fences;
        }
    }

    /// After a COMMIT or a statement that failed: nothing kept holds.
    fn forget(&self) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.seen = None;
        cache.fences.clear();
    }
}

#[async_trait]
impl GroupLog for SqliteAppends {
    // The transaction by hand, not sqlx's: a COMMIT that fails on a full
    // disk leaves sqlx's count of open transactions at one on a connection
    // SQLite has already rolled back, and every later `begin` on it fails
    // ("non-zero transaction depth").
    type Tx = sqlx::pool::PoolConnection<sqlx::Sqlite>;

    async fn begin(&self) -> Result<Self::Tx> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
        Ok(conn)
    }

    async fn write(&self, conn: &mut Self::Tx, members: &[Member<'_>]) -> Result<Vec<Written>> {
        let Some(cache) = &self.cache else {
            return Ok(write_group!(sqlx::Sqlite, conn, members, lock: ""));
        };
        let (version,): (i64,) = sqlx::query_as("PRAGMA data_version").fetch_one(&mut **conn).await?;
        let mut fences = cache.take((cache.connections.load(Ordering::Acquire), version));
        let unseen: Vec<&RunKey> =
            runs_of(members).into_iter().filter(|run| !fences.contains_key(*run)).collect();
        for runs in unseen.chunks(RUNS_PER_QUERY) {
            read_fences!(sqlx::Sqlite, &mut **conn, runs, fences, lock: "");
        }
        let written = write_planned!(sqlx::Sqlite, conn, members, &fences);
        for (member, written) in members.iter().zip(&written) {
            if let (Written::Stored { seqs, .. }, Some(fence)) = (written, fences.get_mut(member.run))
                && let Some(&last) = seqs.last()
            {
                fence.last = last;
            }
        }
        cache.keep(fences);
        Ok(written)
    }

    async fn commit(&self, mut conn: Self::Tx) -> Result<()> {
        if let Err(e) = sqlx::query("COMMIT").execute(&mut *conn).await {
            self.forget();
            end_failed_transaction(conn).await;
            return Err(e.into());
        }
        Ok(())
    }

    async fn abandon(&self, conn: Self::Tx) {
        self.forget();
        end_failed_transaction(conn).await;
    }
}

impl SqliteAppends {
    fn forget(&self) {
        if let Some(cache) = &self.cache {
            cache.forget();
        }
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
        self.appends.append(run, epoch, chunks).await
    }

    async fn read(&self, run: &RunKey, after: &Offset) -> Result<super::ChunkStream> {
        // Unknown runs fail here rather than inside the stream.
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
