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

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use sha2::{Digest, Sha256};

use super::{Error, Result, Tenant, Timestamp};

/// Bytes per item of a [`BlobStream`].
pub const READ_CHUNK: usize = 1 << 20;

/// A blob's bytes in order.
pub type BlobStream = BoxStream<'static, Result<Bytes>>;

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
pub trait BlobStore: Send + Sync {
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

    /// Which of `hashes` the tenant has not stored.
    async fn missing(&self, tenant: &Tenant, hashes: &[String]) -> Result<Vec<String>>;

    /// The size of the tenant's blob, or [`Error::NotFound`].
    async fn size(&self, tenant: &Tenant, sha256: &str) -> Result<u64>;

    /// The bytes of the tenant's blob in chunks of at most [`READ_CHUNK`];
    /// [`Error::NotFound`] up front when the tenant has no such blob.
    async fn read(&self, tenant: &Tenant, sha256: &str) -> Result<BlobStream>;

    /// Every stored blob of every tenant (for garbage collection).
    async fn list(&self) -> Result<Vec<BlobKey>>;

    /// Remove these blobs (absent ones are ignored); returns how many went.
    async fn delete(&self, keys: &[BlobKey]) -> Result<u64>;

    /// Over every tenant's blobs.
    async fn stats(&self) -> Result<BlobStats>;
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

// ---------------------------------------------------------------- directory

/// The file in a tenant's directory that names the tenant.
const TENANT_FILE: &str = "tenant";

/// Blobs as files `<dir>/tenants/<tenant dir>/<first two hex digits>/<sha256>`,
/// written to `<dir>/tmp` and renamed into place, so a reader never sees
/// half a blob. A tenant's directory is the hex SHA-256 of its name (any
/// tenant name becomes a safe, fixed-length path component) and holds a
/// file `tenant` with the name, for listing.
#[derive(Debug, Clone)]
pub struct DirBlobStore {
    dir: PathBuf,
    /// Whether this file system makes unnamed files (`O_TMPFILE`) that
    /// can be linked in (probed at open).
    unnamed: bool,
}

/// A temp file not written for this long belongs to an upload that died
/// with its process (a crash mid-upload); younger ones may be another
/// process's upload in progress on the same directory.
const ABANDONED_UPLOAD: Duration = Duration::from_secs(3600);

impl DirBlobStore {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir.join("tmp")).map_err(|e| io(dir, e))?;
        std::fs::create_dir_all(dir.join("tenants")).map_err(|e| io(dir, e))?;
        let removed = remove_abandoned_uploads(&dir.join("tmp"), ABANDONED_UPLOAD);
        if removed > 0 {
            tracing::info!(removed, dir = %dir.display(), "removed temp files of abandoned blob uploads");
        }
        let unnamed = unnamed_files_work(&dir.join("tmp"));
        Ok(Self { dir: dir.to_path_buf(), unnamed })
    }

    /// The blob at `target`'s temp file (a new one if `temp` is none), with
    /// `held` written on. Blocking.
    fn temp_for(&self, target: &Path, temp: Option<TempBlob>, held: &[u8]) -> Result<TempBlob> {
        let mut temp = match temp {
            Some(temp) => temp,
            None => self.temp_in(target.parent().expect("blob paths have a parent"))?,
        };
        temp.write(held)?;
        Ok(temp)
    }

    /// A new temp file for a blob that will live in `parent` (created).
    fn temp_in(&self, parent: &Path) -> Result<TempBlob> {
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        if self.unnamed { TempBlob::unnamed(parent) } else { TempBlob::named(&self.temp_dir()) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// As on a file system without `O_TMPFILE` (tests of that path).
    #[cfg(test)]
    pub(crate) fn with_named_temp_files(mut self) -> Self {
        self.unnamed = false;
        self
    }

    fn tenant_dir(&self, tenant: &Tenant) -> PathBuf {
        self.dir.join("tenants").join(hex::encode(Sha256::digest(tenant.as_str().as_bytes())))
    }

    fn path(&self, tenant: &Tenant, sha256: &str) -> PathBuf {
        self.tenant_dir(tenant).join(&sha256[..2]).join(sha256)
    }

    fn temp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// The tenant's directory, named before its first blob lands (so every
    /// blob on disk can be listed with its tenant). Blocking.
    fn ensure_tenant_dir(&self, tenant: &Tenant) -> Result<()> {
        let named = self.tenant_dir(tenant).join(TENANT_FILE);
        if !named.try_exists().map_err(|e| io(&named, e))? {
            let mut temp = self.temp_in(&self.tenant_dir(tenant))?;
            temp.write(tenant.as_str().as_bytes())?;
            temp.persist(&named)?;
        }
        Ok(())
    }

    /// Whether blobs of the old, global layout (`<dir>/<2 hex>/<sha256>`)
    /// are still here: see [`Self::adopt_legacy`].
    pub fn has_legacy_blobs(&self) -> Result<bool> {
        Ok(!self.legacy_shards()?.is_empty())
    }

    fn legacy_shards(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| io(&self.dir, e))? {
            let entry = entry.map_err(|e| io(&self.dir, e))?;
            let name = entry.file_name();
            let is_shard =
                name.len() == 2 && name.to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_hexdigit()));
            if is_shard && entry.file_type().map_err(|e| io(&self.dir, e))?.is_dir() {
                out.push(entry.path());
            }
        }
        Ok(out)
    }

    /// Move blobs of the old global layout into the namespaces of the
    /// tenants whose checkpoints reference them (`owners`: every
    /// (tenant, hash) a checkpoint references; a blob referenced by two
    /// tenants is hard-linked into both), then remove the old layout:
    /// blobs no checkpoint references go (a sweep would have collected
    /// them). Safe to run again after a crash. Returns the blobs adopted.
    pub async fn adopt_legacy(&self, owners: &[BlobKey]) -> Result<u64> {
        let (store, owners) = (self.clone(), owners.to_vec());
        blocking(move || store.adopt_legacy_blocking(&owners)).await
    }

    fn adopt_legacy_blocking(&self, owners: &[BlobKey]) -> Result<u64> {
        let mut adopted = 0;
        for key in owners {
            check_name(&key.sha256)?;
            let old = self.dir.join(&key.sha256[..2]).join(&key.sha256);
            if !old.try_exists().map_err(|e| io(&old, e))? {
                continue;
            }
            let new = self.path(&key.tenant, &key.sha256);
            if new.try_exists().map_err(|e| io(&new, e))? {
                continue;
            }
            self.ensure_tenant_dir(&key.tenant)?;
            let parent = new.parent().expect("blob paths have a parent");
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            // Blobs are immutable (replaced only by rename), so a shared
            // inode is safe; a copy where links are not possible.
            if std::fs::hard_link(&old, &new).is_err() {
                let data = std::fs::read(&old).map_err(|e| io(&old, e))?;
                let mut temp = self.temp_in(parent)?;
                temp.write(&data)?;
                temp.persist(&new)?;
            }
            adopted += 1;
        }
        for shard in self.legacy_shards()? {
            std::fs::remove_dir_all(&shard).map_err(|e| io(&shard, e))?;
        }
        Ok(adopted)
    }
}

