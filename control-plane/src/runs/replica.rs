//! The runs this replica serves: its drives (one per run it drives now)
//! and its clients (streams of each run), and what follows when the last
//! client of a run leaves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::RunOptions;
use crate::context::Context;
use crate::sandbox::RunSandbox;
use crate::store::{self, RunKey, RunRecord, RunUpdate, Timestamp};

/// Why a driver was asked to stop a run it drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancel,
    /// The last client of a run that does not detach went away.
    Disconnected,
}

impl StopReason {
    pub(super) fn code(self) -> &'static str {
        match self {
            StopReason::Cancel => "CANCELLED",
            StopReason::Disconnected => "CLIENT_DISCONNECTED",
        }
    }

    pub(super) fn message(self) -> &'static str {
        match self {
            StopReason::Cancel => "the run was cancelled",
            StopReason::Disconnected => "the client disconnected from a run that does not detach",
        }
    }
}

/// This replica's hold on a run it drives.
#[derive(Clone)]
pub(crate) struct Drive {
    pub(super) stop: CancellationToken,
    reason: Arc<Mutex<Option<StopReason>>>,
    detaches: bool,
}

impl Drive {
    pub(super) fn stop(&self, reason: StopReason) {
        let mut r = self.reason.lock().expect("stop reason poisoned");
        // A cancel outranks a disconnect: both abort, but the record should
        // say what the user asked for.
        if r.is_none() || reason == StopReason::Cancel {
            *r = Some(reason);
        }
        self.stop.cancel();
    }

    pub(super) fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().expect("stop reason poisoned")
    }

    /// A drive no stop reaches: what the writes that record a stop wait on.
    pub(super) fn past_stopping() -> Self {
        Self { stop: CancellationToken::new(), reason: Arc::default(), detaches: false }
    }

    #[cfg(test)]
    pub(super) fn detached_for_test() -> Self {
        Self { stop: CancellationToken::new(), reason: Arc::default(), detaches: true }
    }
}

/// By [`RunKey`]: two tenants' runs of one id are two runs here too.
#[derive(Default)]
pub(super) struct Registry {
    pub(super) drives: HashMap<RunKey, Drive>,
    /// Clients of each run streaming from this replica.
    clients: HashMap<RunKey, usize>,
}

/// The runs this replica serves. Cheap to clone.
#[derive(Clone)]
pub struct Runs {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    /// Its shutdown token: drives detach, streams end.
    pub(super) ctx: Context,
    /// What runs use of the sandbox layer.
    pub(super) sandbox: RunSandbox,
    pub(super) options: RunOptions,
    registry: Mutex<Registry>,
    /// Every drive task, so shutdown can wait for them to detach.
    pub(super) drives: tokio_util::task::TaskTracker,
}

