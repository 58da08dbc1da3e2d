//! `sandhold.v1.SandboxService`: definitions, ensure, and a live sandbox's
//! processes and files proxied to its agent. Every call is scoped to the
//! caller's tenant; another tenant's definition or sandbox is NOT_FOUND.

use std::collections::HashMap;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use shared::error::Error;
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use shared::proto::v1::sandbox_service_server::SandboxService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::tenant_of;
use crate::context::Context;
use crate::provision::{Progress, valid_env_name};
use crate::sandbox::definition;
use crate::sandbox::ensure::{ensure_input, required, secrets_of};
use crate::sandbox::lifecycle::Live;
use crate::store::Tenant;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A `WriteFile` without a declared size is buffered up to this many bytes.
const MAX_BUFFERED_UPLOAD: usize = 64 << 20;

/// Built from the context: the stores, the leases and the lifecycle.
#[derive(Clone)]
pub struct SandboxApi {
    cx: Context,
}

impl SandboxApi {
    pub fn new(cx: Context) -> Self {
        Self { cx }
    }

    async fn live(&self, tenant: &Tenant, sandbox_id: &str) -> Result<Live, Status> {
        Ok(self.cx.lifecycle.agent(&self.cx.stores, tenant, sandbox_id).await?)
    }
}

/// The environment of a process: the ensure's secrets, then the call's
/// plain env, then the call's secrets.
fn process_env(
    live: &Live,
    env: HashMap<String, String>,
    secrets: HashMap<String, String>,
) -> Result<HashMap<String, String>, Error> {
    let mut out: HashMap<String, String> =
        live.secrets.iter().map(|(k, v)| (k.clone(), v.expose().to_string())).collect();
    for (k, v) in env {
        if !valid_env_name(&k) {
            return Err(Error::invalid_field(format!("env[{k}]"), "not a valid variable name"));
        }
        out.insert(k, v);
    }
    for (k, v) in secrets_of("secrets", secrets)? {
        out.insert(k, v.expose().to_string());
    }
    Ok(out)
}

fn agent_command(command: Option<api::Command>) -> Result<agent::Command, Error> {
    let kind = match command.and_then(|c| c.kind) {
        Some(api::command::Kind::Argv(a)) if !a.args.is_empty() => {
            agent::command::Kind::Argv(agent::Argv { args: a.args })
        }
        Some(api::command::Kind::Shell(s)) if !s.is_empty() => agent::command::Kind::Shell(s),
        _ => return Err(Error::invalid_field("command", "required: a non-empty argv or shell string")),
    };
    Ok(agent::Command { kind: Some(kind) })
}