/// Run blocking file work off the async workers, as one task.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Unavailable(format!("blob store task failed: {e}")))?
}

/// The next chunk of a blob file: up to [`READ_CHUNK`] bytes, in a buffer
/// sized for the `left` bytes its metadata promised.
fn read_chunk(file: &mut std::fs::File, left: u64, path: &Path) -> Result<Bytes> {
    use std::io::Read;
    let mut buf = Vec::with_capacity((left as usize).min(READ_CHUNK));
    file.take(READ_CHUNK as u64).read_to_end(&mut buf).map_err(|e| io(path, e))?;
    Ok(Bytes::from(buf))
}

/// The blob files under one tenant's directory.
fn list_tenant_dir(tenant_dir: &Path) -> Result<Vec<String>> {
    // `<tenant dir>/<2 hex>/<sha256>`: shards are the only directories.
    let shards = walkdir::WalkDir::new(tenant_dir)
        .min_depth(2)
        .max_depth(2)
        .into_iter()
        .filter_entry(|e| e.depth() != 1 || (e.file_name().len() == 2 && e.file_type().is_dir()));
    let mut out = Vec::new();
    for blob in shards {
        let name = blob.map_err(|e| io(tenant_dir, e.into()))?.into_path();
        let name = name.file_name().and_then(|n| n.to_str());
        if let Some(name) = name.filter(|n| shared::snapshot::is_sha256_hex(n)) {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// Removes the files of `tmp` not modified for `age`; how many it removed.
/// Best effort: a file it cannot read or remove stays for the next start.
fn remove_abandoned_uploads(tmp: &Path, age: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(tmp) else { return 0 };
    let now = std::time::SystemTime::now();
    entries
        .flatten()
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() >= age)
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Whether `O_TMPFILE` files can be made in `dir` and linked in by name
/// (through `/proc/self/fd`).
fn unnamed_files_work(dir: &Path) -> bool {
    let probe = dir.join(format!("probe-{}", uuid::Uuid::new_v4().simple()));
    let linked = TempBlob::unnamed(dir).and_then(|mut temp| temp.link(&probe)).is_ok();
    let _ = std::fs::remove_file(&probe);
    linked
}

/// A blob file being written: unnamed (`O_TMPFILE`) in the directory the
/// blob will live in, so nothing is left of it if the process dies; or,
/// where the file system has no unnamed files, named under `<dir>/tmp`
/// and removed unless persisted. Unnamed files in the blob's own shard
/// spread the creations over 256 directories: all in `tmp`, concurrent
/// uploads queued on that one directory's lock.
struct TempBlob {
    file: std::fs::File,
    /// The temp file's name, when it has one.
    name: Option<PathBuf>,
}

impl TempBlob {
    fn unnamed(dir: &Path) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
            .map_err(|e| io(dir, e))?;
        Ok(Self { file, name: None })
    }

    fn named(tmp: &Path) -> Result<Self> {
        let path = tmp.join(uuid::Uuid::new_v4().simple().to_string());
        let file = std::fs::File::create(&path).map_err(|e| io(&path, e))?;
        Ok(Self { file, name: Some(path) })
    }

    fn write(&mut self, data: &[u8]) -> Result<()> {
        use std::io::Write;
        self.file.write_all(data).map_err(|e| io(self.name.as_deref().unwrap_or(Path::new("(unnamed)")), e))
    }

    /// Give the file the name `target`: false (and nothing named) when
    /// `target` exists already.
    fn link(&mut self, target: &Path) -> Result<bool> {
        use std::os::fd::AsRawFd;
        let Some(name) = &self.name else {
            let fd = format!("/proc/self/fd/{}", self.file.as_raw_fd());
            let at = nix::fcntl::AT_FDCWD;
            return match nix::unistd::linkat(
                at,
                fd.as_str(),
                at,
                target,
                nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
            ) {
                Ok(()) => Ok(true),
                Err(nix::errno::Errno::EEXIST) => Ok(false),
                Err(e) => Err(io(target, e.into())),
            };
        };
        if target.try_exists().map_err(|e| io(target, e))? {
            return Ok(false);
        }
        std::fs::rename(name, target).map_err(|e| io(target, e))?;
        self.name = None;
        Ok(true)
    }

    /// Make the bytes durable, name them `target`, then make the name
    /// durable: once this returns, a crash leaves the whole blob at
    /// `target`. False (and nothing named) when `target` exists already
    /// (another save of the tenant stored it meanwhile).
    fn persist(mut self, target: &Path) -> Result<bool> {
        self.file.sync_all().map_err(|e| io(target, e))?;
        if !self.link(target)? {
            return Ok(false);
        }
        let parent = target.parent().expect("blob paths have a parent");
        if let Ok(dir) = std::fs::File::open(parent) {
            let _ = dir.sync_all();
        }
        Ok(true)
    }
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            let _ = std::fs::remove_file(name);
        }
    }
}

