//! Orphaned sandboxes: labelled as ours, of a known tenant, with no
//! instance record and no unfinished run, past their grace: destroyed.
//!
//! A sandbox the provider lists with Sandhold's labels, made through this
//! server's data dir (never another deployment's on a shared Docker engine),
//! of a tenant this deployment knows, that no instance record points at and
//! no unfinished run lives in, older than
//! [`ReaperOptions::orphan_sandbox_grace`](crate::config::ReaperOptions::orphan_sandbox_grace),
//! is destroyed (under its sandbox lease, so never during an ensure). The
//! server's own providers are swept and those of every fleet node that
//! answers: a node lost past its grace whose sandboxes were forgotten
//! (`gone`) and that came back has them as orphans.

use std::collections::HashSet;

use tracing::{debug, info, warn};

use crate::context::Context;
use crate::provider::{LABEL_SANDBOX_KEY, LABEL_TENANT};
use crate::store::{self, Tenant, Timestamp, WarmState};

use super::{Reaper, Scope, Tally};

/// Where a listed sandbox is: its node (`""`: this server), provider and id.
#[derive(Clone, Copy)]
struct At<'a> {
    node: &'a str,
    provider: &'a str,
    provider_id: &'a str,
}

impl Reaper {
    /// Tenants this deployment knows: an orphan of an unknown tenant may
    /// belong to another deployment sharing the provider (a Docker engine).
    async fn known_tenants(&self, cx: &Context) -> Result<HashSet<Tenant>, store::Error> {
        let mut known: HashSet<Tenant> = cx.stores.tokens.list_tenants().await?.into_iter().collect();
        if self.inner.single_user {
            known.insert(Tenant::new(crate::auth::SINGLE_USER_TENANT));
        }
        Ok(known)
    }

    pub(super) async fn reclaim_orphans(&self, cx: &Context, scope: &Scope, tally: &mut Tally) {
        let known = match self.known_tenants(cx).await {
            Ok(k) => k,
            Err(e) => {
                warn!(error = %e, "listing tenants failed; no orphaned sandboxes reclaimed");
                return;
            }
        };
        let grace = self.inner.options.orphan_sandbox_grace.as_millis() as i64;
        let now = Timestamp::now().as_millis();
        let own = self.inner.sandbox.providers().map(|p| (String::new(), p.clone()));
        let providers: Vec<_> = own.chain(self.inner.sandbox.node_providers().await).collect();
        for (node, provider) in providers {
            let listed = match provider.list(&Self::scope_labels(scope)).await {
                Ok(l) => l,
                Err(e) => {
                    warn!(provider = %provider.kind(), node = %node, error = %e, "listing sandboxes failed");
                    continue;
                }
            };
            for sandbox in listed {
                let (Some(key), Some(tenant)) =
                    (sandbox.labels.get(LABEL_SANDBOX_KEY), sandbox.labels.get(LABEL_TENANT))
                else {
                    continue;
                };
                let tenant = Tenant::new(tenant);
                if !known.contains(&tenant) || !scope.covers(&tenant) {
                    continue;
                }
                // Not made through our data dir (another deployment on the
                // same Docker engine), or no age to judge: keep it.
                if !sandbox.own {
                    continue;
                }
                let Some(created) = sandbox.created_at else { continue };
                if now.saturating_sub(created.as_millis()) < grace {
                    continue;
                }
                let at =
                    At { node: &node, provider: provider.kind().as_str(), provider_id: &sandbox.provider_id };
                match self.orphan(cx, key, &at).await {
                    Ok(false) => {}
                    Ok(true) => {
                        // Under the sandbox's lease: never during an ensure or destroy.
                        let Ok(Some(lease)) = cx.leases.try_acquire(&format!("sandbox:{key}")).await else {
                            continue;
                        };
                        let still = self.orphan(cx, key, &at).await;
                        if matches!(still, Ok(true)) {
                            match provider.destroy(&sandbox.provider_id).await {
                                Ok(()) => {
                                    info!(sandbox_key = %key, tenant = %tenant, provider_id = %sandbox.provider_id,
                                        node = %node, "orphaned sandbox destroyed");
                                    tally.sandboxes_reclaimed += 1;
                                }
                                Err(e) => warn!(sandbox_key = %key, error = %e,
                                    "destroying an orphaned sandbox failed"),
                            }
                        }
                        let _ = lease.release().await;
                    }
                    Err(e) => debug!(sandbox_key = %key, error = %e, "orphan check failed; kept"),
                }
            }
        }
    }

    /// No instance record points at this sandbox, no warm pool keeps it,
    /// and no unfinished run lives in its key when no record points
    /// anywhere.
    async fn orphan(&self, cx: &Context, key: &str, at: &At<'_>) -> Result<bool, store::Error> {
        let At { node, provider, provider_id } = *at;
        match cx.stores.instances.get(key).await {
            Ok(i) if i.node == node && i.provider == provider && i.provider_sandbox_id == provider_id => {
                Ok(false)
            }
            // The key's record points at another sandbox: this one was replaced.
            Ok(_) => Ok(true),
            Err(store::Error::NotFound(_)) => {
                // A warm pool's sandbox carries its pool key: kept while
                // it is being made or waits to be claimed, and once
                // claimed while the claiming thread's record points at it.
                match cx.stores.warm.get(key).await? {
                    Some(pooled) if pooled.state == WarmState::Creating => return Ok(false),
                    Some(pooled)
                        if pooled.state == WarmState::Ready
                            && pooled.node == node
                            && pooled.provider_sandbox_id == provider_id =>
                    {
                        return Ok(false);
                    }
                    _ => {}
                }
                if cx.stores.instances.points_at(provider, provider_id).await? {
                    return Ok(false);
                }
                Ok(cx.stores.runs.unfinished_in_sandbox(key).await?.is_empty())
            }
            Err(e) => Err(e),
        }
    }
}
