//! The provider vocabulary on the node protocol's wire (`sandhold.node.v1`)
//! and back: specs, sandboxes, capabilities, errors. Both ends (the remote
//! provider and the node's service) convert here, so they agree by
//! construction.

use std::collections::BTreeMap;

use shared::error::{Error as WireError, ErrorCode};
use shared::proto::node::v1 as wire;

use crate::config::Runtime;
use crate::provider::{
    Capabilities, DockerOptions, Error, ListedSandbox, MountSpec, ProviderKind, ResourceUse, SandboxSpec,
};
use crate::store::Timestamp;

pub fn spec_to_wire(spec: &SandboxSpec) -> wire::SandboxSpec {
    let d = &spec.docker;
    wire::SandboxSpec {
        key: spec.key.clone(),
        tenant: spec.tenant.clone(),
        definition_id: spec.definition_id.clone(),
        env: spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        container: Some(wire::ContainerOptions {
            image: d.image.clone(),
            user: d.user.clone(),
            workdir: d.workdir.clone(),
            memory_bytes: d.memory_bytes,
            cpus: d.cpus,
            pids_limit: d.pids_limit,
            read_only_root: d.read_only_root,
            network: d.network.clone(),
            mounts: d
                .mounts
                .iter()
                .map(|m| wire::Mount {
                    source: m.source.clone(),
                    target: m.target.clone(),
                    read_only: m.read_only,
                })
                .collect(),
            runtime: d.runtime.map(|r| r.as_str().to_string()).unwrap_or_default(),
        }),
    }
}

pub fn spec_from_wire(spec: wire::SandboxSpec) -> Result<SandboxSpec, Error> {
    let c = spec.container.unwrap_or_default();
    let runtime = match c.runtime.as_str() {
        "" => None,
        name => Some(
            Runtime::named(name)
                .ok_or_else(|| Error::Refused(format!("unknown container runtime {name:?}")))?,
        ),
    };
    Ok(SandboxSpec {
        key: spec.key,
        tenant: spec.tenant,
        definition_id: spec.definition_id,
        env: spec.env.into_iter().collect(),
        docker: DockerOptions {
            image: c.image,
            user: c.user,
            workdir: c.workdir,
            memory_bytes: c.memory_bytes,
            cpus: c.cpus,
            pids_limit: c.pids_limit,
            read_only_root: c.read_only_root,
            network: c.network,
            mounts: c
                .mounts
                .into_iter()
                .map(|m| MountSpec { source: m.source, target: m.target, read_only: m.read_only })
                .collect(),
            runtime,
        },
    })
}

pub fn capabilities_to_wire(kind: ProviderKind, c: Capabilities) -> wire::ProviderCapabilities {
    crate::provider::with_capability_flags!(
        wire::ProviderCapabilities,
        c,
        provider: kind.as_str().to_string(),
        isolated: kind.kind().isolated(),
    )
}

pub fn capabilities_from_wire(c: &wire::ProviderCapabilities) -> Capabilities {
    crate::provider::with_capability_flags!(Capabilities, c)
}

pub fn listed_to_wire(l: ListedSandbox) -> wire::ListedSandbox {
    wire::ListedSandbox {
        sandbox_id: l.provider_id,
        labels: l.labels.into_iter().collect(),
        running: l.running,
        created_at_ms: l.created_at.map(|t| t.as_millis()).unwrap_or_default(),
        own: l.own,
    }
}

pub fn listed_from_wire(l: wire::ListedSandbox) -> ListedSandbox {
    ListedSandbox {
        provider_id: l.sandbox_id,
        labels: l.labels.into_iter().collect::<BTreeMap<_, _>>(),
        running: l.running,
        created_at: (l.created_at_ms > 0).then(|| Timestamp::from_millis(l.created_at_ms)),
        own: l.own,
    }
}

pub fn usage_to_wire(u: Option<ResourceUse>) -> wire::UsageResponse {
    match u {
        None => wire::UsageResponse::default(),
        Some(u) => wire::UsageResponse {
            measured: true,
            cpu_time_ms: u.cpu_time.map(|t| t.as_millis() as u64),
            memory_bytes: u.memory_bytes,
            memory_limit_bytes: u.memory_limit_bytes,
        },
    }
}

pub fn usage_from_wire(u: wire::UsageResponse) -> Option<ResourceUse> {
    u.measured.then(|| ResourceUse {
        cpu_time: u.cpu_time_ms.map(std::time::Duration::from_millis),
        memory_bytes: u.memory_bytes,
        memory_limit_bytes: u.memory_limit_bytes,
    })
}

/// What a node answered, as a provider error: an operation its provider
/// lacks stays [`Error::Unsupported`]; the rest keep their code and message.
pub fn error_from_status(node: &str, kind: ProviderKind, status: &tonic::Status) -> Error {
    let wire = WireError::from_status(status);
    if wire.code == ErrorCode::Unsupported {
        let capability = wire.metadata.get("capability").cloned().unwrap_or_else(|| "unknown".into());
        return Error::Unsupported { kind, capability };
    }
    let mut wire = wire;
    wire.message = format!("node {node}: {}", wire.message);
    Error::Node(wire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_survives_the_wire() {
        let spec = SandboxSpec {
            key: "k".into(),
            tenant: "t".into(),
            definition_id: "d".into(),
            env: BTreeMap::from([("A".into(), "1".into())]),
            docker: DockerOptions {
                image: Some("busybox".into()),
                memory_bytes: Some(1 << 28),
                cpus: Some(1.5),
                network: None,
                mounts: vec![MountSpec { source: "/srv".into(), target: "/m".into(), read_only: true }],
                runtime: Some(Runtime::Gvisor),
                ..Default::default()
            },
        };
        assert_eq!(spec_from_wire(spec_to_wire(&spec)).unwrap(), spec);
        let mut bad = spec_to_wire(&spec);
        bad.container.as_mut().unwrap().runtime = "kata".into();
        assert!(spec_from_wire(bad).unwrap_err().to_string().contains("kata"));
    }
}
