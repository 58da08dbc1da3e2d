//! Replaying a journal without duplicating what the log already holds.
//!
//! A driver (the first one or a successor) translates the journal from byte
//! 0 and offers every chunk here before appending it. While the stored log
//! has chunks left, an offered chunk must equal the next stored one by
//! fingerprint (every field but the timestamp) and is skipped; once the
//! stored prefix is used up, chunks are delivered. Chunks the server adds
//! outside translation (`run.accepted`, `sandbox.file`, `sandbox.network`,
//! `model.unavailable`, `file.changed`, `harness.warning`) never come back on replay, so the stored log may skip
//! over them, at most [`MAX_OUT_OF_BAND_RUN`] in a row. Anything else is a
//! divergence: the journal no longer explains the log, and nothing past it
//! may be delivered.
//!
//! The command's stderr (`run.stderr`) is not replayed either: its lines sit
//! in the log wherever they arrived, in any number, and a successor follows
//! the stderr sidecar from the offset the last stored one ends at
//! ([`checkpoints`]), so the aligner skips them all. So with the model
//! broker's usage records (`model.usage`): a successor reads them after the
//! last stored `seq`.

use futures::StreamExt;
use futures::stream::BoxStream;
use shared::chunk::{
    BUDGET_EXCEEDED, FILE_CHANGED, HARNESS_WARNING, MODEL_UNAVAILABLE, NETWORK_BLOCKED, NETWORK_POLICY,
    RUN_ACCEPTED, SANDBOX_FILE, SANDBOX_NETWORK, fingerprint, fingerprint_hex, stderr_offset, usage_seq,
};
use shared::proto::v1::{Chunk, ChunkType};

use super::Error;
use super::log::decode_chunk;
use super::usage::Tally;
use crate::store::ChunkStream;

/// Out-of-band chunks the stored log may skip in a row. Writers keep runs of
/// them shorter (see the driver's file event budget).
pub const MAX_OUT_OF_BAND_RUN: usize = 64;

/// Whether the server, not translation, produced this chunk.
pub fn is_out_of_band(chunk: &Chunk) -> bool {
    chunk.r#type() == ChunkType::Custom
        && matches!(
            chunk.name.as_str(),
            RUN_ACCEPTED
                | SANDBOX_FILE
                | SANDBOX_NETWORK
                | NETWORK_BLOCKED
                | NETWORK_POLICY
                | MODEL_UNAVAILABLE
                | FILE_CHANGED
                | HARNESS_WARNING
                | BUDGET_EXCEEDED
        )
}

/// Whether the aligner skips `stored` whatever the number in a row:
/// `run.stderr` and `model.usage`, delivered from their own checkpoints.
fn is_sidecar(stored: &Chunk) -> bool {
    stderr_offset(stored).is_some() || usage_seq(stored).is_some()
}

/// Where the run's stderr sidecar was delivered up to (the offset the last
/// stored `run.stderr` chunk ends at, 0 when there is none), its model
/// usage (the stored `model.usage` chunks summed, the last `seq`), and the
/// version of the sandbox's live network rules last recorded on it (the
/// latest `network.policy`, 0 when none is). Appends
/// are fenced, so no earlier driver adds one after the caller's claim:
/// reading on from here delivers each stderr line and usage record exactly
/// once.
pub async fn checkpoints(mut stored: ChunkStream) -> Result<(u64, Tally, u64), Error> {
    let (mut offset, mut tally, mut policy) = (0, Tally::default(), 0);
    while let Some(chunk) = stored.next().await {
        let chunk = decode_chunk(&chunk.map_err(Error::Store)?)?;
        if let Some(end) = stderr_offset(&chunk) {
            offset = offset.max(end);
        }
        if chunk.r#type() == ChunkType::Custom && chunk.name == NETWORK_POLICY {
            let value: serde_json::Value = serde_json::from_str(&chunk.value_json).unwrap_or_default();
            policy = value["version"].as_u64().unwrap_or(0).max(policy);
        }
        tally.observe(&chunk);
    }
    Ok((offset, tally, policy))
}

/// The stored log, in order, as the aligner reads it.
pub type StoredChunks = BoxStream<'static, Result<Chunk, Error>>;

