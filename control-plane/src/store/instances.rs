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
