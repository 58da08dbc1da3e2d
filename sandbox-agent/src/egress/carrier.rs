//! Carriers: `Carry` streams the control plane opened ahead of time, kept
//! idle in a pool until the listener needs an upstream connection. A dial
//! takes one, asks the control plane to connect, and turns the stream into
//! a byte stream (`AsyncRead + AsyncWrite`) for the listener.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::proto::agent::v1::{
    CarryAsk, CarryClose, CarryDial, CarryRequest, CarryResponse, carry_request, carry_response,
};

use super::ask::Asks;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tonic::{Status, Streaming};

/// Bytes per `data` message at most.
pub const CHUNK: usize = 64 * 1024;

/// One carrier: what the agent sends on it, and what it receives.
struct Carrier {
    tx: mpsc::Sender<Result<CarryResponse, Status>>,
    inbound: Streaming<CarryRequest>,
}

/// Why a dial gave no connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DialError {
    /// No carrier appeared within the wait: no control plane drives the
    /// sandbox right now.
    NoCarrier(Duration),
    /// The control plane's allowlist refused the destination.
    Refused(String),
    /// The control plane could not connect, or did not answer in time.
    Failed(String),
    /// The destination falls under an ask rule (handled by the pool).
    Ask(CarryAsk),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoCarrier(wait) => write!(
                f,
                "no control plane is carrying egress for this sandbox right now (waited {}s for one)",
                wait.as_secs_f32()
            ),
            Self::Refused(why) => write!(f, "refused by the sandbox's egress allowlist: {why}"),
            Self::Failed(why) => write!(f, "{why}"),
            Self::Ask(ask) => write!(f, "asks ({})", ask.rule),
        }
    }
}

#[derive(Default)]
struct Idle {
    carriers: VecDeque<Carrier>,
    /// The agent is stopping: carriers are ended, not kept.
    closed: bool,
}

/// The idle carriers. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    idle: Mutex<Idle>,
    arrived: Notify,
    /// How long a dial waits for a carrier to appear.
    wait: Duration,
    /// How long a dial waits for `dialed`.
    dial_timeout: Duration,
    asks: Asks,
}

impl Pool {
    /// A pool whose network asks go to the request dirs of the runs in
    /// `journal_dir`.
    pub fn new(wait: Duration, dial_timeout: Duration, journal_dir: std::path::PathBuf) -> Self {
        let asks = Asks::new(journal_dir);
        Self {
            inner: Arc::new(PoolInner {
                idle: Mutex::default(),
                arrived: Notify::new(),
                wait,
                dial_timeout,
                asks,
            }),
        }
    }

    /// Keep a new carrier; its response stream is the returned receiver.
    pub fn add(&self, inbound: Streaming<CarryRequest>) -> mpsc::Receiver<Result<CarryResponse, Status>> {
        let (tx, rx) = mpsc::channel(16);
        let mut idle = self.inner.idle.lock().expect("carrier pool poisoned");
        if idle.closed {
            // Dropping the sender ends the stream at once.
            return rx;
        }
        // Carriers whose control plane went away are of no use any more.
        idle.carriers.retain(|c| !c.tx.is_closed());
        idle.carriers.push_back(Carrier { tx, inbound });
        drop(idle);
        self.inner.arrived.notify_waiters();
        rx
    }

    /// End every idle carrier's stream, and every new one's: the agent is
    /// stopping, and an open stream would hold its drain up.
    pub fn close(&self) {
        let mut idle = self.inner.idle.lock().expect("carrier pool poisoned");
        idle.closed = true;
        idle.carriers.clear();
    }

    /// The newest open carrier (the likeliest still alive), waiting until
    /// `deadline` for one.
    async fn take(&self, deadline: Instant) -> Option<Carrier> {
        loop {
            let arrived = self.inner.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            {
                let mut idle = self.inner.idle.lock().expect("carrier pool poisoned");
                while let Some(carrier) = idle.carriers.pop_back() {
                    if !carrier.tx.is_closed() {
                        return Some(carrier);
                    }
                }
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return None;
            }
        }
    }

