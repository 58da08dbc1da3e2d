//! `PortService`: TCP connections to ports on the sandbox's own loopback,
//! carried over the agent's gRPC connection. A sandbox with no network
//! (Docker's `none`) still serves its ports to the control plane this way.

use std::net::{Ipv4Addr, SocketAddr};

use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    PortOpened, PortRequest, PortResponse, port_request, port_response, port_service_server::PortService,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::context::AgentContext;

/// Bytes read from the port per message.
const READ_CHUNK: usize = 64 * 1024;

/// The service; holds nothing: every connection is its own.
#[derive(Debug, Default)]
pub struct Ports;

impl Ports {
    pub fn new(_ctx: &AgentContext) -> Self {
        Self
    }

    async fn connect(
        &self,
        mut inbound: Streaming<PortRequest>,
    ) -> Result<ReceiverStream<Result<PortResponse, Status>>, Error> {
        let port = match inbound.message().await {
            Ok(Some(PortRequest { request: Some(port_request::Request::Open(open)) })) => open.port,
            Ok(Some(_)) => return Err(Error::invalid_field("open", "the first message must carry open")),
            Ok(None) => return Err(Error::invalid_field("open", "the stream ended before open")),
            Err(status) => return Err(Error::from_status(&status)),
        };
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| Error::invalid_field("open.port", format!("{port} is not a port (1-65535)")))?;
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect(address).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => Error::new(
                ErrorCode::FailedPrecondition,
                format!("nothing listens on port {port} in the sandbox (127.0.0.1:{port})"),
            ),
            _ => Error::internal(format!("connecting to 127.0.0.1:{port}: {e}")),
        })?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        let (tx, rx) = mpsc::channel(16);
        // The channel is empty, so this cannot wait.
        let _ = tx.send(Ok(PortResponse { event: Some(port_response::Event::Opened(PortOpened {})) })).await;
        let upstream = tokio::spawn(to_port(inbound, write, port));
        tokio::spawn(async move {
            from_port(read, &tx, port).await;
            // The sandbox side is done; a caller still sending gets nowhere.
            upstream.abort();
        });
        Ok(ReceiverStream::new(rx))
    }
}

/// Write the caller's bytes to the port. `close` shuts the write side down
/// (the caller sent everything); the caller leaving drops the socket half,
/// which closes the connection once the reader is gone too.
async fn to_port(mut inbound: Streaming<PortRequest>, mut write: OwnedWriteHalf, port: u16) {
    loop {
        match inbound.message().await {
            Ok(Some(PortRequest { request: Some(port_request::Request::Data(data)) })) => {
                if let Err(e) = write.write_all(&data).await {
                    tracing::debug!(port, error = %e, "writing to the port failed");
                    return;
                }
            }
            Ok(Some(PortRequest { request: Some(port_request::Request::Close(_)) })) => {
                let _ = write.shutdown().await;
                // Keep reading: anything after `close` is a caller's bug,
                // but leaving now would look like the caller went away.
                while let Ok(Some(_)) = inbound.message().await {}
                return;
            }
            Ok(Some(_)) => tracing::debug!(port, "ignoring a second open"),
            Ok(None) | Err(_) => {
                let _ = write.shutdown().await;
                return;
            }
        }
    }
}

/// Send what the port writes until it closes its side or the caller goes.
async fn from_port(mut read: OwnedReadHalf, tx: &mpsc::Sender<Result<PortResponse, Status>>, port: u16) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut recheck = Recheck::default();
    loop {
        tokio::select! {
            n = recheck.read(&mut read, &mut buf) => match n {
                Ok(0) => return,
                Ok(n) => {
                    let event = Some(port_response::Event::Data(buf[..n].to_vec()));
                    if tx.send(Ok(PortResponse { event })).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(port, error = %e, "reading from the port failed");
                    let _ = tx.send(Err(Error::new(ErrorCode::Unavailable, format!("port {port}: {e}")).into())).await;
                    return;
                }
            },
            _ = tx.closed() => return,
        }
    }
}

