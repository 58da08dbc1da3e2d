//! `InfoService`: version, protocol version and capabilities.

use shared::proto::agent::v1::{GetInfoRequest, GetInfoResponse, info_service_server::InfoService};
use tonic::{Request, Response, Status};

use crate::context::AgentContext;

pub struct Info {
    ctx: AgentContext,
}

impl Info {
    pub fn new(ctx: &AgentContext) -> Self {
        Self { ctx: ctx.clone() }
    }
}

#[tonic::async_trait]
impl InfoService for Info {
    async fn get_info(&self, _req: Request<GetInfoRequest>) -> Result<Response<GetInfoResponse>, Status> {
        Ok(Response::new(GetInfoResponse {
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol_version: shared::AGENT_PROTOCOL_VERSION,
            root: self.ctx.root.path().display().to_string(),
            capabilities: Some(self.ctx.capabilities),
            pid: std::process::id(),
            journal_dir: self.ctx.journal_dir.display().to_string(),
        }))
    }
}
