//! `sandhold.v1.AdminService`: operator calls. Identity (who the caller is
//! and what this server is) and the reaper's on-demand sweep, whose
//! [`reaper::Error`] maps to a status here.

use shared::proto::v1::admin_service_server::AdminService;
use shared::proto::v1::{
    DrainNodeRequest, DrainNodeResponse, GetServerInfoRequest, GetServerInfoResponse, ListNodesRequest,
    ListNodesResponse, RemoveNodeRequest, RemoveNodeResponse, SweepRequest, SweepResponse, SweptRun,
};
use tonic::{Request, Response, Status};

use crate::auth::tenant_of;
use crate::context::Context;
use crate::metrics::SweepOutcome;
use crate::reaper::{self, Reaper, Scope, Tally};
use crate::store::Tenant;

impl From<reaper::Error> for Status {
    fn from(e: reaper::Error) -> Self {
        shared::error::Error::from(e).into()
    }
}

pub struct AdminApi {
    cx: Context,
    reaper: Reaper,
    /// Tenants whose sweep covers every tenant.
    operators: Vec<String>,
    single_user: bool,
}

impl AdminApi {
    pub fn new(cx: Context, reaper: Reaper, operators: Vec<String>, single_user: bool) -> Self {
        Self { cx, reaper, operators, single_user }
    }

    /// An operator (or the single user, who is every tenant there is)
    /// sweeps everything; any other tenant only what is its own.
    fn scope_of(&self, tenant: &Tenant) -> Scope {
        if self.single_user || self.operators.iter().any(|o| o == tenant.as_str()) {
            Scope::All
        } else {
            Scope::Tenant(tenant.clone())
        }
    }

    /// The fleet's nodes are the operator's: anyone else is refused.
    fn operator<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let tenant = tenant_of(request)?;
        match self.scope_of(&tenant) {
            Scope::All => Ok(()),
            Scope::Tenant(_) => Err(Status::permission_denied(format!(
                "the fleet's nodes are the operator's: tenant {tenant} is not an operator (--operator-tenant)"
            ))),
        }
    }
}

pub fn tally_to_api(scope: &Scope, tally: &Tally) -> SweepResponse {
    SweepResponse {
        outcomes: SweepOutcome::PER_RUN.iter().map(|o| (o.as_str().to_string(), tally.count(*o))).collect(),
        runs: tally
            .runs
            .iter()
            .map(|r| SweptRun {
                run_id: r.run_id.to_string(),
                outcome: r.outcome.as_str().to_string(),
                detail: r.detail.clone(),
                terminalized_anyway: r.terminalized_anyway,
            })
            .collect(),
        journals_pruned: tally.journals_pruned,
        journals_kept: tally.journals_kept,
        sandboxes_reclaimed: tally.sandboxes_reclaimed,
        runs_removed: tally.runs_removed,
        definitions_removed: tally.definitions_removed,
        truncated: tally.truncated,
        scope: scope.name().to_string(),
        elapsed_ms: tally.elapsed.as_millis() as u64,
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn get_server_info(
        &self,
        request: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(GetServerInfoResponse {
            server_version: env!("CARGO_PKG_VERSION").to_string(),
            tenant: tenant.to_string(),
            replica_id: self.cx.replica_id.clone(),
            store_backend: self.cx.stores.backend_name().to_string(),
            lease_backend: self.cx.leases.backend_name().to_string(),
        }))
    }

    async fn sweep(&self, request: Request<SweepRequest>) -> Result<Response<SweepResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let scope = self.scope_of(&tenant);
        let tally = self.reaper.sweep(&scope).await?;
        Ok(Response::new(tally_to_api(&scope, &tally)))
    }

    async fn list_nodes(
        &self,
        request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        self.operator(&request)?;
        let nodes = self.cx.lifecycle.fleet()?.list().await?;
        Ok(Response::new(ListNodesResponse { nodes: nodes.iter().map(super::nodes::node_to_api).collect() }))
    }

    async fn drain_node(
        &self,
        request: Request<DrainNodeRequest>,
    ) -> Result<Response<DrainNodeResponse>, Status> {
        self.operator(&request)?;
        let node = self.cx.lifecycle.fleet()?.drain(&request.get_ref().name).await?;
        Ok(Response::new(DrainNodeResponse { node: Some(super::nodes::node_to_api(&node)) }))
    }

    async fn remove_node(
        &self,
        request: Request<RemoveNodeRequest>,
    ) -> Result<Response<RemoveNodeResponse>, Status> {
        self.operator(&request)?;
        self.cx.lifecycle.fleet()?.remove(&request.get_ref().name).await?;
        Ok(Response::new(RemoveNodeResponse {}))
    }
}
