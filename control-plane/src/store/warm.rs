//! Warm pools ([`WarmStore`]): which definitions keep sandboxes ready, and
//! the pooled sandboxes themselves.
//!
//! A pooled sandbox is made under a key of its own (its `pool_key`, which
//! its provider labels carry) and goes `creating` → `ready` → `claimed`. A
//! claim is one statement that picks the oldest ready sandbox of the pool
//! and marks it with the claiming thread's sandbox key, so two replicas
//! never claim the same one (PostgreSQL skips rows another claim has
//! locked; SQLite has one writer). The claimed row stays for a day (what
//! `pools ls` counts as claimed); the thread's instance record is what
//! points at the sandbox from then on.

use async_trait::async_trait;

use super::{Result, Tenant, Timestamp};

/// A definition's pool: how many sandboxes it keeps ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPool {
    pub tenant: Tenant,
    pub definition_id: String,
    pub target: u32,
    /// Why the last refill failed; empty when it did not.
    pub last_error: String,
}

/// Where a pooled sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmState {
    /// Being created and set up (its provider id is not known yet).
    Creating,
    Ready,
    Claimed,
}

impl WarmState {
    pub fn as_str(self) -> &'static str {
        match self {
            WarmState::Creating => "creating",
            WarmState::Ready => "ready",
            WarmState::Claimed => "claimed",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        match s {
            "creating" => Ok(WarmState::Creating),
            "ready" => Ok(WarmState::Ready),
            "claimed" => Ok(WarmState::Claimed),
            other => Err(super::Error::Corrupt(format!("unknown warm sandbox state {other:?}"))),
        }
    }
}

/// A pooled sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmSandbox {
    /// The key it was made under: its labels carry it.
    pub pool_key: String,
    pub tenant: Tenant,
    pub definition_id: String,
    /// What the definition was when the sandbox was made (its sandbox key
    /// without a thread): a sandbox of another digest is never claimed.
    pub digest: String,
    pub provider: String,
    /// The fleet node it lives on; empty: the server's own providers.
    pub node: String,
    /// Empty while `Creating`.
    pub provider_sandbox_id: String,
    pub state: WarmState,
    /// The sandbox key of the thread that claimed it.
    pub claimed_key: Option<String>,
    pub created_at: Timestamp,
    pub claimed_at: Option<Timestamp>,
}

#[async_trait]
pub trait WarmStore: Send + Sync {
    /// Set the definition's pool (a target of 0 removes it).
    async fn set_pool(&self, tenant: &Tenant, definition_id: &str, target: u32) -> Result<()>;

    /// Every pool, of every tenant.
    async fn pools(&self) -> Result<Vec<WarmPool>>;

    /// Record why the pool's last refill failed (empty: it did not).
    async fn set_pool_error(&self, tenant: &Tenant, definition_id: &str, error: &str) -> Result<()>;

    /// A sandbox about to be made for the pool: `Creating`, no provider id.
    async fn add(&self, sandbox: &WarmSandbox) -> Result<()>;

    /// The `Creating` sandbox `pool_key` is made and set up: `Ready`.
    async fn ready(&self, pool_key: &str, provider_sandbox_id: &str) -> Result<bool>;

    /// Claim the oldest ready sandbox of the pool made from `digest` for
    /// the thread's `sandbox_key`; `None` when the pool has none ready.
    async fn claim(
        &self,
        tenant: &Tenant,
        definition_id: &str,
        digest: &str,
        sandbox_key: &str,
    ) -> Result<Option<WarmSandbox>>;

    async fn get(&self, pool_key: &str) -> Result<Option<WarmSandbox>>;

    /// Every pooled sandbox (all states), or one tenant's.
    async fn list(&self, tenant: Option<&Tenant>) -> Result<Vec<WarmSandbox>>;

    /// True if it existed.
    async fn remove(&self, pool_key: &str) -> Result<bool>;

    /// The tenant's pooled sandboxes not claimed yet (creating or ready, or
    /// claimed a moment ago by a thread whose record is not written yet):
    /// they count against its sandbox quota like its instances.
    async fn count_unclaimed(&self, tenant: &Tenant) -> Result<u64>;
}

