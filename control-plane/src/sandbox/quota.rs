//! The operator's limit on sandboxes per tenant, checked where an ensure
//! would create a new one (not when it resumes or replaces the key's own).
//!
//! A sandbox counts from the moment its creation is admitted until its
//! instance record is gone (a warm pool's, from its admission until a
//! thread's record points at it, then as that record) (destroyed: `DestroySandbox`,
//! `destroy_on_complete`, the reaper), stopped or not. The count is the
//! tenant's instance records plus the creations this replica has admitted
//! but not recorded yet. Admissions on one replica take turns, and each
//! reads the creations in flight before the records, so a creation that
//! finishes meanwhile is counted once or twice, never not at all: on one
//! replica two ensures cannot both take the last slot. Across replicas a
//! creation in flight elsewhere is not seen until it is recorded, so each
//! other replica creating at that moment may add one over the limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::info;

use super::Error;
use crate::config::{Limit, Quotas};
use crate::store::{Stores, Tenant};

/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct SandboxQuota {
    limit: Limit,
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// One admission at a time on this replica.
    admission: tokio::sync::Mutex<()>,
    /// Admitted creations not recorded yet, per tenant.
    creating: Mutex<HashMap<Tenant, u64>>,
}

/// A creation admitted under the quota; counted until dropped (after the
/// instance is recorded, or the creation failed).
#[derive(Debug)]
pub(super) struct Slot {
    inner: Arc<Inner>,
    tenant: Tenant,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut creating = self.inner.creating.lock().expect("sandbox quota poisoned");
        if let Some(n) = creating.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                creating.remove(&self.tenant);
            }
        }
    }
}

impl Default for SandboxQuota {
    fn default() -> Self {
        Self::new(Quotas::default().sandboxes())
    }
}

impl SandboxQuota {
    pub fn new(limit: Limit) -> Self {
        Self { limit, inner: Arc::default() }
    }

    /// Admit one more sandbox of `tenant`, or refuse with
    /// RESOURCE_EXHAUSTED naming the limit. `None`: no limit, nothing held.
    pub(super) async fn admit(&self, stores: &Stores, tenant: &Tenant) -> Result<Option<Slot>, Error> {
        if self.limit.max.is_none() {
            return Ok(None);
        }
        let _turn = self.inner.admission.lock().await;
        let in_flight = self.in_flight(tenant);
        // A pooled sandbox not claimed yet is the tenant's too.
        let recorded = stores.instances.count(tenant).await? + stores.warm.count_unclaimed(tenant).await?;
        let held = recorded + in_flight;
        if !self.limit.admits(held) {
            let refusal = self.limit.exceeded(tenant.as_str(), held, "sandboxes");
            info!(tenant = %tenant, held, "sandbox refused: {refusal}");
            return Err(refusal.into());
        }
        *self.inner.creating.lock().expect("sandbox quota poisoned").entry(tenant.clone()).or_default() += 1;
        Ok(Some(Slot { inner: self.inner.clone(), tenant: tenant.clone() }))
    }

    /// Write the record of a sandbox admitted with `slot` (its instance,
    /// or its warm pool row) and release the slot in one admission turn:
    /// an admission in between would count the sandbox twice, once in
    /// flight and once recorded, and refuse a sandbox the quota has room
    /// for (a pooled sandbox's row is written before its long creation).
    pub(super) async fn settle<T, E>(
        &self,
        slot: Option<Slot>,
        record: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let Some(slot) = slot else { return record.await };
        let _turn = self.inner.admission.lock().await;
        let recorded = record.await;
        drop(slot);
        recorded
    }

    fn in_flight(&self, tenant: &Tenant) -> u64 {
        self.inner.creating.lock().expect("sandbox quota poisoned").get(tenant).copied().unwrap_or_default()
    }
}
