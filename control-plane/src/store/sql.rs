//! What both backends share: row types and the queries that read the same in
//! SQLite and PostgreSQL (`$N` placeholders, `ON CONFLICT`, `RETURNING` and
//! `TRUE` mean the same in both). The fenced append and close differ and live
//! in each backend.

use super::{
    Definition, Epoch, Error, Instance, LiveNetwork, NewNode, NodeRecord, Offset, Result, RunError, RunId,
    RunKey, RunRecord, RunStatus, SentinelKey, StoredChunk, Tenant, Timestamp,
};

/// Columns of `runs`, in [`RunRow`] order.
macro_rules! run_columns {
    () => {
        "run_id, thread_id, tenant, status, started_at, finished_at, error_code, error_message, usage, \
         sandbox_key, detached_since, cancel_requested, driver_epoch, sentinel_key, log_closed, updated_at, spec, \
         forked_from_run, session_id"
    };
}
pub(super) use run_columns;

/// `status NOT IN (<terminal>)`, kept next to [`RunStatus::is_terminal`]'s list.
macro_rules! not_terminal {
    () => {
        "status NOT IN ('completed', 'failed', 'aborted')"
    };
}
pub(super) use not_terminal;

/// `status IN (<terminal>)`, the complement of [`not_terminal`].
macro_rules! terminal {
    () => {
        "status IN ('completed', 'failed', 'aborted')"
    };
}
pub(super) use terminal;

/// Delete run `$run`'s events on transaction `$tx`, with the run: no
/// foreign key cascades them on PostgreSQL (an append is fenced by the
/// run's row instead, migration 0028).
macro_rules! delete_events {
    ($tx:ident, $runs:expr) => {{
        let runs: &[RunKey] = $runs;
        // One statement for many runs (the retention reaper deletes 200 at
        // a time), not a round trip each.
        for group in runs.chunks(500) {
            let mut delete = sqlx::QueryBuilder::new("DELETE FROM run_events WHERE (tenant, run_id) IN (");
            delete.push_values(group, |mut row, run| {
                row.push_bind(run.tenant.as_str()).push_bind(run.run.as_str());
            });
            delete.push(")");
            delete.build().execute(&mut *$tx).await?;
        }
    }};
}
pub(super) use delete_events;

macro_rules! instance_columns {
    () => {
        "sandbox_key, tenant, provider, provider_sandbox_id, native_snapshot, definition_id, thread_id, \
         created_at, updated_at, env, node, network, network_version"
    };
}
pub(super) use instance_columns;

pub(super) fn epoch_to_db(epoch: Epoch) -> Result<i64> {
    i64::try_from(epoch).map_err(|_| Error::invalid("epoch", format!("{epoch} is out of range")))
}

fn epoch_from_db(epoch: i64) -> Result<Epoch> {
    Epoch::try_from(epoch).map_err(|_| Error::Corrupt(format!("negative epoch {epoch}")))
}

#[derive(sqlx::FromRow)]
pub(super) struct RunRow {
    run_id: String,
    thread_id: String,
    tenant: String,
    status: String,
    started_at: i64,
    finished_at: Option<i64>,
    error_code: Option<String>,
    error_message: Option<String>,
    usage: Option<String>,
    sandbox_key: Option<String>,
    detached_since: Option<i64>,
    cancel_requested: bool,
    driver_epoch: i64,
    sentinel_key: String,
    log_closed: bool,
    updated_at: i64,
    spec: Option<String>,
    forked_from_run: Option<String>,
    session_id: Option<String>,
}

impl RunRow {
    pub(super) fn into_record(self) -> Result<RunRecord> {
        let run_id = RunId::parse(&self.run_id)
            .map_err(|e| Error::Corrupt(format!("run id {:?}: {e}", self.run_id)))?;
        let status = RunStatus::parse(&self.status)
            .ok_or_else(|| Error::Corrupt(format!("run {run_id}: status {:?}", self.status)))?;
        let usage = self
            .usage
            .map(|u| serde_json::from_str(&u))
            .transpose()
            .map_err(|e| Error::Corrupt(format!("run {run_id}: usage: {e}")))?;
        let spec = self
            .spec
            .map(|u| serde_json::from_str(&u))
            .transpose()
            .map_err(|e| Error::Corrupt(format!("run {run_id}: spec: {e}")))?;
        let forked_from_run = self
            .forked_from_run
            .map(|r| RunId::parse(&r))
            .transpose()
            .map_err(|e| Error::Corrupt(format!("run {run_id}: forked_from_run: {e}")))?;
        let error = match (self.error_code, self.error_message) {
            (None, None) => None,
            (code, message) => {
                Some(RunError { code: code.unwrap_or_default(), message: message.unwrap_or_default() })
            }
        };
        Ok(RunRecord {
            thread_id: self.thread_id,
            tenant: Tenant::new(self.tenant),
            status,
            started_at: Timestamp::from_millis(self.started_at),
            finished_at: self.finished_at.map(Timestamp::from_millis),
            error,
            usage,
            sandbox_key: self.sandbox_key,
            detached_since: self.detached_since.map(Timestamp::from_millis),
            cancel_requested: self.cancel_requested,
            driver_epoch: epoch_from_db(self.driver_epoch)?,
            sentinel_key: SentinelKey::new(self.sentinel_key),
            log_closed: self.log_closed,
            updated_at: Timestamp::from_millis(self.updated_at),
            spec,
            forked_from_run,
            session_id: self.session_id,
            run_id,
        })
    }
}

pub(super) fn json_to_db(usage: &Option<serde_json::Value>) -> Option<String> {
    usage.as_ref().map(|u| u.to_string())
}

