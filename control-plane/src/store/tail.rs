//! Tailing reads: one tail per followed run per store, shared by every
//! stream of that run in this process.
//!
//! A run's tail is a task that starts at the log's end and reads what is
//! appended after it (one query per wake-up: closed? and the next page) into a
//! window of the latest chunks; its followers take their chunks from that
//! window. A follower behind the window (attached at an older offset, or
//! too slow to keep up) pages through the table on its own until it reaches
//! the window, so a slow reader neither holds the others back nor makes the
//! tail keep more. N streams of one run cost one tail's query, not 2N, and
//! one subscriber to the store's wake-ups, not N: with a thousand streams
//! over a hundred runs, per-stream tails read every chunk once per stream
//! and starved the appends of the pool's connections.
//!
//! Both backends share this; they differ in where wake-ups come from
//! (in-process sends; PostgreSQL adds LISTEN/NOTIFY from other processes).
//! A wake-up from the store only says "look again": the tail reads the
//! table. What this process's own committer has just committed to a
//! followed run reaches its tail with the rows themselves ([`Tails::feed`]),
//! after the COMMIT, so the tail takes them as read instead of reading them
//! back (a burst of 200,000 chunks was 3,125 queries of 64 rows). When they
//! do not follow its last row (it fell behind a burst and only the newest
//! were kept for it), the window starts over at them: followers before
//! them page through the table, as followers behind the window always do.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, broadcast, oneshot, watch};
use tokio::time::Instant;

use super::{ChunkStream, Error, Offset, Result, RunKey, StoredChunk};

/// Rows fetched per query; a follower far behind catches up page by page.
/// A reader that reads nothing holds one page: with 200 such attaches on a
/// log of 4 KB chunks, 512 rows held 2 MiB each (over 500 MiB in all).
const PAGE_SIZE: i64 = 64;

/// The most chunks, and bytes of payload, a run's window keeps: a burst of
/// this much between a follower's reads costs it nothing extra. The oldest
/// go first; at least the newest chunk stays, whatever its size.
const WINDOW_ROWS: usize = 4 * PAGE_SIZE as usize;
const WINDOW_BYTES: usize = 1 << 20;

/// In a burst a window holds up to this many chunks (still at most
/// [`WINDOW_BYTES`] of payload), and settles back to [`WINDOW_ROWS`] once
/// it has held more for [`BURST_HOLD`]. One commit of the run's writer
/// can be 4,096 chunks (`runs/coalesce.rs`): a window of 256 put every
/// follower behind each such commit, paging 64 rows a query, and the
/// follower, not the writer, set the durable stream's pace. A run at a
/// model's pace never leaves the steady bound, so many runs' windows cost
/// what they did.
const BURST_ROWS: usize = 8192;
const BURST_HOLD: Duration = Duration::from_secs(1);

/// Consecutive failed reads of the database (unavailable: a pool timeout,
/// a dropped connection, a connection refused while it restarts) a tail
/// retries, one poll interval apart, before its followers get the error.
const TAIL_RETRIES: u32 = 10;

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
    // The tails' one dispatcher reads these; if it falls behind it gets
    // `Lagged`, which wakes every tail.
    broadcast::channel(1024).0
}

pub(super) fn wake_run(wakes: &Wakes, run: &RunKey) {
    // No receivers is fine: nobody is tailing.
    let _ = wakes.send(Wake::Run(Arc::from(run.encode())));
}

/// The queries a tail needs.
#[async_trait]
pub(super) trait LogPages: Send + Sync + 'static {
    /// Chunks with `seq > after_seq`, in order, at most `limit` (none for an
    /// unknown run).
    async fn page_after(&self, run: &RunKey, after_seq: i64, limit: i64) -> Result<Vec<StoredChunk>>;

    /// Whether the log is closed, and the sequence number of its last
    /// chunk (0 for an empty log), read together.
    async fn log_end(&self, run: &RunKey) -> Result<(bool, i64)>;

    /// Whether the log is closed, and [`LogPages::page_after`], read in one
    /// statement (one snapshot): when it says closed, the page reaches the
    /// log's end or is full; [`super::Error::NotFound`] for an unknown run.
    async fn closed_and_page_after(
        &self,
        run: &RunKey,
        after_seq: i64,
        limit: i64,
    ) -> Result<(bool, Vec<StoredChunk>)>;
}

