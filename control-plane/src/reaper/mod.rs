//! The reaper: closes out detached durable runs, prunes journals of
//! terminal runs, and destroys orphaned sandboxes.
//!
//! A sweep runs on one replica at a time, under the lease
//! [`SWEEP_LEASE`]: the server schedules one every
//! [`ReaperOptions::interval`] (a replica that finds the lease held skips
//! that turn) and `AdminService.Sweep` runs one on demand (waiting for the
//! lease). Each run it touches is also taken through its own run lease by
//! `Runs::try_take_over`, so even two sweeps at once cannot act on one run
//! twice: a sweep whose drive was superseded (its record claimed again at a
//! later epoch) counts the run `not_claimed` and leaves it to the successor.
//!
//! Per detached run (oldest detachment first, at most
//! [`ReaperOptions::max_runs`]), the journal is probed (`ProbeExit`; an
//! unknown state is never taken as finished):
//!
//! | probe | what the sweep does | outcome |
//! |---|---|---|
//! | finished | drive it to its terminal state through the takeover path, wait (per-run budget), destroy its sandbox | `finalized` (`reclaim_failed` if the destroy failed) |
//! | finished, drive overran the budget | stop the drive as a cancel (record `aborted`, sandbox destroyed) | `budget_exceeded` |
//! | running, detached for less than the TTL | nothing | `producing` |
//! | running, detached for the TTL or longer | record a cancel, drive it (the driver destroys the sandbox, writes `aborted`) | `expired` |
//! | unknown, agent unreachable, no sandbox | nothing | `unknown` |
//! | another replica holds the run's lease, took it over during the sweep, or it ended (or a client came back) meanwhile | nothing (an expired run's cancel is recorded for its holder) | `not_claimed` |
//! | anything else failed | nothing more | `failed` |
//!
//! Journals: in every sandbox the provider reports running, each journal
//! whose run record is terminal is deleted; a journal with no record at all
//! only once older than [`ReaperOptions::orphan_journal_age`]; anything not
//! proven terminal (running record, undecodable name, store error, record
//! of another tenant) is kept. At most
//! [`ReaperOptions::max_journal_deletions`] per sweep.
//!
//! Orphaned sandboxes: a sandbox the provider lists with Sandhold's labels,
//! made through this server's data dir (never another deployment's on a
//! shared Docker engine), of a tenant this deployment knows, that no
//! instance record points at and
//! no unfinished run lives in, older than
//! [`ReaperOptions::orphan_sandbox_grace`], is destroyed (under its sandbox
//! lease, so never during an ensure).
//!
//! Scope: the scheduled sweep covers every tenant; `AdminService.Sweep`
//! covers the caller's tenant only, unless the caller is an operator tenant
//! (or the single user), whose sweep covers every tenant.

mod detached;
mod journals;
mod orphans;
mod schedule;

use std::sync::Arc;
use std::time::Duration;

pub use crate::config::ReaperOptions;
use crate::context::Context;
use crate::metrics::SweepOutcome;
use crate::runs::Runs;
use crate::store::{RunId, Tenant};

/// The cluster-wide lease a sweep holds.
pub const SWEEP_LEASE: &str = "reaper:sweep";
/// Bound on reaching a sandbox's agent and asking it one thing.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a drive stopped for overrunning its budget may take to end.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// How long an on-demand sweep waits for another replica's sweep to end.
const LEASE_WAIT: Duration = Duration::from_secs(300);

/// Whose runs, journals and sandboxes a sweep covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Tenant(Tenant),
}

impl Scope {
    fn covers(&self, tenant: &Tenant) -> bool {
        match self {
            Scope::All => true,
            Scope::Tenant(t) => t == tenant,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::Tenant(_) => "tenant",
        }
    }
}

/// What a sweep did with one detached run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub run_id: RunId,
    pub outcome: SweepOutcome,
    pub detail: String,
    /// The drive overran its budget and was stopped; the record is terminal
    /// anyway (kept when `reclaim_failed` overwrote `budget_exceeded`).
    pub terminalized_anyway: bool,
}

impl RunReport {
    fn new(run_id: &RunId, outcome: SweepOutcome, detail: impl Into<String>) -> Self {
        Self { run_id: run_id.clone(), outcome, detail: detail.into(), terminalized_anyway: false }
    }
}

/// A sweep's tally.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub runs: Vec<RunReport>,
    pub journals_pruned: u64,
    pub journals_kept: u64,
    pub sandboxes_reclaimed: u64,
    /// A bound of the sweep (runs, deletions, the lease) cut it short.
    pub truncated: bool,
    pub elapsed: Duration,
}

impl Tally {
    /// Runs with `outcome`.
    pub fn count(&self, outcome: SweepOutcome) -> u64 {
        self.runs.iter().filter(|r| r.outcome == outcome).count() as u64
    }
}

/// The reaper of one replica. Cheap to clone.
#[derive(Clone)]
pub struct Reaper {
    inner: Arc<Inner>,
}

struct Inner {
    cx: Context,
    runs: Runs,
    options: ReaperOptions,
    /// Single-user mode: the one tenant is known without a token.
    single_user: bool,
}

impl Reaper {
    pub fn new(cx: Context, runs: Runs, options: ReaperOptions, single_user: bool) -> Self {
        Self { inner: Arc::new(Inner { cx, runs, options, single_user }) }
    }

    pub fn options(&self) -> &ReaperOptions {
        &self.inner.options
    }
}

/// How a drive the sweep waited for ended.
enum Driven {
    Terminal,
    /// Overran the budget, was stopped, and the record is terminal.
    Overran,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::provider::LABEL_TENANT;

    #[test]
    fn options_refuse_a_zero_ttl_or_budget() {
        assert!(ReaperOptions::default().validate().is_ok());
        let zero_ttl = ReaperOptions { detached_run_ttl: Duration::ZERO, ..Default::default() };
        assert!(zero_ttl.validate().is_err());
        let zero_budget = ReaperOptions { run_budget: Duration::ZERO, ..Default::default() };
        assert!(zero_budget.validate().is_err());
    }

    #[test]
    fn a_tenant_scope_covers_only_its_tenant() {
        let acme = Tenant::new("acme");
        assert!(Scope::All.covers(&acme));
        assert!(Scope::Tenant(acme.clone()).covers(&acme));
        assert!(!Scope::Tenant(Tenant::new("globex")).covers(&acme));
        assert_eq!(Reaper::scope_labels(&Scope::All), BTreeMap::new());
        assert_eq!(
            Reaper::scope_labels(&Scope::Tenant(acme)).get(LABEL_TENANT).map(String::as_str),
            Some("acme")
        );
    }
}
