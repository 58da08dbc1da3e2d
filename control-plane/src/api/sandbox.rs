//! `sandhold.v1.SandboxService`: request fields in, [`Sandboxes`]
//! operations (definitions, ensure, a live sandbox's processes and files),
//! their results and [`sandbox::Error`] out as messages and statuses. Every
//! call is scoped to the caller's tenant; another tenant's definition or
//! sandbox is NOT_FOUND.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use shared::proto::v1 as api;
use shared::proto::v1::sandbox_service_server::SandboxService;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::tenant_of;
use crate::context::Context;
use crate::provision::InvalidField;
use crate::runs;
use crate::sandbox::{self, Sandboxes};
use crate::store::Stores;

impl From<sandbox::Error> for Status {
    fn from(e: sandbox::Error) -> Self {
        match e {
            // The agent's (or the caller's own stream's) status, unchanged.
            sandbox::Error::Rpc(status) => status,
            other => shared::error::Error::from(other).into(),
        }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn to_status_stream<T: 'static>(
    stream: impl Stream<Item = Result<T, sandbox::Error>> + Send + 'static,
) -> BoxStream<T> {
    Box::pin(stream.map(|item| item.map_err(Status::from)))
}

/// Built from the context: the stores, the leases, the lifecycle and the
/// task set.
#[derive(Clone)]
pub struct SandboxApi {
    sandboxes: Sandboxes,
    stores: Stores,
}

impl SandboxApi {
    pub fn new(cx: Context) -> Self {
        Self { sandboxes: cx.sandboxes(), stores: cx.stores.clone() }
    }
}

#[tonic::async_trait]
impl SandboxService for SandboxApi {
    async fn put_definition(
        &self,
        request: Request<api::PutDefinitionRequest>,
    ) -> Result<Response<api::PutDefinitionResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let definition = self.sandboxes.put_definition(&tenant, request.into_inner().definition).await?;
        Ok(Response::new(api::PutDefinitionResponse { definition: Some(definition) }))
    }

