//! What a snapshot operation can fail with, and the one mapping of it to the
//! wire error. The gRPC adapter (`api::snapshot`) turns that into a status;
//! the layers above (the sandbox lifecycle, the run driver) hold it as a
//! variant of their own errors.

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
    /// A file (`path` set) or the whole snapshot (`path` empty) is over a
    /// maximum, as the manifest declares it or as its bytes arrive; the
    /// save records nothing.
    #[error("{} is {size} bytes, over the maximum of {} bytes ({setting}); exclude it in the snapshot policy or raise the maximum", shown(.path), .max.bytes, setting = .max.setting)]
    TooLarge { path: String, size: u64, max: crate::config::ByteMax },
    /// The checkpoint has no file at `path`.
    #[error("no file {path:?} in checkpoint {checkpoint_id}")]
    NoSuchFile { path: String, checkpoint_id: String },
    /// What the agent sent, or a store holds, breaks the protocol or its
    /// hashes.
    #[error("{0}")]
    Corrupt(String),
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A manifest `shared::snapshot` refuses, as it says why (the path, the
    /// violation).
    #[error(transparent)]
    Manifest(WireError),
}

/// How a refusal names what is too large.
fn shown(path: &str) -> String {
    if path.is_empty() { "the snapshot".to_string() } else { format!("{path:?}") }
}

impl Error {
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
            Error::TooLarge { ref path, size, max } => {
                let (path, message) = (path.clone(), e.to_string());
                WireError::new(ErrorCode::SnapshotTooLarge, message)
                    .with_meta("path", path)
                    .with_meta("size", size.to_string())
                    .with_meta("max", max.bytes.to_string())
                    .with_meta("limit", max.setting)
            }
            e @ Error::NoSuchFile { .. } => WireError::not_found(e.to_string()),
            Error::Corrupt(why) => WireError::internal(why),
            Error::Store(e) => e.into(),
            Error::Manifest(e) => e,
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
        let max = crate::config::ByteMax { bytes: 1024, setting: "max-snapshot-file-bytes" };
        let big = WireError::from(Error::TooLarge { path: "big.bin".into(), size: 4096, max });
        assert_eq!(big.code, ErrorCode::SnapshotTooLarge);
        assert_eq!(
            big.message,
            "\"big.bin\" is 4096 bytes, over the maximum of 1024 bytes (max-snapshot-file-bytes); \
             exclude it in the snapshot policy or raise the maximum"
        );
        let meta = |k: &str| big.metadata.get(k).cloned().unwrap_or_default();
        assert_eq!(
            (meta("path"), meta("size"), meta("max"), meta("limit")),
            ("big.bin".into(), "4096".into(), "1024".into(), "max-snapshot-file-bytes".into())
        );
        let whole = Error::TooLarge { path: String::new(), size: 4096, max };
        assert!(whole.to_string().starts_with("the snapshot is 4096 bytes"), "{whole}");
        let missing = WireError::from(Error::NoSuchFile { path: "a.txt".into(), checkpoint_id: "c1".into() });
        assert_eq!(
            (missing.code, missing.message.as_str()),
            (ErrorCode::NotFound, "no file \"a.txt\" in checkpoint c1")
        );
    }
}
