//! [`RemoteProvider`]: a provider of a node, called over the node protocol.
//! Its sandboxes' addresses are `node:` addresses, reached through the
//! node's `ConnectAgent` ([`crate::tunnel`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use shared::proto::node::v1 as wire;
use shared::proto::node::v1::node_service_client::NodeServiceClient;
use shared::secret::Secret;
use shared::transport::Address;
use tonic::transport::Channel;

use super::convert;
use crate::provider::{
    Capabilities, Error, ListedSandbox, Provider, ProviderKind, ResourceUse, Result, Sandbox, SandboxSpec,
    Snapshot,
};

/// One provider (`kind`) of node `node`.
#[derive(Clone)]
pub struct RemoteProvider {
    node: String,
    kind: ProviderKind,
    capabilities: Capabilities,
    client: NodeServiceClient<Channel>,
}

impl std::fmt::Debug for RemoteProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteProvider").field("node", &self.node).field("kind", &self.kind).finish()
    }
}

impl RemoteProvider {
    pub fn new(node: &str, kind: ProviderKind, capabilities: Capabilities, channel: Channel) -> Self {
        Self { node: node.to_string(), kind, capabilities, client: NodeServiceClient::new(channel) }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    fn reference(&self, id: &str) -> wire::SandboxRef {
        wire::SandboxRef { provider: self.kind.as_str().to_string(), sandbox_id: id.to_string() }
    }

    fn failed(&self) -> impl Fn(tonic::Status) -> Error + '_ {
        move |status| convert::error_from_status(&self.node, self.kind, &status)
    }

    /// A sandbox as the node described it, its agent reached through the node.
    fn sandbox(&self, s: Option<wire::Sandbox>) -> Result<Sandbox> {
        let s = s.ok_or_else(|| Error::Internal(format!("node {} answered without a sandbox", self.node)))?;
        Ok(Sandbox {
            address: Address::Node {
                node: self.node.clone(),
                provider: self.kind.as_str().to_string(),
                sandbox: s.sandbox_id.clone(),
            },
            provider_id: s.sandbox_id,
            token: Secret::new(s.agent_token),
            workspace: PathBuf::from(s.workspace),
            runtime: s.runtime,
        })
    }
}

#[async_trait]
impl Provider for RemoteProvider {
    fn kind(&self) -> ProviderKind {
        self.kind
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn supports(&self, spec: &SandboxSpec) -> Result<()> {
        let request = wire::SupportsRequest {
            provider: self.kind.as_str().into(),
            spec: Some(convert::spec_to_wire(spec)),
        };
        self.client.clone().supports(request).await.map_err(self.failed())?;
        Ok(())
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox> {
        let request = wire::CreateRequest {
            provider: self.kind.as_str().into(),
            spec: Some(convert::spec_to_wire(spec)),
        };
        let reply = self.client.clone().create(request).await.map_err(self.failed())?.into_inner();
        self.sandbox(reply.sandbox)
    }

    async fn resume(&self, provider_id: &str) -> Result<Option<Sandbox>> {
        let reply = self
            .client
            .clone()
            .resume(self.reference(provider_id))
            .await
            .map_err(self.failed())?
            .into_inner();
        if !reply.found {
            return Ok(None);
        }
        self.sandbox(reply.sandbox).map(Some)
    }

    async fn destroy(&self, provider_id: &str) -> Result<()> {
        self.client.clone().destroy(self.reference(provider_id)).await.map_err(self.failed())?;
        Ok(())
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ListedSandbox>> {
        let request = wire::ListRequest {
            provider: self.kind.as_str().into(),
            labels: labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        let reply = self.client.clone().list(request).await.map_err(self.failed())?.into_inner();
        Ok(reply.sandboxes.into_iter().map(convert::listed_from_wire).collect())
    }

    async fn stop(&self, provider_id: &str) -> Result<()> {
        self.client.clone().stop(self.reference(provider_id)).await.map_err(self.failed())?;
        Ok(())
    }

    async fn usage(&self, provider_id: &str) -> Result<Option<ResourceUse>> {
        let reply =
            self.client.clone().usage(self.reference(provider_id)).await.map_err(self.failed())?.into_inner();
        Ok(convert::usage_from_wire(reply))
    }

    async fn snapshot(&self, provider_id: &str) -> Result<Snapshot> {
        let reply = self
            .client
            .clone()
            .snapshot(self.reference(provider_id))
            .await
            .map_err(self.failed())?
            .into_inner();
        Ok(Snapshot { id: reply.snapshot_id })
    }

    async fn changed_paths(&self, provider_id: &str) -> Result<Option<Vec<String>>> {
        let reply = self
            .client
            .clone()
            .changed_paths(self.reference(provider_id))
            .await
            .map_err(self.failed())?
            .into_inner();
        Ok(reply.known.then_some(reply.paths))
    }

    async fn restore(&self, snapshot: &Snapshot, spec: &SandboxSpec) -> Result<Sandbox> {
        let request = wire::RestoreRequest {
            provider: self.kind.as_str().into(),
            snapshot_id: snapshot.id.clone(),
            spec: Some(convert::spec_to_wire(spec)),
        };
        let reply = self.client.clone().restore(request).await.map_err(self.failed())?.into_inner();
        self.sandbox(reply.sandbox)
    }

    async fn delete_snapshot(&self, snapshot: &Snapshot) -> Result<()> {
        let request =
            wire::SnapshotRef { provider: self.kind.as_str().into(), snapshot_id: snapshot.id.clone() };
        self.client.clone().delete_snapshot(request).await.map_err(self.failed())?;
        Ok(())
    }

    async fn fork(&self, provider_id: &str, spec: &SandboxSpec) -> Result<Sandbox> {
        let request = wire::ForkRequest {
            provider: self.kind.as_str().into(),
            source_sandbox_id: provider_id.to_string(),
            spec: Some(convert::spec_to_wire(spec)),
        };
        let reply = self.client.clone().fork(request).await.map_err(self.failed())?.into_inner();
        self.sandbox(reply.sandbox)
    }
}
