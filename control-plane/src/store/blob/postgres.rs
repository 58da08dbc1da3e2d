//! The PostgreSQL backend: a blob per row.

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    BlobBatch, BlobKey, BlobSink, BlobStats, BlobStore, BlobStream, BlobUpload, OneByOne, READ_CHUNK,
    check_name, not_found,
};
use crate::store::{Error, Result, Tenant, Timestamp};

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

    /// Each blob is its row's own transaction already.
    async fn begin_batch(&self, tenant: &Tenant, _sizes: &[u64]) -> Result<Box<dyn BlobBatch>> {
        Ok(Box::new(OneByOne::new(self.clone(), tenant)))
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
