//! The directory backend: a blob per file, or many small blobs of one
//! save in a pack.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::file::{TempBlob, remove_abandoned_uploads, unnamed_files_work};
use super::pack::{self, Appended, Hash, Location, PACKS, PackWriter, TenantPacks, hash_of};
use super::{
    BlobBatch, BlobKey, BlobSink, BlobStats, BlobStore, BlobStream, BlobUpload, ManyBlobs, READ_CHUNK,
    blocking, check_name, io, not_found, read_each,
};
use crate::store::{Error, Result, Tenant};

/// The file in a tenant's directory that names the tenant.
const TENANT_FILE: &str = "tenant";

/// Blobs as files `<dir>/tenants/<tenant dir>/<first two hex digits>/<sha256>`,
/// or in packs `<dir>/tenants/<tenant dir>/packs/<id>.pack` (the small
/// blobs of a save that stores many: [`super::pack`]), each made durable
/// before it gets its name, so a reader never sees half a blob. A tenant's
/// directory is the hex SHA-256 of its name (any tenant name becomes a
/// safe, fixed-length path component) and holds a file `tenant` with the
/// name, for listing.
#[derive(Debug, Clone)]
pub struct DirBlobStore {
    dir: PathBuf,
    /// Whether this file system makes unnamed files (`O_TMPFILE`) that
    /// can be linked in (probed at open).
    unnamed: bool,
    /// What the packs of recently used tenants hold (by tenant directory).
    packs: Arc<Mutex<HashMap<PathBuf, Arc<TenantPacks>>>>,
}

/// A batch packs its blobs of up to this size ...
const PACKED_MAX: u64 = HELD_IN_MEMORY as u64;
/// ... when it has at least this many (fewer are files of their own: a
/// save that changed a few files makes no pack of a few blobs).
const PACK_AT_LEAST: usize = 16;
/// The tenants whose packs are kept read (each a map of its packed blobs,
/// ~70 bytes a blob).
const TENANTS_KEPT: usize = 16;

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
        Ok(Self { dir: dir.to_path_buf(), unnamed, packs: Arc::default() })
    }

    fn packs_dir(&self, tenant: &Tenant) -> PathBuf {
        self.tenant_dir(tenant).join(PACKS)
    }

    /// The tenant's packs, read again from disk (and kept). Blocking.
    fn packs_now(&self, tenant: &Tenant) -> Result<Arc<TenantPacks>> {
        let key = self.tenant_dir(tenant);
        let previous = self.packs.lock().expect("packs").get(&key).cloned();
        let now = Arc::new(pack::scan(&key.join(PACKS), previous.as_deref())?);
        let mut kept = self.packs.lock().expect("packs");
        if kept.len() >= TENANTS_KEPT && !kept.contains_key(&key) {
            let any = kept.keys().next().cloned().expect("not empty");
            kept.remove(&any);
        }
        kept.insert(key, now.clone());
        Ok(now)
    }

    /// The tenant's packs as last read (read now if never). Blocking.
    fn packs_known(&self, tenant: &Tenant) -> Result<Arc<TenantPacks>> {
        let known = self.packs.lock().expect("packs").get(&self.tenant_dir(tenant)).cloned();
        match known {
            Some(known) => Ok(known),
            None => self.packs_now(tenant),
        }
    }

    /// Where the tenant's packed blob is: as last read, else as read now.
    /// Blocking.
    fn packed(&self, tenant: &Tenant, hash: &Hash) -> Result<Option<Location>> {
        if let Some(at) = self.packs_known(tenant)?.get(hash) {
            return Ok(Some(at.clone()));
        }
        Ok(self.packs_now(tenant)?.get(hash).cloned())
    }

    /// Which of `hashes` are packed (as the tenant's packs were last read),
    /// in runs to read together; and the rest. Blocking.
    fn plan_reads(&self, tenant: &Tenant, hashes: Vec<String>) -> (Vec<pack::Run>, Vec<String>) {
        let Ok(packs) = self.packs_known(tenant) else { return (Vec::new(), hashes) };
        let (mut located, mut rest) = (Vec::new(), Vec::new());
        for sha256 in hashes {
            match check_name(&sha256).ok().and_then(|()| packs.get(&hash_of(&sha256))) {
                Some(at) => located.push((sha256, at.clone())),
                None => rest.push(sha256),
            }
        }
        (pack::runs(located), rest)
    }

    /// Every blob of the tenant whose directory is `tenant_dir`, with its
    /// size: its files and its packs' live blobs. Blocking.
    fn tenant_blobs(&self, tenant: &Tenant, tenant_dir: &Path) -> Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for (hash, len) in self.packs_now(tenant)?.live() {
            out.insert(hex::encode(hash), len);
        }
        for sha256 in list_tenant_dir(tenant_dir)? {
            if let std::collections::btree_map::Entry::Vacant(blob) = out.entry(sha256) {
                // Deleted since the listing: not a blob any more.
                let Ok(meta) = std::fs::metadata(self.path(tenant, blob.key())) else { continue };
                blob.insert(meta.len());
            }
        }
        Ok(out)
    }

    /// Every tenant with a blob directory, by name. Blocking.
    fn tenants(&self) -> Result<Vec<(Tenant, PathBuf)>> {
        let tenants = self.dir.join("tenants");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&tenants).map_err(|e| io(&tenants, e))? {
            let tenant_dir = entry.map_err(|e| io(&tenants, e))?.path();
            // A directory without its name file holds no blob yet (the name
            // is written first).
            let Ok(name) = std::fs::read_to_string(tenant_dir.join(TENANT_FILE)) else { continue };
            out.push((Tenant::new(name), tenant_dir));
        }
        Ok(out)
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

