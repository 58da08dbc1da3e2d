//! The driver's handle for appending to one run's log under one epoch.

use std::sync::Arc;

use tokio::sync::Mutex;

use super::{Epoch, Error, EventLog, NewChunk, Offset, Result, RunId};

/// Appends to one run's log as the driver holding `epoch`.
///
/// Latched: the first [`Error::Fenced`] shuts this writer for good, and later
/// appends fail without reaching the store. The store alone would refuse them
/// too (epochs never decrease), so the latch saves round trips and makes the
/// refusal visible ([`LogWriter::is_fenced`]); it is not what makes the fence
/// hold. To write again a driver claims the run and makes a new writer with
/// the new epoch.
///
/// Appends through one writer are serialized, so concurrent callers cannot
/// reorder batches.
pub struct LogWriter {
    log: Arc<dyn EventLog>,
    run: RunId,
    epoch: Epoch,
    /// `Some(current epoch)` once refused.
    fenced_by: Mutex<Option<Epoch>>,
}

impl LogWriter {
    pub fn new(log: Arc<dyn EventLog>, run: RunId, epoch: Epoch) -> Self {
        Self { log, run, epoch, fenced_by: Mutex::new(None) }
    }

    pub fn run(&self) -> &RunId {
        &self.run
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// True once an append was refused because the run was claimed again.
    pub async fn is_fenced(&self) -> bool {
        self.fenced_by.lock().await.is_some()
    }

    /// Append a batch (see [`EventLog::append`]).
    pub async fn append(&self, chunks: &[NewChunk]) -> Result<Vec<Offset>> {
        let mut fenced_by = self.fenced_by.lock().await;
        if let Some(current) = *fenced_by {
            return Err(Error::Fenced { run: self.run.to_string(), held: self.epoch, current });
        }
        let result = self.log.append(&self.run, self.epoch, chunks).await;
        if let Err(Error::Fenced { current, .. }) = &result {
            *fenced_by = Some(*current);
        }
        result
    }
}
