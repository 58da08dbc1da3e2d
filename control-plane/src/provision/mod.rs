//! The seam between the sandbox lifecycle and workspace provisioning, and
//! what both sides of it share: the secrets of a live sandbox, the
//! [`Masks`] for text leaving the server, the ensure [`Progress`] stream,
//! field validation ([`InvalidField`], [`Violations`]) and what
//! provisioning fails with ([`Error`]).
//!
//! The lifecycle (module `sandbox`) calls a [`Provisioner`] once, right
//! after a sandbox was created (never on resume or restore: a snapshot
//! already holds the provisioned workspace). The implementation is the
//! `workspace` module's `WorkspaceProvisioner`: git source, setup over the
//! agent's persistent shell, instructions and skills. This module sits below
//! both, so neither imports the other's internals.

mod error;
mod field;
mod progress;

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use shared::proto::v1::WorkspaceDefinition;
use shared::secret::Secret;

use crate::agent::AgentClient;
pub use error::Error;
pub use field::{InvalidField, Violations, refuse};
pub use progress::{MAX_OUTPUT_LINE, Outcome, PROGRESS_BUFFER, Progress};
pub use shared::mask::Masks;
pub use shared::secret::valid_env_name;

/// Secret values by name, for one live sandbox. Never stored.
pub type Secrets = BTreeMap<String, Secret>;

/// What a provisioner works with.
pub struct ProvisionContext<'a> {
    pub agent: &'a AgentClient,
    pub workspace: &'a WorkspaceDefinition,
    pub secrets: &'a Secrets,
    /// Secrets only the agent holds (model keys): never in a setup step's
    /// environment.
    pub withheld: &'a BTreeSet<String>,
    /// Added to every setup step's environment (the egress proxy's).
    pub env: &'a BTreeMap<String, String>,
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

/// Hand the sandbox's secret values to its agent, which keeps them in
/// memory and masks them at the source (journal reads, stderr tails,
/// snapshot captures), so what any replica stores is already masked.
pub async fn hand_over(agent: &AgentClient, secrets: &Secrets) -> Result<(), tonic::Status> {
    if secrets.is_empty() {
        return Ok(());
    }
    let secrets = secrets
        .iter()
        .map(|(name, value)| shared::proto::agent::v1::NamedSecret {
            name: name.clone(),
            value: value.expose().to_string(),
        })
        .collect();
    agent.secrets().put_secrets(shared::proto::agent::v1::PutSecretsRequest { secrets }).await?;
    Ok(())
}

/// Replaces secret values (and their escaped forms) in text that leaves
/// the server (progress lines, error messages) with `[secret:NAME]`: a
/// setup step may well echo a token it was given.
pub fn redactor(secrets: &Secrets) -> Result<Masks, Error> {
    Masks::new(secrets.iter().map(|(name, value)| (name.as_str(), value.expose())))
        .map_err(|e| Error::SecretMatcher(e.message))
}