/// A blob up to this size waits in memory until its commit (one blocking
/// task writes, syncs and renames it, or its batch's pack takes it); a
/// larger one goes on to a temp file as its pieces come.
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

    async fn begin_batch(&self, tenant: &Tenant, sizes: &[u64]) -> Result<Box<dyn BlobBatch>> {
        let small = sizes.iter().filter(|s| **s <= PACKED_MAX).count();
        let pack = if small >= PACK_AT_LEAST {
            let (store, tenant) = (self.clone(), tenant.clone());
            let writer = blocking(move || {
                store.ensure_tenant_dir(&tenant)?;
                let dir = store.packs_dir(&tenant);
                Ok(PackWriter::new(dir.clone(), store.temp_in(&dir)?))
            })
            .await?;
            Some(Arc::new(writer))
        } else {
            None
        };
        Ok(Box::new(DirBatch { store: self.clone(), tenant: tenant.clone(), pack }))
    }

    async fn missing(&self, tenant: &Tenant, hashes: &[String]) -> Result<Vec<String>> {
        for h in hashes {
            check_name(h)?;
        }
        let (store, tenant, hashes) = (self.clone(), tenant.clone(), hashes.to_vec());
        // One blocking task for the lot (a save asks for every file's);
        // the packs as they are now (what another process stored or
        // collected counts).
        blocking(move || {
            let packs = store.packs_now(&tenant)?;
            let mut out = Vec::new();
            for h in hashes {
                if packs.get(&hash_of(&h)).is_some() {
                    continue;
                }
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
        let (store, tenant, name) = (self.clone(), tenant.clone(), sha256.to_string());
        blocking(move || match std::fs::metadata(store.path(&tenant, &name)) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                store.packed(&tenant, &hash_of(&name))?.map(|at| at.len).ok_or_else(|| not_found(&name))
            }
            Err(e) => Err(io(&store.dir, e)),
        })
        .await
    }

    async fn read(&self, tenant: &Tenant, sha256: &str) -> Result<BlobStream> {
        check_name(sha256)?;
        let (path, name) = (self.path(tenant, sha256), sha256.to_string());
        let (store, tenant) = (self.clone(), tenant.clone());
        // Opened and its first chunk read in one blocking task (the whole of
        // a small blob), each buffer no larger than what is left to read.
        let first = blocking(move || {
            // Packed, where the tenant's packs as last read say so (a
            // restore reads thousands from one pack), else a file of its
            // own, else packed where they say so now.
            let hash = hash_of(&name);
            if let Some(at) = store.packs_known(&tenant)?.get(&hash) {
                match pack::read(at) {
                    Err(Error::NotFound(_)) => {}
                    read => return read.map(First::Packed),
                }
            }
            let mut file = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return match store.packs_now(&tenant)?.get(&hash).map(pack::read) {
                        Some(Err(Error::NotFound(_))) | None => Err(not_found(&name)),
                        Some(read) => read.map(First::Packed),
                    };
                }
                Err(e) => return Err(io(&path, e)),
            };
            let size = file.metadata().map_err(|e| io(&path, e))?.len();
            let first = read_chunk(&mut file, size, &path)?;
            Ok(First::File((file, path), first, size))
        })
        .await?;
        let (file, first, size) = match first {
            // A packed blob is at most what a chunk holds.
            First::Packed(bytes) => {
                return Ok(Box::pin(futures::stream::iter((!bytes.is_empty()).then_some(Ok(bytes)))));
            }
            First::File(file, first, size) => (file, first, size),
        };
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

    /// Packed blobs (as the tenant's packs were last read) a run at a time,
    /// by pack and offset, one read of a few MiB each (a restore of 20,000
    /// small blobs opened the pack and handed a blocking read off 20,000
    /// times), the next run read while this one is sent; then the rest
    /// one by one. A run whose pack went since (or would not read) is read
    /// one by one too: each blob looks again, or says why it cannot.
    fn read_many(self: Arc<Self>, tenant: &Tenant, hashes: Vec<String>) -> ManyBlobs {
        let tenant = tenant.clone();
        Box::pin(async_stream::stream! {
            let planned = {
                let (store, tenant, hashes) = (self.clone(), tenant.clone(), hashes.clone());
                blocking(move || Ok(store.plan_reads(&tenant, hashes))).await
            };
            let (runs, rest) = planned.unwrap_or((Vec::new(), hashes));
            let read = futures::stream::iter(runs)
                .map(|run| {
                    let names = run.names();
                    async move { (names, blocking(move || pack::read_run(&run)).await) }
                })
                .buffered(2);
            futures::pin_mut!(read);
            while let Some((names, blobs)) = read.next().await {
                match blobs {
                    Ok(blobs) => {
                        for (sha256, bytes) in blobs {
                            yield (sha256, Ok(bytes));
                        }
                    }
                    Err(_) => {
                        let mut each = read_each(self.clone(), tenant.clone(), names);
                        while let Some(piece) = each.next().await {
                            yield piece;
                        }
                    }
                }
            }
            let mut each = read_each(self, tenant, rest);
            while let Some(piece) = each.next().await {
                yield piece;
            }
        })
    }

    async fn list(&self) -> Result<Vec<BlobKey>> {
        let store = self.clone();
        blocking(move || {
            let mut out = Vec::new();
            for (tenant, tenant_dir) in store.tenants()? {
                for sha256 in store.tenant_blobs(&tenant, &tenant_dir)?.into_keys() {
                    out.push(BlobKey { tenant: tenant.clone(), sha256 });
                }
            }
            out.sort();
            Ok(out)
        })
        .await
    }

    /// All in one blocking task (a task per blob made a collection of
    /// 20,000 blobs 20,000 hand-offs): the files removed, then each
    /// tenant's packs collected ([`pack::collect`]).
    async fn delete(&self, keys: &[BlobKey]) -> Result<u64> {
        for key in keys {
            check_name(&key.sha256)?;
        }
        let mut by_tenant: HashMap<Tenant, HashSet<Hash>> = HashMap::new();
        for key in keys {
            by_tenant.entry(key.tenant.clone()).or_default().insert(hash_of(&key.sha256));
        }
        let store = self.clone();
        blocking(move || {
            let mut deleted = 0;
            for (tenant, kill) in by_tenant {
                let mut gone = HashSet::new();
                for hash in &kill {
                    if pack::remove(&store.path(&tenant, &hex::encode(hash)))? {
                        gone.insert(*hash);
                    }
                }
                let packs = store.packs_now(&tenant)?;
                if packs.has_packs() {
                    let dir = store.packs_dir(&tenant);
                    let new_temp = || store.temp_in(&dir);
                    gone.extend(pack::collect(&dir, &store.temp_dir(), &packs, &kill, &new_temp)?);
                    store.packs_now(&tenant)?;
                }
                deleted += gone.len() as u64;
            }
            Ok(deleted)
        })
        .await
    }

    async fn stats(&self) -> Result<BlobStats> {
        let store = self.clone();
        blocking(move || {
            let mut stats = BlobStats::default();
            for (tenant, tenant_dir) in store.tenants()? {
                for size in store.tenant_blobs(&tenant, &tenant_dir)?.into_values() {
                    stats.count += 1;
                    stats.bytes += size;
                }
            }
            Ok(stats)
        })
        .await
    }
}

