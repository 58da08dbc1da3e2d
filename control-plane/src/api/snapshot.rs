//! `sandhold.v1.SnapshotService`: save, list, fork, read artifacts of and
//! delete a thread's checkpoints. Saving is a [`Sandboxes`] operation (it
//! needs the thread's live sandbox), the rest [`Snapshots`] ones; their
//! errors (`sandbox::Error`, [`snapshot::Error`]) map to statuses. Scoped
//! to the caller's tenant: another tenant's thread has no checkpoints and
//! its checkpoint ids are NOT_FOUND.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use shared::proto::v1 as api;
use shared::proto::v1::snapshot_service_server::SnapshotService;
use tonic::{Request, Response, Status};

use crate::auth::tenant_of;
use crate::context::Context;
use crate::sandbox::Sandboxes;
use crate::snapshot::{self, Snapshots};
use crate::store::Checkpoint;

impl From<snapshot::Error> for Status {
    fn from(e: snapshot::Error) -> Self {
        shared::error::Error::from(e).into()
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Built from the context: the stores and the sandboxes.
#[derive(Clone)]
pub struct SnapshotApi {
    snapshots: Snapshots,
    sandboxes: Sandboxes,
}

impl SnapshotApi {
    pub fn new(cx: Context) -> Self {
        Self { snapshots: Snapshots::new(cx.stores.clone()), sandboxes: cx.sandboxes() }
    }
}

pub(crate) fn to_api(c: Checkpoint, head: Option<&str>) -> api::Checkpoint {
    api::Checkpoint {
        head: head == Some(c.checkpoint_id.as_str()),
        checkpoint_id: c.checkpoint_id,
        thread_id: c.thread_id,
        parent_id: c.parent_id.unwrap_or_default(),
        run_id: c.run_id,
        label: c.label,
        created_at_ms: c.created_at.as_millis(),
        file_count: c.file_count,
        dir_count: c.dir_count,
        total_bytes: c.total_bytes,
        uploaded_bytes: c.uploaded_bytes,
        forked_from: c.forked_from.unwrap_or_default(),
    }
}

#[tonic::async_trait]
impl SnapshotService for SnapshotApi {
    type ReadArtifactStream = BoxStream<api::ReadArtifactResponse>;

    async fn save_snapshot(
        &self,
        req: Request<api::SaveSnapshotRequest>,
    ) -> Result<Response<api::SaveSnapshotResponse>, Status> {
        let tenant = tenant_of(&req)?;
        let checkpoint = self.sandboxes.save_checkpoint(&tenant, &req.into_inner()).await?;
        let id = checkpoint.checkpoint_id.clone();
        Ok(Response::new(api::SaveSnapshotResponse { checkpoint: Some(to_api(checkpoint, Some(&id))) }))
    }

    async fn list_snapshots(
        &self,
        req: Request<api::ListSnapshotsRequest>,
    ) -> Result<Response<api::ListSnapshotsResponse>, Status> {
        let tenant = tenant_of(&req)?;
        let listed = self.snapshots.list(&tenant, &req.into_inner().thread_id).await?;
        let head = listed.head.as_deref();
        Ok(Response::new(api::ListSnapshotsResponse {
            checkpoints: listed.checkpoints.into_iter().map(|c| to_api(c, head)).collect(),
        }))
    }

    async fn fork_snapshot(
        &self,
        req: Request<api::ForkSnapshotRequest>,
    ) -> Result<Response<api::ForkSnapshotResponse>, Status> {
        let tenant = tenant_of(&req)?;
        let req = req.into_inner();
        let fork =
            self.snapshots.fork(&tenant, &req.thread_id, &req.checkpoint_id, &req.new_thread_id).await?;
        let id = fork.checkpoint.checkpoint_id.clone();
        Ok(Response::new(api::ForkSnapshotResponse {
            checkpoint: Some(to_api(fork.checkpoint, Some(&id))),
            run_ids: fork.runs.iter().map(ToString::to_string).collect(),
        }))
    }

    async fn read_artifact(
        &self,
        req: Request<api::ReadArtifactRequest>,
    ) -> Result<Response<Self::ReadArtifactStream>, Status> {
        let tenant = tenant_of(&req)?;
        let req = req.into_inner();
        let artifact =
            self.snapshots.read_artifact(&tenant, &req.thread_id, &req.checkpoint_id, &req.path).await?;
        Ok(Response::new(Box::pin(artifact.map(|item| item.map_err(Status::from)))))
    }

    async fn delete_snapshot(
        &self,
        req: Request<api::DeleteSnapshotRequest>,
    ) -> Result<Response<api::DeleteSnapshotResponse>, Status> {
        let tenant = tenant_of(&req)?;
        let req = req.into_inner();
        self.snapshots.delete(&tenant, &req.thread_id, &req.checkpoint_id).await?;
        Ok(Response::new(api::DeleteSnapshotResponse {}))
    }
}
