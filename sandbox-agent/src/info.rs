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

#[cfg(test)]
mod tests {
    use shared::proto::agent::v1::info_service_client::InfoServiceClient;
    use shared::proto::agent::v1::info_service_server::InfoServiceServer;
    use tonic::transport::Server;

    use super::*;
    use crate::testing;

    #[tokio::test]
    async fn get_info_reports_the_context_it_was_built_from() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = testing::context(dir.path());
        let channel =
            testing::channel(Server::builder().add_service(InfoServiceServer::new(Info::new(&ctx)))).await;
        let info = InfoServiceClient::new(channel).get_info(GetInfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.protocol_version, shared::AGENT_PROTOCOL_VERSION);
        assert_eq!(info.agent_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(info.root, dir.path().join("root").canonicalize().unwrap().display().to_string());
        assert_eq!(info.journal_dir, dir.path().join("journal").display().to_string());
        assert_eq!(info.capabilities, Some(crate::context::capabilities(&ctx.isolation)));
        assert_eq!(info.pid, std::process::id());
    }
}