impl Runs {
    pub fn new(ctx: Context, options: RunOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                sandbox: ctx.run_sandbox(),
                ctx,
                options,
                registry: Mutex::default(),
                drives: tokio_util::task::TaskTracker::new(),
            }),
        }
    }

    pub(super) fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
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
    pub(super) fn register(&self, run: &RunKey, detaches: bool) -> Option<Drive> {
        let mut reg = self.registry();
        if reg.drives.contains_key(run) {
            return None;
        }
        let drive = Drive { stop: CancellationToken::new(), reason: Arc::default(), detaches };
        reg.drives.insert(run.clone(), drive.clone());
        Some(drive)
    }

    pub(super) fn unregister(&self, run: &RunKey) {
        self.registry().drives.remove(run);
    }

    /// Stop a run this replica drives; false when it drives no such run.
    pub(super) fn stop_local(&self, run: &RunKey, reason: StopReason) -> bool {
        match self.registry().drives.get(run) {
            Some(drive) => {
                drive.stop(reason);
                true
            }
            None => false,
        }
    }

    /// Another replica announced a cancel of `run` (a [`RunKey::encode`],
    /// see `lease::CancelBus::listen`): stop it if this replica drives it.
    pub fn cancel_announced(&self, run: &str) {
        if let Some(run) = RunKey::decode(run)
            && self.stop_local(&run, StopReason::Cancel)
        {
            tracing::info!(run_id = %run.run, tenant = %run.tenant, "cancel announced by another replica");
        }
    }

    /// This replica's cancel subscription (re)started: a cancel announced
    /// while it was down reached no one here, so the records of the runs
    /// it drives are read once for a recorded cancel.
    pub fn recheck_cancels(&self) {
        let driven: Vec<RunKey> = self.registry().drives.keys().cloned().collect();
        if driven.is_empty() {
            return;
        }
        let runs = self.clone();
        self.inner.drives.spawn(async move {
            for run in driven {
                match runs.inner.ctx.stores.runs.get(&run).await {
                    Ok(record) if record.cancel_requested && runs.stop_local(&run, StopReason::Cancel) => {
                        tracing::info!(run_id = %run.run, tenant = %run.tenant, "cancel found on the record after the subscription restarted");
                    }
                    Ok(_) => {}
                    Err(e) => debug!(run_id = %run.run, error = %e, "could not read the record for a cancel"),
                }
            }
        });
    }

    /// Stop a drive of this replica as a cancel would (the reaper's time
    /// budget for it ran out): the sandbox is destroyed and the record
    /// `aborted`. False when this replica drives no such run.
    pub fn stop_overrun(&self, run: &RunKey) -> bool {
        self.stop_local(run, StopReason::Cancel)
    }

    /// A client began streaming `run` from this replica.
    pub(super) fn client_arrived(&self, run: &RunKey) {
        *self.registry().clients.entry(run.clone()).or_default() += 1;
    }

    /// A client's stream of `run` ended (finished or dropped). When it was
    /// the last one here and the run is still going: a run that detaches is
    /// marked detached; one that does not is stopped.
    pub(super) fn client_left(&self, run: &RunKey) {
        let stop_drive = {
            let mut reg = self.registry();
            let left = match reg.clients.get_mut(run) {
                Some(n) => {
                    *n -= 1;
                    *n
                }
                None => 0,
            };
            if left > 0 {
                return;
            }
            reg.clients.remove(run);
            reg.drives.get(run).filter(|d| !d.detaches).cloned()
        };
        if let Some(drive) = stop_drive {
            drive.stop(StopReason::Disconnected);
            return;
        }
        if self.inner.ctx.shutdown.is_cancelled() {
            return; // the drive marks it detached itself
        }
        let runs = self.clone();
        let run = run.clone();
        self.inner.drives.spawn(async move {
            if let Err(e) = runs.mark_detached(&run).await {
                debug!(run_id = %run.run, error = %e, "could not mark the run detached");
            }
        });
    }

    /// Set `detached_since` on a running run that has none.
    pub(crate) async fn mark_detached(&self, run: &RunKey) -> Result<(), store::Error> {
        let cx = &self.inner.ctx;
        let record = cx.stores.runs.get(run).await?;
        if record.status.is_terminal() || record.detached_since.is_some() {
            return Ok(());
        }
        let update = RunUpdate { detached_since: Some(Some(Timestamp::now())), ..Default::default() };
        match cx.stores.runs.update(run, update).await {
            Ok(_) | Err(store::Error::RunTerminal { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A client attached: the run is no longer detached.
    pub(super) async fn mark_attached(&self, record: &RunRecord) {
        if record.status.is_terminal() || record.detached_since.is_none() {
            return;
        }
        let cx = &self.inner.ctx;
        let update = RunUpdate { detached_since: Some(None), ..Default::default() };
        if let Err(e) = cx.stores.runs.update(&record.key(), update).await
            && !matches!(e, store::Error::RunTerminal { .. })
        {
            warn!(run_id = %record.run_id, error = %e, "could not clear detached_since");
        }
    }
}
