//! API tokens ([`TokenStore`]), stored only as hashes.

use async_trait::async_trait;

use super::{Result, Tenant};

/// API bearer tokens. Only the SHA-256 of a token is stored.
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Map `token` to `tenant` (idempotent). A token already mapped to
    /// another tenant is [`Error::AlreadyExists`](super::Error::AlreadyExists).
    async fn put_token(&self, tenant: &Tenant, token: &str) -> Result<()>;

    async fn tenant_for_token(&self, token: &str) -> Result<Option<Tenant>>;

    /// Tenants having at least one token, sorted.
    async fn list_tenants(&self) -> Result<Vec<Tenant>>;

    /// True if it existed.
    async fn delete_token(&self, token: &str) -> Result<bool>;

    /// Delete every token but `keep` (all of them when it is empty): how a
    /// token taken out of the configuration stops working. Returns how
    /// many were deleted.
    async fn keep_only(&self, keep: &[&str]) -> Result<u64>;
}

/// Hex SHA-256 of a token: the only form a token is stored in.
pub(crate) fn token_hash(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}
