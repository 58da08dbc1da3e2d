//! Prometheus metrics of one replica, served on their own port
//! (`--metrics-listen`, off by default) by [`endpoint`].
//!
//! One process-wide registry ([`registry`]) with typed handles, so any
//! component records without threading a handle through its constructor.
//! Every name starts with `sandhold_`; no label carries a tenant, a run id or
//! anything else a caller chose, so the series set is small and fixed.
//!
//! | metric | type | labels | recorded by |
//! |---|---|---|---|
//! | `sandhold_runs_started_total` | counter | | the run pump: [`runs()`]`.started()` |
//! | `sandhold_runs_finished_total` | counter | `status` = completed, failed, aborted | the run pump after its terminal write: [`runs()`]`.finished(status)` |
//! | `sandhold_runs` | gauge | `status` = running, interrupted | sampled from the database at each scrape (cluster-wide: every replica reports the same number) |
//! | `sandhold_drives_active` | gauge | | the run pump: hold the guard of [`drives()`]`.start()` while driving a run |
//! | `sandhold_takeovers_total` | counter | | the run pump after a successful claim of a run another driver had: [`takeovers()`]`.inc()` |
//! | `sandhold_fencing_refusals_total` | counter | `write` = append, finish | the stores: an append (the store's `LogWriter`) or terminal write refused because the run was claimed again |
//! | `sandhold_journal_read_bytes_total` | counter | | the run pump, per journal line read from a sandbox agent: [`journal()`]`.read(bytes)` |
//! | `sandhold_event_log_append_seconds` | histogram | | the store's `LogWriter::append`: one observation per batch, refused ones included |
//! | `sandhold_sweep_outcomes_total` | counter | `outcome` | the reaper, per run or journal it handled: [`sweeps()`]`.outcome(outcome)` |
//! | `sandhold_sandbox_ensures_total` | counter | `outcome` = created, resumed, snapshot_restored, failed | the sandbox lifecycle's `ensure` |
//! | `sandhold_build_info` | gauge (1) | `version` | at start |
//!
//! The exposition format is OpenMetrics text (Prometheus scrapes it as is).

mod endpoint;

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use shared::proto::v1::EnsureOutcome;

pub use endpoint::{MetricsEndpoint, Sampler, serve as serve_endpoint};

/// Run statuses a run ends in: the `status` values of
/// `sandhold_runs_finished_total` (the store's `RunStatus` names).
pub const TERMINAL_STATUSES: [&str; 3] = ["completed", "failed", "aborted"];
/// Run statuses before the end: the `status` values of `sandhold_runs`.
pub const UNFINISHED_STATUSES: [&str; 2] = ["running", "interrupted"];

/// Outcomes the reaper reports (`sandhold_sweep_outcomes_total{outcome}`).
/// Closed so a typo cannot start a new series. The first eight are what a
/// sweep did with one detached run (see the reaper); the last two
/// count journals and orphaned sandboxes it removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SweepOutcome {
    /// The journal had finished: driven to its terminal state, sandbox reclaimed.
    Finalized,
    /// Still running past the detached-run TTL: cancelled, sandbox destroyed.
    Expired,
    /// Still running within the TTL: left alone.
    Producing,
    /// The sandbox could not say (`ProbeExit` unknown, agent unreachable): left alone.
    Unknown,
    /// Another replica holds the run's lease (or it ended meanwhile): left alone.
    NotClaimed,
    /// The drive did not end within the per-run budget: stopped, record terminal anyway.
    BudgetExceeded,
    /// Terminal, but destroying its sandbox failed.
    ReclaimFailed,
    /// Handling the run failed; the next sweep tries again.
    Failed,
    /// A journal of a terminal run (or an old orphan) deleted.
    JournalPruned,
    /// An orphaned sandbox (no instance record, no live run) destroyed.
    SandboxReclaimed,
}

impl SweepOutcome {
    /// What a sweep can do with one detached run.
    pub const PER_RUN: [SweepOutcome; 8] = [
        Self::Finalized,
        Self::Expired,
        Self::Producing,
        Self::Unknown,
        Self::NotClaimed,
        Self::BudgetExceeded,
        Self::ReclaimFailed,
        Self::Failed,
    ];

    pub const ALL: [SweepOutcome; 10] = {
        let mut all = [Self::JournalPruned; 10];
        let mut i = 0;
        while i < Self::PER_RUN.len() {
            all[i] = Self::PER_RUN[i];
            i += 1;
        }
        all[9] = Self::SandboxReclaimed;
        all
    };

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Finalized => "finalized",
            Self::Expired => "expired",
            Self::Producing => "producing",
            Self::Unknown => "unknown",
            Self::NotClaimed => "not_claimed",
            Self::BudgetExceeded => "budget_exceeded",
            Self::ReclaimFailed => "reclaim_failed",
            Self::Failed => "failed",
            Self::JournalPruned => "journal_pruned",
            Self::SandboxReclaimed => "sandbox_reclaimed",
        }
    }
}

