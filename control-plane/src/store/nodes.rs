//! The fleet's nodes ([`NodeStore`]): sandbox hosts as they registered and
//! last heartbeated. Their state (ready, draining, unreachable, lost) is
//! derived from these when read, never stored.

use async_trait::async_trait;

use super::{Result, Timestamp};

/// What a node says when it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewNode {
    pub name: String,
    /// Where its NodeService answers (`https://HOST:PORT`).
    pub address: String,
    /// JSON object of its labels.
    pub labels: String,
    /// JSON array of its providers and their capabilities.
    pub providers: String,
    pub memory_bytes: u64,
    pub cpus: u32,
    pub sandbox_slots: u32,
    pub version: String,
}

/// A node's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub node: NewNode,
    pub free_memory_bytes: u64,
    /// Sandboxes its providers held at the last heartbeat.
    pub sandboxes: u32,
    pub draining: bool,
    pub removed: bool,
    pub registered_at: Timestamp,
    pub last_heartbeat: Timestamp,
}

#[async_trait]
pub trait NodeStore: Send + Sync {
    /// Insert, or update a node registering again (its drain mark stays).
    /// `None` when the name was removed: it may not come back.
    async fn register(&self, node: NewNode) -> Result<Option<NodeRecord>>;

    /// Record a heartbeat. `None` for an unknown or removed node.
    async fn heartbeat(
        &self,
        name: &str,
        free_memory_bytes: u64,
        sandboxes: u32,
    ) -> Result<Option<NodeRecord>>;

    async fn get(&self, name: &str) -> Result<Option<NodeRecord>>;

    /// Every node not removed, by name.
    async fn list(&self) -> Result<Vec<NodeRecord>>;

    /// Mark it draining (or not). `None` for an unknown or removed node.
    async fn set_draining(&self, name: &str, draining: bool) -> Result<Option<NodeRecord>>;

    /// Mark it removed. True if it was there and not removed yet.
    async fn remove(&self, name: &str) -> Result<bool>;

    /// How many sandboxes are placed on each node that has any: recorded
    /// instances, and pooled (warm) sandboxes not claimed yet (a claimed
    /// one is an instance already). One aggregate, not every row.
    async fn placed(&self) -> Result<Vec<(String, u32)>>;
}
