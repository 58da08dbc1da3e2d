//! Which definition a thread's next run uses when its client names none.
//! A thread keeps its sandbox, and its sandbox is the one of its definition:
//! the definition of the thread's newest run, else (a thread whose sandbox
//! was ensured through the API but never ran) of its newest sandbox. Decided
//! here so that every client, in any language, gets the same answer.

use super::{Error, RunSpec};
use crate::store::{Stores, Tenant};

/// The definition `thread_id`'s next run uses; `None` for a thread with no
/// run and no sandbox (or only ones that name no definition).
pub async fn definition_of(
    stores: &Stores,
    tenant: &Tenant,
    thread_id: &str,
) -> Result<Option<String>, Error> {
    let runs = stores.runs.list_by_thread(tenant, thread_id).await?;
    let newest = runs.iter().max_by_key(|r| r.started_at.as_millis());
    if let Some(id) =
        newest.and_then(|r| RunSpec::of(r).ok()).map(|s| s.definition_id).filter(|id| !id.is_empty())
    {
        return Ok(Some(id));
    }
    let instances = stores.instances.list(Some(tenant)).await?;
    let newest = instances
        .into_iter()
        .filter(|i| i.thread_id == thread_id && !i.definition_id.is_empty())
        .max_by_key(|i| i.updated_at.as_millis());
    Ok(newest.map(|i| i.definition_id))
}
