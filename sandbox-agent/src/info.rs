//! `InfoService`: version, protocol version and capabilities.

use shared::proto::agent::v1::{
    Capabilities, GetInfoRequest, GetInfoResponse, info_service_server::InfoService,
};
use tonic::{Request, Response, Status};

use crate::server::AgentState;

pub struct Info {
    state: AgentState,
}

impl Info {
    pub fn new(state: AgentState) -> Self {
        Self { state }
    }
}

#[tonic::async_trait]
impl InfoService for Info {
    async fn get_info(&self, _req: Request<GetInfoRequest>) -> Result<Response<GetInfoResponse>, Status> {
        Ok(Response::new(GetInfoResponse {
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol_version: shared::AGENT_PROTOCOL_VERSION,
            root: self.state.root.path().display().to_string(),
            capabilities: Some(self.state.capabilities),
            pid: std::process::id(),
            journal_dir: self.state.journal_dir.display().to_string(),
        }))
    }
}

/// What this agent can do. Services that are not built yet say `false`.
pub fn capabilities() -> Capabilities {
    Capabilities {
        background_processes: true,
        killable_processes: true,
        writable_stdin: true,
        journal: true,
        watch: true,
        inotify: true,
        snapshots: true,
    }
}