/// A read that does not trust readiness alone. Under gVisor the netstack
/// sometimes posts no epoll event for the last bytes and the FIN of a
/// loopback connection (google/gvisor#7331 is one such report): the
/// socket sits in CLOSE_WAIT with nothing queued while tokio waits for an
/// edge that never comes, and the caller's stream stalls for good. So a
/// read that has waited a while asks the socket itself, without waiting
/// (`recv` with `MSG_DONTWAIT`): the bytes or the end of file it finds are
/// the read's. The wait starts short after data (where a lost FIN hurts:
/// a reply read to its end) and doubles while the connection idles, so an
/// idle connection costs one system call a second.
struct Recheck {
    after: std::time::Duration,
}

impl Recheck {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(50);
    const MOST: std::time::Duration = std::time::Duration::from_secs(1);

    async fn read(&mut self, read: &mut OwnedReadHalf, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        loop {
            if let Ok(n) = tokio::time::timeout(self.after, read.read(buf)).await {
                self.after = Self::FIRST;
                return n;
            }
            let fd = read.as_ref().as_raw_fd();
            // SAFETY: `fd` is the open socket `read` holds (borrowed for the
            // call); `buf` is valid for its length. No read is in flight: the
            // timed-out one was dropped.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                self.after = Self::FIRST;
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
            self.after = (self.after * 2).min(Self::MOST);
        }
    }
}

impl Default for Recheck {
    fn default() -> Self {
        Self { after: Self::FIRST }
    }
}

#[tonic::async_trait]
impl PortService for Ports {
    type OpenStream = ReceiverStream<Result<PortResponse, Status>>;

    async fn open(&self, req: Request<Streaming<PortRequest>>) -> Result<Response<Self::OpenStream>, Status> {
        Ok(Response::new(Ports::connect(self, req.into_inner()).await?))
    }
}

#[cfg(test)]
mod tests {
    use shared::proto::agent::v1::port_service_client::PortServiceClient;
    use shared::proto::agent::v1::port_service_server::PortServiceServer;
    use shared::proto::agent::v1::{PortClose, PortOpen};
    use tokio::net::TcpListener;
    use tonic::transport::Server;

    use super::*;
    use crate::testing;

    fn open(port: u32) -> PortRequest {
        PortRequest { request: Some(port_request::Request::Open(PortOpen { port })) }
    }

    #[tokio::test]
    async fn bytes_go_both_ways_and_close_is_a_half_close() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = testing::context(dir.path());
        let channel =
            testing::channel(Server::builder().add_service(PortServiceServer::new(Ports::new(&ctx)))).await;
        let mut client = PortServiceClient::new(channel);
        // An upper-casing echo server that answers only after its input ends:
        // it proves `close` reaches it as end-of-file while the reply still
        // comes back.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            socket.read_to_end(&mut got).await.unwrap();
            socket.write_all(&got.to_ascii_uppercase()).await.unwrap();
        });
        let (tx, rx) = mpsc::channel(4);
        tx.send(open(u32::from(port))).await.unwrap();
        let mut responses = client.open(ReceiverStream::new(rx)).await.unwrap().into_inner();
        assert!(matches!(
            responses.message().await.unwrap().unwrap().event,
            Some(port_response::Event::Opened(_))
        ));
        for part in ["hello ", "port"] {
            let data = Some(port_request::Request::Data(part.as_bytes().to_vec()));
            tx.send(PortRequest { request: data }).await.unwrap();
        }
        tx.send(PortRequest { request: Some(port_request::Request::Close(PortClose {})) }).await.unwrap();
        let mut back = Vec::new();
        while let Some(msg) = responses.message().await.unwrap() {
            if let Some(port_response::Event::Data(d)) = msg.event {
                back.extend(d);
            }
        }
        assert_eq!(back, b"HELLO PORT");
        server.await.unwrap();

        // Nothing listens there any more.
        let (tx, rx) = mpsc::channel(1);
        tx.send(open(u32::from(port))).await.unwrap();
        let err = client.open(ReceiverStream::new(rx)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        let (tx, rx) = mpsc::channel(1);
        tx.send(open(70_000)).await.unwrap();
        let err = client.open(ReceiverStream::new(rx)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
}
