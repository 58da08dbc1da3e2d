//! Content-addressed blobs of portable snapshots: the bytes of one captured
//! file (secret values already zeroed), named by the hex SHA-256 of those
//! bytes, **per tenant**. Two backends behind [`BlobStore`]: a directory under
//! the data dir (the embedded default) and a PostgreSQL table (shared by
//! replicas). One conformance suite (`snapshot_conformance.rs`) runs against
//! both.
//!
//! # One namespace per tenant
//!
//! A blob is the pair (tenant, hash): the same bytes stored by two tenants
//! are two blobs. So a tenant learns nothing from the store about another
//! tenant's bytes (`missing` and a save's `uploaded_bytes` answer for its
//! own blobs only), and a manifest entry that claims another tenant's hash
//! (the agent that reports manifests runs inside the tenant's sandbox)
//! names a blob this tenant does not have: the save asks for its bytes and
//! `put` hashes them on receipt. De-duplication stays within a tenant.
//!
//! A blob is immutable: `put` of a stored (tenant, hash) is a no-op, and
//! `put` refuses bytes that do not hash to the name.
//!
//! # Streamed in pieces
//!
//! A blob arrives as a [`BlobUpload`] ([`BlobStore::begin_put`]): pieces
//! in order, hashed and counted as they pass, never joined in memory. The
//! upload refuses a piece that would take it past its declared size, and
//! [`BlobUpload::finish`] stores it only when the count and the hash are
//! the name's; an upload dropped unfinished (refused, or its save gone)
//! leaves nothing behind. Which blobs are still
//! needed is the checkpoint store's business
//! ([`super::CheckpointStore::sweep`]).

mod dir;
mod file;
mod pack;
mod postgres;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use sha2::{Digest, Sha256};

use super::{Error, Result, Tenant};

pub use dir::DirBlobStore;
pub use postgres::PgBlobStore;

/// Bytes per item of a [`BlobStream`].
pub const READ_CHUNK: usize = 1 << 20;

/// A blob's bytes in order.
pub type BlobStream = BoxStream<'static, Result<Bytes>>;

/// The pieces of many blobs ([`BlobStore::read_many`]), each with its
/// blob's name.
pub type ManyBlobs = BoxStream<'static, (String, Result<Bytes>)>;

/// Blobs [`read_each`] opens ahead of the one it is reading.
const READ_AHEAD: usize = 8;

/// What a blob store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlobStats {
    pub count: u64,
    pub bytes: u64,
}

/// One stored blob: whose it is and which bytes (for garbage collection).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobKey {
    pub tenant: Tenant,
    pub sha256: String,
}

impl BlobKey {
    pub fn new(tenant: &Tenant, sha256: impl Into<String>) -> Self {
        Self { tenant: tenant.clone(), sha256: sha256.into() }
    }
}

/// Where a backend puts the pieces of one upload until it is verified.
/// Dropped without [`BlobSink::commit`]: the pieces are discarded.
#[async_trait]
pub trait BlobSink: Send {
    async fn write(&mut self, piece: &[u8]) -> Result<()>;

    /// Make the pieces the blob (they were verified); true when newly
    /// stored for this tenant.
    async fn commit(self: Box<Self>) -> Result<bool>;
}

/// One blob being stored, piece by piece: each piece hashed and counted on
/// its way to the backend's sink. Dropping it unfinished aborts it.
pub struct BlobUpload {
    sha256: String,
    size: u64,
    written: u64,
    hasher: Sha256,
    sink: Box<dyn BlobSink>,
}

impl BlobUpload {
    pub fn new(sha256: &str, size: u64, sink: Box<dyn BlobSink>) -> Self {
        Self { sha256: sha256.to_string(), size, written: 0, hasher: Sha256::new(), sink }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The next piece; [`Error::Invalid`] when it takes the blob past its
    /// declared size (nothing of it is written).
    pub async fn write(&mut self, piece: &[u8]) -> Result<()> {
        let total = self.written.saturating_add(piece.len() as u64);
        if total > self.size {
            return Err(Error::invalid(
                "blob",
                format!("more than the {} bytes declared for {}", self.size, self.sha256),
            ));
        }
        self.hasher.update(piece);
        self.written = total;
        self.sink.write(piece).await
    }

    /// Store the blob once all its declared bytes came and hash to its
    /// name ([`Error::Invalid`] otherwise, and nothing is stored). True
    /// when newly stored for this tenant.
    pub async fn finish(self) -> Result<bool> {
        if self.written != self.size {
            return Err(Error::invalid(
                "blob",
                format!("{} bytes came for {}, {} were declared", self.written, self.sha256, self.size),
            ));
        }
        let actual = hex::encode(self.hasher.finalize());
        if actual != self.sha256 {
            return Err(Error::invalid("blob", format!("bytes hash to {actual}, not {}", self.sha256)));
        }
        self.sink.commit().await
    }
}

#[async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// `"dir"` or `"postgres"`.
    fn backend_name(&self) -> &'static str;

    /// Begin storing the tenant's `sha256`, of `size` bytes, in pieces.
    async fn begin_put(&self, tenant: &Tenant, sha256: &str, size: u64) -> Result<BlobUpload>;

    /// How many uploads one save may have finishing at once (each may hold
    /// something shared until it is stored: a pooled connection).
    fn finishing_at_once(&self) -> usize;

