//! The closed label values of the metric families (run statuses, sweep
//! outcomes, fenced writes) and the label sets that carry them. Closed so a
//! typo cannot start a new series, and no label carries a caller's value.

use prometheus_client::encoding::EncodeLabelSet;

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
    /// An ended run older than the retention (`--retain-runs`) removed with its log.
    RunRemoved,
    /// An unused definition made from flags removed after its grace.
    DefinitionRemoved,
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

    pub const ALL: [SweepOutcome; 12] = {
        let mut all = [Self::JournalPruned; 12];
        let mut i = 0;
        while i < Self::PER_RUN.len() {
            all[i] = Self::PER_RUN[i];
            i += 1;
        }
        all[9] = Self::SandboxReclaimed;
        all[10] = Self::RunRemoved;
        all[11] = Self::DefinitionRemoved;
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
            Self::RunRemoved => "run_removed",
            Self::DefinitionRemoved => "definition_removed",
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
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Append => "append",
            Self::Finish => "finish",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StatusLabel {
    pub(super) status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: &'static str,
}

/// A fleet node, by the name the operator gave it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NodeLabel {
    pub(super) node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct WriteLabel {
    pub(super) write: &'static str,
}

/// A tenant (one of the operator's, never a caller's choice: the series
/// set stays as small as the tenant list) and a kind of model token.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TenantTokensLabel {
    pub(super) tenant: String,
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VersionLabel {
    pub(super) version: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunStatus;

    #[test]
    fn status_labels_are_the_store_statuses() {
        let (terminal, unfinished): (Vec<RunStatus>, Vec<RunStatus>) =
            RunStatus::ALL.into_iter().partition(|s| s.is_terminal());
        assert_eq!(terminal.iter().map(|s| s.as_str()).collect::<Vec<_>>(), TERMINAL_STATUSES);
        assert_eq!(unfinished.iter().map(|s| s.as_str()).collect::<Vec<_>>(), UNFINISHED_STATUSES);
    }
}