/// The first read of a blob: the whole of a packed one, or a file opened
/// with its first chunk and its size.
enum First {
    Packed(Bytes),
    File((std::fs::File, PathBuf), Bytes, u64),
}

/// The uploads of one save to a [`DirBlobStore`]: blobs of up to
/// [`PACKED_MAX`] go to one pack when the save has at least
/// [`PACK_AT_LEAST`] of them (stored for good when it is sealed), the rest
/// to files of their own as [`BlobStore::begin_put`] stores them.
struct DirBatch {
    store: DirBlobStore,
    tenant: Tenant,
    pack: Option<Arc<PackWriter>>,
}

#[async_trait]
impl BlobBatch for DirBatch {
    async fn begin_put(&self, sha256: &str, size: u64) -> Result<BlobUpload> {
        match &self.pack {
            Some(pack) if size <= PACKED_MAX => {
                check_name(sha256)?;
                let held = Vec::with_capacity(size as usize);
                let sink = PackedSink { pack: pack.clone(), hash: hash_of(sha256), held };
                Ok(BlobUpload::new(sha256, size, Box::new(sink)))
            }
            _ => self.store.begin_put(&self.tenant, sha256, size).await,
        }
    }

    async fn seal(self: Box<Self>) -> Result<()> {
        let DirBatch { store, tenant, pack } = *self;
        let Some(pack) = pack else { return Ok(()) };
        let pack = Arc::into_inner(pack)
            .ok_or_else(|| Error::Unavailable("a blob of the pack is still being stored".into()))?;
        blocking(move || {
            pack.seal()?;
            store.packs_now(&tenant).map(drop)
        })
        .await
    }
}

