//! `sandhold.v1.AdminService`: operator calls. For now identity: who the
//! caller is and what this server is.

use shared::proto::v1::admin_service_server::AdminService;
use shared::proto::v1::{GetServerInfoRequest, GetServerInfoResponse};
use tonic::{Request, Response, Status};

use crate::auth::tenant_of;
use crate::server::ServerState;

pub struct AdminApi {
    state: ServerState,
}

impl AdminApi {
    pub fn new(state: ServerState) -> Self {
        Self { state }
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn get_server_info(
        &self,
        request: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let ready = self.state.ready()?;
        Ok(Response::new(GetServerInfoResponse {
            server_version: env!("CARGO_PKG_VERSION").to_string(),
            tenant: tenant.to_string(),
            replica_id: self.state.replica_id().to_string(),
            store_backend: ready.stores.backend_name().to_string(),
            lease_backend: ready.leases.backend_name().to_string(),
        }))
    }
}