pub struct Aligner {
    /// Stored chunks not matched yet, read page by page: the aligner holds
    /// one page of the log, not the log.
    stored: StoredChunks,
    /// The next stored chunk not matched yet, with its index in the log.
    next: Option<(usize, Chunk)>,
    read: usize,
    exhausted: bool,
    skipped_in_a_row: usize,
}

impl Aligner {
    /// `stored` is the whole stored log, in order.
    pub async fn new(stored: StoredChunks) -> Result<Self, Error> {
        let mut aligner = Self { stored, next: None, read: 0, exhausted: false, skipped_in_a_row: 0 };
        aligner.peek().await?;
        Ok(aligner)
    }

    /// A run's log as stored now, `stored` from its start.
    pub async fn of_stored(stored: ChunkStream) -> Result<Self, Error> {
        let stored = stored.map(|c| c.map_err(Error::Store).and_then(|c| decode_chunk(&c)));
        Self::new(Box::pin(stored)).await
    }

    /// Read the next stored chunk into `next`, if there is one.
    async fn peek(&mut self) -> Result<(), Error> {
        if self.next.is_none() && !self.exhausted {
            match self.stored.next().await {
                Some(chunk) => {
                    self.next = Some((self.read, chunk?));
                    self.read += 1;
                }
                None => self.exhausted = true,
            }
        }
        Ok(())
    }

    async fn pop(&mut self) -> Result<(), Error> {
        self.next = None;
        self.peek().await
    }

    /// True once everything stored was matched: every offer now delivers.
    pub fn caught_up(&self) -> bool {
        self.next.is_none() && self.exhausted
    }

    /// Offer the next chunk of the replay: `Ok(true)` to deliver it,
    /// `Ok(false)` when the log already holds it, `REPLAY_DIVERGED` when the
    /// log holds something else.
    pub async fn offer(&mut self, chunk: &Chunk) -> Result<bool, Error> {
        // Past the stored log (a fresh run's every chunk): nothing to compare.
        if self.next.is_none() {
            return Ok(true);
        }
        let offered = fingerprint(chunk);
        loop {
            let Some((index, stored)) = &self.next else { return Ok(true) };
            if fingerprint(stored) == offered {
                self.skipped_in_a_row = 0;
                self.pop().await?;
                return Ok(false);
            }
            if is_sidecar(stored) {
                self.pop().await?;
                continue;
            }
            if is_out_of_band(stored) && self.skipped_in_a_row < MAX_OUT_OF_BAND_RUN {
                self.skipped_in_a_row += 1;
                self.pop().await?;
                continue;
            }
            return Err(diverged(*index, &fingerprint_hex(stored), &hex::encode(offered)));
        }
    }

    /// The replay ended (the run's terminal chunk was offered): a stored log
    /// longer than the replay (apart from out-of-band chunks) diverged too.
    pub async fn finish(&mut self) -> Result<(), Error> {
        while let Some((index, stored)) = &self.next {
            if is_out_of_band(stored) || is_sidecar(stored) {
                self.pop().await?;
                continue;
            }
            return Err(diverged(*index, &fingerprint_hex(stored), "none (the replay ended)"));
        }
        Ok(())
    }
}

