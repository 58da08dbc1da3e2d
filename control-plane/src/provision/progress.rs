//! The progress stream of one `EnsureSandbox`.

use std::time::Instant;

use shared::proto::v1::{EnsurePhase, EnsureProgress, EnsureSandboxResponse, ensure_sandbox_response};
use tokio::sync::mpsc;

pub type EnsureItem = Result<EnsureSandboxResponse, shared::error::Error>;

/// Sends progress events in order. A client that went away does not stop
/// the ensure (a half-made sandbox must still be finished or cleaned up):
/// sends to a closed stream are dropped. Unbounded so a slow client never
/// stalls a setup step; an ensure emits a bounded number of lines per step.
#[derive(Debug, Clone)]
pub struct Progress {
    tx: Option<mpsc::UnboundedSender<EnsureItem>>,
    started: Instant,
}

impl Progress {
    pub fn new(tx: mpsc::UnboundedSender<EnsureItem>) -> Self {
        Self { tx: Some(tx), started: Instant::now() }
    }

    /// Progress nobody listens to (internal ensures, benchmarks).
    pub fn discard() -> Self {
        Self { tx: None, started: Instant::now() }
    }

    pub fn send(&self, mut event: EnsureProgress) {
        event.elapsed_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Some(tx) = &self.tx {
            let _ = tx.send(Ok(EnsureSandboxResponse {
                event: Some(ensure_sandbox_response::Event::Progress(event)),
            }));
        }
    }

    pub fn phase(&self, phase: EnsurePhase, message: impl Into<String>) {
        self.send(EnsureProgress { phase: phase as i32, message: message.into(), ..Default::default() });
    }
}
