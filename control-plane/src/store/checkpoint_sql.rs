//! [`super::CheckpointStore`] for both SQL backends. The statements read the
//! same in SQLite and PostgreSQL; what differs is passed in: how a write
//! transaction begins (`BEGIN IMMEDIATE` takes SQLite's write lock up
//! front), the row-lock suffix (`FOR UPDATE` on PostgreSQL; SQLite has one
//! writer anyway), and the statements that exclude pinning from a sweep
//! (advisory locks on PostgreSQL; SQLite's write lock does it).

use super::checkpoint::Checkpoint;
use super::{Error, Tenant, Timestamp};

/// Columns of `snapshot_checkpoints`, in [`CheckpointRow`] order.
macro_rules! checkpoint_columns {
    () => {
        "checkpoint_id, tenant, thread_id, parent_id, run_id, label, forked_from, file_count, dir_count, \
         total_bytes, uploaded_bytes, created_at"
    };
}
pub(super) use checkpoint_columns;

/// Rows per multi-row INSERT (up to four parameters each; under SQLite's limit).
pub(super) const REFS_PER_INSERT: usize = 400;

#[derive(sqlx::FromRow)]
pub(super) struct CheckpointRow {
    checkpoint_id: String,
    tenant: String,
    thread_id: String,
    parent_id: Option<String>,
    run_id: String,
    label: String,
    forked_from: Option<String>,
    file_count: i64,
    dir_count: i64,
    total_bytes: i64,
    uploaded_bytes: i64,
    created_at: i64,
}

impl From<CheckpointRow> for Checkpoint {
    fn from(r: CheckpointRow) -> Self {
        Checkpoint {
            checkpoint_id: r.checkpoint_id,
            tenant: Tenant::new(r.tenant),
            thread_id: r.thread_id,
            parent_id: r.parent_id,
            run_id: r.run_id,
            label: r.label,
            forked_from: r.forked_from,
            file_count: r.file_count as u64,
            dir_count: r.dir_count as u64,
            total_bytes: r.total_bytes as u64,
            uploaded_bytes: r.uploaded_bytes as u64,
            created_at: Timestamp::from_millis(r.created_at),
        }
    }
}

pub(super) fn checkpoint_not_found(thread_id: &str, checkpoint_id: &str) -> Error {
    Error::NotFound(format!("checkpoint {checkpoint_id} of thread {thread_id}"))
}

pub(super) fn new_checkpoint_id() -> String {
    format!("ckpt-{}", uuid::Uuid::new_v4().simple())
}

