//! Content-addressed blobs of portable snapshots: the bytes of one captured
//! file (secret values already zeroed), named by the hex SHA-256 of those
//! bytes. Two backends behind [`BlobStore`]: a directory under the data dir
//! (the embedded default) and a PostgreSQL table (shared by replicas). One
//! conformance suite (`snapshot_conformance.rs`) runs against both.
//!
//! A blob is immutable: `put` of a stored hash is a no-op, and `put`
//! refuses bytes that do not hash to the name. Which blobs are still needed
//! is the checkpoint store's business ([`super::CheckpointStore::sweep`]).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use super::{Error, Result, Timestamp};

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

#[async_trait]
pub trait BlobStore: Send + Sync {
    /// `"dir"` or `"postgres"`.
    fn backend_name(&self) -> &'static str;

    /// Store `data` as `sha256`. [`Error::Invalid`] when the bytes hash to
    /// something else (nothing is stored). Returns true when newly stored.
    async fn put(&self, sha256: &str, data: Bytes) -> Result<bool>;

    /// Which of `hashes` the store does not hold.
    async fn missing(&self, hashes: &[String]) -> Result<Vec<String>>;

    /// The blob's size, or [`Error::NotFound`].
    async fn size(&self, sha256: &str) -> Result<u64>;

    /// The blob's bytes in chunks of at most [`READ_CHUNK`];
    /// [`Error::NotFound`] up front when it is absent.
    async fn read(&self, sha256: &str) -> Result<BlobStream>;

    /// Every stored hash (for garbage collection).
    async fn list(&self) -> Result<Vec<String>>;

    /// Remove these blobs (absent ones are ignored); returns how many went.
    async fn delete(&self, hashes: &[String]) -> Result<u64>;

    async fn stats(&self) -> Result<BlobStats>;
}

fn check_name(sha256: &str) -> Result<()> {
    if shared::snapshot::is_sha256_hex(sha256) {
        Ok(())
    } else {
        Err(Error::invalid("blob", format!("{sha256:?} is not a hex SHA-256")))
    }
}

fn check_bytes(sha256: &str, data: &[u8]) -> Result<()> {
    check_name(sha256)?;
    let actual = hex::encode(Sha256::digest(data));
    if actual != sha256 {
        return Err(Error::invalid("blob", format!("bytes hash to {actual}, not {sha256}")));
    }
    Ok(())
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Unavailable(format!("blob store {}: {e}", path.display()))
}

// ---------------------------------------------------------------- directory

/// Blobs as files `<dir>/<first two hex digits>/<sha256>`, written to
/// `<dir>/tmp` and renamed into place, so a reader never sees half a blob.
#[derive(Debug, Clone)]
pub struct DirBlobStore {
    dir: PathBuf,
}

impl DirBlobStore {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir.join("tmp")).map_err(|e| io(dir, e))?;
        Ok(Self { dir: dir.to_path_buf() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join(&sha256[..2]).join(sha256)
    }
}

