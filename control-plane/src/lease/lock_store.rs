//! The backend contract every lock store implements.

use std::time::Duration;

use super::LeaseError;

/// The backend contract. Keys arrive already namespaced; tokens are random
/// per acquisition, so "the key still holds my token" means "nobody took it
/// over since".
///
/// Object safe (`async_trait`) so the store can be held as
/// `Arc<dyn LockStore>` and chosen at start from the configuration.
#[async_trait::async_trait]
pub trait LockStore: Send + Sync + 'static {
    /// `"in-process"` or `"redis"`.
    fn backend_name(&self) -> &'static str;

    /// Set `key` to `token` for `ttl` if the key is free (absent or expired).
    /// `Ok(false)`: someone holds it.
    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError>;

    /// Reset the expiry of `key` to `ttl` from now, only if it still holds
    /// `token`. `Ok(false)`: the key is gone or holds another token.
    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError>;

    /// Delete `key` only if it holds `token`. `Ok(false)`: it did not.
    async fn unlock(&self, key: &str, token: &str) -> Result<bool, LeaseError>;

    /// The token `key` holds now; `None` when it is free (absent or expired).
    async fn holder(&self, key: &str) -> Result<Option<String>, LeaseError>;
}
