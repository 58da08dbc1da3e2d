//! The typed handles components record through, one per metric family
//! (or group of families), each a thin wrapper over its
//! `prometheus-client` metrics.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use shared::proto::v1::EnsureOutcome;

use super::labels::{
    FencedWrite, NodeLabel, OutcomeLabel, ReasonLabel, StatusLabel, SweepOutcome, TERMINAL_STATUSES,
    TenantTokensLabel, UNFINISHED_STATUSES, WriteLabel,
};

/// Model tokens the runs' brokers metered, per tenant.
pub struct ModelMetrics {
    pub(super) tokens: Family<TenantTokensLabel, Counter>,
}

impl ModelMetrics {
    /// One model answer's tokens, as its `model.usage` chunk was appended.
    pub fn metered(&self, tenant: &str, input: u64, output: u64, cache_read: u64, cache_write: u64) {
        for (kind, n) in
            [("input", input), ("output", output), ("cache_read", cache_read), ("cache_write", cache_write)]
        {
            self.tokens.get_or_create(&TenantTokensLabel { tenant: tenant.to_string(), kind }).inc_by(n);
        }
    }
}

/// Run counters and the sampled run gauge.
pub struct RunMetrics {
    pub(super) started: Counter,
    pub(super) finished: Family<StatusLabel, Counter>,
    pub(super) current: Family<StatusLabel, Gauge>,
}

impl RunMetrics {
    /// A run was created and its drive began on this replica.
    pub fn started(&self) {
        self.started.inc();
    }

    /// This replica wrote the run's terminal status. Non-terminal statuses
    /// are ignored (they are not outcomes).
    pub fn finished(&self, status: &str) {
        if let Some(status) = TERMINAL_STATUSES.into_iter().find(|s| *s == status) {
            self.finished.get_or_create(&StatusLabel { status }).inc();
        }
    }

    /// Set the sampled number of runs in `status` (the endpoint does this
    /// from the database at each scrape).
    pub fn set_current(&self, status: &str, count: i64) {
        if let Some(status) = UNFINISHED_STATUSES.into_iter().find(|s| *s == status) {
            self.current.get_or_create(&StatusLabel { status }).set(count);
        }
    }
}

/// Drives this replica is running now.
pub struct DriveMetrics {
    pub(super) active: Gauge,
}

impl DriveMetrics {
    /// Count a drive as active until the guard is dropped (so a drive that
    /// ends by error or panic is uncounted too).
    #[must_use = "the drive counts as active only while the guard lives"]
    pub fn start(&self) -> ActiveDrive {
        self.active.inc();
        ActiveDrive(self.active.clone())
    }

    pub fn active(&self) -> i64 {
        self.active.get()
    }
}

/// See [`DriveMetrics::start`].
pub struct ActiveDrive(Gauge);

impl Drop for ActiveDrive {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Refused fenced writes.
pub struct FencingMetrics {
    pub(super) refusals: Family<WriteLabel, Counter>,
}

impl FencingMetrics {
    pub fn refused(&self, write: FencedWrite) {
        self.refusals.get_or_create(&WriteLabel { write: write.as_str() }).inc();
    }

    pub fn refusals(&self, write: FencedWrite) -> u64 {
        self.refusals.get_or_create(&WriteLabel { write: write.as_str() }).get()
    }
}

/// Bytes read from run journals inside sandboxes.
pub struct JournalMetrics {
    pub(super) read_bytes: Counter,
}

impl JournalMetrics {
    pub fn read(&self, bytes: u64) {
        self.read_bytes.inc_by(bytes);
    }
}

/// Event-log append latency.
pub struct EventLogMetrics {
    pub(super) append_seconds: Histogram,
}

impl EventLogMetrics {
    pub fn observe_append(&self, elapsed: Duration) {
        self.append_seconds.observe(elapsed.as_secs_f64());
    }
}

/// Reaper tallies.
pub struct SweepMetrics {
    pub(super) outcomes: Family<OutcomeLabel, Counter>,
}

impl SweepMetrics {
    pub fn outcome(&self, outcome: SweepOutcome) {
        self.outcomes_by(outcome, 1);
    }

