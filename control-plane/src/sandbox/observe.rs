//! What the providers say of a tenant's sandboxes: running, stopped or
//! missing, and what a running one uses. Whatever a provider cannot tell
//! (it is off, it failed, it took too long) stays unknown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use shared::proto::v1 as api;
use tracing::debug;

use super::Lifecycle;
use crate::provider::{Provider, ProviderKind, ResourceUse};
use crate::store::{Instance, Timestamp};

/// How long one provider call of an observation may take.
const PROVIDER_CALL: Duration = Duration::from_secs(3);

/// A sandbox as its provider sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Observed {
    pub state: api::SandboxState,
    pub usage: Option<api::ResourceUsage>,
}

impl Lifecycle {
    /// Each instance's state (one listing per provider) and, for those
    /// running, their resource use (one call each, concurrently).
    pub(crate) async fn observe(&self, instances: &[Instance]) -> Vec<Observed> {
        // One listing per provider of each node (`""`: this server's own).
        let mut providers: HashMap<(&str, &str), Option<Arc<dyn Provider>>> = HashMap::new();
        for i in instances {
            let at = (i.node.as_str(), i.provider.as_str());
            if providers.contains_key(&at) {
                continue;
            }
            let provider = match ProviderKind::named(&i.provider) {
                Some(kind) => self.provider_on(&i.node, kind).await.ok(),
                None => None,
            };
            providers.insert(at, provider);
        }
        let mut running: HashMap<(&str, &str), Option<HashMap<String, bool>>> = HashMap::new();
        for (at, provider) in &providers {
            let Some(provider) = provider else {
                running.insert(*at, None);
                continue;
            };
            let listed = match tokio::time::timeout(PROVIDER_CALL, provider.list(&Default::default())).await {
                Ok(Ok(listed)) => Some(listed.into_iter().map(|l| (l.provider_id, l.running)).collect()),
                Ok(Err(e)) => {
                    debug!(node = %at.0, provider = %at.1, error = %e, "listing sandboxes for their state failed");
                    None
                }
                Err(_) => None,
            };
            running.insert(*at, listed);
        }
        let states: Vec<api::SandboxState> = instances
            .iter()
            .map(|i| match running.get(&(i.node.as_str(), i.provider.as_str())) {
                Some(Some(listed)) => match listed.get(&i.provider_sandbox_id) {
                    Some(true) => api::SandboxState::Running,
                    Some(false) => api::SandboxState::Stopped,
                    None => api::SandboxState::Missing,
                },
                _ => api::SandboxState::Unspecified,
            })
            .collect();
        let usages = join_all(instances.iter().zip(&states).map(|(i, state)| {
            let provider = providers.get(&(i.node.as_str(), i.provider.as_str())).cloned().flatten();
            async move {
                if *state != api::SandboxState::Running {
                    return None;
                }
                match tokio::time::timeout(PROVIDER_CALL, provider?.usage(&i.provider_sandbox_id)).await {
                    Ok(Ok(used)) => used.map(usage_to_api),
                    Ok(Err(e)) => {
                        debug!(sandbox_key = %i.sandbox_key, error = %e, "measuring a sandbox failed");
                        None
                    }
                    Err(_) => None,
                }
            }
        }))
        .await;
        states.into_iter().zip(usages).map(|(state, usage)| Observed { state, usage }).collect()
    }
}

fn usage_to_api(used: ResourceUse) -> api::ResourceUsage {
    api::ResourceUsage {
        cpu_time_ms: used.cpu_time.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        memory_bytes: used.memory_bytes,
        memory_limit_bytes: used.memory_limit_bytes,
        measured_at_ms: Timestamp::now().as_millis(),
    }
}