/// The tails of one store.
#[derive(Clone)]
pub(super) struct Tails {
    shared: Arc<Shared>,
}

struct Shared {
    runs: Mutex<HashMap<Arc<str>, Entry>>,
    poll_interval: Duration,
}

struct Entry {
    tail: Weak<RunTail>,
    signal: Arc<Signal>,
}

/// How a run's tail is woken: to look at the log again, or with rows this
/// process committed to it.
#[derive(Default)]
struct Signal {
    notify: Notify,
    news: Mutex<News>,
}

#[derive(Default)]
struct News {
    /// Committed by this process, in commit order, not yet taken: the
    /// newest, at most what a window holds in a burst (older ones would
    /// leave the window as soon as they entered it).
    committed: Newest,
    /// The log may hold what `committed` does not show: read the table.
    look: bool,
}

/// The newest chunks of a run, oldest first, and their bytes of payload.
#[derive(Default)]
struct Newest {
    chunks: VecDeque<StoredChunk>,
    bytes: usize,
}

impl Newest {
    fn push(&mut self, chunks: Vec<StoredChunk>) {
        self.bytes += chunks.iter().map(|chunk| chunk.payload.len()).sum::<usize>();
        if self.chunks.is_empty() {
            // Taken as they are (a commit's rows into news just taken): not
            // copied into a queue grown from nothing.
            self.chunks = VecDeque::from(chunks);
        } else {
            self.chunks.extend(chunks);
        }
    }

    /// Drop the oldest past `rows` or [`WINDOW_BYTES`] (the newest always
    /// stays); the sequence number of the last dropped.
    fn keep(&mut self, rows: usize) -> Option<i64> {
        let mut dropped = None;
        while self.chunks.len() > 1 && (self.chunks.len() > rows || self.bytes > WINDOW_BYTES) {
            let oldest = self.chunks.pop_front().expect("more than one chunk");
            self.bytes -= oldest.payload.len();
            dropped = Some(oldest.offset.seq());
        }
        dropped
    }
}

impl Signal {
    fn look(&self) {
        self.news.lock().unwrap_or_else(|e| e.into_inner()).look = true;
        self.notify.notify_one();
    }

    fn committed(&self, chunks: Vec<StoredChunk>) {
        let mut news = self.news.lock().unwrap_or_else(|e| e.into_inner());
        news.committed.push(chunks);
        news.committed.keep(BURST_ROWS);
        drop(news);
        self.notify.notify_one();
    }

