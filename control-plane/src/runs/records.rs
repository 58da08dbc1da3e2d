//! A tenant's run records: look-ups, listings, and the cancel request.

use tracing::{debug, info};

use super::{Error, Runs, StopReason};
use crate::provision::InvalidField;
use crate::store::{self, RunFilter, RunId, RunKey, RunRecord, Tenant, Timestamp};

/// Unset list limit.
const DEFAULT_LIST_LIMIT: u32 = 100;
const MAX_LIST_LIMIT: u32 = 1000;

/// The name of a run's lease (`run:<tenant>:<run id>`): one driver per
/// run, and two tenants' runs of one id are two runs.
pub fn lease_name(run: &RunKey) -> String {
    format!("run:{}", run.encode())
}

/// The token of the page after `last`: its start and run id (a run id has
/// no `:`).
fn page_token_of(last: &RunRecord) -> String {
    format!("{}:{}", last.started_at.as_millis(), last.run_id)
}

/// Where the page a token names starts.
fn page_after(token: &str) -> Result<Option<(Timestamp, RunId)>, Error> {
    if token.is_empty() {
        return Ok(None);
    }
    let invalid =
        || InvalidField::new("page_token", "not a token of ListRuns (pass next_page_token as it came)");
    let (ms, run) = token.split_once(':').ok_or_else(invalid)?;
    let ms: i64 = ms.parse().map_err(|_| invalid())?;
    let run = RunId::parse(run).map_err(|_| invalid())?;
    Ok(Some((Timestamp::from_millis(ms), run)))
}

/// A run id from a request field.
pub(super) fn run_id_field(field: &str, raw: &str) -> Result<RunId, Error> {
    RunId::parse(InvalidField::required(field, raw)?)
        .map_err(|e| InvalidField::new(field, e.to_string()).into())
}

impl Runs {
    /// The tenant's run, or NOT_FOUND (the same for an id only another
    /// tenant uses: run ids are per tenant).
    pub(super) async fn record(&self, run: &RunKey) -> Result<RunRecord, Error> {
        self.inner.ctx.stores.runs.get(run).await.map_err(Error::lookup(&run.run))
    }

    /// The tenant's run `run_id`.
    pub async fn get(&self, tenant: &Tenant, run_id: &str) -> Result<RunRecord, Error> {
        let run = run_id_field("run_id", run_id)?;
        self.record(&RunKey::new(tenant.clone(), run)).await
    }

    /// A page of the tenant's runs that `filter` keeps, newest first, after
    /// the run `page_token` names (empty: from the newest); `limit` 0 is the
    /// default, and it is capped. Returns the token of the next page, empty
    /// after the last.
    pub async fn list(
        &self,
        tenant: &Tenant,
        mut filter: RunFilter,
        page_token: &str,
        limit: u32,
    ) -> Result<(Vec<RunRecord>, String), Error> {
        let limit = if limit == 0 { DEFAULT_LIST_LIMIT } else { limit.min(MAX_LIST_LIMIT) };
        filter.after = page_after(page_token)?;
        // One more than asked: whether there is a next page.
        let mut runs = self.inner.ctx.stores.runs.list_page(tenant, &filter, limit + 1).await?;
        let next = if runs.len() > limit as usize {
            runs.truncate(limit as usize);
            runs.last().map(page_token_of).unwrap_or_default()
        } else {
            String::new()
        };
        Ok((runs, next))
    }

    /// The thread's run that is not terminal, if any.
    pub async fn active(&self, tenant: &Tenant, thread_id: &str) -> Result<Option<RunRecord>, Error> {
        if thread_id.is_empty() {
            return Err(InvalidField::new("thread_id", "required").into());
        }
        Ok(self.inner.ctx.stores.runs.active_run(tenant, thread_id).await?)
    }

    /// Remove the tenant's ended run with its log. One that has not ended
    /// is refused: its driver still writes to it.
    pub async fn remove(&self, tenant: &Tenant, run_id: &str) -> Result<(), Error> {
        let run = RunKey::new(tenant.clone(), run_id_field("run_id", run_id)?);
        self.inner.ctx.stores.runs.delete_ended(&run).await.map_err(Error::lookup(&run.run))?;
        info!(run_id = %run.run, "run removed");
        Ok(())
    }

    /// Record a cancel of the tenant's run and make its driver hear of it
    /// (here, on another replica, or by driving it here to stop it).
    /// Returns the record as it was when the cancel was recorded.
    pub async fn cancel(&self, tenant: &Tenant, run_id: &str) -> Result<RunRecord, Error> {
        let run = RunKey::new(tenant.clone(), run_id_field("run_id", run_id)?);
        let cx = &self.inner.ctx;
        let record = cx.stores.runs.request_cancel(&run).await.map_err(Error::lookup(&run.run))?;
        if !record.status.is_terminal() {
            info!(run_id = %run.run, "cancel requested");
            if !self.announce_cancel(&run).await {
                // Driven nowhere, perhaps: drive it here to stop it (a drive
                // reads the record when it starts).
                if let Err(e) = self.try_take_over(&run).await {
                    debug!(run_id = %run.run, error = %e, "could not take the cancelled run over");
                }
            }
        }
        Ok(record)
    }

    /// Record a cancel of `run` (the reaper's, of a run past its TTL) and
    /// tell its driver, wherever it is.
    pub async fn record_cancel(&self, run: &RunKey) -> Result<RunRecord, store::Error> {
        let record = self.inner.ctx.stores.runs.request_cancel(run).await?;
        if !record.status.is_terminal() {
            self.announce_cancel(run).await;
        }
        Ok(record)
    }

    /// Make the driver of `run` hear of its recorded cancel: stopped at
    /// once when this replica drives it, else announced on the cancel bus
    /// (drivers never poll the record). True when it was driven here.
    async fn announce_cancel(&self, run: &RunKey) -> bool {
        if self.stop_local(run, StopReason::Cancel) {
            return true;
        }
        self.inner.ctx.cancels.publish(&run.encode()).await;
        false
    }
}
