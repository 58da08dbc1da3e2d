//! Durable state of the control plane: run records ([`RunStore`]), per-run
//! event logs ([`EventLog`]), sandbox instances ([`InstanceStore`]), sandbox
//! definitions ([`DefinitionStore`]) and API tokens ([`TokenStore`]).
//!
//! Two backends implement every trait: SQLite (the embedded default, one file
//! under the data dir) and PostgreSQL (shared by any number of replicas).
//! [`Stores::open`] picks one from the database URL and applies the embedded
//! migrations. Each trait has one conformance suite run against both.
//!
//! # Fencing
//!
//! A run is written by one driver at a time. Each successful
//! [`RunStore::claim`] bumps the run's `driver_epoch`; every append
//! ([`EventLog::append`]) and every terminal write ([`RunStore::finish`])
//! carries the writer's epoch and is applied only if it still equals the
//! record's, checked atomically with the write (see the backends for the
//! argument). Epochs only grow, so a refused epoch is refused forever: the
//! fence latches by construction. [`LogWriter`] additionally latches in
//! memory so a superseded writer stops without another round trip.

pub mod blob;
mod checkpoint;
mod checkpoint_sql;
mod error;
mod postgres;
mod sql;
mod sqlite;
mod tail;
pub mod testing;
mod writer;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod snapshot_conformance;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
pub use shared::ids::RunId;

pub use blob::{BlobStats, BlobStore, DirBlobStore, PgBlobStore};
pub use checkpoint::{Checkpoint, CheckpointStore, DeleteBlobs, Fork, NewCheckpoint, WriterClaim};
pub use error::{Error, Result};
pub use writer::LogWriter;

pub use crate::config::default_database_url;

/// A driver epoch. Bumped by every successful claim; never decreases.
pub type Epoch = u64;

/// The epoch of a freshly created run, owned by whoever created it
/// ([`CreatedRun::created`] is true). A resumer must [`RunStore::claim`].
pub const FIRST_EPOCH: Epoch = 1;

/// Read position before the first chunk of every log: `read(run,
/// FIRST_OFFSET)` yields the whole log. Clients may send it verbatim.
pub const FIRST_OFFSET: &str = "0";

/// How often a tailing [`EventLog::read`] re-checks the table when no
/// wake-up arrives (a wake-up lost to a reconnect, or an append by another
/// process on SQLite). Never faster than this.
pub const TAIL_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The tenant an object belongs to. Every record carries one; asking for
/// another tenant's object yields [`Error::NotFound`].
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Tenant(String);

impl Tenant {
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tenant({})", self.0)
    }
}

/// Wall-clock time with millisecond precision, as stored (round-trips
/// exactly through both backends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(i64);

impl Timestamp {
    pub fn now() -> Self {
        SystemTime::now().into()
    }

    pub const fn from_millis(millis_since_unix_epoch: i64) -> Self {
        Self(millis_since_unix_epoch)
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    pub fn to_system_time(self) -> SystemTime {
        if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_millis(self.0 as u64)
        } else {
            UNIX_EPOCH - Duration::from_millis(self.0.unsigned_abs())
        }
    }

    pub fn saturating_sub(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => Self(-i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX)),
        }
    }
}

// ---------------------------------------------------------------- runs

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Interrupted,
    Completed,
    Failed,
    Aborted,
}

impl RunStatus {
    pub const ALL: [RunStatus; 5] =
        [Self::Running, Self::Interrupted, Self::Completed, Self::Failed, Self::Aborted];

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Aborted)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Interrupted => "interrupted",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a run failed: a reason code (e.g. `REPLAY_DIVERGED`) and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    pub code: String,
    pub message: String,
}

/// The per-run secret that keys the journal's exit sentinel. Stored (a
/// takeover needs it to recognise the sentinel) but never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelKey(String);

impl SentinelKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// A fresh key: 32 random bytes, hex.
    pub fn random() -> Self {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut bytes);
        Self(hex::encode(bytes))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SentinelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A run's lifecycle record.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub run_id: RunId,
    pub thread_id: String,
    pub tenant: Tenant,
    pub status: RunStatus,
    pub started_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    pub error: Option<RunError>,
    /// Token usage and the like, as the harness reports it.
    pub usage: Option<serde_json::Value>,
    pub sandbox_key: Option<String>,
    /// Set when the last client left a durable run; the reaper's clock.
    pub detached_since: Option<Timestamp>,
    /// Intent only: the driver decides when the run is actually aborted.
    pub cancel_requested: bool,
    pub driver_epoch: Epoch,
    pub sentinel_key: SentinelKey,
    /// No more appends; tailers end once they have read everything.
    pub log_closed: bool,
    pub updated_at: Timestamp,
    /// What started the run (opaque to the store): harness, definition,
    /// durability. Never a secret.
    pub spec: Option<serde_json::Value>,
    /// Set on a copy made by a snapshot fork ([`CheckpointStore::fork`]):
    /// the run of the source thread it was copied from.
    pub forked_from_run: Option<RunId>,
}