fn exit_status(s: Option<agent::ExitStatus>) -> Option<api::ExitStatus> {
    let status = s?.status.map(|s| match s {
        agent::exit_status::Status::Code(c) => api::exit_status::Status::Code(c),
        agent::exit_status::Status::Signal(n) => api::exit_status::Status::Signal(n),
    });
    Some(api::ExitStatus { status })
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

#[tonic::async_trait]
impl SandboxService for SandboxApi {
    async fn put_definition(
        &self,
        request: Request<api::PutDefinitionRequest>,
    ) -> Result<Response<api::PutDefinitionResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let definition =
            request.into_inner().definition.ok_or_else(|| Error::invalid_field("definition", "required"))?;
        definition::validate(&definition)?;
        self.cx.stores.definitions.put(&tenant, &definition.id, definition::to_stored(&definition)).await?;
        Ok(Response::new(api::PutDefinitionResponse { definition: Some(definition) }))
    }

    async fn get_definition(
        &self,
        request: Request<api::GetDefinitionRequest>,
    ) -> Result<Response<api::GetDefinitionResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let id = request.into_inner().id;
        let stored = self.cx.stores.definitions.get(&tenant, required("id", &id)?).await?;
        Ok(Response::new(api::GetDefinitionResponse {
            definition: Some(definition::from_stored(&stored.body)?),
        }))
    }

    async fn list_definitions(
        &self,
        request: Request<api::ListDefinitionsRequest>,
    ) -> Result<Response<api::ListDefinitionsResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let stored = self.cx.stores.definitions.list(&tenant).await?;
        let definitions =
            stored.iter().map(|d| definition::from_stored(&d.body)).collect::<Result<_, _>>()?;
        Ok(Response::new(api::ListDefinitionsResponse { definitions }))
    }

    async fn delete_definition(
        &self,
        request: Request<api::DeleteDefinitionRequest>,
    ) -> Result<Response<api::DeleteDefinitionResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let id = request.into_inner().id;
        if !self.cx.stores.definitions.delete(&tenant, required("id", &id)?).await? {
            return Err(Error::not_found(format!("definition {id} not found")).into());
        }
        Ok(Response::new(api::DeleteDefinitionResponse {}))
    }

    type EnsureSandboxStream = BoxStream<api::EnsureSandboxResponse>;

    async fn ensure_sandbox(
        &self,
        request: Request<api::EnsureSandboxRequest>,
    ) -> Result<Response<Self::EnsureSandboxStream>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let input =
            ensure_input(&self.cx.stores, tenant, &req.definition_id, req.thread_id, req.run_id, req.secrets)
                .await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let progress = Progress::new(tx.clone());
        let (stores, leases) = (self.cx.stores.clone(), self.cx.leases.clone());
        let lifecycle = self.cx.lifecycle.clone();
        // Detached from the call: a client that leaves mid-ensure must not
        // leave a half-made sandbox behind.
        tokio::spawn(async move {
            let last = match lifecycle.ensure(&stores, &leases, input, &progress).await {
                Ok(ready) => Ok(api::EnsureSandboxResponse {
                    event: Some(api::ensure_sandbox_response::Event::Ready(ready)),
                }),
                Err(e) => Err(e),
            };
            let _ = tx.send(last);
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx).map(|item| item.map_err(Status::from)))))
    }

    async fn get_sandbox(
        &self,
        request: Request<api::GetSandboxRequest>,
    ) -> Result<Response<api::GetSandboxResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let id = request.into_inner().sandbox_id;
        let instance =
            self.cx.lifecycle.instance(&self.cx.stores, &tenant, required("sandbox_id", &id)?).await?;
        Ok(Response::new(api::GetSandboxResponse { sandbox: Some(self.cx.lifecycle.describe(&instance)) }))
    }

    async fn list_sandboxes(
        &self,
        request: Request<api::ListSandboxesRequest>,
    ) -> Result<Response<api::ListSandboxesResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let thread = request.into_inner().thread_id;
        let instances = self.cx.stores.instances.list(Some(&tenant)).await?;
        let sandboxes = instances
            .iter()
            .map(|i| self.cx.lifecycle.describe(i))
            .filter(|s| thread.is_empty() || s.thread_id == thread)
            .collect();
        Ok(Response::new(api::ListSandboxesResponse { sandboxes }))
    }

    async fn destroy_sandbox(
        &self,
        request: Request<api::DestroySandboxRequest>,
    ) -> Result<Response<api::DestroySandboxResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let id = request.into_inner().sandbox_id;
        self.cx
            .lifecycle
            .destroy(&self.cx.stores, &self.cx.leases, &tenant, required("sandbox_id", &id)?)
            .await?;
        Ok(Response::new(api::DestroySandboxResponse {}))
    }

    async fn exec(&self, request: Request<api::ExecRequest>) -> Result<Response<api::ExecResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let live = self.live(&tenant, &req.sandbox_id).await?;
        let command = agent_command(req.command)?;
        let env = process_env(&live, req.env, req.secrets)?;
        let resp = live
            .agent
            .process()
            .exec(agent::ExecRequest {
                command: Some(command),
                cwd: req.cwd,
                env,
                stdin: req.stdin,
                timeout_ms: req.timeout_ms,
                output_limit_bytes: req.output_limit_bytes,
            })
            .await?
            .into_inner();
        Ok(Response::new(api::ExecResponse {
            status: exit_status(resp.status),
            stdout: resp.stdout,
            stderr: resp.stderr,
            stdout_truncated: resp.stdout_truncated,
            stderr_truncated: resp.stderr_truncated,
            timed_out: resp.timed_out,
            duration_ms: resp.duration_ms,
        }))
    }

    type ExecStreamStream = BoxStream<api::ExecStreamResponse>;

    async fn exec_stream(
        &self,
        request: Request<Streaming<api::ExecStreamRequest>>,
    ) -> Result<Response<Self::ExecStreamStream>, Status> {
        let tenant = tenant_of(&request)?;
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.and_then(|m| m.request);
        let Some(api::exec_stream_request::Request::Start(start)) = first else {
            return Err(Error::invalid_field("start", "the first message must be `start`").into());
        };
        let live = self.live(&tenant, &start.sandbox_id).await?;
        let command = agent_command(start.command)?;
        let env = process_env(&live, start.env, start.secrets)?;
        let (tx, rx) = mpsc::channel::<agent::SpawnRequest>(16);
        let start = agent::SpawnRequest {
            request: Some(agent::spawn_request::Request::Start(agent::SpawnStart {
                command: Some(command),
                cwd: start.cwd,
                env,
                detached: false,
            })),
        };
        tx.send(start).await.map_err(|_| Error::internal("exec stream closed before start"))?;
        // Held by the response stream: a client that half-closes its side
        // after `start` must not end the agent's request stream (and with it
        // the process) while output is still flowing.
        let hold_open = tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let request = match message.request {
                    Some(api::exec_stream_request::Request::Stdin(data)) => {
                        agent::spawn_request::Request::Stdin(data)
                    }
                    Some(api::exec_stream_request::Request::CloseStdin(_)) => {
                        agent::spawn_request::Request::CloseStdin(agent::CloseStdin {})
                    }
                    Some(api::exec_stream_request::Request::Signal(n)) => {
                        agent::spawn_request::Request::Signal(n)
                    }
                    Some(api::exec_stream_request::Request::Start(_)) | None => continue,
                };
                if tx.send(agent::SpawnRequest { request: Some(request) }).await.is_err() {
                    break;
                }
            }
        });
        let outbound = live.agent.process().spawn(ReceiverStream::new(rx)).await?.into_inner();
        let mapped = outbound.map(move |item| {
            let _ = &hold_open;
            let event = item?.event.map(|e| match e {
                agent::spawn_response::Event::Started(s) => {
                    api::exec_stream_response::Event::StartedPid(s.pid)
                }
                agent::spawn_response::Event::Output(o) => {
                    api::exec_stream_response::Event::Output(api::OutputChunk {
                        stream: o.stream,
                        data: o.data,
                    })
                }
                agent::spawn_response::Event::Exited(x) => {
                    api::exec_stream_response::Event::Exited(exit_status(Some(x)).unwrap_or_default())
                }
            });
            Ok(api::ExecStreamResponse { event })
        });
        Ok(Response::new(Box::pin(mapped)))
    }

    type ReadFileStream = BoxStream<api::ReadFileResponse>;

    async fn read_file(
        &self,
        request: Request<api::ReadFileRequest>,
    ) -> Result<Response<Self::ReadFileStream>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let live = self.live(&tenant, &req.sandbox_id).await?;
        let stream = live
            .agent
            .fs()
            .read_file(agent::ReadFileRequest { path: req.path, offset: req.offset, limit: req.limit })
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(stream.map(|r| r.map(|c| api::ReadFileResponse { data: c.data })))))
    }

    async fn write_file(
        &self,
        request: Request<Streaming<api::WriteFileRequest>>,
    ) -> Result<Response<api::WriteFileResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let mut inbound = request.into_inner();
        let Some(api::write_file_request::Request::Header(header)) =
            inbound.message().await?.and_then(|m| m.request)
        else {
            return Err(Error::invalid_field("header", "the first message must be the header").into());
        };
        let live = self.live(&tenant, &header.sandbox_id).await?;
        // The agent always gets the exact size, so an upload cut off on the
        // way is refused there rather than committed short.
        let (size, buffered) = match header.size {
            Some(size) => (size, None),
            None => {
                let mut data = Vec::new();
                while let Some(message) = inbound.message().await? {
                    if let Some(api::write_file_request::Request::Data(chunk)) = message.request {
                        data.extend_from_slice(&chunk);
                        if data.len() > MAX_BUFFERED_UPLOAD {
                            return Err(Error::invalid_field(
                                "header.size",
                                format!("required for uploads over {MAX_BUFFERED_UPLOAD} bytes"),
                            )
                            .into());
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
                    .chain(all.chunks(256 << 10).map(|c| data(c.to_vec())))
                    .collect();
                live.agent.fs().write_file(futures::stream::iter(chunks)).await?
            }
            None => {
                // Forward until the client's stream ends; on a client error
                // stop forwarding, so the agent sees a short upload.
                let (tx, rx) = mpsc::channel::<agent::WriteFileRequest>(8);
                tx.send(agent_header).await.map_err(|_| Error::internal("upload channel closed"))?;
                tokio::spawn(async move {
                    while let Ok(Some(m)) = inbound.message().await {
                        if let Some(api::write_file_request::Request::Data(chunk)) = m.request
                            && tx.send(data(chunk)).await.is_err()
                        {
                            break;
                        }
                    }
                });
                live.agent.fs().write_file(ReceiverStream::new(rx)).await?
            }
        };
        Ok(Response::new(api::WriteFileResponse { bytes_written: resp.into_inner().bytes_written }))
    }

    async fn list_files(
        &self,
        request: Request<api::ListFilesRequest>,
    ) -> Result<Response<api::ListFilesResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let live = self.live(&tenant, &req.sandbox_id).await?;
        let resp = live
            .agent
            .fs()
            .list_dir(agent::ListDirRequest { path: req.path, depth: req.depth })
            .await?
            .into_inner();
        Ok(Response::new(api::ListFilesResponse {
            entries: resp.entries.into_iter().map(file_info).collect(),
        }))
    }

    async fn stat_file(
        &self,
        request: Request<api::StatFileRequest>,
    ) -> Result<Response<api::StatFileResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let live = self.live(&tenant, &req.sandbox_id).await?;
        let stat = agent::StatRequest { path: req.path };
        let mut fs = live.agent.fs();
        let resp = if req.no_follow { fs.lstat(stat).await? } else { fs.stat(stat).await? }.into_inner();
        Ok(Response::new(api::StatFileResponse { info: resp.info.map(file_info) }))
    }

    async fn make_dir(
        &self,
        request: Request<api::MakeDirRequest>,
    ) -> Result<Response<api::MakeDirResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let live = self.live(&tenant, &req.sandbox_id).await?;
        live.agent.fs().make_dir(agent::MakeDirRequest { path: req.path, parents: req.parents }).await?;
        Ok(Response::new(api::MakeDirResponse {}))
    }

    async fn remove_file(
        &self,
        request: Request<api::RemoveFileRequest>,
    ) -> Result<Response<api::RemoveFileResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let live = self.live(&tenant, &req.sandbox_id).await?;
        live.agent.fs().remove(agent::RemoveRequest { path: req.path, recursive: req.recursive }).await?;
        Ok(Response::new(api::RemoveFileResponse {}))
    }

    async fn rename_file(
        &self,
        request: Request<api::RenameFileRequest>,
    ) -> Result<Response<api::RenameFileResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let live = self.live(&tenant, &req.sandbox_id).await?;
        live.agent.fs().rename(agent::RenameRequest { from: req.from, to: req.to }).await?;
        Ok(Response::new(api::RenameFileResponse {}))
    }

    type WatchFilesStream = BoxStream<api::WatchFilesResponse>;

    async fn watch_files(
        &self,
        request: Request<api::WatchFilesRequest>,
    ) -> Result<Response<Self::WatchFilesStream>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let live = self.live(&tenant, &req.sandbox_id).await?;
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
            let out: Vec<Result<api::WatchFilesResponse, Status>> = match item {
                Err(status) => vec![Err(status)],
                Ok(resp) => match resp.kind {
                    Some(agent::watch_response::Kind::Started(_)) => vec![Ok(api::WatchFilesResponse {
                        kind: Some(api::watch_files_response::Kind::Started(api::WatchStarted {})),
                    })],
                    Some(agent::watch_response::Kind::Events(batch)) => batch
                        .events
                        .into_iter()
                        .map(|e| {
                            Ok(api::WatchFilesResponse {
                                kind: Some(api::watch_files_response::Kind::Event(api::FileEvent {
                                    r#type: e.r#type,
                                    path: e.path,
                                    timestamp_ms: e.timestamp_ms,
                                    from_path: e.from_path,
                                    is_dir: e.is_dir,
                                })),
                            })
                        })
                        .collect(),
                    None => Vec::new(),
                },
            };
            futures::stream::iter(out)
        });
        Ok(Response::new(Box::pin(mapped)))
    }
}
