//! The options of the components `sandhold serve` configures: the reaper's
//! sweep, the takeover's quiet gate, leases, the default database. They
//! live here, at the bottom of the crate, so the settings can name them
//! without the settings depending on the components; each component
//! re-exports its own (`reaper::ReaperOptions`, `runs::quiet::QuietGate`,
//! `lease::LeaseOptions`, `store::default_database_url`).
//!
//! Serde names are the TOML keys (and the flags, with `-`), durations in
//! milliseconds.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub const DEFAULT_SWEEP_INTERVAL_MS: u64 = 60_000;
/// 30 minutes: a detached run still producing after this is cancelled.
pub const DEFAULT_DETACHED_RUN_TTL_MS: u64 = 30 * 60_000;
pub const DEFAULT_SWEEP_MAX_RUNS: u32 = 100;
pub const DEFAULT_SWEEP_RUN_BUDGET_MS: u64 = 120_000;
pub const DEFAULT_ORPHAN_JOURNAL_AGE_MS: u64 = 24 * 60 * 60_000;
pub const DEFAULT_SWEEP_MAX_JOURNAL_DELETIONS: u32 = 1_000;
pub const DEFAULT_ORPHAN_SANDBOX_GRACE_MS: u64 = 10 * 60_000;
/// 2 minutes: a tenant's own sweep starts no new run after this.
pub const DEFAULT_TENANT_SWEEP_BUDGET_MS: u64 = 120_000;
pub const DEFAULT_LEASE_TTL_MS: u64 = 15_000;
pub const DEFAULT_LEASE_RENEW_MS: u64 = 5_000;
/// Default prefix of every lease key.
pub const DEFAULT_NAMESPACE: &str = "sandhold:lease:";

/// Schedule, TTL and bounds of a sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaperOptions {
    /// Between scheduled sweeps; zero: no scheduled sweep.
    #[serde(rename = "sweep_interval_ms", with = "millis")]
    pub interval: Duration,
    /// A detached run still producing this long after its client left is
    /// cancelled. The only detached-run TTL.
    #[serde(rename = "detached_run_ttl_ms", with = "millis")]
    pub detached_run_ttl: Duration,
    /// Detached runs one sweep handles at most.
    #[serde(rename = "sweep_max_runs")]
    pub max_runs: u32,
    /// Time one run's drive to its terminal state may take.
    #[serde(rename = "sweep_run_budget_ms", with = "millis")]
    pub run_budget: Duration,
    /// A journal without a run record is deleted only when older.
    #[serde(rename = "orphan_journal_age_ms", with = "millis")]
    pub orphan_journal_age: Duration,
    /// Journals one sweep deletes at most.
    #[serde(rename = "sweep_max_journal_deletions")]
    pub max_journal_deletions: u32,
    /// An orphaned sandbox is destroyed only when older.
    #[serde(rename = "orphan_sandbox_grace_ms", with = "millis")]
    pub orphan_sandbox_grace: Duration,
    /// A tenant's own sweep (`AdminService.Sweep` of a tenant that is no
    /// operator) starts no new run after this long; the run in hand still
    /// gets its `run_budget`.
    #[serde(rename = "tenant_sweep_budget_ms", with = "millis")]
    pub tenant_sweep_budget: Duration,
}

impl Default for ReaperOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(DEFAULT_SWEEP_INTERVAL_MS),
            detached_run_ttl: Duration::from_millis(DEFAULT_DETACHED_RUN_TTL_MS),
            max_runs: DEFAULT_SWEEP_MAX_RUNS,
            run_budget: Duration::from_millis(DEFAULT_SWEEP_RUN_BUDGET_MS),
            orphan_journal_age: Duration::from_millis(DEFAULT_ORPHAN_JOURNAL_AGE_MS),
            max_journal_deletions: DEFAULT_SWEEP_MAX_JOURNAL_DELETIONS,
            orphan_sandbox_grace: Duration::from_millis(DEFAULT_ORPHAN_SANDBOX_GRACE_MS),
            tenant_sweep_budget: Duration::from_millis(DEFAULT_TENANT_SWEEP_BUDGET_MS),
        }
    }
}

impl ReaperOptions {
    pub fn validate(&self) -> Result<(), String> {
        if self.detached_run_ttl.is_zero() {
            return Err("the detached-run TTL must be positive (--detached-run-ttl-ms)".into());
        }
        if self.run_budget.is_zero() {
            return Err("the per-run sweep budget must be positive (--sweep-run-budget-ms)".into());
        }
        if self.tenant_sweep_budget.is_zero() {
            return Err("a tenant's sweep budget must be positive (--tenant-sweep-budget-ms)".into());
        }
        Ok(())
    }
}

/// How long a takeover waits for quiet; `window` 0 disables the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuietGate {
    /// The log must gain no chunk for this long.
    #[serde(rename = "takeover_quiet_ms", with = "millis")]
    pub window: Duration,
    /// Give up (an error) when the log is still growing after this long.
    #[serde(rename = "takeover_quiet_max_ms", with = "millis")]
    pub max_wait: Duration,
}

impl Default for QuietGate {
    fn default() -> Self {
        Self { window: Duration::ZERO, max_wait: Duration::from_secs(30) }
    }
}

impl QuietGate {
    pub fn validate(&self) -> Result<(), String> {
        if !self.window.is_zero() && self.max_wait <= self.window {
            return Err(format!(
                "the takeover quiet window ({} ms) must be shorter than its bound ({} ms) \
                 (--takeover-quiet-ms, --takeover-quiet-max-ms)",
                self.window.as_millis(),
                self.max_wait.as_millis()
            ));
        }
        Ok(())
    }
}

/// How long a lease lives without renewal, how often the holder renews it,
/// and the key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOptions {
    pub ttl: Duration,
    pub renew_every: Duration,
    pub namespace: String,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_millis(DEFAULT_LEASE_TTL_MS),
            renew_every: Duration::from_millis(DEFAULT_LEASE_RENEW_MS),
            namespace: DEFAULT_NAMESPACE.into(),
        }
    }
}

impl LeaseOptions {
    /// Renewal must sit well inside the TTL: with `renew_every > ttl / 2` a
    /// single slow round trip loses the lease. The lease machinery's
    /// `validate` wraps this message in its own error type.
    pub fn check(&self) -> Result<(), String> {
        if self.ttl < Duration::from_millis(100) {
            return Err(format!("lease ttl {:?} is below 100ms", self.ttl));
        }
        if self.renew_every.is_zero() || self.renew_every * 2 > self.ttl {
            return Err(format!(
                "lease renewal interval {:?} must be above zero and at most half the ttl {:?}",
                self.renew_every, self.ttl
            ));
        }
        Ok(())
    }
}

/// The database URL of the embedded default: a SQLite file in `data_dir`.
pub fn default_database_url(data_dir: &Path) -> String {
    format!("sqlite://{}", data_dir.join("sandhold.db").display())
}

/// A [`Duration`] as whole milliseconds (the unit of every `*_ms` key).
pub(super) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refuse_a_zero_ttl_or_budget() {
        assert!(ReaperOptions::default().validate().is_ok());
        let zero_ttl = ReaperOptions { detached_run_ttl: Duration::ZERO, ..Default::default() };
        assert!(zero_ttl.validate().is_err());
        let zero_budget = ReaperOptions { run_budget: Duration::ZERO, ..Default::default() };
        assert!(zero_budget.validate().is_err());
        let zero_tenant = ReaperOptions { tenant_sweep_budget: Duration::ZERO, ..Default::default() };
        assert!(zero_tenant.validate().unwrap_err().contains("--tenant-sweep-budget-ms"));
    }
}
