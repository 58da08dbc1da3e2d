//! Journal pruning: delete the journals of terminal runs in every running
//! sandbox, and orphans old enough; keep anything not proven terminal.
//!
//! In every sandbox the provider reports running, each journal whose run
//! record (of the sandbox's tenant: a sandbox is one tenant's, and so are
//! the runs in it) is terminal is deleted; a journal with no record at all
//! only once older than
//! [`ReaperOptions::orphan_journal_age`](crate::config::ReaperOptions::orphan_journal_age);
//! anything not proven terminal (running record, undecodable name, store
//! error) is kept. At most
//! [`ReaperOptions::max_journal_deletions`](crate::config::ReaperOptions::max_journal_deletions)
//! per sweep.

use std::collections::{BTreeMap, HashSet};

use shared::proto::agent::v1 as agent;
use tracing::{debug, warn};

use crate::context::Context;
use crate::provider::LABEL_TENANT;
use crate::store::{self, RunId, RunKey, Timestamp};

use super::handle::PROBE_TIMEOUT;
use super::schedule::Bounds;
use super::{Error, Reaper, Scope, Tally};

impl Reaper {
    /// Provider ids of the sandboxes that are running now, per provider name.
    async fn running_sandboxes(&self, labels: &BTreeMap<String, String>) -> HashSet<(String, String)> {
        let mut running = HashSet::new();
        for provider in self.inner.sandbox.providers() {
            match provider.list(labels).await {
                Ok(listed) => running.extend(
                    listed
                        .into_iter()
                        .filter(|s| s.running)
                        .map(|s| (provider.kind().as_str().to_string(), s.provider_id)),
                ),
                Err(e) => warn!(provider = %provider.kind(), error = %e, "listing sandboxes failed"),
            }
        }
        running
    }

    pub(super) fn scope_labels(scope: &Scope) -> BTreeMap<String, String> {
        match scope {
            Scope::All => BTreeMap::new(),
            Scope::Tenant(t) => BTreeMap::from([(LABEL_TENANT.to_string(), t.as_str().to_string())]),
        }
    }

    pub(super) async fn prune_journals(
        &self,
        cx: &Context,
        scope: &Scope,
        bounds: &Bounds<'_>,
        tally: &mut Tally,
    ) {
        let instances = match cx.stores.instances.list(scope.tenant()).await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "listing instances failed; no journals pruned");
                return;
            }
        };
        // Only running sandboxes: a sweep never wakes a stopped one.
        let running = self.running_sandboxes(&Self::scope_labels(scope)).await;
        let mut budget = u64::from(self.inner.options.max_journal_deletions);
        for instance in instances {
            // The listing is of this server's own providers: a node's
            // sandboxes are not in it.
            if !instance.node.is_empty()
                || !running.contains(&(instance.provider.clone(), instance.provider_sandbox_id.clone()))
            {
                continue;
            }
            if budget == 0 || bounds.exhausted() {
                tally.truncated = true;
                break;
            }
            match tokio::time::timeout(PROBE_TIMEOUT, self.prune_sandbox(cx, &instance, budget)).await {
                Ok(Ok((pruned, kept))) => {
                    budget -= pruned.min(budget);
                    tally.journals_pruned += pruned;
                    tally.journals_kept += kept;
                }
                Ok(Err(e)) => {
                    debug!(sandbox_key = %instance.sandbox_key, error = %e, "journals not pruned")
                }
                Err(_) => {
                    debug!(sandbox_key = %instance.sandbox_key, "journals not pruned: the agent is slow")
                }
            }
        }
    }

    /// Delete the journals of one sandbox that are proven dead; returns
    /// (deleted, kept).
    async fn prune_sandbox(
        &self,
        cx: &Context,
        instance: &store::Instance,
        budget: u64,
    ) -> Result<(u64, u64), Error> {
        let live = self.inner.sandbox.agent(&instance.tenant, &instance.sandbox_key).await?;
        let journals = live
            .agent
            .journal()
            .list_journals(agent::ListJournalsRequest {})
            .await
            .map_err(Error::Journals)?
            .into_inner()
            .journals;
        let now = Timestamp::now().as_millis();
        let orphan_age = self.inner.options.orphan_journal_age.as_millis() as i64;
        let mut doomed = Vec::new();
        let mut kept = 0u64;
        for journal in journals {
            let dead = match RunId::parse(&journal.run_id) {
                Err(_) => false,
                // A sandbox is one tenant's, so are the runs in it.
                Ok(run) => match cx.stores.runs.get(&RunKey::new(instance.tenant.clone(), run)).await {
                    Ok(r) => r.status.is_terminal(),
                    Err(store::Error::NotFound(_)) => now.saturating_sub(journal.mtime_ms) >= orphan_age,
                    Err(_) => false,
                },
            };
            if dead && (doomed.len() as u64) < budget {
                doomed.push(journal.run_id);
            } else {
                kept += 1;
            }
        }
        if doomed.is_empty() {
            return Ok((0, kept));
        }
        let deleted = live
            .agent
            .journal()
            .delete_journals(agent::DeleteJournalsRequest { run_ids: doomed })
            .await
            .map_err(Error::Journals)?
            .into_inner()
            .deleted;
        for run in &deleted {
            debug!(sandbox_key = %instance.sandbox_key, run_id = %run, "journal pruned");
        }
        Ok((deleted.len() as u64, kept))
    }
}
