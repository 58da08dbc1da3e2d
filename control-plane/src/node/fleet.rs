//! [`Fleet`]: the nodes this control plane knows, their registration and
//! heartbeats, their derived state, and the mutual-TLS channels to them
//! (one per node, shared by its remote providers and every agent tunnel).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::proto::node::v1 as wire;
use shared::proto::node::v1::node_service_client::NodeServiceClient;
use shared::secret::{Secret, constant_time_eq};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::{info, warn};

use super::remote::RemoteProvider;
use super::{Error, NodeState};
use crate::provider::{Capabilities, Provider, ProviderKind};
use crate::store::{NewNode, NodeRecord, Stores, Timestamp};

/// How often nodes heartbeat (told to them at registration).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// Heartbeats a node may miss before it is unreachable (gets no new sandbox).
const MISSED_BEATS: u32 = 3;
/// Bound on dialling a node and asking its capabilities at registration.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// The control plane's side of the node protocol's mutual TLS: its client
/// identity and the CA a node's certificate must come from (PEM).
#[derive(Clone)]
pub struct NodeTls {
    pub cert: Vec<u8>,
    pub key: Secret,
    pub ca: Vec<u8>,
}

impl NodeTls {
    /// Read the three files.
    pub fn load(cert: &std::path::Path, key: &std::path::Path, ca: &std::path::Path) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let read = |p: &std::path::Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let key = String::from_utf8(read(key)?).context("the node TLS key is not PEM text")?;
        Ok(Self { cert: read(cert)?, key: Secret::new(key), ca: read(ca)? })
    }

    fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, self.key.expose().as_bytes()))
    }
}

/// What the fleet is configured with (`sandhold serve`'s node flags).
#[derive(Clone, Default)]
pub struct FleetOptions {
    /// The join token nodes must present; `None`: no node may join.
    pub join_token: Option<Secret>,
    pub tls: Option<NodeTls>,
    /// How long a node may be silent before its sandboxes are given up.
    pub grace: Duration,
}

/// A node as listed: its record, derived state and the sandboxes placed on it.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub record: NodeRecord,
    pub state: NodeState,
    pub labels: BTreeMap<String, String>,
    pub providers: Vec<wire::ProviderCapabilities>,
    /// Sandboxes the control plane placed there: its instances and its
    /// unclaimed warm sandboxes.
    pub placed: u32,
    /// Sandboxes this replica chose it for and is still making (not yet
    /// recorded): what keeps a burst of placements from all choosing the
    /// node that looked emptiest before the first of them was recorded.
    pub pending: u32,
}

/// The nodes of this control plane. Cheap to clone.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

struct Inner {
    stores: Stores,
    options: FleetOptions,
    /// Dialled nodes: the address dialled and the channel.
    channels: Mutex<HashMap<String, (String, Channel)>>,
    /// Sandboxes being made on each node by this replica ([`Reservation`]s).
    pending: Mutex<HashMap<String, u32>>,
    /// Held from listing the nodes to reserving the chosen one, so that two
    /// placements of this replica never both choose from the same count.
    placing: tokio::sync::Mutex<()>,
}

/// A new sandbox being made on a node: counted by [`Fleet::list`] as
/// [`NodeView::pending`] until dropped (once the sandbox is recorded, or
/// its making failed).
pub struct Reservation {
    inner: Arc<Inner>,
    node: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut pending = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = pending.get_mut(&self.node) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                pending.remove(&self.node);
            }
        }
    }
}

