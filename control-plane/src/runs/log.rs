//! How a run's chunks are kept in its event log: the protobuf encoding of
//! each chunk, its kind the chunk type's name. The drive writes them; an
//! attach, the aligner and the requests read them back. A request chunk
//! also marks its row of the run's request index, in the same append.

use prost::Message;
use shared::chunk;
use shared::proto::v1::Chunk;

use tracing::info;

use super::Error;
use super::request_index::request_mark;
use crate::store::{EventLog, NewChunk, RunKey, StoredChunk};

/// How a chunk is stored: its protobuf encoding, kind = its type name.
pub(crate) fn encode_chunk(c: &Chunk) -> NewChunk {
    NewChunk::new(chunk::type_name(c.r#type()), c.encode_to_vec()).with_request(request_mark(c))
}

pub(crate) fn decode_chunk(stored: &StoredChunk) -> Result<Chunk, Error> {
    let mut chunk = Chunk::default();
    decode_chunk_into(stored, &mut chunk)?;
    Ok(chunk)
}

/// [`decode_chunk`] into a chunk already in place (a boxed one: a chunk is
/// some 550 bytes, and one decoded where it stays is not copied there).
pub(crate) fn decode_chunk_into(stored: &StoredChunk, chunk: &mut Chunk) -> Result<(), Error> {
    chunk
        .merge(stored.payload.as_ref())
        .map_err(|e| Error::Corrupt(format!("stored chunk at offset {} does not decode: {e}", stored.offset)))
}

/// Build the run's request index from its log if the log was written
/// before the index existed ([`EventLog::backfill_requests`]): once per
/// such run, on its first list or answer; a lookup for every other.
pub(crate) async fn backfill_requests(events: &dyn EventLog, run: &RunKey) -> Result<(), Error> {
    // A chunk that does not decode asks nothing (reading it fails elsewhere).
    let mark_of = |stored: &StoredChunk| request_mark(&decode_chunk(stored).ok()?);
    if events.backfill_requests(run, &mark_of).await? {
        info!(tenant = %run.tenant, run_id = %run.run, "request index built from the run's log");
    }
    Ok(())
}