    /// `n` items with the same outcome (a sweep's tally at once).
    pub fn outcomes_by(&self, outcome: SweepOutcome, n: u64) {
        self.outcomes.get_or_create(&OutcomeLabel { outcome: outcome.as_str() }).inc_by(n);
    }
}

/// `EnsureSandbox` results, and the warm pools.
pub struct SandboxMetrics {
    pub(super) ensures: Family<OutcomeLabel, Counter>,
    /// Ensures of a new sandbox under a definition with a pool: `claimed`
    /// or `miss` (the pool had none ready: created cold).
    pub(super) warm_claims: Family<OutcomeLabel, Counter>,
    /// How long making one pooled sandbox took (create and setup).
    pub(super) warm_refill_seconds: Histogram,
    /// Pooled sandboxes ready, across pools (as the last keeper pass saw).
    pub(super) warm_ready: Gauge,
    pub(super) placement_failures: Family<ReasonLabel, Counter>,
    pub(super) nodes: NodeGauges,
}

/// What each node of the fleet holds, as sampled at a scrape.
#[derive(Default)]
pub(super) struct NodeGauges {
    pub(super) sandboxes: Family<NodeLabel, Gauge>,
    pub(super) slots: Family<NodeLabel, Gauge>,
    pub(super) free_memory: Family<NodeLabel, Gauge>,
    pub(super) heartbeat_age: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

/// One node as a scrape samples it.
pub struct NodeSample<'a> {
    pub node: &'a str,
    pub sandboxes: u32,
    pub slots: u32,
    pub free_memory_bytes: u64,
    pub heartbeat_age: std::time::Duration,
}

impl SandboxMetrics {
    pub fn ensured(&self, outcome: EnsureOutcome) {
        let outcome = match outcome {
            EnsureOutcome::Created => "created",
            EnsureOutcome::Resumed => "resumed",
            EnsureOutcome::SnapshotRestored => "snapshot_restored",
            EnsureOutcome::Claimed => "claimed",
            EnsureOutcome::Unspecified => "unspecified",
        };
        self.ensures.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// A new sandbox no node could take: `reason` is `labels`, `provider`,
    /// `not_ready` or `full`.
    pub fn placement_failed(&self, reason: &'static str) {
        self.placement_failures.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// The fleet's nodes now (a node no longer listed leaves no series).
    pub fn nodes(&self, nodes: &[NodeSample<'_>]) {
        let g = &self.nodes;
        g.sandboxes.clear();
        g.slots.clear();
        g.free_memory.clear();
        g.heartbeat_age.clear();
        for n in nodes {
            let label = NodeLabel { node: n.node.to_string() };
            g.sandboxes.get_or_create(&label).set(i64::from(n.sandboxes));
            g.slots.get_or_create(&label).set(i64::from(n.slots));
            g.free_memory.get_or_create(&label).set(i64::try_from(n.free_memory_bytes).unwrap_or(i64::MAX));
            g.heartbeat_age.get_or_create(&label).set(n.heartbeat_age.as_secs_f64());
        }
    }

    pub fn ensure_failed(&self) {
        self.ensures.get_or_create(&OutcomeLabel { outcome: "failed" }).inc();
    }

    /// A new sandbox of a pooled definition: taken from the pool, or not.
    pub fn warm_claim(&self, claimed: bool) {
        let outcome = if claimed { "claimed" } else { "miss" };
        self.warm_claims.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub fn warm_refilled(&self, took: Duration) {
        self.warm_refill_seconds.observe(took.as_secs_f64());
    }

    pub fn warm_ready(&self, ready: u64) {
        self.warm_ready.set(i64::try_from(ready).unwrap_or(i64::MAX));
    }
}
