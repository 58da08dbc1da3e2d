//! What a provider operation can fail with, and the one mapping of it to the
//! wire error. The agent's handshake errors (protocol, token) pass through
//! as the agent client said them.

use std::path::PathBuf;

use shared::error::{Error as WireError, ErrorCode};

use super::ProviderKind;
use crate::provision::InvalidField;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A spec field the provider cannot act on.
    #[error(transparent)]
    InvalidField(#[from] InvalidField),
    /// A directory that would put agent sockets past the kernel's limit.
    #[error("{0}")]
    SocketPathTooLong(String),
    /// No such sandbox, container or image.
    #[error("{0}")]
    NotFound(String),
    /// An optional operation this provider lacks.
    #[error("the {kind} provider does not support the {capability} capability")]
    Unsupported { kind: ProviderKind, capability: String },
    /// What this host or this sandbox is in no state to do (no agent
    /// binary, a read-only root to commit, a host dir that lost its token).
    #[error("{0}")]
    Refused(String),
    /// The image is not in the local engine, and Sandhold never pulls.
    #[error(
        "image {0} is not in the local Docker engine and Sandhold never pulls (there is no registry here): build \
         it locally (e.g. scripts/build-test-images) or docker load it"
    )]
    ImageMissing(String),
    /// The Docker engine refused the request as malformed (HTTP 400).
    #[error("{0}")]
    EngineRefused(String),
    /// The Docker engine answered with a status nobody expects.
    #[error("{0}")]
    EngineFailed(String),
    /// The engine, or the sandbox's agent, does not answer (yet).
    #[error("{0}")]
    Unavailable(String),
    /// A file of the host could not be used.
    #[error("{doing} {}: {source}", path.display())]
    Io { doing: &'static str, path: PathBuf, source: std::io::Error },
    /// Something of this process failed (a thread, an encoding).
    #[error("{0}")]
    Internal(String),
    /// The sandbox's agent refused the handshake (another protocol, a
    /// wrong token).
    #[error(transparent)]
    Agent(WireError),
    /// What the node holding the sandbox answered (its code kept).
    #[error(transparent)]
    Node(WireError),
}

impl Error {
    /// An I/O failure while `doing` something to `path`.
    pub(crate) fn io(path: &std::path::Path, doing: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Io { doing, path, source }
    }
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::InvalidField(e) => e.into(),
            Error::SocketPathTooLong(_) | Error::EngineRefused(_) => {
                WireError::new(ErrorCode::InvalidArgument, message)
            }
            Error::NotFound(_) => WireError::not_found(message),
            Error::Unsupported { kind, capability } => WireError::new(ErrorCode::Unsupported, message)
                .with_meta("capability", capability)
                .with_meta("provider", kind.as_str()),
            Error::Refused(_) => WireError::new(ErrorCode::FailedPrecondition, message),
            Error::ImageMissing(image) => {
                WireError::new(ErrorCode::FailedPrecondition, message).with_meta("image", image)
            }
            Error::EngineFailed(_) | Error::Io { .. } | Error::Internal(_) => WireError::internal(message),
            Error::Unavailable(_) => WireError::new(ErrorCode::Unavailable, message),
            Error::Agent(e) | Error::Node(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_keeps_its_code_and_names_the_capability_and_provider() {
        let wire = WireError::from(Error::Unsupported {
            kind: ProviderKind::new(&crate::provider::docker::KIND),
            capability: "fork".into(),
        });
        assert_eq!(wire.code, ErrorCode::Unsupported);
        assert_eq!(wire.message, "the docker provider does not support the fork capability");
        assert_eq!(wire.metadata.get("capability").map(String::as_str), Some("fork"));
        assert_eq!(wire.metadata.get("provider").map(String::as_str), Some("docker"));
    }

    #[test]
    fn refusals_keep_their_codes_messages_and_details() {
        let field = WireError::from(Error::from(InvalidField::new("docker.user", "is root")));
        assert_eq!(
            (field.code, field.message.as_str()),
            (ErrorCode::InvalidArgument, "docker.user: is root")
        );
        assert_eq!(field.field_violations, [("docker.user".to_string(), "is root".to_string())]);
        let image = WireError::from(Error::ImageMissing("img:1".into()));
        assert_eq!(image.code, ErrorCode::FailedPrecondition);
        assert!(
            image.message.starts_with("image img:1 is not in the local Docker engine"),
            "{}",
            image.message
        );
        assert_eq!(image.metadata.get("image").map(String::as_str), Some("img:1"));
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let io = WireError::from(Error::io(std::path::Path::new("/x/token"), "reading")(io));
        assert_eq!((io.code, io.message.as_str()), (ErrorCode::Internal, "reading /x/token: denied"));
        let agent =
            WireError::new(ErrorCode::ProtocolMismatch, "v2").with_meta("agent_protocol_version", "2");
        assert_eq!(WireError::from(Error::Agent(agent.clone())), agent, "the agent's error passes as it is");
        for (e, code) in [
            (Error::NotFound("gone".into()), ErrorCode::NotFound),
            (Error::Refused("no".into()), ErrorCode::FailedPrecondition),
            (Error::EngineRefused("bad".into()), ErrorCode::InvalidArgument),
            (Error::EngineFailed("500".into()), ErrorCode::Internal),
            (Error::Unavailable("down".into()), ErrorCode::Unavailable),
            (Error::SocketPathTooLong("long".into()), ErrorCode::InvalidArgument),
        ] {
            let message = e.to_string();
            let wire = WireError::from(e);
            assert_eq!((wire.code, wire.message), (code, message));
            assert!(wire.metadata.is_empty() && wire.field_violations.is_empty());
        }
    }
}
