//! Run records and their store ([`RunStore`]): create, claim (the fence), update, finish.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Epoch, Result, RunId, Tenant, Timestamp};

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

/// Which run: run ids are a namespace per tenant (two tenants may each
/// have a run `r1`, with separate records and logs), so a run is named by
/// both. Every store call on one run or its log takes its key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunKey {
    pub tenant: Tenant,
    pub run: RunId,
}

impl RunKey {
    pub fn new(tenant: Tenant, run: RunId) -> Self {
        Self { tenant, run }
    }

    /// `<tenant>:<run id>`, where one string must name the run (lease
    /// names, cancel announcements, log wake-ups). Unambiguous: a run id
    /// has no `:`, so [`RunKey::decode`] splits at the last one.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.tenant, self.run)
    }

    pub fn decode(encoded: &str) -> Option<Self> {
        let (tenant, run) = encoded.rsplit_once(':')?;
        if tenant.is_empty() {
            return None;
        }
        Some(Self { tenant: Tenant::new(tenant), run: RunId::parse(run).ok()? })
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
    /// Set on a copy made by a snapshot fork ([`CheckpointStore::fork`](super::CheckpointStore::fork)):
    /// the run of the source thread it was copied from.
    pub forked_from_run: Option<RunId>,
    /// The harness session the run worked in, written with its end.
    pub session_id: Option<String>,
}

impl RunRecord {
    pub fn key(&self) -> RunKey {
        RunKey::new(self.tenant.clone(), self.run_id.clone())
    }
}

/// Which of a tenant's runs [`RunStore::list_page`] returns; every field
/// set narrows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub thread_id: Option<String>,
    pub status: Option<RunStatus>,
    /// Contained in the run id, the thread id or the stored spec (harness,
    /// definition, command, prompt), ASCII case ignored.
    pub text: Option<String>,
    /// Only runs listed after this one: started earlier, or at the same
    /// millisecond with a smaller run id (a page's last run).
    pub after: Option<(Timestamp, RunId)>,
}

