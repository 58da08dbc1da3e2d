//! The [`Provider`] trait every implementation fills in, which
//! implementation it is, and what it can do.
//!
//! Both providers advertise what they can do through [`Capabilities`];
//! calling an optional operation a provider lacks fails with
//! [`Error::Unsupported`] naming the capability (`UNIMPLEMENTED` on the
//! wire).

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Error, ListedSandbox, ProviderKind, ResourceUse, Sandbox, SandboxSpec, Snapshot};

/// Every provider result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a provider can do. The lifecycle and the run driver branch on these,
/// never on the provider's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Capabilities {
    /// Native [`Provider::snapshot`] and [`Provider::restore`].
    pub snapshots: bool,
    /// Native [`Provider::fork`].
    pub fork: bool,
    /// Processes outlive the call that started them.
    pub background_processes: bool,
    /// Started processes can be signalled and killed.
    pub killable_processes: bool,
    /// A spawned process's stdin can be written after start.
    pub writable_stdin: bool,
    /// The sandbox's files survive a restart of the agent and of the
    /// sandbox itself (until destroy).
    pub durable_filesystem: bool,
    /// The sandbox's network can be cut off or chosen (Docker: `none` by
    /// default, or a named network).
    pub network_policy: bool,
    /// `ConnectPort` reaches the sandbox's own loopback (a local sandbox
    /// has none of its own: it shares the host's).
    pub ports: bool,
    /// `OpenTerminal`: a pseudo-terminal in the sandbox.
    pub terminal: bool,
}

/// A struct literal of `$ty` with the nine [`Capabilities`] flags taken
/// from `$c` (anything with those fields: [`Capabilities`], the node
/// protocol's and the API's messages) and `$extra` fields after them: the
/// one place the flags are listed for a conversion.
macro_rules! with_capability_flags {
    ($ty:path, $c:expr $(, $($extra:tt)*)?) => {{
        let c = $c;
        $ty {
            snapshots: c.snapshots,
            fork: c.fork,
            background_processes: c.background_processes,
            killable_processes: c.killable_processes,
            writable_stdin: c.writable_stdin,
            durable_filesystem: c.durable_filesystem,
            network_policy: c.network_policy,
            ports: c.ports,
            terminal: c.terminal,
            $($($extra)*)?
        }
    }};
}
pub(crate) use with_capability_flags;

/// A place sandboxes live. Object-safe: held as `Arc<dyn Provider>`.
#[async_trait]
pub trait Provider: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> ProviderKind;

    fn capabilities(&self) -> Capabilities;

    /// Whether this provider, as its host is now, can make what `spec` asks
    /// for (Docker: the runtime is registered with the engine); checked at
    /// `PutDefinition` and again by every create.
    async fn supports(&self, _spec: &SandboxSpec) -> Result<()> {
        Ok(())
    }

    /// Create a sandbox and return once its agent answers. A failed create
    /// leaves nothing behind.
    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox>;

    /// The sandbox with this id, its agent answering (restarted when it had
    /// stopped), or `None` when the sandbox is gone.
    async fn resume(&self, provider_id: &str) -> Result<Option<Sandbox>>;

    /// Stop the sandbox and remove everything it had. Destroying a sandbox
    /// that is already gone succeeds.
    async fn destroy(&self, provider_id: &str) -> Result<()>;

    /// Sandboxes of this provider carrying all of `labels` (an empty map:
    /// every sandbox Sandhold manages here).
    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ListedSandbox>>;

    /// Stop the sandbox but keep it: [`Provider::resume`] starts it again.
    /// For idle sandboxes past their `keep_alive`.
    async fn stop(&self, provider_id: &str) -> Result<()> {
        let _ = provider_id;
        Err(unsupported(self.kind(), "stop"))
    }

    /// What the running sandbox uses now, as far as the provider can
    /// measure it; `None` when it is not running (or the provider measures
    /// nothing).
    async fn usage(&self, provider_id: &str) -> Result<Option<ResourceUse>> {
        let _ = provider_id;
        Ok(None)
    }

    /// Capture the sandbox's filesystem natively.
    async fn snapshot(&self, provider_id: &str) -> Result<Snapshot> {
        let _ = provider_id;
        Err(unsupported(self.kind(), "snapshots"))
    }

    /// The paths (absolute, in the sandbox's file system) a native snapshot
    /// would hold that its image does not: what is scanned for secret
    /// values before one is taken. `None`: the provider cannot tell.
    async fn changed_paths(&self, provider_id: &str) -> Result<Option<Vec<String>>> {
        let _ = provider_id;
        Ok(None)
    }

    /// A new sandbox for `spec`, started from `snapshot`.
    async fn restore(&self, snapshot: &Snapshot, spec: &SandboxSpec) -> Result<Sandbox> {
        let _ = (snapshot, spec);
        Err(unsupported(self.kind(), "snapshots"))
    }

    /// Delete a snapshot. Deleting one that is gone succeeds.
    async fn delete_snapshot(&self, snapshot: &Snapshot) -> Result<()> {
        let _ = snapshot;
        Err(unsupported(self.kind(), "snapshots"))
    }

    /// A new, independent sandbox for `spec` holding a copy of the files of
    /// the sandbox `provider_id` as they are now.
    async fn fork(&self, provider_id: &str, spec: &SandboxSpec) -> Result<Sandbox> {
        let _ = (provider_id, spec);
        Err(unsupported(self.kind(), "fork"))
    }
}

/// The error of an optional operation a provider lacks.
fn unsupported(kind: ProviderKind, capability: &str) -> Error {
    Error::Unsupported { kind, capability: capability.to_string() }
}

#[cfg(test)]
mod tests {
    use shared::error::{Error as WireError, ErrorCode};

    use super::*;

    #[derive(Debug)]
    struct Minimal;

    #[async_trait]
    impl Provider for Minimal {
        fn kind(&self) -> ProviderKind {
            ProviderKind::named("local").expect("local is registered")
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }
        async fn create(&self, _spec: &SandboxSpec) -> Result<Sandbox> {
            Err(Error::Internal("not in this test".into()))
        }
        async fn resume(&self, _id: &str) -> Result<Option<Sandbox>> {
            Ok(None)
        }
        async fn destroy(&self, _id: &str) -> Result<()> {
            Ok(())
        }
        async fn list(&self, _labels: &BTreeMap<String, String>) -> Result<Vec<ListedSandbox>> {
            Ok(Vec::new())
        }
    }

    #[tokio::test]
    async fn missing_optional_operations_are_unimplemented_and_name_the_capability() {
        let provider: std::sync::Arc<dyn Provider> = std::sync::Arc::new(Minimal);
        let snap = Snapshot { id: "x".into() };
        for (err, capability) in [
            (provider.snapshot("id").await.unwrap_err(), "snapshots"),
            (provider.restore(&snap, &SandboxSpec::default()).await.unwrap_err(), "snapshots"),
            (provider.delete_snapshot(&snap).await.unwrap_err(), "snapshots"),
            (provider.fork("id", &SandboxSpec::default()).await.unwrap_err(), "fork"),
        ] {
            let err = WireError::from(err);
            assert_eq!(err.code, ErrorCode::Unsupported);
            assert!(err.message.contains(capability), "{}", err.message);
            assert_eq!(err.metadata.get("capability").map(String::as_str), Some(capability));
            assert_eq!(tonic::Status::from(err).code(), tonic::Code::Unimplemented);
        }
    }
}
