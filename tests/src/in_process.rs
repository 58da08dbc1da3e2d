//! The public services in-process: a [`Context`] with real SQLite stores,
//! in-process leases and the local provider, the services built from it
//! (no `server::start`), served through the real tonic stack (auth layer
//! included, single-user) over a `tokio::io::duplex` pipe.

use std::sync::Arc;

use control_plane::api::{AdminApi, RunApi, SandboxApi, SnapshotApi};
use control_plane::auth::{AuthLayer, Authenticator};
use control_plane::config::{LeaseOptions, ReaperOptions, default_database_url};
use control_plane::context::Context;
use control_plane::lease::{self, CancelBus};
use control_plane::provider::{LocalProvider, LocalProviderOptions};
use control_plane::reaper::Reaper;
use control_plane::runs::{self, RunOptions};
use control_plane::sandbox::{Lifecycle, Providers};
use control_plane::store::Stores;
use control_plane::workspace::WorkspaceProvisioner;
use hyper_util::rt::TokioIo;
use shared::proto::v1::admin_service_client::AdminServiceClient;
use shared::proto::v1::admin_service_server::AdminServiceServer;
use shared::proto::v1::run_service_client::RunServiceClient;
use shared::proto::v1::run_service_server::RunServiceServer;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;
use shared::proto::v1::sandbox_service_server::SandboxServiceServer;
use shared::proto::v1::snapshot_service_client::SnapshotServiceClient;
use shared::proto::v1::snapshot_service_server::SnapshotServiceServer;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::{Channel, Endpoint, Server, Uri};

use tonic::service::interceptor::InterceptedService;

use crate::agent::static_agent;
use crate::auth::{Bearer, bearer};
use crate::local::TestDir;
use crate::server::{Admin, Runs, Sandboxes};

/// The token of the in-process single-user server.
const LOCAL_TOKEN: &str = "in-process-local-token";

/// The services of one context over one in-memory connection. Dropping it
/// stops the server task and kills the local sandboxes it made.
pub struct InProcess {
    pub cx: Context,
    pub channel: Channel,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    // Last: the sandboxes' processes die before the directory goes.
    _dir: TestDir,
}

impl InProcess {
    pub async fn start() -> Self {
        let dir = TestDir::new("sh-ip");
        let stores = Stores::open(&default_database_url(dir.path())).await.expect("SQLite stores");
        let leases = lease::open(None, LeaseOptions::default(), stores.backend_name(), "in-process")
            .await
            .expect("leases");
        let mut local = LocalProviderOptions::new(dir.path());
        local.agent_binary = Some(static_agent());
        let providers =
            Providers::new().with(Arc::new(LocalProvider::new(local).expect("the local provider")));
        let shutdown = CancellationToken::new();
        let cx = Context {
            replica_id: "in-process".into(),
            stores,
            leases,
            presence: None,
            lifecycle: Lifecycle::new(providers, Arc::new(WorkspaceProvisioner)),
            cancels: CancelBus::Local,
            tasks: TaskTracker::new(),
            shutdown: shutdown.clone(),
        };
        let runs = runs::Runs::new(cx.clone(), RunOptions::default());
        let reaper = Reaper::new(cx.clone(), runs.clone(), ReaperOptions::default(), true);
        let auth = Authenticator::new(true);
        auth.set_local_token(shared::secret::Secret::new(LOCAL_TOKEN));
        auth.set_token_store(cx.stores.tokens.clone());
        let router = Server::builder()
            .layer(AuthLayer::new(auth))
            .add_service(AdminServiceServer::new(AdminApi::new(cx.clone(), reaper, Vec::new(), true)))
            .add_service(SnapshotServiceServer::new(SnapshotApi::new(cx.clone())))
            .add_service(SandboxServiceServer::new(SandboxApi::new(cx.clone())))
            .add_service(RunServiceServer::new(RunApi::new(runs)));
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let stop = shutdown.clone();
        let server = tokio::spawn(async move {
            // One connection, then nothing more, never an end: tonic takes
            // the end of its incoming stream for a shutdown.
            let incoming = tokio_stream::StreamExt::chain(
                tokio_stream::once(Ok::<_, std::io::Error>(server_io)),
                tokio_stream::pending(),
            );
            let _ = router.serve_with_incoming_shutdown(incoming, stop.cancelled_owned()).await;
        });
        let mut client_io = Some(client_io);
        let channel = Endpoint::try_from("http://in-process.invalid")
            .expect("a static URI")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let io = client_io.take();
                async move { io.map(TokioIo::new).ok_or_else(|| std::io::Error::other("one connection only")) }
            }))
            .await
            .expect("connecting over the duplex pipe");
        Self { cx, channel, shutdown, server, _dir: dir }
    }

    // Clients send the single-user server's token as real ones do.
    pub fn runs(&self) -> Runs {
        shared::sized!(RunServiceClient::with_interceptor(self.channel.clone(), bearer(LOCAL_TOKEN)))
    }

    pub fn sandboxes(&self) -> Sandboxes {
        shared::sized!(SandboxServiceClient::with_interceptor(self.channel.clone(), bearer(LOCAL_TOKEN)))
    }

    pub fn snapshots(&self) -> SnapshotServiceClient<InterceptedService<Channel, Bearer>> {
        shared::sized!(SnapshotServiceClient::with_interceptor(self.channel.clone(), bearer(LOCAL_TOKEN)))
    }

    pub fn admin(&self) -> Admin {
        shared::sized!(AdminServiceClient::with_interceptor(self.channel.clone(), bearer(LOCAL_TOKEN)))
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.server.abort();
    }
}
