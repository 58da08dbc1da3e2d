//! Sandboxes whose node is gone (removed by the operator, silent past the
//! grace period, or unknown): nothing can be asked of that node, so their
//! records are forgotten rather than tried again and again. The sandbox
//! itself, if the node ever comes back, is that node's orphan.

use tracing::warn;

use super::{Error, Lifecycle};
use crate::lease::Leases;
use crate::node;
use crate::provider::ProviderKind;
use crate::store::{self, Stores};

impl Lifecycle {
    /// Whether `node` is gone for a sandbox of `provider`: removed, lost or
    /// unknown. `""` (this server's own providers) never is, nor is a node
    /// only unreachable (a partition shorter than the grace period).
    pub(crate) async fn node_gone(&self, node: &str, provider: &str) -> bool {
        if node.is_empty() {
            return false;
        }
        let Some(kind) = ProviderKind::named(provider) else { return false };
        matches!(
            self.provider_on(node, kind).await,
            Err(Error::Fleet(node::Error::Removed(_) | node::Error::Lost(_) | node::Error::NotFound(_)))
        )
    }

    /// Forget sandbox `key` if its record still points at a node that is
    /// gone: the record goes (and the tenant's quota with it), nothing is
    /// asked of the node. Under the sandbox's lease, taken without waiting:
    /// while it is held (an ensure placing the thread's next sandbox, say)
    /// nothing is done. Whether the record went.
    pub async fn forget_if_node_gone(
        &self,
        stores: &Stores,
        leases: &Leases,
        key: &str,
    ) -> Result<bool, Error> {
        let Some(lease) = leases.try_acquire(&format!("sandbox:{key}")).await? else { return Ok(false) };
        let result = async {
            // Read under the lease: an ensure may have placed a new one.
            let instance = match stores.instances.get(key).await {
                Ok(i) => i,
                Err(store::Error::NotFound(_)) => return Ok(false),
                Err(e) => return Err(Error::from(e)),
            };
            if !self.node_gone(&instance.node, &instance.provider).await {
                return Ok(false);
            }
            self.forget_gone(stores, &instance).await?;
            Ok(true)
        }
        .await;
        let _ = lease.release().await;
        result
    }

    /// Delete the record of `instance`, whose node is gone (the caller holds
    /// its sandbox lease and checked).
    pub(super) async fn forget_gone(&self, stores: &Stores, instance: &store::Instance) -> Result<(), Error> {
        stores.instances.delete(&instance.sandbox_key).await?;
        self.forget(&instance.sandbox_key);
        warn!(sandbox_key = %instance.sandbox_key, tenant = %instance.tenant, node = %instance.node,
            provider_id = %instance.provider_sandbox_id, "sandbox forgotten: its node is gone");
        Ok(())
    }
}