/// How long after its claim a pooled sandbox whose thread's record is not
/// written yet still counts against the quota as unclaimed.
pub(super) const RECORDING_WINDOW_MS: i64 = 60_000;

/// Columns of `warm_sandboxes`, in [`WarmRow`] order.
macro_rules! warm_columns {
    () => {
        "pool_key, tenant, definition_id, digest, provider, node, provider_sandbox_id, state, \
         claimed_key, created_at, claimed_at"
    };
}
pub(super) use warm_columns;

#[derive(sqlx::FromRow)]
pub(super) struct WarmRow {
    pool_key: String,
    tenant: String,
    definition_id: String,
    digest: String,
    provider: String,
    node: String,
    provider_sandbox_id: String,
    state: String,
    claimed_key: Option<String>,
    created_at: i64,
    claimed_at: Option<i64>,
}

impl TryFrom<WarmRow> for WarmSandbox {
    type Error = super::Error;

    fn try_from(r: WarmRow) -> Result<Self> {
        Ok(WarmSandbox {
            pool_key: r.pool_key,
            tenant: Tenant::new(r.tenant),
            definition_id: r.definition_id,
            digest: r.digest,
            provider: r.provider,
            node: r.node,
            provider_sandbox_id: r.provider_sandbox_id,
            state: WarmState::parse(&r.state)?,
            claimed_key: r.claimed_key,
            created_at: Timestamp::from_millis(r.created_at),
            claimed_at: r.claimed_at.map(Timestamp::from_millis),
        })
    }
}

