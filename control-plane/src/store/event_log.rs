//! Per-run event logs ([`EventLog`]): offsets, chunks, appends fenced by the writer's epoch, tailing reads.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use super::{Epoch, Error, IndexedRequest, MarkOf, RequestFilter, RequestMark, Result, RunKey, Timestamp};

/// A position in a run's log, minted by the store. Opaque to clients: they
/// get it with each chunk and hand it back to resume after that chunk.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Offset(u64);

impl Offset {
    /// The position before the first chunk ([`FIRST_OFFSET`](super::FIRST_OFFSET)).
    pub const fn start() -> Self {
        Self(0)
    }

    /// Parse an offset a client sent back.
    pub fn parse(s: &str) -> Result<Self> {
        if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::invalid("offset", format!("{s:?} is not an offset this store minted")));
        }
        s.parse::<u64>()
            .ok()
            .filter(|n| i64::try_from(*n).is_ok())
            .map(Self)
            .ok_or_else(|| Error::invalid("offset", format!("{s:?} is out of range")))
    }

    pub(crate) fn from_seq(seq: i64) -> Result<Self> {
        u64::try_from(seq).map(Self).map_err(|_| Error::Corrupt(format!("negative event sequence {seq}")))
    }

    /// The stored sequence number (0 = before the first chunk).
    pub(crate) fn seq(&self) -> i64 {
        // Offsets come from `parse` or `from_seq`, both within i64.
        self.0 as i64
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Offset({})", self.0)
    }
}

/// A chunk to append. The log does not interpret it: `kind` names the event
/// type, `payload` is its encoding, `request` what it does to the run's
/// requests (the event model's choice).
///
/// Cheap to clone, as a chunk is on its way from its writer to every
/// reader: `kind` is mostly a static name and `payload` shared bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChunk {
    pub kind: Cow<'static, str>,
    pub payload: Bytes,
    pub request: Option<RequestMark>,
}

impl NewChunk {
    pub fn new(kind: impl Into<Cow<'static, str>>, payload: impl Into<Bytes>) -> Self {
        Self { kind: kind.into(), payload: payload.into(), request: None }
    }

    /// The chunk asks or answers a request ([`EventLog::requests`]).
    pub fn with_request(mut self, mark: Option<RequestMark>) -> Self {
        self.request = mark;
        self
    }
}

/// A chunk as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChunk {
    pub offset: Offset,
    /// The epoch of the driver that appended it.
    pub epoch: Epoch,
    pub kind: Cow<'static, str>,
    pub payload: Bytes,
    pub appended_at: Timestamp,
}

/// What a log holds right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSnapshot {
    pub chunks: Vec<StoredChunk>,
    pub closed: bool,
}

/// Chunks a reader of a stored log asks for at once ([`EventLog::page`]):
/// the memory a reader holds is a page, not the log.
pub const PAGE_CHUNKS: usize = 64;

/// The log after `after` as stored now, page by page: ends at the last
/// chunk stored when the read gets there, never waits for more.
pub fn stored_after(events: Arc<dyn EventLog>, run: RunKey, after: Offset) -> ChunkStream {
    paged(after, move |cursor| {
        let (events, run) = (events.clone(), run.clone());
        async move { events.page(&run, &cursor, PAGE_CHUNKS).await }
    })
}

/// As [`stored_after`], with each page read by `page` (the
/// [`PAGE_CHUNKS`] after its cursor): a caller may retry a page's read.
pub fn paged<F, Fut>(after: Offset, mut page: F) -> ChunkStream
where
    F: FnMut(Offset) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Vec<StoredChunk>>> + Send,
{
    Box::pin(async_stream::try_stream! {
        let mut cursor = after;
        loop {
            let page = page(cursor.clone()).await?;
            let full = page.len() == PAGE_CHUNKS;
            for chunk in page {
                cursor = chunk.offset.clone();
                yield chunk;
            }
            if !full {
                break;
            }
        }
    })
}

/// Chunks in log order; ends after the last chunk of a closed log. An error
/// item ends the stream; resume with `read` after the last offset seen.
pub type ChunkStream = BoxStream<'static, Result<StoredChunk>>;

/// Per-run append-only event logs, keyed like their run records
/// ([`RunKey`]). A log belongs to its run record: the record carries the
/// fencing epoch and the closed flag.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Append `chunks` in order, in one transaction (which appends of other
    /// runs waiting at the same time may share: group commit, answered only
    /// once it committed), and return one offset per chunk. Refused with [`Error::Fenced`] unless `epoch` is the run's
    /// current epoch, atomically with respect to a concurrent claim: nothing
    /// of a superseded writer lands after the claim that superseded it.
    /// [`Error::LogClosed`] after [`EventLog::close`]. Drivers append through
    /// a [`LogWriter`](super::LogWriter).
    async fn append(&self, run: &RunKey, epoch: Epoch, chunks: &[NewChunk]) -> Result<Vec<Offset>>;

    /// Everything after `after`, then new appends as they land (from this
    /// process or any other), ending once the log is closed and read to its
    /// end. [`Error::NotFound`] up front for an unknown run.
    async fn read(&self, run: &RunKey, after: &Offset) -> Result<ChunkStream>;

    /// What is stored now, without waiting for anything: the whole log in
    /// memory, for tests and tools. Servers page with [`EventLog::page`].
    async fn snapshot(&self, run: &RunKey) -> Result<LogSnapshot>;

    /// At most `limit` stored chunks after `after`, in order, without
    /// waiting: fewer than `limit` means the log holds nothing more now.
    /// [`Error::NotFound`] for an unknown run.
    async fn page(&self, run: &RunKey, after: &Offset, limit: usize) -> Result<Vec<StoredChunk>>;

    /// The last stored chunk, if any. [`Error::NotFound`] for an unknown run.
    async fn last(&self, run: &RunKey) -> Result<Option<StoredChunk>>;

    /// The run's requests as its appends indexed them ([`NewChunk::request`]),
    /// in the order asked: the work is in the requests read, never in the
    /// length of the log. Nothing for an unknown run.
    async fn requests(&self, run: &RunKey, filter: RequestFilter) -> Result<Vec<IndexedRequest>>;

    /// One request of the run by id, if the log holds it.
    async fn request(&self, run: &RunKey, request_id: &str) -> Result<Option<IndexedRequest>>;

    /// Build the request index of a run whose log was written (in part)
    /// before the index existed, from its log, once: the runs that existed
    /// then are marked unindexed (migration 0021). `mark_of` reads what
    /// each stored chunk does to the run's requests. The index is rebuilt
    /// whole in one transaction, appends to the run waiting meanwhile, and
    /// the mark cleared with it. Returns whether it built one: false for an
    /// indexed run (one lookup) or an unknown one.
    async fn backfill_requests(&self, run: &RunKey, mark_of: &MarkOf) -> Result<bool>;

    /// Close the log: later appends are refused and tailers end. Not fenced
    /// (teardown must always be able to release tailers); idempotent. A
    /// driver closes only after its terminal write went through (or the run
    /// is known terminal): closing is final, also for a successor.
    async fn close(&self, run: &RunKey) -> Result<()>;
}