/// A blob up to this size waits in memory until its commit (one blocking
/// task writes, syncs and renames it); a larger one goes on to a temp file
/// as its pieces come.
const HELD_IN_MEMORY: usize = READ_CHUNK;

/// The pieces of an upload to a [`DirBlobStore`]: held in memory, or in a
/// temp file once larger than [`HELD_IN_MEMORY`]; fsynced and renamed onto
/// the blob's path at commit, unless the tenant holds the blob already.
struct DirSink {
    store: DirBlobStore,
    tenant: Tenant,
    target: PathBuf,
    held: Vec<u8>,
    temp: Option<TempBlob>,
}

#[async_trait]
impl BlobSink for DirSink {
    async fn write(&mut self, piece: &[u8]) -> Result<()> {
        if self.temp.is_none() && self.held.len() + piece.len() <= HELD_IN_MEMORY {
            self.held.extend_from_slice(piece);
            return Ok(());
        }
        let (temp, held, piece) = (self.temp.take(), std::mem::take(&mut self.held), piece.to_vec());
        let (store, target) = (self.store.clone(), self.target.clone());
        self.temp = Some(
            blocking(move || {
                let mut temp = store.temp_for(&target, temp, &held)?;
                temp.write(&piece)?;
                Ok(temp)
            })
            .await?,
        );
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<bool> {
        let DirSink { store, tenant, target, held, temp } = *self;
        blocking(move || {
            if target.try_exists().map_err(|e| io(&target, e))? {
                // Stored already: the bytes were checked, and are dropped.
                return Ok(false);
            }
            store.ensure_tenant_dir(&tenant)?;
            store.temp_for(&target, temp, &held)?.persist(&target)
        })
        .await
    }
}

#[async_trait]
impl BlobStore for DirBlobStore {
    fn backend_name(&self) -> &'static str {
        "dir"
    }

