//! The chunks a drive has made and the log does not hold yet, and the one
//! append of them in flight: the pump translates the lines that arrive
//! while the last batch commits, and sends them together once it has.
//!
//! One append at a time keeps the log in the order the chunks were made,
//! retries included: a batch that fails and is tried again still lands
//! before the next one leaves (two in flight could land the later first).
//!
//! Chunks wait encoded, as the log stores them, and a landed batch's
//! buffer is the next one's: a burst's batches hold thousands of chunks,
//! and a buffer grown from nothing for each (then given back to the
//! system) cost more than the chunks' own encoding.

use std::future::Future;
use std::pin::Pin;

use shared::proto::v1::Chunk;

use super::ending::Ending;
use crate::runs::coalesce;
use crate::runs::log::encode_chunk;
use crate::store::NewChunk;

/// Chunks and their encoded bytes waiting, at most, before the pump reads
/// no more of the journal until an append lands: the bounds of one batch
/// the driver reads ([`coalesce`]), so a writer slower than its agent holds
/// the agent's lines in the journal, not in memory (one more Follow message
/// may go over, as one batch always could).
const WAITING_MAX: usize = coalesce::MAX_LINES;
const WAITING_BYTES: usize = coalesce::MAX_BYTES;

/// An append of some chunks, landing (or failing as the drive's ending),
/// with the batch handed back for its buffer.
pub(super) type Landing<'a> = Pin<Box<dyn Future<Output = (Result<(), Ending>, Vec<NewChunk>)> + Send + 'a>>;

#[derive(Default)]
pub(super) struct Outbox<'a> {
    waiting: Vec<NewChunk>,
    /// `waiting`'s encoded size.
    waiting_bytes: usize,
    /// The last landed batch's buffer, empty, for the next batch.
    spare: Vec<NewChunk>,
    in_flight: Option<Landing<'a>>,
}

impl<'a> Outbox<'a> {
    /// Chunks to append after every chunk pushed before them.
    pub(super) fn push(&mut self, chunks: impl IntoIterator<Item = Chunk>) {
        for chunk in chunks {
            self.push_one(&chunk);
        }
    }

    /// [`Self::push`] of one chunk.
    pub(super) fn push_one(&mut self, chunk: &Chunk) {
        let row = encode_chunk(chunk);
        self.waiting_bytes += row.payload.len();
        self.waiting.push(row);
    }

    /// Whether the pump may read more before an append lands.
    pub(super) fn has_room(&self) -> bool {
        self.waiting.len() < WAITING_MAX && self.waiting_bytes < WAITING_BYTES
    }

    /// Start appending everything waiting, in one batch, unless an append
    /// is in flight (it is sent once that one lands).
    pub(super) fn send(&mut self, append: impl FnOnce(Vec<NewChunk>) -> Landing<'a>) {
        if self.in_flight.is_none() && !self.waiting.is_empty() {
            self.in_flight = Some(append(self.take()));
        }
    }

    /// The append in flight, landed; pending for ever when none is in
    /// flight (a `select!` branch). Cancel-safe: the append stays in flight.
    pub(super) async fn landed(&mut self) -> Result<(), Ending> {
        let Some(landing) = self.in_flight.as_mut() else {
            return std::future::pending().await;
        };
        let (landed, mut batch) = landing.await;
        self.in_flight = None;
        batch.clear();
        self.spare = batch;
        landed
    }

    /// Wait for the append in flight, if any; what waits stays waiting.
    pub(super) async fn settle(&mut self) -> Result<(), Ending> {
        match self.in_flight {
            Some(_) => self.landed().await,
            None => Ok(()),
        }
    }

    /// Give the buffers' memory back when nothing waits and nothing is in
    /// flight: a run between bursts (most of a run's life, at a model's
    /// pace) holds none, so many runs do not each keep what their largest
    /// burst grew.
    pub(super) fn trim(&mut self) {
        if self.in_flight.is_none() && self.waiting.is_empty() {
            self.waiting = Vec::new();
            self.spare = Vec::new();
        }
    }

