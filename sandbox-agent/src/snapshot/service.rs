//! `SnapshotService`: the tonic service over capture and restore.

use std::path::{Path, PathBuf};
use std::pin::Pin;

use futures::Stream;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    CaptureRequest, CaptureResponse, ReadBlobsRequest, ReadBlobsResponse, RestoreRequest, RestoreResponse,
    restore_request, snapshot_service_server::SnapshotService,
};
use shared::snapshot::check_path;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::capture::{capture, read_blob};
use super::policy::Policy;
use super::redaction::Redactor;
use super::restore::{Receiver, Staging, apply, refuse};
use crate::confine::Root;
use crate::context::AgentContext;
use crate::run_user::{FsAs, RunUser};
use crate::vault::Vault;

/// Manifest entries per `CaptureResponse`.
const ENTRIES_PER_MESSAGE: usize = 1000;

pub struct Snapshots {
    root: Root,
    staging_parent: PathBuf,
    run_user: Option<RunUser>,
    vault: Vault,
}

impl Snapshots {
    pub fn new(ctx: &AgentContext) -> Self {
        // Beside the journal dir: outside the workspace, inside whatever the
        // provider keeps for the sandbox.
        let staging_parent =
            ctx.journal_dir.parent().map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        Self {
            root: ctx.root.clone(),
            staging_parent,
            run_user: ctx.run_user.clone(),
            vault: ctx.vault.clone(),
        }
    }

    /// The values a capture zeroes: the request's and every one this agent
    /// holds (a successor replica that never had them still captures
    /// safely). Refused when the sandbox was handed secrets this agent no
    /// longer holds (it restarted): a capture never goes without them.
    fn redactor(&self, requested: Vec<String>) -> Result<Redactor, Error> {
        let declared = self.vault.declared();
        self.vault.masks(&declared, "capturing a snapshot")?;
        let mut values = requested;
        values.extend(self.vault.values());
        Redactor::new(&values)
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(Status::from),
        Err(e) => Err(Error::internal(format!("snapshot task failed: {e}")).into()),
    }
}

#[tonic::async_trait]
impl SnapshotService for Snapshots {
    type CaptureStream = BoxStream<CaptureResponse>;
    type ReadBlobsStream = BoxStream<ReadBlobsResponse>;