    /// Each finish is a blocking task and an fsync: many at once share the
    /// file system's journal commits.
    fn finishing_at_once(&self) -> usize {
        128
    }

    async fn begin_put(&self, tenant: &Tenant, sha256: &str, size: u64) -> Result<BlobUpload> {
        check_name(sha256)?;
        // No file work until a piece outgrows memory or the commit: one
        // blocking task per small blob.
        let sink = DirSink {
            store: self.clone(),
            tenant: tenant.clone(),
            target: self.path(tenant, sha256),
            held: Vec::with_capacity((size as usize).min(HELD_IN_MEMORY)),
            temp: None,
        };
        Ok(BlobUpload::new(sha256, size, Box::new(sink)))
    }

    async fn missing(&self, tenant: &Tenant, hashes: &[String]) -> Result<Vec<String>> {
        for h in hashes {
            check_name(h)?;
        }
        let (store, tenant, hashes) = (self.clone(), tenant.clone(), hashes.to_vec());
        // One blocking task for the lot (a save asks for every file's).
        blocking(move || {
            let mut out = Vec::new();
            for h in hashes {
                let path = store.path(&tenant, &h);
                if !path.try_exists().map_err(|e| io(&path, e))? {
                    out.push(h);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn size(&self, tenant: &Tenant, sha256: &str) -> Result<u64> {
        check_name(sha256)?;
        match tokio::fs::metadata(self.path(tenant, sha256)).await {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_found(sha256)),
            Err(e) => Err(io(&self.dir, e)),
        }
    }

    async fn read(&self, tenant: &Tenant, sha256: &str) -> Result<BlobStream> {
        check_name(sha256)?;
        let (path, name) = (self.path(tenant, sha256), sha256.to_string());
        // Opened and its first chunk read in one blocking task (the whole of
        // a small blob), each buffer no larger than what is left to read.
        let (file, first, size) = blocking(move || {
            let mut file = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found(&name)),
                Err(e) => return Err(io(&path, e)),
            };
            let size = file.metadata().map_err(|e| io(&path, e))?.len();
            let first = read_chunk(&mut file, size, &path)?;
            Ok(((file, path), first, size))
        })
        .await?;
        Ok(Box::pin(async_stream::try_stream! {
            let (mut file, mut read) = (Some(file), first.len() as u64);
            let mut chunk = first;
            while !chunk.is_empty() {
                let full = chunk.len() == READ_CHUNK;
                yield chunk;
                if !full {
                    break;
                }
                let (mut f, path) = file.take().expect("kept between chunks");
                let left = size.saturating_sub(read);
                let (f, next) = blocking(move || {
                    let next = read_chunk(&mut f, left, &path)?;
                    Ok(((f, path), next))
                })
                .await?;
                read += next.len() as u64;
                (file, chunk) = (Some(f), next);
            }
        }))
    }

    async fn list(&self) -> Result<Vec<BlobKey>> {
        let tenants = self.dir.join("tenants");
        blocking(move || list_tenants(&tenants)).await
    }

    /// All in one blocking task (a task per blob made a collection of
    /// 20,000 blobs 20,000 hand-offs).
    async fn delete(&self, keys: &[BlobKey]) -> Result<u64> {
        for key in keys {
            check_name(&key.sha256)?;
        }
        let paths: Vec<PathBuf> = keys.iter().map(|k| self.path(&k.tenant, &k.sha256)).collect();
        let dir = self.dir.clone();
        blocking(move || {
            let mut deleted = 0;
            for path in paths {
                match std::fs::remove_file(&path) {
                    Ok(()) => deleted += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(&dir, e)),
                }
            }
            Ok(deleted)
        })
        .await
    }

    async fn stats(&self) -> Result<BlobStats> {
        let store = self.clone();
        blocking(move || {
            let mut stats = BlobStats::default();
            for key in list_tenants(&store.dir.join("tenants"))? {
                stats.count += 1;
                let path = store.path(&key.tenant, &key.sha256);
                stats.bytes += std::fs::metadata(&path).map_or(0, |m| m.len());
            }
            Ok(stats)
        })
        .await
    }
}

/// Every blob of every tenant under `tenants`, sorted. Blocking.
fn list_tenants(tenants: &Path) -> Result<Vec<BlobKey>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(tenants).map_err(|e| io(tenants, e))? {
        let tenant_dir = entry.map_err(|e| io(tenants, e))?.path();
        // A directory without its name file holds no blob yet (the name
        // is written first).
        let Ok(name) = std::fs::read_to_string(tenant_dir.join(TENANT_FILE)) else { continue };
        let tenant = Tenant::new(name);
        for sha256 in list_tenant_dir(&tenant_dir)? {
            out.push(BlobKey { tenant: tenant.clone(), sha256 });
        }
    }
    out.sort();
    Ok(out)
}