    /// A connection to `dial`'s destination through a carrier. A carrier
    /// that ends before answering is dropped and the next one tried. A
    /// destination under an ask rule waits for the request's answer and,
    /// allowed, is dialed again with it.
    pub async fn dial(&self, mut dial: CarryDial) -> Result<DuplexStream, DialError> {
        let mut deadline = Instant::now() + self.inner.wait;
        loop {
            // Carriers that keep vanishing before they answer must not
            // keep this request busy past the wait.
            if Instant::now() >= deadline {
                return Err(DialError::NoCarrier(self.inner.wait));
            }
            let carrier = self.take(deadline).await.ok_or(DialError::NoCarrier(self.inner.wait))?;
            match carrier.dial(dial.clone(), self.inner.dial_timeout).await {
                Ok(stream) => return Ok(stream),
                Err(None) => tracing::debug!("a carrier ended before answering its dial, trying another"),
                Err(Some(DialError::Ask(ask))) if dial.request_id.is_empty() => {
                    let (run, id) = self.inner.asks.ask(&ask, &dial).await.map_err(DialError::Refused)?;
                    (dial.request_run_id, dial.request_id) = (run, id);
                    deadline = Instant::now() + self.inner.wait;
                }
                Err(Some(DialError::Ask(ask))) => {
                    return Err(DialError::Refused(format!(
                        "the control plane did not take the answer of request {} (rule {})",
                        dial.request_id, ask.rule
                    )));
                }
                Err(Some(e)) => return Err(e),
            }
        }
    }
}

impl Carrier {
    /// `Err(None)`: the carrier was gone.
    async fn dial(mut self, dial: CarryDial, timeout: Duration) -> Result<DuplexStream, Option<DialError>> {
        let (host, port) = (dial.host.clone(), dial.port);
        let message = Some(carry_response::Message::Dial(dial));
        self.tx.send(Ok(CarryResponse { message })).await.map_err(|_| None)?;
        let answer = tokio::time::timeout(timeout, self.inbound.message()).await.map_err(|_| {
            Some(DialError::Failed(format!(
                "the control plane did not answer the dial to {host}:{port} within {}s",
                timeout.as_secs()
            )))
        })?;
        match answer {
            Ok(Some(CarryRequest { message: Some(carry_request::Message::Dialed(dialed)) })) => {
                if let Some(ask) = dialed.ask {
                    Err(Some(DialError::Ask(ask)))
                } else if dialed.error.is_empty() {
                    Ok(splice(self.tx, self.inbound))
                } else if dialed.refused {
                    Err(Some(DialError::Refused(dialed.error)))
                } else {
                    Err(Some(DialError::Failed(format!("connecting to {host}:{port}: {}", dialed.error))))
                }
            }
            Ok(Some(_)) => Err(Some(DialError::Failed(
                "the control plane sent bytes before answering the dial".to_string(),
            ))),
            Ok(None) | Err(_) => Err(None),
        }
    }
}

/// How the inbound half ended.
enum Inbound {
    /// `close`: the upstream ended its side; ours may still send.
    Closed,
    /// The stream ended (the connection is gone) or the client went away.
    Gone,
}

/// A byte stream over a connected carrier: what is written to it goes out
/// as `data` (shutting its write side down sends `close`), what arrives as
/// `data` is read from it (`close` or the stream's end reads as EOF). The
/// carrier's stream ends once both sides are done, or at once when the
/// control plane's side ends.
fn splice(
    tx: mpsc::Sender<Result<CarryResponse, Status>>,
    mut inbound: Streaming<CarryRequest>,
) -> DuplexStream {
    let (theirs, ours) = tokio::io::duplex(2 * CHUNK);
    let (mut read, mut write) = tokio::io::split(ours);
    tokio::spawn(async move {
        let outbound = async {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match read.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let close = Some(carry_response::Message::Close(CarryClose {}));
                        let _ = tx.send(Ok(CarryResponse { message: close })).await;
                        return;
                    }
                    Ok(n) => {
                        let data = Some(carry_response::Message::Data(buf[..n].to_vec()));
                        if tx.send(Ok(CarryResponse { message: data })).await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        let inbound = async {
            loop {
                match inbound.message().await {
                    Ok(Some(CarryRequest { message: Some(carry_request::Message::Data(data)) })) => {
                        if write.write_all(&data).await.is_err() {
                            return Inbound::Gone;
                        }
                    }
                    Ok(Some(CarryRequest { message: Some(carry_request::Message::Close(_)) })) => {
                        let _ = write.shutdown().await;
                        return Inbound::Closed;
                    }
                    Ok(Some(_)) => tracing::debug!("ignoring an unexpected carrier message"),
                    Ok(None) | Err(_) => {
                        let _ = write.shutdown().await;
                        return Inbound::Gone;
                    }
                }
            }
        };
        tokio::pin!(outbound, inbound);
        let (mut out_done, mut in_done) = (false, false);
        while !(out_done && in_done) {
            tokio::select! {
                () = &mut outbound, if !out_done => out_done = true,
                end = &mut inbound, if !in_done => {
                    in_done = true;
                    if matches!(end, Inbound::Gone) {
                        break;
                    }
                }
            }
        }
        // Dropping the sender ends the carrier's stream.
    });
    theirs
}
