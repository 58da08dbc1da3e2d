//! The seam between the sandbox lifecycle and workspace provisioning, and
//! what both sides of it share: the secrets of a live sandbox, the
//! [`Redactor`] for text leaving the server, the ensure [`Progress`] stream,
//! and field validation ([`InvalidField`]).
//!
//! The lifecycle (module `sandbox`) calls a [`Provisioner`] once, right
//! after a sandbox was created (never on resume or restore: a snapshot
//! already holds the provisioned workspace). The implementation is the
//! `workspace` module's `WorkspaceProvisioner`: git source, setup over the
//! agent's persistent shell, instructions and skills. This module sits below
//! both, so neither imports the other's internals.

mod field;
mod progress;

use std::collections::BTreeMap;

use async_trait::async_trait;
use shared::error::{Error, ErrorCode};
use shared::proto::v1::WorkspaceDefinition;
use shared::secret::Secret;

use crate::agent::AgentClient;
pub use field::InvalidField;
pub use progress::{EnsureItem, Progress};
pub use shared::redact::Redactor;

/// Secret values by name, for one live sandbox. Never stored.
pub type Secrets = BTreeMap<String, Secret>;

/// What a provisioner works with.
pub struct ProvisionContext<'a> {
    pub agent: &'a AgentClient,
    pub workspace: &'a WorkspaceDefinition,
    pub secrets: &'a Secrets,
    pub progress: &'a Progress,
}

#[async_trait]
pub trait Provisioner: Send + Sync + std::fmt::Debug {
    /// Refuse a workspace this provisioner cannot build, before a sandbox
    /// is created for it.
    fn check(&self, workspace: &WorkspaceDefinition) -> Result<(), Error>;

    /// Build the workspace in a freshly created sandbox. An error fails the
    /// ensure; the lifecycle then destroys the sandbox.
    async fn provision(&self, ctx: ProvisionContext<'_>) -> Result<(), Error>;
}

/// Replaces secret values in text that leaves the server (progress lines,
/// error messages): a setup step may well echo a token it was given.
pub fn redactor(secrets: &Secrets) -> Result<Redactor, Error> {
    Redactor::from_secrets(secrets.values())
}

/// An environment variable / secret name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `Ok` without violations; else every `(field, why)` in one INVALID_ARGUMENT.
pub fn refuse(what: &str, violations: Vec<(String, String)>) -> Result<(), Error> {
    if violations.is_empty() {
        return Ok(());
    }
    let summary = violations.iter().map(|(f, w)| format!("{f}: {w}")).collect::<Vec<_>>().join("; ");
    let mut err = Error::new(ErrorCode::InvalidArgument, format!("invalid {what}: {summary}"));
    for (f, w) in violations {
        err = err.with_violation(f, w);
    }
    Err(err)
}
