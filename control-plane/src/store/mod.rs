//! Durable state of the control plane: run records ([`RunStore`]), per-run
//! event logs ([`EventLog`]), sandbox instances ([`InstanceStore`]), sandbox
//! definitions ([`DefinitionStore`]) and API tokens ([`TokenStore`]).
//!
//! Two backends implement every trait: SQLite (the embedded default, one file
//! under the data dir) and PostgreSQL (shared by any number of replicas).
//! [`Stores::open`] picks one from the database URL and applies the embedded
//! migrations. Each trait has one conformance suite run against both.
//!
//! # Fencing
//!
//! A run is written by one driver at a time. Each successful
//! [`RunStore::claim`] bumps the run's `driver_epoch`; every append
//! ([`EventLog::append`]) and every terminal write ([`RunStore::finish`])
//! carries the writer's epoch and is applied only if it still equals the
//! record's, checked atomically with the write (see the backends for the
//! argument). Epochs only grow, so a refused epoch is refused forever: the
//! fence latches by construction. [`LogWriter`] additionally latches in
//! memory so a superseded writer stops without another round trip.

mod attempts;
pub mod blob;
mod checkpoint;
mod checkpoint_sql;
mod definitions;
mod error;
mod event_log;
mod group;
mod instances;
mod nodes;
mod postgres;
mod presence;
mod primitives;
mod requests;
mod requests_sql;
mod runs;
mod sql;
mod sqlite;
mod stores;
mod tail;
mod tokens;
mod warm;
mod writer;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod snapshot_conformance;

pub use shared::ids::RunId;

pub use attempts::{AttemptRecord, AttemptSetRecord, AttemptStore, Promotion};
pub use blob::{BlobBatch, BlobKey, BlobStats, BlobStore, DirBlobStore, PgBlobStore};
pub use checkpoint::{Adopted, Checkpoint, CheckpointStore, DeleteBlobs, Fork, NewCheckpoint, WriterClaim};
pub use definitions::{DERIVED_PREFIX, Definition, DefinitionStore};
pub use error::{Error, Result};
pub use event_log::{
    ChunkStream, EventLog, LogSnapshot, NewChunk, Offset, PAGE_CHUNKS, StoredChunk, paged, stored_after,
};
pub use group::GroupCommit;
pub use instances::{
    Instance, InstanceStore, LIVE_HISTORY, LiveChange, LiveNetwork, NetworkChange, NewInstance,
};
pub use nodes::{NewNode, NodeRecord, NodeStore};
pub use presence::Presence;
pub use primitives::{Epoch, FIRST_EPOCH, FIRST_OFFSET, TAIL_POLL_INTERVAL, Tenant, Timestamp};
pub use requests::{IndexedRequest, MarkOf, RequestFilter, RequestMark};
pub use runs::{
    Admitted, CreatedRun, NewRun, RunError, RunFilter, RunFinish, RunKey, RunRecord, RunStatus, RunStore,
    RunUpdate, SentinelKey, generated_run_id,
};
use stores::Pool;
pub use stores::Stores;
pub use tokens::TokenStore;
pub(crate) use tokens::token_hash;
pub use warm::{WarmPool, WarmSandbox, WarmState, WarmStore};
pub use writer::LogWriter;

pub use crate::config::default_database_url;