#[derive(sqlx::FromRow)]
pub(super) struct EventRow {
    seq: i64,
    epoch: i64,
    kind: String,
    payload: Vec<u8>,
    appended_at: i64,
}

impl EventRow {
    pub(super) fn new(seq: i64, epoch: i64, kind: String, payload: Vec<u8>, appended_at: i64) -> Self {
        Self { seq, epoch, kind, payload, appended_at }
    }

    pub(super) fn into_chunk(self) -> Result<StoredChunk> {
        Ok(StoredChunk {
            offset: Offset::from_seq(self.seq)?,
            epoch: epoch_from_db(self.epoch)?,
            kind: self.kind.into(),
            payload: self.payload.into(),
            appended_at: Timestamp::from_millis(self.appended_at),
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct InstanceRow {
    sandbox_key: String,
    tenant: String,
    provider: String,
    provider_sandbox_id: String,
    native_snapshot: Option<String>,
    definition_id: String,
    thread_id: String,
    created_at: i64,
    updated_at: i64,
    env: Option<String>,
    node: String,
    network: Option<String>,
    network_version: i64,
}

impl From<InstanceRow> for Instance {
    fn from(row: InstanceRow) -> Self {
        Instance {
            sandbox_key: row.sandbox_key,
            tenant: Tenant::new(row.tenant),
            provider: row.provider,
            provider_sandbox_id: row.provider_sandbox_id,
            native_snapshot: row.native_snapshot,
            definition_id: row.definition_id,
            thread_id: row.thread_id,
            created_at: Timestamp::from_millis(row.created_at),
            updated_at: Timestamp::from_millis(row.updated_at),
            // Written only by `set_env`, from a map: always an object.
            env: row.env.and_then(|e| serde_json::from_str(&e).ok()).unwrap_or_default(),
            node: row.node,
            // Written only by `set_network`, from a `LiveNetwork`.
            network: LiveNetwork {
                version: u64::try_from(row.network_version).unwrap_or_default(),
                ..row.network.and_then(|n| serde_json::from_str(&n).ok()).unwrap_or_default()
            },
        }
    }
}

/// Columns of `nodes`, in [`NodeRow`] order.
macro_rules! node_columns {
    () => {
        "name, address, labels, providers, memory_bytes, cpus, sandbox_slots, free_memory_bytes, sandboxes, \
         version, draining, removed, registered_at, last_heartbeat"
    };
}
pub(super) use node_columns;

#[derive(sqlx::FromRow)]
pub(super) struct NodeRow {
    name: String,
    address: String,
    labels: String,
    providers: String,
    memory_bytes: i64,
    cpus: i64,
    sandbox_slots: i64,
    free_memory_bytes: i64,
    sandboxes: i64,
    version: String,
    draining: i64,
    removed: i64,
    registered_at: i64,
    last_heartbeat: i64,
}

impl From<NodeRow> for NodeRecord {
    fn from(row: NodeRow) -> Self {
        NodeRecord {
            node: NewNode {
                name: row.name,
                address: row.address,
                labels: row.labels,
                providers: row.providers,
                memory_bytes: u64::try_from(row.memory_bytes).unwrap_or_default(),
                cpus: u32::try_from(row.cpus).unwrap_or_default(),
                sandbox_slots: u32::try_from(row.sandbox_slots).unwrap_or_default(),
                version: row.version,
            },
            free_memory_bytes: u64::try_from(row.free_memory_bytes).unwrap_or_default(),
            sandboxes: u32::try_from(row.sandboxes).unwrap_or_default(),
            draining: row.draining != 0,
            removed: row.removed != 0,
            registered_at: Timestamp::from_millis(row.registered_at),
            last_heartbeat: Timestamp::from_millis(row.last_heartbeat),
        }
    }
}

/// A count as a database integer.
pub(super) fn db_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[derive(sqlx::FromRow)]
pub(super) struct DefinitionRow {
    tenant: String,
    id: String,
    body: String,
    created_at: i64,
    updated_at: i64,
}

impl DefinitionRow {
    pub(super) fn into_definition(self) -> Result<Definition> {
        let body = serde_json::from_str(&self.body)
            .map_err(|e| Error::Corrupt(format!("definition {:?}: {e}", self.id)))?;
        Ok(Definition {
            tenant: Tenant::new(self.tenant),
            id: self.id,
            body,
            created_at: Timestamp::from_millis(self.created_at),
            updated_at: Timestamp::from_millis(self.updated_at),
        })
    }
}

/// The same for an unknown run and another tenant's: nothing tells them apart.
/// The row a write's `RETURNING` gave, the statement read to its end. Every
/// `INSERT`/`UPDATE … RETURNING` outside a transaction of its own reads its
/// row through this, never through `fetch_one` or `fetch_optional`.
///
/// SQLite commits a statement's own transaction when the statement
/// finishes. `fetch_optional` stops at the first row and resets the
/// statement, and a commit that fails at the reset (a full disk) is lost
/// without an error: the caller holds a row the database never kept
/// (launchbadge/sqlx#3430). Read to its end, the statement reports it.
pub(super) async fn written<'q, DB, O, E>(
    query: sqlx::query::QueryAs<'q, DB, O, <DB as sqlx::Database>::Arguments<'q>>,
    executor: E,
) -> Result<Option<O>>
where
    DB: sqlx::Database,
    O: Send + Unpin + for<'r> sqlx::FromRow<'r, DB::Row> + 'q,
    E: 'q + sqlx::Executor<'q, Database = DB>,
    <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    Ok(query.fetch_all(executor).await?.into_iter().next())
}

pub(super) fn run_not_found(run: &RunKey) -> Error {
    Error::NotFound(format!("run {}", run.run))
}

/// Why a conditional run update matched no row.
pub(super) fn explain_refusal(run: &RunKey, current: Option<RunRecord>, held: Option<Epoch>) -> Error {
    match current {
        None => run_not_found(run),
        Some(record) => match held {
            Some(held) if held != record.driver_epoch => {
                Error::Fenced { run: run.run.to_string(), held, current: record.driver_epoch }
            }
            _ if record.status.is_terminal() => {
                Error::RunTerminal { run: run.run.to_string(), status: record.status }
            }
            _ => Error::Corrupt(format!("run {}: conditional update matched nothing", run.run)),
        },
    }
}

/// Implements [`super::RunStore`], the shared half of [`super::EventLog`]
/// ([`super::tail::LogPages`] plus `snapshot`), [`super::InstanceStore`],
/// [`super::DefinitionStore`] and [`super::TokenStore`] for a backend struct
/// with a `pool` field of the given database.
macro_rules! impl_shared_stores {
    ($store:ty, $db:ty) => {
        impl $store {
            async fn fetch_run(&self, run: &RunKey) -> Result<Option<RunRecord>> {
                sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE tenant = $1 AND run_id = $2"
                ))
                .bind(run.tenant.as_str())
                .bind(run.run.as_str())
                .fetch_optional(&self.pool)
                .await?
                .map(RunRow::into_record)
                .transpose()
            }

            async fn fetch_runs<'q>(
                &self,
                query: sqlx::query::QueryAs<'q, $db, RunRow, <$db as sqlx::Database>::Arguments<'q>>,
            ) -> Result<Vec<RunRecord>> {
                query.fetch_all(&self.pool).await?.into_iter().map(RunRow::into_record).collect()
            }

            async fn snapshot_chunks(&self, run: &RunKey) -> Result<Vec<StoredChunk>> {
                sqlx::query_as::<_, EventRow>(
                    "SELECT seq, epoch, kind, payload, appended_at FROM run_events \
                     WHERE tenant = $1 AND run_id = $2 ORDER BY seq",
                )
                .bind(run.tenant.as_str())
                .bind(run.run.as_str())
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(EventRow::into_chunk)
                .collect()
            }

            async fn page_chunks(&self, run: &RunKey, after: &Offset, limit: usize) -> Result<Vec<StoredChunk>> {
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let page = <Self as LogPages>::page_after(self, run, after.seq(), limit).await?;
                if page.is_empty() {
                    self.log_closed_flag(run).await?; // NotFound for an unknown run
                }
                Ok(page)
            }

            async fn last_chunk(&self, run: &RunKey) -> Result<Option<StoredChunk>> {
                let last = sqlx::query_as::<_, EventRow>(
                    "SELECT seq, epoch, kind, payload, appended_at FROM run_events \
                     WHERE tenant = $1 AND run_id = $2 ORDER BY seq DESC LIMIT 1",
                )
                .bind(run.tenant.as_str())
                .bind(run.run.as_str())
                .fetch_optional(&self.pool)
                .await?;
                match last {
                    Some(row) => row.into_chunk().map(Some),
                    None => self.log_closed_flag(run).await.map(|_| None),
                }
            }

            async fn log_closed_flag(&self, run: &RunKey) -> Result<bool> {
                sqlx::query_scalar::<_, bool>("SELECT log_closed FROM runs WHERE tenant = $1 AND run_id = $2")
                    .bind(run.tenant.as_str())
                    .bind(run.run.as_str())
                    .fetch_optional(&self.pool)
                    .await?
                    .ok_or_else(|| run_not_found(run))
            }
        }

