//! The control plane's client of one sandbox agent.
//!
//! Connecting calls `InfoService.GetInfo` first and refuses an agent that
//! speaks another protocol version, so nothing past the handshake ever talks
//! to an agent it cannot understand. The typed service clients share one
//! HTTP/2 channel and every request carries the sandbox's bearer token.

use std::time::{Duration, Instant};

use backon::Retryable;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::egress_service_client::EgressServiceClient;
use shared::proto::agent::v1::fs_service_client::FsServiceClient;
use shared::proto::agent::v1::info_service_client::InfoServiceClient;
use shared::proto::agent::v1::journal_service_client::JournalServiceClient;
use shared::proto::agent::v1::port_service_client::PortServiceClient;
use shared::proto::agent::v1::process_service_client::ProcessServiceClient;
use shared::proto::agent::v1::request_service_client::RequestServiceClient;
use shared::proto::agent::v1::secret_service_client::SecretServiceClient;
use shared::proto::agent::v1::shell_service_client::ShellServiceClient;
use shared::proto::agent::v1::snapshot_service_client::SnapshotServiceClient;
use shared::proto::agent::v1::watch_service_client::WatchServiceClient;
use shared::proto::agent::v1::{GetInfoRequest, GetInfoResponse};
use shared::secret::Secret;
use shared::transport::{Address, BearerToken, authed};

use crate::telemetry::calls::Traced;

/// The channel to an agent: every call a client span, with the sandbox's
/// token.
pub type AgentChannel = shared::transport::AuthedChannel<Traced<tonic::transport::Channel>>;

/// How a starting agent is looked for ([`ready_pauses`]): first after
/// 2 ms, the pause doubling to 50 ms. An agent answers within a few
/// milliseconds of its process starting; a constant 50 ms made every cold
/// sandbox wait up to that long for nothing.
const FIRST_READY_PAUSE: Duration = Duration::from_millis(2);
pub const LONGEST_READY_PAUSE: Duration = Duration::from_millis(50);

/// The pauses between looks for a starting agent (endless).
pub fn ready_pauses() -> impl Iterator<Item = Duration> + Send + Unpin {
    std::iter::successors(Some(FIRST_READY_PAUSE), |pause| Some((*pause * 2).min(LONGEST_READY_PAUSE)))
}
/// Bound on one connection attempt and its `GetInfo`, so a socket that
/// accepts but never answers cannot eat a whole deadline in one try.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connected, version-checked agent. Cheap to clone (one shared channel).
#[derive(Clone)]
pub struct AgentClient {
    address: Address,
    channel: AgentChannel,
    info: GetInfoResponse,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("address", &self.address)
            .field("agent_version", &self.info.agent_version)
            .field("pid", &self.info.pid)
            .finish_non_exhaustive()
    }
}

impl AgentClient {
    /// Connect once and shake hands. `Unavailable` when nothing answers,
    /// `ProtocolMismatch` for an agent of another protocol version,
    /// `Unauthenticated` for a wrong token.
    pub async fn connect(address: &Address, token: &Secret) -> Result<Self, Error> {
        let bearer = BearerToken::new(token.expose())
            .map_err(|e| Error::new(ErrorCode::InvalidArgument, format!("sandbox token: {e}")))?;
        let attempt = async {
            let channel = match address {
                Address::Node { node, provider, sandbox } => {
                    crate::tunnel::connect(node, provider, sandbox).await
                }
                _ => shared::transport::connect(address).await,
            };
            let channel = channel.map_err(|e| {
                Error::new(
                    ErrorCode::Unavailable,
                    format!("connecting to the sandbox agent at {address}: {e}"),
                )
            })?;
            let channel = authed(Traced::new(channel), bearer);
            let info = InfoServiceClient::new(channel.clone())
                .get_info(GetInfoRequest {})
                .await
                .map_err(|status| {
                    let mut err = Error::from_status(&status);
                    err.message = format!("sandbox agent at {address}: GetInfo: {}", err.message);
                    err
                })?
                .into_inner();
            Ok::<_, Error>((channel, info))
        };
        let (channel, info) = tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await.map_err(|_| {
            Error::new(
                ErrorCode::Unavailable,
                format!("sandbox agent at {address} did not answer GetInfo within {ATTEMPT_TIMEOUT:?}"),
            )
        })??;
        if info.protocol_version != shared::AGENT_PROTOCOL_VERSION {
            return Err(Error::new(
                ErrorCode::ProtocolMismatch,
                format!(
                    "sandbox agent at {address} (version {}) speaks agent protocol {}, this control plane speaks {}; \
                     use a sandhold-agent built with this control plane",
                    info.agent_version,
                    info.protocol_version,
                    shared::AGENT_PROTOCOL_VERSION
                ),
            )
            .with_meta("agent_protocol_version", info.protocol_version.to_string())
            .with_meta("expected_protocol_version", shared::AGENT_PROTOCOL_VERSION.to_string()));
        }
        Ok(Self { address: address.clone(), channel, info })
    }