impl Fleet {
    pub fn new(stores: Stores, options: FleetOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                stores,
                options,
                channels: Mutex::default(),
                pending: Mutex::default(),
                placing: tokio::sync::Mutex::default(),
            }),
        }
    }

    /// Hold while listing the nodes, choosing one and reserving it.
    pub async fn placing(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.placing.lock().await
    }

    /// Count a new sandbox on `node` as pending until the reservation drops.
    pub fn reserve(&self, node: &str) -> Reservation {
        *self.inner.pending.lock().unwrap_or_else(|e| e.into_inner()).entry(node.to_string()).or_default() +=
            1;
        Reservation { inner: self.inner.clone(), node: node.to_string() }
    }

    /// How long a node may be silent before it is lost.
    pub fn grace(&self) -> Duration {
        self.inner.options.grace
    }

    /// Refuse a registry call without the join token.
    pub fn check_join_token(&self, presented: Option<&str>) -> Result<(), Error> {
        let Some(expected) = &self.inner.options.join_token else {
            return Err(Error::Closed(
                "this control plane accepts no nodes (start it with --node-join-token-file, --node-tls-cert, \
                 --node-tls-key and --node-tls-ca)",
            ));
        };
        match presented {
            Some(p) if constant_time_eq(p.as_bytes(), expected.expose().as_bytes()) => Ok(()),
            _ => Err(Error::JoinToken),
        }
    }

    /// A node joins (or joins again): dialled back with mutual TLS first.
    pub async fn register(
        &self,
        request: shared::proto::v1::RegisterNodeRequest,
    ) -> Result<shared::proto::v1::RegisterNodeResponse, Error> {
        check_name(&request.name)?;
        if self.inner.stores.nodes.get(&request.name).await?.is_some_and(|n| n.removed) {
            return Err(Error::Removed(request.name));
        }
        let channel = self.dial(&request.address)?;
        let answered = tokio::time::timeout(
            DIAL_TIMEOUT,
            NodeServiceClient::new(channel.clone()).capabilities(wire::CapabilitiesRequest {}),
        )
        .await
        .map_err(|_| {
            Error::Unreachable(format!("{} did not answer within {DIAL_TIMEOUT:?}", request.address))
        })?
        .map_err(|status| Error::Unreachable(format!("{}: {}", request.address, chain(&status))))?
        .into_inner();
        if answered.name != request.name {
            return Err(Error::Invalid(format!(
                "the node at {} calls itself {:?}, not {:?}",
                request.address, answered.name, request.name
            )));
        }
        let capacity = request.capacity.unwrap_or_default();
        let labels: BTreeMap<_, _> = request.labels.into_iter().collect();
        let providers: Vec<_> = answered.providers.iter().map(ProviderJson::from).collect();
        let record = self
            .inner
            .stores
            .nodes
            .register(NewNode {
                name: request.name.clone(),
                address: request.address.clone(),
                labels: serde_json::to_string(&labels).expect("labels serialize"),
                providers: serde_json::to_string(&providers).expect("providers serialize"),
                memory_bytes: capacity.memory_bytes,
                cpus: capacity.cpus,
                sandbox_slots: capacity.sandbox_slots,
                version: request.version,
            })
            .await?
            .ok_or_else(|| Error::Removed(request.name.clone()))?;
        self.keep(&record.node.name, &record.node.address, channel);
        info!(node = %record.node.name, address = %record.node.address, "node registered");
        Ok(shared::proto::v1::RegisterNodeResponse {
            heartbeat_interval_ms: HEARTBEAT_INTERVAL.as_millis() as u64,
        })
    }

    pub async fn heartbeat(
        &self,
        request: shared::proto::v1::HeartbeatRequest,
    ) -> Result<shared::proto::v1::HeartbeatResponse, Error> {
        let record = self
            .inner
            .stores
            .nodes
            .heartbeat(&request.name, request.free_memory_bytes, request.sandboxes)
            .await?
            .ok_or_else(|| Error::NotFound(request.name.clone()))?;
        Ok(shared::proto::v1::HeartbeatResponse { draining: record.draining })
    }

    /// Every node not removed, with its state and what is placed on it.
    pub async fn list(&self) -> Result<Vec<NodeView>, Error> {
        let records = self.inner.stores.nodes.list().await?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let placed: HashMap<String, u32> = self.inner.stores.nodes.placed().await?.into_iter().collect();
        let pending = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let now = Timestamp::now();
        Ok(records
            .into_iter()
            .map(|record| {
                let state = self.state_of(&record, now);
                let labels = serde_json::from_str(&record.node.labels).unwrap_or_default();
                let providers = providers_of(&record);
                let placed = placed.get(&record.node.name).copied().unwrap_or_default();
                let pending = pending.get(&record.node.name).copied().unwrap_or_default();
                NodeView { record, state, labels, providers, placed, pending }
            })
            .collect())
    }

    /// Whether any node is registered (then placement chooses among them).
    pub async fn any(&self) -> Result<bool, Error> {
        Ok(!self.inner.stores.nodes.list().await?.is_empty())
    }

    pub async fn drain(&self, name: &str) -> Result<NodeView, Error> {
        self.inner
            .stores
            .nodes
            .set_draining(name, true)
            .await?
            .ok_or_else(|| Error::NotFound(name.into()))?;
        info!(node = %name, "node draining");
        self.view(name).await
    }

    pub async fn remove(&self, name: &str) -> Result<(), Error> {
        if !self.inner.stores.nodes.remove(name).await? {
            return Err(Error::NotFound(name.into()));
        }
        self.inner.channels.lock().expect("node channels poisoned").remove(name);
        crate::tunnel::forget(name);
        warn!(node = %name, "node removed: its sandboxes are given up");
        Ok(())
    }

    /// The node `name` as listed.
    pub async fn view(&self, name: &str) -> Result<NodeView, Error> {
        self.list()
            .await?
            .into_iter()
            .find(|n| n.record.node.name == name)
            .ok_or_else(|| Error::NotFound(name.into()))
    }

    /// The state of a record now.
    pub fn state_of(&self, record: &NodeRecord, now: Timestamp) -> NodeState {
        let age = Duration::from_millis(
            u64::try_from(now.as_millis() - record.last_heartbeat.as_millis()).unwrap_or(0),
        );
        if age > self.inner.options.grace {
            NodeState::Lost
        } else if age > HEARTBEAT_INTERVAL * MISSED_BEATS {
            NodeState::Unreachable
        } else if record.draining {
            NodeState::Draining
        } else {
            NodeState::Ready
        }
    }

    /// The `kind` provider of node `name`. Fails for a node removed, lost,
    /// or not offering it.
    pub async fn provider(&self, name: &str, kind: ProviderKind) -> Result<Arc<dyn Provider>, Error> {
        let record = self.inner.stores.nodes.get(name).await?.ok_or_else(|| Error::NotFound(name.into()))?;
        if record.removed {
            return Err(Error::Removed(name.into()));
        }
        if self.state_of(&record, Timestamp::now()) == NodeState::Lost {
            return Err(Error::Lost(name.into()));
        }
        let capabilities = providers_of(&record)
            .iter()
            .find(|p| p.provider == kind.as_str())
            .map(super::convert::capabilities_from_wire)
            .ok_or_else(|| Error::NoProvider { node: name.into(), kind })?;
        let channel = self.channel(name, &record.node.address)?;
        Ok(Arc::new(RemoteProvider::new(name, kind, capabilities, channel)))
    }

    /// What the `kind` provider of node `name` can do, as it registered.
    pub async fn capabilities(&self, name: &str, kind: ProviderKind) -> Option<Capabilities> {
        let record = self.inner.stores.nodes.get(name).await.ok()??;
        providers_of(&record)
            .iter()
            .find(|p| p.provider == kind.as_str())
            .map(super::convert::capabilities_from_wire)
    }

    /// The channel to `name` at `address`, dialled once (lazily) and kept.
    fn channel(&self, name: &str, address: &str) -> Result<Channel, Error> {
        if let Some((dialled, channel)) =
            self.inner.channels.lock().expect("node channels poisoned").get(name)
            && dialled == address
        {
            return Ok(channel.clone());
        }
        let channel = self.dial(address)?;
        self.keep(name, address, channel.clone());
        Ok(channel)
    }

    fn keep(&self, name: &str, address: &str, channel: Channel) {
        crate::tunnel::register(name, channel.clone());
        self.inner
            .channels
            .lock()
            .expect("node channels poisoned")
            .insert(name.to_string(), (address.to_string(), channel));
    }

    /// A lazy mutual-TLS channel to a node's NodeService.
    fn dial(&self, address: &str) -> Result<Channel, Error> {
        let Some(tls) = &self.inner.options.tls else {
            return Err(Error::Closed(
                "this control plane has no identity towards nodes (--node-tls-cert, --node-tls-key, --node-tls-ca)",
            ));
        };
        if !address.starts_with("https://") {
            return Err(Error::Invalid(format!("node address {address:?} must be https://HOST:PORT")));
        }
        let endpoint = Endpoint::from_shared(address.to_string())
            .map_err(|e| Error::Invalid(format!("node address {address:?}: {e}")))?
            .tls_config(tls.client())
            .map_err(|e| Error::Invalid(format!("node TLS: {e}")))?;
        Ok(tune(endpoint).connect_lazy())
    }
}

