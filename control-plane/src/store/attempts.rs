//! Attempt sets ([`AttemptStore`]): one task fanned out to N runs, each in
//! a thread of its own forked from the set's thread; each attempt's
//! evaluation once its run has ended; and which attempt was promoted.

use async_trait::async_trait;

use super::{Result, Tenant, Timestamp};

/// A set, as created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptSetRecord {
    pub set_id: String,
    pub tenant: Tenant,
    /// The thread the task was asked in.
    pub thread_id: String,
    pub definition_id: String,
    /// The checkpoint every attempt started from (of `thread_id`).
    pub base_checkpoint_id: String,
    pub promoted_run_id: Option<String>,
    pub created_at: Timestamp,
}

/// One attempt of a set.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub set_id: String,
    /// 0 to N-1.
    pub attempt: u32,
    pub run_id: String,
    /// The attempt's own thread.
    pub thread_id: String,
    pub harness: String,
    pub model: String,
    /// What its evaluation found, once its run ended (opaque here).
    pub evaluation: Option<serde_json::Value>,
}

/// What a promote found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Promotion {
    /// This call promoted `run_id`.
    Now,
    /// `run_id` was promoted already: nothing changes.
    Again,
    /// Another attempt was promoted.
    Other(String),
}

#[async_trait]
pub trait AttemptStore: Send + Sync {
    /// Record a set and its attempts in one transaction.
    async fn create(&self, set: &AttemptSetRecord, attempts: &[AttemptRecord]) -> Result<()>;

    /// The tenant's set and its attempts in order; NOT_FOUND for another
    /// tenant's.
    async fn get(&self, tenant: &Tenant, set_id: &str) -> Result<(AttemptSetRecord, Vec<AttemptRecord>)>;

    /// Attempts of every tenant not evaluated yet, at most `limit`.
    async fn unevaluated(&self, limit: u32) -> Result<Vec<(Tenant, AttemptRecord)>>;

    /// Record an attempt's evaluation (the last one written stays).
    async fn evaluated(&self, set_id: &str, attempt: u32, evaluation: &serde_json::Value) -> Result<()>;

    /// Mark `run_id` the set's promoted attempt, unless one is already.
    async fn promote(&self, tenant: &Tenant, set_id: &str, run_id: &str) -> Result<Promotion>;

    /// Forget a set that never started whole. True if it existed.
    async fn delete(&self, tenant: &Tenant, set_id: &str) -> Result<bool>;
}

type SetRow = (String, String, String, String, String, Option<String>, i64);
type AttemptRow = (String, i64, String, String, String, String, Option<String>);

pub(super) fn set_of(row: SetRow) -> AttemptSetRecord {
    let (set_id, tenant, thread_id, definition_id, base_checkpoint_id, promoted_run_id, created_at) = row;
    AttemptSetRecord {
        set_id,
        tenant: Tenant::new(tenant),
        thread_id,
        definition_id,
        base_checkpoint_id,
        promoted_run_id,
        created_at: Timestamp::from_millis(created_at),
    }
}

pub(super) fn attempt_of(row: AttemptRow) -> Result<AttemptRecord> {
    let (set_id, attempt, run_id, thread_id, harness, model, evaluation) = row;
    let evaluation = evaluation
        .map(|e| serde_json::from_str(&e))
        .transpose()
        .map_err(|e| super::Error::Corrupt(format!("attempt {attempt} of set {set_id}: {e}")))?;
    Ok(AttemptRecord {
        set_id,
        attempt: u32::try_from(attempt).unwrap_or_default(),
        run_id,
        thread_id,
        harness,
        model,
        evaluation,
    })
}

