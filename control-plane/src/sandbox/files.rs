//! Files of a live sandbox, through its agent: read, write, list, stat,
//! make directories, remove, rename, and watch.

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::{Error, Sandboxes};
use crate::store::Tenant;

/// A `WriteFile` without a declared size is buffered up to this many bytes.
const MAX_BUFFERED_UPLOAD: usize = 64 << 20;

/// How a buffered upload is cut into messages to the agent.
const UPLOAD_CHUNK: usize = 256 << 10;

pub type ReadFileStream = BoxStream<'static, Result<api::ReadFileResponse, Error>>;
pub type WatchStream = BoxStream<'static, Result<api::WatchFilesResponse, Error>>;

impl Sandboxes {
    pub async fn read_file(
        &self,
        tenant: &Tenant,
        req: api::ReadFileRequest,
    ) -> Result<ReadFileStream, Error> {
        let live = self.live(tenant, &req.sandbox_id).await?;
        let stream = live
            .agent
            .fs()
            .read_file(agent::ReadFileRequest { path: req.path, offset: req.offset, limit: req.limit })
            .await?
            .into_inner();
        Ok(Box::pin(stream.map(|r| Ok(api::ReadFileResponse { data: r?.data }))))
    }

    /// Write the file `inbound` begins with the header of; returns the
    /// bytes written. The agent always gets the exact size, so an upload
    /// cut off on the way is refused there rather than committed short.
    pub async fn write_file<S>(&self, tenant: &Tenant, mut inbound: S) -> Result<u64, Error>
    where
        S: Stream<Item = Result<api::WriteFileRequest, Status>> + Send + Unpin + 'static,
    {
        let Some(api::write_file_request::Request::Header(header)) =
            inbound.next().await.transpose()?.and_then(|m| m.request)
        else {
            return Err(Error::invalid_field("header", "the first message must be the header"));
        };
        let live = self.live(tenant, &header.sandbox_id).await?;
        let (size, buffered) = match header.size {
            Some(size) => (size, None),
            None => {
                let mut data = Vec::new();
                while let Some(message) = inbound.next().await.transpose()? {
                    if let Some(api::write_file_request::Request::Data(chunk)) = message.request {
                        data.extend_from_slice(&chunk);
                        if data.len() > MAX_BUFFERED_UPLOAD {
                            return Err(Error::invalid_field(
                                "header.size",
                                format!("required for uploads over {MAX_BUFFERED_UPLOAD} bytes"),
                            ));
                        }
                    }
                }
                (data.len() as u64, Some(data))
            }
        };
        let agent_header = agent::WriteFileRequest {
            request: Some(agent::write_file_request::Request::Header(agent::WriteFileHeader {
                path: header.path,
                mode: header.mode,
                make_parents: header.make_parents,
                size: Some(size),
            })),
        };
        let data = |chunk: Vec<u8>| agent::WriteFileRequest {
            request: Some(agent::write_file_request::Request::Data(chunk)),
        };
        let resp = match buffered {
            Some(all) => {
                let chunks: Vec<agent::WriteFileRequest> = std::iter::once(agent_header)
                    .chain(all.chunks(UPLOAD_CHUNK).map(|c| data(c.to_vec())))
                    .collect();
                live.agent.fs().write_file(futures::stream::iter(chunks)).await?
            }
            None => {
                // Forward until the client's stream ends; on a client error
                // (or at shutdown) stop forwarding, so the agent sees a short
                // upload.
                let (tx, rx) = mpsc::channel::<agent::WriteFileRequest>(8);
                tx.send(agent_header).await.map_err(|_| Error::Closed("upload channel closed"))?;
                self.forward(inbound, tx, move |message: api::WriteFileRequest| match message.request {
                    Some(api::write_file_request::Request::Data(chunk)) => Some(data(chunk)),
                    _ => None,
                });
                live.agent.fs().write_file(ReceiverStream::new(rx)).await?
            }
        };
        Ok(resp.into_inner().bytes_written)
    }

