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
use tokio::io::AsyncReadExt;

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
        Ok(Self { dir: dir.to_path_buf() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn tenant_dir(&self, tenant: &Tenant) -> PathBuf {
        self.dir.join("tenants").join(hex::encode(Sha256::digest(tenant.as_str().as_bytes())))
    }

    fn path(&self, tenant: &Tenant, sha256: &str) -> PathBuf {
        self.tenant_dir(tenant).join(&sha256[..2]).join(sha256)
    }

    /// Write `data` to `target` through a temp file and a rename.
    async fn write_atomically(&self, target: &Path, data: &[u8]) -> Result<()> {
        let parent = target.parent().expect("blob paths have a parent");
        tokio::fs::create_dir_all(parent).await.map_err(|e| io(parent, e))?;
        let temp = self.dir.join("tmp").join(uuid::Uuid::new_v4().simple().to_string());
        tokio::fs::write(&temp, data).await.map_err(|e| io(&temp, e))?;
        let file = tokio::fs::File::open(&temp).await.map_err(|e| io(&temp, e))?;
        file.sync_all().await.map_err(|e| io(&temp, e))?;
        tokio::fs::rename(&temp, target).await.map_err(|e| io(target, e))
    }

    /// The tenant's directory, named before its first blob lands (so every
    /// blob on disk can be listed with its tenant).
    async fn ensure_tenant_dir(&self, tenant: &Tenant) -> Result<()> {
        let named = self.tenant_dir(tenant).join(TENANT_FILE);
        if !tokio::fs::try_exists(&named).await.map_err(|e| io(&named, e))? {
            self.write_atomically(&named, tenant.as_str().as_bytes()).await?;
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
        let mut adopted = 0;
        for key in owners {
            check_name(&key.sha256)?;
            let old = self.dir.join(&key.sha256[..2]).join(&key.sha256);
            if !tokio::fs::try_exists(&old).await.map_err(|e| io(&old, e))? {
                continue;
            }
            let new = self.path(&key.tenant, &key.sha256);
            if tokio::fs::try_exists(&new).await.map_err(|e| io(&new, e))? {
                continue;
            }
            self.ensure_tenant_dir(&key.tenant).await?;
            let parent = new.parent().expect("blob paths have a parent");
            tokio::fs::create_dir_all(parent).await.map_err(|e| io(parent, e))?;
            // Blobs are immutable (replaced only by rename), so a shared
            // inode is safe; a copy where links are not possible.
            if tokio::fs::hard_link(&old, &new).await.is_err() {
                let data = tokio::fs::read(&old).await.map_err(|e| io(&old, e))?;
                self.write_atomically(&new, &data).await?;
            }
            adopted += 1;
        }
        for shard in self.legacy_shards()? {
            tokio::fs::remove_dir_all(&shard).await.map_err(|e| io(&shard, e))?;
        }
        Ok(adopted)
    }
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

/// A blob file being written under `<dir>/tmp`, removed unless renamed.
struct TempBlob {
    path: PathBuf,
    file: Option<tokio::fs::File>,
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        drop(self.file.take());
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The pieces of an upload to a [`DirBlobStore`]: a temp file, fsynced and
/// renamed onto `target` at commit. `temp` is `None` when the tenant holds
/// the blob already.
struct DirSink {
    temp: Option<TempBlob>,
    target: PathBuf,
}

#[async_trait]
impl BlobSink for DirSink {
    async fn write(&mut self, piece: &[u8]) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let Some(temp) = &mut self.temp else { return Ok(()) };
        let file = temp.file.as_mut().expect("open until commit");
        file.write_all(piece).await.map_err(|e| io(&temp.path, e))
    }

    async fn commit(mut self: Box<Self>) -> Result<bool> {
        use tokio::io::AsyncWriteExt;
        let Some(mut temp) = self.temp.take() else { return Ok(false) };
        let mut file = temp.file.take().expect("open until commit");
        file.flush().await.map_err(|e| io(&temp.path, e))?;
        file.sync_all().await.map_err(|e| io(&temp.path, e))?;
        drop(file);
        let parent = self.target.parent().expect("blob paths have a parent");
        tokio::fs::create_dir_all(parent).await.map_err(|e| io(parent, e))?;
        if tokio::fs::try_exists(&self.target).await.map_err(|e| io(&self.target, e))? {
            // Another save of the tenant stored it meanwhile.
            return Ok(false);
        }
        tokio::fs::rename(&temp.path, &self.target).await.map_err(|e| io(&self.target, e))?;
        // Renamed: nothing left for the drop to remove.
        temp.path = PathBuf::new();
        if let Ok(dir) = tokio::fs::File::open(parent).await {
            let _ = dir.sync_all().await;
        }
        Ok(true)
    }
}

#[async_trait]
impl BlobStore for DirBlobStore {
    fn backend_name(&self) -> &'static str {
        "dir"
    }

    async fn begin_put(&self, tenant: &Tenant, sha256: &str, size: u64) -> Result<BlobUpload> {
        check_name(sha256)?;
        let target = self.path(tenant, sha256);
        // Stored already: the bytes are still checked, then dropped.
        let temp = if tokio::fs::try_exists(&target).await.map_err(|e| io(&target, e))? {
            None
        } else {
            self.ensure_tenant_dir(tenant).await?;
            let path = self.dir.join("tmp").join(uuid::Uuid::new_v4().simple().to_string());
            let file = tokio::fs::File::create(&path).await.map_err(|e| io(&path, e))?;
            Some(TempBlob { path, file: Some(file) })
        };
        Ok(BlobUpload::new(sha256, size, Box::new(DirSink { temp, target })))
    }

    async fn missing(&self, tenant: &Tenant, hashes: &[String]) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for h in hashes {
            check_name(h)?;
            if !tokio::fs::try_exists(self.path(tenant, h)).await.map_err(|e| io(&self.dir, e))? {
                out.push(h.clone());
            }
        }
        Ok(out)
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
        let path = self.path(tenant, sha256);
        let mut file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found(sha256)),
            Err(e) => return Err(io(&path, e)),
        };
        Ok(Box::pin(async_stream::try_stream! {
            loop {
                let mut buf = vec![0u8; READ_CHUNK];
                let mut filled = 0;
                while filled < READ_CHUNK {
                    let n = file.read(&mut buf[filled..]).await.map_err(|e| io(&path, e))?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                if filled == 0 {
                    break;
                }
                buf.truncate(filled);
                yield Bytes::from(buf);
                if filled < READ_CHUNK {
                    break;
                }
            }
        }))
    }

    async fn list(&self) -> Result<Vec<BlobKey>> {
        let tenants = self.dir.join("tenants");
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for entry in std::fs::read_dir(&tenants).map_err(|e| io(&tenants, e))? {
                let tenant_dir = entry.map_err(|e| io(&tenants, e))?.path();
                // A directory without its name file holds no blob yet
                // (the name is written first).
                let Ok(name) = std::fs::read_to_string(tenant_dir.join(TENANT_FILE)) else { continue };
                let tenant = Tenant::new(name);
                for sha256 in list_tenant_dir(&tenant_dir)? {
                    out.push(BlobKey { tenant: tenant.clone(), sha256 });
                }
            }
            out.sort();
            Ok(out)
        })
        .await
        .map_err(|e| Error::Unavailable(format!("listing blobs: {e}")))?
    }

    async fn delete(&self, keys: &[BlobKey]) -> Result<u64> {
        let mut deleted = 0;
        for key in keys {
            check_name(&key.sha256)?;
            match tokio::fs::remove_file(self.path(&key.tenant, &key.sha256)).await {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&self.dir, e)),
            }
        }
        Ok(deleted)
    }

    async fn stats(&self) -> Result<BlobStats> {
        let mut stats = BlobStats::default();
        for key in self.list().await? {
            stats.count += 1;
            stats.bytes += self.size(&key.tenant, &key.sha256).await.unwrap_or(0);
        }
        Ok(stats)
    }
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

    #[tokio::test]
    async fn refused_and_abandoned_uploads_leave_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirBlobStore::open(dir.path()).unwrap();
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
        let temps = std::fs::read_dir(dir.path().join("tmp")).unwrap().count();
        assert_eq!(temps, 0, "no temp file is left behind");
        assert!(store.list().await.unwrap().is_empty());
        let mut up = store.begin_put(&acme, &h, 10).await.unwrap();
        up.write(b"0123456789").await.unwrap();
        assert!(up.finish().await.unwrap());
        assert_eq!(read_all(&store, &acme, &h).await, b"0123456789");
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "renamed, not copied");
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