    /// Everything waiting, handed over for its append (the last one once
    /// the one in flight settled).
    pub(super) fn take(&mut self) -> Vec<NewChunk> {
        self.waiting_bytes = 0;
        let next = std::mem::take(&mut self.spare);
        std::mem::replace(&mut self.waiting, next)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use prost::Message as _;
    use tokio::sync::oneshot;

    use super::*;

    fn chunk(n: i64) -> Chunk {
        Chunk { timestamp_ms: n, ..Default::default() }
    }

    /// The chunks of a batch, by the timestamp each was made with.
    fn stamps(batch: &[NewChunk]) -> Vec<i64> {
        batch.iter().map(|row| Chunk::decode(row.payload.as_ref()).unwrap().timestamp_ms).collect()
    }

    type Gate = oneshot::Sender<Result<(), Ending>>;

    /// Appends that land when the test says, recording each batch.
    #[derive(Default, Clone)]
    struct Log {
        batches: Arc<Mutex<Vec<Vec<i64>>>>,
        gates: Arc<Mutex<Vec<Gate>>>,
    }

    impl Log {
        fn append(&self) -> impl FnOnce(Vec<NewChunk>) -> Landing<'static> + '_ {
            move |chunks| {
                self.batches.lock().unwrap().push(stamps(&chunks));
                let (gate, landing) = oneshot::channel();
                self.gates.lock().unwrap().push(gate);
                Box::pin(async move { (landing.await.expect("the test lands every append"), chunks) })
            }
        }

        fn land(&self, result: Result<(), Ending>) {
            let gate = self.gates.lock().unwrap().remove(0);
            assert!(gate.send(result).is_ok(), "the append is awaited");
        }

        /// Land the oldest append, and see the outbox take it as landed.
        async fn land_in(&self, outbox: &mut Outbox<'_>) {
            self.land(Ok(()));
            outbox.landed().await.unwrap();
        }

        fn batches(&self) -> Vec<Vec<i64>> {
            self.batches.lock().unwrap().clone()
        }
    }

    #[tokio::test]
    async fn what_is_made_during_an_append_goes_next_in_one_batch_in_order() {
        let log = Log::default();
        let mut outbox = Outbox::default();
        outbox.push([chunk(1), chunk(2)]);
        outbox.send(log.append());
        // Made while 1-2 is in flight: held, not sent beside it.
        outbox.push([chunk(3)]);
        outbox.send(log.append());
        outbox.push([chunk(4), chunk(5)]);
        outbox.send(log.append());
        assert_eq!(log.batches(), vec![vec![1, 2]]);

        log.land_in(&mut outbox).await;
        outbox.send(log.append());
        assert_eq!(log.batches(), vec![vec![1, 2], vec![3, 4, 5]]);
        // Nothing waits: a send starts nothing.
        log.land(Ok(()));
        outbox.settle().await.unwrap();
        outbox.send(log.append());
        assert_eq!(log.batches().len(), 2);
    }

    #[tokio::test]
    async fn a_failed_append_is_the_drives_ending_and_what_waits_is_kept() {
        let log = Log::default();
        let mut outbox = Outbox::default();
        outbox.push([chunk(1)]);
        outbox.send(log.append());
        outbox.push([chunk(2)]);
        log.land(Err(Ending::Superseded("claimed".into())));
        assert!(matches!(outbox.settle().await, Err(Ending::Superseded(_))));
        assert_eq!(stamps(&outbox.take()), vec![2]);
    }

    #[tokio::test]
    async fn landed_waits_for_ever_with_nothing_in_flight_and_is_cancel_safe() {
        let log = Log::default();
        let mut outbox = Outbox::default();
        let idle = tokio::time::timeout(std::time::Duration::from_millis(20), outbox.landed()).await;
        assert!(idle.is_err(), "nothing in flight never lands");

        outbox.push([chunk(1)]);
        outbox.send(log.append());
        // A select that picks another branch drops `landed`: the append
        // stays in flight and lands later.
        let dropped = tokio::time::timeout(std::time::Duration::from_millis(20), outbox.landed()).await;
        assert!(dropped.is_err());
        outbox.push([chunk(2)]);
        outbox.send(log.append());
        assert_eq!(log.batches(), vec![vec![1]], "still one in flight");
        log.land_in(&mut outbox).await;
        outbox.send(log.append());
        assert_eq!(log.batches(), vec![vec![1], vec![2]]);
    }

    /// Two buffers take turns: one filling while the other is in flight.
    #[tokio::test]
    async fn a_landed_batch_s_buffer_is_filled_again() {
        let log = Log::default();
        let mut outbox = Outbox::default();
        outbox.push((0..1000).map(chunk));
        outbox.send(log.append());
        outbox.push([chunk(1000)]);
        log.land_in(&mut outbox).await;
        outbox.send(log.append());
        // Made while 1000 is in flight: into the buffer the first batch grew.
        outbox.push([chunk(1001)]);
        let next = outbox.take();
        assert!(next.capacity() >= 1000, "the buffer of 1,000 chunks, not a new one: {}", next.capacity());
        assert_eq!(stamps(&next), vec![1001], "emptied before it is filled again");
        assert_eq!(log.batches()[1], vec![1000]);
    }

    #[tokio::test]
    async fn an_idle_outbox_gives_its_buffers_back() {
        let log = Log::default();
        let mut outbox = Outbox::default();
        outbox.push((0..1000).map(chunk));
        outbox.send(log.append());
        outbox.push((1000..2000).map(chunk));
        outbox.trim();
        assert!(outbox.waiting.capacity() >= 1000, "an append in flight and chunks waiting: kept");
        log.land_in(&mut outbox).await;
        outbox.send(log.append());
        log.land_in(&mut outbox).await;
        assert!(outbox.spare.capacity() >= 1000 && outbox.waiting.capacity() >= 1000);
        outbox.trim();
        assert_eq!((outbox.waiting.capacity(), outbox.spare.capacity()), (0, 0));
        assert_eq!(log.batches().concat(), (0..2000).collect::<Vec<_>>(), "nothing lost to a trim");
    }

    #[test]
    fn a_full_outbox_has_no_room() {
        let mut outbox = Outbox::default();
        outbox.push((0..WAITING_MAX as i64 - 1).map(chunk));
        assert!(outbox.has_room());
        outbox.push([chunk(0)]);
        assert!(!outbox.has_room());
        outbox.take();
        assert!(outbox.has_room(), "what was taken is not waiting");
    }

    /// A tenant's few huge lines fill it as many small ones do.
    #[test]
    fn a_few_large_chunks_fill_it_too() {
        let mut outbox = Outbox::default();
        let large = || Chunk { delta: "x".repeat(1 << 20), ..Default::default() };
        outbox.push((0..3).map(|_| large()));
        assert!(outbox.has_room());
        outbox.push([large()]);
        assert!(!outbox.has_room(), "4 MiB wait");
        let log = Log::default();
        outbox.send(log.append());
        assert!(outbox.has_room(), "what is in flight is not waiting");
    }
}
