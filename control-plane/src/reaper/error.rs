//! What a sweep, or one of its steps, can fail with, and the one mapping of
//! it to the wire error: the admin adapter's status, and the detail of a
//! run's report (what a client is told, never store internals).

use shared::error::{Error as WireError, ErrorCode};

use crate::lease::LeaseError;
use crate::{runs, sandbox, store};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another replica's sweep held the sweep lease past the wait.
    #[error("another replica's sweep did not end in time; try again")]
    Busy,
    /// A sweep of this tenant's own is running already (lease `lease`).
    #[error("a sweep of tenant {tenant} is running already; a tenant sweeps one at a time")]
    TenantBusy { tenant: String, lease: String },
    /// The sandbox's agent refused the exit probe.
    #[error("probing the journal: {}", .0.message())]
    Probe(tonic::Status),
    /// The sandbox's agent did not answer the exit probe in time.
    #[error("the sandbox's agent did not answer in time")]
    ProbeTimedOut,
    /// The sandbox's agent refused to list or delete journals.
    #[error("{}", .0.message())]
    Journals(tonic::Status),
    /// Destroying the sandbox of a terminal run failed.
    #[error("reclaiming the run's sandbox: {0}")]
    Reclaim(sandbox::Error),
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    #[error(transparent)]
    Runs(#[from] runs::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Lease(#[from] LeaseError),
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        match e {
            Error::Busy | Error::ProbeTimedOut => WireError::new(ErrorCode::Unavailable, e.to_string()),
            Error::TenantBusy { ref lease, .. } => {
                let lease = lease.clone();
                WireError::new(ErrorCode::ResourceExhausted, e.to_string()).with_meta("lease", lease)
            }
            Error::Probe(status) => WireError::from_status(&status).context("probing the journal"),
            Error::Journals(status) => WireError::from_status(&status),
            Error::Reclaim(e) => WireError::from(e).context("reclaiming the run's sandbox"),
            Error::Sandbox(e) => e.into(),
            Error::Runs(e) => e.into(),
            Error::Store(e) => e.into(),
            Error::Lease(e) => e.into(),
        }
    }
}

/// What a run's report says of an error: its message as a client sees it.
pub(super) fn told(e: impl Into<WireError>) -> String {
    e.into().message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_failures_keep_their_codes_and_say_what_was_being_done() {
        let busy = WireError::from(Error::Busy);
        assert_eq!(
            (busy.code, busy.message.as_str()),
            (ErrorCode::Unavailable, "another replica's sweep did not end in time; try again")
        );
        assert_eq!(WireError::from(Error::ProbeTimedOut).code, ErrorCode::Unavailable);
        let tenant = WireError::from(Error::TenantBusy {
            tenant: "t1".into(),
            lease: "reaper:sweep:tenant:t1".into(),
        });
        assert_eq!(
            (tenant.code, tenant.message.as_str()),
            (
                ErrorCode::ResourceExhausted,
                "a sweep of tenant t1 is running already; a tenant sweeps one at a time"
            )
        );
        assert_eq!(tenant.metadata.get("lease").map(String::as_str), Some("reaper:sweep:tenant:t1"));
        let refused = tonic::Status::from(WireError::new(ErrorCode::PermissionDenied, "no"));
        let probe = WireError::from(Error::Probe(refused));
        assert_eq!(
            (probe.code, probe.message.as_str()),
            (ErrorCode::PermissionDenied, "probing the journal: no")
        );
        let reclaim = WireError::from(Error::Reclaim(sandbox::Error::NotRunning("k".into())));
        assert_eq!(reclaim.code, ErrorCode::FailedPrecondition);
        assert_eq!(
            reclaim.message,
            "reclaiming the run's sandbox: sandbox k is not running; call EnsureSandbox to bring it back"
        );
    }

    #[test]
    fn a_report_tells_what_a_client_may_see_of_a_store_failure() {
        let db = store::Error::Corrupt("row 7 of runs".into());
        assert_eq!(told(Error::from(db)), "internal store error");
    }
}
