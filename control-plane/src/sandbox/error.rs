//! What a sandbox operation can fail with: the public operations of
//! [`Sandboxes`](super::Sandboxes) and the lifecycle below them (ensure,
//! the live agent, destroy), and the one mapping of it to the wire error.
//! The gRPC adapters (`api::sandbox`, `api::snapshot`) turn that into a
//! status. The layers below keep their own errors, held here as variants;
//! only the sandbox agent's answers travel as it gave them.

use shared::error::{Error as WireError, ErrorCode};

use crate::lease::LeaseError;
use crate::provider::{self, ProviderKind};
use crate::provision::{self, InvalidField, Violations};
use crate::{snapshot, store};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field that cannot be acted on.
    #[error(transparent)]
    InvalidField(#[from] InvalidField),
    /// A definition refused by its validation or the operator's policy.
    #[error(transparent)]
    Invalid(#[from] Violations),
    /// A definition asks for what is not built yet.
    #[error("{0}")]
    Unimplemented(String),
    /// No such definition for this tenant (another tenant's is the same).
    #[error("definition {0} not found")]
    DefinitionNotFound(String),
    /// A stored definition that does not decode.
    #[error("stored sandbox definition is unreadable: {0}")]
    CorruptDefinition(&'static str),
    /// No such sandbox for this tenant (another tenant's is the same).
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// The sandbox is recorded but its provider has it stopped or gone.
    #[error("sandbox {0} is not running; call EnsureSandbox to bring it back")]
    NotRunning(String),
    /// The definition's provider is off on this server, and why.
    #[error("the {kind} provider is not available on this server: {why}")]
    ProviderOff { kind: ProviderKind, why: String },
    /// An instance record names a provider this server does not know.
    #[error("instance of unknown provider {0:?}")]
    UnknownProvider(String),
    /// The wait for the sandbox's lease ended before it was granted.
    #[error("{0}")]
    Cancelled(&'static str),
    /// Another replica took the sandbox's lease during an ensure.
    #[error("lost the lease on sandbox {0} while ensuring it; retry")]
    LeaseLost(String),
    /// A save names a thread none of whose sandboxes is recorded.
    #[error("thread {0} has no sandbox to save; EnsureSandbox first")]
    NoSandboxToSave(String),
    /// A save from a sandbox of a definition with `reuse: none`.
    #[error("the definition has `reuse: none`: its sandboxes are per run and cannot save a named checkpoint")]
    PerRunSandbox,
    /// A save needs the value of every declared secret, to zero it.
    #[error("the value of secret {0} is not known to this server; EnsureSandbox with it, then save")]
    SecretNotKnown(String),
    /// git in the sandbox refused (its message), or is not there.
    #[error("{0}")]
    Git(String),
    /// The channel to the agent closed before the request was sent.
    #[error("{0}")]
    Closed(&'static str),
    /// A status of the sandbox's agent, or of the caller's own request
    /// stream, passed on as it is.
    #[error(transparent)]
    Rpc(#[from] tonic::Status),
    /// Over one of the tenant's quotas.
    #[error(transparent)]
    OverQuota(#[from] crate::config::OverLimit),
    /// The sandbox's agent could not be reached or refused the handshake.
    #[error(transparent)]
    Agent(WireError),
    #[error(transparent)]
    Provider(#[from] provider::Error),
    /// Provisioning the workspace of a new sandbox failed.
    #[error(transparent)]
    Provision(#[from] provision::Error),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Snapshot(#[from] snapshot::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    /// No node can take a new sandbox of the definition, and why.
    #[error("no node can take this sandbox: {0}")]
    Unplaceable(String),
    /// The node the sandbox lived on is gone (removed, or silent past the
    /// grace period): the sandbox is given up.
    #[error("sandbox {key} is lost: {why}")]
    SandboxLost { key: String, node: String, why: String },
    /// The node stopped answering while it made the sandbox (its daemon
    /// died, a partition): nothing of it was recorded.
    #[error(
        "node {node} stopped answering while it made this sandbox; nothing of it was kept, retry (a new one \
         is placed, there once the node is back): {why}"
    )]
    NodeFailed { node: String, why: String },
    /// A live network rule outside the definition's or the operator's
    /// bounds, and which.
    #[error("{0}")]
    OutsideBounds(String),
    /// Live network rules for a sandbox whose definition gives it no proxy.
    #[error(
        "sandbox {0}: its definition gives it no proxy (no network.allow_hosts, rules or credentials), so live \
         network rules would change nothing"
    )]
    NoProxy(String),
    /// The fleet (the node the sandbox is on) refused.
    #[error(transparent)]
    Fleet(#[from] crate::node::Error),
}

impl Error {
    /// `node` stopped answering while it made a sandbox, as `why` says.
    pub fn node_failed(node: &str, why: &dyn std::fmt::Display) -> Self {
        Self::NodeFailed { node: node.to_string(), why: why.to_string() }
    }

    /// Whether the sandbox is given up for good (waiting cannot bring it back).
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::SandboxLost { .. })
    }

    /// Whether this travels as NOT_FOUND: the sandbox, or what it was asked
    /// about, does not exist (a stopped run's sandbox may be gone already).
    pub fn is_not_found(&self) -> bool {
        let status = |s: &tonic::Status| WireError::from_status(s).code == ErrorCode::NotFound;
        match self {
            Self::NotFound(_) | Self::DefinitionNotFound(_) => true,
            Self::Provider(provider::Error::NotFound(_))
            | Self::Snapshot(snapshot::Error::NoSuchFile { .. }) => true,
            Self::Agent(e)
            | Self::Provider(provider::Error::Agent(e))
            | Self::Provision(provision::Error::Agent(e)) => e.code == ErrorCode::NotFound,
            Self::Rpc(s) | Self::Snapshot(snapshot::Error::Agent { status: s, .. }) => status(s),
            Self::Store(e) | Self::Snapshot(snapshot::Error::Store(e)) => e.code() == ErrorCode::NotFound,
            _ => false,
        }
    }
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        let precondition = || WireError::new(ErrorCode::FailedPrecondition, message.clone());
        match e {
            Error::InvalidField(e) => e.into(),
            Error::Invalid(e) => e.into(),
            Error::Unimplemented(_) => WireError::new(ErrorCode::Unimplemented, message),
            Error::OutsideBounds(_) => WireError::new(ErrorCode::PermissionDenied, message),
            Error::DefinitionNotFound(_) | Error::NotFound(_) => WireError::not_found(message),
            Error::NoSandboxToSave(_)
            | Error::PerRunSandbox
            | Error::NotRunning(_)
            | Error::Git(_)
            | Error::NoProxy(_) => precondition(),
            Error::SecretNotKnown(name) => precondition().with_meta("secret", name),
            Error::ProviderOff { kind, .. } => precondition().with_meta("provider", kind.as_str()),
            Error::CorruptDefinition(_) | Error::UnknownProvider(_) | Error::Closed(_) => {
                WireError::internal(message)
            }
            Error::Cancelled(_) => WireError::new(ErrorCode::Cancelled, message),
            Error::LeaseLost(_) => WireError::new(ErrorCode::LeaseLost, message),
            Error::Rpc(status) if never_reached_the_agent(&status) => WireError::new(
                ErrorCode::Unavailable,
                format!(
                    "the sandbox's agent did not answer (it may be restarting; retry): {}",
                    transport_cause(&status)
                ),
            ),
            Error::Rpc(status) => WireError::from_status(&status),
            Error::OverQuota(e) => e.into(),
            Error::Agent(e) => e,
            Error::Provider(e) => e.into(),
            Error::Provision(e) => e.into(),
            Error::Lease(e) => e.into(),
            Error::Snapshot(e) => e.into(),
            Error::Store(e) => e.into(),
            Error::Unplaceable(_) => precondition(),
            Error::SandboxLost { node, .. } => {
                WireError::new(ErrorCode::SandboxLost, message).with_meta("node", node)
            }
            Error::NodeFailed { node, .. } => {
                WireError::new(ErrorCode::Unavailable, message).with_meta("node", node)
            }
            Error::Fleet(e) => e.into(),
        }
    }
}

/// Whether `status` was made on this side of the connection to the agent
/// (tonic's client: the connection closed unanswered or timed out, the
/// socket gone while a restarted agent binds it again), not answered by the
/// agent: such a status carries tonic's transport error as its source. tonic
/// reports those as `Unknown` "transport error" or `Cancelled` "operation
/// was canceled", which tell a caller nothing, or the wrong thing (it
/// cancelled nothing), about a failure that is retryable.
fn never_reached_the_agent(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some_and(|e| e.is::<tonic::transport::Error>())
}

/// The causes of a transport failure, outermost first ("transport error:
/// tcp connect error: Connection refused").
fn transport_cause(status: &tonic::Status) -> String {
    let mut causes = vec![status.message().to_string()];
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        let said = e.to_string();
        if !causes.contains(&said) {
            causes.push(said);
        }
        cause = e.source();
    }
    causes.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call whose connection closes unanswered (what a dying agent's
    /// socket does) failed on this side: UNAVAILABLE, naming the cause, not
    /// tonic's `Cancelled`; what the agent answered passes on as it said.
    #[tokio::test]
    async fn an_agent_that_did_not_answer_is_unavailable_not_unknown() {
        use shared::proto::agent::v1::{ExecRequest, process_service_client::ProcessServiceClient};
        // What a dying agent's socket does: it takes the connection and
        // closes it unanswered.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                drop(socket);
            }
        });
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
        let status = ProcessServiceClient::new(channel).exec(ExecRequest::default()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Cancelled, "tonic's own answer: {status:?}");
        let e = WireError::from(Error::Rpc(status));
        assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
        assert!(e.message.starts_with("the sandbox's agent did not answer"), "{}", e.message);

        let answered = WireError::from(Error::Rpc(tonic::Status::unknown("the agent's own failure")));
        assert_eq!(
            (answered.code, answered.message.as_str()),
            (ErrorCode::Internal, "the agent's own failure")
        );
        let cancelled = WireError::from(Error::Rpc(tonic::Status::cancelled("the agent cancelled it")));
        assert_eq!(cancelled.code, ErrorCode::Cancelled);
    }

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

    #[test]
    fn lifecycle_refusals_keep_their_codes_messages_and_metadata() {
        let off = WireError::from(Error::ProviderOff {
            kind: ProviderKind::named("docker").unwrap(),
            why: "no engine".into(),
        });
        assert_eq!(off.code, ErrorCode::FailedPrecondition);
        assert_eq!(off.message, "the docker provider is not available on this server: no engine");
        assert_eq!(off.metadata.get("provider").map(String::as_str), Some("docker"));
        let lost = WireError::from(Error::LeaseLost("k1".into()));
        assert_eq!(
            (lost.code, lost.message.as_str()),
            (ErrorCode::LeaseLost, "lost the lease on sandbox k1 while ensuring it; retry")
        );
        let stopped = WireError::from(Error::NotRunning("k1".into()));
        assert_eq!(stopped.code, ErrorCode::FailedPrecondition);
        assert_eq!(stopped.message, "sandbox k1 is not running; call EnsureSandbox to bring it back");
        let gone = WireError::from(Error::NotFound("k1".into()));
        assert_eq!((gone.code, gone.message.as_str()), (ErrorCode::NotFound, "sandbox k1 not found"));
        let waited =
            WireError::from(Error::Cancelled("ensure cancelled while waiting for the sandbox lease"));
        assert_eq!(waited.code, ErrorCode::Cancelled);
        let corrupt = WireError::from(Error::CorruptDefinition("not hex"));
        assert_eq!(
            (corrupt.code, corrupt.message.as_str()),
            (ErrorCode::Internal, "stored sandbox definition is unreadable: not hex")
        );
        let unknown = WireError::from(Error::UnknownProvider("kvm".into()));
        assert_eq!(
            (unknown.code, unknown.message.as_str()),
            (ErrorCode::Internal, "instance of unknown provider \"kvm\"")
        );
    }

    #[test]
    fn the_layers_below_keep_their_mapping_and_not_found_is_told_apart() {
        let unsupported = provider::Error::Unsupported {
            kind: ProviderKind::named("local").unwrap(),
            capability: "fork".into(),
        };
        let wire = WireError::from(Error::from(unsupported));
        assert_eq!(wire.code, ErrorCode::Unsupported);
        assert_eq!(wire.metadata.get("capability").map(String::as_str), Some("fork"));
        let agent =
            WireError::new(ErrorCode::ProtocolMismatch, "speaks 2").with_meta("agent_protocol_version", "2");
        assert_eq!(WireError::from(Error::Agent(agent.clone())), agent);
        assert!(Error::NotFound("k".into()).is_not_found());
        assert!(Error::from(provider::Error::NotFound("container".into())).is_not_found());
        assert!(Error::from(store::Error::NotFound("row".into())).is_not_found());
        assert!(!Error::NotRunning("k".into()).is_not_found());
        assert!(!Error::Agent(agent).is_not_found());
    }
}
