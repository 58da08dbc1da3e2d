//! A tenant's checkpoints as the public API sees them: list a thread's,
//! fork one into a new thread, read a file of one, delete one. Saving
//! needs the thread's live sandbox, so it is the sandbox component's
//! operation (over [`save`](super::save)).

use futures::StreamExt;
use futures::stream::BoxStream;
use prost::Message;
use sha2::Digest;
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;

use super::Error;
use super::blob::blob_bytes;
use crate::provision::InvalidField;
use crate::store::{Checkpoint, Fork, Stores, Tenant};

/// The messages of one artifact read: its info first (alone when the file
/// is empty), then its bytes, checked against its hash at the end.
pub type ArtifactStream = BoxStream<'static, Result<api::ReadArtifactResponse, Error>>;

/// A thread's checkpoints, oldest first, and which of them is its head.
pub struct Listed {
    pub checkpoints: Vec<Checkpoint>,
    pub head: Option<String>,
}

/// Built from the stores. Cheap to clone.
#[derive(Clone)]
pub struct Snapshots {
    stores: Stores,
}

impl Snapshots {
    pub fn new(stores: Stores) -> Self {
        Self { stores }
    }

    /// The tenant's checkpoints of `thread_id` (none for another tenant's).
    pub async fn list(&self, tenant: &Tenant, thread_id: &str) -> Result<Listed, Error> {
        let thread_id = InvalidField::required("thread_id", thread_id)?;
        let head = self.stores.checkpoints.head(tenant, thread_id).await?.map(|h| h.checkpoint_id);
        let checkpoints = self.stores.checkpoints.list(tenant, thread_id).await?;
        Ok(Listed { checkpoints, head })
    }

    /// Copy checkpoint `checkpoint_id` of `thread_id`, and the runs before
    /// it, into `new_thread_id`, which has neither yet.
    pub async fn fork(
        &self,
        tenant: &Tenant,
        thread_id: &str,
        checkpoint_id: &str,
        new_thread_id: &str,
    ) -> Result<Fork, Error> {
        Ok(self
            .stores
            .checkpoints
            .fork(
                tenant,
                InvalidField::required("thread_id", thread_id)?,
                InvalidField::required("checkpoint_id", checkpoint_id)?,
                InvalidField::required("new_thread_id", new_thread_id)?,
            )
            .await?)
    }

    /// The file at `path` of the tenant's checkpoint, streamed from the
    /// tenant's blobs.
    pub async fn read_artifact(
        &self,
        tenant: &Tenant,
        thread_id: &str,
        checkpoint_id: &str,
        path: &str,
    ) -> Result<ArtifactStream, Error> {
        let thread_id = InvalidField::required("thread_id", thread_id)?;
        let checkpoint_id = InvalidField::required("checkpoint_id", checkpoint_id)?;
        let path = path.trim_start_matches("./");
        shared::snapshot::check_path(path).map_err(|why| Error::from(InvalidField::new("path", why)))?;
        // Checks that the checkpoint is this tenant's and this thread's.
        let (_, manifest) = self.stores.checkpoints.get(tenant, thread_id, checkpoint_id).await?;
        let entries = agent::CaptureResponse::decode(manifest.as_slice())
            .map_err(|e| Error::Corrupt(format!("checkpoint {checkpoint_id}: unreadable manifest: {e}")))?
            .entries;
        let entry = entries
            .into_iter()
            .find(|e| e.path == path && e.kind == agent::EntryKind::File as i32)
            .ok_or_else(|| Error::NoSuchFile {
            path: path.to_string(),
            checkpoint_id: checkpoint_id.to_string(),
        })?;
        let mut blob = blob_bytes(&self.stores, tenant, &entry.sha256).await?;
        let info =
            api::ArtifactInfo { path: entry.path, size: entry.size, mode: entry.mode, sha256: entry.sha256 };
        let stream = async_stream::try_stream! {
            let expected = info.sha256.clone();
            let mut hasher = sha2::Sha256::new();
            let mut info = Some(info);
            while let Some(chunk) = blob.next().await {
                let chunk = chunk?;
                hasher.update(&chunk);
                yield api::ReadArtifactResponse { info: info.take(), data: chunk.to_vec() };
            }
            if let Some(info) = info.take() {
                yield api::ReadArtifactResponse { info: Some(info), data: Vec::new() };
            }
            if hex::encode(hasher.finalize()) != expected {
                Err(Error::Corrupt("the stored blob does not match its hash".into()))?;
            }
        };
        Ok(Box::pin(stream))
    }

    /// Delete the tenant's checkpoint `checkpoint_id` of `thread_id`.
    pub async fn delete(&self, tenant: &Tenant, thread_id: &str, checkpoint_id: &str) -> Result<(), Error> {
        self.stores
            .checkpoints
            .delete(
                tenant,
                InvalidField::required("thread_id", thread_id)?,
                InvalidField::required("checkpoint_id", checkpoint_id)?,
            )
            .await?;
        Ok(())
    }
}
