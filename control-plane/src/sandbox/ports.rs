//! `ConnectPort`: a byte stream to a TCP port on a sandbox's own loopback,
//! carried by its agent (`PortService`), so a sandbox without a network
//! still shows the server it started. Any replica can serve it: the agent
//! is reached through the sandbox's record, not through who created it.

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::sandboxes::Optional;
use super::{Error, Sandboxes};
use crate::provision::InvalidField;
use crate::store::Tenant;

/// What a `ConnectPort` answers: `opened`, then the port's bytes.
pub type PortEvents = BoxStream<'static, Result<api::ConnectPortResponse, Error>>;

impl Sandboxes {
    /// Open the connection `inbound` begins with (`open`) and carry the
    /// rest of it (bytes, `close`) to the port until either side ends.
    pub async fn connect_port<S>(&self, tenant: &Tenant, mut inbound: S) -> Result<PortEvents, Error>
    where
        S: Stream<Item = Result<api::ConnectPortRequest, Status>> + Send + Unpin + 'static,
    {
        let first = inbound.next().await.transpose()?.and_then(|m| m.request);
        let Some(api::connect_port_request::Request::Open(open)) = first else {
            return Err(InvalidField::new("open", "the first message must be `open`").into());
        };
        if !(1..=u32::from(u16::MAX)).contains(&open.port) {
            return Err(
                InvalidField::new("open.port", format!("{} is not a port (1-65535)", open.port)).into()
            );
        }
        let live = self.live_for(tenant, &open.sandbox_id, Optional::Ports).await?;
        let (tx, rx) = mpsc::channel::<agent::PortRequest>(16);
        let open = agent::PortRequest {
            request: Some(agent::port_request::Request::Open(agent::PortOpen { port: open.port })),
        };
        tx.send(open).await.map_err(|_| Error::Closed("port stream closed before open"))?;
        self.forward(inbound, tx, |message: api::ConnectPortRequest| {
            let request = match message.request? {
                api::connect_port_request::Request::Data(data) => agent::port_request::Request::Data(data),
                api::connect_port_request::Request::Close(_) => {
                    agent::port_request::Request::Close(agent::PortClose {})
                }
                api::connect_port_request::Request::Open(_) => return None,
            };
            Some(agent::PortRequest { request: Some(request) })
        });
        let outbound = live.agent.port().open(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Box::pin(outbound.map(|item| {
            let event = item?.event.map(|e| match e {
                agent::port_response::Event::Opened(_) => {
                    api::connect_port_response::Event::Opened(api::ConnectPortOpened {})
                }
                agent::port_response::Event::Data(d) => api::connect_port_response::Event::Data(d),
            });
            Ok(api::ConnectPortResponse { event })
        })))
    }
}
