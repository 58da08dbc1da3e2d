//! Where a sandbox lives: on the server's own providers (node `""`), or on
//! a node of the fleet. A sandbox stays where it is while its node lives; a
//! new one goes to a ready node whose labels satisfy the definition's
//! `[placement] require`, that offers its provider and has a free slot,
//! most unreserved memory first: a node's memory less one slot's share
//! (memory / slots) for each sandbox on it or being made there by this
//! replica. Reserving by slot share, not by the free memory a heartbeat
//! reports, is what spreads a burst (an attempt set's N sandboxes, a warm
//! pool's refill): an idle sandbox barely moves a host's free memory, and
//! a heartbeat is seconds old. Ties go to the node reporting the most
//! free memory, then the fewest sandboxes. With no node registered, every
//! sandbox stays on the server's own providers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use shared::proto::v1 as api;
use tracing::warn;

use super::{Error, Lifecycle};
use crate::node::fleet::Reservation;
use crate::node::{self, NodeState, NodeView};
use crate::provider::{Provider, ProviderKind};
use crate::store::Instance;

/// Where a sandbox is (or goes): its node (`""`: this server) and provider.
pub(super) struct Placed {
    pub node: String,
    pub provider: Arc<dyn Provider>,
    /// For a new sandbox on a node: held until it is recorded (or its
    /// making failed), so that placements meanwhile count it.
    pub reservation: Option<Reservation>,
}

impl Placed {
    /// On this server's own `provider`.
    fn here(provider: Arc<dyn Provider>) -> Self {
        Self { node: String::new(), provider, reservation: None }
    }
}

impl Lifecycle {
    /// Where the sandbox of `existing` lives, or where a new one of
    /// `definition` goes. An existing sandbox whose node is gone (removed,
    /// lost) is given up: a new one is placed.
    pub(super) async fn place(
        &self,
        existing: Option<&Instance>,
        kind: ProviderKind,
        definition: &api::SandboxDefinition,
    ) -> Result<Placed, Error> {
        if let Some(instance) = existing {
            if instance.node.is_empty() {
                return Ok(Placed::here(self.providers.get(kind)?.clone()));
            }
            match self.provider_on(&instance.node, kind).await {
                Ok(provider) => {
                    return Ok(Placed { node: instance.node.clone(), provider, reservation: None });
                }
                Err(Error::Fleet(
                    e @ (node::Error::Removed(_) | node::Error::Lost(_) | node::Error::NotFound(_)),
                )) => {
                    warn!(sandbox_key = %instance.sandbox_key, node = %instance.node, error = %e, "the sandbox's node is gone; placing a new one");
                }
                Err(e) => return Err(e),
            }
        }
        let Some(fleet) = &self.fleet else {
            return Ok(Placed::here(self.providers.get(kind)?.clone()));
        };
        let placing = fleet.placing().await;
        let nodes = fleet.list().await?;
        if nodes.is_empty() {
            return Ok(Placed::here(self.providers.get(kind)?.clone()));
        }
        let require = requirements(definition);
        let chosen = choose(&nodes, kind, &require).map_err(|(reason, why)| {
            crate::metrics::sandboxes().placement_failed(reason);
            Error::Unplaceable(why)
        })?;
        let reservation = fleet.reserve(&chosen);
        drop(placing);
        Ok(Placed {
            provider: fleet.provider(&chosen, kind).await?,
            reservation: Some(reservation),
            node: chosen,
        })
    }

    /// A sandbox whose node is gone (removed, lost, unknown) is lost: the
    /// live agent is forgotten and [`Error::SandboxLost`] says why. A
    /// node that is only unreachable (a partition shorter than the grace
    /// period) still holds it.
    pub(super) async fn check_node(&self, instance: &Instance) -> Result<(), Error> {
        if instance.node.is_empty() {
            return Ok(());
        }
        let Some(kind) = ProviderKind::named(&instance.provider) else { return Ok(()) };
        match self.provider_on(&instance.node, kind).await {
            Err(Error::Fleet(
                e @ (node::Error::Removed(_) | node::Error::Lost(_) | node::Error::NotFound(_)),
            )) => {
                self.forget(&instance.sandbox_key);
                Err(Error::SandboxLost {
                    key: instance.sandbox_key.clone(),
                    node: instance.node.clone(),
                    why: e.to_string(),
                })
            }
            _ => Ok(()),
        }
    }

    /// How long a drive keeps reconnecting to sandbox `key` before it gives
    /// up: `default`, or for a sandbox on a node, until the node is lost
    /// (the grace period), whichever is longer.
    pub(crate) async fn reconnect_budget(&self, instance: Option<&Instance>, default: Duration) -> Duration {
        match (instance, &self.fleet) {
            (Some(i), Some(fleet)) if !i.node.is_empty() => {
                default.max(fleet.grace() + crate::node::fleet::HEARTBEAT_INTERVAL * 5)
            }
            _ => default,
        }
    }

