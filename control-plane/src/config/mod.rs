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
mod redact;
mod serve;

pub use layer::ConfigLayer;
pub use options::{
    DEFAULT_DETACHED_RUN_TTL_MS, DEFAULT_LEASE_RENEW_MS, DEFAULT_LEASE_TTL_MS, DEFAULT_NAMESPACE,
    DEFAULT_ORPHAN_JOURNAL_AGE_MS, DEFAULT_ORPHAN_SANDBOX_GRACE_MS, DEFAULT_SWEEP_INTERVAL_MS,
    DEFAULT_SWEEP_MAX_JOURNAL_DELETIONS, DEFAULT_SWEEP_MAX_RUNS, DEFAULT_SWEEP_RUN_BUDGET_MS, LeaseOptions,
    QuietGate, ReaperOptions, default_database_url,
};
pub use redact::redact_url;
pub use serve::{
    ApiToken, DEFAULT_LISTEN, DEFAULT_LOG_FILTER, DEFAULT_SHUTDOWN_GRACE_MS, LogFormat, ServeConfig,
    default_data_dir,
};
