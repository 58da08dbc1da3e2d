//! `SnapshotService`: the tonic service over capture and restore.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use futures::Stream;
use sha2::{Digest, Sha256};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    CaptureRequest, CaptureResponse, ManifestEntry, ReadBlobsRequest, ReadBlobsResponse, RestoreRequest,
    RestoreResponse, restore_request, snapshot_service_server::SnapshotService,
};
use shared::snapshot::{ManifestSummary, check_manifest, check_path};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::capture::{capture, kind_of, unsupported};
use super::policy::Policy;
use super::redaction::{Redactor, zero_file};
use super::restore::{Incoming, Staging, plan, refuse, remove_paths, write_entries};
use crate::confine::{Root, io_error};
use crate::context::AgentContext;

/// Manifest entries per `CaptureResponse`.
const ENTRIES_PER_MESSAGE: usize = 1000;

pub struct Snapshots {
    root: Root,
    staging_parent: PathBuf,
}

impl Snapshots {
    pub fn new(ctx: &AgentContext) -> Self {
        // Beside the journal dir: outside the workspace, inside whatever the
        // provider keeps for the sandbox.
        let staging_parent =
            ctx.journal_dir.parent().map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        Self { root: ctx.root.clone(), staging_parent }
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
        let redactor = Redactor::new(&req.redact_values)?;
        let root = self.root.path().to_path_buf();
        let entries = blocking(move || capture(&root, &policy, &redactor)).await?;
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
        let req = req.into_inner();
        let policy = Policy::compile(&req.policy.unwrap_or_default())?;
        let redactor = Redactor::new(&req.redact_values)?;
        for blob in &req.blobs {
            check_path(&blob.path)
                .map_err(|why| Error::invalid_field("blobs.path", format!("{:?}: {why}", blob.path)))?;
        }
        let root = self.root.clone();
        let (tx, rx) = mpsc::channel::<Result<ReadBlobsResponse, Status>>(4);
        tokio::task::spawn_blocking(move || {
            for blob in req.blobs {
                let result = (|| {
                    let path = blob.path.as_str();
                    let abs = root.resolve_no_follow(path)?;
                    let meta = std::fs::symlink_metadata(&abs).map_err(|e| io_error(e, path))?;
                    if !meta.is_file() {
                        return Err(unsupported(path, kind_of(&meta.file_type())));
                    }
                    if meta.mode() & 0o111 != 0 {
                        return Err(unsupported(path, "executable"));
                    }
                    let (_, sha256) = zero_file(&abs, path, &redactor, policy.redacted(path), |data| {
                        let msg = ReadBlobsResponse {
                            sha256: blob.sha256.clone(),
                            data: data.to_vec(),
                            last: false,
                        };
                        tx.blocking_send(Ok(msg)).map_err(|_| Error::new(ErrorCode::Cancelled, "reader left"))
                    })?;
                    if sha256 != blob.sha256 {
                        return Err(Error::new(
                            ErrorCode::FailedPrecondition,
                            format!("{path:?} changed while it was captured; capture again"),
                        )
                        .with_meta("path", path));
                    }
                    let end = ReadBlobsResponse { sha256: blob.sha256.clone(), data: Vec::new(), last: true };
                    tx.blocking_send(Ok(end)).map_err(|_| Error::new(ErrorCode::Cancelled, "reader left"))
                })();
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
        let staging = Staging::new(&self.staging_parent)?;
        let mut entries: Vec<ManifestEntry> = Vec::new();
        let mut summary: Option<ManifestSummary> = None;
        let mut current: Option<Incoming> = None;
        let mut received: HashSet<String> = HashSet::new();
        while let Some(msg) = inbound.message().await? {
            match msg.request {
                Some(restore_request::Request::Entries(batch)) => {
                    if summary.is_some() {
                        return Err(refuse("manifest entries after the first blob").into());
                    }
                    entries.extend(batch.entries);
                    if entries.len() as u64 > header.entry_count {
                        return Err(refuse("more manifest entries than the header announced").into());
                    }
                }
                Some(restore_request::Request::Blob(blob)) => {
                    if summary.is_none() {
                        if entries.len() as u64 != header.entry_count {
                            return Err(refuse("fewer manifest entries than the header announced").into());
                        }
                        summary = Some(check_manifest(&entries)?);
                    }
                    let known = summary.as_ref().expect("set above");
                    if current.as_ref().is_none_or(|c| c.sha256 != blob.sha256) {
                        if let Some(done) = current.take() {
                            received.insert(done.finish().await?);
                        }
                        let Some(&expected) = known.blobs.get(&blob.sha256) else {
                            return Err(
                                refuse(format!("blob {:?} is not in the manifest", blob.sha256)).into()
                            );
                        };
                        if received.contains(&blob.sha256) {
                            return Err(refuse(format!("blob {} sent twice", blob.sha256)).into());
                        }
                        let file = tokio::fs::File::create(staging.blob(&blob.sha256))
                            .await
                            .map_err(|e| Error::internal(format!("staging a blob: {e}")))?;
                        current = Some(Incoming {
                            sha256: blob.sha256.clone(),
                            file,
                            hasher: Sha256::new(),
                            size: 0,
                            expected,
                        });
                    }
                    let incoming = current.as_mut().expect("set above");
                    incoming.size += blob.data.len() as u64;
                    if incoming.size > incoming.expected {
                        return Err(refuse(format!(
                            "blob {} is longer than the {} bytes the manifest says",
                            incoming.sha256, incoming.expected
                        ))
                        .into());
                    }
                    incoming.hasher.update(&blob.data);
                    incoming
                        .file
                        .write_all(&blob.data)
                        .await
                        .map_err(|e| Error::internal(format!("staging a blob: {e}")))?;
                }
                Some(restore_request::Request::Header(_)) => return Err(refuse("a second header").into()),
                None => return Err(refuse("an empty message").into()),
            }
        }
        if let Some(done) = current.take() {
            received.insert(done.finish().await?);
        }
        let summary = match summary {
            Some(s) => s,
            None => {
                if entries.len() as u64 != header.entry_count {
                    return Err(refuse("fewer manifest entries than the header announced").into());
                }
                check_manifest(&entries)?
            }
        };
        if let Some(missing) = summary.blobs.keys().find(|h| !received.contains(*h)) {
            let path =
                entries.iter().find(|e| &e.sha256 == missing).map(|e| e.path.clone()).unwrap_or_default();
            return Err(Status::from(
                refuse(format!("blob {missing} of {path:?} is missing")).with_meta("path", path),
            ));
        }
        if received.len() as u64 != header.blob_count {
            return Err(refuse("the blob count differs from the header").into());
        }
        let root = self.root.clone();
        let response = blocking(move || {
            let plan = plan(root.path(), &policy, entries)?;
            // Verified and planned: the first change to the workspace.
            remove_paths(root.path(), &plan.remove)?;
            let mut response = write_entries(&root, &staging, &plan.write)?;
            response.paths_removed = plan.remove.len() as u64;
            response.entries_excluded = plan.excluded;
            drop(staging);
            Ok(response)
        })
        .await?;
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