    /// The `kind` provider of `node` (`""`: this server's own).
    pub(crate) async fn provider_on(
        &self,
        node: &str,
        kind: ProviderKind,
    ) -> Result<Arc<dyn Provider>, Error> {
        if node.is_empty() {
            return Ok(self.providers.get(kind)?.clone());
        }
        match &self.fleet {
            Some(fleet) => Ok(fleet.provider(node, kind).await?),
            None => Err(node::Error::NotFound(node.to_string()).into()),
        }
    }
}

/// The definition's `[placement] require`, as KEY -> VALUE.
pub(super) fn requirements(definition: &api::SandboxDefinition) -> BTreeMap<String, String> {
    let Some(placement) = &definition.placement else { return BTreeMap::new() };
    placement
        .require
        .iter()
        .filter_map(|r| r.split_once('=').map(|(k, v)| (k.trim().to_string(), v.trim().to_string())))
        .collect()
}

/// Problems of a definition's placement, as at `PutDefinition`.
pub(super) fn violations(definition: &api::SandboxDefinition, out: &mut Vec<(String, String)>) {
    let Some(placement) = &definition.placement else { return };
    for (i, r) in placement.require.iter().enumerate() {
        let ok = r.split_once('=').is_some_and(|(k, v)| !k.trim().is_empty() && !v.trim().is_empty());
        if !ok {
            out.push((format!("definition.placement.require[{i}]"), format!("{r:?} is not KEY=VALUE")));
        }
    }
}

/// The node a new sandbox of provider `kind` requiring `require` goes to,
/// or why there is none: the metric's reason (`labels`, `provider`,
/// `not_ready`, `full`) and the message.
pub(super) fn choose(
    nodes: &[NodeView],
    kind: ProviderKind,
    require: &BTreeMap<String, String>,
) -> Result<String, (&'static str, String)> {
    let wanted = if require.is_empty() {
        "nodes".to_string()
    } else {
        format!(
            "nodes with {}",
            require.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
        )
    };
    let labelled: Vec<&NodeView> =
        nodes.iter().filter(|n| require.iter().all(|(k, v)| n.labels.get(k) == Some(v))).collect();
    if labelled.is_empty() {
        let missing = require.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        return Err(("labels", format!("no node has {missing}")));
    }
    let offering: Vec<&NodeView> =
        labelled.into_iter().filter(|n| n.providers.iter().any(|p| p.provider == kind.as_str())).collect();
    if offering.is_empty() {
        return Err(("provider", format!("no {wanted} offers the {kind} provider")));
    }
    let ready: Vec<&NodeView> = offering.iter().copied().filter(|n| n.state == NodeState::Ready).collect();
    if ready.is_empty() {
        let states: Vec<String> =
            offering.iter().map(|n| format!("{} is {}", n.record.node.name, n.state.as_str())).collect();
        return Err((
            "not_ready",
            format!("none of the {} {wanted} is ready ({})", offering.len(), states.join(", ")),
        ));
    }
    let used = |n: &NodeView| n.placed + n.pending;
    let free: Vec<&NodeView> =
        ready.iter().copied().filter(|n| used(n) < n.record.node.sandbox_slots).collect();
    let Some(best) = free.into_iter().max_by(|a, b| {
        unreserved(a)
            .cmp(&unreserved(b))
            .then(a.record.free_memory_bytes.cmp(&b.record.free_memory_bytes))
            .then(used(b).cmp(&used(a)))
            .then(b.record.node.name.cmp(&a.record.node.name))
    }) else {
        return Err(("full", format!("all {} ready {wanted} are full", ready.len())));
    };
    Ok(best.record.node.name.clone())
}

/// A node's memory not yet reserved: its memory less one slot's share for
/// each sandbox on it or being made there.
fn unreserved(n: &NodeView) -> u128 {
    let slots = u128::from(n.record.node.sandbox_slots.max(1));
    let free_slots = slots.saturating_sub(u128::from(n.placed + n.pending));
    u128::from(n.record.node.memory_bytes) * free_slots / slots
}

#[cfg(test)]
mod tests {
    use shared::proto::node::v1::ProviderCapabilities;

    use super::*;
    use crate::store::{NewNode, NodeRecord, Timestamp};

