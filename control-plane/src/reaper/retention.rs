//! Retention: ended runs older than
//! [`ReaperOptions::retain_runs`](crate::config::ReaperOptions::retain_runs)
//! are removed with their event logs and requests, oldest end first, by a
//! sweep of every tenant (a tenant's own sweep never removes anything the
//! operator's setting did not ask for). Unset, runs are kept forever.
//!
//! Removing is the same however often it happens and whichever replica
//! does it: the store deletes only ended runs, in one statement per batch.

use tracing::{info, warn};

use crate::context::Context;
use crate::store::Timestamp;

use super::{Reaper, Scope, Tally};

/// Runs one statement removes.
const BATCH: u32 = 200;
/// Runs one sweep removes at most; the next sweep goes on.
const MAX_PER_SWEEP: u64 = 10_000;

impl Reaper {
    pub(super) async fn remove_expired_runs(&self, cx: &Context, scope: &Scope, tally: &mut Tally) {
        let (Scope::All, Some(retain)) = (scope, self.inner.options.retain_runs) else { return };
        let retain_ms = i64::try_from(retain.as_millis()).unwrap_or(i64::MAX);
        let cutoff = Timestamp::from_millis(Timestamp::now().as_millis().saturating_sub(retain_ms));
        while tally.runs_removed < MAX_PER_SWEEP {
            match cx.stores.runs.delete_ended_before(cutoff, BATCH).await {
                Ok(removed) => {
                    tally.runs_removed += removed.len() as u64;
                    for run in &removed {
                        info!(run_id = %run.run, tenant = %run.tenant, "run removed: ended before the retention");
                    }
                    if (removed.len() as u32) < BATCH {
                        return;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "removing runs past the retention failed; the next sweep tries again");
                    return;
                }
            }
        }
        tally.truncated = true;
    }
}