    pub async fn list_files(
        &self,
        tenant: &Tenant,
        req: api::ListFilesRequest,
    ) -> Result<Vec<api::FileInfo>, Error> {
        let live = self.live(tenant, &req.sandbox_id).await?;
        let resp = live
            .agent
            .fs()
            .list_dir(agent::ListDirRequest { path: req.path, depth: req.depth })
            .await?
            .into_inner();
        Ok(resp.entries.into_iter().map(file_info).collect())
    }

    /// What is at the path (the link itself with `no_follow`).
    pub async fn stat_file(
        &self,
        tenant: &Tenant,
        req: api::StatFileRequest,
    ) -> Result<Option<api::FileInfo>, Error> {
        let live = self.live(tenant, &req.sandbox_id).await?;
        let stat = agent::StatRequest { path: req.path };
        let mut fs = live.agent.fs();
        let resp = if req.no_follow { fs.lstat(stat).await? } else { fs.stat(stat).await? }.into_inner();
        Ok(resp.info.map(file_info))
    }

    pub async fn make_dir(&self, tenant: &Tenant, req: api::MakeDirRequest) -> Result<(), Error> {
        let live = self.live(tenant, &req.sandbox_id).await?;
        live.agent.fs().make_dir(agent::MakeDirRequest { path: req.path, parents: req.parents }).await?;
        Ok(())
    }

    pub async fn remove_file(&self, tenant: &Tenant, req: api::RemoveFileRequest) -> Result<(), Error> {
        let live = self.live(tenant, &req.sandbox_id).await?;
        live.agent.fs().remove(agent::RemoveRequest { path: req.path, recursive: req.recursive }).await?;
        Ok(())
    }

    pub async fn rename_file(&self, tenant: &Tenant, req: api::RenameFileRequest) -> Result<(), Error> {
        let live = self.live(tenant, &req.sandbox_id).await?;
        live.agent.fs().rename(agent::RenameRequest { from: req.from, to: req.to }).await?;
        Ok(())
    }

    /// `started`, then one message per file event, until the caller leaves.
    pub async fn watch_files(
        &self,
        tenant: &Tenant,
        req: api::WatchFilesRequest,
    ) -> Result<WatchStream, Error> {
        let live = self.live(tenant, &req.sandbox_id).await?;
        let stream = live
            .agent
            .watch()
            .watch(agent::WatchRequest {
                path: req.path,
                recursive: req.recursive,
                ignore: req.ignore,
                ..Default::default()
            })
            .await?
            .into_inner();
        let mapped = stream.flat_map(|item| {
            let out: Vec<Result<api::WatchFilesResponse, Error>> = match item {
                Err(status) => vec![Err(status.into())],
                Ok(resp) => watch_messages(resp).into_iter().map(Ok).collect(),
            };
            futures::stream::iter(out)
        });
        Ok(Box::pin(mapped))
    }
}

/// The public messages of one agent watch message.
fn watch_messages(resp: agent::WatchResponse) -> Vec<api::WatchFilesResponse> {
    match resp.kind {
        Some(agent::watch_response::Kind::Started(_)) => vec![api::WatchFilesResponse {
            kind: Some(api::watch_files_response::Kind::Started(api::WatchStarted {})),
        }],
        Some(agent::watch_response::Kind::Events(batch)) => batch
            .events
            .into_iter()
            .map(|e| api::WatchFilesResponse {
                kind: Some(api::watch_files_response::Kind::Event(api::FileEvent {
                    r#type: e.r#type,
                    path: e.path,
                    timestamp_ms: e.timestamp_ms,
                    from_path: e.from_path,
                    is_dir: e.is_dir,
                })),
            })
            .collect(),
        None => Vec::new(),
    }
}

fn file_info(i: agent::FileInfo) -> api::FileInfo {
    api::FileInfo {
        path: i.path,
        name: i.name,
        r#type: i.r#type,
        size: i.size,
        mode: i.mode,
        mtime_ms: i.mtime_ms,
        symlink_target: i.symlink_target,
    }
}