/// A run id nobody chose: `run-<32 hex>`.
pub fn generated_run_id() -> RunId {
    RunId::parse(&format!("run-{}", uuid::Uuid::new_v4().simple())).expect("a valid run id")
}

/// What [`RunStore::create_or_resume`] needs to create a run.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: RunId,
    pub thread_id: String,
    pub tenant: Tenant,
    pub sentinel_key: SentinelKey,
    pub sandbox_key: Option<String>,
    pub started_at: Timestamp,
    /// See [`RunRecord::spec`].
    pub spec: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreatedRun {
    pub record: RunRecord,
    /// True when this call created the record: the caller owns
    /// [`FIRST_EPOCH`]. False when the run existed: the record is returned
    /// unchanged and the caller must claim before writing.
    pub created: bool,
}

/// Non-terminal changes to a record; `None` leaves a field as it is.
/// Not fenced: a stale driver's non-terminal write cannot make a live run
/// look finished, and the current driver overwrites it anyway.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunUpdate {
    /// `running` or `interrupted` only; terminal statuses go through
    /// [`RunStore::finish`]. Refused with [`Error::RunTerminal`] once the run
    /// is terminal.
    pub status: Option<RunStatus>,
    pub sandbox_key: Option<Option<String>>,
    pub detached_since: Option<Option<Timestamp>>,
    pub usage: Option<serde_json::Value>,
}

/// A terminal status write, fenced by the writer's epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct RunFinish {
    /// `completed`, `failed` or `aborted`.
    pub status: RunStatus,
    pub error: Option<RunError>,
    /// Replaces the stored usage when set.
    pub usage: Option<serde_json::Value>,
    pub finished_at: Timestamp,
}

/// Run lifecycle records. Operations taking a [`Tenant`] serve the API and
/// treat another tenant's run as unknown; the others serve the driver and the
/// reaper, which act for every tenant.
#[async_trait]
pub trait RunStore: Send + Sync {
    /// Create the run, or return the existing record unchanged. A run id that
    /// exists under another tenant is [`Error::AlreadyExists`].
    async fn create_or_resume(&self, new: NewRun) -> Result<CreatedRun>;

    async fn get(&self, tenant: &Tenant, run: &RunId) -> Result<RunRecord>;

    /// The record whatever its tenant (driver, reaper).
    async fn get_unscoped(&self, run: &RunId) -> Result<RunRecord>;

    async fn update(&self, run: &RunId, update: RunUpdate) -> Result<RunRecord>;

    /// Take over the run: bump its epoch and return the record carrying the
    /// new one. Refuses terminal runs ([`Error::RunTerminal`]) and unknown
    /// ones ([`Error::NotFound`]). Two racing claims get distinct epochs; the
    /// lower one is already superseded.
    async fn claim(&self, run: &RunId) -> Result<RunRecord>;

    /// Write a terminal status, only if `epoch` is the current epoch
    /// ([`Error::Fenced`] otherwise: the write is suppressed) and the run is
    /// not terminal yet ([`Error::RunTerminal`]).
    async fn finish(&self, run: &RunId, epoch: Epoch, finish: RunFinish) -> Result<RunRecord>;

    /// Record that the tenant asked to cancel the run. Writes no status: only
    /// the driver knows when the agent is gone. A terminal run is returned
    /// unchanged.
    async fn request_cancel(&self, tenant: &Tenant, run: &RunId) -> Result<RunRecord>;

    /// The newest non-terminal run of the thread.
    async fn active_run(&self, tenant: &Tenant, thread_id: &str) -> Result<Option<RunRecord>>;

    /// Runs of the thread, oldest first.
    async fn list_by_thread(&self, tenant: &Tenant, thread_id: &str) -> Result<Vec<RunRecord>>;

    /// The tenant's newest `limit` runs, newest first.
    async fn list_recent(&self, tenant: &Tenant, limit: u32) -> Result<Vec<RunRecord>>;

    /// Runs still `running` and detached at or before `cutoff` (inclusive),
    /// oldest detachment first, across all tenants.
    async fn list_reclaimable(&self, cutoff: Timestamp) -> Result<Vec<RunRecord>>;

    /// Runs still `running` and not detached, across all tenants, oldest
    /// start first, at most `limit`: the reaper looks among them for runs
    /// no replica drives (their driver died with no client left).
    async fn list_undetached_running(&self, limit: u32) -> Result<Vec<RunRecord>>;

    /// Runs not terminal yet whose sandbox is `sandbox_key`, across all
    /// tenants: the reaper keeps a sandbox some run still lives in.
    async fn unfinished_in_sandbox(&self, sandbox_key: &str) -> Result<Vec<RunRecord>>;
}