    async fn capture(&self, req: Request<CaptureRequest>) -> Result<Response<Self::CaptureStream>, Status> {
        let req = req.into_inner();
        let policy = Policy::compile(&req.policy.unwrap_or_default())?;
        let redactor = self.redactor(req.redact_values)?;
        let root = self.root.path().to_path_buf();
        let user = self.run_user.clone();
        // As the run user: a link it swapped in never shows the snapshot
        // what only the agent may read.
        let entries = blocking(move || {
            let _as = FsAs::new(user.as_ref())?;
            capture(&root, &policy, &redactor, user.as_ref())
        })
        .await?;
        let batches: Vec<Result<CaptureResponse, Status>> = entries
            .chunks(ENTRIES_PER_MESSAGE)
            .map(|c| Ok(CaptureResponse { entries: c.to_vec() }))
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(batches))))
    }

    async fn read_blobs(
        &self,
        req: Request<ReadBlobsRequest>,
    ) -> Result<Response<Self::ReadBlobsStream>, Status> {
        let mut req = req.into_inner();
        let policy = Policy::compile(&req.policy.unwrap_or_default())?;
        let redactor = self.redactor(std::mem::take(&mut req.redact_values))?;
        for blob in &req.blobs {
            check_path(&blob.path)
                .map_err(|why| Error::invalid_field("blobs.path", format!("{:?}: {why}", blob.path)))?;
        }
        let root = self.root.clone();
        let user = self.run_user.clone();
        let (tx, rx) = mpsc::channel::<Result<ReadBlobsResponse, Status>>(16);
        tokio::task::spawn_blocking(move || {
            let _as = match FsAs::new(user.as_ref()) {
                Ok(as_user) => as_user,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e.into()));
                    return;
                }
            };
            let send = |msg: ReadBlobsResponse| {
                tx.blocking_send(Ok(msg)).map_err(|_| Error::new(ErrorCode::Cancelled, "reader left"))
            };
            for blob in req.blobs {
                let sha256 = blob.sha256.clone();
                // One piece held back, so the last one carries `last`: a
                // small file is one message.
                let mut held: Option<Vec<u8>> = None;
                let result =
                    read_blob(&root, &blob, &policy, &redactor, |data| match held.replace(data.to_vec()) {
                        Some(data) => {
                            send(ReadBlobsResponse { sha256: sha256.clone(), data: data.into(), last: false })
                        }
                        None => Ok(()),
                    })
                    .and_then(|()| {
                        send(ReadBlobsResponse {
                            sha256,
                            data: held.take().unwrap_or_default().into(),
                            last: true,
                        })
                    });
                if let Err(e) = result {
                    let _ = tx.blocking_send(Err(e.into()));
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn restore(
        &self,
        req: Request<Streaming<RestoreRequest>>,
    ) -> Result<Response<RestoreResponse>, Status> {
        let mut inbound = req.into_inner();
        let header = match inbound.message().await? {
            Some(RestoreRequest { request: Some(restore_request::Request::Header(h)) }) => h,
            _ => return Err(Error::invalid_field("header", "the first message must carry the header").into()),
        };
        let policy = Policy::compile(&header.policy.clone().unwrap_or_default())?;
        let mut staging = Staging::new(&self.staging_parent)?;
        let mut receiver = Receiver::new(&header, &mut staging);
        while let Some(msg) = inbound.message().await? {
            match msg.request {
                Some(restore_request::Request::Entries(batch)) => receiver.entries(batch.entries)?,
                Some(restore_request::Request::Blob(blob)) => receiver.blob(blob).await?,
                Some(restore_request::Request::Header(_)) => return Err(refuse("a second header").into()),
                None => return Err(refuse("an empty message").into()),
            }
        }
        let entries = receiver.finish().await?;
        let root = self.root.clone();
        let user = self.run_user.clone();
        // Written as the run user, so what it restores is the user's.
        let response = blocking(move || apply(&root, staging, &policy, entries, user.as_ref())).await?;
        tracing::info!(
            files = response.files_written,
            dirs = response.dirs_created,
            bytes = response.bytes_written,
            removed = response.paths_removed,
            excluded = response.entries_excluded,
            "snapshot restored"
        );
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};
    use shared::proto::agent::v1::snapshot_service_client::SnapshotServiceClient;
    use shared::proto::agent::v1::snapshot_service_server::SnapshotServiceServer;
    use shared::proto::agent::v1::{BlobRef, EntryKind};
    use tonic::transport::Server;

    use super::*;
    use crate::testing;

    #[tokio::test]
    async fn capture_and_read_blobs_zero_secret_values_through_the_real_stack() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = testing::context(dir.path());
        let root = dir.path().join("root");
        std::fs::write(root.join("a.txt"), "token=s3cret!").unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/HEAD"), "excluded by default").unwrap();
        let channel =
            testing::channel(Server::builder().add_service(SnapshotServiceServer::new(Snapshots::new(&ctx))))
                .await;
        let mut client = SnapshotServiceClient::new(channel);
        let secrets = vec!["s3cret".to_string()];
        let zeroed = b"token=\0\0\0\0\0\0!".to_vec();

        let req = CaptureRequest { redact_values: secrets.clone(), ..Default::default() };
        let mut batches = client.capture(req).await.unwrap().into_inner();
        let mut entries = Vec::new();
        while let Some(batch) = batches.message().await.unwrap() {
            entries.extend(batch.entries);
        }
        assert_eq!(entries.len(), 1, "{entries:?}");
        let entry = &entries[0];
        assert_eq!((entry.path.as_str(), entry.kind, entry.size), ("a.txt", EntryKind::File as i32, 13));
        assert_eq!(entry.sha256, hex::encode(Sha256::digest(&zeroed)));

        let blob = BlobRef { path: entry.path.clone(), sha256: entry.sha256.clone() };
        let req = ReadBlobsRequest { blobs: vec![blob], redact_values: secrets, ..Default::default() };
        let mut chunks = client.read_blobs(req).await.unwrap().into_inner();
        let (mut data, mut last) = (Vec::new(), false);
        while let Some(chunk) = chunks.message().await.unwrap() {
            assert_eq!(chunk.sha256, entry.sha256);
            data.extend_from_slice(&chunk.data);
            last = chunk.last;
        }
        assert!(last, "the blob ends with a last message");
        assert_eq!(data, zeroed);
    }
}
