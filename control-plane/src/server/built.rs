//! What the server builds once its stores are open: the service slots the
//! router serves from, and the context and run driver that readiness fills
//! in and shutdown drains. Its own file so that start-up, readiness and
//! shutdown each read it without reading one another.

use std::sync::OnceLock;

use shared::proto::v1::admin_service_server::AdminServiceServer;
use shared::proto::v1::node_registry_server::NodeRegistryServer;
use shared::proto::v1::run_service_server::RunServiceServer;
use shared::proto::v1::sandbox_service_server::SandboxServiceServer;
use shared::proto::v1::snapshot_service_server::SnapshotServiceServer;
use tokio_util::sync::CancellationToken;

use super::gate::Slot;
use crate::context::Context;
use crate::runs::Runs;

/// Where the built services go once the stores are open.
pub(super) struct Slots {
    pub(super) admin: Slot<AdminServiceServer<crate::api::AdminApi>>,
    pub(super) snapshot: Slot<SnapshotServiceServer<crate::api::SnapshotApi>>,
    pub(super) sandbox: Slot<SandboxServiceServer<crate::api::SandboxApi>>,
    pub(super) runs: Slot<RunServiceServer<crate::api::RunApi>>,
    pub(super) nodes: Slot<NodeRegistryServer<crate::api::NodeRegistryApi>>,
}

/// What exists once the server is ready: the context and the run driver
/// (shutdown drains its drives).
pub(super) struct Built {
    pub(super) cx: Context,
    pub(super) runs: Runs,
}

/// Where [`Built`] is put once, and can be awaited.
#[derive(Default)]
pub(super) struct BuiltCell {
    built: OnceLock<Built>,
    filled: CancellationToken,
}

impl BuiltCell {
    pub(super) fn get(&self) -> Option<&Built> {
        self.built.get()
    }

    /// Cancelled once [`BuiltCell::set`] has run.
    pub(super) fn filled(&self) -> &CancellationToken {
        &self.filled
    }

    pub(super) fn set(&self, built: Built) {
        let _ = self.built.set(built);
        self.filled.cancel();
    }
}