    async fn get_definition(
        &self,
        request: Request<api::GetDefinitionRequest>,
    ) -> Result<Response<api::GetDefinitionResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let api::GetDefinitionRequest { id, thread_id } = request.into_inner();
        let id = match (id.is_empty(), thread_id.is_empty()) {
            (_, true) => id,
            (true, false) => runs::thread_definition(&self.stores, &tenant, &thread_id).await?.ok_or_else(|| {
                Status::not_found(format!(
                    "thread {thread_id:?} has no run and no sandbox yet: its first run names its definition"
                ))
            })?,
            (false, false) => {
                return Err(sandbox::Error::from(InvalidField::new("thread_id", "give either id or thread_id")).into());
            }
        };
        let definition = self.sandboxes.get_definition(&tenant, &id).await?;
        Ok(Response::new(api::GetDefinitionResponse { definition: Some(definition) }))
    }

    async fn list_definitions(
        &self,
        request: Request<api::ListDefinitionsRequest>,
    ) -> Result<Response<api::ListDefinitionsResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let definitions = self.sandboxes.list_definitions(&tenant).await?;
        Ok(Response::new(api::ListDefinitionsResponse { definitions }))
    }

    async fn delete_definition(
        &self,
        request: Request<api::DeleteDefinitionRequest>,
    ) -> Result<Response<api::DeleteDefinitionResponse>, Status> {
        let tenant = tenant_of(&request)?;
        self.sandboxes.delete_definition(&tenant, &request.into_inner().id).await?;
        Ok(Response::new(api::DeleteDefinitionResponse {}))
    }

    type EnsureSandboxStream = BoxStream<api::EnsureSandboxResponse>;

    async fn ensure_sandbox(
        &self,
        request: Request<api::EnsureSandboxRequest>,
    ) -> Result<Response<Self::EnsureSandboxStream>, Status> {
        let tenant = tenant_of(&request)?;
        let events = self.sandboxes.ensure(tenant, request.into_inner()).await?;
        Ok(Response::new(to_status_stream(events)))
    }

    async fn get_sandbox(
        &self,
        request: Request<api::GetSandboxRequest>,
    ) -> Result<Response<api::GetSandboxResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let sandbox = self.sandboxes.get(&tenant, &request.into_inner().sandbox_id).await?;
        Ok(Response::new(api::GetSandboxResponse { sandbox: Some(sandbox) }))
    }

    async fn set_env(
        &self,
        request: Request<api::SetEnvRequest>,
    ) -> Result<Response<api::SetEnvResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let sandbox = self.sandboxes.set_env(&tenant, request.into_inner()).await?;
        Ok(Response::new(api::SetEnvResponse { sandbox: Some(sandbox) }))
    }

    async fn update_network_policy(
        &self,
        request: Request<api::UpdateNetworkPolicyRequest>,
    ) -> Result<Response<api::UpdateNetworkPolicyResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let policy = self.sandboxes.update_network(&tenant, request.into_inner()).await?;
        Ok(Response::new(api::UpdateNetworkPolicyResponse { policy: Some(policy) }))
    }

    async fn list_sandboxes(
        &self,
        request: Request<api::ListSandboxesRequest>,
    ) -> Result<Response<api::ListSandboxesResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let sandboxes = self.sandboxes.list(&tenant, &req.thread_id, req.with_state).await?;
        Ok(Response::new(api::ListSandboxesResponse { sandboxes }))
    }

    async fn list_warm_pools(
        &self,
        request: Request<api::ListWarmPoolsRequest>,
    ) -> Result<Response<api::ListWarmPoolsResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let pools = self.sandboxes.warm_pools(&tenant).await?;
        Ok(Response::new(api::ListWarmPoolsResponse { pools }))
    }

    async fn destroy_sandbox(
        &self,
        request: Request<api::DestroySandboxRequest>,
    ) -> Result<Response<api::DestroySandboxResponse>, Status> {
        let tenant = tenant_of(&request)?;
        self.sandboxes.destroy(&tenant, &request.into_inner().sandbox_id).await?;
        Ok(Response::new(api::DestroySandboxResponse {}))
    }

    async fn exec(&self, request: Request<api::ExecRequest>) -> Result<Response<api::ExecResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(self.sandboxes.exec(&tenant, request.into_inner()).await?))
    }

    type ExecStreamStream = BoxStream<api::ExecStreamResponse>;

    async fn exec_stream(
        &self,
        request: Request<Streaming<api::ExecStreamRequest>>,
    ) -> Result<Response<Self::ExecStreamStream>, Status> {
        let tenant = tenant_of(&request)?;
        let events = self.sandboxes.exec_stream(&tenant, request.into_inner()).await?;
        Ok(Response::new(to_status_stream(events)))
    }

    type ReadFileStream = BoxStream<api::ReadFileResponse>;

    async fn read_file(
        &self,
        request: Request<api::ReadFileRequest>,
    ) -> Result<Response<Self::ReadFileStream>, Status> {
        let tenant = tenant_of(&request)?;
        let chunks = self.sandboxes.read_file(&tenant, request.into_inner()).await?;
        Ok(Response::new(to_status_stream(chunks)))
    }

    async fn write_file(
        &self,
        request: Request<Streaming<api::WriteFileRequest>>,
    ) -> Result<Response<api::WriteFileResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let bytes_written = self.sandboxes.write_file(&tenant, request.into_inner()).await?;
        Ok(Response::new(api::WriteFileResponse { bytes_written }))
    }

    async fn list_files(
        &self,
        request: Request<api::ListFilesRequest>,
    ) -> Result<Response<api::ListFilesResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let entries = self.sandboxes.list_files(&tenant, request.into_inner()).await?;
        Ok(Response::new(api::ListFilesResponse { entries }))
    }

    async fn stat_file(
        &self,
        request: Request<api::StatFileRequest>,
    ) -> Result<Response<api::StatFileResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let info = self.sandboxes.stat_file(&tenant, request.into_inner()).await?;
        Ok(Response::new(api::StatFileResponse { info }))
    }

    async fn make_dir(
        &self,
        request: Request<api::MakeDirRequest>,
    ) -> Result<Response<api::MakeDirResponse>, Status> {
        let tenant = tenant_of(&request)?;
        self.sandboxes.make_dir(&tenant, request.into_inner()).await?;
        Ok(Response::new(api::MakeDirResponse {}))
    }

    async fn remove_file(
        &self,
        request: Request<api::RemoveFileRequest>,
    ) -> Result<Response<api::RemoveFileResponse>, Status> {
        let tenant = tenant_of(&request)?;
        self.sandboxes.remove_file(&tenant, request.into_inner()).await?;
        Ok(Response::new(api::RemoveFileResponse {}))
    }

    async fn rename_file(
        &self,
        request: Request<api::RenameFileRequest>,
    ) -> Result<Response<api::RenameFileResponse>, Status> {
        let tenant = tenant_of(&request)?;
        self.sandboxes.rename_file(&tenant, request.into_inner()).await?;
        Ok(Response::new(api::RenameFileResponse {}))
    }

    type ConnectPortStream = BoxStream<api::ConnectPortResponse>;

    async fn connect_port(
        &self,
        request: Request<Streaming<api::ConnectPortRequest>>,
    ) -> Result<Response<Self::ConnectPortStream>, Status> {
        let tenant = tenant_of(&request)?;
        let events = self.sandboxes.connect_port(&tenant, request.into_inner()).await?;
        Ok(Response::new(to_status_stream(events)))
    }

    type OpenTerminalStream = BoxStream<api::OpenTerminalResponse>;

    async fn open_terminal(
        &self,
        request: Request<Streaming<api::OpenTerminalRequest>>,
    ) -> Result<Response<Self::OpenTerminalStream>, Status> {
        let tenant = tenant_of(&request)?;
        let events = self.sandboxes.open_terminal(&tenant, request.into_inner()).await?;
        Ok(Response::new(to_status_stream(events)))
    }

    async fn git_status(
        &self,
        request: Request<api::GitStatusRequest>,
    ) -> Result<Response<api::GitStatusResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(self.sandboxes.git_status(&tenant, request.into_inner()).await?))
    }

    async fn git_diff(
        &self,
        request: Request<api::GitDiffRequest>,
    ) -> Result<Response<api::GitDiffResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(self.sandboxes.git_diff(&tenant, request.into_inner()).await?))
    }

    async fn git_add(
        &self,
        request: Request<api::GitAddRequest>,
    ) -> Result<Response<api::GitAddResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(self.sandboxes.git_add(&tenant, request.into_inner()).await?))
    }

    async fn git_commit(
        &self,
        request: Request<api::GitCommitRequest>,
    ) -> Result<Response<api::GitCommitResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(self.sandboxes.git_commit(&tenant, request.into_inner()).await?))
    }

    async fn git_branch(
        &self,
        request: Request<api::GitBranchRequest>,
    ) -> Result<Response<api::GitBranchResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(self.sandboxes.git_branch(&tenant, request.into_inner()).await?))
    }

    async fn git_push(
        &self,
        request: Request<api::GitPushRequest>,
    ) -> Result<Response<api::GitPushResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(self.sandboxes.git_push(&tenant, request.into_inner()).await?))
    }

    async fn git_pull(
        &self,
        request: Request<api::GitPullRequest>,
    ) -> Result<Response<api::GitPullResponse>, Status> {
        let tenant = tenant_of(&request)?;
        Ok(Response::new(self.sandboxes.git_pull(&tenant, request.into_inner()).await?))
    }

    type WatchFilesStream = BoxStream<api::WatchFilesResponse>;

    async fn watch_files(
        &self,
        request: Request<api::WatchFilesRequest>,
    ) -> Result<Response<Self::WatchFilesStream>, Status> {
        let tenant = tenant_of(&request)?;
        let events = self.sandboxes.watch_files(&tenant, request.into_inner()).await?;
        Ok(Response::new(to_status_stream(events)))
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn an_agent_status_passes_unchanged_and_refusals_keep_their_details() {
        let agent = Status::with_details(Code::Aborted, "agent says no", bytes::Bytes::from_static(b"d"));
        let passed = Status::from(sandbox::Error::Rpc(agent));
        assert_eq!(
            (passed.code(), passed.message(), passed.details()),
            (Code::Aborted, "agent says no", &b"d"[..])
        );
        let refused = Status::from(sandbox::Error::SecretNotKnown("TOKEN".into()));
        assert_eq!(refused.code(), Code::FailedPrecondition);
        let wire = shared::error::Error::from_status(&refused);
        assert_eq!(wire.metadata.get("secret").map(String::as_str), Some("TOKEN"));
    }
}
