//! The control plane's side of `EgressService.Carry`: a few carriers kept
//! open on a sandbox's agent while this replica uses it (drives a run, runs
//! setup). When the agent takes one, the destination is checked against the
//! sandbox's [`Plan`], connected, and bytes are carried both ways; every
//! connection, refused ones included, is reported as a [`Connection`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use shared::proto::agent::v1 as agent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{Plan, Purpose};
use crate::agent::AgentClient;

/// Carriers kept waiting for the agent at any time.
const IDLE: usize = 2;
/// Bound on connecting to a destination.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest `data` message sent to the agent.
const PIECE: usize = 64 * 1024;
/// Between attempts to open a carrier on an agent that refused or went away.
const REOPEN_MIN: Duration = Duration::from_millis(200);
const REOPEN_MAX: Duration = Duration::from_secs(5);

/// One connection the sandbox asked for, as it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    pub host: String,
    pub port: u16,
    pub purpose: Purpose,
    /// The model route's label (the harness), for [`Purpose::Model`].
    pub route: String,
    /// Allowed by the plan (it may still have failed to connect).
    pub allowed: bool,
    /// Why it was refused or failed; `None` for a connection that was made.
    pub error: Option<String>,
    /// Bytes from the sandbox to the destination, and back.
    pub sent: u64,
    pub received: u64,
    pub duration_ms: u64,
    /// `false` for the early report of a connection just made (before
    /// its bytes), `true` for the record of one that ended or never began.
    pub ended: bool,
}

impl Connection {
    /// The `sandbox.network` event's value.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::json!({
            "host": self.host,
            "port": self.port,
            "purpose": self.purpose.as_str(),
            "allowed": self.allowed,
            "bytes_sent": self.sent,
            "bytes_received": self.received,
            "duration_ms": self.duration_ms,
        });
        if !self.route.is_empty() {
            value["route"] = self.route.clone().into();
        }
        if let Some(error) = &self.error {
            value["error"] = error.clone().into();
        }
        value
    }

    /// One line for people: `registry.npmjs.org:443 refused: ...`.
    pub fn summary(&self) -> String {
        let what = match (&self.error, self.allowed) {
            (Some(e), false) => format!("refused: {e}"),
            (Some(e), true) => format!("failed: {e}"),
            (None, _) => format!("{} bytes out, {} back", self.sent, self.received),
        };
        format!("network {} {}:{} {what}", self.purpose.as_str(), self.host, self.port)
    }

    /// A model upstream that could not be reached (not a refusal: the
    /// plan's own model upstreams are never refused unless misconfigured).
    pub fn model_unreachable(&self) -> bool {
        self.purpose == Purpose::Model && self.error.is_some()
    }
}

/// Carriers on one agent; dropping this closes them (connections in flight
/// included: the agent's clients see their connection end).
#[derive(Debug)]
pub struct Carriers {
    stop: CancellationToken,
}

impl Drop for Carriers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Carriers {
    /// Keep carriers open on `agent` for `plan`, reporting each connection
    /// on `events` (dropped when nobody listens).
    pub fn open(agent: AgentClient, plan: Arc<Plan>, events: mpsc::UnboundedSender<Connection>) -> Self {
        let stop = CancellationToken::new();
        tokio::spawn(keep_open(agent, plan, events, stop.clone()));
        Self { stop }
    }
}

/// What a carrier became.
enum Outcome {
    /// The agent took it (a connection was carried, or refused).
    Used,
    /// It could not be opened, or ended before the agent used it.
    Lost(String),
}

async fn keep_open(
    agent: AgentClient,
    plan: Arc<Plan>,
    events: mpsc::UnboundedSender<Connection>,
    stop: CancellationToken,
) {
    let (taken_tx, mut taken_rx) = mpsc::unbounded_channel::<()>();
    let mut tasks: JoinSet<Outcome> = JoinSet::new();
    let spawn = |tasks: &mut JoinSet<Outcome>| {
        let (agent, plan, events, taken) = (agent.clone(), plan.clone(), events.clone(), taken_tx.clone());
        tasks.spawn(carry(agent, plan, events, taken));
    };
    for _ in 0..IDLE {
        spawn(&mut tasks);
    }
    let mut pause = REOPEN_MIN;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            // Taken: open a replacement at once, so the pool stays full
            // while the connection is carried.
            Some(()) = taken_rx.recv() => {
                spawn(&mut tasks);
                pause = REOPEN_MIN;
            }
            Some(done) = tasks.join_next() => {
                let why = match done {
                    Ok(Outcome::Used) => continue,
                    Ok(Outcome::Lost(why)) => why,
                    Err(e) => e.to_string(),
                };
                debug!(error = %why, "an egress carrier closed before use; reopening");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(REOPEN_MAX);
                spawn(&mut tasks);
            }
        }
    }
    tasks.abort_all();
}

