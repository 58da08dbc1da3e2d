//! `sandhold node`: this host's providers served to the control plane as
//! `sandhold.node.v1.NodeService` over mutual TLS, registered through the
//! public API (`NodeRegistry`, with the join token) and kept alive with
//! heartbeats. A restarted node finds its sandboxes again through its
//! providers (`resume` reads the data dir and the engine's labels): the
//! control plane keeps calling it with the ids it was given.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use futures::Stream;
use shared::proto::node::v1 as wire;
use shared::proto::node::v1::node_service_server::{NodeService, NodeServiceServer};
use shared::proto::v1::node_registry_client::NodeRegistryClient;
use shared::proto::v1::{HeartbeatRequest, NodeCapacity, RegisterNodeRequest};
use shared::secret::Secret;
use shared::transport::{Address, BearerToken, authed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use super::NodeTls;
use super::convert;
use crate::provider::{Provider, SandboxSpec, Snapshot};

/// How `sandhold node` runs.
pub struct NodeOptions {
    pub name: String,
    pub listen: SocketAddr,
    /// Where the control plane dials this node (`https://HOST:PORT`).
    pub advertise: String,
    /// The control plane's public API (`http(s)://HOST:PORT`).
    pub server: String,
    pub labels: BTreeMap<String, String>,
    /// This node's certificate and key, and the CA a control plane's must
    /// come from (also trusted for an `https` `server`).
    pub tls: NodeTls,
    pub join_token: Secret,
    pub sandbox_slots: u32,
}

/// Bytes read from an agent socket per frame.
const FRAME_BYTES: usize = 64 * 1024;
/// Pause between registration attempts while the control plane is unreachable.
const RETRY: Duration = Duration::from_secs(1);

/// Serve until `shutdown`; fails at once on what retrying cannot fix (the
/// control plane refused the node: its join token, its certificate, a name
/// the operator removed).
pub async fn run(
    options: NodeOptions,
    providers: Vec<Arc<dyn Provider>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut labels = auto_labels(&providers).await;
    labels.extend(options.labels.clone());
    let service = NodeServer::new(&options.name, providers);
    let server_tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&options.tls.cert, options.tls.key.expose().as_bytes()))
        .client_ca_root(Certificate::from_pem(&options.tls.ca));
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("listening on {}", options.listen))?;
    let serving = tonic::transport::Server::builder()
        .tls_config(server_tls)
        .context("the node's TLS certificate")?
        .http2_keepalive_interval(Some(Duration::from_secs(5)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .initial_stream_window_size(Some(1 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .max_concurrent_streams(Some(10_000))
        .add_service(NodeServiceServer::new(service.clone()))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown.clone().cancelled_owned(),
        );
    info!(node = %options.name, listen = %options.listen, advertise = %options.advertise, ?labels, "sandhold node serving");
    let keep = keep_registered(&options, labels, service, shutdown.clone());
    tokio::select! {
        served = serving => served.context("serving NodeService"),
        kept = keep => {
            shutdown.cancel();
            kept
        }
    }
}

/// `docker=true` with a Docker provider, `runtime=gvisor` when its engine
/// has runsc.
async fn auto_labels(providers: &[Arc<dyn Provider>]) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for p in providers {
        if p.kind().as_str() == crate::provider::Kind::name(&crate::provider::docker::KIND) {
            labels.insert("docker".to_string(), "true".to_string());
            let mut spec = SandboxSpec::default();
            spec.docker.runtime = Some(crate::config::Runtime::Gvisor);
            if p.supports(&spec).await.is_ok() {
                labels.insert("runtime".to_string(), "gvisor".to_string());
            }
        }
    }
    labels
}

/// Register, then heartbeat; register again when the control plane forgot
/// this node. Returns only with an error retrying cannot fix, or `Ok` at
/// shutdown.
async fn keep_registered(
    options: &NodeOptions,
    labels: BTreeMap<String, String>,
    service: NodeServer,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let bearer =
        BearerToken::new(options.join_token.expose()).map_err(|e| anyhow::anyhow!("join token: {e}"))?;
    let mut endpoint = Endpoint::from_shared(options.server.clone()).context("--server")?;
    if options.server.starts_with("https://") {
        endpoint = endpoint
            .tls_config(
                ClientTlsConfig::new()
                    .with_native_roots()
                    .ca_certificate(Certificate::from_pem(&options.tls.ca)),
            )
            .context("--server TLS")?;
    }
    let channel: Channel = endpoint.connect_timeout(Duration::from_secs(5)).connect_lazy();
    let mut registry = NodeRegistryClient::new(authed(channel, bearer));
    let register = RegisterNodeRequest {
        name: options.name.clone(),
        address: options.advertise.clone(),
        capacity: Some(NodeCapacity {
            memory_bytes: meminfo("MemTotal:").unwrap_or_default(),
            cpus: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
            sandbox_slots: options.sandbox_slots,
        }),
        labels: labels.into_iter().collect(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let mut registered: Option<Duration> = None;
    loop {
        let pause = match registered {
            None => match registry.register_node(register.clone()).await {
                Ok(r) => {
                    let every = Duration::from_millis(r.into_inner().heartbeat_interval_ms.max(100));
                    info!(server = %options.server, "registered with the control plane");
                    registered = Some(every);
                    every
                }
                Err(status) if refused(&status) => {
                    anyhow::bail!(
                        "the control plane at {} refused this node: {}",
                        options.server,
                        status.message()
                    )
                }
                Err(status) => {
                    warn!(server = %options.server, error = %status.message(), "registering failed; retrying");
                    RETRY
                }
            },
            Some(every) => {
                let beat = HeartbeatRequest {
                    name: options.name.clone(),
                    free_memory_bytes: meminfo("MemAvailable:").unwrap_or_default(),
                    sandboxes: service.count().await,
                };
                match registry.heartbeat(beat).await {
                    Ok(_) => {}
                    Err(status) if status.code() == tonic::Code::NotFound => registered = None,
                    Err(status) if refused(&status) => {
                        anyhow::bail!(
                            "the control plane at {} refused this node: {}",
                            options.server,
                            status.message()
                        )
                    }
                    Err(status) => warn!(error = %status.message(), "heartbeat failed"),
                }
                every
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// A refusal waiting does not cure.
fn refused(status: &Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::FailedPrecondition
            | tonic::Code::InvalidArgument
    )
}

/// A `/proc/meminfo` field in bytes.
fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// The node's NodeService over its providers. Cheap to clone.
#[derive(Clone)]
struct NodeServer {
    name: String,
    providers: Arc<HashMap<String, Arc<dyn Provider>>>,
    /// Where each sandbox's agent listens, as its provider last said.
    sockets: Arc<Mutex<HashMap<(String, String), Address>>>,
}

impl NodeServer {
    fn new(name: &str, providers: Vec<Arc<dyn Provider>>) -> Self {
        Self {
            name: name.to_string(),
            providers: Arc::new(providers.into_iter().map(|p| (p.kind().as_str().to_string(), p)).collect()),
            sockets: Arc::default(),
        }
    }

    fn provider(&self, name: &str) -> Result<&Arc<dyn Provider>, Status> {
        self.providers.get(name).ok_or_else(|| {
            Status::failed_precondition(format!("node {} offers no {name:?} provider", self.name))
        })
    }

    /// Sandboxes the providers hold now.
    async fn count(&self) -> u32 {
        let mut n = 0;
        for p in self.providers.values() {
            if let Ok(listed) = p.list(&BTreeMap::new()).await {
                n += listed.iter().filter(|l| l.own).count() as u32;
            }
        }
        n
    }

    /// Remember where the agent of a sandbox `provider` handed out listens.
    fn reply(&self, provider: &str, s: crate::provider::Sandbox) -> wire::Sandbox {
        self.sockets
            .lock()
            .expect("sockets poisoned")
            .insert((provider.to_string(), s.provider_id.clone()), s.address.clone());
        wire::Sandbox {
            sandbox_id: s.provider_id,
            agent_token: s.token.expose().to_string(),
            workspace: s.workspace.display().to_string(),
            runtime: s.runtime,
        }
    }

    /// Where the agent of `sandbox` listens: as last handed out, else as
    /// its provider finds it (after a restart of this node).
    async fn socket(&self, r: &wire::SandboxRef) -> Result<Address, Status> {
        let key = (r.provider.clone(), r.sandbox_id.clone());
        if let Some(address) = self.sockets.lock().expect("sockets poisoned").get(&key) {
            return Ok(address.clone());
        }
        let provider = self.provider(&r.provider)?;
        match provider.resume(&r.sandbox_id).await.map_err(status)? {
            Some(s) => {
                let address = s.address.clone();
                self.reply(&r.provider, s);
                Ok(address)
            }
            None => Err(Status::not_found(format!("no sandbox {} on node {}", r.sandbox_id, self.name))),
        }
    }

    fn forget(&self, provider: &str, id: &str) {
        self.sockets.lock().expect("sockets poisoned").remove(&(provider.to_string(), id.to_string()));
    }
}

fn status(e: crate::provider::Error) -> Status {
    shared::error::Error::from(e).into()
}

fn spec(spec: Option<wire::SandboxSpec>) -> Result<SandboxSpec, Status> {
    convert::spec_from_wire(spec.unwrap_or_default()).map_err(status)
}

type AgentBytes = Pin<Box<dyn Stream<Item = Result<wire::ConnectAgentResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl NodeService for NodeServer {
    async fn capabilities(
        &self,
        _request: Request<wire::CapabilitiesRequest>,
    ) -> Result<Response<wire::CapabilitiesResponse>, Status> {
        let mut providers: Vec<_> = self
            .providers
            .values()
            .map(|p| convert::capabilities_to_wire(p.kind(), p.capabilities()))
            .collect();
        providers.sort_by(|a, b| a.provider.cmp(&b.provider));
        Ok(Response::new(wire::CapabilitiesResponse {
            name: self.name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            providers,
        }))
    }

    async fn supports(
        &self,
        request: Request<wire::SupportsRequest>,
    ) -> Result<Response<wire::SupportsResponse>, Status> {
        let r = request.into_inner();
        self.provider(&r.provider)?.supports(&spec(r.spec)?).await.map_err(status)?;
        Ok(Response::new(wire::SupportsResponse {}))
    }

    async fn create(
        &self,
        request: Request<wire::CreateRequest>,
    ) -> Result<Response<wire::SandboxReply>, Status> {
        let r = request.into_inner();
        let sandbox = self.provider(&r.provider)?.create(&spec(r.spec)?).await.map_err(status)?;
        Ok(Response::new(wire::SandboxReply { sandbox: Some(self.reply(&r.provider, sandbox)) }))
    }

    async fn resume(
        &self,
        request: Request<wire::SandboxRef>,
    ) -> Result<Response<wire::ResumeResponse>, Status> {
        let r = request.into_inner();
        let found = self.provider(&r.provider)?.resume(&r.sandbox_id).await.map_err(status)?;
        Ok(Response::new(match found {
            Some(s) => wire::ResumeResponse { found: true, sandbox: Some(self.reply(&r.provider, s)) },
            None => {
                self.forget(&r.provider, &r.sandbox_id);
                wire::ResumeResponse { found: false, sandbox: None }
            }
        }))
    }

    async fn destroy(&self, request: Request<wire::SandboxRef>) -> Result<Response<wire::Empty>, Status> {
        let r = request.into_inner();
        self.provider(&r.provider)?.destroy(&r.sandbox_id).await.map_err(status)?;
        self.forget(&r.provider, &r.sandbox_id);
        Ok(Response::new(wire::Empty {}))
    }

    async fn stop(&self, request: Request<wire::SandboxRef>) -> Result<Response<wire::Empty>, Status> {
        let r = request.into_inner();
        self.provider(&r.provider)?.stop(&r.sandbox_id).await.map_err(status)?;
        self.forget(&r.provider, &r.sandbox_id);
        Ok(Response::new(wire::Empty {}))
    }

    async fn list(
        &self,
        request: Request<wire::ListRequest>,
    ) -> Result<Response<wire::ListResponse>, Status> {
        let r = request.into_inner();
        let labels = r.labels.into_iter().collect();
        let listed = self.provider(&r.provider)?.list(&labels).await.map_err(status)?;
        Ok(Response::new(wire::ListResponse {
            sandboxes: listed.into_iter().map(convert::listed_to_wire).collect(),
        }))
    }

    async fn usage(
        &self,
        request: Request<wire::SandboxRef>,
    ) -> Result<Response<wire::UsageResponse>, Status> {
        let r = request.into_inner();
        let used = self.provider(&r.provider)?.usage(&r.sandbox_id).await.map_err(status)?;
        Ok(Response::new(convert::usage_to_wire(used)))
    }

    async fn snapshot(
        &self,
        request: Request<wire::SandboxRef>,
    ) -> Result<Response<wire::SnapshotReply>, Status> {
        let r = request.into_inner();
        let snap = self.provider(&r.provider)?.snapshot(&r.sandbox_id).await.map_err(status)?;
        Ok(Response::new(wire::SnapshotReply { snapshot_id: snap.id }))
    }

    async fn restore(
        &self,
        request: Request<wire::RestoreRequest>,
    ) -> Result<Response<wire::SandboxReply>, Status> {
        let r = request.into_inner();
        let snap = Snapshot { id: r.snapshot_id };
        let sandbox = self.provider(&r.provider)?.restore(&snap, &spec(r.spec)?).await.map_err(status)?;
        Ok(Response::new(wire::SandboxReply { sandbox: Some(self.reply(&r.provider, sandbox)) }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<wire::SnapshotRef>,
    ) -> Result<Response<wire::Empty>, Status> {
        let r = request.into_inner();
        self.provider(&r.provider)?.delete_snapshot(&Snapshot { id: r.snapshot_id }).await.map_err(status)?;
        Ok(Response::new(wire::Empty {}))
    }

    async fn fork(
        &self,
        request: Request<wire::ForkRequest>,
    ) -> Result<Response<wire::SandboxReply>, Status> {
        let r = request.into_inner();
        let sandbox =
            self.provider(&r.provider)?.fork(&r.source_sandbox_id, &spec(r.spec)?).await.map_err(status)?;
        Ok(Response::new(wire::SandboxReply { sandbox: Some(self.reply(&r.provider, sandbox)) }))
    }

    async fn changed_paths(
        &self,
        request: Request<wire::SandboxRef>,
    ) -> Result<Response<wire::ChangedPathsResponse>, Status> {
        let r = request.into_inner();
        let paths = self.provider(&r.provider)?.changed_paths(&r.sandbox_id).await.map_err(status)?;
        Ok(Response::new(wire::ChangedPathsResponse {
            known: paths.is_some(),
            paths: paths.unwrap_or_default(),
        }))
    }

    type ConnectAgentStream = AgentBytes;

    async fn connect_agent(
        &self,
        request: Request<Streaming<wire::ConnectAgentRequest>>,
    ) -> Result<Response<Self::ConnectAgentStream>, Status> {
        use wire::connect_agent_request::Frame;
        let mut inbound = request.into_inner();
        let open = match inbound.message().await? {
            Some(wire::ConnectAgentRequest { frame: Some(Frame::Open(open)) }) => open,
            _ => return Err(Status::invalid_argument("ConnectAgent starts with `open`")),
        };
        let address = self.socket(&open).await?;
        let stream: Box<dyn AgentSocket> = match &address {
            Address::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await.map_err(|e| {
                self.forget(&open.provider, &open.sandbox_id);
                Status::unavailable(format!("sandbox {} agent at {}: {e}", open.sandbox_id, path.display()))
            })?),
            Address::Tcp(addr) if addr.ip().is_loopback() => {
                Box::new(tokio::net::TcpStream::connect(addr).await.map_err(|e| {
                    self.forget(&open.provider, &open.sandbox_id);
                    Status::unavailable(format!("sandbox {} agent at {addr}: {e}", open.sandbox_id))
                })?)
            }
            other => {
                return Err(Status::failed_precondition(format!(
                    "agent address {other} is not reachable here"
                )));
            }
        };
        let (mut reading, mut writing) = tokio::io::split(stream);
        tokio::spawn(async move {
            while let Ok(Some(frame)) = inbound.message().await {
                if let Some(Frame::Data(bytes)) = frame.frame
                    && writing.write_all(&bytes).await.is_err()
                {
                    return;
                }
            }
            let _ = writing.shutdown().await;
        });
        let (out, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut buf = vec![0u8; FRAME_BYTES];
            loop {
                match reading.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let frame = wire::ConnectAgentResponse { data: buf[..n].to_vec() };
                        if out.send(Ok(frame)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A connection to an agent: its Unix socket, or loopback TCP.
trait AgentSocket: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> AgentSocket for T {}
