//! Every store over one database ([`Stores`]): opening a backend by URL, health, shutdown.

use std::sync::Arc;

use super::{
    AttemptStore, BlobStore, CheckpointStore, DefinitionStore, Error, EventLog, GroupCommit, InstanceStore,
    NodeStore, Result, RunStatus, RunStore, TokenStore, WarmStore, postgres, sqlite,
};

/// Every store over one database.
#[derive(Clone)]
pub struct Stores {
    pub runs: Arc<dyn RunStore>,
    pub events: Arc<dyn EventLog>,
    pub instances: Arc<dyn InstanceStore>,
    pub definitions: Arc<dyn DefinitionStore>,
    pub tokens: Arc<dyn TokenStore>,
    /// Warm pools and their pooled sandboxes.
    pub warm: Arc<dyn WarmStore>,
    /// Attempt sets and their attempts.
    pub attempts: Arc<dyn AttemptStore>,
    /// The fleet's sandbox hosts.
    pub nodes: Arc<dyn NodeStore>,
    /// Portable snapshot checkpoints, heads and blob references.
    pub checkpoints: Arc<dyn CheckpointStore>,
    /// Portable snapshot blobs: a directory beside the SQLite file, or a
    /// table of the PostgreSQL database.
    pub blobs: Arc<dyn BlobStore>,
    pub(super) pool: Pool,
    /// The event log's appends' own connections.
    pub(super) append_pool: Pool,
}

#[derive(Clone)]
pub(super) enum Pool {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Stores {
    /// Connect to `database_url` (`sqlite://<path>`, `postgres://...` or
    /// `postgresql://...`) and apply the embedded migrations. A SQLite file
    /// and its parent directory are created. On PostgreSQL this also starts
    /// the LISTEN task that wakes tailers (needs a Tokio runtime); it stops
    /// when the last clone of the stores is dropped.
    pub async fn open(database_url: &str) -> Result<Stores> {
        Self::open_with(database_url, GroupCommit::default()).await
    }

    /// [`Stores::open`], with appends committed as `grouping` says (the
    /// event-log benchmark's baseline turns grouping off). Starts the
    /// committer task of the event log's appends, on the current runtime.
    pub async fn open_with(database_url: &str, grouping: GroupCommit) -> Result<Stores> {
        if database_url.starts_with("sqlite:") {
            sqlite::open(database_url, grouping).await
        } else if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
            postgres::open(database_url, grouping).await
        } else {
            Err(Error::invalid("database_url", "expected sqlite://<path> or postgres://..."))
        }
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend_name(&self) -> &'static str {
        match self.pool {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }

    /// One round trip to the database (for health).
    pub async fn ping(&self) -> Result<()> {
        match &self.pool {
            Pool::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
            Pool::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
        }
        Ok(())
    }

    /// How many runs are `running` and `interrupted` right now, across
    /// tenants (for the metrics endpoint). Statuses without runs are 0.
    pub async fn count_unfinished_runs(&self) -> Result<Vec<(RunStatus, i64)>> {
        const QUERY: &str = "SELECT status, COUNT(*) FROM runs \
             WHERE status IN ('running', 'interrupted') GROUP BY status";
        let rows: Vec<(String, i64)> = match &self.pool {
            Pool::Sqlite(pool) => sqlx::query_as(QUERY).fetch_all(pool).await?,
            Pool::Postgres(pool) => sqlx::query_as(QUERY).fetch_all(pool).await?,
        };
        Ok([RunStatus::Running, RunStatus::Interrupted]
            .into_iter()
            .map(|status| {
                let n = rows.iter().find(|(s, _)| s == status.as_str()).map_or(0, |(_, n)| *n);
                (status, n)
            })
            .collect())
    }

    /// Close the connections (graceful shutdown). Tailing reads end with an
    /// error afterwards.
    pub async fn close(&self) {
        for pool in [&self.append_pool, &self.pool] {
            match pool {
                Pool::Sqlite(pool) => pool.close().await,
                Pool::Postgres(pool) => pool.close().await,
            }
        }
    }
}