/// Which fenced write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FencedWrite {
    Append,
    Finish,
}

impl FencedWrite {
    fn as_str(self) -> &'static str {
        match self {
            Self::Append => "append",
            Self::Finish => "finish",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabel {
    write: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// Run counters and the sampled run gauge.
pub struct RunMetrics {
    started: Counter,
    finished: Family<StatusLabel, Counter>,
    current: Family<StatusLabel, Gauge>,
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
    active: Gauge,
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
    refusals: Family<WriteLabel, Counter>,
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
    read_bytes: Counter,
}

impl JournalMetrics {
    pub fn read(&self, bytes: u64) {
        self.read_bytes.inc_by(bytes);
    }
}

/// Event-log append latency.
pub struct EventLogMetrics {
    append_seconds: Histogram,
}

impl EventLogMetrics {
    pub fn observe_append(&self, elapsed: Duration) {
        self.append_seconds.observe(elapsed.as_secs_f64());
    }
}

/// Reaper tallies.
pub struct SweepMetrics {
    outcomes: Family<OutcomeLabel, Counter>,
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

/// `EnsureSandbox` results.
pub struct SandboxMetrics {
    ensures: Family<OutcomeLabel, Counter>,
}

impl SandboxMetrics {
    pub fn ensured(&self, outcome: EnsureOutcome) {
        let outcome = match outcome {
            EnsureOutcome::Created => "created",
            EnsureOutcome::Resumed => "resumed",
            EnsureOutcome::SnapshotRestored => "snapshot_restored",
            EnsureOutcome::Unspecified => "unspecified",
        };
        self.ensures.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub fn ensure_failed(&self) {
        self.ensures.get_or_create(&OutcomeLabel { outcome: "failed" }).inc();
    }
}

/// Every metric of the process and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    runs: RunMetrics,
    drives: DriveMetrics,
    takeovers: Counter,
    fencing: FencingMetrics,
    journal: JournalMetrics,
    event_log: EventLogMetrics,
    sweeps: SweepMetrics,
    sandboxes: SandboxMetrics,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("sandhold");
        let runs = RunMetrics {
            started: Counter::default(),
            finished: Family::default(),
            current: Family::default(),
        };
        registry.register("runs_started", "Runs created and started by this replica", runs.started.clone());
        registry.register(
            "runs_finished",
            "Terminal status writes by this replica, by status",
            runs.finished.clone(),
        );
        registry.register(
            "runs",
            "Runs in a non-terminal status, sampled from the database at scrape time (cluster-wide)",
            runs.current.clone(),
        );
        let drives = DriveMetrics { active: Gauge::default() };
        registry.register("drives_active", "Runs this replica is driving now", drives.active.clone());
        let takeovers = Counter::default();
        registry.register("takeovers", "Runs this replica took over from another driver", takeovers.clone());
        let fencing = FencingMetrics { refusals: Family::default() };
        registry.register(
            "fencing_refusals",
            "Writes refused because the run was claimed by a newer driver, by write",
            fencing.refusals.clone(),
        );
        let journal = JournalMetrics { read_bytes: Counter::default() };
        registry.register_with_unit(
            "journal_read",
            "Bytes of run journals read from sandbox agents",
            Unit::Bytes,
            journal.read_bytes.clone(),
        );
        let event_log = EventLogMetrics {
            // 0.5 ms .. ~8 s.
            append_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 15)),
        };
        registry.register_with_unit(
            "event_log_append",
            "Latency of one event-log append batch",
            Unit::Seconds,
            event_log.append_seconds.clone(),
        );
        let sweeps = SweepMetrics { outcomes: Family::default() };
        registry.register("sweep_outcomes", "Items the reaper handled, by outcome", sweeps.outcomes.clone());
        let sandboxes = SandboxMetrics { ensures: Family::default() };
        registry.register("sandbox_ensures", "EnsureSandbox calls by outcome", sandboxes.ensures.clone());
        let build_info = Family::<VersionLabel, Gauge>::default();
        build_info.get_or_create(&VersionLabel { version: env!("CARGO_PKG_VERSION") }).set(1);
        registry.register("build_info", "The running sandhold's version", build_info);

        // Every closed label value exists from the start at zero, so a rate
        // over a series that has not moved yet is 0 rather than absent.
        for status in TERMINAL_STATUSES {
            let _ = runs.finished.get_or_create(&StatusLabel { status });
        }
        for status in UNFINISHED_STATUSES {
            let _ = runs.current.get_or_create(&StatusLabel { status });
        }
        for write in [FencedWrite::Append, FencedWrite::Finish] {
            let _ = fencing.refusals.get_or_create(&WriteLabel { write: write.as_str() });
        }
        for outcome in SweepOutcome::ALL {
            let _ = sweeps.outcomes.get_or_create(&OutcomeLabel { outcome: outcome.as_str() });
        }
        for outcome in ["created", "resumed", "snapshot_restored", "failed"] {
            let _ = sandboxes.ensures.get_or_create(&OutcomeLabel { outcome });
        }

        Self { registry, runs, drives, takeovers, fencing, journal, event_log, sweeps, sandboxes }
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The value of one sample in an exposition: `series` is the name with its
/// labels as printed (`sandhold_runs_finished_total{status="failed"}`).
/// For tests and tools reading a scrape.
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process-wide metrics.
pub fn registry() -> &'static Metrics {
    &METRICS
}

pub fn runs() -> &'static RunMetrics {
    &METRICS.runs
}

pub fn drives() -> &'static DriveMetrics {
    &METRICS.drives
}