pub(super) fn to_db(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Inside the transaction `$tx`: thread `$thread` of `$tenant` exists in
/// `snapshot_threads`, its row locked (`$for_update`); evaluates to its
/// head.
macro_rules! lock_thread_head {
    ($tx:ident, $tenant:expr, $thread:expr, $now:expr, $for_update:literal) => {{
        sqlx::query(
            "INSERT INTO snapshot_threads (tenant, thread_id, head, writer_epoch, updated_at) \
             VALUES ($1, $2, NULL, 0, $3) ON CONFLICT (tenant, thread_id) DO NOTHING",
        )
        .bind($tenant.as_str())
        .bind($thread)
        .bind($now)
        .execute(&mut *$tx)
        .await?;
        let head: Option<String> = sqlx::query_scalar(concat!(
            "SELECT head FROM snapshot_threads WHERE tenant = $1 AND thread_id = $2",
            $for_update
        ))
        .bind($tenant.as_str())
        .bind($thread)
        .fetch_one(&mut *$tx)
        .await?;
        head
    }};
}
pub(super) use lock_thread_head;

/// Inside `$tx`: a copy of checkpoint `$source` (manifest and blob
/// references, `forked_from` naming it) as thread `$thread`'s checkpoint
/// number `$seq` after `$parent`, made its head (fencing the thread's
/// writer); evaluates to the copy's row.
macro_rules! copy_checkpoint_as_head {
    ($tx:ident, $tenant:expr, $source:expr, $thread:expr, $parent:expr, $seq:expr, $now:expr) => {{
        let id = new_checkpoint_id();
        let row = sqlx::query_as::<_, CheckpointRow>(concat!(
            "INSERT INTO snapshot_checkpoints (checkpoint_id, tenant, thread_id, parent_id, run_id, \
             label, forked_from, manifest, file_count, dir_count, total_bytes, uploaded_bytes, seq, \
             created_at) \
             SELECT $1, tenant, $2, $3, run_id, label, checkpoint_id, manifest, file_count, dir_count, \
             total_bytes, 0, $4, $5 FROM snapshot_checkpoints WHERE checkpoint_id = $6 RETURNING ",
            checkpoint_columns!()
        ))
        .bind(&id)
        .bind($thread)
        .bind($parent)
        .bind($seq)
        .bind($now)
        .bind($source)
        .fetch_one(&mut *$tx)
        .await?;
        sqlx::query(
            "INSERT INTO snapshot_blob_refs (checkpoint_id, sha256) \
             SELECT $1, sha256 FROM snapshot_blob_refs WHERE checkpoint_id = $2",
        )
        .bind(&id)
        .bind($source)
        .execute(&mut *$tx)
        .await?;
        sqlx::query(
            "UPDATE snapshot_threads SET head = $3, writer_epoch = writer_epoch + 1, updated_at = $4 \
             WHERE tenant = $1 AND thread_id = $2",
        )
        .bind($tenant.as_str())
        .bind($thread)
        .bind(&id)
        .bind($now)
        .execute(&mut *$tx)
        .await?;
        row
    }};
}
pub(super) use copy_checkpoint_as_head;

/// Copy the ended run `$source` of `$tenant`, with its event log and
/// requests, into thread `$thread` under a fresh id (its record names the
/// source in `forked_from_run`), inside the transaction `$tx`; evaluates to
/// the copy's id.
macro_rules! copy_run {
    ($tx:ident, $tenant:expr, $source:expr, $thread:expr, $now:expr) => {{
        let (tenant, source, new_thread_id, now) = ($tenant, $source, $thread, $now);
        let copy = super::generated_run_id();
        sqlx::query(
            "INSERT INTO runs (run_id, thread_id, tenant, status, started_at, finished_at, \
             error_code, error_message, usage, sandbox_key, detached_since, cancel_requested, \
             driver_epoch, sentinel_key, log_closed, updated_at, spec, forked_from_run, \
             requests_indexed, definition_id, session_id) \
             SELECT $1, $2, tenant, status, started_at, finished_at, error_code, error_message, \
             usage, NULL, NULL, FALSE, driver_epoch, $3, TRUE, $4, spec, run_id, requests_indexed, \
             definition_id, session_id \
             FROM runs WHERE tenant = $6 AND run_id = $5",
        )
        .bind(copy.as_str())
        .bind(new_thread_id)
        .bind(super::SentinelKey::random().expose())
        .bind(now)
        .bind(source)
        .bind(tenant.as_str())
        .execute(&mut *$tx)
        .await?;
        sqlx::query(
            "INSERT INTO run_events (tenant, run_id, seq, epoch, kind, payload, appended_at) \
             SELECT tenant, $1, seq, epoch, kind, payload, appended_at FROM run_events \
             WHERE tenant = $3 AND run_id = $2",
        )
        .bind(copy.as_str())
        .bind(source)
        .bind(tenant.as_str())
        .execute(&mut *$tx)
        .await?;
        // The copy's requests are the source's, at the same offsets
        // (and built from its log alike when the source's are not).
        sqlx::query(
            "INSERT INTO run_requests (tenant, run_id, request_id, asked_seq, answered_seq) \
             SELECT tenant, $1, request_id, asked_seq, answered_seq FROM run_requests \
             WHERE tenant = $3 AND run_id = $2",
        )
        .bind(copy.as_str())
        .bind(source)
        .bind(tenant.as_str())
        .execute(&mut *$tx)
        .await?;
        copy
    }};
}
pub(super) use copy_run;

/// Implements [`super::CheckpointStore`] for `$store` (with a `pool` of
/// `$db`). `$begin`: the statement opening a write transaction;
/// `$for_update`: the row-lock suffix; `$sweep_lock` / `$pin_lock`: the
/// statements that make a sweep and a pin exclude each other.
macro_rules! impl_checkpoint_store {
    ($store:ty, $db:ty, begin: $begin:literal, for_update: $for_update:literal,
     sweep_lock: $sweep_lock:literal, pin_lock: $pin_lock:literal) => {
        #[async_trait::async_trait]
        impl super::CheckpointStore for $store {
            async fn claim_writer(&self, tenant: &Tenant, thread_id: &str) -> Result<super::WriterClaim> {
                let claimed = sqlx::query_as(
                    "INSERT INTO snapshot_threads (tenant, thread_id, head, writer_epoch, updated_at) \
                     VALUES ($1, $2, NULL, 1, $3) ON CONFLICT (tenant, thread_id) DO UPDATE SET \
                     writer_epoch = snapshot_threads.writer_epoch + 1, updated_at = excluded.updated_at \
                     RETURNING writer_epoch, head",
                )
                .bind(tenant.as_str())
                .bind(thread_id)
                .bind(Timestamp::now().as_millis());
                let (epoch, head): (i64, Option<String>) = super::sql::written(claimed, &self.pool)
                    .await?
                    .ok_or_else(|| Error::Corrupt("claiming a thread's writer returned no row".into()))?;
                Ok(super::WriterClaim {
                    tenant: tenant.clone(),
                    thread_id: thread_id.to_string(),
                    epoch: epoch as u64,
                    head,
                })
            }

            async fn commit(
                &self,
                claim: &super::WriterClaim,
                new: super::NewCheckpoint,
                pin_id: &str,
            ) -> Result<super::Checkpoint> {
                let mut tx = self.pool.begin_with($begin).await?;
                let row: Option<(i64, Option<String>)> = sqlx::query_as(concat!(
                    "SELECT writer_epoch, head FROM snapshot_threads WHERE tenant = $1 AND thread_id = $2",
                    $for_update
                ))
                .bind(claim.tenant.as_str())
                .bind(&claim.thread_id)
                .fetch_optional(&mut *tx)
                .await?;
                let Some((current, head)) = row else {
                    return Err(Error::NotFound(format!("thread {}", claim.thread_id)));
                };
                if current as u64 != claim.epoch {
                    return Err(Error::WriterLost {
                        thread: claim.thread_id.clone(),
                        held: claim.epoch,
                        current: current as u64,
                    });
                }
                if head != claim.head {
                    return Err(Error::StaleHead {
                        thread: claim.thread_id.clone(),
                        expected: claim.head.clone(),
                        current: head,
                    });
                }
                let seq: i64 = sqlx::query_scalar(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM snapshot_checkpoints WHERE tenant = $1 AND thread_id = $2",
                )
                .bind(claim.tenant.as_str())
                .bind(&claim.thread_id)
                .fetch_one(&mut *tx)
                .await?;
                let id = new_checkpoint_id();
                let row = sqlx::query_as::<_, CheckpointRow>(concat!(
                    "INSERT INTO snapshot_checkpoints (checkpoint_id, tenant, thread_id, parent_id, run_id, \
                     label, forked_from, manifest, file_count, dir_count, total_bytes, uploaded_bytes, seq, \
                     created_at) VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, $9, $10, $11, $12, $13) RETURNING ",
                    checkpoint_columns!()
                ))
                .bind(&id)
                .bind(claim.tenant.as_str())
                .bind(&claim.thread_id)
                .bind(&claim.head)
                .bind(&new.run_id)
                .bind(&new.label)
                .bind(&new.manifest)
                .bind(to_db(new.file_count))
                .bind(to_db(new.dir_count))
                .bind(to_db(new.total_bytes))
                .bind(to_db(new.uploaded_bytes))
                .bind(seq)
                .bind(Timestamp::now().as_millis())
                .fetch_one(&mut *tx)
                .await?;
                let mut blobs = new.blobs;
                blobs.sort();
                blobs.dedup();
                for group in blobs.chunks(REFS_PER_INSERT) {
                    let mut insert =
                        sqlx::QueryBuilder::<$db>::new("INSERT INTO snapshot_blob_refs (checkpoint_id, sha256) ");
                    insert.push_values(group, |mut row, hash| {
                        row.push_bind(&id).push_bind(hash);
                    });
                    insert.build().execute(&mut *tx).await?;
                }
                sqlx::query("UPDATE snapshot_threads SET head = $3, updated_at = $4 WHERE tenant = $1 AND thread_id = $2")
                    .bind(claim.tenant.as_str())
                    .bind(&claim.thread_id)
                    .bind(&id)
                    .bind(Timestamp::now().as_millis())
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("DELETE FROM snapshot_blob_pins WHERE pin_id = $1").bind(pin_id).execute(&mut *tx).await?;
                tx.commit().await?;
                Ok(row.into())
            }

            async fn head(&self, tenant: &Tenant, thread_id: &str) -> Result<Option<super::Checkpoint>> {
                Ok(sqlx::query_as::<_, CheckpointRow>(concat!(
                    "SELECT ",
                    checkpoint_columns!(),
                    " FROM snapshot_checkpoints WHERE tenant = $1 AND thread_id = $2 AND checkpoint_id = \
                     (SELECT head FROM snapshot_threads WHERE tenant = $1 AND thread_id = $2)"
                ))
                .bind(tenant.as_str())
                .bind(thread_id)
                .fetch_optional(&self.pool)
                .await?
                .map(Into::into))
            }

            async fn list(&self, tenant: &Tenant, thread_id: &str) -> Result<Vec<super::Checkpoint>> {
                Ok(sqlx::query_as::<_, CheckpointRow>(concat!(
                    "SELECT ",
                    checkpoint_columns!(),
                    " FROM snapshot_checkpoints WHERE tenant = $1 AND thread_id = $2 ORDER BY seq"
                ))
                .bind(tenant.as_str())
                .bind(thread_id)
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(Into::into)
                .collect())
            }

            async fn get(
                &self,
                tenant: &Tenant,
                thread_id: &str,
                checkpoint_id: &str,
            ) -> Result<(super::Checkpoint, Vec<u8>)> {
                let row = sqlx::query_as::<_, CheckpointRow>(concat!(
                    "SELECT ",
                    checkpoint_columns!(),
                    " FROM snapshot_checkpoints WHERE tenant = $1 AND thread_id = $2 AND checkpoint_id = $3"
                ))
                .bind(tenant.as_str())
                .bind(thread_id)
                .bind(checkpoint_id)
                .fetch_optional(&self.pool)
                .await?
                .ok_or_else(|| checkpoint_not_found(thread_id, checkpoint_id))?;
                let manifest: Vec<u8> =
                    sqlx::query_scalar("SELECT manifest FROM snapshot_checkpoints WHERE checkpoint_id = $1")
                        .bind(checkpoint_id)
                        .fetch_one(&self.pool)
                        .await?;
                Ok((row.into(), manifest))
            }

            async fn fork(
                &self,
                tenant: &Tenant,
                thread_id: &str,
                checkpoint_id: &str,
                new_thread_id: &str,
            ) -> Result<super::Fork> {
                if new_thread_id.is_empty() {
                    return Err(Error::invalid("new_thread_id", "empty"));
                }
                let mut tx = self.pool.begin_with($begin).await?;
                let written_at: Option<i64> = sqlx::query_scalar(
                    "SELECT created_at FROM snapshot_checkpoints \
                     WHERE tenant = $1 AND thread_id = $2 AND checkpoint_id = $3",
                )
                .bind(tenant.as_str())
                .bind(thread_id)
                .bind(checkpoint_id)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(written_at) = written_at else {
                    return Err(checkpoint_not_found(thread_id, checkpoint_id));
                };
                let now = Timestamp::now().as_millis();
                let head = lock_thread_head!(tx, tenant, new_thread_id, now, $for_update);
                let busy: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM snapshot_checkpoints WHERE tenant = $1 AND thread_id = $2) \
                     OR EXISTS (SELECT 1 FROM runs WHERE tenant = $1 AND thread_id = $2)",
                )
                .bind(tenant.as_str())
                .bind(new_thread_id)
                .fetch_one(&mut *tx)
                .await?;
                if head.is_some() || busy {
                    return Err(Error::NotEmpty(format!("thread {new_thread_id} already has checkpoints or runs")));
                }
                let row = copy_checkpoint_as_head!(tx, tenant, checkpoint_id, new_thread_id, None::<String>, 1i64, now);
                // The conversation up to the checkpoint. A terminal run's log
                // is complete: its driver appends nothing after the terminal
                // status, and a terminal run cannot be claimed again.
                let sources: Vec<String> = sqlx::query_scalar(concat!(
                    "SELECT run_id FROM runs WHERE tenant = $1 AND thread_id = $2 AND started_at <= $3 AND ",
                    terminal!(),
                    " ORDER BY started_at, run_id"
                ))
                .bind(tenant.as_str())
                .bind(thread_id)
                .bind(written_at)
                .fetch_all(&mut *tx)
                .await?;
                let mut runs = Vec::with_capacity(sources.len());
                for source in sources {
                    let copy = copy_run!(tx, tenant, &source, new_thread_id, now);
                    runs.push(copy);
                }
                tx.commit().await?;
                Ok(super::Fork { checkpoint: row.into(), runs })
            }

            async fn adopt(
                &self,
                tenant: &Tenant,
                from_thread: &str,
                checkpoint_id: &str,
                run_id: &str,
                thread_id: &str,
            ) -> Result<super::Adopted> {
                let mut tx = self.pool.begin_with($begin).await?;
                let exists: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM snapshot_checkpoints \
                     WHERE tenant = $1 AND thread_id = $2 AND checkpoint_id = $3)",
                )
                .bind(tenant.as_str())
                .bind(from_thread)
                .bind(checkpoint_id)
                .fetch_one(&mut *tx)
                .await?;
                if !exists {
                    return Err(checkpoint_not_found(from_thread, checkpoint_id));
                }
                let ended: bool = sqlx::query_scalar(concat!(
                    "SELECT EXISTS (SELECT 1 FROM runs WHERE tenant = $1 AND thread_id = $2 AND run_id = $3 AND ",
                    terminal!(),
                    ")"
                ))
                .bind(tenant.as_str())
                .bind(from_thread)
                .bind(run_id)
                .fetch_one(&mut *tx)
                .await?;
                if !ended {
                    return Err(Error::NotFound(format!("ended run {run_id} of thread {from_thread}")));
                }
                let now = Timestamp::now().as_millis();
                let head = lock_thread_head!(tx, tenant, thread_id, now, $for_update);
                let seq: i64 = sqlx::query_scalar(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM snapshot_checkpoints WHERE tenant = $1 AND thread_id = $2",
                )
                .bind(tenant.as_str())
                .bind(thread_id)
                .fetch_one(&mut *tx)
                .await?;
                // The head fences any writer of the thread meanwhile.
                let row = copy_checkpoint_as_head!(tx, tenant, checkpoint_id, thread_id, &head, seq, now);
                let run = copy_run!(tx, tenant, run_id, thread_id, now);
                tx.commit().await?;
                Ok(super::Adopted { checkpoint: row.into(), run })
            }

            async fn delete(&self, tenant: &Tenant, thread_id: &str, checkpoint_id: &str) -> Result<()> {
                let mut tx = self.pool.begin_with($begin).await?;
                let head: Option<Option<String>> = sqlx::query_scalar(concat!(
                    "SELECT head FROM snapshot_threads WHERE tenant = $1 AND thread_id = $2",
                    $for_update
                ))
                .bind(tenant.as_str())
                .bind(thread_id)
                .fetch_optional(&mut *tx)
                .await?;
                let deleted = sqlx::query(
                    "DELETE FROM snapshot_checkpoints WHERE tenant = $1 AND thread_id = $2 AND checkpoint_id = $3",
                )
                .bind(tenant.as_str())
                .bind(thread_id)
                .bind(checkpoint_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if deleted == 0 {
                    return Err(checkpoint_not_found(thread_id, checkpoint_id));
                }
                if head.flatten().as_deref() == Some(checkpoint_id) {
                    sqlx::query(
                        "UPDATE snapshot_threads SET updated_at = $3, head = (SELECT checkpoint_id FROM \
                         snapshot_checkpoints WHERE tenant = $1 AND thread_id = $2 ORDER BY seq DESC LIMIT 1) \
                         WHERE tenant = $1 AND thread_id = $2",
                    )
                    .bind(tenant.as_str())
                    .bind(thread_id)
                    .bind(Timestamp::now().as_millis())
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn pin_blobs(&self, tenant: &Tenant, pin_id: &str, hashes: &[String]) -> Result<()> {
                let mut tx = self.pool.begin_with($begin).await?;
                sqlx::query($pin_lock).execute(&mut *tx).await?;
                let now = Timestamp::now().as_millis();
                for group in hashes.chunks(REFS_PER_INSERT) {
                    let mut insert = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO snapshot_blob_pins (pin_id, tenant, sha256, pinned_at) ",
                    );
                    insert.push_values(group, |mut row, hash| {
                        row.push_bind(pin_id).push_bind(tenant.as_str()).push_bind(hash).push_bind(now);
                    });
                    insert.push(" ON CONFLICT (pin_id, sha256) DO NOTHING");
                    insert.build().execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn unpin(&self, pin_id: &str) -> Result<()> {
                sqlx::query("DELETE FROM snapshot_blob_pins WHERE pin_id = $1").bind(pin_id).execute(&self.pool).await?;
                Ok(())
            }

            async fn sweep(
                &self,
                stored: Vec<super::BlobKey>,
                pin_ttl: std::time::Duration,
                delete: super::checkpoint::DeleteBlobs<'_>,
            ) -> Result<Vec<super::BlobKey>> {
                let mut tx = self.pool.begin_with($begin).await?;
                sqlx::query($sweep_lock).execute(&mut *tx).await?;
                sqlx::query("DELETE FROM snapshot_blob_pins WHERE pinned_at < $1")
                    .bind(Timestamp::now().saturating_sub(pin_ttl).as_millis())
                    .execute(&mut *tx)
                    .await?;
                // Per (tenant, hash): another tenant's reference to the same
                // bytes keeps nothing of this tenant's.
                let live: std::collections::HashSet<(String, String)> = sqlx::query_as(
                    "SELECT c.tenant, r.sha256 FROM snapshot_blob_refs r \
                     JOIN snapshot_checkpoints c ON c.checkpoint_id = r.checkpoint_id \
                     UNION SELECT tenant, sha256 FROM snapshot_blob_pins",
                )
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
                let garbage: Vec<super::BlobKey> = stored
                    .into_iter()
                    .filter(|k| !live.contains(&(k.tenant.as_str().to_string(), k.sha256.clone())))
                    .collect();
                if !garbage.is_empty() {
                    // Inside the transaction: no pin can land until the
                    // blobs are gone (see the module docs of `checkpoint`).
                    delete(garbage.clone()).await?;
                }
                tx.commit().await?;
                Ok(garbage)
            }
        }
    };
}
pub(super) use impl_checkpoint_store;
