//! What a run operation can fail with, and the run driver's failures (a
//! run that fails records the mapped code and message). The gRPC adapter
//! (`api::runs`) maps it to a status; the layers below (the sandbox
//! lifecycle, provisioning, the store, the lease) keep their own errors,
//! held here as variants, and the agent's answers travel as it gave them.

use shared::error::{Error as WireError, ErrorCode};

use crate::lease::LeaseError;
use crate::provision::{self, InvalidField};
use crate::sandbox;
use crate::store::{self, RunId};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field that cannot be acted on.
    #[error(transparent)]
    InvalidField(#[from] InvalidField),
    /// The harness cannot build a command from these options.
    #[error("{0}")]
    InvalidCommand(String),
    /// Another run of the tenant has this id (run ids are per tenant).
    #[error("run {0} already exists")]
    AlreadyExists(RunId),
    /// Over one of the tenant's quotas.
    #[error(transparent)]
    OverQuota(#[from] crate::config::OverLimit),
    /// No such run for this tenant (another tenant's is the same).
    #[error("run {0} not found")]
    NotFound(RunId),
    /// A run's record has no spec to drive it by.
    #[error("run {0} has no spec on its record")]
    NoSpec(RunId),
    /// What a run's record or stored log holds does not decode.
    #[error("{0}")]
    Corrupt(String),
    /// A taken-over run whose first driver died before its sandbox was
    /// recorded.
    #[error("the server that started this run stopped before its sandbox was ready")]
    SandboxNeverReady,
    /// The journal was never started in the sandbox.
    #[error(
        "the run's journal does not exist in its sandbox: the server that started the run stopped before the \
         command was started"
    )]
    NoJournal,
    /// The run's supervisor is gone without writing its exit sentinel.
    #[error("the run's supervisor in the sandbox is gone and left no exit sentinel")]
    SupervisorGone,
    /// The command printed a journal line longer than the agent serves.
    #[error("{0}")]
    LineTooLong(String),
    /// The journal reached the run's byte cap; the agent's supervisor
    /// stopped the command. The agent's error, as it gave it.
    #[error("{}", .0.message)]
    JournalFull(WireError),
    /// The journal replays to another chunk than the log holds at `index`.
    #[error("the journal does not replay the stored log: chunk {index} differs")]
    Diverged { index: usize, stored: String, replayed: String },
    /// Another writer kept appending to the log after this replica's claim.
    #[error(
        "run {run}'s stored log kept growing for {elapsed_ms} ms after this replica claimed it ({grew} chunks \
         landed): another writer is still appending"
    )]
    StillWritten { run: RunId, elapsed_ms: u128, grew: u64 },
    /// The server is shutting down under an attached client.
    #[error("the server is shutting down: attach again (any replica) after the last offset received")]
    ShuttingDown,
    /// The driver panicked (the run fails rather than hang).
    #[error("the run driver panicked: {0}")]
    Panicked(String),
    /// The sandbox's agent refused to start the journaled command.
    #[error("starting the run in the sandbox: {}", .0.message())]
    StartRefused(tonic::Status),
    /// The sandbox's agent lacks the values of the run's secrets (it
    /// restarted) and no ensure handed them back within the reconnect
    /// budget: it never serves the run's output unmasked.
    #[error("reading the run's journal: {}", .0.message())]
    SecretsMissing(tonic::Status),
    /// The run's sandbox could not be reached within the reconnect budget.
    #[error("reaching the run's sandbox: {0}")]
    Unreachable(sandbox::Error),
    /// The definition's model access for the run's harness is unusable.
    #[error("the run's model access: {0}")]
    Egress(String),
    /// The run's model upstream stayed unreachable past its bound; the CLI
    /// is stopped.
    #[error("the model upstream {upstream} has been unreachable for {} s: {error}", waited_ms / 1000)]
    ModelUnreachable { upstream: String, error: String, waited_ms: u64 },
    /// The run's model usage reached its token budget (the run's, or the
    /// tenant's daily one): its broker refuses further model requests, and
    /// the CLI is stopped; or a run started past the tenant's.
    #[error("the model token budget is used up ({limit} = {max}, {used} used)")]
    BudgetExceeded { limit: String, max: u64, used: u64 },
    /// No such request in the run (not recorded in its sandbox).
    #[error("run {run} has no request {request}")]
    RequestNotFound { run: RunId, request: String },
    /// The request was answered already, or the run has ended.
    #[error("{0}")]
    RequestClosed(String),
    /// The sandbox's agent refused an answer for another reason.
    #[error("answering in the run's sandbox: {}", .0.message())]
    AnswerRefused(tonic::Status),
    /// The files that carry secrets could not be written for this run.
    #[error("projecting skills for the run: {0}")]
    Projecting(provision::Error),
    #[error(transparent)]
    Provision(#[from] provision::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The run's sandbox: its ensure was refused or failed.
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    /// A checkpoint of a set of attempts could not be saved or read.
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::Error),
    /// A set of attempts cannot do what was asked in its state (no
    /// portable snapshots, an attempt not evaluated yet, another promoted).
    #[error("{0}")]
    Attempts(String),
}

