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

    /// Remove at most `limit` definitions, of every tenant, whose id the
    /// server derived from their content ([`DERIVED_PREFIX`]: a run's
    /// flags, or a `PutDefinition` with no id), last put before `cutoff`,
    /// that nothing names any more: no sandbox record, no unfinished run,
    /// and no thread's newest run (whose definition the thread's next run
    /// takes). Returns what it removed. A definition put again (which
    /// every `sandhold run` with flags does) is newer than any cutoff in
    /// the past, even when the put races the removal.
    async fn delete_unused_derived(&self, cutoff: Timestamp, limit: u32) -> Result<Vec<(Tenant, String)>>;
}

/// How the id the server gives a definition sent with none begins (`def-`
/// and 16 hex digits of its content's digest).
pub const DERIVED_PREFIX: &str = "def-";
