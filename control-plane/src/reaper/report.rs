//! What a sweep covers ([`Scope`]) and what it reports: a [`RunReport`]
//! per detached run and the sweep's [`Tally`].

use std::time::Duration;

use crate::metrics::SweepOutcome;
use crate::store::{RunId, Tenant};

/// Whose runs, journals and sandboxes a sweep covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Tenant(Tenant),
}

impl Scope {
    pub(super) fn covers(&self, tenant: &Tenant) -> bool {
        match self {
            Scope::All => true,
            Scope::Tenant(t) => t == tenant,
        }
    }

    /// The one tenant covered; `None`: every tenant.
    pub fn tenant(&self) -> Option<&Tenant> {
        match self {
            Scope::All => None,
            Scope::Tenant(t) => Some(t),
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
    pub(super) fn new(run_id: &RunId, outcome: SweepOutcome, detail: impl Into<String>) -> Self {
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
    /// Instance records and warm pool rows of sandboxes on a node that is
    /// gone (removed, lost), forgotten.
    pub sandboxes_forgotten: u64,
    /// Ended runs removed by the retention (`--retain-runs`).
    pub runs_removed: u64,
    /// Unused definitions made from flags removed
    /// (`--unused-definition-grace-ms`).
    pub definitions_removed: u64,
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::provider::LABEL_TENANT;
    use crate::reaper::Reaper;

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