/// Keepalive and windows of a node's one connection: it carries every agent
/// stream of its sandboxes.
pub fn tune(endpoint: Endpoint) -> Endpoint {
    endpoint
        .connect_timeout(DIAL_TIMEOUT)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .initial_stream_window_size(Some(1 << 20))
        .initial_connection_window_size(Some(16 << 20))
}

/// A node's providers as stored: the capabilities message as JSON.
#[derive(serde::Serialize, serde::Deserialize)]
struct ProviderJson {
    provider: String,
    capabilities: Capabilities,
    isolated: bool,
}

impl From<&wire::ProviderCapabilities> for ProviderJson {
    fn from(p: &wire::ProviderCapabilities) -> Self {
        Self {
            provider: p.provider.clone(),
            capabilities: super::convert::capabilities_from_wire(p),
            isolated: p.isolated,
        }
    }
}

fn providers_of(record: &NodeRecord) -> Vec<wire::ProviderCapabilities> {
    let stored: Vec<ProviderJson> = serde_json::from_str(&record.node.providers).unwrap_or_default();
    stored
        .into_iter()
        .filter_map(|p| {
            let kind = ProviderKind::named(&p.provider)?;
            let mut wire = super::convert::capabilities_to_wire(kind, p.capabilities);
            wire.isolated = p.isolated;
            Some(wire)
        })
        .collect()
}

/// A node name: [A-Za-z0-9._-], 1-63 characters.
fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!("node name {name:?}: [A-Za-z0-9._-], 1-63 characters")))
    }
}

/// A status and the causes under it (a TLS refusal is a few levels down).
fn chain(status: &tonic::Status) -> String {
    let mut out = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_short_and_plain() {
        assert!(check_name("node-1.a_b").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
