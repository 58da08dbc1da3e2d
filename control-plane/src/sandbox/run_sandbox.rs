//! The sandbox layer as runs and the reaper see it: ensure a run's sandbox,
//! reach its agent, destroy it, read the definition a run was started
//! from, and what launching a run's command in it takes from the operator
//! (journal cap, egress bounds, the toolchain's `PATH`). Everything else of
//! the lifecycle (its policy, toolchains and providers) stays behind this.

use std::collections::BTreeMap;
use std::sync::Arc;

use shared::proto::v1::{EnsureReady, SandboxDefinition};

use super::lifecycle::Live;
use super::{EnsureInput, Error, Lifecycle, definition};
use crate::harness::Harness;
use crate::lease::Leases;
use crate::provider::Provider;
use crate::provision::Progress;
use crate::store::{Stores, Tenant};

/// Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct RunSandbox {
    stores: Stores,
    leases: Leases,
    lifecycle: Lifecycle,
}

impl RunSandbox {
    pub fn new(stores: Stores, leases: Leases, lifecycle: Lifecycle) -> Self {
        Self { stores, leases, lifecycle }
    }

    /// The tenant's stored definition `id`, decoded (the one place a run's
    /// definition is decoded: a drive reads it once and hands it down).
    pub async fn definition(&self, tenant: &Tenant, id: &str) -> Result<SandboxDefinition, Error> {
        let stored = self.stores.definitions.get(tenant, id).await?;
        definition::from_stored(&stored.body)
    }

    /// Resume, restore or create the sandbox of `input`.
    pub async fn ensure(&self, input: EnsureInput, progress: &Progress) -> Result<EnsureReady, Error> {
        self.lifecycle.ensure(&self.stores, &self.leases, input, progress).await
    }

    /// A connected agent for the tenant's sandbox `key` (resumed if need be).
    pub(crate) async fn agent(&self, tenant: &Tenant, key: &str) -> Result<Live, Error> {
        self.lifecycle.agent(&self.stores, tenant, key).await
    }

    /// How long a drive keeps reconnecting to sandbox `key`: `default`, or
    /// on a node, at least the fleet's grace period.
    pub(crate) async fn reconnect_budget(
        &self,
        key: &str,
        default: std::time::Duration,
    ) -> std::time::Duration {
        let instance = self.stores.instances.get(key).await.ok();
        self.lifecycle.reconnect_budget(instance.as_ref(), default).await
    }

    /// The sandbox `key` when this replica holds its agent now.
    pub(crate) fn live(&self, key: &str) -> Option<Live> {
        self.lifecycle.live(key)
    }

    /// Destroy the tenant's sandbox `key` (and with it any command in it).
    pub async fn destroy(&self, tenant: &Tenant, key: &str) -> Result<(), Error> {
        self.lifecycle.destroy(&self.stores, &self.leases, tenant, key).await
    }

    /// The journal byte cap of a run under `definition`, within the
    /// operator's bounds.
    pub fn journal_cap(&self, definition: &SandboxDefinition) -> u64 {
        self.lifecycle.policy.journal_cap(definition)
    }

    /// Whether a run's egress may reach private addresses.
    pub fn egress_private_addresses(&self) -> bool {
        self.lifecycle.policy.egress_private_addresses()
    }

    /// The egress limits of a run's sandbox of `tenant`, counted with the
    /// rest of this server's.
    pub fn egress_limits(&self, tenant: &str) -> crate::egress::Limits {
        self.lifecycle.egress_limits(tenant)
    }

    /// The live network rules of sandbox `key`, read at each connection
    /// of its proxy (every replica reads the same record).
    pub fn live_rules(&self, key: &str) -> Arc<dyn crate::egress::LiveRules> {
        let operator = self.lifecycle.policy.settings().egress_hosts.iter();
        Arc::new(super::network::StoredLiveRules {
            instances: self.stores.instances.clone(),
            key: key.to_string(),
            operator: operator.filter_map(|p| crate::egress::HostPattern::parse(p).ok()).collect(),
        })
    }

    /// Sandbox `key`'s live network rules as its record holds them now.
    pub async fn live_network(&self, key: &str) -> Result<crate::store::LiveNetwork, Error> {
        Ok(self.stores.instances.get(key).await?.network)
    }

    /// The operator's maxima of portable snapshots.
    pub fn snapshot_limits(&self) -> crate::config::SnapshotLimits {
        self.lifecycle.snapshot_limits()
    }

    /// The run's `PATH` with the toolchain's CLIs on it, and a warning when
    /// the harness's CLI is nowhere (see [`super::run_path`]).
    pub(crate) async fn run_path(
        &self,
        live: &Live,
        harness: Harness,
        program: &str,
        env: &BTreeMap<String, String>,
    ) -> (Option<String>, Option<String>) {
        let toolchains = self.lifecycle.toolchains.as_ref();
        super::run_path::run_path(toolchains, harness, program, env, live.provider, &live.agent).await
    }

    /// Every provider this replica serves (for the reaper's sweeps of
    /// sandboxes and journals).
    pub fn providers(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.lifecycle.providers.all()
    }

    /// The providers of every node of the fleet that answers (ready or
    /// draining), each with its node's name; none without a fleet. For the
    /// reaper's orphan sweep: a node that was lost and came back still
    /// holds the sandboxes forgotten meanwhile.
    pub async fn node_providers(&self) -> Vec<(String, Arc<dyn Provider>)> {
        use crate::node::NodeState;
        let Some(fleet) = &self.lifecycle.fleet else { return Vec::new() };
        let nodes = match fleet.list().await {
            Ok(nodes) => nodes,
            Err(e) => {
                tracing::warn!(error = %e, "listing the fleet's nodes failed");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for node in nodes.into_iter().filter(|n| matches!(n.state, NodeState::Ready | NodeState::Draining)) {
            let name = node.record.node.name.clone();
            for kind in
                node.providers.iter().filter_map(|p| crate::provider::ProviderKind::named(&p.provider))
            {
                match fleet.provider(&name, kind).await {
                    Ok(provider) => out.push((name.clone(), provider)),
                    Err(e) => tracing::debug!(node = %name, error = %e, "a node's provider is not reachable"),
                }
            }
        }
        out
    }
}