// ---------------------------------------------------------------- postgres

/// Blobs as `bytea` rows of `snapshot_blobs`, keyed by (tenant, sha256),
/// read back in slices.
#[derive(Debug, Clone)]
pub struct PgBlobStore {
    pool: sqlx::PgPool,
}

impl PgBlobStore {
    pub fn new(pool: sqlx::PgPool) -> Self {
        Self { pool }
    }
}

/// The columns of `keys`, for `UNNEST`.
fn key_columns(keys: &[BlobKey]) -> (Vec<&str>, Vec<&str>) {
    keys.iter().map(|k| (k.tenant.as_str(), k.sha256.as_str())).unzip()
}

/// The pieces of an upload to a [`PgBlobStore`]: rows of a temporary
/// table in the upload's transaction, joined into the blob's row by the
/// database at commit (the server never holds the whole blob).
struct PgSink {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    tenant: Tenant,
    sha256: String,
    next: i32,
}

#[async_trait]
impl BlobSink for PgSink {
    async fn write(&mut self, piece: &[u8]) -> Result<()> {
        sqlx::query("INSERT INTO snapshot_blob_upload (seq, data) VALUES ($1, $2)")
            .bind(self.next)
            .bind(piece)
            .execute(&mut *self.tx)
            .await?;
        self.next += 1;
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<bool> {
        let PgSink { mut tx, tenant, sha256, .. } = *self;
        let inserted = sqlx::query(
            "INSERT INTO snapshot_blobs (tenant, sha256, size, data, created_at) \
             SELECT $1, $2, COALESCE(SUM(length(data)), 0), \
                    COALESCE(string_agg(data, ''::bytea ORDER BY seq), ''::bytea), $3 \
             FROM snapshot_blob_upload \
             ON CONFLICT (tenant, sha256) DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(&sha256)
        .bind(Timestamp::now().as_millis())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(inserted > 0)
    }
}

#[async_trait]
impl BlobStore for PgBlobStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    /// Each upload holds a pooled connection (its transaction) until it
    /// is stored: one finishing while the next streams in, so a save holds
    /// two of the pool's connections at most, never the runs' share.
    fn finishing_at_once(&self) -> usize {
        1
    }

    async fn begin_put(&self, tenant: &Tenant, sha256: &str, size: u64) -> Result<BlobUpload> {
        check_name(sha256)?;
        let mut tx = self.pool.begin().await?;
        // The pieces wait in a table of this transaction only: a rollback
        // (the upload dropped) or the commit removes it.
        sqlx::query(
            "CREATE TEMP TABLE snapshot_blob_upload (seq INT PRIMARY KEY, data BYTEA NOT NULL) \
             ON COMMIT DROP",
        )
        .execute(&mut *tx)
        .await?;
        let sink = PgSink { tx, tenant: tenant.clone(), sha256: sha256.to_string(), next: 0 };
        Ok(BlobUpload::new(sha256, size, Box::new(sink)))
    }

    async fn missing(&self, tenant: &Tenant, hashes: &[String]) -> Result<Vec<String>> {
        for h in hashes {
            check_name(h)?;
        }
        Ok(sqlx::query_scalar::<_, String>(
            "SELECT h FROM UNNEST($2::text[]) AS wanted(h) \
             WHERE NOT EXISTS (SELECT 1 FROM snapshot_blobs WHERE tenant = $1 AND sha256 = wanted.h)",
        )
        .bind(tenant.as_str())
        .bind(hashes)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn size(&self, tenant: &Tenant, sha256: &str) -> Result<u64> {
        check_name(sha256)?;
        sqlx::query_scalar::<_, i64>("SELECT size FROM snapshot_blobs WHERE tenant = $1 AND sha256 = $2")
            .bind(tenant.as_str())
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await?
            .map(|s| s as u64)
            .ok_or_else(|| not_found(sha256))
    }

    async fn read(&self, tenant: &Tenant, sha256: &str) -> Result<BlobStream> {
        let size = self.size(tenant, sha256).await?;
        let pool = self.pool.clone();
        let (tenant, sha256) = (tenant.clone(), sha256.to_string());
        Ok(Box::pin(async_stream::try_stream! {
            let mut offset = 0u64;
            while offset < size {
                // substring() counts from 1.
                let slice: Vec<u8> = sqlx::query_scalar(
                    "SELECT substring(data FROM $3::int FOR $4::int) FROM snapshot_blobs \
                     WHERE tenant = $1 AND sha256 = $2",
                )
                .bind(tenant.as_str())
                .bind(&sha256)
                .bind(offset as i64 + 1)
                .bind(READ_CHUNK as i64)
                .fetch_optional(&pool)
                .await?
                .ok_or_else(|| not_found(&sha256))?;
                if slice.is_empty() {
                    Err(Error::Corrupt(format!("blob {sha256} is shorter than its size")))?;
                }
                offset += slice.len() as u64;
                yield Bytes::from(slice);
            }
        }))
    }

    async fn list(&self) -> Result<Vec<BlobKey>> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT tenant, sha256 FROM snapshot_blobs ORDER BY tenant, sha256")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|(tenant, sha256)| BlobKey { tenant: Tenant::new(tenant), sha256 }).collect())
    }

    async fn delete(&self, keys: &[BlobKey]) -> Result<u64> {
        let (tenants, hashes) = key_columns(keys);
        Ok(sqlx::query(
            "DELETE FROM snapshot_blobs WHERE (tenant, sha256) IN \
             (SELECT * FROM UNNEST($1::text[], $2::text[]))",
        )
        .bind(tenants)
        .bind(hashes)
        .execute(&self.pool)
        .await?
        .rows_affected())
    }

    async fn stats(&self) -> Result<BlobStats> {
        let (count, bytes): (i64, Option<i64>) =
            sqlx::query_as("SELECT COUNT(*), SUM(size)::BIGINT FROM snapshot_blobs")
                .fetch_one(&self.pool)
                .await?;
        Ok(BlobStats { count: count as u64, bytes: bytes.unwrap_or(0) as u64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewCheckpoint, Stores};

    fn sha(data: &[u8]) -> String {
        hex::encode(Sha256::digest(data))
    }

    /// A blob file of the global layout, as stores before per-tenant blobs
    /// wrote them.
    fn write_legacy(dir: &Path, data: &[u8]) -> String {
        let h = sha(data);
        std::fs::create_dir_all(dir.join(&h[..2])).unwrap();
        std::fs::write(dir.join(&h[..2]).join(&h), data).unwrap();
        h
    }

    async fn read_all(blobs: &dyn BlobStore, tenant: &Tenant, h: &str) -> Vec<u8> {
        use futures::StreamExt;
        let mut out = Vec::new();
        let mut stream = blobs.read(tenant, h).await.unwrap();
        while let Some(chunk) = stream.next().await {
            out.extend(chunk.unwrap());
        }
        out
    }

    /// Every file under `dir`, but the tenants' name files.
    fn files_under(dir: &Path) -> Vec<PathBuf> {
        let files = walkdir::WalkDir::new(dir).into_iter().map(|e| e.unwrap());
        let files = files.filter(|e| e.file_type().is_file() && e.file_name() != TENANT_FILE);
        files.map(walkdir::DirEntry::into_path).collect()
    }

    async fn uploads_refused_or_abandoned_leave_no_file(store: DirBlobStore, dir: &Path) {
        let acme = Tenant::new("acme");
        let h = sha(b"0123456789");
        let mut up = store.begin_put(&acme, &h, 10).await.unwrap();
        up.write(b"01234").await.unwrap();
        assert!(matches!(up.write(b"567890").await, Err(Error::Invalid { .. })), "past the declared size");
        drop(up);
        let mut up = store.begin_put(&acme, &h, 10).await.unwrap();
        up.write(b"0123456788").await.unwrap();
        assert!(matches!(up.finish().await, Err(Error::Invalid { .. })), "other bytes");
        let mut up = store.begin_put(&acme, &h, 10).await.unwrap();
        up.write(b"012").await.unwrap();
        drop(up);
        // Past what is held in memory: on its way to a file when dropped.
        let large = vec![7u8; HELD_IN_MEMORY * 2 + 10];
        let mut up = store.begin_put(&acme, &sha(&large), large.len() as u64).await.unwrap();
        up.write(&large[..HELD_IN_MEMORY + 1]).await.unwrap();
        drop(up);
        assert_eq!(files_under(dir), Vec::<PathBuf>::new(), "nothing is left behind");
        assert!(store.list().await.unwrap().is_empty());
        let mut up = store.begin_put(&acme, &h, 10).await.unwrap();
        up.write(b"0123456789").await.unwrap();
        assert!(up.finish().await.unwrap());
        let mut up = store.begin_put(&acme, &sha(&large), large.len() as u64).await.unwrap();
        for piece in large.chunks(HELD_IN_MEMORY / 2 + 3) {
            up.write(piece).await.unwrap();
        }
        assert!(up.finish().await.unwrap());
        assert_eq!(read_all(&store, &acme, &h).await, b"0123456789");
        assert_eq!(read_all(&store, &acme, &sha(&large)).await, large);
        let blobs = [store.path(&acme, &h), store.path(&acme, &sha(&large))];
        let mut files = files_under(dir);
        files.sort();
        let mut expected = blobs.to_vec();
        expected.sort();
        assert_eq!(files, expected, "the blobs, and no temp file beside them");
    }

    #[tokio::test]
    async fn uploads_refused_or_abandoned_leave_no_file_with_unnamed_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirBlobStore::open(dir.path()).unwrap();
        assert!(store.unnamed, "this file system makes O_TMPFILE files");
        uploads_refused_or_abandoned_leave_no_file(store, dir.path()).await;
    }

    #[tokio::test]
    async fn uploads_refused_or_abandoned_leave_no_file_with_named_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirBlobStore::open(dir.path()).unwrap().with_named_temp_files();
        uploads_refused_or_abandoned_leave_no_file(store, dir.path()).await;
    }

    #[test]
    fn opening_removes_the_temp_files_of_uploads_abandoned_long_ago_only() {
        let dir = tempfile::tempdir().unwrap();
        DirBlobStore::open(dir.path()).unwrap();
        let tmp = dir.path().join("tmp");
        let (old, fresh) = (tmp.join("old"), tmp.join("fresh"));
        std::fs::write(&fresh, b"in progress").unwrap();
        let file = std::fs::File::create(&old).unwrap();
        file.set_modified(std::time::SystemTime::now() - ABANDONED_UPLOAD - Duration::from_secs(1)).unwrap();
        drop(file);
        DirBlobStore::open(dir.path()).unwrap();
        assert!(!old.exists(), "a crash's leftover is removed");
        assert!(fresh.exists(), "an upload that may still be going is kept");
    }

    #[tokio::test]
    async fn legacy_blobs_go_to_every_tenant_that_references_them_and_the_rest_goes() {
        let dir = tempfile::tempdir().unwrap();
        let (shared, own, garbage) = (
            write_legacy(dir.path(), b"shared"),
            write_legacy(dir.path(), b"own"),
            write_legacy(dir.path(), b"garbage"),
        );
        let store = DirBlobStore::open(dir.path()).unwrap();
        assert!(store.has_legacy_blobs().unwrap());
        let (acme, globex) = (Tenant::new("acme"), Tenant::new("../globex"));
        let owners = [
            BlobKey::new(&acme, &shared),
            BlobKey::new(&globex, &shared),
            BlobKey::new(&acme, &own),
            // Referenced, but its file was already gone.
            BlobKey::new(&globex, sha(b"lost")),
        ];
        assert_eq!(store.adopt_legacy(&owners).await.unwrap(), 3);
        assert!(!store.has_legacy_blobs().unwrap());
        assert_eq!(read_all(&store, &acme, &shared).await, b"shared");
        assert_eq!(read_all(&store, &globex, &shared).await, b"shared");
        assert_eq!(read_all(&store, &acme, &own).await, b"own");
        assert_eq!(
            store.missing(&globex, std::slice::from_ref(&own)).await.unwrap(),
            std::slice::from_ref(&own)
        );
        let listed = store.list().await.unwrap();
        assert_eq!(listed.len(), 3, "{listed:?}");
        assert!(listed.iter().all(|k| k.sha256 != garbage), "unreferenced legacy blobs are dropped");
        // Deleting one tenant's link leaves the other's.
        store.delete(&[BlobKey::new(&acme, &shared)]).await.unwrap();
        assert_eq!(read_all(&store, &globex, &shared).await, b"shared");
        // Again (after a crash, say): nothing left to do.
        assert_eq!(store.adopt_legacy(&owners).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn opening_the_sqlite_stores_adopts_legacy_blobs_by_their_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sandhold.db").display());
        let acme = Tenant::new("acme");
        let h = sha(b"from before");
        let stores = Stores::open(&url).await.unwrap();
        let claim = stores.checkpoints.claim_writer(&acme, "t").await.unwrap();
        let new = NewCheckpoint {
            run_id: "r".into(),
            label: "old".into(),
            manifest: Vec::new(),
            blobs: vec![h.clone()],
            file_count: 1,
            dir_count: 0,
            total_bytes: 11,
            uploaded_bytes: 11,
        };
        stores.checkpoints.commit(&claim, new, "p").await.unwrap();
        stores.close().await;
        write_legacy(&dir.path().join("snapshot-blobs"), b"from before");
        let stores = Stores::open(&url).await.unwrap();
        assert_eq!(read_all(stores.blobs.as_ref(), &acme, &h).await, b"from before");
        assert_eq!(stores.blobs.list().await.unwrap(), [BlobKey::new(&acme, &h)]);
        stores.close().await;
    }
}
