//! Tailing reads: page through a run's log and wait for wake-ups between
//! pages. Both backends share this; they differ in where wake-ups come from
//! (in-process sends; PostgreSQL adds LISTEN/NOTIFY from other processes).
//! Data always comes from the table, a wake-up only says "look again".

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::{ChunkStream, Offset, Result, RunKey, StoredChunk};

/// Rows fetched per query; a tailer far behind catches up page by page.
/// A reader that reads nothing holds one page: with 200 such attaches on a
/// log of 4 KB chunks, 512 rows held 2 MiB each (over 500 MiB in all).
const PAGE_SIZE: i64 = 64;

#[derive(Debug, Clone)]
pub(super) enum Wake {
    /// Something was appended to this run's log, or it was closed (the
    /// run's [`RunKey::encode`]).
    Run(Arc<str>),
    /// Wake-ups may have been missed (listener reconnected): everyone looks.
    All,
}

pub(super) type Wakes = broadcast::Sender<Wake>;

pub(super) fn wakes() -> Wakes {
    // A slow tailer that falls behind gets `Lagged`, which wakes it anyway.
    broadcast::channel(1024).0
}

pub(super) fn wake_run(wakes: &Wakes, run: &RunKey) {
    // No receivers is fine: nobody is tailing.
    let _ = wakes.send(Wake::Run(Arc::from(run.encode())));
}

/// The two queries a tail needs.
#[async_trait]
pub(super) trait LogPages: Send + Sync + 'static {
    /// [`super::Error::NotFound`] for an unknown run.
    async fn log_closed(&self, run: &RunKey) -> Result<bool>;

    /// Chunks with `seq > after_seq`, in order, at most `limit`.
    async fn page_after(&self, run: &RunKey, after_seq: i64, limit: i64) -> Result<Vec<StoredChunk>>;
}

/// Stream the log after `after`, then follow it until it is closed.
pub(super) fn follow(
    pages: Arc<dyn LogPages>,
    wakes: &Wakes,
    run: RunKey,
    after: Offset,
    poll_interval: Duration,
) -> ChunkStream {
    // Subscribe before the first query: an append that commits after the
    // query has a wake-up waiting for us.
    let mut wake_rx = wakes.subscribe();
    let woken_by = run.encode();
    Box::pin(async_stream::try_stream! {
        let mut cursor = after.seq();
        loop {
            // Closed first, rows second: appends after close are refused, so
            // rows read after seeing `closed` are the whole log.
            let closed = pages.log_closed(&run).await?;
            let page = pages.page_after(&run, cursor, PAGE_SIZE).await?;
            let full_page = page.len() as i64 == PAGE_SIZE;
            for chunk in page {
                cursor = chunk.offset.seq();
                yield chunk;
            }
            if full_page {
                continue;
            }
            if closed {
                break;
            }
            wait_for_wake(&mut wake_rx, &woken_by, poll_interval).await;
        }
    })
}

async fn wait_for_wake(wake_rx: &mut broadcast::Receiver<Wake>, run: &str, poll_interval: Duration) {
    use broadcast::error::RecvError;
    let poll = tokio::time::sleep(poll_interval);
    tokio::pin!(poll);
    loop {
        tokio::select! {
            () = &mut poll => return,
            wake = wake_rx.recv() => match wake {
                Ok(Wake::Run(woken)) if &*woken == run => return,
                Ok(Wake::Run(_)) => {}
                Ok(Wake::All) | Err(RecvError::Lagged(_)) => return,
                Err(RecvError::Closed) => {
                    poll.as_mut().await;
                    return;
                }
            },
        }
    }
}