    /// Retry [`connect`](Self::connect) until the agent answers or `deadline`
    /// passes: for an agent that is still starting. Errors that waiting
    /// cannot cure (protocol mismatch, wrong token) end the wait at once.
    pub async fn connect_with_deadline(
        address: &Address,
        token: &Secret,
        deadline: Duration,
    ) -> Result<Self, Error> {
        let until = Instant::now() + deadline;
        let connected = (|| Self::connect(address, token))
            .retry(ready_pauses())
            .when(|e| retryable(e) && Instant::now() < until)
            .await;
        connected.map_err(|e| {
            if !retryable(&e) {
                return e;
            }
            Error::new(
                ErrorCode::Unavailable,
                format!("sandbox agent did not become ready within {deadline:?}: {}", e.message),
            )
        })
    }

    pub fn address(&self) -> &Address {
        &self.address
    }

    /// What the agent said at the handshake (version, pid, root,
    /// capabilities).
    pub fn handshake(&self) -> &GetInfoResponse {
        &self.info
    }

    /// What a run in this sandbox must be told about the confinement of
    /// its run user: each layer the agent does not apply (its kernel lacks
    /// it, or the operator turned it off), as a `harness.warning`.
    pub fn confinement_warnings(&self) -> Vec<String> {
        let caps = self.info.capabilities.unwrap_or_default();
        let mut warnings = Vec::new();
        if !caps.landlock {
            warnings.push(
                "Landlock does not confine this sandbox's run user (its kernel lacks it, or the operator \
                 turned it off): its writes are bounded only by file permissions"
                    .to_string(),
            );
        }
        if !caps.seccomp {
            warnings.push(
                "the seccomp denylist does not confine this sandbox's run user (its kernel lacks it, or the \
                 operator turned it off): mount, bpf, io_uring and the rest stay open to it"
                    .to_string(),
            );
        }
        warnings
    }

    pub fn info(&self) -> InfoServiceClient<AgentChannel> {
        shared::sized!(InfoServiceClient::new(self.channel.clone()))
    }

    pub fn process(&self) -> ProcessServiceClient<AgentChannel> {
        shared::sized!(ProcessServiceClient::new(self.channel.clone()))
    }

    pub fn fs(&self) -> FsServiceClient<AgentChannel> {
        shared::sized!(FsServiceClient::new(self.channel.clone()))
    }

    pub fn shell(&self) -> ShellServiceClient<AgentChannel> {
        shared::sized!(ShellServiceClient::new(self.channel.clone()))
    }

    pub fn journal(&self) -> JournalServiceClient<AgentChannel> {
        shared::sized!(JournalServiceClient::new(self.channel.clone()))
    }

    pub fn watch(&self) -> WatchServiceClient<AgentChannel> {
        shared::sized!(WatchServiceClient::new(self.channel.clone()))
    }

    pub fn port(&self) -> PortServiceClient<AgentChannel> {
        shared::sized!(PortServiceClient::new(self.channel.clone()))
    }