// ---------------------------------------------------------------- event log

/// A position in a run's log, minted by the store. Opaque to clients: they
/// get it with each chunk and hand it back to resume after that chunk.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Offset(u64);

impl Offset {
    /// The position before the first chunk ([`FIRST_OFFSET`]).
    pub const fn start() -> Self {
        Self(0)
    }

    /// Parse an offset a client sent back.
    pub fn parse(s: &str) -> Result<Self> {
        if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::invalid("offset", format!("{s:?} is not an offset this store minted")));
        }
        s.parse::<u64>()
            .ok()
            .filter(|n| i64::try_from(*n).is_ok())
            .map(Self)
            .ok_or_else(|| Error::invalid("offset", format!("{s:?} is out of range")))
    }

    pub(crate) fn from_seq(seq: i64) -> Result<Self> {
        u64::try_from(seq).map(Self).map_err(|_| Error::Corrupt(format!("negative event sequence {seq}")))
    }

    /// The stored sequence number (0 = before the first chunk).
    pub(crate) fn seq(&self) -> i64 {
        // Offsets come from `parse` or `from_seq`, both within i64.
        self.0 as i64
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Offset({})", self.0)
    }
}

/// A chunk to append. The log does not interpret it: `kind` names the event
/// type, `payload` is its encoding (the event model's choice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChunk {
    pub kind: String,
    pub payload: Vec<u8>,
}

impl NewChunk {
    pub fn new(kind: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self { kind: kind.into(), payload: payload.into() }
    }
}

/// A chunk as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChunk {
    pub offset: Offset,
    /// The epoch of the driver that appended it.
    pub epoch: Epoch,
    pub kind: String,
    pub payload: Vec<u8>,
    pub appended_at: Timestamp,
}

/// What a log holds right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSnapshot {
    pub chunks: Vec<StoredChunk>,
    pub closed: bool,
}

/// Chunks in log order; ends after the last chunk of a closed log. An error
/// item ends the stream; resume with `read` after the last offset seen.
pub type ChunkStream = BoxStream<'static, Result<StoredChunk>>;

/// Per-run append-only event logs. A log belongs to its run record: the
/// record carries the fencing epoch and the closed flag.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Append `chunks` in order, in one transaction, and return one offset
    /// per chunk. Refused with [`Error::Fenced`] unless `epoch` is the run's
    /// current epoch, atomically with respect to a concurrent claim: nothing
    /// of a superseded writer lands after the claim that superseded it.
    /// [`Error::LogClosed`] after [`EventLog::close`]. Drivers append through
    /// a [`LogWriter`].
    async fn append(&self, run: &RunId, epoch: Epoch, chunks: &[NewChunk]) -> Result<Vec<Offset>>;

    /// Everything after `after`, then new appends as they land (from this
    /// process or any other), ending once the log is closed and read to its
    /// end. [`Error::NotFound`] up front for an unknown run.
    async fn read(&self, run: &RunId, after: &Offset) -> Result<ChunkStream>;

    /// What is stored now, without waiting for anything.
    async fn snapshot(&self, run: &RunId) -> Result<LogSnapshot>;

    /// Close the log: later appends are refused and tailers end. Not fenced
    /// (teardown must always be able to release tailers); idempotent. A
    /// driver closes only after its terminal write went through (or the run
    /// is known terminal): closing is final, also for a successor.
    async fn close(&self, run: &RunId) -> Result<()>;
}

// ---------------------------------------------------------------- instances

/// A sandbox the control plane provisioned, by sandbox key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub sandbox_key: String,
    pub tenant: Tenant,
    /// The provider's name (`local`, `docker`, ...).
    pub provider: String,
    /// The provider's own id (container id, directory, ...).
    pub provider_sandbox_id: String,
    /// The latest provider-native snapshot (e.g. a committed image).
    pub native_snapshot: Option<String>,
    /// The definition and thread the sandbox was ensured for.
    pub definition_id: String,
    pub thread_id: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInstance {
    pub sandbox_key: String,
    pub tenant: Tenant,
    pub provider: String,
    pub provider_sandbox_id: String,
    pub native_snapshot: Option<String>,
    pub definition_id: String,
    pub thread_id: String,
}

#[async_trait]
pub trait InstanceStore: Send + Sync {
    /// Insert or replace by sandbox key; `created_at` survives a replace.
    async fn put(&self, instance: NewInstance) -> Result<Instance>;

    /// Whatever its tenant: callers serving a tenant compare
    /// [`Instance::tenant`] and answer NOT_FOUND on a mismatch.
    async fn get(&self, sandbox_key: &str) -> Result<Instance>;