    /// Store `data` as the tenant's `sha256` (one upload of it, in pieces
    /// of [`READ_CHUNK`]). [`Error::Invalid`] when the bytes hash to
    /// something else (nothing is stored). Returns true when newly stored
    /// for this tenant (whatever other tenants hold).
    async fn put(&self, tenant: &Tenant, sha256: &str, data: Bytes) -> Result<bool> {
        let mut upload = self.begin_put(tenant, sha256, data.len() as u64).await?;
        for piece in data.chunks(READ_CHUNK) {
            upload.write(piece).await?;
        }
        upload.finish().await
    }

    /// A batch for the tenant's blobs of one save, whose blobs will be of
    /// these `sizes` (a backend may store them together: see
    /// [`BlobBatch`]).
    async fn begin_batch(&self, tenant: &Tenant, sizes: &[u64]) -> Result<Box<dyn BlobBatch>>;

    /// Which of `hashes` the tenant has not stored.
    async fn missing(&self, tenant: &Tenant, hashes: &[String]) -> Result<Vec<String>>;

    /// The size of the tenant's blob, or [`Error::NotFound`].
    async fn size(&self, tenant: &Tenant, sha256: &str) -> Result<u64>;

    /// The bytes of the tenant's blob in chunks of at most [`READ_CHUNK`];
    /// [`Error::NotFound`] up front when the tenant has no such blob.
    async fn read(&self, tenant: &Tenant, sha256: &str) -> Result<BlobStream>;

    /// The tenant's blobs `hashes` (a restore's), in the order the backend
    /// reads them best: every piece of each (at most [`READ_CHUNK`]) with
    /// its name, a blob's pieces together and in order, an empty blob one
    /// empty piece. A blob that cannot be read is an `Err` (after what was
    /// read of it), and the others still come.
    fn read_many(self: Arc<Self>, tenant: &Tenant, hashes: Vec<String>) -> ManyBlobs {
        read_each(self, tenant.clone(), hashes)
    }

    /// Every stored blob of every tenant (for garbage collection).
    async fn list(&self) -> Result<Vec<BlobKey>>;

    /// Remove these blobs (absent ones are ignored); returns how many went.
    async fn delete(&self, keys: &[BlobKey]) -> Result<u64>;

    /// Over every tenant's blobs.
    async fn stats(&self) -> Result<BlobStats>;
}

/// The blobs one save stores: each through [`BlobBatch::begin_put`] as
/// through [`BlobStore::begin_put`], but stored for good (read, listed,
/// not missing) only once [`BlobBatch::seal`] returned, so a backend may
/// make many durable at once (the directory store packs small ones).
/// Dropped unsealed, what was not stored for good is discarded.
#[async_trait]
pub trait BlobBatch: Send + Sync {
    /// An upload of the batch. Its `finish` is true when the blob is new
    /// to the batch (the save asked for what the tenant was missing).
    async fn begin_put(&self, sha256: &str, size: u64) -> Result<BlobUpload>;

    /// Store the batch's finished uploads for good (every upload is
    /// finished or dropped by then).
    async fn seal(self: Box<Self>) -> Result<()>;
}

/// A batch that stores each blob as it finishes (a backend with nothing to
/// gain from storing them together).
pub struct OneByOne<S> {
    store: S,
    tenant: Tenant,
}

impl<S> OneByOne<S> {
    pub fn new(store: S, tenant: &Tenant) -> Self {
        Self { store, tenant: tenant.clone() }
    }
}

#[async_trait]
impl<S: BlobStore> BlobBatch for OneByOne<S> {
    async fn begin_put(&self, sha256: &str, size: u64) -> Result<BlobUpload> {
        self.store.begin_put(&self.tenant, sha256, size).await
    }

    async fn seal(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// [`BlobStore::read_many`] by [`BlobStore::read`] of one blob after
/// another, a few opened ahead (one blocking open after another left the
/// reader waiting).
fn read_each<S: BlobStore + ?Sized>(store: Arc<S>, tenant: Tenant, hashes: Vec<String>) -> ManyBlobs {
    let opened = futures::stream::iter(hashes)
        .map(move |sha256| {
            let (store, tenant) = (store.clone(), tenant.clone());
            async move {
                let pieces = store.read(&tenant, &sha256).await;
                (sha256, pieces)
            }
        })
        .buffered(READ_AHEAD);
    Box::pin(async_stream::stream! {
        futures::pin_mut!(opened);
        while let Some((sha256, pieces)) = opened.next().await {
            let mut pieces = match pieces {
                Ok(pieces) => pieces,
                Err(e) => {
                    yield (sha256, Err(e));
                    continue;
                }
            };
            let mut any = false;
            while let Some(piece) = pieces.next().await {
                let failed = piece.is_err();
                any = true;
                yield (sha256.clone(), piece);
                if failed {
                    break;
                }
            }
            if !any {
                yield (sha256, Ok(Bytes::new()));
            }
        }
    })
}

fn check_name(sha256: &str) -> Result<()> {
    if shared::snapshot::is_sha256_hex(sha256) {
        Ok(())
    } else {
        Err(Error::invalid("blob", format!("{sha256:?} is not a hex SHA-256")))
    }
}

fn not_found(sha256: &str) -> Error {
    Error::NotFound(format!("blob {sha256}"))
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Unavailable(format!("blob store {}: {e}", path.display()))
}

/// Run blocking file work off the async workers, as one task.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Unavailable(format!("blob store task failed: {e}")))?
}
