//! Agent connections through a node: each connection of an agent channel
//! is one `sandhold.node.v1.NodeService.ConnectAgent` stream on the node's
//! single (mutual-TLS) HTTP/2 connection, carrying the agent protocol's own
//! HTTP/2 as bytes. The agent client opens a
//! `node:NODE/PROVIDER/SANDBOX` address here; every agent RPC, Follow
//! stream, egress carrier, port and terminal then works as over a Unix
//! socket, multiplexed. Nothing on the node listens for sandboxes on TCP.
//!
//! The channels to nodes are registered by whoever dials them (the fleet's
//! remote providers), by node name: an address of a node names the node,
//! and only a provider of that node hands such an address out.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

use shared::proto::node::v1::node_service_client::NodeServiceClient;
use shared::proto::node::v1::{ConnectAgentRequest, SandboxRef, connect_agent_request::Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// The channel to each node this process dialled, by node name.
static NODES: LazyLock<RwLock<HashMap<String, Channel>>> = LazyLock::new(Default::default);

/// Bytes buffered in each direction of one agent connection.
const PIPE_BYTES: usize = 256 * 1024;
/// Largest `data` frame sent to the node.
const FRAME_BYTES: usize = 64 * 1024;

/// Agent connections to `node` go over `channel` from now on.
pub fn register(node: &str, channel: Channel) {
    NODES.write().expect("node channels poisoned").insert(node.to_string(), channel);
}

/// No new agent connection to `node` (removed by the operator).
pub fn forget(node: &str) {
    NODES.write().expect("node channels poisoned").remove(node);
}

fn channel_of(node: &str) -> Option<Channel> {
    NODES.read().expect("node channels poisoned").get(node).cloned()
}

/// A channel to the agent of `sandbox` (of `provider`) on `node`: every
/// connection it makes is a `ConnectAgent` stream.
pub async fn connect(node: &str, provider: &str, sandbox: &str) -> Result<Channel, tonic::transport::Error> {
    let (node, provider, sandbox) = (node.to_string(), provider.to_string(), sandbox.to_string());
    shared::transport::connector_endpoint()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (node, provider, sandbox) = (node.clone(), provider.clone(), sandbox.clone());
            async move { open(&node, provider, sandbox).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
}

/// One connection: a `ConnectAgent` stream, pumped to and from one end of
/// an in-memory pipe whose other end is returned.
async fn open(node: &str, provider: String, sandbox: String) -> std::io::Result<tokio::io::DuplexStream> {
    let channel = channel_of(node).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!("node {node} is not known to this control plane (not registered, or removed)"),
        )
    })?;
    let (to_node, outbound) = tokio::sync::mpsc::channel(16);
    let open = ConnectAgentRequest { frame: Some(Frame::Open(SandboxRef { provider, sandbox_id: sandbox })) };
    to_node.send(open).await.map_err(|_| std::io::Error::other("tunnel closed"))?;
    let inbound = NodeServiceClient::new(channel)
        .max_decoding_message_size(FRAME_BYTES * 4)
        .connect_agent(ReceiverStream::new(outbound))
        .await
        .map_err(|status| {
            let kind = match status.code() {
                tonic::Code::NotFound => std::io::ErrorKind::NotFound,
                _ => std::io::ErrorKind::ConnectionRefused,
            };
            std::io::Error::new(kind, format!("node {node}: ConnectAgent: {}", status.message()))
        })?;
    let mut inbound = inbound.into_inner();
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let (mut reading, mut writing) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let mut buf = vec![0u8; FRAME_BYTES];
        loop {
            match reading.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let frame = ConnectAgentRequest { frame: Some(Frame::Data(buf[..n].to_vec())) };
                    if to_node.send(frame).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping the sender ends the request stream: the node closes the
        // agent socket.
    });
    tokio::spawn(async move {
        while let Ok(Some(message)) = inbound.message().await {
            if writing.write_all(&message.data).await.is_err() {
                return;
            }
        }
        let _ = writing.shutdown().await;
    });
    Ok(ours)
}
