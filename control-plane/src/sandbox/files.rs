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
use crate::provision::InvalidField;
use crate::store::Tenant;

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
    /// bytes written. Streamed through as it comes (the server holds a few
    /// messages, never the file): with a declared size the agent refuses
    /// an upload cut off before it; without one the agent commits only on
    /// the end message sent once the client's stream ended cleanly, so a
    /// client that broke off with an error commits nothing.
    pub async fn write_file<S>(&self, tenant: &Tenant, mut inbound: S) -> Result<u64, Error>
    where
        S: Stream<Item = Result<api::WriteFileRequest, Status>> + Send + Unpin + 'static,
    {
        let Some(api::write_file_request::Request::Header(header)) =
            inbound.next().await.transpose()?.and_then(|m| m.request)
        else {
            return Err(InvalidField::new("header", "the first message must be the header").into());
        };
        let live = self.live(tenant, &header.sandbox_id).await?;
        let agent_header = agent::WriteFileRequest {
            request: Some(agent::write_file_request::Request::Header(agent::WriteFileHeader {
                path: header.path,
                mode: header.mode,
                make_parents: header.make_parents,
                size: header.size,
                end_required: header.size.is_none(),
            })),
        };
        // Forward until the client's stream ends (then the end message);
        // on a client error (or at shutdown) stop forwarding, so the agent
        // sees a short upload, or one without its end, and commits nothing.
        let (tx, rx) = mpsc::channel::<agent::WriteFileRequest>(8);
        tx.send(agent_header).await.map_err(|_| Error::Closed("upload channel closed"))?;
        let then_end = inbound.map(|m| m.map(Some)).chain(futures::stream::once(async { Ok(None) }));
        self.forward(Box::pin(then_end), tx, move |message: Option<api::WriteFileRequest>| {
            use agent::write_file_request::Request;
            match message.map(|m| m.request) {
                Some(Some(api::write_file_request::Request::Data(chunk))) => {
                    Some(agent::WriteFileRequest { request: Some(Request::Data(chunk)) })
                }
                Some(_) => None,
                None => Some(agent::WriteFileRequest { request: Some(Request::End(agent::WriteFileEnd {})) }),
            }
        });
        let resp = live.agent.fs().write_file(ReceiverStream::new(rx)).await?;
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
