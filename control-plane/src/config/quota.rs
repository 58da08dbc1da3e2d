//! Per-tenant quotas: how many sandboxes and running runs one tenant may
//! hold at once. Server configuration only, like the operator policy; the
//! checks live with the components (`sandbox::lifecycle`, `runs::start`).
//!
//! `0` turns a limit off. That is an operator's explicit choice, never the
//! default: a service with API tokens serves tenants it does not trust, and
//! without a limit one of them can take every slot of the host.

use serde::{Deserialize, Serialize};
use shared::error::{Error as WireError, ErrorCode};

/// Sandboxes one tenant may hold at once (running or stopped: a stopped
/// container still holds its disk), unless the operator says otherwise.
pub const DEFAULT_MAX_SANDBOXES_PER_TENANT: u32 = 32;
/// Runs not yet terminal (`running`, `interrupted`) one tenant may have.
pub const DEFAULT_MAX_RUNNING_RUNS_PER_TENANT: u32 = 32;

/// The quotas as configured. Serde names are the TOML keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    /// Sandboxes (instance records) of one tenant; `0`: no limit.
    pub max_sandboxes_per_tenant: u32,
    /// Non-terminal runs of one tenant; `0`: no limit.
    pub max_running_runs_per_tenant: u32,
    /// Model tokens (input, cache reads and writes, output) the runs of one
    /// tenant started on one UTC day may use, as their brokers metered
    /// them; `0` (the default): no limit.
    #[serde(default)]
    pub tenant_daily_tokens: u64,
    /// Attempts one StartAttempts may fan a task out to.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
}

/// Attempts of one task unless the operator says otherwise: each is a run
/// and a sandbox of the host's.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

fn default_max_attempts() -> u32 {
    DEFAULT_MAX_ATTEMPTS
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            max_sandboxes_per_tenant: DEFAULT_MAX_SANDBOXES_PER_TENANT,
            max_running_runs_per_tenant: DEFAULT_MAX_RUNNING_RUNS_PER_TENANT,
            tenant_daily_tokens: 0,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }
}

/// One quota: its setting's name (the flag without `--`, what a refusal
/// names) and its value, `None` when off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub setting: &'static str,
    pub max: Option<u32>,
}

impl Limit {
    fn of(setting: &'static str, max: u32) -> Self {
        Self { setting, max: (max > 0).then_some(max) }
    }

    /// Whether a tenant holding `held` may take one more.
    pub fn admits(&self, held: u64) -> bool {
        self.max.is_none_or(|max| held < u64::from(max))
    }

    /// What a refused request is told, e.g. "tenant t1 has 4 running runs,
    /// the limit (max-running-runs-per-tenant) is 4".
    pub fn refusal(&self, tenant: &str, held: u64, what: &str) -> String {
        let max = self.max.map_or_else(|| "off".to_string(), |m| m.to_string());
        format!("tenant {tenant} has {held} {what}, the limit ({}) is {max}", self.setting)
    }

    /// The refusal of one more for a tenant holding `held` `what`.
    pub fn exceeded(&self, tenant: &str, held: u64, what: &str) -> OverLimit {
        OverLimit {
            message: self.refusal(tenant, held, what),
            setting: self.setting,
            max: self.max.unwrap_or_default(),
        }
    }
}

/// A request over a tenant's quota: `RESOURCE_EXHAUSTED`, naming the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OverLimit {
    pub message: String,
    pub setting: &'static str,
    pub max: u32,
}

impl From<OverLimit> for WireError {
    fn from(e: OverLimit) -> Self {
        WireError::new(ErrorCode::ResourceExhausted, e.message)
            .with_meta("limit", e.setting)
            .with_meta("max", e.max.to_string())
    }
}

impl Quotas {
    pub fn sandboxes(&self) -> Limit {
        Limit::of("max-sandboxes-per-tenant", self.max_sandboxes_per_tenant)
    }

    pub fn running_runs(&self) -> Limit {
        Limit::of("max-running-runs-per-tenant", self.max_running_runs_per_tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_resource_exhausted_naming_the_limit() {
        let q = Quotas { max_sandboxes_per_tenant: 2, ..Quotas::default() };
        let wire = WireError::from(q.sandboxes().exceeded("t1", 2, "sandboxes"));
        assert_eq!(wire.code, ErrorCode::ResourceExhausted);
        assert_eq!(wire.message, "tenant t1 has 2 sandboxes, the limit (max-sandboxes-per-tenant) is 2");
        assert_eq!(wire.metadata.get("limit").map(String::as_str), Some("max-sandboxes-per-tenant"));
        assert_eq!(wire.metadata.get("max").map(String::as_str), Some("2"));
    }

    #[test]
    fn defaults_are_limits_and_zero_turns_one_off() {
        let q = Quotas::default();
        assert_eq!(q.sandboxes().max, Some(32));
        assert_eq!(q.running_runs().max, Some(32));
        assert!(q.running_runs().admits(31));
        assert!(!q.running_runs().admits(32));
        let off = Quotas { max_sandboxes_per_tenant: 0, ..q };
        assert_eq!(off.sandboxes().max, None);
        assert!(off.sandboxes().admits(u64::MAX));
    }

    #[test]
    fn a_refusal_names_the_count_and_the_setting() {
        let q = Quotas { max_running_runs_per_tenant: 4, ..Default::default() };
        assert_eq!(
            q.running_runs().refusal("t1", 4, "running runs"),
            "tenant t1 has 4 running runs, the limit (max-running-runs-per-tenant) is 4"
        );
    }
}
