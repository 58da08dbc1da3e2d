//! Durable runs: the driver that turns a run's journal into its event log,
//! and the `RunService` in front of it.
//!
//! One replica drives a run at a time, holding the run's lease
//! (`run:<run_id>`) and the record's epoch: it follows the journal inside the
//! sandbox from byte 0, translates each line with the run's harness adapter
//! (run-scoped ids, so a replay gives the same chunks), aligns the result
//! with what the log already holds ([`align`]), and appends the rest through
//! a fenced [`LogWriter`](crate::store::LogWriter). Clients never talk to the
//! driver: they read the log, from any replica.
//!
//! A drive ends in exactly one way ([`driver::Ending`]): the run exited and
//! its terminal chunk and status are written; it was cancelled or (when it
//! does not detach) its client left, and the sandbox is destroyed and the
//! record `aborted`; an error failed it; or the driver stopped driving
//! without writing a terminal state: the server is shutting down (the run is
//! marked detached for another replica), the lease was lost, or a successor
//! fenced it off.

pub mod align;
pub mod cancel;
pub mod coalesce;
pub mod driver;
pub mod quiet;
pub mod service;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::error::{Error, ErrorCode};
use shared::proto::v1 as api;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

pub use cancel::CancelBus;
pub use service::{RunApi, Takeover};

use crate::sandbox::Lifecycle;
use crate::server::ServerState;
use crate::store::{self, RunId, RunRecord, RunStatus, RunUpdate, Timestamp};

/// What started a run, kept on its record (never a secret, never the
/// prompt) so that any replica can drive it on and describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    pub harness: String,
    pub definition_id: String,
    pub durable: bool,
    pub detach_on_disconnect: bool,
    #[serde(default)]
    pub cwd: String,
}

impl RunSpec {
    pub fn of(record: &RunRecord) -> Result<Self, Error> {
        let value = record.spec.clone().ok_or_else(|| {
            Error::new(
                ErrorCode::FailedPrecondition,
                format!("run {} has no spec on its record", record.run_id),
            )
        })?;
        serde_json::from_value(value).map_err(|e| {
            Error::internal(format!("run {}: unreadable spec on its record: {e}", record.run_id))
        })
    }
}

/// Timings of the driver.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// How often a driver re-reads the record for a cancel recorded on
    /// another replica.
    pub cancel_poll: Duration,
    /// A journal silent this long is probed (`ProbeExit`): a supervisor
    /// gone without its sentinel fails the run.
    pub liveness_probe: Duration,
    /// How long an unreachable agent is retried before the run fails.
    pub reconnect_budget: Duration,
    /// How often an attach whose run another replica holds tries to take
    /// the drive over.
    pub takeover_retry: Duration,
    /// How long a takeover waits for the stored log to stop growing before
    /// it reads it (default: no wait; the fence makes it unnecessary).
    pub quiet: quiet::QuietGate,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            cancel_poll: Duration::from_secs(1),
            liveness_probe: Duration::from_secs(5),
            reconnect_budget: Duration::from_secs(60),
            takeover_retry: Duration::from_secs(1),
            quiet: quiet::QuietGate::default(),
        }
    }
}

/// Why a driver was asked to stop a run it drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancel,
    /// The last client of a run that does not detach went away.
    Disconnected,
}

impl StopReason {
    fn code(self) -> &'static str {
        match self {
            StopReason::Cancel => "CANCELLED",
            StopReason::Disconnected => "CLIENT_DISCONNECTED",
        }
    }

    fn message(self) -> &'static str {
        match self {
            StopReason::Cancel => "the run was cancelled",
            StopReason::Disconnected => "the client disconnected from a run that does not detach",
        }
    }
}

/// This replica's hold on a run it drives.
#[derive(Clone)]
pub(crate) struct Drive {
    stop: CancellationToken,
    reason: Arc<Mutex<Option<StopReason>>>,
    detaches: bool,
}

impl Drive {
    fn stop(&self, reason: StopReason) {
        let mut r = self.reason.lock().expect("stop reason poisoned");
        // A cancel outranks a disconnect: both abort, but the record should
        // say what the user asked for.
        if r.is_none() || reason == StopReason::Cancel {
            *r = Some(reason);
        }
        self.stop.cancel();
    }

    fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().expect("stop reason poisoned")
    }
}

#[derive(Default)]
struct Registry {
    drives: HashMap<String, Drive>,
    /// Clients of each run streaming from this replica.
    clients: HashMap<String, usize>,
}

/// The runs this replica serves. Cheap to clone.
#[derive(Clone)]
pub struct Runs {
    inner: Arc<Inner>,
}

struct Inner {
    state: ServerState,
    lifecycle: Lifecycle,
    /// Server shutdown: drives detach, streams end.
    shutdown: CancellationToken,
    options: RunOptions,
    cancels: CancelBus,
    registry: Mutex<Registry>,
    /// Every drive task, so shutdown can wait for them to detach.
    drives: tokio_util::task::TaskTracker,
}

