//! The process-wide registry: every family registered under its name, the
//! exposition, and the accessors components record through.
//!
//! One process-wide registry ([`registry()`]) with typed handles, so any
//! component records without threading a handle through its constructor.
//! Every name starts with `sandhold_`; no label carries a run id or anything
//! else a caller chose (a tenant is the operator's: one of its configured
//! tenants), so the series set is small.
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
//! | `sandhold_sandbox_ensures_total` | counter | `outcome` = created, resumed, snapshot_restored, claimed, failed | the sandbox lifecycle's `ensure` |
//! | `sandhold_warm_claims_total` | counter | `outcome` = claimed, miss | an ensure of a new sandbox of a definition with a warm pool |
//! | `sandhold_warm_refill_seconds` | histogram | | the warm pool keeper, per pooled sandbox made (create and setup) |
//! | `sandhold_warm_ready` | gauge | | the warm pool keeper after each pass: pooled sandboxes ready, across pools |
//! | `sandhold_placement_failures_total` | counter | `reason` = labels, provider, not_ready, full | the sandbox layer's placement, per new sandbox no node could take: [`sandboxes()`]`.placement_failed(reason)` |
//! | `sandhold_node_sandboxes`, `sandhold_node_sandbox_slots`, `sandhold_node_free_memory_bytes`, `sandhold_node_heartbeat_age_seconds` | gauge | `node` | sampled from the database at each scrape: each node not removed (the operator names them) |
//! | `sandhold_model_tokens_total` | counter | `tenant`, `kind` = input, output, cache_read, cache_write | the run pump, per `model.usage` chunk it appends: [`model()`]`.metered(..)` |
//! | `sandhold_build_info` | gauge (1) | `version` | at start |
//!
//! The exposition format is OpenMetrics text (Prometheus scrapes it as is).

use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::handles::{
    DriveMetrics, EventLogMetrics, FencingMetrics, JournalMetrics, ModelMetrics, RunMetrics, SandboxMetrics,
    SweepMetrics,
};
use super::labels::{
    FencedWrite, OutcomeLabel, ReasonLabel, StatusLabel, SweepOutcome, TERMINAL_STATUSES,
    UNFINISHED_STATUSES, VersionLabel, WriteLabel,
};

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
    model: ModelMetrics,
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
        let sandboxes = SandboxMetrics {
            ensures: Family::default(),
            warm_claims: Family::default(),
            // 50 ms .. ~14 min.
            warm_refill_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 15)),
            warm_ready: Gauge::default(),
            placement_failures: Family::default(),
            nodes: Default::default(),
        };
        registry.register("sandbox_ensures", "EnsureSandbox calls by outcome", sandboxes.ensures.clone());
        registry.register(
            "warm_claims",
            "New sandboxes of pooled definitions: claimed from the pool, or missed",
            sandboxes.warm_claims.clone(),
        );
        registry.register_with_unit(
            "warm_refill",
            "Time to create and set up one pooled sandbox",
            Unit::Seconds,
            sandboxes.warm_refill_seconds.clone(),
        );
        registry.register("warm_ready", "Pooled sandboxes ready to be claimed", sandboxes.warm_ready.clone());
        registry.register(
            "placement_failures",
            "New sandboxes no node could take, by reason",
            sandboxes.placement_failures.clone(),
        );
        registry.register(
            "node_sandboxes",
            "Sandboxes placed on each node",
            sandboxes.nodes.sandboxes.clone(),
        );
        registry.register(
            "node_sandbox_slots",
            "Sandboxes each node holds at most",
            sandboxes.nodes.slots.clone(),
        );
        registry.register(
            "node_free_memory_bytes",
            "Memory each node had available at its last heartbeat",
            sandboxes.nodes.free_memory.clone(),
        );
        registry.register(
            "node_heartbeat_age_seconds",
            "How long ago each node last heartbeated",
            sandboxes.nodes.heartbeat_age.clone(),
        );
        let model = ModelMetrics { tokens: Family::default() };
        registry.register(
            "model_tokens",
            "Model tokens the runs' brokers metered, by tenant and kind",
            model.tokens.clone(),
        );
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
        for outcome in ["created", "resumed", "snapshot_restored", "claimed", "failed"] {
            let _ = sandboxes.ensures.get_or_create(&OutcomeLabel { outcome });
        }
        for outcome in ["claimed", "miss"] {
            let _ = sandboxes.warm_claims.get_or_create(&OutcomeLabel { outcome });
        }
        for reason in ["labels", "provider", "not_ready", "full"] {
            let _ = sandboxes.placement_failures.get_or_create(&ReasonLabel { reason });
        }

        Self { registry, runs, drives, takeovers, fencing, journal, event_log, sweeps, sandboxes, model }
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

pub fn model() -> &'static ModelMetrics {
    &METRICS.model
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared::proto::v1::EnsureOutcome;

    use super::*;
    use crate::store::RunStatus;

    fn sample(text: &str, series: &str) -> f64 {
        super::sample(text, series).unwrap_or_else(|| panic!("{series} missing in:\n{text}"))
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
        // Per tenant: a series appears with the tenant's first tokens.
        m.model.metered("t1", 12, 7, 5, 3);
        m.model.metered("t1", 12, 7, 0, 0);
        let metered = m.encode();
        assert_eq!(sample(&metered, "sandhold_model_tokens_total{tenant=\"t1\",kind=\"input\"}"), 24.0);
        assert_eq!(sample(&metered, "sandhold_model_tokens_total{tenant=\"t1\",kind=\"output\"}"), 14.0);
        assert_eq!(sample(&metered, "sandhold_model_tokens_total{tenant=\"t1\",kind=\"cache_read\"}"), 5.0);
        assert!(!metered.contains("tenant=\"t2\""), "{metered}");
        let info = format!("sandhold_build_info{{version=\"{}\"}}", env!("CARGO_PKG_VERSION"));
        assert_eq!(sample(&after, &info), 1.0);
        assert!(after.ends_with("# EOF\n"), "{after}");
    }
}
