//! Sandbox definitions ([`DefinitionStore`]).

use async_trait::async_trait;

use super::{Result, Tenant, Timestamp};

/// A sandbox definition as a tenant stored it. The store keeps exactly the
/// JSON it is given; keeping secret values out is the API layer's job.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub tenant: Tenant,
    pub id: String,
    pub body: serde_json::Value,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[async_trait]
pub trait DefinitionStore: Send + Sync {
    /// Insert or replace; `created_at` survives a replace.
    async fn put(&self, tenant: &Tenant, id: &str, body: serde_json::Value) -> Result<Definition>;

    async fn get(&self, tenant: &Tenant, id: &str) -> Result<Definition>;

    /// The tenant's definitions by id.
    async fn list(&self, tenant: &Tenant) -> Result<Vec<Definition>>;

    /// True if it existed.
    async fn delete(&self, tenant: &Tenant, id: &str) -> Result<bool>;
}
