//! The progress stream of one `EnsureSandbox`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use shared::proto::v1::{EnsurePhase, EnsureProgress, EnsureSandboxResponse, ensure_sandbox_response};
use tokio::sync::mpsc;

/// The longest output line a progress event carries; setup cuts longer
/// ones and says how much it cut.
pub const MAX_OUTPUT_LINE: usize = 8 * 1024;

/// How many progress events wait for a client that reads more slowly than
/// the ensure writes them. With setup lines cut at
/// [`MAX_OUTPUT_LINE`] bytes this bounds what one ensure keeps
/// for its client.
pub const PROGRESS_BUFFER: usize = 256;

/// Sends progress events in order. A client that went away does not stop
/// the ensure (a half-made sandbox must still be finished or cleaned up):
/// sends to a closed stream are dropped. A slow client never stalls a setup
/// step either: the buffer is bounded, and the events a full buffer cannot
/// take are coalesced into one note saying how many were dropped, sent as
/// soon as there is room again (at the latest just before the outcome).
#[derive(Clone)]
pub struct Progress {
    send: Option<Arc<dyn Fn(EnsureSandboxResponse) + Send + Sync>>,
    started: Instant,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").field("listened", &self.send.is_some()).finish_non_exhaustive()
    }
}

impl Progress {
    /// Progress sent as the `Ok` items of a bounded stream
    /// ([`PROGRESS_BUFFER`] events) whose last item, the ensure's outcome,
    /// may be an error of the caller's kind. The returned [`Outcome`] sends
    /// that last item after the progress. The stream ends when the outcome
    /// is sent and the `Progress` (and its clones) are dropped.
    pub fn channel<E: Send + 'static>() -> (Self, Outcome<E>, mpsc::Receiver<Result<EnsureSandboxResponse, E>>)
    {
        let (tx, rx) = mpsc::channel(PROGRESS_BUFFER);
        let dropped = Arc::new(Mutex::new(Dropped::default()));
        let outcome = Outcome { tx: tx.clone(), dropped: dropped.clone() };
        (Self::new(tx, dropped), outcome, rx)
    }

    fn new<E: Send + 'static>(
        tx: mpsc::Sender<Result<EnsureSandboxResponse, E>>,
        dropped: Arc<Mutex<Dropped>>,
    ) -> Self {
        let send = move |response: EnsureSandboxResponse| {
            let phase = match &response.event {
                Some(ensure_sandbox_response::Event::Progress(p)) => p.phase,
                _ => EnsurePhase::Unspecified as i32,
            };
            let mut dropped = lock(&dropped);
            if dropped.count > 0 {
                if tx.try_send(Ok(dropped_note(dropped.count, phase))).is_err() {
                    dropped.count += 1;
                    dropped.phase = phase;
                    return;
                }
                dropped.count = 0;
            }
            if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(Ok(response)) {
                dropped.count += 1;
                dropped.phase = phase;
            }
        };
        Self { send: Some(Arc::new(send)), started: Instant::now() }
    }

    /// Progress nobody listens to (internal ensures, benchmarks).
    pub fn discard() -> Self {
        Self { send: None, started: Instant::now() }
    }

    pub fn send(&self, mut event: EnsureProgress) {
        event.elapsed_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Some(send) = &self.send {
            send(EnsureSandboxResponse { event: Some(ensure_sandbox_response::Event::Progress(event)) });
        }
    }

    pub fn phase(&self, phase: EnsurePhase, message: impl Into<String>) {
        self.send(EnsureProgress { phase: phase as i32, message: message.into(), ..Default::default() });
    }

    /// A warning the client shows as is, once.
    pub fn warning(&self, phase: EnsurePhase, warning: impl Into<String>) {
        self.send(EnsureProgress { phase: phase as i32, warning: warning.into(), ..Default::default() });
    }
}