        #[async_trait]
        impl RunStore for $store {
            async fn create_within(&self, new: NewRun, max_unfinished: Option<u32>) -> Result<Admitted> {
                let mut tx = self.pool.begin().await?;
                if max_unfinished.is_some() {
                    Self::lock_tenant_runs(&mut tx, &new.tenant).await?;
                }
                let inserted = sqlx::query(concat!(
                    "INSERT INTO runs (run_id, thread_id, tenant, status, started_at, sandbox_key, \
                     driver_epoch, sentinel_key, updated_at, spec, definition_id) \
                     SELECT $1, $2, $3, 'running', $4, $5, $6, $7, $8, $9, $11 \
                     WHERE $10 IS NULL OR (SELECT COUNT(*) FROM runs WHERE tenant = $3 AND ",
                    not_terminal!(),
                    ") < $10 ON CONFLICT (tenant, run_id) DO NOTHING"
                ))
                .bind(new.run_id.as_str())
                .bind(&new.thread_id)
                .bind(new.tenant.as_str())
                .bind(new.started_at.as_millis())
                .bind(&new.sandbox_key)
                .bind(epoch_to_db(FIRST_EPOCH)?)
                .bind(new.sentinel_key.expose())
                .bind(Timestamp::now().as_millis())
                .bind(json_to_db(&new.spec))
                .bind(max_unfinished.map(i64::from))
                .bind(new.definition_id.as_deref().filter(|id| !id.is_empty()))
                .execute(&mut *tx)
                .await?
                .rows_affected();
                let row = sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE tenant = $1 AND run_id = $2"
                ))
                .bind(new.tenant.as_str())
                .bind(new.run_id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                let admitted = match row.map(RunRow::into_record).transpose()? {
                    Some(record) => Admitted::Run(CreatedRun { record, created: inserted == 1 }),
                    None => {
                        let unfinished = sqlx::query_scalar::<_, i64>(concat!(
                            "SELECT COUNT(*) FROM runs WHERE tenant = $1 AND ",
                            not_terminal!()
                        ))
                        .bind(new.tenant.as_str())
                        .fetch_one(&mut *tx)
                        .await?;
                        Admitted::Full { unfinished: u64::try_from(unfinished).unwrap_or_default() }
                    }
                };
                tx.commit().await?;
                Ok(admitted)
            }

