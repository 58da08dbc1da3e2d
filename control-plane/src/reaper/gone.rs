//! Sandboxes on a node that is gone (removed, or silent past the grace
//! period): their instance records and warm pool rows are forgotten, not
//! tried sweep after sweep.
//!
//! An instance on a gone node with no unfinished run in it loses its record
//! (under its sandbox lease, rechecked there: an ensure placing the thread's
//! next sandbox meanwhile keeps it), which frees the tenant's quota; a run
//! still in it is left to its drive, which ends it `SANDBOX_LOST` (a run
//! with no driver left is taken over by the sweep for that: [`detached`]),
//! and the next sweep forgets the sandbox.
//!
//! [`detached`]: super::detached A warm pool row on a gone node is
//! removed, so the keeper refills the pool elsewhere. The sandboxes
//! themselves are not touched: the node cannot be asked, and if it comes
//! back they are its orphans, which the orphan sweep destroys
//! ([`super::orphans`]).

use std::collections::HashMap;

use tracing::{debug, warn};

use crate::context::Context;

use super::schedule::Bounds;
use super::{Reaper, Scope, Tally};

impl Reaper {
    pub(super) async fn forget_gone_nodes_sandboxes(
        &self,
        cx: &Context,
        scope: &Scope,
        bounds: &Bounds<'_>,
        tally: &mut Tally,
    ) {
        // Whether each node is gone, asked once per sweep.
        let mut gone: HashMap<(String, String), bool> = HashMap::new();
        let mut is_gone = async |node: &str, provider: &str| -> bool {
            let at = (node.to_string(), provider.to_string());
            if let Some(known) = gone.get(&at) {
                return *known;
            }
            let answer = cx.lifecycle.node_gone(node, provider).await;
            gone.insert(at, answer);
            answer
        };
        let instances = match cx.stores.instances.list(scope.tenant()).await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "listing instances failed; no sandbox of a gone node forgotten");
                return;
            }
        };
        for instance in instances.into_iter().filter(|i| !i.node.is_empty()) {
            if bounds.exhausted() {
                tally.truncated = true;
                return;
            }
            if !is_gone(&instance.node, &instance.provider).await {
                continue;
            }
            match cx.stores.runs.unfinished_in_sandbox(&instance.sandbox_key).await {
                Ok(runs) if runs.is_empty() => {}
                Ok(_) => {
                    debug!(sandbox_key = %instance.sandbox_key, "kept: a run in it has not ended yet");
                    continue;
                }
                Err(e) => {
                    debug!(sandbox_key = %instance.sandbox_key, error = %e, "kept: its runs could not be read");
                    continue;
                }
            }
            match cx.lifecycle.forget_if_node_gone(&cx.stores, &cx.leases, &instance.sandbox_key).await {
                Ok(true) => tally.sandboxes_forgotten += 1,
                Ok(false) => {}
                Err(e) => warn!(sandbox_key = %instance.sandbox_key, error = %e,
                    "forgetting a sandbox of a gone node failed"),
            }
        }
        let pooled = match cx.stores.warm.list(scope.tenant()).await {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "listing warm pools failed; no pooled sandbox of a gone node forgotten");
                return;
            }
        };
        for sandbox in pooled.into_iter().filter(|s| !s.node.is_empty()) {
            if is_gone(&sandbox.node, &sandbox.provider).await {
                match cx.stores.warm.remove(&sandbox.pool_key).await {
                    Ok(true) => {
                        warn!(pool_key = %sandbox.pool_key, tenant = %sandbox.tenant, node = %sandbox.node,
                            "pooled sandbox forgotten: its node is gone");
                        tally.sandboxes_forgotten += 1;
                    }
                    Ok(false) => {}
                    Err(e) => warn!(pool_key = %sandbox.pool_key, error = %e,
                        "forgetting a pooled sandbox of a gone node failed"),
                }
            }
        }
    }
}