/// One blob of a [`DirBatch`]'s pack: held in memory until verified, then
/// appended to the pack.
struct PackedSink {
    pack: Arc<PackWriter>,
    hash: Hash,
    held: Vec<u8>,
}

#[async_trait]
impl BlobSink for PackedSink {
    async fn write(&mut self, piece: &[u8]) -> Result<()> {
        self.held.extend_from_slice(piece);
        Ok(())
    }

    /// False when the pack holds the blob already; stored for good when
    /// the pack is sealed.
    async fn commit(self: Box<Self>) -> Result<bool> {
        match self.pack.append(self.hash, &self.held) {
            Appended::Duplicate => Ok(false),
            Appended::Held => Ok(true),
            Appended::Write(bytes, at) => {
                let pack = self.pack.clone();
                blocking(move || pack.write_at(&bytes, at)).await?;
                Ok(true)
            }
        }
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

    /// Stores `data` through one sealed batch of `store`.
    async fn save_batch(store: &DirBlobStore, tenant: &Tenant, data: &[Vec<u8>]) {
        let sizes: Vec<u64> = data.iter().map(|d| d.len() as u64).collect();
        let batch = store.begin_batch(tenant, &sizes).await.unwrap();
        for d in data {
            let mut up = batch.begin_put(&sha(d), d.len() as u64).await.unwrap();
            up.write(d).await.unwrap();
            up.finish().await.unwrap();
        }
        batch.seal().await.unwrap();
    }

    /// A first save of many small files is one pack (plus a file per large
    /// blob), not a file each; a save of a few is files as before.
    #[tokio::test]
    async fn many_small_blobs_of_a_save_are_one_pack_and_a_few_are_files() {
        for unnamed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let store = DirBlobStore::open(dir.path()).unwrap();
            let store = if unnamed { store } else { store.with_named_temp_files() };
            let acme = Tenant::new("acme");
            let mut data: Vec<Vec<u8>> = (0..100).map(|i| format!("file {i}").into_bytes()).collect();
            data.push(vec![3u8; HELD_IN_MEMORY + 1]);
            save_batch(&store, &acme, &data).await;
            let mut files = files_under(dir.path());
            files.sort();
            assert_eq!(files.len(), 2, "{files:?}");
            assert_eq!(files[0], store.path(&acme, &sha(&data[100])), "the large blob is a file");
            assert_eq!(files[1].parent().unwrap(), store.packs_dir(&acme));
            assert_eq!(files[1].extension().unwrap(), "pack");

            let few: Vec<Vec<u8>> =
                (0..PACK_AT_LEAST - 1).map(|i| format!("changed {i}").into_bytes()).collect();
            save_batch(&store, &acme, &few).await;
            assert_eq!(files_under(dir.path()).len(), 2 + few.len(), "a file each");
            for d in data.iter().chain(&few) {
                assert_eq!(read_all(&store, &acme, &sha(d)).await, *d);
            }
        }
    }