            async fn get(&self, run: &RunKey) -> Result<RunRecord> {
                self.fetch_run(run).await?.ok_or_else(|| run_not_found(run))
            }

            async fn update(&self, run: &RunKey, update: RunUpdate) -> Result<RunRecord> {
                if let Some(status) = update.status
                    && status.is_terminal()
                {
                    return Err(Error::invalid("status", format!("{status} is terminal: use finish")));
                }
                let mut query = sqlx::QueryBuilder::<$db>::new("UPDATE runs SET updated_at = ");
                query.push_bind(Timestamp::now().as_millis());
                if let Some(status) = update.status {
                    query.push(", status = ").push_bind(status.as_str());
                }
                if let Some(sandbox_key) = &update.sandbox_key {
                    query.push(", sandbox_key = ").push_bind(sandbox_key.clone());
                }
                if let Some(detached_since) = update.detached_since {
                    query.push(", detached_since = ").push_bind(detached_since.map(Timestamp::as_millis));
                }
                if update.usage.is_some() {
                    query.push(", usage = ").push_bind(json_to_db(&update.usage));
                }
                query.push(" WHERE tenant = ").push_bind(run.tenant.as_str());
                query.push(" AND run_id = ").push_bind(run.run.as_str());
                // Marking a run detached is for running runs only: a mark that
                // lost the race with the run's end must not land on the record.
                if update.status.is_some() || matches!(update.detached_since, Some(Some(_))) {
                    query.push(concat!(" AND ", not_terminal!()));
                }
                query.push(concat!(" RETURNING ", run_columns!()));
                match super::sql::written(query.build_query_as::<RunRow>(), &self.pool).await? {
                    Some(row) => row.into_record(),
                    None => Err(explain_refusal(run, self.fetch_run(run).await?, None)),
                }
            }

            async fn claim(&self, run: &RunKey) -> Result<RunRecord> {
                // One UPDATE: racing claims serialize on the row and each sees
                // the other's bump, so every claim gets its own epoch.
                let row = super::sql::written(sqlx::query_as::<_, RunRow>(concat!(
                    "UPDATE runs SET driver_epoch = driver_epoch + 1, updated_at = $2 \
                     WHERE run_id = $1 AND tenant = $3 AND ",
                    not_terminal!(),
                    " RETURNING ",
                    run_columns!()
                ))
                .bind(run.run.as_str())
                .bind(Timestamp::now().as_millis())
                .bind(run.tenant.as_str())
                , &self.pool)
                .await?;
                match row {
                    Some(row) => row.into_record(),
                    None => Err(explain_refusal(run, self.fetch_run(run).await?, None)),
                }
            }

            async fn finish(&self, run: &RunKey, epoch: Epoch, finish: RunFinish) -> Result<RunRecord> {
                if !finish.status.is_terminal() {
                    return Err(Error::invalid("status", format!("{} is not terminal", finish.status)));
                }
                // The epoch test sits in the UPDATE's WHERE: against a racing
                // claim (an UPDATE of the same row) the two serialize on the
                // row, and whichever runs second re-checks the other's result
                // (PostgreSQL re-evaluates the WHERE on the new row version;
                // SQLite runs one writer at a time).
                let row = super::sql::written(sqlx::query_as::<_, RunRow>(concat!(
                    "UPDATE runs SET status = $3, finished_at = $4, error_code = $5, error_message = $6, \
                     usage = COALESCE($7, usage), updated_at = $8, session_id = COALESCE($10, session_id) \
                     WHERE run_id = $1 AND tenant = $9 AND driver_epoch = $2 AND ",
                    not_terminal!(),
                    " RETURNING ",
                    run_columns!()
                ))
                .bind(run.run.as_str())
                .bind(epoch_to_db(epoch)?)
                .bind(finish.status.as_str())
                .bind(finish.finished_at.as_millis())
                .bind(finish.error.as_ref().map(|e| e.code.clone()))
                .bind(finish.error.as_ref().map(|e| e.message.clone()))
                .bind(json_to_db(&finish.usage))
                .bind(Timestamp::now().as_millis())
                .bind(run.tenant.as_str())
                .bind(finish.session_id.as_deref())
                , &self.pool)
                .await?;
                match row {
                    Some(row) => row.into_record(),
                    None => {
                        let refusal = explain_refusal(run, self.fetch_run(run).await?, Some(epoch));
                        if matches!(refusal, Error::Fenced { .. }) {
                            crate::metrics::fencing().refused(crate::metrics::FencedWrite::Finish);
                        }
                        Err(refusal)
                    }
                }
            }

            async fn request_cancel(&self, run: &RunKey) -> Result<RunRecord> {
                let row = super::sql::written(sqlx::query_as::<_, RunRow>(concat!(
                    "UPDATE runs SET cancel_requested = TRUE, updated_at = $3 \
                     WHERE run_id = $1 AND tenant = $2 AND ",
                    not_terminal!(),
                    " RETURNING ",
                    run_columns!()
                ))
                .bind(run.run.as_str())
                .bind(run.tenant.as_str())
                .bind(Timestamp::now().as_millis())
                , &self.pool)
                .await?;
                match row {
                    Some(row) => row.into_record(),
                    // Unknown, or terminal (returned as is).
                    None => RunStore::get(self, run).await,
                }
            }

