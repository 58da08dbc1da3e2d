//! Live network rules of a running sandbox (`UpdateNetworkPolicy`): host
//! patterns allowed and denied on top of its definition's rules, kept on
//! its instance record, so every replica's proxy reads them at each new
//! connection ([`StoredLiveRules`]) and a takeover finds them.
//!
//! The bounds: a change may deny any host (narrowing is always allowed);
//! it may allow a host only within the operator's egress hosts (as a
//! definition's `allow_hosts`) and only where no host-wide deny rule of
//! the definition covers it (the definition's deny wins over any allow,
//! so such an allow could never take effect). Its `ask` rules still ask:
//! ask wins over allow.

use std::sync::Arc;

use shared::proto::v1 as api;

use super::{Error, Sandboxes};
use crate::egress::{HostPattern, LiveHosts, LiveRules};
use crate::provision::InvalidField;
use crate::store::{InstanceStore, LIVE_HISTORY, LiveChange, LiveNetwork, NetworkChange, Tenant, Timestamp};

/// Most host patterns on each live list.
pub const MAX_LIVE_HOSTS: usize = 256;
/// Tries of a change that lost its compare-and-set to another change.
const TRIES: usize = 5;

impl Sandboxes {
    /// Change the tenant's sandbox's live network rules within the
    /// definition's and the operator's bounds (see the module); with
    /// nothing to change, only read them.
    pub async fn update_network(
        &self,
        tenant: &Tenant,
        req: api::UpdateNetworkPolicyRequest,
    ) -> Result<api::LiveNetworkPolicy, Error> {
        let key = InvalidField::required("sandbox_id", &req.sandbox_id)?;
        let instance = self.lifecycle.instance(&self.stores, tenant, key).await?;
        let stored = self.stores.definitions.get(tenant, &instance.definition_id).await;
        let definition = match stored {
            Ok(stored) => super::definition::from_stored(&stored.body)?,
            Err(crate::store::Error::NotFound(_)) => api::SandboxDefinition::default(),
            Err(e) => return Err(e.into()),
        };
        let change =
            NetworkChange { allow_hosts: req.allow_hosts, deny_hosts: req.deny_hosts, reset: req.reset };
        if change == NetworkChange::default() {
            return Ok(describe(&instance.network, &definition));
        }
        if !crate::egress::proxied(&definition) {
            return Err(Error::NoProxy(key.to_string()));
        }
        self.check_change(&change, &definition)?;
        let mut network = instance.network;
        for _ in 0..TRIES {
            let next = apply(&network, &change, tenant)?;
            match self.stores.instances.set_network(key, network.version, &next).await? {
                Some(changed) => {
                    tracing::info!(
                        sandbox_key = %key, tenant = %tenant.as_str(), version = changed.network.version,
                        "live network rules changed"
                    );
                    return Ok(describe(&changed.network, &definition));
                }
                None => network = self.lifecycle.instance(&self.stores, tenant, key).await?.network,
            }
        }
        Err(Error::Rpc(tonic::Status::aborted(format!(
            "{key}: its network rules changed under this change {TRIES} times; retry"
        ))))
    }