    fn node(
        name: &str,
        labels: &[(&str, &str)],
        slots: u32,
        placed: u32,
        free: u64,
        state: NodeState,
    ) -> NodeView {
        NodeView {
            record: NodeRecord {
                node: NewNode {
                    name: name.into(),
                    address: String::new(),
                    labels: String::new(),
                    providers: String::new(),
                    memory_bytes: 0,
                    cpus: 1,
                    sandbox_slots: slots,
                    version: String::new(),
                },
                free_memory_bytes: free,
                sandboxes: placed,
                draining: state == NodeState::Draining,
                removed: false,
                registered_at: Timestamp::from_millis(0),
                last_heartbeat: Timestamp::from_millis(0),
            },
            state,
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            providers: vec![ProviderCapabilities { provider: "local".into(), ..Default::default() }],
            placed,
            pending: 0,
        }
    }

    /// A ready node of `memory` bytes and `slots` slots reporting `free`.
    fn sized(name: &str, memory: u64, slots: u32, free: u64) -> NodeView {
        let mut n = node(name, &[], slots, 0, free, NodeState::Ready);
        n.record.node.memory_bytes = memory;
        n
    }

    /// Place `count` sandboxes one after another, each pending on its node
    /// when the next is placed (a burst: none recorded yet).
    fn burst(nodes: &mut [NodeView], count: usize) -> Vec<String> {
        (0..count)
            .map(|_| {
                let chosen = choose(nodes, local(), &req(&[])).unwrap();
                nodes.iter_mut().find(|n| n.record.node.name == chosen).unwrap().pending += 1;
                chosen
            })
            .collect()
    }

    #[test]
    fn a_burst_spreads_over_like_nodes_whatever_megabytes_their_heartbeats_differ_by() {
        const GIB: u64 = 1 << 30;
        const MIB: u64 = 1 << 20;
        // Three like nodes on one host: their heartbeats report a few MiB
        // apart, which must not send a whole burst to the first.
        let mut nodes = [
            sized("a", 24 * GIB, 10, 20 * GIB + 5 * MIB),
            sized("b", 24 * GIB, 10, 20 * GIB),
            sized("c", 24 * GIB, 10, 20 * GIB + MIB),
        ];
        assert_eq!(burst(&mut nodes, 6), ["a", "c", "b", "a", "c", "b"]);
        // What is recorded counts as what is pending does.
        nodes[0].placed = 4;
        assert_eq!(burst(&mut nodes, 2), ["c", "b"]);
        // A bigger node takes sandboxes until it has no more memory
        // unreserved than the smaller one, then they alternate.
        let mut unlike = [sized("big", 32 * GIB, 8, 20 * GIB), sized("small", 16 * GIB, 8, 20 * GIB)];
        assert_eq!(burst(&mut unlike, 6), ["big", "big", "big", "big", "small", "big"]);
    }

    fn local() -> ProviderKind {
        ProviderKind::named("local").unwrap()
    }

    fn req(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn most_free_memory_first_among_ready_nodes_with_the_labels_and_a_slot() {
        let nodes = [
            node("a", &[("docker", "true")], 2, 0, 10, NodeState::Ready),
            node("b", &[("docker", "true")], 2, 0, 30, NodeState::Ready),
            node("c", &[("docker", "true")], 2, 2, 90, NodeState::Ready),
            node("d", &[("docker", "true")], 9, 0, 99, NodeState::Draining),
            node("e", &[], 9, 0, 99, NodeState::Ready),
        ];
        assert_eq!(choose(&nodes, local(), &req(&[("docker", "true")])).unwrap(), "b");
        assert_eq!(choose(&nodes, local(), &req(&[])).unwrap(), "e");
    }

    #[test]
    fn an_unsatisfiable_placement_says_why() {
        let nodes = [
            node("a", &[("docker", "true")], 1, 1, 10, NodeState::Ready),
            node("b", &[("docker", "true")], 1, 1, 10, NodeState::Ready),
            node("c", &[("docker", "true")], 1, 0, 10, NodeState::Unreachable),
        ];
        assert_eq!(
            choose(&nodes, local(), &req(&[("runtime", "gvisor")])).unwrap_err().1,
            "no node has runtime=gvisor"
        );
        assert_eq!(
            choose(&nodes, local(), &req(&[("docker", "true")])).unwrap_err().1,
            "all 2 ready nodes with docker=true are full"
        );
        let docker = ProviderKind::named("docker").unwrap();
        assert!(choose(&nodes, docker, &req(&[])).unwrap_err().1.contains("offers the docker provider"));
        let down = [node("c", &[], 1, 0, 10, NodeState::Unreachable)];
        assert_eq!(
            choose(&down, local(), &req(&[])).unwrap_err(),
            ("not_ready", "none of the 1 nodes is ready (c is unreachable)".to_string())
        );
    }
}
