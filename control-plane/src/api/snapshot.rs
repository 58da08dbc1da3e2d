//! `sandhold.v1.SnapshotService`: save, list, fork, read artifacts of and
//! delete a thread's checkpoints. Scoped to the caller's tenant: another
//! tenant's thread has no checkpoints and its checkpoint ids are NOT_FOUND.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use prost::Message;
use sha2::Digest;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use shared::proto::v1::snapshot_service_server::SnapshotService;
use tonic::{Request, Response, Status};

use crate::auth::tenant_of;
use crate::context::Context;
use crate::sandbox::ensure::required;
use crate::snapshot::{self, SaveRequest, capture_policy};
use crate::store::{Checkpoint, Instance, Tenant};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Built from the context: the stores and the lifecycle.
#[derive(Clone)]
pub struct SnapshotApi {
    cx: Context,
}

impl SnapshotApi {
    pub fn new(cx: Context) -> Self {
        Self { cx }
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

/// The tenant's sandbox of `thread_id` to save from: `sandbox_id` when
/// given, else the thread's only sandbox.
async fn sandbox_of_thread(
    stores: &crate::store::Stores,
    tenant: &Tenant,
    thread_id: &str,
    sandbox_id: &str,
) -> Result<Instance, Error> {
    let mut of_thread: Vec<Instance> = stores
        .instances
        .list(Some(tenant))
        .await?
        .into_iter()
        .filter(|i| i.thread_id == thread_id && (sandbox_id.is_empty() || i.sandbox_key == sandbox_id))
        .collect();
    match of_thread.len() {
        0 => Err(Error::new(
            ErrorCode::FailedPrecondition,
            format!("thread {thread_id} has no sandbox to save; EnsureSandbox first"),
        )),
        1 => Ok(of_thread.remove(0)),
        n => {
            Err(Error::invalid_field("sandbox_id", format!("thread {thread_id} has {n} sandboxes; name one")))
        }
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
        let req = req.into_inner();
        let thread_id = required("thread_id", &req.thread_id)?;
        let instance = sandbox_of_thread(&self.cx.stores, &tenant, thread_id, &req.sandbox_id).await?;
        let stored = self.cx.stores.definitions.get(&tenant, &instance.definition_id).await?;
        let definition = crate::sandbox::definition::from_stored(&stored.body)?;
        let lifecycle = definition.lifecycle.clone().unwrap_or_default();
        if lifecycle.reuse == api::Reuse::None as i32 {
            return Err(Error::new(
                ErrorCode::FailedPrecondition,
                "the definition has `reuse: none`: its sandboxes are per run and cannot save a named checkpoint",
            )
            .into());
        }
        let live = self.cx.lifecycle.agent(&self.cx.stores, &tenant, &instance.sandbox_key).await?;
        // Without the secret values nothing could be zeroed: refuse rather
        // than store them.
        if let Some(name) = definition.secret_names.iter().find(|n| !live.secrets.contains_key(*n)) {
            return Err(Error::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "the value of secret {name} is not known to this server; EnsureSandbox with it, then save"
                ),
            )
            .with_meta("secret", name.clone())
            .into());
        }
        let policy = capture_policy(lifecycle.portable_snapshots.as_ref());
        let checkpoint = snapshot::save(
            &self.cx.stores,
            &live.agent,
            SaveRequest {
                tenant: &tenant,
                thread_id,
                run_id: &req.run_id,
                label: &req.label,
                policy,
                secrets: &live.secrets,
            },
        )
        .await?;
        let id = checkpoint.checkpoint_id.clone();
        Ok(Response::new(api::SaveSnapshotResponse { checkpoint: Some(to_api(checkpoint, Some(&id))) }))
    }

    async fn list_snapshots(
        &self,
        req: Request<api::ListSnapshotsRequest>,
    ) -> Result<Response<api::ListSnapshotsResponse>, Status> {
        let tenant = tenant_of(&req)?;
        let req = req.into_inner();
        let thread_id = required("thread_id", &req.thread_id)?;
        let head = self.cx.stores.checkpoints.head(&tenant, thread_id).await.map_err(Error::from)?;
        let head = head.map(|h| h.checkpoint_id);
        let checkpoints = self.cx.stores.checkpoints.list(&tenant, thread_id).await.map_err(Error::from)?;
        Ok(Response::new(api::ListSnapshotsResponse {
            checkpoints: checkpoints.into_iter().map(|c| to_api(c, head.as_deref())).collect(),
        }))
    }

    async fn fork_snapshot(
        &self,
        req: Request<api::ForkSnapshotRequest>,
    ) -> Result<Response<api::ForkSnapshotResponse>, Status> {
        let tenant = tenant_of(&req)?;
        let req = req.into_inner();
        let fork = self
            .cx
            .stores
            .checkpoints
            .fork(
                &tenant,
                required("thread_id", &req.thread_id)?,
                required("checkpoint_id", &req.checkpoint_id)?,
                required("new_thread_id", &req.new_thread_id)?,
            )
            .await
            .map_err(Error::from)?;
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
        let thread_id = required("thread_id", &req.thread_id)?;
        let checkpoint_id = required("checkpoint_id", &req.checkpoint_id)?;
        let path = req.path.trim_start_matches("./");
        shared::snapshot::check_path(path).map_err(|why| Error::invalid_field("path", why))?;
        // Checks that the checkpoint is this tenant's and this thread's.
        let (_, manifest) =
            self.cx.stores.checkpoints.get(&tenant, thread_id, checkpoint_id).await.map_err(Error::from)?;
        let entries = agent::CaptureResponse::decode(manifest.as_slice())
            .map_err(|e| Error::internal(format!("checkpoint {checkpoint_id}: unreadable manifest: {e}")))?
            .entries;
        let entry =
            entries
                .into_iter()
                .find(|e| e.path == path && e.kind == agent::EntryKind::File as i32)
                .ok_or_else(|| Error::not_found(format!("no file {path:?} in checkpoint {checkpoint_id}")))?;
        let mut blob = snapshot::blob_bytes(&self.cx.stores, &entry.sha256).await?;
        let info =
            api::ArtifactInfo { path: entry.path, size: entry.size, mode: entry.mode, sha256: entry.sha256 };
        let stream = async_stream::try_stream! {
            let expected = info.sha256.clone();
            let mut hasher = sha2::Sha256::new();
            let mut info = Some(info);
            while let Some(chunk) = blob.next().await {
                let chunk = chunk.map_err(|e| Status::from(Error::from(e)))?;
                hasher.update(&chunk);
                yield api::ReadArtifactResponse { info: info.take(), data: chunk.to_vec() };
            }
            if let Some(info) = info.take() {
                yield api::ReadArtifactResponse { info: Some(info), data: Vec::new() };
            }
            if hex::encode(hasher.finalize()) != expected {
                Err(Status::from(Error::internal("the stored blob does not match its hash")))?;
            }
        };
        Ok(Response::new(Box::pin(stream)))
    }

    async fn delete_snapshot(
        &self,
        req: Request<api::DeleteSnapshotRequest>,
    ) -> Result<Response<api::DeleteSnapshotResponse>, Status> {
        let tenant = tenant_of(&req)?;
        let req = req.into_inner();
        self.cx
            .stores
            .checkpoints
            .delete(
                &tenant,
                required("thread_id", &req.thread_id)?,
                required("checkpoint_id", &req.checkpoint_id)?,
            )
            .await
            .map_err(Error::from)?;
        Ok(Response::new(api::DeleteSnapshotResponse {}))
    }
}