impl RunFilter {
    /// [`text`](Self::text) as a `LIKE ... ESCAPE '\'` pattern over the
    /// lowercased columns. The spec is JSON text, so the needle is matched
    /// as JSON writes it (a quote in a prompt is `\"` there).
    pub fn like_pattern(&self) -> Option<String> {
        let text = self.text.as_deref().filter(|t| !t.is_empty())?;
        let json = serde_json::to_string(&text.to_ascii_lowercase()).expect("a string serializes");
        let needle = &json[1..json.len() - 1];
        let mut pattern = String::with_capacity(needle.len() + 2);
        pattern.push('%');
        for c in needle.chars() {
            if matches!(c, '%' | '_' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('%');
        Some(pattern)
    }
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
    /// The definition the run starts under, kept in a column of its own so
    /// that definitions nothing names any more can be found
    /// ([`DefinitionStore::delete_unused_derived`](super::DefinitionStore::delete_unused_derived)).
    pub definition_id: Option<String>,
}

impl NewRun {
    /// A run with nothing but its identity, started now: no sandbox, no
    /// spec. What the log and the run store need, and no more.
    pub fn bare(run_id: RunId, tenant: &str, thread_id: &str) -> Self {
        Self {
            run_id,
            thread_id: thread_id.into(),
            tenant: Tenant::new(tenant),
            sentinel_key: SentinelKey::new("k"),
            sandbox_key: None,
            started_at: Timestamp::now(),
            spec: None,
            definition_id: None,
        }
    }

    pub fn key(&self) -> RunKey {
        RunKey::new(self.tenant.clone(), self.run_id.clone())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreatedRun {
    pub record: RunRecord,
    /// True when this call created the record: the caller owns
    /// [`FIRST_EPOCH`](super::FIRST_EPOCH). False when the run existed: the record is returned
    /// unchanged and the caller must claim before writing.
    pub created: bool,
}

/// What [`RunStore::create_within`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    /// Created, or the existing record (as [`RunStore::create_or_resume`]).
    Run(CreatedRun),
    /// Nothing written: the tenant has `unfinished` runs not terminal, at
    /// or over the limit.
    Full { unfinished: u64 },
}

/// Non-terminal changes to a record; `None` leaves a field as it is.
/// Not fenced: a stale driver's non-terminal write cannot make a live run
/// look finished, and the current driver overwrites it anyway.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunUpdate {
    /// `running` or `interrupted` only; terminal statuses go through
    /// [`RunStore::finish`]. Refused with [`Error::RunTerminal`](super::Error::RunTerminal) once the run
    /// is terminal.
    pub status: Option<RunStatus>,
    pub sandbox_key: Option<Option<String>>,
    /// Setting it (`Some(Some(_))`) is refused with
    /// [`Error::RunTerminal`](super::Error::RunTerminal) once the run is
    /// terminal; clearing it is not.
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
    /// The harness session the run worked in; kept as stored when `None`.
    pub session_id: Option<String>,
}

/// Run lifecycle records, keyed by [`RunKey`]: a run of another tenant is
/// as unknown as a run nobody has. Operations on one run take its key; the
/// listings taking a [`Tenant`] serve the API, the others the reaper, which
/// acts for every tenant.
#[async_trait]
pub trait RunStore: Send + Sync {
    /// Create the run, or return the existing record of the tenant's run
    /// unchanged. Another tenant's run with the same id is no conflict.
    async fn create_or_resume(&self, new: NewRun) -> Result<CreatedRun> {
        match self.create_within(new, None).await? {
            Admitted::Run(created) => Ok(created),
            Admitted::Full { .. } => Err(super::Error::Corrupt("a run refused without a limit".into())),
        }
    }

    /// As [`create_or_resume`](Self::create_or_resume), but a new run only
    /// while the tenant has fewer than `max_unfinished` runs not terminal
    /// (`None`: no limit). The count and the insert are one step against
    /// every other `create_within` of the tenant, on any replica: SQLite
    /// runs them in one write statement (one writer at a time), PostgreSQL
    /// under a transaction-scoped advisory lock on the tenant.
    async fn create_within(&self, new: NewRun, max_unfinished: Option<u32>) -> Result<Admitted>;

    async fn get(&self, run: &RunKey) -> Result<RunRecord>;

    async fn update(&self, run: &RunKey, update: RunUpdate) -> Result<RunRecord>;

    /// Take over the run: bump its epoch and return the record carrying the
    /// new one. Refuses terminal runs ([`Error::RunTerminal`](super::Error::RunTerminal)) and unknown
    /// ones ([`Error::NotFound`](super::Error::NotFound)). Two racing claims get distinct epochs; the
    /// lower one is already superseded.
    async fn claim(&self, run: &RunKey) -> Result<RunRecord>;

    /// Write a terminal status, only if `epoch` is the current epoch
    /// ([`Error::Fenced`](super::Error::Fenced) otherwise: the write is suppressed) and the run is
    /// not terminal yet ([`Error::RunTerminal`](super::Error::RunTerminal)).
    async fn finish(&self, run: &RunKey, epoch: Epoch, finish: RunFinish) -> Result<RunRecord>;

    /// Record that the tenant asked to cancel the run. Writes no status: only
    /// the driver knows when the agent is gone. A terminal run is returned
    /// unchanged.
    async fn request_cancel(&self, run: &RunKey) -> Result<RunRecord>;

    /// The newest non-terminal run of the thread.
    async fn active_run(&self, tenant: &Tenant, thread_id: &str) -> Result<Option<RunRecord>>;

    /// Runs of the thread, oldest first.
    async fn list_by_thread(&self, tenant: &Tenant, thread_id: &str) -> Result<Vec<RunRecord>>;

    /// The tenant's newest `limit` runs, newest first.
    async fn list_recent(&self, tenant: &Tenant, limit: u32) -> Result<Vec<RunRecord>> {
        self.list_page(tenant, &RunFilter::default(), limit).await
    }

    /// The tenant's runs that `filter` keeps, newest first (by start, then
    /// run id, descending), at most `limit`.
    async fn list_page(&self, tenant: &Tenant, filter: &RunFilter, limit: u32) -> Result<Vec<RunRecord>>;

    /// Runs still `running` and detached at or before `cutoff` (inclusive),
    /// oldest detachment first, of `tenant` (`None`: across all tenants).
    async fn list_reclaimable(&self, cutoff: Timestamp, tenant: Option<&Tenant>) -> Result<Vec<RunRecord>>;

    /// Runs still `running` and not detached, of `tenant` (`None`: across
    /// all tenants), oldest start first, at most `limit`: the reaper looks
    /// among them for runs no replica drives (their driver died with no
    /// client left).
    async fn list_undetached_running(&self, limit: u32, tenant: Option<&Tenant>) -> Result<Vec<RunRecord>>;

    /// Runs not terminal yet whose sandbox is `sandbox_key` (a sandbox key
    /// is one tenant's): the reaper keeps a sandbox some run still lives in.
    async fn unfinished_in_sandbox(&self, sandbox_key: &str) -> Result<Vec<RunRecord>>;

    /// Remove an ended run with everything stored under it (its event log
    /// and request index go with the row). A run not ended is refused
    /// ([`Error::RunNotEnded`](super::Error::RunNotEnded)): its driver still writes to it.
    async fn delete_ended(&self, run: &RunKey) -> Result<()>;

    /// Remove at most `limit` runs of any tenant that ended before `cutoff`,
    /// oldest end first, the way [`delete_ended`](Self::delete_ended) does;
    /// returns their keys. The retention pass of the reaper.
    async fn delete_ended_before(&self, cutoff: Timestamp, limit: u32) -> Result<Vec<RunKey>>;
}