    async fn set_native_snapshot(&self, sandbox_key: &str, snapshot: Option<String>) -> Result<Instance>;

    /// All instances, or one tenant's, by sandbox key.
    async fn list(&self, tenant: Option<&Tenant>) -> Result<Vec<Instance>>;

    /// True if it existed.
    async fn delete(&self, sandbox_key: &str) -> Result<bool>;
}

// ---------------------------------------------------------------- definitions

/// A sandbox definition as a tenant stored it. The store keeps exactly the
/// JSON it is given; keeping secret values out is the API layer's job.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub tenant: Tenant,
    pub id: String,
    pub body: serde_json::Value,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[async_trait]
pub trait DefinitionStore: Send + Sync {
    /// Insert or replace; `created_at` survives a replace.
    async fn put(&self, tenant: &Tenant, id: &str, body: serde_json::Value) -> Result<Definition>;

    async fn get(&self, tenant: &Tenant, id: &str) -> Result<Definition>;

    /// The tenant's definitions by id.
    async fn list(&self, tenant: &Tenant) -> Result<Vec<Definition>>;

    /// True if it existed.
    async fn delete(&self, tenant: &Tenant, id: &str) -> Result<bool>;
}

// ---------------------------------------------------------------- tokens

/// API bearer tokens. Only the SHA-256 of a token is stored.
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Map `token` to `tenant` (idempotent). A token already mapped to
    /// another tenant is [`Error::AlreadyExists`].
    async fn put_token(&self, tenant: &Tenant, token: &str) -> Result<()>;

    async fn tenant_for_token(&self, token: &str) -> Result<Option<Tenant>>;

    /// Tenants having at least one token, sorted.
    async fn list_tenants(&self) -> Result<Vec<Tenant>>;

    /// True if it existed.
    async fn delete_token(&self, token: &str) -> Result<bool>;
}

/// Hex SHA-256 of a token: the only form a token is stored in.
pub(crate) fn token_hash(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

// ---------------------------------------------------------------- bundle

/// Every store over one database.
#[derive(Clone)]
pub struct Stores {
    pub runs: Arc<dyn RunStore>,
    pub events: Arc<dyn EventLog>,
    pub instances: Arc<dyn InstanceStore>,
    pub definitions: Arc<dyn DefinitionStore>,
    pub tokens: Arc<dyn TokenStore>,
    /// Portable snapshot checkpoints, heads and blob references.
    pub checkpoints: Arc<dyn CheckpointStore>,
    /// Portable snapshot blobs: a directory beside the SQLite file, or a
    /// table of the PostgreSQL database.
    pub blobs: Arc<dyn BlobStore>,
    pool: Pool,
}

#[derive(Clone)]
enum Pool {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Stores {
    /// Connect to `database_url` (`sqlite://<path>`, `postgres://...` or
    /// `postgresql://...`) and apply the embedded migrations. A SQLite file
    /// and its parent directory are created. On PostgreSQL this also starts
    /// the LISTEN task that wakes tailers (needs a Tokio runtime); it stops
    /// when the last clone of the stores is dropped.
    pub async fn open(database_url: &str) -> Result<Stores> {
        if database_url.starts_with("sqlite:") {
            sqlite::open(database_url).await
        } else if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
            postgres::open(database_url).await
        } else {
            Err(Error::invalid("database_url", "expected sqlite://<path> or postgres://..."))
        }
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend_name(&self) -> &'static str {
        match self.pool {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }

    /// One round trip to the database (for health).
    pub async fn ping(&self) -> Result<()> {
        match &self.pool {
            Pool::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
            Pool::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
        }
        Ok(())
    }

    /// How many runs are `running` and `interrupted` right now, across
    /// tenants (for the metrics endpoint). Statuses without runs are 0.
    pub async fn count_unfinished_runs(&self) -> Result<Vec<(RunStatus, i64)>> {
        const QUERY: &str = "SELECT status, COUNT(*) FROM runs \
             WHERE status IN ('running', 'interrupted') GROUP BY status";
        let rows: Vec<(String, i64)> = match &self.pool {
            Pool::Sqlite(pool) => sqlx::query_as(QUERY).fetch_all(pool).await?,
            Pool::Postgres(pool) => sqlx::query_as(QUERY).fetch_all(pool).await?,
        };
        Ok([RunStatus::Running, RunStatus::Interrupted]
            .into_iter()
            .map(|status| {
                let n = rows.iter().find(|(s, _)| s == status.as_str()).map_or(0, |(_, n)| *n);
                (status, n)
            })
            .collect())
    }

    /// Close the connections (graceful shutdown). Tailing reads end with an
    /// error afterwards.
    pub async fn close(&self) {
        match &self.pool {
            Pool::Sqlite(pool) => pool.close().await,
            Pool::Postgres(pool) => pool.close().await,
        }
    }
}
