//! The request index of run logs: which chunk of a run's log asked each of
//! its requests and which answered it, kept by the append that stores them
//! (same transaction), so that listing a run's requests and answering one
//! read a few rows instead of the whole log.

use super::StoredChunk;

/// What a stored chunk does to its run's requests, for building the index
/// of a log written before it ([`super::EventLog::backfill_requests`]): the
/// event model's reading, as [`super::NewChunk::request`] says it for an
/// append.
pub type MarkOf = dyn Fn(&StoredChunk) -> Option<RequestMark> + Send + Sync;

/// What an appended chunk does to its run's requests. The log does not
/// interpret chunks; the caller says this beside `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestMark {
    /// The chunk asks request `id`. Only the first ask of an id counts (a
    /// record repeated after an agent crash is not a new request).
    Asked(String),
    /// The chunk answers request `id`. Only the first answer after its ask
    /// counts; an answer to an id never asked is not indexed.
    Answered(String),
}

/// One request as the index finds it: the chunk that asked and, once
/// answered, the chunk that answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedRequest {
    pub request_id: String,
    pub asked: StoredChunk,
    pub answered: Option<StoredChunk>,
}

/// Which requests of a run to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFilter {
    All,
    /// Those without an answer.
    Pending,
}