impl Runs {
    pub fn new(
        state: ServerState,
        lifecycle: Lifecycle,
        shutdown: CancellationToken,
        options: RunOptions,
        cancels: CancelBus,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                state,
                lifecycle,
                shutdown,
                options,
                cancels,
                registry: Mutex::default(),
                drives: tokio_util::task::TaskTracker::new(),
            }),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.inner.registry.lock().expect("run registry poisoned")
    }

    /// Wait (at most `within`) for every drive to end; at shutdown they
    /// detach, and the stores must stay open until they have.
    pub async fn drain(&self, within: Duration) {
        self.inner.drives.close();
        if tokio::time::timeout(within, self.inner.drives.wait()).await.is_err() {
            warn!(still_driving = self.driving(), "drives did not end in time at shutdown");
        }
    }

    /// Number of runs this replica drives now.
    pub fn driving(&self) -> usize {
        self.registry().drives.len()
    }

    /// Register a drive; `None` when this replica already drives the run.
    fn register(&self, run: &RunId, detaches: bool) -> Option<Drive> {
        let mut reg = self.registry();
        if reg.drives.contains_key(run.as_str()) {
            return None;
        }
        let drive = Drive { stop: CancellationToken::new(), reason: Arc::default(), detaches };
        reg.drives.insert(run.to_string(), drive.clone());
        Some(drive)
    }

    fn unregister(&self, run: &RunId) {
        self.registry().drives.remove(run.as_str());
    }

    /// Stop a run this replica drives; false when it drives no such run.
    fn stop_local(&self, run: &RunId, reason: StopReason) -> bool {
        match self.registry().drives.get(run.as_str()) {
            Some(drive) => {
                drive.stop(reason);
                true
            }
            None => false,
        }
    }

    /// Stop a drive of this replica as a cancel would (the reaper's time
    /// budget for it ran out): the sandbox is destroyed and the record
    /// `aborted`. False when this replica drives no such run.
    pub fn stop_overrun(&self, run: &RunId) -> bool {
        self.stop_local(run, StopReason::Cancel)
    }

    /// A client began streaming `run` from this replica.
    fn client_arrived(&self, run: &RunId) {
        *self.registry().clients.entry(run.to_string()).or_default() += 1;
    }

    /// A client's stream of `run` ended (finished or dropped). When it was
    /// the last one here and the run is still going: a run that detaches is
    /// marked detached; one that does not is stopped.
    fn client_left(&self, run: &RunId) {
        let stop_drive = {
            let mut reg = self.registry();
            let left = match reg.clients.get_mut(run.as_str()) {
                Some(n) => {
                    *n -= 1;
                    *n
                }
                None => 0,
            };
            if left > 0 {
                return;
            }
            reg.clients.remove(run.as_str());
            reg.drives.get(run.as_str()).filter(|d| !d.detaches).cloned()
        };
        if let Some(drive) = stop_drive {
            drive.stop(StopReason::Disconnected);
            return;
        }
        if self.inner.shutdown.is_cancelled() {
            return; // the drive marks it detached itself
        }
        let runs = self.clone();
        let run = run.clone();
        tokio::spawn(async move {
            if let Err(e) = runs.mark_detached(&run).await {
                debug!(run_id = %run, error = %e.message, "could not mark the run detached");
            }
        });
    }

    /// Set `detached_since` on a running run that has none.
    pub(crate) async fn mark_detached(&self, run: &RunId) -> Result<(), Error> {
        let ready = self.inner.state.ready()?;
        let record = ready.stores.runs.get_unscoped(run).await?;
        if record.status.is_terminal() || record.detached_since.is_some() {
            return Ok(());
        }
        let update = RunUpdate { detached_since: Some(Some(Timestamp::now())), ..Default::default() };
        match ready.stores.runs.update(run, update).await {
            Ok(_) | Err(store::Error::RunTerminal { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// A client attached: the run is no longer detached.
    async fn mark_attached(&self, record: &RunRecord) {
        if record.status.is_terminal() || record.detached_since.is_none() {
            return;
        }
        let Ok(ready) = self.inner.state.ready() else { return };
        let update = RunUpdate { detached_since: Some(None), ..Default::default() };
        if let Err(e) = ready.stores.runs.update(&record.run_id, update).await
            && !matches!(e, store::Error::RunTerminal { .. })
        {
            warn!(run_id = %record.run_id, error = %e, "could not clear detached_since");
        }
    }
}

/// The API view of a record.
pub fn run_to_api(record: &RunRecord) -> api::Run {
    let spec = RunSpec::of(record).ok();
    api::Run {
        run_id: record.run_id.to_string(),
        thread_id: record.thread_id.clone(),
        status: status_to_api(record.status) as i32,
        harness: spec.as_ref().map(|s| s.harness.clone()).unwrap_or_default(),
        definition_id: spec.as_ref().map(|s| s.definition_id.clone()).unwrap_or_default(),
        durable: spec.as_ref().is_some_and(|s| s.durable),
        started_at_ms: record.started_at.as_millis(),
        finished_at_ms: record.finished_at.map(Timestamp::as_millis),
        error: record
            .error
            .as_ref()
            .map(|e| api::RunFailure { code: e.code.clone(), message: e.message.clone() }),
        usage: record.usage.as_ref().and_then(shared::chunk::usage_from_json),
        sandbox_id: record.sandbox_key.clone().unwrap_or_default(),
        detached_since_ms: record.detached_since.map(Timestamp::as_millis),
        cancel_requested: record.cancel_requested,
        forked_from_run: record.forked_from_run.as_ref().map(RunId::to_string).unwrap_or_default(),
    }
}

fn status_to_api(status: RunStatus) -> api::RunStatus {
    match status {
        RunStatus::Running => api::RunStatus::Running,
        RunStatus::Interrupted => api::RunStatus::Interrupted,
        RunStatus::Completed => api::RunStatus::Completed,
        RunStatus::Failed => api::RunStatus::Failed,
        RunStatus::Aborted => api::RunStatus::Aborted,
    }
}
