//! Retention: ended runs older than
//! [`ReaperOptions::retain_runs`](crate::config::ReaperOptions::retain_runs)
//! are removed with their event logs and requests, oldest end first, by a
//! sweep of every tenant (a tenant's own sweep never removes anything the
//! operator's setting did not ask for). Unset, runs are kept forever.
//!
//! Then the definitions the server derived from content (`def-...`: each
//! combination of `sandhold run` flags makes one) that nothing names any
//! more (no sandbox, no unfinished run, no thread's newest run) and that
//! were last put longer ago than
//! [`ReaperOptions::unused_definition_grace`](crate::config::ReaperOptions::unused_definition_grace).
//! Definitions stored under a name of the tenant's own are never touched.
//!
//! Removing is the same however often it happens and whichever replica
//! does it: the store deletes only ended runs and unnamed definitions, in
//! one statement per batch.

use tracing::{info, warn};

use std::time::Duration;

use crate::context::Context;
use crate::store::{self, Timestamp};

use super::{Reaper, Scope, Tally};

/// Runs (or definitions) one statement removes.
const BATCH: u32 = 200;
/// Runs (and definitions) one sweep removes at most; the next sweep goes on.
const MAX_PER_SWEEP: u64 = 10_000;

impl Reaper {
    pub(super) async fn remove_expired_runs(&self, cx: &Context, scope: &Scope, tally: &mut Tally) {
        let (Scope::All, Some(retain)) = (scope, self.inner.options.retain_runs) else { return };
        let cutoff = before(retain);
        let removed = in_batches(
            &mut tally.runs_removed,
            || cx.stores.runs.delete_ended_before(cutoff, BATCH),
            |run| info!(run_id = %run.run, tenant = %run.tenant, "run removed: ended before the retention"),
        )
        .await;
        match removed {
            Ok(cut_short) => tally.truncated |= cut_short,
            Err(e) => {
                warn!(error = %e, "removing runs past the retention failed; the next sweep tries again")
            }
        }
    }

    pub(super) async fn remove_unused_definitions(&self, cx: &Context, scope: &Scope, tally: &mut Tally) {
        let Scope::All = scope else { return };
        let cutoff = before(self.inner.options.unused_definition_grace);
        let removed = in_batches(
            &mut tally.definitions_removed,
            || cx.stores.definitions.delete_unused_derived(cutoff, BATCH),
            |(tenant, id)| info!(definition = %id, tenant = %tenant, "definition removed: made from flags, unused"),
        )
        .await;
        match removed {
            Ok(cut_short) => tally.truncated |= cut_short,
            Err(e) => warn!(error = %e, "removing unused definitions failed; the next sweep tries again"),
        }
    }
}

/// `age` ago.
fn before(age: Duration) -> Timestamp {
    let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    Timestamp::from_millis(Timestamp::now().as_millis().saturating_sub(age_ms))
}

/// Remove `batch` after batch (logging each item) until one comes back
/// short, counting into `removed`, at most [`MAX_PER_SWEEP`]; `Ok(true)`
/// when that bound cut it short.
async fn in_batches<T, Fut>(
    removed: &mut u64,
    mut batch: impl FnMut() -> Fut,
    log: impl Fn(&T),
) -> Result<bool, store::Error>
where
    Fut: Future<Output = Result<Vec<T>, store::Error>>,
{
    while *removed < MAX_PER_SWEEP {
        let items = batch().await?;
        *removed += items.len() as u64;
        items.iter().for_each(&log);
        if (items.len() as u32) < BATCH {
            return Ok(false);
        }
    }
    Ok(true)
}
