//! Configuration of `sandhold serve`, merged from layers: built-in defaults,
//! then an optional TOML file (`--config`), then `SANDHOLD_*` environment
//! variables, then flags. Clap reads a flag and its variable together (the
//! flag wins) into a [`ConfigLayer`], the file deserializes into another,
//! and figment merges them onto the defaults: defaults < file < (env < flag).
//!
//! Secrets (API tokens, passwords inside URLs) never reach `--print-config`
//! output or a log line: [`ServeConfig::to_redacted_toml`] and
//! [`redact_url`] are the only ways this module prints them.
//!
//! The bottom of the crate: this module imports no other module of it. The
//! options of the components it configures live here (`options.rs`) and the
//! components re-export them.

mod layer;
mod options;
mod policy;
mod quota;
mod redact;
mod serve;
mod snapshot;
mod tokens_file;
mod web;

pub use layer::{ConfigLayer, TOKENS_VAR};
pub use options::{
    DEFAULT_DETACHED_RUN_TTL_MS, DEFAULT_LEASE_RENEW_MS, DEFAULT_LEASE_TTL_MS, DEFAULT_NAMESPACE,
    DEFAULT_ORPHAN_JOURNAL_AGE_MS, DEFAULT_ORPHAN_SANDBOX_GRACE_MS, DEFAULT_SWEEP_INTERVAL_MS,
    DEFAULT_SWEEP_MAX_JOURNAL_DELETIONS, DEFAULT_SWEEP_MAX_RUNS, DEFAULT_SWEEP_RUN_BUDGET_MS,
    DEFAULT_TENANT_SWEEP_BUDGET_MS, LeaseOptions, QuietGate, ReaperOptions, default_database_url, parse_span,
};
pub use policy::{
    DEFAULT_DOCKER_MAX_MEMORY_BYTES, DEFAULT_DOCKER_MAX_PIDS_LIMIT, DEFAULT_DOCKER_MEMORY_BYTES,
    DEFAULT_DOCKER_PIDS_LIMIT, DEFAULT_EGRESS_MAX_CONNECTIONS_PER_SANDBOX,
    DEFAULT_EGRESS_MAX_CONNECTIONS_PER_TENANT, Policy, ProviderName, Runtime, TenantPolicy,
    forbidden_network, plain_absolute,
};
pub use quota::{
    DEFAULT_MAX_RUNNING_RUNS_PER_TENANT, DEFAULT_MAX_SANDBOXES_PER_TENANT, Limit, OverLimit, Quotas,
};
pub use redact::redact_url;
pub use serve::{
    ApiToken, DEFAULT_LISTEN, DEFAULT_LOG_FILTER, DEFAULT_SHUTDOWN_GRACE_MS, LogFormat, ServeConfig,
    TlsFiles, default_data_dir,
};
pub use snapshot::{ByteMax, DEFAULT_MAX_SNAPSHOT_BYTES, DEFAULT_MAX_SNAPSHOT_FILE_BYTES, SnapshotLimits};
pub use web::{ANY_ORIGIN, normalize_host, normalize_origin};