/// Where an ensure's outcome goes, after its progress.
pub struct Outcome<E> {
    tx: mpsc::Sender<Result<EnsureSandboxResponse, E>>,
    dropped: Arc<Mutex<Dropped>>,
}

impl<E> Outcome<E> {
    /// Sends the ensure's last item, waiting for room: first the note of
    /// events dropped since the last note (a client must learn what it
    /// missed even when no progress followed the gap), then `last`. Neither
    /// is ever dropped. `Err` when the client is gone.
    pub async fn send(self, last: Result<EnsureSandboxResponse, E>) -> Result<(), ()> {
        let pending = std::mem::take(&mut *lock(&self.dropped));
        if pending.count > 0 {
            self.tx.send(Ok(dropped_note(pending.count, pending.phase))).await.map_err(|_| ())?;
        }
        self.tx.send(last).await.map_err(|_| ())
    }
}

/// Events a full buffer could not take since the last note, and the phase
/// of the last of them.
#[derive(Default)]
struct Dropped {
    count: u64,
    phase: i32,
}

fn lock(dropped: &Mutex<Dropped>) -> std::sync::MutexGuard<'_, Dropped> {
    dropped.lock().unwrap_or_else(|e| e.into_inner())
}

fn dropped_note(dropped: u64, phase: i32) -> EnsureSandboxResponse {
    let message =
        format!("{dropped} progress events dropped: the client read more slowly than the sandbox wrote");
    EnsureSandboxResponse {
        event: Some(ensure_sandbox_response::Event::Progress(EnsureProgress {
            phase,
            message,
            ..Default::default()
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(p: &Progress, n: usize) {
        p.send(EnsureProgress {
            phase: EnsurePhase::Setup as i32,
            output_line: n.to_string(),
            ..Default::default()
        });
    }

    fn progress(item: Result<EnsureSandboxResponse, ()>) -> EnsureProgress {
        match item.unwrap().event {
            Some(ensure_sandbox_response::Event::Progress(p)) => p,
            other => panic!("not progress: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_client_that_reads_nothing_holds_a_bounded_buffer_and_is_told_what_it_missed() {
        let (p, tx, mut rx) = Progress::channel::<()>();
        for n in 0..PROGRESS_BUFFER * 4 {
            line(&p, n);
        }
        // The buffer is full with the first events; nothing more was kept.
        assert_eq!(rx.len(), PROGRESS_BUFFER);
        let first: Vec<String> =
            (0..PROGRESS_BUFFER).map(|_| progress(rx.try_recv().unwrap()).output_line).collect();
        assert_eq!(first, (0..PROGRESS_BUFFER).map(|n| n.to_string()).collect::<Vec<_>>());
        assert!(rx.try_recv().is_err());
        // With room again, the next event follows a note counting the gap.
        line(&p, 9999);
        let note = progress(rx.try_recv().unwrap());
        assert!(
            note.message.starts_with(&format!("{} progress events dropped", PROGRESS_BUFFER * 3)),
            "{note:?}"
        );
        assert_eq!(note.phase, EnsurePhase::Setup as i32);
        assert_eq!(progress(rx.try_recv().unwrap()).output_line, "9999");
        // The outcome waits for room and is never dropped; the events dropped
        // since the last note, with no progress after them to carry their
        // note, are counted in a note just before it.
        for n in 0..PROGRESS_BUFFER + 5 {
            line(&p, n);
        }
        drop(p);
        let outcome = tokio::spawn(async move { tx.send(Err(())).await.is_ok() });
        for _ in 0..PROGRESS_BUFFER {
            progress(rx.recv().await.unwrap());
        }
        let note = progress(rx.recv().await.unwrap());
        assert!(note.message.starts_with("5 progress events dropped"), "{note:?}");
        assert_eq!(note.phase, EnsurePhase::Setup as i32);
        assert_eq!(rx.recv().await.unwrap(), Err(()));
        assert!(outcome.await.unwrap());
        assert!(rx.recv().await.is_none(), "the stream ends after the outcome");
    }
}
