//! What a snapshot operation can fail with. The gRPC adapter
//! (`api::snapshot`) maps it to a status through the wire error
//! (`shared::error::Error`), the form the layers above it (lifecycle, run
//! driver) take it in.

use shared::error::{Error as WireError, ErrorCode};

use crate::provision::InvalidField;
use crate::store;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field that cannot be acted on.
    #[error(transparent)]
    InvalidField(#[from] InvalidField),
    /// The sandbox's agent refused or failed a call made while `doing`.
    #[error("{doing}: {}", .status.message())]
    Agent { doing: String, status: tonic::Status },
    /// A file's bytes no longer hash to its manifest entry when uploaded.
    #[error("a file changed while it was captured ({0}); save again")]
    ChangedWhileCaptured(String),
    /// The checkpoint has no file at `path`.
    #[error("no file {path:?} in checkpoint {checkpoint_id}")]
    NoSuchFile { path: String, checkpoint_id: String },
    /// What the agent sent, or a store holds, breaks the protocol or its
    /// hashes.
    #[error("{0}")]
    Corrupt(String),
    #[error(transparent)]
    Store(#[from] store::Error),
    /// From the layers below: a manifest `shared::snapshot` refuses.
    #[error(transparent)]
    Other(#[from] WireError),
}

impl Error {
    pub fn invalid_field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidField(InvalidField::new(field, reason))
    }

    /// An agent call's status, said to have happened while `doing`.
    pub(super) fn agent(doing: impl Into<String>) -> impl FnOnce(tonic::Status) -> Self {
        move |status| Self::Agent { doing: doing.into(), status }
    }
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidField(e) => e.into(),
            Error::Agent { doing, status } => WireError::from_status(&status).context(doing),
            e @ Error::ChangedWhileCaptured(_) => {
                WireError::new(ErrorCode::FailedPrecondition, e.to_string())
            }
            e @ Error::NoSuchFile { .. } => WireError::not_found(e.to_string()),
            Error::Corrupt(why) => WireError::internal(why),
            Error::Store(e) => e.into(),
            Error::Other(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_status_keeps_its_code_and_says_what_was_being_done() {
        let status = tonic::Status::from(WireError::new(ErrorCode::Unavailable, "socket gone"));
        let wire = WireError::from(Error::agent("capturing the workspace")(status));
        assert_eq!(wire.code, ErrorCode::Unavailable);
        assert_eq!(wire.message, "capturing the workspace: socket gone");
    }

    #[test]
    fn refusals_map_to_their_codes() {
        let changed = WireError::from(Error::ChangedWhileCaptured("hash mismatch".into()));
        assert_eq!(changed.code, ErrorCode::FailedPrecondition);
        assert_eq!(changed.message, "a file changed while it was captured (hash mismatch); save again");
        let missing = WireError::from(Error::NoSuchFile { path: "a.txt".into(), checkpoint_id: "c1".into() });
        assert_eq!(
            (missing.code, missing.message.as_str()),
            (ErrorCode::NotFound, "no file \"a.txt\" in checkpoint c1")
        );
    }
}