impl Error {
    /// The failure a Follow answered with when the journal is over one of
    /// its bounds (these end the run; anything else is retried).
    pub(super) fn over_a_journal_bound(status: &tonic::Status) -> Option<Self> {
        let e = WireError::from_status(status);
        match e.code {
            ErrorCode::LineTooLong => Some(Self::LineTooLong(e.message)),
            ErrorCode::JournalFull => Some(Self::JournalFull(e)),
            _ => None,
        }
    }

    /// A failure that ends the run while its command may still run, so the
    /// command must be stopped.
    pub(super) fn outlives_the_command(&self) -> bool {
        // A full disk: the command would go on filling it (a local
        // sandbox's journal is on it), and destroying its sandbox is what
        // frees room for the run's end to be recorded.
        matches!(
            self,
            Self::LineTooLong(_)
                | Self::ModelUnreachable { .. }
                | Self::BudgetExceeded { .. }
                | Self::Store(store::Error::StorageFull(_))
        )
    }

    /// A store lookup of `run`, where NotFound names the run.
    pub(super) fn lookup(run: &RunId) -> impl FnOnce(store::Error) -> Self + '_ {
        move |e| match e {
            store::Error::NotFound(_) => Self::NotFound(run.clone()),
            other => Self::Store(other),
        }
    }
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::InvalidField(e) => e.into(),
            Error::InvalidCommand(_) => WireError::new(ErrorCode::InvalidArgument, message),
            Error::AlreadyExists(_) => WireError::new(ErrorCode::AlreadyExists, message),
            Error::OverQuota(e) => e.into(),
            Error::NotFound(_) => WireError::not_found(message),
            Error::NoSpec(_) | Error::SandboxNeverReady | Error::NoJournal | Error::SupervisorGone => {
                WireError::new(ErrorCode::FailedPrecondition, message)
            }
            Error::Corrupt(_) | Error::Panicked(_) => WireError::internal(message),
            Error::LineTooLong(_) => WireError::new(ErrorCode::LineTooLong, message),
            Error::JournalFull(e) => e,
            Error::Diverged { index, stored, replayed } => WireError::new(ErrorCode::ReplayDiverged, message)
                .with_meta("index", index.to_string())
                .with_meta("stored_fingerprint", stored)
                .with_meta("replayed_fingerprint", replayed),
            Error::StillWritten { .. } => WireError::new(ErrorCode::ClaimLost, message),
            Error::ShuttingDown => WireError::new(ErrorCode::Unavailable, message),
            Error::StartRefused(status) => {
                WireError::from_status(&status).context("starting the run in the sandbox")
            }
            Error::SecretsMissing(status) => {
                WireError::from_status(&status).context("reading the run's journal")
            }
            Error::Unreachable(e) => WireError::from(e).context("reaching the run's sandbox"),
            Error::Projecting(e) => WireError::from(e).context("projecting skills for the run"),
            Error::RequestNotFound { .. } => WireError::not_found(message),
            Error::RequestClosed(_) => WireError::new(ErrorCode::FailedPrecondition, message),
            Error::AnswerRefused(status) => {
                WireError::from_status(&status).context("answering in the run's sandbox")
            }
            Error::Egress(_) => WireError::new(ErrorCode::FailedPrecondition, message),
            Error::ModelUnreachable { upstream, .. } => {
                WireError::new(ErrorCode::ModelUnreachable, message).with_meta("upstream", upstream)
            }
            Error::BudgetExceeded { limit, max, used } => WireError::new(ErrorCode::BudgetExceeded, message)
                .with_meta("limit", limit)
                .with_meta("max", max.to_string())
                .with_meta("used", used.to_string()),
            Error::Provision(e) => e.into(),
            Error::Store(e) => e.into(),
            Error::Lease(e) => e.into(),
            Error::Sandbox(e) => e.into(),
            Error::Snapshot(e) => e.into(),
            Error::Attempts(_) => WireError::new(ErrorCode::FailedPrecondition, message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_their_codes_and_messages() {
        let run = RunId::parse("r1").unwrap();
        let field = WireError::from(Error::from(InvalidField::new("thread_id", "required")));
        assert_eq!((field.code, field.message.as_str()), (ErrorCode::InvalidArgument, "thread_id: required"));
        assert_eq!(field.field_violations, [("thread_id".to_string(), "required".to_string())]);
        let taken = WireError::from(Error::AlreadyExists(run.clone()));
        assert_eq!((taken.code, taken.message.as_str()), (ErrorCode::AlreadyExists, "run r1 already exists"));
        let missing = WireError::from(Error::NotFound(run));
        assert_eq!((missing.code, missing.message.as_str()), (ErrorCode::NotFound, "run r1 not found"));
        assert_eq!(WireError::from(Error::SupervisorGone).code, ErrorCode::FailedPrecondition);
        assert_eq!(WireError::from(Error::ShuttingDown).code, ErrorCode::Unavailable);
    }

    #[test]
    fn a_divergence_carries_where_and_both_fingerprints() {
        let wire = WireError::from(Error::Diverged { index: 3, stored: "aa".into(), replayed: "bb".into() });
        assert_eq!(wire.code, ErrorCode::ReplayDiverged);
        assert_eq!(wire.message, "the journal does not replay the stored log: chunk 3 differs");
        for (key, value) in [("index", "3"), ("stored_fingerprint", "aa"), ("replayed_fingerprint", "bb")] {
            assert_eq!(wire.metadata.get(key).map(String::as_str), Some(value), "{key}");
        }
    }

    #[test]
    fn what_the_driver_was_doing_prefixes_the_cause_and_keeps_its_code() {
        let agent = tonic::Status::from(WireError::new(ErrorCode::PermissionDenied, "no"));
        let start = WireError::from(Error::StartRefused(agent));
        assert_eq!(
            (start.code, start.message.as_str()),
            (ErrorCode::PermissionDenied, "starting the run in the sandbox: no")
        );
        let gone = WireError::from(Error::Unreachable(sandbox::Error::NotFound("k".into())));
        assert_eq!(
            (gone.code, gone.message.as_str()),
            (ErrorCode::NotFound, "reaching the run's sandbox: sandbox k not found")
        );
        let secret = provision::Error::SecretNotPassed {
            needs: "MCP skill \"m\": header \"h\" needs".into(),
            name: "K".into(),
        };
        let projecting = WireError::from(Error::Projecting(secret));
        assert_eq!(projecting.code, ErrorCode::FailedPrecondition);
        assert!(
            projecting.message.starts_with("projecting skills for the run: MCP skill"),
            "{}",
            projecting.message
        );
        assert_eq!(projecting.metadata.get("secret").map(String::as_str), Some("K"));
    }
}
