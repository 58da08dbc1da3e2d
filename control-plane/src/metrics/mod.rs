//! Prometheus metrics of one replica, served on their own port
//! (`--metrics-listen`, off by default) by [`endpoint`]: one process-wide
//! registry ([`registry()`]; the `registry` module's docs list every series)
//! with typed [`handles`] whose labels are closed sets ([`labels`]).

mod endpoint;
mod handles;
mod labels;
mod registry;

pub use endpoint::{MetricsEndpoint, Sampler, serve as serve_endpoint};
pub use handles::{
    ActiveDrive, DriveMetrics, EventLogMetrics, FencingMetrics, JournalMetrics, ModelMetrics, NodeSample,
    RunMetrics, SandboxMetrics, SweepMetrics,
};
pub use labels::{FencedWrite, SweepOutcome, TERMINAL_STATUSES, UNFINISHED_STATUSES};
pub use registry::{
    Metrics, drives, event_log, fencing, journal, model, registry, runs, sample, sandboxes, sweeps, takeovers,
};