#[async_trait]
impl BlobStore for DirBlobStore {
    fn backend_name(&self) -> &'static str {
        "dir"
    }

    async fn put(&self, sha256: &str, data: Bytes) -> Result<bool> {
        check_bytes(sha256, &data)?;
        let target = self.path(sha256);
        if tokio::fs::try_exists(&target).await.map_err(|e| io(&target, e))? {
            return Ok(false);
        }
        let parent = target.parent().expect("blob paths have a parent");
        tokio::fs::create_dir_all(parent).await.map_err(|e| io(parent, e))?;
        let temp = self.dir.join("tmp").join(uuid::Uuid::new_v4().simple().to_string());
        tokio::fs::write(&temp, &data).await.map_err(|e| io(&temp, e))?;
        let file = tokio::fs::File::open(&temp).await.map_err(|e| io(&temp, e))?;
        file.sync_all().await.map_err(|e| io(&temp, e))?;
        tokio::fs::rename(&temp, &target).await.map_err(|e| io(&target, e))?;
        Ok(true)
    }

    async fn missing(&self, hashes: &[String]) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for h in hashes {
            check_name(h)?;
            if !tokio::fs::try_exists(self.path(h)).await.map_err(|e| io(&self.dir, e))? {
                out.push(h.clone());
            }
        }
        Ok(out)
    }

    async fn size(&self, sha256: &str) -> Result<u64> {
        check_name(sha256)?;
        match tokio::fs::metadata(self.path(sha256)).await {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(Error::NotFound(format!("blob {sha256}")))
            }
            Err(e) => Err(io(&self.dir, e)),
        }
    }

    async fn read(&self, sha256: &str) -> Result<BlobStream> {
        check_name(sha256)?;
        let path = self.path(sha256);
        let mut file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!("blob {sha256}")));
            }
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

    async fn list(&self) -> Result<Vec<String>> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            // `<dir>/<2 hex>/<sha256>`: shards are the only directories.
            let shards = walkdir::WalkDir::new(&dir)
                .min_depth(2)
                .max_depth(2)
                .into_iter()
                .filter_entry(|e| e.depth() != 1 || (e.file_name().len() == 2 && e.file_type().is_dir()));
            let mut out = Vec::new();
            for blob in shards {
                let name = blob.map_err(|e| io(&dir, e.into()))?.into_path();
                let name = name.file_name().and_then(|n| n.to_str());
                if let Some(name) = name.filter(|n| shared::snapshot::is_sha256_hex(n)) {
                    out.push(name.to_string());
                }
            }
            out.sort();
            Ok(out)
        })
        .await
        .map_err(|e| Error::Unavailable(format!("listing blobs: {e}")))?
    }

    async fn delete(&self, hashes: &[String]) -> Result<u64> {
        let mut deleted = 0;
        for h in hashes {
            check_name(h)?;
            match tokio::fs::remove_file(self.path(h)).await {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&self.dir, e)),
            }
        }
        Ok(deleted)
    }

    async fn stats(&self) -> Result<BlobStats> {
        let mut stats = BlobStats::default();
        for h in self.list().await? {
            stats.count += 1;
            stats.bytes += self.size(&h).await.unwrap_or(0);
        }
        Ok(stats)
    }
}

// ---------------------------------------------------------------- postgres

/// Blobs as `bytea` rows of `snapshot_blobs`, read back in slices.
#[derive(Debug, Clone)]
pub struct PgBlobStore {
    pool: sqlx::PgPool,
}

impl PgBlobStore {
    pub fn new(pool: sqlx::PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl BlobStore for PgBlobStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    async fn put(&self, sha256: &str, data: Bytes) -> Result<bool> {
        check_bytes(sha256, &data)?;
        let inserted = sqlx::query(
            "INSERT INTO snapshot_blobs (sha256, size, data, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (sha256) DO NOTHING",
        )
        .bind(sha256)
        .bind(data.len() as i64)
        .bind(data.as_ref())
        .bind(Timestamp::now().as_millis())
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(inserted > 0)
    }

    async fn missing(&self, hashes: &[String]) -> Result<Vec<String>> {
        for h in hashes {
            check_name(h)?;
        }
        Ok(sqlx::query_scalar::<_, String>(
            "SELECT h FROM UNNEST($1::text[]) AS wanted(h) \
             WHERE NOT EXISTS (SELECT 1 FROM snapshot_blobs WHERE sha256 = wanted.h)",
        )
        .bind(hashes)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn size(&self, sha256: &str) -> Result<u64> {
        check_name(sha256)?;
        sqlx::query_scalar::<_, i64>("SELECT size FROM snapshot_blobs WHERE sha256 = $1")
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await?
            .map(|s| s as u64)
            .ok_or_else(|| Error::NotFound(format!("blob {sha256}")))
    }

    async fn read(&self, sha256: &str) -> Result<BlobStream> {
        let size = self.size(sha256).await?;
        let pool = self.pool.clone();
        let sha256 = sha256.to_string();
        Ok(Box::pin(async_stream::try_stream! {
            let mut offset = 0u64;
            while offset < size {
                // substring() counts from 1.
                let slice: Vec<u8> = sqlx::query_scalar(
                    "SELECT substring(data FROM $2::int FOR $3::int) FROM snapshot_blobs WHERE sha256 = $1",
                )
                .bind(&sha256)
                .bind(offset as i64 + 1)
                .bind(READ_CHUNK as i64)
                .fetch_optional(&pool)
                .await?
                .ok_or_else(|| Error::NotFound(format!("blob {sha256}")))?;
                if slice.is_empty() {
                    Err(Error::Corrupt(format!("blob {sha256} is shorter than its size")))?;
                }
                offset += slice.len() as u64;
                yield Bytes::from(slice);
            }
        }))
    }

    async fn list(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT sha256 FROM snapshot_blobs ORDER BY sha256")
            .fetch_all(&self.pool)
            .await?)
    }

    async fn delete(&self, hashes: &[String]) -> Result<u64> {
        Ok(sqlx::query("DELETE FROM snapshot_blobs WHERE sha256 = ANY($1)")
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
