//! What a provider is asked to make: the [`SandboxSpec`] and the labels
//! every Sandhold sandbox carries.
//!
//! Secrets are never part of a [`SandboxSpec`]: a container's environment is
//! visible to `docker inspect` and is baked into committed snapshot images,
//! so secret values travel with each call to the agent instead.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::DockerOptions;

/// Label every Sandhold sandbox carries, so orphans can be found even when
/// the instance store lost them.
pub const LABEL_MANAGED: &str = "dev.sandhold.managed";
pub const LABEL_TENANT: &str = "dev.sandhold.tenant";
pub const LABEL_SANDBOX_KEY: &str = "dev.sandhold.sandbox-key";
pub const LABEL_DEFINITION: &str = "dev.sandhold.definition";

/// Everything a provider needs to create a sandbox. Contains no secret.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The sandbox key (hash of tenant, definition, options, workspace,
    /// thread); labels the sandbox and names its snapshots.
    pub key: String,
    pub tenant: String,
    pub definition_id: String,
    /// Non-secret environment of the agent and everything it starts.
    /// Secrets are passed per call to the agent, never here.
    pub env: BTreeMap<String, String>,
    /// Options of the Docker provider; the local provider ignores them.
    pub docker: DockerOptions,
}

impl SandboxSpec {
    /// The labels a sandbox of this spec carries.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_TENANT.to_string(), self.tenant.clone()),
            (LABEL_SANDBOX_KEY.to_string(), self.key.clone()),
            (LABEL_DEFINITION.to_string(), self.definition_id.clone()),
        ])
    }
}
