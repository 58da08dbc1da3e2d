//! What a sandbox operation can fail with. The gRPC adapters
//! (`api::sandbox`, `api::snapshot`) map it to a status; the wire error
//! (`shared::error::Error`) stays the vocabulary of the lifecycle and the
//! definition checks, carried in `Other`.

use shared::error::{Error as WireError, ErrorCode};

use crate::provision::InvalidField;
use crate::{snapshot, store};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field that cannot be acted on.
    #[error(transparent)]
    InvalidField(#[from] InvalidField),
    /// No such definition for this tenant (another tenant's is the same).
    #[error("definition {0} not found")]
    DefinitionNotFound(String),
    /// A save names a thread none of whose sandboxes is recorded.
    #[error("thread {0} has no sandbox to save; EnsureSandbox first")]
    NoSandboxToSave(String),
    /// A save from a sandbox of a definition with `reuse: none`.
    #[error("the definition has `reuse: none`: its sandboxes are per run and cannot save a named checkpoint")]
    PerRunSandbox,
    /// A save needs the value of every declared secret, to zero it.
    #[error("the value of secret {0} is not known to this server; EnsureSandbox with it, then save")]
    SecretNotKnown(String),
    /// The channel to the agent closed before the request was sent.
    #[error("{0}")]
    Closed(&'static str),
    /// A status of the sandbox's agent, or of the caller's own request
    /// stream, passed on as it is.
    #[error(transparent)]
    Rpc(#[from] tonic::Status),
    #[error(transparent)]
    Snapshot(#[from] snapshot::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    /// From the layers below: the lifecycle, the definition checks.
    #[error(transparent)]
    Other(#[from] WireError),
}

impl Error {
    pub fn invalid_field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidField(InvalidField::new(field, reason))
    }
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        let precondition = |e: &Error| WireError::new(ErrorCode::FailedPrecondition, e.to_string());
        match e {
            Error::InvalidField(e) => e.into(),
            e @ Error::DefinitionNotFound(_) => WireError::not_found(e.to_string()),
            e @ (Error::NoSandboxToSave(_) | Error::PerRunSandbox) => precondition(&e),
            Error::SecretNotKnown(ref name) => precondition(&e).with_meta("secret", name.clone()),
            Error::Closed(why) => WireError::internal(why),
            Error::Rpc(status) => WireError::from_status(&status),
            Error::Snapshot(e) => e.into(),
            Error::Store(e) => e.into(),
            Error::Other(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_refusals_are_failed_preconditions_naming_what_is_missing() {
        let unknown = WireError::from(Error::SecretNotKnown("TOKEN".into()));
        assert_eq!(unknown.code, ErrorCode::FailedPrecondition);
        assert_eq!(unknown.metadata.get("secret").map(String::as_str), Some("TOKEN"));
        let none = WireError::from(Error::NoSandboxToSave("t1".into()));
        assert_eq!(none.message, "thread t1 has no sandbox to save; EnsureSandbox first");
        assert_eq!(WireError::from(Error::PerRunSandbox).code, ErrorCode::FailedPrecondition);
        let missing = WireError::from(Error::DefinitionNotFound("d".into()));
        assert_eq!((missing.code, missing.message.as_str()), (ErrorCode::NotFound, "definition d not found"));
    }
}