/// Implements [`WarmStore`] for `$store` (with a `pool`). `$skip_locked`:
/// the row-lock suffix of a claim's pick (`FOR UPDATE SKIP LOCKED` on
/// PostgreSQL, so concurrent claims take different rows; nothing on
/// SQLite, whose one writer serializes them).
macro_rules! impl_warm_store {
    ($store:ty, skip_locked: $skip_locked:literal) => {
        #[async_trait::async_trait]
        impl super::WarmStore for $store {
            async fn set_pool(&self, tenant: &Tenant, definition_id: &str, target: u32) -> Result<()> {
                if target == 0 {
                    sqlx::query("DELETE FROM warm_pools WHERE tenant = $1 AND definition_id = $2")
                        .bind(tenant.as_str())
                        .bind(definition_id)
                        .execute(&self.pool)
                        .await?;
                    return Ok(());
                }
                sqlx::query(
                    "INSERT INTO warm_pools (tenant, definition_id, target, last_error, updated_at) \
                     VALUES ($1, $2, $3, '', $4) ON CONFLICT (tenant, definition_id) DO UPDATE SET \
                     target = excluded.target, updated_at = excluded.updated_at",
                )
                .bind(tenant.as_str())
                .bind(definition_id)
                .bind(i64::from(target))
                .bind(Timestamp::now().as_millis())
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn pools(&self) -> Result<Vec<super::WarmPool>> {
                let rows: Vec<(String, String, i64, String)> = sqlx::query_as(
                    "SELECT tenant, definition_id, target, last_error FROM warm_pools \
                     ORDER BY tenant, definition_id",
                )
                .fetch_all(&self.pool)
                .await?;
                Ok(rows
                    .into_iter()
                    .map(|(tenant, definition_id, target, last_error)| super::WarmPool {
                        tenant: Tenant::new(tenant),
                        definition_id,
                        target: u32::try_from(target).unwrap_or(u32::MAX),
                        last_error,
                    })
                    .collect())
            }

            async fn set_pool_error(&self, tenant: &Tenant, definition_id: &str, error: &str) -> Result<()> {
                sqlx::query(
                    "UPDATE warm_pools SET last_error = $3 WHERE tenant = $1 AND definition_id = $2 \
                     AND last_error <> $3",
                )
                .bind(tenant.as_str())
                .bind(definition_id)
                .bind(error)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn add(&self, s: &super::WarmSandbox) -> Result<()> {
                sqlx::query(concat!(
                    "INSERT INTO warm_sandboxes (",
                    super::warm::warm_columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
                ))
                .bind(&s.pool_key)
                .bind(s.tenant.as_str())
                .bind(&s.definition_id)
                .bind(&s.digest)
                .bind(&s.provider)
                .bind(&s.node)
                .bind(&s.provider_sandbox_id)
                .bind(s.state.as_str())
                .bind(&s.claimed_key)
                .bind(s.created_at.as_millis())
                .bind(s.claimed_at.map(|t| t.as_millis()))
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn ready(&self, pool_key: &str, provider_sandbox_id: &str) -> Result<bool> {
                let done = sqlx::query(
                    "UPDATE warm_sandboxes SET state = 'ready', provider_sandbox_id = $2 \
                     WHERE pool_key = $1 AND state = 'creating'",
                )
                .bind(pool_key)
                .bind(provider_sandbox_id)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn claim(
                &self,
                tenant: &Tenant,
                definition_id: &str,
                digest: &str,
                sandbox_key: &str,
            ) -> Result<Option<super::WarmSandbox>> {
                let row: Option<super::warm::WarmRow> = sqlx::query_as(concat!(
                    "UPDATE warm_sandboxes SET state = 'claimed', claimed_key = $4, claimed_at = $5 \
                     WHERE state = 'ready' AND pool_key = (SELECT pool_key FROM warm_sandboxes \
                     WHERE tenant = $1 AND definition_id = $2 AND digest = $3 AND state = 'ready' \
                     ORDER BY created_at, pool_key LIMIT 1",
                    $skip_locked,
                    ") RETURNING ",
                    super::warm::warm_columns!()
                ))
                .bind(tenant.as_str())
                .bind(definition_id)
                .bind(digest)
                .bind(sandbox_key)
                .bind(Timestamp::now().as_millis())
                .fetch_optional(&self.pool)
                .await?;
                row.map(super::WarmSandbox::try_from).transpose()
            }

            async fn get(&self, pool_key: &str) -> Result<Option<super::WarmSandbox>> {
                let row: Option<super::warm::WarmRow> = sqlx::query_as(concat!(
                    "SELECT ",
                    super::warm::warm_columns!(),
                    " FROM warm_sandboxes WHERE pool_key = $1"
                ))
                .bind(pool_key)
                .fetch_optional(&self.pool)
                .await?;
                row.map(super::WarmSandbox::try_from).transpose()
            }

            async fn list(&self, tenant: Option<&Tenant>) -> Result<Vec<super::WarmSandbox>> {
                let rows: Vec<super::warm::WarmRow> = match tenant {
                    Some(tenant) => {
                        sqlx::query_as(concat!(
                            "SELECT ",
                            super::warm::warm_columns!(),
                            " FROM warm_sandboxes WHERE tenant = $1 ORDER BY created_at, pool_key"
                        ))
                        .bind(tenant.as_str())
                        .fetch_all(&self.pool)
                        .await?
                    }
                    None => {
                        sqlx::query_as(concat!(
                            "SELECT ",
                            super::warm::warm_columns!(),
                            " FROM warm_sandboxes ORDER BY created_at, pool_key"
                        ))
                        .fetch_all(&self.pool)
                        .await?
                    }
                };
                rows.into_iter().map(super::WarmSandbox::try_from).collect()
            }

            async fn remove(&self, pool_key: &str) -> Result<bool> {
                let done = sqlx::query("DELETE FROM warm_sandboxes WHERE pool_key = $1")
                    .bind(pool_key)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn count_unclaimed(&self, tenant: &Tenant) -> Result<u64> {
                // A sandbox claimed a moment ago whose thread's record is
                // not written yet is counted still: else a refill could
                // take its place in the quota in between.
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM warm_sandboxes w WHERE w.tenant = $1 AND (w.state <> 'claimed' \
                     OR (w.claimed_at > $2 AND NOT EXISTS \
                     (SELECT 1 FROM instances i WHERE i.sandbox_key = w.claimed_key)))",
                )
                .bind(tenant.as_str())
                .bind(Timestamp::now().as_millis() - super::warm::RECORDING_WINDOW_MS)
                .fetch_one(&self.pool)
                .await?;
                Ok(n as u64)
            }
        }
    };
}
pub(super) use impl_warm_store;
