//! `sandhold port-forward SANDBOX [LOCAL_ADDR:]LOCAL_PORT:SANDBOX_PORT`:
//! listen locally and carry each connection to a port on the sandbox's
//! loopback through `ConnectPort`, many at once, until Ctrl-C.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::str::FromStr;

use anyhow::Context;
use clap::Args;
use shared::proto::v1 as api;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::client::{ClientArgs, Svc};
use super::output::status_error;
use super::run::with_connection;

#[derive(Debug, Clone, Args)]
pub struct PortForwardArgs {
    #[command(flatten)]
    pub target: super::ids::SandboxTarget,
    /// `[LOCAL_ADDR:]LOCAL_PORT:SANDBOX_PORT`: listen on LOCAL_ADDR
    /// (default 127.0.0.1) port LOCAL_PORT (0: any free port), forward to
    /// SANDBOX_PORT on the sandbox's loopback.
    #[arg(value_name = "[LOCAL_ADDR:]LOCAL_PORT:SANDBOX_PORT")]
    pub ports: Forward,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Where to listen and which sandbox port to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub listen: SocketAddr,
    pub sandbox_port: u16,
}

impl FromStr for Forward {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = || format!("{s:?}: expected [LOCAL_ADDR:]LOCAL_PORT:SANDBOX_PORT, e.g. 8080:80");
        let (local, sandbox) = s.rsplit_once(':').ok_or_else(usage)?;
        let sandbox_port: u16 = sandbox.parse().map_err(|_| usage())?;
        if sandbox_port == 0 {
            return Err(format!("{s:?}: the sandbox port must be 1-65535"));
        }
        let (addr, port) = match local.rsplit_once(':') {
            Some((addr, port)) => {
                let addr = addr.trim_start_matches('[').trim_end_matches(']');
                let addr: IpAddr = match addr {
                    "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    other => other.parse().map_err(|_| format!("{s:?}: {other:?} is not an IP address"))?,
                };
                (addr, port)
            }
            None => (IpAddr::V4(Ipv4Addr::LOCALHOST), local),
        };
        let port: u16 = port.parse().map_err(|_| usage())?;
        Ok(Self { listen: SocketAddr::new(addr, port), sandbox_port })
    }
}

pub async fn port_forward(args: PortForwardArgs) -> ExitCode {
    let client = args.client.clone();
    with_connection(&client, async move |conn| {
        let listener = TcpListener::bind(args.ports.listen)
            .await
            .with_context(|| format!("listening on {}", args.ports.listen))?;
        let local = listener.local_addr()?;
        let sandboxes = conn.sandboxes();
        let sandbox_id = args.target.resolve(conn).await?;
        // Fail now, not at the first connection, for a sandbox that is
        // not there (or not the caller's), or has no ports of its own.
        let sandbox = sandboxes
            .clone()
            .get_sandbox(api::GetSandboxRequest { sandbox_id: sandbox_id.clone() })
            .await
            .map_err(status_error)?
            .into_inner()
            .sandbox
            .unwrap_or_default();
        if !sandbox.capabilities.is_some_and(|c| c.ports) {
            anyhow::bail!(
                "sandbox {} ({} provider) has no loopback of its own to forward to: its processes listen on the \
                 server's host, so connect there directly (127.0.0.1:{} on that host); port-forward is for \
                 sandboxes with their own network, such as Docker's",
                &sandbox_id[..sandbox_id.len().min(16)],
                sandbox.provider,
                args.ports.sandbox_port
            );
        }
        eprintln!("Forwarding from {local} -> {sandbox_id}:{} (Ctrl-C to stop)", args.ports.sandbox_port);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (socket, peer) = accepted.context("accepting a connection")?;
                    let (client, sandbox_id, port) = (sandboxes.clone(), sandbox_id.clone(), args.ports.sandbox_port);
                    tokio::spawn(async move {
                        if let Err(e) = carry(client, socket, sandbox_id, port).await {
                            eprintln!("connection from {peer}: {e:#}");
                        }
                    });
                }
                _ = tokio::signal::ctrl_c() => return Ok(0),
            }
        }
    })
    .await
}

/// Carry one local connection to the sandbox's port and back. The local
/// side's end of input becomes `close` (the sandbox side reads end of
/// file); the sandbox side's end closes the local socket.
async fn carry(
    mut client: SandboxServiceClient<Svc>,
    socket: TcpStream,
    sandbox_id: String,
    port: u16,
) -> anyhow::Result<()> {
    let _ = socket.set_nodelay(true);
    let (tx, rx) = mpsc::channel(16);
    let open = api::ConnectPortOpen { sandbox_id, port: u32::from(port) };
    tx.send(api::ConnectPortRequest { request: Some(api::connect_port_request::Request::Open(open)) })
        .await?;
    let mut responses =
        client.connect_port(ReceiverStream::new(rx)).await.map_err(status_error)?.into_inner();
    let (mut read, mut write) = socket.into_split();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let request = match read.read(&mut buf).await {
                Ok(0) | Err(_) => api::connect_port_request::Request::Close(api::ConnectPortClose {}),
                Ok(n) => api::connect_port_request::Request::Data(buf[..n].to_vec()),
            };
            let done = matches!(request, api::connect_port_request::Request::Close(_));
            if tx.send(api::ConnectPortRequest { request: Some(request) }).await.is_err() || done {
                // Keep the request stream open until the answer ends:
                // dropping it would end the call.
                std::future::pending::<()>().await;
            }
        }
    });
    let result = async {
        while let Some(message) = responses.next().await {
            if let Some(api::connect_port_response::Event::Data(data)) = message.map_err(status_error)?.event
            {
                write.write_all(&data).await?;
            }
        }
        anyhow::Ok(())
    }
    .await;
    upstream.abort();
    let _ = write.shutdown().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_like_kubectl_port_forward() {
        let f = |s: &str| s.parse::<Forward>();
        assert_eq!(
            f("8080:80").unwrap(),
            Forward { listen: "127.0.0.1:8080".parse().unwrap(), sandbox_port: 80 }
        );
        assert_eq!(f("0.0.0.0:9000:8000").unwrap().listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(f("localhost:0:3000").unwrap().listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(f("[::1]:9000:80").unwrap().listen, "[::1]:9000".parse().unwrap());
        for bad in ["80", "a:80", "8080:0", "8080:70000", "host.example:1:2"] {
            assert!(f(bad).is_err(), "{bad}");
        }
    }
}
