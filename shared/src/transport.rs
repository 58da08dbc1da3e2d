//! Addresses of the form `unix:PATH`, `tcp:HOST:PORT` or
//! `node:NODE/PROVIDER/SANDBOX`, listening on them, and gRPC clients that
//! carry a bearer token.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Where a gRPC server listens or a client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp(SocketAddr),
    /// The agent of sandbox `sandbox` of provider `provider` on the fleet's
    /// node `node`: reached through the node's `ConnectAgent` (the control
    /// plane's tunnel), never dialled directly.
    Node {
        node: String,
        provider: String,
        sandbox: String,
    },
}

impl FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: address needs a path, e.g. unix:/run/sandhold/agent.sock".into());
            }
            Ok(Self::Unix(PathBuf::from(path)))
        } else if let Some(addr) = s.strip_prefix("tcp:") {
            addr.parse().map(Self::Tcp).map_err(|e| {
                format!("tcp: address {addr:?}: {e} (expected HOST:PORT, e.g. tcp:127.0.0.1:7070)")
            })
        } else if let Some(rest) = s.strip_prefix("node:") {
            let mut parts = rest.splitn(3, '/');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(node), Some(provider), Some(sandbox))
                    if !node.is_empty() && !provider.is_empty() && !sandbox.is_empty() =>
                {
                    Ok(Self::Node { node: node.into(), provider: provider.into(), sandbox: sandbox.into() })
                }
                _ => Err(format!("node: address {rest:?} must be NODE/PROVIDER/SANDBOX")),
            }
        } else {
            Err(format!("address {s:?} must start with unix:, tcp: or node:"))
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
            Self::Tcp(a) => write!(f, "tcp:{a}"),
            Self::Node { node, provider, sandbox } => write!(f, "node:{node}/{provider}/{sandbox}"),
        }
    }
}

/// A PING on every connection this often, idle or not; the connection is
/// closed when one goes unacknowledged for [`KEEPALIVE_TIMEOUT`], and the
/// channel then connects again. A server that died is usually seen at once
/// (a refused connect, a reset), but under gVisor a connect to the socket
/// of an agent that has just died succeeds and then nothing ever answers:
/// without this, every call on the channel waited out its own deadline.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// Long enough that a busy agent (gVisor's ptrace platform under load)
/// keeps its connection and the streams on it.
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// What every channel is opened with.
fn endpoint(uri: Endpoint) -> Endpoint {
    uri.http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
}

/// What a channel over a custom connector is opened with (the URI is
/// ignored by the connector; it only has to parse).
pub fn connector_endpoint() -> Endpoint {
    endpoint(Endpoint::from_static("http://sandbox.local"))
}

/// Open a channel to `address`. A `node:` address is the control plane's
/// to reach (through its tunnel): here every connection attempt fails.
pub async fn connect(address: &Address) -> Result<Channel, tonic::transport::Error> {
    match address {
        Address::Node { node, .. } => {
            let why = format!("{address} is reached through node {node}'s ConnectAgent, not dialled");
            connector_endpoint()
                .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                    let why = why.clone();
                    async move {
                        Err::<hyper_util::rt::TokioIo<tokio::net::UnixStream>, _>(std::io::Error::other(why))
                    }
                }))
                .await
        }
        Address::Tcp(addr) => endpoint(Endpoint::from_shared(format!("http://{addr}"))?).connect().await,
        Address::Unix(path) => {
            let path = path.clone();
            // The URI is ignored by the connector; it only has to parse.
            endpoint(Endpoint::from_static("http://sandbox.local"))
                .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
        }
    }
}

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Clone)]
pub struct BearerToken(MetadataValue<Ascii>);

impl BearerToken {
    pub fn new(token: &str) -> Result<Self, String> {
        format!("Bearer {token}").parse().map(Self).map_err(|_| "token must be printable ASCII".to_string())
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken([redacted])")
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// A channel whose requests carry a bearer token (over `C`: the channel
/// itself, or a layer around it such as the control plane's call spans).
pub type AuthedChannel<C = Channel> = InterceptedService<C, BearerToken>;

pub fn authed<C>(channel: C, token: BearerToken) -> AuthedChannel<C> {
    InterceptedService::new(channel, token)
}

/// Extract the bearer token of a request's metadata, if any.
pub fn bearer_of(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    let value = metadata.get("authorization")?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer "))?;
    Some(token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!("unix:/tmp/a.sock".parse::<Address>().unwrap(), Address::Unix("/tmp/a.sock".into()));
        assert_eq!(
            "tcp:127.0.0.1:80".parse::<Address>().unwrap(),
            Address::Tcp("127.0.0.1:80".parse().unwrap())
        );
        assert!("unix:".parse::<Address>().is_err());
        assert!("tcp:nope".parse::<Address>().is_err());
        assert!("/tmp/a.sock".parse::<Address>().is_err());
        let node = Address::Node { node: "n1".into(), provider: "docker".into(), sandbox: "abc/d".into() };
        assert_eq!(node.to_string().parse::<Address>().unwrap(), node);
        assert!("node:n1/docker".parse::<Address>().is_err());
    }

    #[test]
    fn token_is_not_printed() {
        let t = BearerToken::new("s3cret").unwrap();
        assert!(!format!("{t:?}").contains("s3cret"));
    }
}
