//! Checkpoint records of portable snapshots: per thread a head and a writer
//! fence, per checkpoint its manifest and the blobs it references, and pins
//! that keep a save's blobs alive until its checkpoint commits.
//!
//! # One writer per thread
//!
//! A save first [`CheckpointStore::claim_writer`]s the thread: the thread's
//! `writer_epoch` is bumped and the claim remembers it with the head it saw.
//! [`CheckpointStore::commit`] writes the checkpoint, its blob references,
//! the new head and drops the save's pins in one transaction, and only if
//! the epoch is still the claim's ([`Error::WriterLost`] otherwise: a newer
//! save claimed the thread) and the head is still the one the claim saw
//! ([`Error::StaleHead`]: a delete or another writer moved it).
//!
//! # Garbage collection against concurrent saves
//!
//! Blobs are per tenant ([`super::blob`]): a checkpoint references blobs of
//! its own tenant, a pin protects blobs of the tenant that pinned them, and
//! the sweep decides per (tenant, hash), so what one tenant's checkpoints
//! and saves hold never keeps, nor loses, another tenant's blob.
//!
//! A save pins every blob of its manifest ([`CheckpointStore::pin_blobs`])
//! *before* it asks the blob store which ones it lacks. A sweep deletes
//! blobs referenced by no checkpoint and no live pin, inside a transaction
//! that excludes pinning: SQLite's single writer, or on PostgreSQL an
//! exclusive transaction-scoped advisory lock that pinning takes shared. So
//! either the pin commits first (the sweep sees it and keeps the blob) or
//! the sweep's deletions finish first (the save then finds the blob missing
//! and uploads it). Pins older than the sweep's TTL (a save that died) no
//! longer protect anything.

use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;

use super::blob::BlobKey;
use super::{Result, Tenant, Timestamp};

/// A checkpoint as listed (without its manifest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub checkpoint_id: String,
    pub tenant: Tenant,
    pub thread_id: String,
    pub parent_id: Option<String>,
    pub run_id: String,
    pub label: String,
    pub forked_from: Option<String>,
    pub file_count: u64,
    pub dir_count: u64,
    pub total_bytes: u64,
    pub uploaded_bytes: u64,
    pub created_at: Timestamp,
}

/// What a save commits.
#[derive(Debug, Clone)]
pub struct NewCheckpoint {
    pub run_id: String,
    pub label: String,
    /// The encoded manifest (opaque to the store).
    pub manifest: Vec<u8>,
    /// Every blob the manifest references (the tenant's own).
    pub blobs: Vec<String>,
    pub file_count: u64,
    pub dir_count: u64,
    pub total_bytes: u64,
    pub uploaded_bytes: u64,
}

/// What [`CheckpointStore::adopt`] made.
#[derive(Debug, Clone)]
pub struct Adopted {
    /// The copy of the checkpoint: the thread's new head.
    pub checkpoint: Checkpoint,
    /// The copy of the run.
    pub run: super::RunId,
}

/// What a fork made in the new thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fork {
    /// The copy of the chosen checkpoint: the new thread's head.
    pub checkpoint: Checkpoint,
    /// The copied conversation, oldest first: one run per terminal run of
    /// the source thread that started at or before the chosen checkpoint
    /// was written, under a fresh id, with its whole event log.
    pub runs: Vec<super::RunId>,
}

/// The right to write the thread's next checkpoint, until a newer claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterClaim {
    pub tenant: Tenant,
    pub thread_id: String,
    pub epoch: u64,
    /// The head when claimed: the new checkpoint's parent.
    pub head: Option<String>,
}

/// Deletes the given blobs from the blob store (called inside the sweep's
/// transaction).
pub type DeleteBlobs<'a> = &'a (dyn Fn(Vec<BlobKey>) -> BoxFuture<'a, Result<u64>> + Send + Sync);

#[async_trait]
pub trait CheckpointStore: Send + Sync {
    /// Become the thread's writer (creating the thread's record).
    async fn claim_writer(&self, tenant: &Tenant, thread_id: &str) -> Result<WriterClaim>;

    /// Commit a checkpoint as the thread's new head, with its blob
    /// references, dropping the pins of `pin_id`, in one transaction; fenced
    /// by the claim (see the module docs).
    async fn commit(&self, claim: &WriterClaim, new: NewCheckpoint, pin_id: &str) -> Result<Checkpoint>;

    /// The thread's head checkpoint, if any.
    async fn head(&self, tenant: &Tenant, thread_id: &str) -> Result<Option<Checkpoint>>;

    /// The thread's checkpoints, oldest first.
    async fn list(&self, tenant: &Tenant, thread_id: &str) -> Result<Vec<Checkpoint>>;

    /// A checkpoint of this tenant's thread with its manifest;
    /// [`super::Error::NotFound`] for another thread's or tenant's.
    async fn get(
        &self,
        tenant: &Tenant,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<(Checkpoint, Vec<u8>)>;

    /// Copy the checkpoint into `new_thread_id` as its head, together with
    /// the thread's conversation up to it, in one transaction: every
    /// terminal run of the source thread that started at or before the
    /// checkpoint was written becomes a run of the new thread under a fresh
    /// id ([`super::RunRecord::forked_from_run`] names the source), with the
    /// same status, times, error, usage, spec, harness session and event log (same offsets,
    /// kinds and payloads), no sandbox, a closed log and a fresh sentinel
    /// key. Runs still going, and runs that started later, are not copied.
    /// [`super::Error::NotEmpty`] when the destination has a checkpoint or a
    /// run (nothing is copied then).
    async fn fork(
        &self,
        tenant: &Tenant,
        thread_id: &str,
        checkpoint_id: &str,
        new_thread_id: &str,
    ) -> Result<Fork>;

    /// Copy checkpoint `checkpoint_id` of `from_thread` into `thread_id`
    /// as its new head (its parent the old head), and the ended run
    /// `run_id` of `from_thread` with it, as [`CheckpointStore::fork`]
    /// copies runs: how an attempt is promoted. One transaction.
    async fn adopt(
        &self,
        tenant: &Tenant,
        from_thread: &str,
        checkpoint_id: &str,
        run_id: &str,
        thread_id: &str,
    ) -> Result<Adopted>;

    /// Delete the checkpoint (and its blob references); a deleted head is
    /// replaced by the newest remaining checkpoint.
    async fn delete(&self, tenant: &Tenant, thread_id: &str, checkpoint_id: &str) -> Result<()>;

    /// Protect these blobs of the tenant from the sweep until `unpin` or
    /// the commit.
    async fn pin_blobs(&self, tenant: &Tenant, pin_id: &str, hashes: &[String]) -> Result<()>;

    async fn unpin(&self, pin_id: &str) -> Result<()>;

    /// Delete, through `delete`, the blobs of `stored` that no checkpoint of
    /// their tenant references and no pin of their tenant younger than
    /// `pin_ttl` protects; returns them.
    async fn sweep(
        &self,
        stored: Vec<BlobKey>,
        pin_ttl: Duration,
        delete: DeleteBlobs<'_>,
    ) -> Result<Vec<BlobKey>>;
}