/// Implements [`AttemptStore`] for `$store` (with a `pool`); `$begin` opens
/// a write transaction.
macro_rules! impl_attempt_store {
    ($store:ty, begin: $begin:literal) => {
        #[async_trait::async_trait]
        impl super::AttemptStore for $store {
            async fn create(
                &self,
                set: &super::AttemptSetRecord,
                attempts: &[super::AttemptRecord],
            ) -> Result<()> {
                let mut tx = self.pool.begin_with($begin).await?;
                sqlx::query(
                    "INSERT INTO attempt_sets (set_id, tenant, thread_id, definition_id, base_checkpoint_id, \
                     promoted_run_id, created_at) VALUES ($1, $2, $3, $4, $5, NULL, $6)",
                )
                .bind(&set.set_id)
                .bind(set.tenant.as_str())
                .bind(&set.thread_id)
                .bind(&set.definition_id)
                .bind(&set.base_checkpoint_id)
                .bind(set.created_at.as_millis())
                .execute(&mut *tx)
                .await?;
                for a in attempts {
                    sqlx::query(
                        "INSERT INTO attempts (set_id, attempt, tenant, run_id, thread_id, harness, model, \
                         evaluation) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)",
                    )
                    .bind(&set.set_id)
                    .bind(i64::from(a.attempt))
                    .bind(set.tenant.as_str())
                    .bind(&a.run_id)
                    .bind(&a.thread_id)
                    .bind(&a.harness)
                    .bind(&a.model)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn get(
                &self,
                tenant: &Tenant,
                set_id: &str,
            ) -> Result<(super::AttemptSetRecord, Vec<super::AttemptRecord>)> {
                let set = sqlx::query_as(
                    "SELECT set_id, tenant, thread_id, definition_id, base_checkpoint_id, promoted_run_id, \
                     created_at FROM attempt_sets WHERE tenant = $1 AND set_id = $2",
                )
                .bind(tenant.as_str())
                .bind(set_id)
                .fetch_optional(&self.pool)
                .await?
                .map(super::attempts::set_of)
                .ok_or_else(|| Error::NotFound(format!("attempt set {set_id}")))?;
                let rows = sqlx::query_as(
                    "SELECT set_id, attempt, run_id, thread_id, harness, model, evaluation FROM attempts \
                     WHERE tenant = $1 AND set_id = $2 ORDER BY attempt",
                )
                .bind(tenant.as_str())
                .bind(set_id)
                .fetch_all(&self.pool)
                .await?;
                let attempts = rows.into_iter().map(super::attempts::attempt_of).collect::<Result<_>>()?;
                Ok((set, attempts))
            }

            async fn unevaluated(&self, limit: u32) -> Result<Vec<(Tenant, super::AttemptRecord)>> {
                let rows: Vec<(String, String, i64, String, String, String, String, Option<String>)> =
                    sqlx::query_as(
                        "SELECT tenant, set_id, attempt, run_id, thread_id, harness, model, evaluation \
                         FROM attempts WHERE evaluation IS NULL ORDER BY set_id, attempt LIMIT $1",
                    )
                    .bind(i64::from(limit))
                    .fetch_all(&self.pool)
                    .await?;
                rows.into_iter()
                    .map(|(tenant, set_id, attempt, run_id, thread_id, harness, model, evaluation)| {
                        let a = super::attempts::attempt_of((
                            set_id, attempt, run_id, thread_id, harness, model, evaluation,
                        ))?;
                        Ok((Tenant::new(tenant), a))
                    })
                    .collect()
            }

            async fn evaluated(
                &self,
                set_id: &str,
                attempt: u32,
                evaluation: &serde_json::Value,
            ) -> Result<()> {
                sqlx::query("UPDATE attempts SET evaluation = $3 WHERE set_id = $1 AND attempt = $2")
                    .bind(set_id)
                    .bind(i64::from(attempt))
                    .bind(evaluation.to_string())
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn promote(&self, tenant: &Tenant, set_id: &str, run_id: &str) -> Result<super::Promotion> {
                let taken = sqlx::query(
                    "UPDATE attempt_sets SET promoted_run_id = $3 WHERE tenant = $1 AND set_id = $2 \
                     AND promoted_run_id IS NULL",
                )
                .bind(tenant.as_str())
                .bind(set_id)
                .bind(run_id)
                .execute(&self.pool)
                .await?;
                if taken.rows_affected() == 1 {
                    return Ok(super::Promotion::Now);
                }
                let promoted: Option<Option<String>> = sqlx::query_scalar(
                    "SELECT promoted_run_id FROM attempt_sets WHERE tenant = $1 AND set_id = $2",
                )
                .bind(tenant.as_str())
                .bind(set_id)
                .fetch_optional(&self.pool)
                .await?;
                match promoted.flatten() {
                    Some(p) if p == run_id => Ok(super::Promotion::Again),
                    Some(p) => Ok(super::Promotion::Other(p)),
                    None => Err(Error::NotFound(format!("attempt set {set_id}"))),
                }
            }

            async fn delete(&self, tenant: &Tenant, set_id: &str) -> Result<bool> {
                let mut tx = self.pool.begin_with($begin).await?;
                sqlx::query("DELETE FROM attempts WHERE tenant = $1 AND set_id = $2")
                    .bind(tenant.as_str())
                    .bind(set_id)
                    .execute(&mut *tx)
                    .await?;
                let gone = sqlx::query("DELETE FROM attempt_sets WHERE tenant = $1 AND set_id = $2")
                    .bind(tenant.as_str())
                    .bind(set_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(gone.rows_affected() == 1)
            }
        }
    };
}
pub(super) use impl_attempt_store;