pub fn takeovers() -> &'static Counter {
    &METRICS.takeovers
}

pub fn fencing() -> &'static FencingMetrics {
    &METRICS.fencing
}

pub fn journal() -> &'static JournalMetrics {
    &METRICS.journal
}

pub fn event_log() -> &'static EventLogMetrics {
    &METRICS.event_log
}

pub fn sweeps() -> &'static SweepMetrics {
    &METRICS.sweeps
}

pub fn sandboxes() -> &'static SandboxMetrics {
    &METRICS.sandboxes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunStatus;

    fn sample(text: &str, series: &str) -> f64 {
        super::sample(text, series).unwrap_or_else(|| panic!("{series} missing in:\n{text}"))
    }

    #[test]
    fn status_labels_are_the_store_statuses() {
        let (terminal, unfinished): (Vec<RunStatus>, Vec<RunStatus>) =
            RunStatus::ALL.into_iter().partition(|s| s.is_terminal());
        assert_eq!(terminal.iter().map(|s| s.as_str()).collect::<Vec<_>>(), TERMINAL_STATUSES);
        assert_eq!(unfinished.iter().map(|s| s.as_str()).collect::<Vec<_>>(), UNFINISHED_STATUSES);
    }

    #[test]
    fn handles_move_their_series() {
        // A registry of its own: other tests of this binary record into the
        // process-wide one concurrently.
        let m = Metrics::new();
        let before = m.encode();
        m.runs.started();
        m.runs.finished(RunStatus::Failed.as_str());
        m.runs.finished(RunStatus::Running.as_str()); // not an outcome: ignored
        m.runs.set_current(RunStatus::Running.as_str(), 7);
        let drive = m.drives.start();
        m.takeovers.inc();
        m.fencing.refused(FencedWrite::Finish);
        m.journal.read(42);
        m.event_log.observe_append(Duration::from_millis(3));
        m.sweeps.outcomes_by(SweepOutcome::JournalPruned, 2);
        m.sandboxes.ensured(EnsureOutcome::Resumed);
        m.sandboxes.ensure_failed();
        let during = m.encode();
        drop(drive);
        let after = m.encode();

        let moved = |series: &str| sample(&during, series) - sample(&before, series);
        assert_eq!(moved("sandhold_runs_started_total"), 1.0);
        assert_eq!(moved("sandhold_runs_finished_total{status=\"failed\"}"), 1.0);
        assert_eq!(moved("sandhold_runs_finished_total{status=\"completed\"}"), 0.0);
        assert!(!during.contains("status=\"running\"} 1"), "running is no outcome:\n{during}");
        assert_eq!(moved("sandhold_runs{status=\"running\"}"), 7.0);
        assert_eq!(moved("sandhold_takeovers_total"), 1.0);
        assert_eq!(moved("sandhold_fencing_refusals_total{write=\"finish\"}"), 1.0);
        assert_eq!(moved("sandhold_fencing_refusals_total{write=\"append\"}"), 0.0);
        assert_eq!(moved("sandhold_journal_read_bytes_total"), 42.0);
        assert_eq!(moved("sandhold_event_log_append_seconds_count"), 1.0);
        assert_eq!(moved("sandhold_event_log_append_seconds_bucket{le=\"0.004\"}"), 1.0);
        assert_eq!(moved("sandhold_event_log_append_seconds_bucket{le=\"0.002\"}"), 0.0);
        assert_eq!(moved("sandhold_sweep_outcomes_total{outcome=\"journal_pruned\"}"), 2.0);
        assert_eq!(moved("sandhold_sandbox_ensures_total{outcome=\"resumed\"}"), 1.0);
        assert_eq!(moved("sandhold_sandbox_ensures_total{outcome=\"failed\"}"), 1.0);
        assert_eq!(moved("sandhold_sandbox_ensures_total{outcome=\"created\"}"), 0.0);
        assert_eq!(moved("sandhold_drives_active"), 1.0);
        assert_eq!(sample(&after, "sandhold_drives_active"), 0.0);
        let info = format!("sandhold_build_info{{version=\"{}\"}}", env!("CARGO_PKG_VERSION"));
        assert_eq!(sample(&after, &info), 1.0);
        assert!(after.ends_with("# EOF\n"), "{after}");
    }
}