/// One carrier: open it, wait for the agent's `dial`, then carry.
async fn carry(
    agent: AgentClient,
    plan: Arc<Plan>,
    events: mpsc::UnboundedSender<Connection>,
    taken: mpsc::UnboundedSender<()>,
) -> Outcome {
    let (tx, rx) = mpsc::channel::<agent::CarryRequest>(16);
    let mut inbound = match agent.egress().carry(ReceiverStream::new(rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Outcome::Lost(status.message().to_string()),
    };
    let dial = match inbound.next().await {
        Some(Ok(agent::CarryResponse { message: Some(agent::carry_response::Message::Dial(dial)) })) => dial,
        Some(Ok(_)) => return Outcome::Lost("the agent's first message was not `dial`".into()),
        Some(Err(status)) => return Outcome::Lost(status.message().to_string()),
        None => return Outcome::Lost("the agent closed the carrier".into()),
    };
    let _ = taken.send(());
    let started = Instant::now();
    let purpose = Purpose::from_wire(dial.purpose);
    let mut connection = Connection {
        host: super::limits::bounded(&dial.host),
        port: u16::try_from(dial.port).unwrap_or(0),
        purpose,
        route: dial.route.clone(),
        allowed: false,
        error: None,
        sent: 0,
        received: 0,
        duration_ms: 0,
        ended: true,
    };
    // The slot is held as long as the connection is carried.
    let connected = match plan.admit() {
        Ok(slot) => plan.connect(&dial, CONNECT_TIMEOUT).await.map(|stream| (stream, slot)),
        Err(refusal) => Err(refusal),
    };
    let (stream, _slot) = match connected {
        Ok(connected) => {
            connection.allowed = true;
            connected
        }
        Err(refusal) => {
            connection.allowed = !refusal.refused;
            connection.error = Some(refusal.reason.clone());
            let asked = refusal.ask.is_some();
            let dialed =
                agent::CarryDialed { error: refusal.reason, refused: refusal.refused, ask: refusal.ask };
            let _ = tx.send(message(agent::carry_request::Message::Dialed(dialed))).await;
            connection.duration_ms = started.elapsed().as_millis() as u64;
            // An ask is no refusal: its request is the record, and the dial
            // after the answer is recorded as any other.
            if !asked {
                let _ = events.send(connection);
            }
            // Until the agent ends the carrier: dropping the stream now
            // could reset it before the answer reaches the agent, which
            // would then try the next carrier, and the next.
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, async {
                while let Some(Ok(_)) = inbound.next().await {}
            })
            .await;
            return Outcome::Used;
        }
    };
    let dialed = agent::CarryDialed::default();
    if tx.send(message(agent::carry_request::Message::Dialed(dialed))).await.is_err() {
        connection.error = Some("the agent left before the connection was made".into());
        let _ = events.send(connection);
        return Outcome::Used;
    }
    let _ = events.send(Connection { ended: false, ..connection.clone() });
    let (sent, received) = splice(stream, inbound, tx).await;
    connection.sent = sent;
    connection.received = received;
    connection.duration_ms = started.elapsed().as_millis() as u64;
    let _ = events.send(connection);
    Outcome::Used
}

fn message(message: agent::carry_request::Message) -> agent::CarryRequest {
    agent::CarryRequest { message: Some(message) }
}

/// Carry bytes until both directions ended; returns the byte counts
/// (to the destination, from it).
async fn splice(
    stream: TcpStream,
    mut inbound: tonic::Streaming<agent::CarryResponse>,
    tx: mpsc::Sender<agent::CarryRequest>,
) -> (u64, u64) {
    let (mut read, mut write) = stream.into_split();
    let up = async move {
        let mut sent = 0u64;
        let mut writing = true;
        // Read to the stream's end even after `close`: dropping it early
        // would end the carrier while the destination's answer (a tunnel's
        // client may half-close first) is still being carried down.
        while let Some(Ok(response)) = inbound.next().await {
            match response.message {
                Some(agent::carry_response::Message::Data(data)) if writing => {
                    if write.write_all(&data).await.is_err() {
                        writing = false;
                        let _ = write.shutdown().await;
                    }
                    sent += data.len() as u64;
                }
                Some(agent::carry_response::Message::Close(_)) if writing => {
                    writing = false;
                    let _ = write.shutdown().await;
                }
                _ => {}
            }
        }
        if writing {
            let _ = write.shutdown().await;
        }
        sent
    };
    let down = async move {
        let mut received = 0u64;
        let mut buf = vec![0u8; PIECE];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    received += n as u64;
                    let data = message(agent::carry_request::Message::Data(buf[..n].to_vec()));
                    if tx.send(data).await.is_err() {
                        return received;
                    }
                }
            }
        }
        let _ = tx.send(message(agent::carry_request::Message::Close(agent::CarryClose {}))).await;
        received
    };
    tokio::join!(up, down)
}
