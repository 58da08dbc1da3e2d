//! What the services of one replica share once its stores are open: the
//! replica's id, the stores, the leases, the sandbox lifecycle, the cancel
//! bus, the task set for work a call leaves running, and the shutdown
//! signal. Built once by `server` after start-up (or by a test, with real
//! SQLite stores and the local provider), then handed to the domain
//! components that need it. Nothing here reaches up: the context sits right
//! above the mechanisms it holds and below every service built from it.
//! Metrics are process-wide (`metrics::registry()`), not carried.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::lease::{CancelBus, Leases};
use crate::sandbox::{Lifecycle, RunSandbox, Sandboxes};
use crate::store::{Presence, Stores};

/// Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct Context {
    pub replica_id: String,
    pub stores: Stores,
    pub leases: Leases,
    /// Which replicas are alive, where the database can tell (PostgreSQL):
    /// a run whose driver's replica is gone is taken over at once, not when
    /// its lease expires.
    pub presence: Option<Presence>,
    pub lifecycle: Lifecycle,
    /// Tells the replica that drives a run that it was cancelled elsewhere.
    pub cancels: CancelBus,
    /// Tasks a call leaves running (an ensure whose client left, the
    /// forwarding of a request stream); shutdown waits for them before the
    /// stores close.
    pub tasks: TaskTracker,
    /// Server shutdown: drives detach, streams end, loops stop.
    pub shutdown: CancellationToken,
}

impl Context {
    /// The sandbox operations, on this context's stores, leases, lifecycle
    /// and task set.
    pub fn sandboxes(&self) -> Sandboxes {
        Sandboxes::new(
            self.stores.clone(),
            self.leases.clone(),
            self.lifecycle.clone(),
            self.tasks.clone(),
            self.shutdown.clone(),
        )
    }

    /// The sandbox layer as runs and the reaper use it.
    pub fn run_sandbox(&self) -> RunSandbox {
        RunSandbox::new(self.stores.clone(), self.leases.clone(), self.lifecycle.clone())
    }
}