    /// Two stores on one directory (two processes): what one packs or
    /// collects, the other's answers follow, whatever it read before.
    #[tokio::test]
    async fn a_second_store_on_the_directory_sees_packs_and_their_collection() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two) = (DirBlobStore::open(dir.path()).unwrap(), DirBlobStore::open(dir.path()).unwrap());
        let acme = Tenant::new("acme");
        let data: Vec<Vec<u8>> = (0..40).map(|i| format!("blob {i}").repeat(50).into_bytes()).collect();
        let hashes: Vec<String> = data.iter().map(|d| sha(d)).collect();
        // `two` reads the tenant's packs before any exist.
        assert_eq!(two.missing(&acme, &hashes).await.unwrap(), hashes);
        save_batch(&one, &acme, &data).await;
        assert!(two.missing(&acme, &hashes).await.unwrap().is_empty());
        assert_eq!(read_all(&two, &acme, &hashes[39]).await, data[39]);
        // `one` collects most of them: the pack is rewritten, and `two`
        // (which knows the old pack) still reads the rest and misses the
        // collected.
        assert_eq!(one.delete(&keys(&acme, &hashes[..30])).await.unwrap(), 30);
        assert_eq!(read_all(&two, &acme, &hashes[39]).await, data[39]);
        assert_eq!(two.size(&acme, &hashes[35]).await.unwrap(), data[35].len() as u64);
        assert_eq!(two.missing(&acme, &hashes).await.unwrap(), hashes[..30]);
        assert!(matches!(two.read(&acme, &hashes[0]).await.err(), Some(Error::NotFound(_))));
        assert_eq!(two.list().await.unwrap(), {
            let mut left = keys(&acme, &hashes[30..]);
            left.sort();
            left
        });
        // And the other way round.
        assert_eq!(two.delete(&keys(&acme, &hashes[30..])).await.unwrap(), 10);
        assert_eq!(one.missing(&acme, &hashes).await.unwrap(), hashes);
        assert_eq!(files_under(dir.path()), Vec::<PathBuf>::new(), "no pack, no dead list, no temp file");
    }

    /// A store that read the tenant's packs before another store on the
    /// directory collected and removed the pack: a restore's read of many
    /// blobs looks again, one by one, and still gets every live blob whole
    /// (the collected ones are not found).
    #[tokio::test]
    async fn many_blobs_from_a_pack_removed_since_are_looked_up_again() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two) =
            (Arc::new(DirBlobStore::open(dir.path()).unwrap()), DirBlobStore::open(dir.path()).unwrap());
        let acme = Tenant::new("acme");
        let data: Vec<Vec<u8>> = (0..40).map(|i| format!("blob {i}").repeat(50).into_bytes()).collect();
        let hashes: Vec<String> = data.iter().map(|d| sha(d)).collect();
        save_batch(&two, &acme, &data).await;
        assert_eq!(read_all(one.as_ref(), &acme, &hashes[0]).await, data[0], "`one` knows the pack");
        // Most collected: rewritten; then one more: the old pack removed.
        assert_eq!(two.delete(&keys(&acme, &hashes[..30])).await.unwrap(), 30);
        assert_eq!(two.delete(&keys(&acme, &hashes[30..31])).await.unwrap(), 1);
        let mut got: HashMap<String, Result<Vec<u8>>> = HashMap::new();
        let mut pieces = one.clone().read_many(&acme, hashes.clone());
        while let Some((sha256, piece)) = pieces.next().await {
            assert!(got.insert(sha256, piece.map(Vec::from)).is_none(), "one piece each");
        }
        for (i, (h, d)) in hashes.iter().zip(&data).enumerate() {
            match &got[h] {
                Ok(bytes) => assert!(i > 30 && bytes == d, "blob {i}"),
                Err(e) => assert!(i <= 30 && matches!(e, Error::NotFound(_)), "blob {i}: {e}"),
            }
        }
    }

    fn keys(tenant: &Tenant, hashes: &[String]) -> Vec<BlobKey> {
        hashes.iter().map(|h| BlobKey::new(tenant, h)).collect()
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
