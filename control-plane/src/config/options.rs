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
/// One day: an unused definition made from flags is removed after this.
pub const DEFAULT_UNUSED_DEFINITION_GRACE_MS: u64 = 24 * 60 * 60_000;
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
    /// A definition derived from content (`def-...`) that nothing names is
    /// removed only when last put longer ago.
    #[serde(rename = "unused_definition_grace_ms", with = "millis")]
    pub unused_definition_grace: Duration,
    /// A tenant's own sweep (`AdminService.Sweep` of a tenant that is no
    /// operator) starts no new run after this long; the run in hand still
    /// gets its `run_budget`.
    #[serde(rename = "tenant_sweep_budget_ms", with = "millis")]
    pub tenant_sweep_budget: Duration,
    /// Ended runs are removed with their logs this long after they ended;
    /// `None`: kept until `runs rm`.
    #[serde(rename = "retain_runs", with = "retention", default, skip_serializing_if = "Option::is_none")]
    pub retain_runs: Option<Duration>,
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
            unused_definition_grace: Duration::from_millis(DEFAULT_UNUSED_DEFINITION_GRACE_MS),
            tenant_sweep_budget: Duration::from_millis(DEFAULT_TENANT_SWEEP_BUDGET_MS),
            retain_runs: None,
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

/// A span as people write it: whole numbers with a unit each, `s`, `m`,
/// `h`, `d` or `w`, largest first or not (`90s`, `36h`, `30d`, `1d12h`).
pub fn parse_span(text: &str) -> Result<Duration, String> {
    let bad =
        || format!("{text:?} is not a duration: write a number and a unit (s, m, h, d, w), e.g. 30d or 12h");
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit: u64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        total = n.checked_mul(unit).and_then(|s| total.checked_add(s)).ok_or_else(bad)?;
        digits.clear();
    }
    if !digits.is_empty() || text.trim().is_empty() {
        return Err(bad());
    }
    if total == 0 {
        return Err(format!("{text:?}: a retention must be longer than zero (leave it unset to keep runs)"));
    }
    Ok(Duration::from_secs(total))
}

/// An optional span in a configuration: `"30d"` (see [`parse_span`]),
/// written back in seconds (`"2592000s"`).
mod retention {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&format!("{}s", d.as_secs())),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => super::parse_span(&text).map(Some).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_as_people_write_them() {
        assert_eq!(parse_span("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_span("1d12h"), Ok(Duration::from_secs(36 * 3_600)));
        assert_eq!(parse_span("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_span("2w"), Ok(Duration::from_secs(14 * 86_400)));
        for bad in ["", "30", "d", "30x", "1.5d", "-1d", "99999999999999999999w"] {
            assert!(parse_span(bad).unwrap_err().contains("not a duration"), "{bad}");
        }
        assert!(parse_span("0d").unwrap_err().contains("longer than zero"));
    }

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