fn diverged(index: usize, stored: &str, replayed: &str) -> Error {
    Error::Diverged { index, stored: stored.to_string(), replayed: replayed.to_string() }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shared::chunk::ChunkFactory;
    use shared::error::{Error as WireError, ErrorCode};
    use shared::ids::RunId;

    use super::*;

    async fn aligner(stored: Vec<Chunk>) -> Aligner {
        Aligner::new(Box::pin(futures::stream::iter(stored.into_iter().map(Ok)))).await.unwrap()
    }

    fn factory() -> ChunkFactory {
        ChunkFactory::new(&RunId::parse("r1").unwrap(), "t1", || 7)
    }

    fn texts(n: usize) -> Vec<Chunk> {
        let f = factory();
        (0..n).map(|i| f.text_content("m", &format!("line {i}"))).collect()
    }

    fn file_event(i: usize) -> Chunk {
        factory().custom(SANDBOX_FILE, &json!({"type": "create", "path": format!("f{i}")}))
    }

    #[tokio::test]
    async fn skips_the_stored_prefix_then_delivers() {
        let replay = texts(5);
        let mut a = aligner(replay[..3].to_vec()).await;
        let mut delivered = Vec::new();
        for c in &replay {
            delivered.push(a.offer(c).await.unwrap());
        }
        assert_eq!(delivered, [false, false, false, true, true]);
        assert!(a.caught_up());
        a.finish().await.unwrap();
    }

    #[tokio::test]
    async fn timestamps_do_not_matter() {
        let stored = texts(1);
        let mut later = stored[0].clone();
        later.timestamp_ms += 1_000;
        let mut a = aligner(stored).await;
        assert!(!a.offer(&later).await.unwrap());
    }

    #[tokio::test]
    async fn out_of_band_chunks_are_skipped_up_to_the_limit() {
        let replay = texts(2);
        let mut stored = vec![factory().custom(RUN_ACCEPTED, &json!({})), replay[0].clone()];
        stored.extend((0..MAX_OUT_OF_BAND_RUN).map(file_event));
        stored.push(replay[1].clone());
        let mut a = aligner(stored).await;
        assert!(!a.offer(&replay[0]).await.unwrap());
        assert!(!a.offer(&replay[1]).await.unwrap(), "64 file events in a row are skipped");

        let mut stored = vec![replay[0].clone()];
        stored.extend((0..=MAX_OUT_OF_BAND_RUN).map(file_event));
        stored.push(replay[1].clone());
        let mut a = aligner(stored).await;
        assert!(!a.offer(&replay[0]).await.unwrap());
        let err = WireError::from(a.offer(&replay[1]).await.unwrap_err());
        assert_eq!(err.code, ErrorCode::ReplayDiverged, "65 in a row is a divergence");
    }

    #[tokio::test]
    async fn stderr_lines_are_skipped_in_any_number() {
        let replay = texts(2);
        let mut stored = vec![replay[0].clone()];
        stored.extend((0..MAX_OUT_OF_BAND_RUN * 3).map(|i| factory().stderr_line("warn", i as u64 + 5)));
        stored.push(replay[1].clone());
        stored.push(factory().stderr_line("after", 1_000));
        let mut a = aligner(stored).await;
        assert!(!a.offer(&replay[0]).await.unwrap());
        assert!(!a.offer(&replay[1]).await.unwrap(), "192 stderr lines in a row are skipped");
        a.finish().await.expect("a trailing stderr line is not a divergence");
    }

    #[tokio::test]
    async fn a_different_chunk_diverges_with_index_and_both_fingerprints() {
        let stored = texts(3);
        let mut replay = stored.clone();
        replay[1].delta = "rewritten".into();
        let mut a = aligner(stored.clone()).await;
        assert!(!a.offer(&replay[0]).await.unwrap());
        let err = WireError::from(a.offer(&replay[1]).await.unwrap_err());
        assert_eq!(err.code, ErrorCode::ReplayDiverged);
        assert_eq!(err.metadata.get("index").map(String::as_str), Some("1"));
        assert_eq!(
            err.metadata.get("stored_fingerprint").map(String::as_str),
            Some(fingerprint_hex(&stored[1]).as_str())
        );
        assert_eq!(
            err.metadata.get("replayed_fingerprint").map(String::as_str),
            Some(fingerprint_hex(&replay[1]).as_str())
        );
    }

    #[tokio::test]
    async fn a_replay_shorter_than_the_log_diverges() {
        let stored = texts(3);
        let mut a = aligner(stored.clone()).await;
        a.offer(&stored[0]).await.unwrap();
        assert_eq!(WireError::from(a.finish().await.unwrap_err()).code, ErrorCode::ReplayDiverged);

        let mut with_tail = stored.clone();
        with_tail.push(file_event(0));
        let mut a = aligner(with_tail).await;
        for c in &stored {
            a.offer(c).await.unwrap();
        }
        a.finish().await.expect("trailing out-of-band chunks are not a divergence");
    }

    #[tokio::test]
    async fn a_failed_read_of_the_stored_log_fails_the_offer() {
        let stored = texts(2);
        let broken: Vec<Result<Chunk, Error>> =
            vec![Ok(stored[0].clone()), Err(Error::Corrupt("page 2 does not decode".into()))];
        let mut a = Aligner::new(Box::pin(futures::stream::iter(broken))).await.unwrap();
        let err = a.offer(&stored[0]).await.unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
        assert!(!a.caught_up(), "an unread log is not caught up");
    }
}
