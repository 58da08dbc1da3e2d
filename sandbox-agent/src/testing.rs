//! In-process gRPC for unit tests: a service built from an [`AgentContext`]
//! served over `tokio::io::duplex`, through the real tonic stack (as tonic's
//! `examples/src/mock/mock.rs`), with no socket and no server.

use std::path::Path;

use hyper_util::rt::TokioIo;
use shared::secret::Secret;
use shared::transport::Address;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::context::AgentContext;
use crate::options::AgentOptions;

/// A context over `<dir>/root` and `<dir>/journal` (both created).
pub fn context(dir: &Path) -> AgentContext {
    let options = AgentOptions {
        listen: Address::Unix(dir.join("unused.sock")),
        root: dir.join("root"),
        token: Secret::new("unused"),
        journal_dir: dir.join("journal"),
        run_user: None,
        unconfined: false,
    };
    AgentContext::new(&options).expect("building the context")
}

/// A channel to `router`, served in-process until the channel is dropped.
pub async fn channel(router: tonic::transport::server::Router) -> Channel {
    let (client, server) = tokio::io::duplex(64 * 1024);
    tokio::spawn(router.serve_with_incoming(tokio_stream::once(Ok::<_, std::io::Error>(server))));
    let mut client = Some(client);
    Endpoint::from_static("http://in-process.test")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let client = client.take();
            async move { client.map(TokioIo::new).ok_or_else(|| std::io::Error::other("client already taken")) }
        }))
        .await
        .expect("connecting in-process")
}
