//! Replaying a journal without duplicating what the log already holds.
//!
//! A driver (the first one or a successor) translates the journal from byte
//! 0 and offers every chunk here before appending it. While the stored log
//! has chunks left, an offered chunk must equal the next stored one by
//! fingerprint (every field but the timestamp) and is skipped; once the
//! stored prefix is used up, chunks are delivered. Chunks the server adds
//! outside translation (`run.accepted`, `sandbox.file`, `file.changed`,
//! `harness.warning`) never come back on replay, so the stored log may skip
//! over them, at most [`MAX_OUT_OF_BAND_RUN`] in a row. Anything else is a
//! divergence: the journal no longer explains the log, and nothing past it
//! may be delivered.

use std::collections::VecDeque;

use shared::chunk::{
    FILE_CHANGED, HARNESS_WARNING, RUN_ACCEPTED, SANDBOX_FILE, fingerprint, fingerprint_hex,
};
use shared::error::{Error, ErrorCode};
use shared::proto::v1::{Chunk, ChunkType};

/// Out-of-band chunks the stored log may skip in a row. Writers keep runs of
/// them shorter (see the driver's file event budget).
pub const MAX_OUT_OF_BAND_RUN: usize = 64;

/// Whether the server, not translation, produced this chunk.
pub fn is_out_of_band(chunk: &Chunk) -> bool {
    chunk.r#type() == ChunkType::Custom
        && matches!(chunk.name.as_str(), RUN_ACCEPTED | SANDBOX_FILE | FILE_CHANGED | HARNESS_WARNING)
}

#[derive(Debug)]
pub struct Aligner {
    /// Stored chunks not matched yet, with their index in the log.
    stored: VecDeque<(usize, Chunk)>,
    skipped_in_a_row: usize,
}

impl Aligner {
    /// `stored` is the whole stored log, in order.
    pub fn new(stored: Vec<Chunk>) -> Self {
        Self { stored: stored.into_iter().enumerate().collect(), skipped_in_a_row: 0 }
    }

    /// True once everything stored was matched: every offer now delivers.
    pub fn caught_up(&self) -> bool {
        self.stored.is_empty()
    }

    /// Offer the next chunk of the replay: `Ok(true)` to deliver it,
    /// `Ok(false)` when the log already holds it, `REPLAY_DIVERGED` when the
    /// log holds something else.
    pub fn offer(&mut self, chunk: &Chunk) -> Result<bool, Error> {
        let offered = fingerprint(chunk);
        loop {
            let Some((index, stored)) = self.stored.front() else { return Ok(true) };
            if fingerprint(stored) == offered {
                self.stored.pop_front();
                self.skipped_in_a_row = 0;
                return Ok(false);
            }
            if is_out_of_band(stored) && self.skipped_in_a_row < MAX_OUT_OF_BAND_RUN {
                self.stored.pop_front();
                self.skipped_in_a_row += 1;
                continue;
            }
            return Err(diverged(*index, &fingerprint_hex(stored), &hex::encode(offered)));
        }
    }

    /// The replay ended (the run's terminal chunk was offered): a stored log
    /// longer than the replay (apart from out-of-band chunks) diverged too.
    pub fn finish(&mut self) -> Result<(), Error> {
        while let Some((index, stored)) = self.stored.front() {
            if is_out_of_band(stored) {
                self.stored.pop_front();
                continue;
            }
            return Err(diverged(*index, &fingerprint_hex(stored), "none (the replay ended)"));
        }
        Ok(())
    }
}

fn diverged(index: usize, stored: &str, replayed: &str) -> Error {
    Error::new(
        ErrorCode::ReplayDiverged,
        format!("the journal does not replay the stored log: chunk {index} differs"),
    )
    .with_meta("index", index.to_string())
    .with_meta("stored_fingerprint", stored)
    .with_meta("replayed_fingerprint", replayed)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shared::chunk::ChunkFactory;
    use shared::ids::RunId;

    use super::*;

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

    #[test]
    fn skips_the_stored_prefix_then_delivers() {
        let replay = texts(5);
        let mut a = Aligner::new(replay[..3].to_vec());
        let delivered: Vec<bool> = replay.iter().map(|c| a.offer(c).unwrap()).collect();
        assert_eq!(delivered, [false, false, false, true, true]);
        assert!(a.caught_up());
        a.finish().unwrap();
    }

    #[test]
    fn timestamps_do_not_matter() {
        let stored = texts(1);
        let mut later = stored[0].clone();
        later.timestamp_ms += 1_000;
        let mut a = Aligner::new(stored);
        assert!(!a.offer(&later).unwrap());
    }

    #[test]
    fn out_of_band_chunks_are_skipped_up_to_the_limit() {
        let replay = texts(2);
        let mut stored = vec![factory().custom(RUN_ACCEPTED, &json!({})), replay[0].clone()];
        stored.extend((0..MAX_OUT_OF_BAND_RUN).map(file_event));
        stored.push(replay[1].clone());
        let mut a = Aligner::new(stored);
        assert!(!a.offer(&replay[0]).unwrap());
        assert!(!a.offer(&replay[1]).unwrap(), "64 file events in a row are skipped");

        let mut stored = vec![replay[0].clone()];
        stored.extend((0..=MAX_OUT_OF_BAND_RUN).map(file_event));
        stored.push(replay[1].clone());
        let mut a = Aligner::new(stored);
        assert!(!a.offer(&replay[0]).unwrap());
        let err = a.offer(&replay[1]).unwrap_err();
        assert_eq!(err.code, ErrorCode::ReplayDiverged, "65 in a row is a divergence");
    }

    #[test]
    fn a_different_chunk_diverges_with_index_and_both_fingerprints() {
        let stored = texts(3);
        let mut replay = stored.clone();
        replay[1].delta = "rewritten".into();
        let mut a = Aligner::new(stored.clone());
        assert!(!a.offer(&replay[0]).unwrap());
        let err = a.offer(&replay[1]).unwrap_err();
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

    #[test]
    fn a_replay_shorter_than_the_log_diverges() {
        let stored = texts(3);
        let mut a = Aligner::new(stored.clone());
        a.offer(&stored[0]).unwrap();
        assert_eq!(a.finish().unwrap_err().code, ErrorCode::ReplayDiverged);

        let mut with_tail = stored.clone();
        with_tail.push(file_event(0));
        let mut a = Aligner::new(with_tail);
        for c in &stored {
            a.offer(c).unwrap();
        }
        a.finish().expect("trailing out-of-band chunks are not a divergence");
    }
}
