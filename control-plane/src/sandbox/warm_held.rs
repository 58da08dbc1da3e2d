//! What this replica holds of the warm pools: the agents of the pooled
//! sandboxes it made, and the keeper's wake-up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::agent::AgentClient;
use crate::provider::Sandbox;

/// What this replica holds of the pools: the agents of the sandboxes it
/// made (a claim here skips the provider's resume and a new connection),
/// and the keeper's wake-up. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct WarmPools {
    held: Arc<Mutex<HashMap<String, (Sandbox, AgentClient)>>>,
    wake: Arc<Notify>,
}

impl WarmPools {
    pub(super) fn hold(&self, pool_key: &str, sandbox: Sandbox, agent: AgentClient) {
        self.held.lock().expect("warm pools poisoned").insert(pool_key.to_string(), (sandbox, agent));
    }

    pub(super) fn take(&self, pool_key: &str) -> Option<(Sandbox, AgentClient)> {
        self.held.lock().expect("warm pools poisoned").remove(pool_key)
    }

    /// Wake the keeper: a pool was set, or claimed from.
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }
}
