//! How a run's chunks are kept in its event log: the protobuf encoding of
//! each chunk, its kind the chunk type's name. The drive writes them; an
//! attach, the aligner and the requests read them back. A request chunk
//! also marks its row of the run's request index, in the same append.

use prost::Message;
use shared::chunk;
use shared::proto::v1::Chunk;

use super::Error;
use crate::store::{NewChunk, StoredChunk};

/// How a chunk is stored: its protobuf encoding, kind = its type name.
pub(crate) fn encode_chunk(c: &Chunk) -> NewChunk {
    NewChunk::new(chunk::type_name(c.r#type()), c.encode_to_vec())
        .with_request(super::request_index::request_mark(c))
}

pub(crate) fn decode_chunk(stored: &StoredChunk) -> Result<Chunk, Error> {
    Chunk::decode(stored.payload.as_slice())
        .map_err(|e| Error::Corrupt(format!("stored chunk at offset {} does not decode: {e}", stored.offset)))
}