    pub fn snapshot(&self) -> SnapshotServiceClient<AgentChannel> {
        shared::sized!(SnapshotServiceClient::new(self.channel.clone()))
    }

    pub fn egress(&self) -> EgressServiceClient<AgentChannel> {
        shared::sized!(EgressServiceClient::new(self.channel.clone()))
    }

    pub fn requests(&self) -> RequestServiceClient<AgentChannel> {
        shared::sized!(RequestServiceClient::new(self.channel.clone()))
    }

    pub fn secrets(&self) -> SecretServiceClient<AgentChannel> {
        SecretServiceClient::new(self.channel.clone())
    }

    /// Ask the agent again (e.g. to see whether its daemon restarted: the
    /// pid changes).
    pub async fn refresh_info(&self) -> Result<GetInfoResponse, Error> {
        self.info()
            .get_info(GetInfoRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| Error::from_status(&s))
    }
}

/// Whether another connection attempt might succeed: the agent is not up
/// yet (no socket, refused, timed out), as opposed to an agent that
/// answered and said no.
fn retryable(err: &Error) -> bool {
    matches!(
        err.code,
        ErrorCode::Unavailable | ErrorCode::DeadlineExceeded | ErrorCode::Cancelled | ErrorCode::Internal
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn nothing_listening_is_unavailable_and_names_the_address() {
        let dir = tempfile::tempdir().unwrap();
        let address = Address::Unix(dir.path().join("none.sock"));
        let err = AgentClient::connect(&address, &Secret::new("t")).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Unavailable);
        assert!(err.message.contains("none.sock"), "{}", err.message);
    }

    #[test]
    fn a_starting_agent_is_looked_for_soon_then_less_often() {
        let pauses: Vec<u64> = ready_pauses().take(8).map(|p| p.as_millis() as u64).collect();
        assert_eq!(pauses, [2, 4, 8, 16, 32, 50, 50, 50]);
    }

    #[tokio::test]
    async fn deadline_bounds_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let address = Address::Unix(dir.path().join("none.sock"));
        let started = Instant::now();
        let err = AgentClient::connect_with_deadline(&address, &Secret::new("t"), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Unavailable);
        assert!(err.message.contains("did not become ready"), "{}", err.message);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}

#[cfg(test)]
mod handshake_tests {
    use super::*;
    use shared::proto::agent::v1::info_service_server::{InfoService, InfoServiceServer};

    /// An agent that reports a protocol version of its choosing.
    struct FakeInfo(u32);

    #[tonic::async_trait]
    impl InfoService for FakeInfo {
        async fn get_info(
            &self,
            _req: tonic::Request<GetInfoRequest>,
        ) -> Result<tonic::Response<GetInfoResponse>, tonic::Status> {
            Ok(tonic::Response::new(GetInfoResponse {
                agent_version: "9.9.9".into(),
                protocol_version: self.0,
                ..Default::default()
            }))
        }
    }

    async fn serve_fake(dir: &std::path::Path, protocol: u32) -> Address {
        let path = dir.join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(InfoServiceServer::new(FakeInfo(protocol)))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        Address::Unix(path)
    }

    #[tokio::test]
    async fn another_protocol_version_is_refused_without_retrying() {
        let dir = tempfile::tempdir().unwrap();
        let address = serve_fake(dir.path(), shared::AGENT_PROTOCOL_VERSION + 1).await;
        let err = AgentClient::connect_with_deadline(&address, &Secret::new("t"), Duration::from_secs(60))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ProtocolMismatch);
        assert_eq!(
            err.metadata.get("agent_protocol_version").map(String::as_str),
            Some((shared::AGENT_PROTOCOL_VERSION + 1).to_string().as_str())
        );
    }

    #[tokio::test]
    async fn the_same_protocol_version_connects() {
        let dir = tempfile::tempdir().unwrap();
        let address = serve_fake(dir.path(), shared::AGENT_PROTOCOL_VERSION).await;
        let client = AgentClient::connect(&address, &Secret::new("t")).await.unwrap();
        assert_eq!(client.handshake().agent_version, "9.9.9");
    }
}
