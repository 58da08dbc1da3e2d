//! What a provider hands back: a live [`Sandbox`], a [`ListedSandbox`],
//! a native [`Snapshot`] and what a sandbox uses ([`ResourceUse`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use shared::secret::Secret;
use shared::transport::Address;

/// A live sandbox: where its agent answers and the token it wants.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The provider's own id (local: the directory name; Docker: the
    /// container id). Store it to resume or destroy the sandbox later.
    pub provider_id: String,
    /// Where the agent listens, as seen from the control plane.
    pub address: Address,
    /// The agent's bearer token. Regenerated only when a sandbox is created.
    pub token: Secret,
    /// The workspace root as the agent (inside the sandbox) sees it.
    pub workspace: PathBuf,
    /// The container runtime it runs under (`runc`, `gvisor`); empty
    /// where there is no container (local).
    pub runtime: String,
}

/// A sandbox found by [`Provider::list`](super::Provider::list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSandbox {
    pub provider_id: String,
    pub labels: BTreeMap<String, String>,
    /// Whether its agent (local) or container (Docker) is running.
    pub running: bool,
    /// When the provider made it, when it can tell (Docker: the container's
    /// creation; local: when its labels were written). The reaper's grace
    /// period for orphans counts from here.
    pub created_at: Option<crate::store::Timestamp>,
    /// Made by this provider instance: its state lives under this server's
    /// data dir (local: always; Docker: the container's host dir is in our
    /// state dir). Another deployment sharing a Docker engine lists
    /// sandboxes that are not ours; the reaper never destroys those.
    pub own: bool,
}

/// What a running sandbox uses now ([`Provider::usage`](super::Provider::usage)).
/// A field the provider cannot measure is `None`: shown as unknown, never
/// guessed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceUse {
    /// CPU time its processes have used since it started (a counter).
    pub cpu_time: Option<std::time::Duration>,
    /// Memory in use now, in bytes.
    pub memory_bytes: Option<u64>,
    /// The most memory it may use, when the provider knows a limit.
    pub memory_limit_bytes: Option<u64>,
}

/// A provider-native snapshot (Docker: a committed image).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// What [`Provider::restore`](super::Provider::restore) takes (Docker: the image reference).
    pub id: String,
}