    fn take(&self) -> News {
        std::mem::take(&mut *self.news.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Of `committed`, the rows after `cursor` (the window's last row) that
/// follow one another up to the newest, and whether they skip rows after
/// `cursor` (which the table has). Rows at or before `cursor` were read
/// already.
fn news_after(cursor: i64, committed: VecDeque<StoredChunk>) -> (Vec<StoredChunk>, bool) {
    let mut rows: Vec<StoredChunk> =
        committed.into_iter().filter(|chunk| chunk.offset.seq() > cursor).collect();
    let run_starts = rows.windows(2).rposition(|pair| pair[1].offset.seq() != pair[0].offset.seq() + 1);
    if let Some(before) = run_starts {
        rows.drain(..=before);
    }
    let skips = rows.first().is_some_and(|first| first.offset.seq() != cursor + 1);
    (rows, skips)
}

/// What the followers of one run hold; when the last lets go, the tail
/// task stops and the entry goes.
struct RunTail {
    key: Arc<str>,
    window: watch::Receiver<Window>,
    shared: Weak<Shared>,
    /// Dropped with this: the tail task's signal to stop.
    _stop: oneshot::Sender<()>,
}

impl Drop for RunTail {
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else { return };
        let mut runs = shared.runs.lock().unwrap_or_else(|e| e.into_inner());
        // A follower may have replaced this entry with a new tail already.
        if runs.get(&self.key).is_some_and(|entry| entry.tail.strong_count() == 0) {
            runs.remove(&self.key);
        }
    }
}

/// The latest chunks of a run as its tail has read them.
#[derive(Default)]
struct Window {
    /// Set once the tail has read where the log ends: the sequence number
    /// `newest` follows. A follower at or past it reads from the window.
    base: Option<i64>,
    /// Contiguous, in order: every chunk after `base` the tail has read.
    newest: Newest,
    /// The log is closed and `newest` reaches its end.
    closed: bool,
    /// The tail gave up: what its followers get.
    failed: Option<Failure>,
}

#[derive(Clone)]
enum Failure {
    NotFound(String),
    Unavailable(String),
}

impl Failure {
    fn of(error: &Error) -> Self {
        match error {
            Error::NotFound(what) => Self::NotFound(what.clone()),
            other => Self::Unavailable(format!("following the log: {other}")),
        }
    }

    fn error(&self) -> Error {
        match self {
            Self::NotFound(what) => Error::NotFound(what.clone()),
            Self::Unavailable(message) => Error::Unavailable(message.clone()),
        }
    }
}

/// What a follower at some position does next.
enum Next {
    /// These chunks, the next ones after its position.
    Chunks(Vec<StoredChunk>),
    /// Its position is before the window: it pages on its own.
    Behind,
    /// Nothing after its position yet.
    Wait,
    /// The log is closed and it has read to the end.
    End,
    Failed(Error),
}

impl Window {
    fn next(&self, cursor: i64) -> Next {
        if let Some(failure) = &self.failed {
            return Next::Failed(failure.error());
        }
        let Some(base) = self.base else { return Next::Wait };
        if cursor < base {
            return Next::Behind;
        }
        let newest = &self.newest.chunks;
        let start = newest.partition_point(|chunk| chunk.offset.seq() <= cursor);
        let chunks: Vec<StoredChunk> = newest.range(start..).take(PAGE_SIZE as usize).cloned().collect();
        match (chunks.is_empty(), self.closed) {
            (false, _) => Next::Chunks(chunks),
            (true, true) => Next::End,
            (true, false) => Next::Wait,
        }
    }

    /// The window starts over after `base`: what it held is no longer the
    /// chunks right before those that follow.
    fn restart(&mut self, base: i64) {
        self.newest = Newest::default();
        self.base = Some(base);
    }

    fn push(&mut self, page: Vec<StoredChunk>) {
        self.newest.push(page);
        self.keep(BURST_ROWS);
    }

    /// Back to the steady bound after a burst.
    fn settle(&mut self) {
        self.keep(WINDOW_ROWS);
    }

    /// Drop the oldest chunks past `rows` or [`WINDOW_BYTES`]; the window
    /// then starts after the last dropped.
    fn keep(&mut self, rows: usize) {
        if let Some(dropped) = self.newest.keep(rows) {
            self.base = Some(dropped);
        }
    }

    /// More than the steady bound: a burst's, until the tail settles it.
    fn bursting(&self) -> bool {
        self.newest.chunks.len() > WINDOW_ROWS
    }
}

impl Tails {
    /// Tails woken by `wakes`, each also looking every `poll_interval`
    /// (appends of other processes a wake-up does not reach).
    pub(super) fn new(wakes: &Wakes, poll_interval: Duration) -> Self {
        let shared = Arc::new(Shared { runs: Mutex::new(HashMap::new()), poll_interval });
        tokio::spawn(dispatch(wakes.subscribe(), Arc::downgrade(&shared)));
        Self { shared }
    }

    /// Stream the log after `after`, then follow it until it is closed.
    pub(super) fn follow(&self, pages: Arc<dyn LogPages>, run: RunKey, after: Offset) -> ChunkStream {
        let tail = self.attach(&pages, &run);
        let poll_interval = self.shared.poll_interval;
        Box::pin(async_stream::try_stream! {
            let mut window = tail.window.clone();
            let mut cursor = after.seq();
            loop {
                let next = window.borrow_and_update().next(cursor);
                match next {
                    Next::Chunks(chunks) => {
                        for chunk in chunks {
                            cursor = chunk.offset.seq();
                            yield chunk;
                        }
                    }
                    Next::Behind => {
                        let page = page_behind(pages.as_ref(), &run, cursor, poll_interval).await?;
                        if page.is_empty() {
                            // Rows the tail read after this position are gone.
                            Err(Error::Corrupt(format!(
                                "the log of run {} has no chunks after {cursor} though its tail read some",
                                run.run
                            )))?;
                        }
                        for chunk in page {
                            cursor = chunk.offset.seq();
                            yield chunk;
                        }
                    }
                    Next::Wait => {
                        if window.changed().await.is_err()
                            && matches!(window.borrow().next(cursor), Next::Wait)
                        {
                            Err(Error::Unavailable(format!("the tail of run {} stopped", run.run)))?;
                        }
                    }
                    Next::End => break,
                    Next::Failed(error) => Err(error)?,
                }
            }
            drop(tail);
        })
    }

    /// The run's tail, started if it has none (or its last one failed).
    fn attach(&self, pages: &Arc<dyn LogPages>, run: &RunKey) -> Arc<RunTail> {
        let key: Arc<str> = Arc::from(run.encode());
        // Declared before the lock: a tail upgraded here and then dropped
        // (its last follower left meanwhile) runs its `Drop`, which takes
        // the lock, only after the guard is gone.
        let current: Option<Arc<RunTail>>;
        let mut runs = self.shared.runs.lock().unwrap_or_else(|e| e.into_inner());
        current = runs.get(&key).and_then(|entry| entry.tail.upgrade());
        if let Some(tail) = &current
            && tail.window.borrow().failed.is_none()
        {
            return tail.clone();
        }
        let signal = Arc::new(Signal::default());
        let (window_tx, window_rx) = watch::channel(Window::default());
        let (stop_tx, stop_rx) = oneshot::channel();
        let tail = Arc::new(RunTail {
            key: key.clone(),
            window: window_rx,
            shared: Arc::downgrade(&self.shared),
            _stop: stop_tx,
        });
        runs.insert(key, Entry { tail: Arc::downgrade(&tail), signal: signal.clone() });
        drop(runs);
        tokio::spawn(run_tail(
            pages.clone(),
            run.clone(),
            window_tx,
            signal,
            stop_rx,
            self.shared.poll_interval,
        ));
        tail
    }

    /// `run`'s rows this process just committed (after the COMMIT), in
    /// order: given to its tail, if it has one (`chunks` is called only
    /// then), as news it need not read back.
    pub(super) fn feed(&self, run: &RunKey, chunks: impl FnOnce() -> Vec<StoredChunk>) {
        let signal = {
            let runs = self.shared.runs.lock().unwrap_or_else(|e| e.into_inner());
            // Most commits have no tail in this process: no key to make.
            if runs.is_empty() {
                return;
            }
            match runs.get(run.encode().as_str()) {
                Some(entry) => entry.signal.clone(),
                None => return,
            }
        };
        signal.committed(chunks());
    }

    /// How many chunks `run`'s window holds now.
    #[cfg(test)]
    fn window_len(&self, run: &RunKey) -> Option<usize> {
        let runs = self.shared.runs.lock().unwrap();
        let tail = runs.get(run.encode().as_str())?.tail.upgrade()?;
        let len = tail.window.borrow().newest.chunks.len();
        Some(len)
    }

    #[cfg(test)]
    fn tailed_runs(&self) -> usize {
        self.shared.runs.lock().unwrap().len()
    }
}

impl Shared {
    /// Wake the tail of `run`, or every tail.
    fn wake(&self, run: Option<&str>) {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        match run {
            Some(run) => {
                if let Some(entry) = runs.get(run) {
                    entry.signal.look();
                }
            }
            None => runs.values().for_each(|entry| entry.signal.look()),
        }
    }
}

/// The store's wake-ups, routed to the tails they concern.
async fn dispatch(mut wakes: broadcast::Receiver<Wake>, shared: Weak<Shared>) {
    use broadcast::error::RecvError;
    loop {
        let wake = wakes.recv().await;
        let Some(shared) = shared.upgrade() else { return };
        match wake {
            Ok(Wake::Run(run)) => shared.wake(Some(&run)),
            Ok(Wake::All) | Err(RecvError::Lagged(_)) => shared.wake(None),
            Err(RecvError::Closed) => return,
        }
    }
}

/// One read of a tail.
enum Read {
    /// Where the log ends: the tail's first read.
    End(i64),
    /// The chunks after the tail's position.
    Page(Vec<StoredChunk>),
}

/// One run's tail: from the log's end, read what is appended into the
/// window, until the log is closed or nobody follows it. Rows this
/// process committed arrive with their wake-up and go into the window as
/// they are when they follow its last; anything else reads the table.
async fn run_tail(
    pages: Arc<dyn LogPages>,
    run: RunKey,
    window: watch::Sender<Window>,
    signal: Arc<Signal>,
    mut stop: oneshot::Receiver<()>,
    poll_interval: Duration,
) {
    let mut cursor: Option<i64> = None;
    let mut failures = 0;
    let mut look = true;
    let mut settle_at: Option<Instant> = None;
    loop {
        if look || cursor.is_none() {
            // One statement: when it says closed, no append can follow the
            // rows it returned.
            let read = async {
                Ok::<_, Error>(match cursor {
                    None => {
                        let (closed, end) = pages.log_end(&run).await?;
                        (closed, Read::End(end))
                    }
                    Some(after) => {
                        let (closed, page) = pages.closed_and_page_after(&run, after, PAGE_SIZE).await?;
                        (closed, Read::Page(page))
                    }
                })
            };
            let read = tokio::select! {
                _ = &mut stop => return,
                read = read => read,
            };
            match read {
                Ok((closed, read)) => {
                    failures = 0;
                    let full = matches!(&read, Read::Page(page) if page.len() as i64 == PAGE_SIZE);
                    let done = closed && !full;
                    window.send_if_modified(|window| {
                        let grew = match read {
                            Read::End(end) => {
                                window.base = Some(end);
                                cursor = Some(end);
                                true
                            }
                            Read::Page(page) => match page.last() {
                                Some(last) => {
                                    cursor = Some(last.offset.seq());
                                    window.push(page);
                                    true
                                }
                                None => false,
                            },
                        };
                        window.closed = done;
                        grew || done
                    });
                    if done {
                        return;
                    }
                    // A full page: there may be more; read on.
                    look = full;
                }
                Err(error) if error.is_transient() && failures < TAIL_RETRIES => {
                    failures += 1;
                    tracing::warn!(run_id = %run.run, %error, failures, "reading the log failed; the tail tries again");
                }
                Err(error) => {
                    window.send_modify(|window| window.failed = Some(Failure::of(&error)));
                    return;
                }
            }
            if look && failures == 0 {
                continue;
            }
        }
        if settle_at.is_none() && window.borrow().bursting() {
            settle_at = Some(Instant::now() + BURST_HOLD);
        }
        let settle = async {
            match settle_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            () = signal.notify.notified() => {}
            () = tokio::time::sleep(poll_interval) => look = true,
            () = settle => {
                settle_at = None;
                // Nothing new to read: followers need not wake.
                window.send_if_modified(|window| {
                    window.settle();
                    false
                });
                continue;
            }
        }
        let news = signal.take();
        look |= news.look;
        // Before the log's end is known every row is read from the table.
        if let Some(after) = cursor {
            let (fresh, skips) = news_after(after, news.committed.chunks);
            if let (Some(first), Some(last)) = (fresh.first(), fresh.last()) {
                let restart = skips.then(|| first.offset.seq() - 1);
                cursor = Some(last.offset.seq());
                window.send_modify(|window| {
                    if let Some(base) = restart {
                        window.restart(base);
                    }
                    window.push(fresh);
                });
            }
        }
    }
}

/// A follower's own page after `after`, behind the shared window: retried
/// as the tail's reads are.
async fn page_behind(
    pages: &dyn LogPages,
    run: &RunKey,
    after: i64,
    poll_interval: Duration,
) -> Result<Vec<StoredChunk>> {
    let mut failures = 0;
    loop {
        match pages.closed_and_page_after(run, after, PAGE_SIZE).await {
            Ok((_, page)) => return Ok(page),
            Err(error) if error.is_transient() && failures < TAIL_RETRIES => {
                failures += 1;
                tracing::warn!(run_id = %run.run, %error, failures, "reading the log failed; the follower tries again");
                tokio::time::sleep(poll_interval).await;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::StreamExt;

    use super::*;
    use crate::store::{FIRST_EPOCH, Tenant, Timestamp};
    use shared::ids::RunId;

    /// A log in memory that counts the tails' queries and can fail them.
    #[derive(Default)]
    struct Log {
        chunks: Mutex<Vec<StoredChunk>>,
        closed: Mutex<bool>,
        queries: AtomicUsize,
        /// The next this many queries fail as unavailable.
        failing: AtomicUsize,
        /// The next this many pages from the log's start are refused, as
        /// by a database that takes no connections (only a follower far
        /// behind asks for them: the tail reads on from the log's end).
        refusing_from_the_start: AtomicUsize,
    }

    impl Log {
        fn append(&self, wakes: &Wakes, run: &RunKey, n: usize) {
            self.store(n);
            wake_run(wakes, run);
        }

        /// Append `n` chunks as this process's committer does: no wake-up,
        /// the rows handed to the tail.
        fn commit(&self, tails: &Tails, run: &RunKey, n: usize) {
            let stored = self.store(n);
            tails.feed(run, || stored);
        }

        /// Append `n` chunks, told nobody; what was stored.
        fn store(&self, n: usize) -> Vec<StoredChunk> {
            let mut chunks = self.chunks.lock().unwrap();
            let mut stored = Vec::with_capacity(n);
            for _ in 0..n {
                let seq = chunks.len() as i64 + 1;
                let chunk = StoredChunk {
                    offset: Offset::from_seq(seq).unwrap(),
                    epoch: FIRST_EPOCH,
                    kind: "line".into(),
                    payload: format!("chunk {seq}").into(),
                    appended_at: Timestamp::now(),
                };
                chunks.push(chunk.clone());
                stored.push(chunk);
            }
            stored
        }

        fn close(&self, wakes: &Wakes, run: &RunKey) {
            *self.closed.lock().unwrap() = true;
            wake_run(wakes, run);
        }

        fn query(&self) -> Result<()> {
            self.queries.fetch_add(1, Ordering::SeqCst);
            let failing = self.failing.load(Ordering::SeqCst);
            if failing > 0 {
                self.failing.store(failing - 1, Ordering::SeqCst);
                return Err(Error::Unavailable("pool timed out while waiting for an open connection".into()));
            }
            Ok(())
        }
    }

    #[async_trait]
    impl LogPages for Log {
        async fn page_after(&self, _run: &RunKey, after_seq: i64, limit: i64) -> Result<Vec<StoredChunk>> {
            self.query()?;
            let chunks = self.chunks.lock().unwrap();
            Ok(chunks.iter().filter(|c| c.offset.seq() > after_seq).take(limit as usize).cloned().collect())
        }

        async fn log_end(&self, _run: &RunKey) -> Result<(bool, i64)> {
            self.query()?;
            Ok((*self.closed.lock().unwrap(), self.chunks.lock().unwrap().len() as i64))
        }

        async fn closed_and_page_after(
            &self,
            run: &RunKey,
            after_seq: i64,
            limit: i64,
        ) -> Result<(bool, Vec<StoredChunk>)> {
            if after_seq == 0
                && self
                    .refusing_from_the_start
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                let refused = "database \"x\" is not currently accepting connections";
                return Err(Error::Database(sqlx::Error::Protocol(refused.into())));
            }
            // One query, as a store answers it (closed read first).
            let closed = *self.closed.lock().unwrap();
            let page = self.page_after(run, after_seq, limit).await?;
            Ok((closed, page))
        }
    }

    /// A log in memory, its pages, one run of it, and tails polling every
    /// `poll_interval`.
    fn fixture(poll_interval: Duration) -> (Wakes, Tails, Arc<Log>, Arc<dyn LogPages>, RunKey) {
        let wakes = wakes();
        let tails = Tails::new(&wakes, poll_interval);
        let log = Arc::new(Log::default());
        let pages: Arc<dyn LogPages> = log.clone();
        (wakes, tails, log, pages, run())
    }

    fn run() -> RunKey {
        RunKey::new(Tenant::new("t"), RunId::parse("r1").unwrap())
    }

    fn seqs(chunks: &[StoredChunk]) -> Vec<i64> {
        chunks.iter().map(|c| c.offset.seq()).collect()
    }

    async fn take(stream: &mut ChunkStream, n: usize) -> Vec<StoredChunk> {
        let mut got = Vec::new();
        while got.len() < n {
            let next = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
            got.push(next.expect("a chunk within 10 s").expect("not the end").expect("no error"));
        }
        got
    }

    #[tokio::test]
    async fn a_hundred_followers_of_a_run_cost_one_tails_queries() {
        let (wakes, tails, log, pages, run) = fixture(Duration::from_secs(60));
        log.append(&wakes, &run, 10);
        let mut streams: Vec<_> =
            (0..100).map(|_| tails.follow(pages.clone(), run.clone(), Offset::start())).collect();
        // Each catches up on the ten chunks before the tail's start.
        for stream in &mut streams {
            assert_eq!(seqs(&take(stream, 10).await), (1..=10).collect::<Vec<_>>());
        }
        let before = log.queries.load(Ordering::SeqCst);
        for round in 0..20 {
            log.append(&wakes, &run, 1);
            for stream in &mut streams {
                assert_eq!(seqs(&take(stream, 1).await), vec![11 + round]);
            }
        }
        let live = log.queries.load(Ordering::SeqCst) - before;
        // A query per wake-up for the one tail; per-stream tails made 200
        // times that (two each).
        assert!(live <= 20 + 1, "{live} queries for 20 appends followed by 100 streams");
        assert_eq!(tails.tailed_runs(), 1);
        drop(streams);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(tails.tailed_runs(), 0, "the last follower gone, the tail goes");
    }

    #[tokio::test]
    async fn a_tail_takes_its_own_processs_commits_without_reading_them_back() {
        let (wakes, tails, log, pages, run) = fixture(Duration::from_secs(60));
        let mut streams: Vec<_> =
            (0..3).map(|_| tails.follow(pages.clone(), run.clone(), Offset::start())).collect();
        log.append(&wakes, &run, 1);
        for stream in &mut streams {
            assert_eq!(seqs(&take(stream, 1).await), vec![1]);
        }
        let before = log.queries.load(Ordering::SeqCst);
        // A burst far past the steady window, in commits as large as the
        // writer's, then single chunks.
        for _ in 0..5 {
            log.commit(&tails, &run, 1000);
        }
        for stream in &mut streams {
            assert_eq!(seqs(&take(stream, 5000).await), (2..=5001).collect::<Vec<_>>());
        }
        for round in 0..20 {
            log.commit(&tails, &run, 1);
            for stream in &mut streams {
                assert_eq!(seqs(&take(stream, 1).await), vec![5002 + round]);
            }
        }
        let read_back = log.queries.load(Ordering::SeqCst) - before;
        assert_eq!(read_back, 0, "5,020 committed chunks to 3 streams cost {read_back} queries");
        log.close(&wakes, &run);
        for stream in &mut streams {
            assert!(stream.next().await.is_none(), "the closed log ends the stream");
        }
    }

    #[tokio::test]
    async fn a_bursts_window_settles_back_and_a_late_follower_reads_the_rest_from_the_table() {
        let (wakes, tails, log, pages, run) = fixture(Duration::from_secs(60));
        let mut follower = tails.follow(pages.clone(), run.clone(), Offset::start());
        log.append(&wakes, &run, 1);
        assert_eq!(seqs(&take(&mut follower, 1).await), vec![1]);
        log.commit(&tails, &run, 3000);
        assert_eq!(seqs(&take(&mut follower, 3000).await), (2..=3001).collect::<Vec<_>>());
        // (Row 1 too, unless the tail's first read already saw it.)
        let held = tails.window_len(&run).unwrap();
        assert!(held >= 3000, "the burst is held for its followers: {held} chunks");
        tokio::time::sleep(BURST_HOLD + Duration::from_millis(300)).await;
        assert_eq!(tails.window_len(&run), Some(WINDOW_ROWS), "settled back to the steady bound");
        let mut late = tails.follow(pages.clone(), run.clone(), Offset::from_seq(10).unwrap());
        assert_eq!(seqs(&take(&mut late, 2991).await), (11..=3001).collect::<Vec<_>>());
        log.close(&wakes, &run);
        assert!(late.next().await.is_none());
        assert!(follower.next().await.is_none());
    }

    #[tokio::test]
    async fn committed_rows_after_a_gap_restart_the_window_and_nothing_in_the_gap_is_lost() {
        let (wakes, tails, log, pages, run) = fixture(Duration::from_secs(60));
        let mut follower = tails.follow(pages.clone(), run.clone(), Offset::start());
        log.append(&wakes, &run, 10);
        assert_eq!(seqs(&take(&mut follower, 10).await), (1..=10).collect::<Vec<_>>());
        // Rows 11-100 are in the table (as if their news was dropped for
        // newer news); only 101-110 reach the tail.
        log.store(90);
        log.commit(&tails, &run, 10);
        assert_eq!(seqs(&take(&mut follower, 100).await), (11..=110).collect::<Vec<_>>());
        log.close(&wakes, &run);
        assert!(follower.next().await.is_none());
    }

    #[test]
    fn news_after_the_cursor_keeps_the_newest_rows_that_follow_one_another() {
        let chunk = |seq: i64| StoredChunk {
            offset: Offset::from_seq(seq).unwrap(),
            epoch: FIRST_EPOCH,
            kind: "line".into(),
            payload: Default::default(),
            appended_at: Timestamp::from_millis(0),
        };
        let news = |seqs: &[i64]| seqs.iter().copied().map(chunk).collect::<VecDeque<_>>();
        let (rows, skips) = news_after(5, news(&[4, 5, 6, 7]));
        assert_eq!((seqs(&rows), skips), (vec![6, 7], false));
        let (rows, skips) = news_after(5, news(&[6, 7, 9, 10]));
        assert_eq!((seqs(&rows), skips), (vec![9, 10], true));
        let (rows, skips) = news_after(5, news(&[3, 4]));
        assert_eq!((seqs(&rows), skips), (vec![], false));
    }

    #[tokio::test]
    async fn a_follower_behind_the_window_pages_on_its_own_and_misses_nothing() {
        let (wakes, tails, log, pages, run) = fixture(Duration::from_secs(60));
        let mut fast = tails.follow(pages.clone(), run.clone(), Offset::start());
        let mut slow = tails.follow(pages.clone(), run.clone(), Offset::start());
        log.append(&wakes, &run, 1);
        assert_eq!(seqs(&take(&mut fast, 1).await), vec![1]);
        assert_eq!(seqs(&take(&mut slow, 1).await), vec![1]);
        // Far more than the window keeps, while `slow` reads nothing.
        let burst = 3 * WINDOW_ROWS;
        for _ in 0..burst {
            log.append(&wakes, &run, 1);
        }
        assert_eq!(seqs(&take(&mut fast, burst).await), (2..=burst as i64 + 1).collect::<Vec<_>>());
        log.close(&wakes, &run);
        let mut rest = take(&mut slow, burst).await;
        assert_eq!(seqs(&rest), (2..=burst as i64 + 1).collect::<Vec<_>>());
        assert!(slow.next().await.is_none(), "the closed log ends the stream");
        assert!(fast.next().await.is_none());
        rest.clear();
    }

    #[tokio::test]
    async fn a_follower_behind_the_window_retries_a_database_that_refuses_it() {
        let (wakes, tails, log, pages, run) = fixture(Duration::from_millis(10));
        log.append(&wakes, &run, 10);
        // The tail starts at the log's end: this follower pages on its own.
        log.refusing_from_the_start.store(TAIL_RETRIES as usize, Ordering::SeqCst);
        let mut behind = tails.follow(pages.clone(), run.clone(), Offset::start());
        assert_eq!(seqs(&take(&mut behind, 10).await), (1..=10).collect::<Vec<_>>());
        log.close(&wakes, &run);
        assert!(behind.next().await.is_none());
    }

    #[tokio::test]
    async fn a_followers_offset_inside_the_window_resumes_after_it() {
        let (wakes, tails, log, pages, run) = fixture(Duration::from_secs(60));
        let mut first = tails.follow(pages.clone(), run.clone(), Offset::start());
        log.append(&wakes, &run, 5);
        assert_eq!(seqs(&take(&mut first, 5).await), vec![1, 2, 3, 4, 5]);
        let mut resumed = tails.follow(pages.clone(), run.clone(), Offset::from_seq(3).unwrap());
        assert_eq!(seqs(&take(&mut resumed, 2).await), vec![4, 5]);
        log.close(&wakes, &run);
        assert!(resumed.next().await.is_none());
    }

    #[tokio::test]
    async fn an_unavailable_database_is_retried_not_passed_to_the_followers() {
        let (wakes, tails, log, pages, run) = fixture(Duration::from_millis(10));
        let mut stream = tails.follow(pages.clone(), run.clone(), Offset::start());
        log.append(&wakes, &run, 1);
        assert_eq!(seqs(&take(&mut stream, 1).await), vec![1]);
        log.failing.store(TAIL_RETRIES as usize - 1, Ordering::SeqCst);
        log.append(&wakes, &run, 2);
        assert_eq!(seqs(&take(&mut stream, 2).await), vec![2, 3]);
        // Past the retries the followers get the error.
        log.failing.store(usize::MAX, Ordering::SeqCst);
        log.append(&wakes, &run, 1);
        let error = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap();
        assert!(matches!(error, Some(Err(Error::Unavailable(_)))), "{error:?}");
        // A new follower starts a new tail once the database answers.
        log.failing.store(0, Ordering::SeqCst);
        let mut again = tails.follow(pages, run.clone(), Offset::from_seq(3).unwrap());
        assert_eq!(seqs(&take(&mut again, 1).await), vec![4]);
    }
}
