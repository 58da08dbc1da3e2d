//! Sandbox instances ([`InstanceStore`]): which sandbox serves which key.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::{Result, Tenant, Timestamp};

/// A sandbox the control plane provisioned, by sandbox key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub sandbox_key: String,
    pub tenant: Tenant,
    /// The provider's name (`local`, `docker`, ...).
    pub provider: String,
    /// The provider's own id (container id, directory, ...).
    pub provider_sandbox_id: String,
    /// The latest provider-native snapshot (e.g. a committed image).
    pub native_snapshot: Option<String>,
    /// The definition and thread the sandbox was ensured for.
    pub definition_id: String,
    pub thread_id: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Variables set on the live sandbox (`SetEnv`), for its later execs
    /// and runs. Kept when the instance is replaced; gone with it.
    pub env: BTreeMap<String, String>,
    /// The fleet node it lives on; empty: the server's own providers.
    pub node: String,
    /// Its live network rules (`UpdateNetworkPolicy`). Kept when the
    /// instance is replaced; gone with it.
    pub network: LiveNetwork,
}

/// A sandbox's live network rules: host patterns allowed and denied on top
/// of its definition's rules, and the last change.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LiveNetwork {
    /// Changes so far (0: never changed); each change counts it up.
    #[serde(skip)]
    pub version: u64,
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    #[serde(default)]
    pub deny_hosts: Vec<String>,
    /// Who made the last change (the caller's tenant).
    #[serde(default)]
    pub changed_by: String,
    /// When (milliseconds since the epoch).
    #[serde(default)]
    pub changed_at_ms: i64,
    /// The latest changes, oldest first (at most [`LIVE_HISTORY`]): what
    /// each run's driver records on it, each change once.
    #[serde(default)]
    pub history: Vec<LiveChange>,
}

/// Changes a sandbox's live rules keep, for drivers that look less often
/// than changes come.
pub const LIVE_HISTORY: usize = 16;

/// One change of a sandbox's live rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LiveChange {
    /// The rules' version it made.
    pub version: u64,
    pub changed_by: String,
    pub changed_at_ms: i64,
    pub change: NetworkChange,
}

/// One `UpdateNetworkPolicy` as asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetworkChange {
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    #[serde(default)]
    pub deny_hosts: Vec<String>,
    #[serde(default)]
    pub reset: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInstance {
    pub sandbox_key: String,
    pub tenant: Tenant,
    pub provider: String,
    pub provider_sandbox_id: String,
    pub native_snapshot: Option<String>,
    pub definition_id: String,
    pub thread_id: String,
    /// The fleet node it lives on; empty: the server's own providers.
    pub node: String,
}

#[async_trait]
pub trait InstanceStore: Send + Sync {
    /// Insert or replace by sandbox key; `created_at` survives a replace.
    async fn put(&self, instance: NewInstance) -> Result<Instance>;

    /// Whatever its tenant: callers serving a tenant compare
    /// [`Instance::tenant`] and answer NOT_FOUND on a mismatch.
    async fn get(&self, sandbox_key: &str) -> Result<Instance>;

    async fn set_native_snapshot(&self, sandbox_key: &str, snapshot: Option<String>) -> Result<Instance>;

    /// Replace the sandbox's variables.
    async fn set_env(&self, sandbox_key: &str, env: &BTreeMap<String, String>) -> Result<Instance>;

    /// Replace the sandbox's live network rules if they are still at
    /// `version` (their version then becomes `version + 1`); `None` when
    /// another change came first.
    async fn set_network(
        &self,
        sandbox_key: &str,
        version: u64,
        network: &LiveNetwork,
    ) -> Result<Option<Instance>>;

    /// All instances, or one tenant's, by sandbox key.
    async fn list(&self, tenant: Option<&Tenant>) -> Result<Vec<Instance>>;

    /// How many instances the tenant has (its sandbox quota's count),
    /// without reading them.
    async fn count(&self, tenant: &Tenant) -> Result<u64>;

    /// Whether any instance record (of any key) points at this sandbox: a
    /// sandbox taken from a warm pool carries its pool key in its labels,
    /// not the key of the thread whose record points at it.
    async fn points_at(&self, provider: &str, provider_sandbox_id: &str) -> Result<bool>;

    /// True if it existed.
    async fn delete(&self, sandbox_key: &str) -> Result<bool>;
}
