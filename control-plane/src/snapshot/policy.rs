//! What a definition asks of portable snapshots: whether they are on, and
//! what a capture keeps.

use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;

/// What a capture keeps, from the definition's `portable_snapshots`.
pub fn capture_policy(portable: Option<&api::PortableSnapshots>) -> agent::CapturePolicy {
    let p = portable.cloned().unwrap_or_default();
    agent::CapturePolicy { include: p.include, exclude: p.exclude, redact: p.redact }
}

/// Whether the definition asks for a checkpoint after each run and a
/// restore into each new sandbox of a thread.
pub fn enabled(definition: &api::SandboxDefinition) -> bool {
    definition.lifecycle.as_ref().and_then(|l| l.portable_snapshots.as_ref()).is_some_and(|p| p.enabled)
}

pub(super) fn portable(definition: &api::SandboxDefinition) -> Option<&api::PortableSnapshots> {
    definition.lifecycle.as_ref().and_then(|l| l.portable_snapshots.as_ref())
}