    /// Refuse a malformed pattern (INVALID_ARGUMENT) and an allow outside
    /// the bounds (PERMISSION_DENIED).
    fn check_change(&self, change: &NetworkChange, definition: &api::SandboxDefinition) -> Result<(), Error> {
        let operator: Vec<HostPattern> = self
            .lifecycle
            .policy
            .settings()
            .egress_hosts
            .iter()
            .filter_map(|p| HostPattern::parse(p).ok())
            .collect();
        let network = definition.network.clone().unwrap_or_default();
        for (field, list) in [("allow_hosts", &change.allow_hosts), ("deny_hosts", &change.deny_hosts)] {
            if list.len() > MAX_LIVE_HOSTS {
                return Err(InvalidField::new(field, format!("at most {MAX_LIVE_HOSTS} hosts")).into());
            }
            for (i, text) in list.iter().enumerate() {
                let pattern = HostPattern::parse(text)
                    .map_err(|why| InvalidField::new(format!("{field}[{i}]"), why))?;
                if field == "deny_hosts" {
                    if change.allow_hosts.contains(text) {
                        return Err(InvalidField::new(
                            format!("{field}[{i}]"),
                            format!("{text:?} is also allowed"),
                        )
                        .into());
                    }
                    continue;
                }
                if !pattern.within(&operator) {
                    return Err(Error::OutsideBounds(format!(
                        "allow_hosts[{i}]: {text:?} is outside the hosts the operator allows (egress_hosts)"
                    )));
                }
                let host_wide = network
                    .deny
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.methods.is_empty() && r.path.is_empty());
                for (j, rule) in host_wide {
                    if HostPattern::parse(&rule.host).is_ok_and(|deny| pattern.within(&[deny])) {
                        return Err(Error::OutsideBounds(format!(
                            "allow_hosts[{i}]: {text:?} is denied by the sandbox's definition (network.deny[{j}] {:?}); \
                             a live change cannot allow it",
                            rule.host
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// `network` with `change` made by `tenant`: each allowed host off the deny
/// list and onto the allow list, each denied one the other way round. An
/// allow that a remaining live deny pattern covers is refused (the deny
/// would win).
fn apply(network: &LiveNetwork, change: &NetworkChange, tenant: &Tenant) -> Result<LiveNetwork, Error> {
    let (mut allow, mut deny) = if change.reset {
        (Vec::new(), Vec::new())
    } else {
        (network.allow_hosts.clone(), network.deny_hosts.clone())
    };
    for host in &change.allow_hosts {
        deny.retain(|h| h != host);
        if !allow.contains(host) {
            allow.push(host.clone());
        }
    }
    for host in &change.deny_hosts {
        allow.retain(|h| h != host);
        if !deny.contains(host) {
            deny.push(host.clone());
        }
    }
    for (i, host) in change.allow_hosts.iter().enumerate() {
        let Ok(pattern) = HostPattern::parse(host) else { continue };
        if let Some(d) = deny.iter().find(|d| HostPattern::parse(d).is_ok_and(|d| pattern.within(&[d]))) {
            return Err(InvalidField::new(
                format!("allow_hosts[{i}]"),
                format!("the live deny {d:?} covers {host:?} and would win; deny_hosts less widely, or reset first"),
            )
            .into());
        }
    }
    for (field, list) in [("allow_hosts", &allow), ("deny_hosts", &deny)] {
        if list.len() > MAX_LIVE_HOSTS {
            return Err(
                InvalidField::new(field, format!("the live list would pass {MAX_LIVE_HOSTS} hosts")).into()
            );
        }
    }
    let (changed_by, changed_at_ms) = (tenant.as_str().to_string(), Timestamp::now().as_millis());
    let mut history = network.history.clone();
    history.push(LiveChange {
        version: network.version + 1,
        changed_by: changed_by.clone(),
        changed_at_ms,
        change: change.clone(),
    });
    let keep = history.len().saturating_sub(LIVE_HISTORY);
    history.drain(..keep);
    Ok(LiveNetwork {
        version: network.version,
        allow_hosts: allow,
        deny_hosts: deny,
        changed_by,
        changed_at_ms,
        history,
    })
}

/// The live rules as the API shows them, with the definition's beside them.
pub(crate) fn describe(network: &LiveNetwork, definition: &api::SandboxDefinition) -> api::LiveNetworkPolicy {
    let own = definition.network.clone().unwrap_or_default();
    let rules = |list: &[api::NetworkRule]| -> Vec<String> {
        list.iter()
            .map(|r| {
                let mut text = r.host.clone();
                if !r.methods.is_empty() {
                    text = format!("{text} {}", r.methods.join(","));
                }
                if !r.path.is_empty() {
                    text = format!("{text} {}", r.path);
                }
                text
            })
            .collect()
    };
    let mut allow = own.allow_hosts.clone();
    allow.extend(own.credentials.iter().flat_map(|c| c.hosts.iter().cloned()));
    allow.extend(rules(&own.allow));
    api::LiveNetworkPolicy {
        allow_hosts: network.allow_hosts.clone(),
        deny_hosts: network.deny_hosts.clone(),
        version: network.version,
        changed_by: network.changed_by.clone(),
        changed_at_ms: network.changed_at_ms,
        definition_allow: allow,
        definition_ask: rules(&own.ask),
        definition_deny: rules(&own.deny),
    }
}

/// A sandbox's live rules as its instance record holds them, read at each
/// connection. A sandbox whose record is gone has none. An allow outside
/// the operator's egress hosts is dropped here too (a record written under
/// a wider operator policy, or by hand, allows nothing more).
pub(crate) struct StoredLiveRules {
    pub instances: Arc<dyn InstanceStore>,
    pub key: String,
    pub operator: Vec<HostPattern>,
}

#[async_trait::async_trait]
impl LiveRules for StoredLiveRules {
    async fn now(&self) -> Result<LiveHosts, String> {
        match self.instances.get(&self.key).await {
            Ok(i) => {
                let mut allow = i.network.allow_hosts;
                allow.retain(|h| HostPattern::parse(h).is_ok_and(|p| p.within(&self.operator)));
                Ok(LiveHosts { allow, deny: i.network.deny_hosts })
            }
            Err(crate::store::Error::NotFound(_)) => Ok(LiveHosts::default()),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(allow: &[&str], deny: &[&str]) -> NetworkChange {
        NetworkChange {
            allow_hosts: allow.iter().map(|h| h.to_string()).collect(),
            deny_hosts: deny.iter().map(|h| h.to_string()).collect(),
            reset: false,
        }
    }

    /// An allow takes a host off the deny list and a deny the other way;
    /// an allow under a wider live deny is refused; reset starts over.
    #[test]
    fn changes_move_hosts_between_the_lists() {
        let t = Tenant::new("t");
        let n = apply(&LiveNetwork::default(), &change(&["a.example", "b.example"], &[]), &t).unwrap();
        assert_eq!(
            (n.allow_hosts.as_slice(), n.deny_hosts.len()),
            (&["a.example".to_string(), "b.example".into()][..], 0)
        );
        let n = apply(&n, &change(&[], &["a.example"]), &t).unwrap();
        assert_eq!(
            (n.allow_hosts.clone(), n.deny_hosts.clone()),
            (vec!["b.example".to_string()], vec!["a.example".to_string()])
        );
        let n =
            apply(&LiveNetwork { deny_hosts: vec!["*.example".into()], ..n }, &change(&[], &[]), &t).unwrap();
        let refused = apply(&n, &change(&["c.example"], &[]), &t).unwrap_err();
        assert!(refused.to_string().contains("*.example"), "{refused}");
        let reset = apply(&n, &NetworkChange { reset: true, ..change(&["c.example"], &[]) }, &t).unwrap();
        assert_eq!((reset.allow_hosts, reset.deny_hosts.len()), (vec!["c.example".to_string()], 0));
        assert_eq!(reset.changed_by, "t");
        let versions: Vec<u64> = reset.history.iter().map(|c| c.version).collect();
        assert_eq!(versions, [1, 1, 1, 1], "each made from version 0 (the store counts up)");
        let many = (0..40).fold(LiveNetwork::default(), |n, i| {
            let next = apply(&n, &change(&[&format!("h{i}.example")], &[]), &t).unwrap();
            LiveNetwork { version: n.version + 1, ..next }
        });
        assert_eq!(many.history.len(), LIVE_HISTORY);
        assert_eq!(many.history.last().unwrap().version, 40);
    }
}
