//! The fleet: sandbox hosts (`sandhold node`) serving their providers over
//! the node protocol (`sandhold.node.v1.NodeService`, mutual TLS), and the
//! control plane's side of it.
//!
//! - [`fleet`]: registration, heartbeats, state, drain and remove, and the
//!   one channel per node;
//! - [`remote`]: a node's provider as a [`crate::provider::Provider`], whose
//!   sandboxes' agents are reached through the node ([`crate::tunnel`]);
//! - [`daemon`]: `sandhold node` itself: this host's providers served as
//!   `NodeService`, registered and kept alive with heartbeats;
//! - [`convert`]: the provider vocabulary on the wire, both ways.
//!
//! Placement (which node a new sandbox goes to) is the sandbox layer's
//! (`sandbox/placement.rs`), from what [`Fleet::list`] says.

pub mod convert;
pub mod daemon;
pub mod fleet;
pub mod remote;

use shared::error::{Error as WireError, ErrorCode};

pub use fleet::{Fleet, FleetOptions, NodeTls, NodeView};
pub use remote::RemoteProvider;

use crate::provider::ProviderKind;

/// A node's state, derived from its drain mark and its heartbeat's age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Heartbeating: takes new sandboxes.
    Ready,
    /// The operator drains it: no new sandbox; its own go on.
    Draining,
    /// No heartbeat for a few intervals: no new sandbox; its own are
    /// waited for until the grace period ends.
    Unreachable,
    /// No heartbeat for longer than the grace period: its sandboxes are
    /// given up.
    Lost,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Draining => "draining",
            Self::Unreachable => "unreachable",
            Self::Lost => "lost",
        }
    }
}

/// What a fleet operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Closed(&'static str),
    #[error("a node registry call needs the operator's join token (SANDHOLD_NODE_JOIN_TOKEN)")]
    JoinToken,
    #[error("no node {0}")]
    NotFound(String),
    #[error("node {0} was removed by the operator")]
    Removed(String),
    #[error("node {0} is lost (no heartbeat for longer than the grace period)")]
    Lost(String),
    #[error("node {node} offers no {kind} provider")]
    NoProvider { node: String, kind: ProviderKind },
    /// Dialling the node back failed: unreachable, or its certificate is
    /// not from the operator's CA (or it refused ours).
    #[error("the control plane could not reach the node over mutual TLS: {0}")]
    Unreachable(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::Closed(_) => WireError::new(ErrorCode::FailedPrecondition, message),
            Error::JoinToken => WireError::new(ErrorCode::Unauthenticated, message),
            Error::NotFound(_) => WireError::not_found(message),
            Error::Removed(_) => WireError::new(ErrorCode::PermissionDenied, message),
            Error::Lost(_) | Error::Unreachable(_) => WireError::new(ErrorCode::FailedPrecondition, message),
            Error::NoProvider { .. } => WireError::new(ErrorCode::FailedPrecondition, message),
            Error::Invalid(_) => WireError::new(ErrorCode::InvalidArgument, message),
            Error::Store(e) => e.into(),
        }
    }
}
