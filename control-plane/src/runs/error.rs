//! What a run operation can fail with. The gRPC adapter (`api::runs`) maps
//! it to a status; the wire error (`shared::error::Error`) stays the
//! vocabulary of the layers below (agent, lifecycle), carried in `Other`.

use shared::error::{Error as WireError, ErrorCode};

use crate::lease::LeaseError;
use crate::sandbox;
use crate::store::{self, RunId};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field that cannot be acted on.
    #[error("{field}: {reason}")]
    InvalidField { field: String, reason: String },
    /// The harness cannot build a command from these options.
    #[error("{0}")]
    InvalidCommand(String),
    /// Another run has this id (of any tenant: the id space is shared).
    #[error("run {0} already exists")]
    AlreadyExists(RunId),
    /// No such run for this tenant (another tenant's is the same).
    #[error("run {0} not found")]
    NotFound(RunId),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// What the ensure of the run's sandbox was asked for, refused.
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    /// From the layers below: the sandbox lifecycle, the agent, a harness.
    #[error(transparent)]
    Other(#[from] WireError),
}

impl Error {
    pub fn invalid_field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidField { field: field.into(), reason: reason.into() }
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
        match e {
            Error::InvalidField { field, reason } => WireError::invalid_field(field, reason),
            Error::InvalidCommand(why) => WireError::new(ErrorCode::InvalidArgument, why),
            Error::AlreadyExists(run) => {
                WireError::new(ErrorCode::AlreadyExists, format!("run {run} already exists"))
            }
            Error::NotFound(run) => WireError::not_found(format!("run {run} not found")),
            Error::Store(e) => e.into(),
            Error::Lease(e) => e.into(),
            Error::Sandbox(e) => e.into(),
            Error::Other(e) => e,
        }
    }
}
