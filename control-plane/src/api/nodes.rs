//! `sandhold.v1.NodeRegistry` (nodes joining, with the join token) and the
//! node views AdminService's ListNodes/DrainNode answer with; a
//! [`node::Error`] maps to a status here.

use shared::proto::v1 as api;
use shared::proto::v1::node_registry_server::NodeRegistry;
use tonic::{Request, Response, Status};

use crate::node::{self, Fleet, NodeView};

impl From<node::Error> for Status {
    fn from(e: node::Error) -> Self {
        shared::error::Error::from(e).into()
    }
}

pub struct NodeRegistryApi {
    fleet: Fleet,
}

impl NodeRegistryApi {
    pub fn new(fleet: Fleet) -> Self {
        Self { fleet }
    }
}

#[tonic::async_trait]
impl NodeRegistry for NodeRegistryApi {
    async fn register_node(
        &self,
        request: Request<api::RegisterNodeRequest>,
    ) -> Result<Response<api::RegisterNodeResponse>, Status> {
        self.fleet.check_join_token(shared::transport::bearer_of(request.metadata()))?;
        Ok(Response::new(self.fleet.register(request.into_inner()).await?))
    }

    async fn heartbeat(
        &self,
        request: Request<api::HeartbeatRequest>,
    ) -> Result<Response<api::HeartbeatResponse>, Status> {
        self.fleet.check_join_token(shared::transport::bearer_of(request.metadata()))?;
        Ok(Response::new(self.fleet.heartbeat(request.into_inner()).await?))
    }
}

pub fn node_to_api(n: &NodeView) -> api::Node {
    let node = &n.record.node;
    api::Node {
        name: node.name.clone(),
        address: node.address.clone(),
        state: n.state.as_str().to_string(),
        capacity: Some(api::NodeCapacity {
            memory_bytes: node.memory_bytes,
            cpus: node.cpus,
            sandbox_slots: node.sandbox_slots,
        }),
        labels: n.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        version: node.version.clone(),
        sandboxes: n.placed,
        free_memory_bytes: n.record.free_memory_bytes,
        last_heartbeat_ms: n.record.last_heartbeat.as_millis(),
        providers: n.providers.iter().map(|p| p.provider.clone()).collect(),
    }
}