            async fn active_run(&self, tenant: &Tenant, thread_id: &str) -> Result<Option<RunRecord>> {
                let query = sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE tenant = $1 AND thread_id = $2 AND ",
                    not_terminal!(),
                    " ORDER BY started_at DESC, run_id DESC LIMIT 1"
                ))
                .bind(tenant.as_str())
                .bind(thread_id);
                Ok(self.fetch_runs(query).await?.into_iter().next())
            }

            async fn list_by_thread(&self, tenant: &Tenant, thread_id: &str) -> Result<Vec<RunRecord>> {
                let query = sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE tenant = $1 AND thread_id = $2 ORDER BY started_at, run_id"
                ))
                .bind(tenant.as_str())
                .bind(thread_id);
                self.fetch_runs(query).await
            }

            async fn list_page(
                &self,
                tenant: &Tenant,
                filter: &crate::store::RunFilter,
                limit: u32,
            ) -> Result<Vec<RunRecord>> {
                let (after_ms, after_run) = match &filter.after {
                    Some((at, run)) => (Some(at.as_millis()), Some(run.as_str())),
                    None => (None, None),
                };
                let query = sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE tenant = $1 \
                     AND ($2 IS NULL OR thread_id = $2) \
                     AND ($3 IS NULL OR status = $3) \
                     AND ($4 IS NULL OR LOWER(run_id) LIKE $4 ESCAPE '\\' OR LOWER(thread_id) LIKE $4 ESCAPE '\\' \
                          OR LOWER(COALESCE(spec, '')) LIKE $4 ESCAPE '\\') \
                     AND ($5 IS NULL OR started_at < $5 OR (started_at = $5 AND run_id < $6)) \
                     ORDER BY started_at DESC, run_id DESC LIMIT $7"
                ))
                .bind(tenant.as_str())
                .bind(filter.thread_id.as_deref())
                .bind(filter.status.map(crate::store::RunStatus::as_str))
                .bind(filter.like_pattern())
                .bind(after_ms)
                .bind(after_run)
                .bind(i64::from(limit));
                self.fetch_runs(query).await
            }

            async fn list_reclaimable(&self, cutoff: Timestamp, tenant: Option<&Tenant>) -> Result<Vec<RunRecord>> {
                let query = sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE status = 'running' AND detached_since IS NOT NULL \
                     AND detached_since <= $1 AND ($2 IS NULL OR tenant = $2) ORDER BY detached_since, run_id"
                ))
                .bind(cutoff.as_millis())
                .bind(tenant.map(Tenant::as_str));
                self.fetch_runs(query).await
            }

            async fn list_undetached_running(&self, limit: u32, tenant: Option<&Tenant>) -> Result<Vec<RunRecord>> {
                let query = sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE status = 'running' AND detached_since IS NULL \
                     AND ($2 IS NULL OR tenant = $2) ORDER BY started_at, run_id LIMIT $1"
                ))
                .bind(i64::from(limit))
                .bind(tenant.map(Tenant::as_str));
                self.fetch_runs(query).await
            }

            async fn unfinished_in_sandbox(&self, sandbox_key: &str) -> Result<Vec<RunRecord>> {
                let query = sqlx::query_as::<_, RunRow>(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE sandbox_key = $1 AND ",
                    not_terminal!(),
                    " ORDER BY started_at, run_id"
                ))
                .bind(sandbox_key);
                self.fetch_runs(query).await
            }

            async fn delete_ended(&self, run: &RunKey) -> Result<()> {
                // The terminal test sits in the DELETE: a run that ends
                // between a look and the delete is never half removed.
                let mut tx = self.pool.begin().await?;
                let deleted =
                    sqlx::query(concat!("DELETE FROM runs WHERE tenant = $1 AND run_id = $2 AND ", terminal!()))
                        .bind(run.tenant.as_str())
                        .bind(run.run.as_str())
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                if deleted == 1 {
                    $crate::store::sql::delete_events!(tx, std::slice::from_ref(run));
                    tx.commit().await?;
                    return Ok(());
                }
                drop(tx);
                match self.fetch_run(run).await? {
                    None => Err(run_not_found(run)),
                    Some(record) => Err(Error::RunNotEnded { run: run.run.to_string(), status: record.status }),
                }
            }

            async fn delete_ended_before(&self, cutoff: Timestamp, limit: u32) -> Result<Vec<RunKey>> {
                let mut tx = self.pool.begin().await?;
                let rows: Vec<(String, String)> = sqlx::query_as(concat!(
                    "DELETE FROM runs WHERE (tenant, run_id) IN (SELECT tenant, run_id FROM runs WHERE ",
                    terminal!(),
                    " AND finished_at < $1 ORDER BY finished_at, run_id LIMIT $2) RETURNING tenant, run_id"
                ))
                .bind(cutoff.as_millis())
                .bind(i64::from(limit))
                .fetch_all(&mut *tx)
                .await?;
                let deleted = rows
                    .into_iter()
                    .map(|(tenant, run)| {
                        let run = crate::store::RunId::parse(&run)
                            .map_err(|e| Error::Corrupt(format!("run id {run:?}: {e}")))?;
                        Ok(RunKey::new(Tenant::new(tenant), run))
                    })
                    .collect::<Result<Vec<_>>>()?;
                $crate::store::sql::delete_events!(tx, &deleted);
                tx.commit().await?;
                Ok(deleted)
            }
        }

        #[async_trait]
        impl LogPages for $store {
            async fn page_after(&self, run: &RunKey, after_seq: i64, limit: i64) -> Result<Vec<StoredChunk>> {
                sqlx::query_as::<_, EventRow>(
                    "SELECT seq, epoch, kind, payload, appended_at FROM run_events \
                     WHERE run_id = $1 AND seq > $2 AND tenant = $4 ORDER BY seq LIMIT $3",
                )
                .bind(run.run.as_str())
                .bind(after_seq)
                .bind(limit)
                .bind(run.tenant.as_str())
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(EventRow::into_chunk)
                .collect()
            }

            async fn log_end(&self, run: &RunKey) -> Result<(bool, i64)> {
                sqlx::query_as::<_, (bool, i64)>(
                    "SELECT r.log_closed, (SELECT COALESCE(MAX(e.seq), 0) FROM run_events e \
                       WHERE e.tenant = r.tenant AND e.run_id = r.run_id) \
                     FROM runs r WHERE r.tenant = $1 AND r.run_id = $2",
                )
                .bind(run.tenant.as_str())
                .bind(run.run.as_str())
                .fetch_optional(&self.pool)
                .await?
                .ok_or_else(|| run_not_found(run))
            }

            async fn closed_and_page_after(
                &self,
                run: &RunKey,
                after_seq: i64,
                limit: i64,
            ) -> Result<(bool, Vec<StoredChunk>)> {
                type Row = (bool, Option<i64>, Option<i64>, Option<String>, Option<Vec<u8>>, Option<i64>);
                let rows = sqlx::query_as::<_, Row>(
                    "SELECT r.log_closed, e.seq, e.epoch, e.kind, e.payload, e.appended_at \
                     FROM runs r LEFT JOIN ( \
                         SELECT seq, epoch, kind, payload, appended_at FROM run_events \
                         WHERE tenant = $1 AND run_id = $2 AND seq > $3 ORDER BY seq LIMIT $4 \
                     ) e ON 1 = 1 \
                     WHERE r.tenant = $1 AND r.run_id = $2 ORDER BY e.seq",
                )
                .bind(run.tenant.as_str())
                .bind(run.run.as_str())
                .bind(after_seq)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                let closed = rows.first().ok_or_else(|| run_not_found(run))?.0;
                let chunks = rows
                    .into_iter()
                    .filter_map(|(_, seq, epoch, kind, payload, at)| match (seq, epoch, kind, payload, at) {
                        (Some(seq), Some(epoch), Some(kind), Some(payload), Some(at)) => {
                            Some(EventRow::new(seq, epoch, kind, payload, at).into_chunk())
                        }
                        _ => None,
                    })
                    .collect::<Result<_>>()?;
                Ok((closed, chunks))
            }
        }

        #[async_trait]
        impl InstanceStore for $store {
            async fn put(&self, instance: NewInstance) -> Result<Instance> {
                let now = Timestamp::now().as_millis();
                let row = super::sql::written(sqlx::query_as::<_, InstanceRow>(concat!(
                    "INSERT INTO instances (",
                    instance_columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, NULL, $9, NULL, 0) ON CONFLICT (sandbox_key) DO UPDATE SET \
                     tenant = excluded.tenant, provider = excluded.provider, node = excluded.node, \
                     provider_sandbox_id = excluded.provider_sandbox_id, \
                     native_snapshot = excluded.native_snapshot, definition_id = excluded.definition_id, \
                     thread_id = excluded.thread_id, updated_at = excluded.updated_at \
                     RETURNING ",
                    instance_columns!()
                ))
                .bind(&instance.sandbox_key)
                .bind(instance.tenant.as_str())
                .bind(&instance.provider)
                .bind(&instance.provider_sandbox_id)
                .bind(&instance.native_snapshot)
                .bind(&instance.definition_id)
                .bind(&instance.thread_id)
                .bind(now)
                .bind(&instance.node)
                , &self.pool)
                .await?
                .ok_or_else(|| Error::Corrupt("an upsert returned no row".into()))?;
                Ok(row.into())
            }

            async fn get(&self, sandbox_key: &str) -> Result<Instance> {
                sqlx::query_as::<_, InstanceRow>(concat!(
                    "SELECT ",
                    instance_columns!(),
                    " FROM instances WHERE sandbox_key = $1"
                ))
                .bind(sandbox_key)
                .fetch_optional(&self.pool)
                .await?
                .map(Instance::from)
                .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_key}")))
            }

            async fn set_native_snapshot(&self, sandbox_key: &str, snapshot: Option<String>) -> Result<Instance> {
                super::sql::written(sqlx::query_as::<_, InstanceRow>(concat!(
                    "UPDATE instances SET native_snapshot = $2, updated_at = $3 WHERE sandbox_key = $1 \
                     RETURNING ",
                    instance_columns!()
                ))
                .bind(sandbox_key)
                .bind(snapshot)
                .bind(Timestamp::now().as_millis())
                , &self.pool)
                .await?
                .map(Instance::from)
                .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_key}")))
            }

            async fn set_env(&self, sandbox_key: &str, env: &std::collections::BTreeMap<String, String>) -> Result<Instance> {
                let json = serde_json::to_string(env).expect("a map of strings serializes");
                super::sql::written(sqlx::query_as::<_, InstanceRow>(concat!(
                    "UPDATE instances SET env = $2, updated_at = $3 WHERE sandbox_key = $1 RETURNING ",
                    instance_columns!()
                ))
                .bind(sandbox_key)
                .bind(json)
                .bind(Timestamp::now().as_millis())
                , &self.pool)
                .await?
                .map(Instance::from)
                .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_key}")))
            }

            async fn set_network(&self, sandbox_key: &str, version: u64, network: &crate::store::LiveNetwork) -> Result<Option<Instance>> {
                let json = serde_json::to_string(network).expect("live rules serialize");
                let version = i64::try_from(version).map_err(|_| Error::invalid("version", "out of range"))?;
                let row = super::sql::written(sqlx::query_as::<_, InstanceRow>(concat!(
                    "UPDATE instances SET network = $2, network_version = network_version + 1, updated_at = $3 \
                     WHERE sandbox_key = $1 AND network_version = $4 RETURNING ",
                    instance_columns!()
                ))
                .bind(sandbox_key)
                .bind(json)
                .bind(Timestamp::now().as_millis())
                .bind(version)
                , &self.pool)
                .await?;
                match row {
                    Some(row) => Ok(Some(row.into())),
                    None => InstanceStore::get(self, sandbox_key).await.map(|_| None),
                }
            }

            async fn list(&self, tenant: Option<&Tenant>) -> Result<Vec<Instance>> {
                let rows = match tenant {
                    Some(tenant) => {
                        sqlx::query_as::<_, InstanceRow>(concat!(
                            "SELECT ",
                            instance_columns!(),
                            " FROM instances WHERE tenant = $1 ORDER BY sandbox_key"
                        ))
                        .bind(tenant.as_str())
                        .fetch_all(&self.pool)
                        .await?
                    }
                    None => {
                        sqlx::query_as::<_, InstanceRow>(concat!(
                            "SELECT ",
                            instance_columns!(),
                            " FROM instances ORDER BY sandbox_key"
                        ))
                        .fetch_all(&self.pool)
                        .await?
                    }
                };
                Ok(rows.into_iter().map(Instance::from).collect())
            }

            async fn count(&self, tenant: &Tenant) -> Result<u64> {
                let n = sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM instances WHERE tenant = $1")
                    .bind(tenant.as_str())
                    .fetch_one(&self.pool)
                    .await?;
                u64::try_from(n).map_err(|_| Error::Corrupt(format!("instance count {n}")))
            }

            async fn points_at(&self, provider: &str, provider_sandbox_id: &str) -> Result<bool> {
                let n = sqlx::query_scalar::<_, i64>(
                    "SELECT COUNT(*) FROM instances WHERE provider = $1 AND provider_sandbox_id = $2",
                )
                .bind(provider)
                .bind(provider_sandbox_id)
                .fetch_one(&self.pool)
                .await?;
                Ok(n > 0)
            }

            async fn delete(&self, sandbox_key: &str) -> Result<bool> {
                let deleted = sqlx::query("DELETE FROM instances WHERE sandbox_key = $1")
                    .bind(sandbox_key)
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
                Ok(deleted > 0)
            }
        }

        #[async_trait]
        impl DefinitionStore for $store {
            async fn put(&self, tenant: &Tenant, id: &str, body: serde_json::Value) -> Result<Definition> {
                if id.is_empty() {
                    return Err(Error::invalid("definition id", "empty"));
                }
                let now = Timestamp::now().as_millis();
                super::sql::written(sqlx::query_as::<_, DefinitionRow>(
                    "INSERT INTO definitions (tenant, id, body, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $4) ON CONFLICT (tenant, id) DO UPDATE SET \
                     body = excluded.body, updated_at = excluded.updated_at \
                     RETURNING tenant, id, body, created_at, updated_at",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(body.to_string())
                .bind(now)
                , &self.pool)
                .await?
                .ok_or_else(|| Error::Corrupt("an upsert returned no row".into()))?
                .into_definition()
            }

            async fn get(&self, tenant: &Tenant, id: &str) -> Result<Definition> {
                sqlx::query_as::<_, DefinitionRow>(
                    "SELECT tenant, id, body, created_at, updated_at FROM definitions \
                     WHERE tenant = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(id)
                .fetch_optional(&self.pool)
                .await?
                .ok_or_else(|| Error::NotFound(format!("sandbox definition {id}")))?
                .into_definition()
            }

            async fn list(&self, tenant: &Tenant) -> Result<Vec<Definition>> {
                sqlx::query_as::<_, DefinitionRow>(
                    "SELECT tenant, id, body, created_at, updated_at FROM definitions \
                     WHERE tenant = $1 ORDER BY id",
                )
                .bind(tenant.as_str())
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(DefinitionRow::into_definition)
                .collect()
            }

            async fn delete(&self, tenant: &Tenant, id: &str) -> Result<bool> {
                let deleted = sqlx::query("DELETE FROM definitions WHERE tenant = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
                Ok(deleted > 0)
            }

            async fn delete_unused_derived(
                &self,
                cutoff: Timestamp,
                limit: u32,
            ) -> Result<Vec<(Tenant, String)>> {
                // `updated_at < $1` twice: PostgreSQL re-checks the outer
                // condition on a row a concurrent put just renewed, not the
                // subquery's.
                let rows: Vec<(String, String)> = sqlx::query_as(concat!(
                    "DELETE FROM definitions WHERE updated_at < $1 AND (tenant, id) IN ( \
                     SELECT d.tenant, d.id FROM definitions d \
                     WHERE d.id LIKE $3 AND d.updated_at < $1 \
                     AND NOT EXISTS (SELECT 1 FROM instances i \
                         WHERE i.tenant = d.tenant AND i.definition_id = d.id) \
                     AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.tenant = d.tenant AND r.definition_id = d.id \
                         AND (r.",
                    not_terminal!(),
                    " OR NOT EXISTS (SELECT 1 FROM runs n WHERE n.tenant = r.tenant \
                             AND n.thread_id = r.thread_id AND n.started_at > r.started_at))) \
                     ORDER BY d.updated_at, d.tenant, d.id LIMIT $2) RETURNING tenant, id"
                ))
                .bind(cutoff.as_millis())
                .bind(i64::from(limit))
                .bind(format!("{}%", crate::store::DERIVED_PREFIX))
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.into_iter().map(|(tenant, id)| (Tenant::new(tenant), id)).collect())
            }
        }

        #[async_trait]
        impl NodeStore for $store {
            async fn register(&self, node: NewNode) -> Result<Option<NodeRecord>> {
                let now = Timestamp::now().as_millis();
                let row = super::sql::written(sqlx::query_as::<_, NodeRow>(concat!(
                    "INSERT INTO nodes (",
                    node_columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $5, 0, $8, 0, 0, $9, $9) ON CONFLICT (name) DO UPDATE SET \
                     address = excluded.address, labels = excluded.labels, providers = excluded.providers, \
                     memory_bytes = excluded.memory_bytes, cpus = excluded.cpus, \
                     sandbox_slots = excluded.sandbox_slots, version = excluded.version, \
                     last_heartbeat = excluded.last_heartbeat WHERE nodes.removed = 0 RETURNING ",
                    node_columns!()
                ))
                .bind(&node.name)
                .bind(&node.address)
                .bind(&node.labels)
                .bind(&node.providers)
                .bind(super::sql::db_count(node.memory_bytes))
                .bind(i64::from(node.cpus))
                .bind(i64::from(node.sandbox_slots))
                .bind(&node.version)
                .bind(now)
                , &self.pool)
                .await?;
                Ok(row.map(NodeRecord::from))
            }

            async fn heartbeat(&self, name: &str, free_memory_bytes: u64, sandboxes: u32) -> Result<Option<NodeRecord>> {
                let row = super::sql::written(sqlx::query_as::<_, NodeRow>(concat!(
                    "UPDATE nodes SET free_memory_bytes = $2, sandboxes = $3, last_heartbeat = $4 \
                     WHERE name = $1 AND removed = 0 RETURNING ",
                    node_columns!()
                ))
                .bind(name)
                .bind(super::sql::db_count(free_memory_bytes))
                .bind(i64::from(sandboxes))
                .bind(Timestamp::now().as_millis())
                , &self.pool)
                .await?;
                Ok(row.map(NodeRecord::from))
            }

            async fn get(&self, name: &str) -> Result<Option<NodeRecord>> {
                Ok(sqlx::query_as::<_, NodeRow>(concat!("SELECT ", node_columns!(), " FROM nodes WHERE name = $1"))
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(NodeRecord::from))
            }

            async fn list(&self) -> Result<Vec<NodeRecord>> {
                Ok(sqlx::query_as::<_, NodeRow>(concat!(
                    "SELECT ",
                    node_columns!(),
                    " FROM nodes WHERE removed = 0 ORDER BY name"
                ))
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(NodeRecord::from)
                .collect())
            }

            async fn set_draining(&self, name: &str, draining: bool) -> Result<Option<NodeRecord>> {
                let row = super::sql::written(sqlx::query_as::<_, NodeRow>(concat!(
                    "UPDATE nodes SET draining = $2 WHERE name = $1 AND removed = 0 RETURNING ",
                    node_columns!()
                ))
                .bind(name)
                .bind(i64::from(draining))
                , &self.pool)
                .await?;
                Ok(row.map(NodeRecord::from))
            }

            async fn remove(&self, name: &str) -> Result<bool> {
                let n = sqlx::query("UPDATE nodes SET removed = 1 WHERE name = $1 AND removed = 0")
                    .bind(name)
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
                Ok(n > 0)
            }

            async fn placed(&self) -> Result<Vec<(String, u32)>> {
                let rows: Vec<(String, i64)> = sqlx::query_as(
                    "SELECT node, COUNT(*) FROM ( \
                       SELECT node FROM instances WHERE node <> '' \
                       UNION ALL \
                       SELECT node FROM warm_sandboxes WHERE node <> '' AND claimed_key IS NULL \
                     ) placed GROUP BY node",
                )
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.into_iter().map(|(node, n)| (node, u32::try_from(n).unwrap_or(u32::MAX))).collect())
            }
        }

        #[async_trait]
        impl TokenStore for $store {
            async fn put_token(&self, tenant: &Tenant, token: &str) -> Result<()> {
                if token.is_empty() {
                    return Err(Error::invalid("token", "empty"));
                }
                let hash = token_hash(token);
                sqlx::query(
                    "INSERT INTO api_tokens (token_sha256, tenant, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (token_sha256) DO NOTHING",
                )
                .bind(&hash)
                .bind(tenant.as_str())
                .bind(Timestamp::now().as_millis())
                .execute(&self.pool)
                .await?;
                let owner = sqlx::query_scalar::<_, String>("SELECT tenant FROM api_tokens WHERE token_sha256 = $1")
                    .bind(&hash)
                    .fetch_optional(&self.pool)
                    .await?;
                match owner {
                    Some(owner) if owner == tenant.as_str() => Ok(()),
                    // Deleted in between (Some: another tenant's) - either way not ours.
                    _ => Err(Error::AlreadyExists("token for another tenant".into())),
                }
            }

            async fn tenant_for_token(&self, token: &str) -> Result<Option<Tenant>> {
                Ok(sqlx::query_scalar::<_, String>("SELECT tenant FROM api_tokens WHERE token_sha256 = $1")
                    .bind(token_hash(token))
                    .fetch_optional(&self.pool)
                    .await?
                    .map(Tenant::new))
            }

            async fn list_tenants(&self) -> Result<Vec<Tenant>> {
                Ok(sqlx::query_scalar::<_, String>("SELECT DISTINCT tenant FROM api_tokens ORDER BY tenant")
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .map(Tenant::new)
                    .collect())
            }

            async fn delete_token(&self, token: &str) -> Result<bool> {
                let deleted = sqlx::query("DELETE FROM api_tokens WHERE token_sha256 = $1")
                    .bind(token_hash(token))
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
                Ok(deleted > 0)
            }

            async fn keep_only(&self, keep: &[&str]) -> Result<u64> {
                let mut query = sqlx::QueryBuilder::<$db>::new("DELETE FROM api_tokens");
                if !keep.is_empty() {
                    query.push(" WHERE token_sha256 NOT IN (");
                    let mut hashes = query.separated(", ");
                    for token in keep {
                        hashes.push_bind(token_hash(token));
                    }
                    hashes.push_unseparated(")");
                }
                Ok(query.build().execute(&self.pool).await?.rows_affected())
            }
        }
    };
}
pub(super) use impl_shared_stores;
