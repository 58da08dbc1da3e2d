//! The driver's handle for appending to one run's log under one epoch.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Mutex;

use crate::metrics::{self, FencedWrite};

use super::{Epoch, Error, EventLog, NewChunk, Offset, Result, RunKey};

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
///
/// Metrics: each append that reaches the store is timed
/// (`sandhold_event_log_append_seconds`) and a store refusal counts as a
/// fencing refusal (`sandhold_fencing_refusals_total{write="append"}`);
/// latched refusals after it do not count again.
pub struct LogWriter {
    log: Arc<dyn EventLog>,
    run: RunKey,
    epoch: Epoch,
    /// `Some(current epoch)` once refused.
    fenced_by: Mutex<Option<Epoch>>,
}

impl LogWriter {
    pub fn new(log: Arc<dyn EventLog>, run: RunKey, epoch: Epoch) -> Self {
        Self { log, run, epoch, fenced_by: Mutex::new(None) }
    }

    pub fn run(&self) -> &RunKey {
        &self.run
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// True once an append was refused because the run was claimed again.
    pub async fn is_fenced(&self) -> bool {
        self.fenced_by.lock().await.is_some()
    }

    /// Append a batch (see [`EventLog::append`]): one span per batch.
    #[tracing::instrument(name = "store.append", skip_all, fields(chunks = chunks.len(), epoch = self.epoch))]
    pub async fn append(&self, chunks: &[NewChunk]) -> Result<Vec<Offset>> {
        let mut fenced_by = self.fenced_by.lock().await;
        if let Some(current) = *fenced_by {
            return Err(Error::Fenced { run: self.run.run.to_string(), held: self.epoch, current });
        }
        let began = Instant::now();
        let result = self.log.append(&self.run, self.epoch, chunks).await;
        metrics::event_log().observe_append(began.elapsed());
        if let Err(Error::Fenced { current, .. }) = &result {
            metrics::fencing().refused(FencedWrite::Append);
            *fenced_by = Some(*current);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{registry, sample};
    use crate::store::{FIRST_EPOCH, NewChunk, NewRun, RunFinish, RunStatus, Stores, Timestamp};

    fn value(series: &str) -> f64 {
        let text = registry().encode();
        sample(&text, series).unwrap_or_else(|| panic!("{series} missing in:\n{text}"))
    }

    #[tokio::test]
    async fn appends_are_timed_and_refusals_counted() {
        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(&crate::store::default_database_url(dir.path())).await.unwrap();
        let new = NewRun::bare(crate::store::RunId::parse("metrics-run").unwrap(), "acme", "t");
        let run = new.key();
        stores.runs.create_or_resume(new).await.unwrap();
        assert_eq!(
            stores.count_unfinished_runs().await.unwrap(),
            [(RunStatus::Running, 1), (RunStatus::Interrupted, 0)]
        );

        // Other tests of this binary record concurrently: compare lower bounds.
        let appends = "sandhold_event_log_append_seconds_count";
        let refused_appends = "sandhold_fencing_refusals_total{write=\"append\"}";
        let refused_finishes = "sandhold_fencing_refusals_total{write=\"finish\"}";
        let (appends_before, append_refusals_before, finish_refusals_before) =
            (value(appends), value(refused_appends), value(refused_finishes));

        let writer = LogWriter::new(stores.events.clone(), run.clone(), FIRST_EPOCH);
        writer.append(&[NewChunk::new("k", b"1".to_vec())]).await.unwrap();
        writer.append(&[NewChunk::new("k", b"2".to_vec())]).await.unwrap();
        assert!(value(appends) >= appends_before + 2.0);

        stores.runs.claim(&run).await.unwrap();
        assert!(matches!(
            writer.append(&[NewChunk::new("k", b"3".to_vec())]).await,
            Err(Error::Fenced { .. })
        ));
        assert!(value(refused_appends) > append_refusals_before);
        let finish = RunFinish {
            session_id: None,
            status: RunStatus::Completed,
            error: None,
            usage: None,
            finished_at: Timestamp::now(),
        };
        let refused = stores.runs.finish(&run, FIRST_EPOCH, finish).await;
        assert!(matches!(refused, Err(Error::Fenced { .. })), "{refused:?}");
        assert!(value(refused_finishes) > finish_refusals_before);
        stores.close().await;
    }
}
