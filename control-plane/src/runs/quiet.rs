//! The quiescence gate of a takeover: wait for a run's stored log to stop
//! growing before reading it and driving on.
//!
//! The reference waits like this because its fence is not atomic: the old
//! driver may still land a write after the successor's claim. Here appends
//! are fenced atomically against the claim (see
//! [`EventLog::append`](crate::store::EventLog::append)), so nothing of the
//! old driver can land once the claim committed and the default window is 0
//! (no wait). Deployments that want the extra margin set a window; the wait
//! is bounded, so a log that keeps growing fails the takeover instead of
//! holding it forever.

use futures::StreamExt;
use tokio::time::Instant;

use super::Error;
pub use crate::config::QuietGate;
use crate::store::{EventLog, Offset, RunKey};

impl QuietGate {
    /// Wait until `run`'s log gained nothing for [`QuietGate::window`];
    /// returns how many chunks landed meanwhile. A closed log is quiet. A log
    /// still growing after [`QuietGate::max_wait`] is `CLAIM_LOST`: another
    /// writer is appending, and driving on would interleave with it.
    pub async fn wait(&self, events: &dyn EventLog, run: &RunKey) -> Result<u64, Error> {
        if self.window.is_zero() {
            return Ok(0);
        }
        let started = Instant::now();
        let give_up = started + self.max_wait;
        let last = events.last(run).await?.map_or(Offset::start(), |c| c.offset);
        let mut tail = events.read(run, &last).await?;
        let mut grew = 0u64;
        loop {
            let quiet_until = Instant::now() + self.window;
            if quiet_until > give_up {
                return Err(Error::StillWritten {
                    run: run.run.clone(),
                    elapsed_ms: started.elapsed().as_millis(),
                    grew,
                });
            }
            match tokio::time::timeout_at(quiet_until, tail.next()).await {
                Err(_) | Ok(None) => return Ok(grew),
                Ok(Some(Ok(_))) => grew += 1,
                Ok(Some(Err(e))) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use shared::error::{Error as WireError, ErrorCode};

    use super::*;
    use crate::store::{FIRST_EPOCH, NewChunk, NewRun, RunId, Stores, Tenant};

    fn key(run: &str) -> RunKey {
        RunKey::new(Tenant::new("acme"), RunId::parse(run).unwrap())
    }

    async fn stores_with_run(dir: &std::path::Path, run: &RunKey) -> Stores {
        let stores = Stores::open(&crate::store::default_database_url(dir)).await.unwrap();
        stores.runs.create_or_resume(NewRun::bare(run.run.clone(), run.tenant.as_str(), "t")).await.unwrap();
        stores
    }

    fn gate(window_ms: u64, max_ms: u64) -> QuietGate {
        QuietGate { window: Duration::from_millis(window_ms), max_wait: Duration::from_millis(max_ms) }
    }

    /// Appends one chunk every `every` until `count` landed, as another
    /// writer of the run's current epoch would.
    fn writer(stores: &Stores, run: &RunKey, every: Duration, count: usize) -> tokio::task::JoinHandle<()> {
        let (events, runs, run) = (stores.events.clone(), stores.runs.clone(), run.clone());
        tokio::spawn(async move {
            for i in 0..count {
                tokio::time::sleep(every).await;
                let epoch = runs.get(&run).await.unwrap().driver_epoch;
                events.append(&run, epoch, &[NewChunk::new("k", format!("{i}").into_bytes())]).await.unwrap();
            }
        })
    }

    #[test]
    fn a_window_needs_a_longer_bound() {
        assert!(QuietGate::default().validate().is_ok());
        assert!(gate(500, 2000).validate().is_ok());
        assert!(gate(500, 500).validate().unwrap_err().contains("--takeover-quiet-max-ms"));
    }

    #[tokio::test]
    async fn a_zero_window_does_not_read_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(&crate::store::default_database_url(dir.path())).await.unwrap();
        // No record at all: a gate that read the log would fail NOT_FOUND.
        let unknown = key("no-such-run");
        assert_eq!(QuietGate::default().wait(stores.events.as_ref(), &unknown).await.unwrap(), 0);
        assert!(gate(50, 500).wait(stores.events.as_ref(), &unknown).await.is_err());
    }

    #[tokio::test]
    async fn waits_out_a_burst_then_returns() {
        let dir = tempfile::tempdir().unwrap();
        let run = key("burst");
        let stores = Arc::new(stores_with_run(dir.path(), &run).await);
        stores.events.append(&run, FIRST_EPOCH, &[NewChunk::new("k", b"before".to_vec())]).await.unwrap();
        // Five chunks 100 ms apart, inside a 1.5 s window: the gate must see
        // every one of them and only return after the burst. (A 400 ms
        // window read a loaded machine's stalled append as quiet.)
        let burst = writer(&stores, &run, Duration::from_millis(100), 5);
        let grew = gate(1_500, 10_000).wait(stores.events.as_ref(), &run).await.unwrap();
        assert!(burst.is_finished(), "the gate returned while the log was still growing");
        assert_eq!(grew, 5);
        assert_eq!(stores.events.snapshot(&run).await.unwrap().chunks.len(), 6);
    }

    #[tokio::test]
    async fn a_log_that_keeps_growing_is_claim_lost() {
        let dir = tempfile::tempdir().unwrap();
        let run = key("endless");
        let stores = stores_with_run(dir.path(), &run).await;
        let endless = writer(&stores, &run, Duration::from_millis(50), 1_000);
        let started = Instant::now();
        // A window of 20 writer intervals: a loaded 2-core machine may stall
        // one append for a few hundred milliseconds, which must not read as
        // quiet (seen failing with a 300 ms window).
        let err = WireError::from(gate(1_000, 3_000).wait(stores.events.as_ref(), &run).await.unwrap_err());
        endless.abort();
        assert_eq!(err.code, ErrorCode::ClaimLost);
        assert!(err.message.contains("kept growing"), "{}", err.message);
        // Bounded: it gave up near max_wait, not after the writer's 50 s.
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_closed_log_is_quiet() {
        let dir = tempfile::tempdir().unwrap();
        let run = key("closed");
        let stores = stores_with_run(dir.path(), &run).await;
        stores.events.close(&run).await.unwrap();
        let gate = gate(60_000, 120_000);
        let wait = gate.wait(stores.events.as_ref(), &run);
        let grew = tokio::time::timeout(Duration::from_secs(20), wait)
            .await
            .expect("a closed log is quiet at once, not after the window")
            .unwrap();
        assert_eq!(grew, 0);
    }
}
