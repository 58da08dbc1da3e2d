//! Providers: where sandboxes live and how they come and go.
//!
//! A provider creates a sandbox with the `sandhold-agent` running inside and
//! answering on a Unix socket the control plane can reach; everything that
//! happens *in* a sandbox then goes through the agent (see
//! [`crate::agent::AgentClient`]). Two implementations:
//!
//! - [`local`]: a directory on this host and the agent as a child process.
//!   No isolation at all: development only.
//! - [`docker`]: a container of any image; the static agent is copied in
//!   before start and is the container's entrypoint.
//!
//! Both advertise what they can do through [`Capabilities`]; calling an
//! optional operation a provider lacks fails with `UNIMPLEMENTED`
//! ([`ErrorCode::Unsupported`]) naming the capability.
//!
//! Secrets are never part of a [`SandboxSpec`]: a container's environment is
//! visible to `docker inspect` and is baked into committed snapshot images,
//! so secret values travel with each call to the agent instead.

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use shared::error::{Error, ErrorCode};
use shared::secret::Secret;
use shared::transport::Address;

pub mod docker;
pub mod local;

pub use docker::{DockerOptions, DockerProvider, DockerProviderOptions, MountSpec};
pub use local::{LocalProvider, LocalProviderOptions};

/// Every provider result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Label every Sandhold sandbox carries, so orphans can be found even when
/// the instance store lost them.
pub const LABEL_MANAGED: &str = "dev.sandhold.managed";
pub const LABEL_TENANT: &str = "dev.sandhold.tenant";
pub const LABEL_SANDBOX_KEY: &str = "dev.sandhold.sandbox-key";
pub const LABEL_DEFINITION: &str = "dev.sandhold.definition";

/// Which provider implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Local,
    Docker,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Docker => "docker",
        }
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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
}

/// Everything a provider needs to create a sandbox. Contains no secret.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The sandbox key (hash of tenant, definition, options, workspace,
    /// thread); labels the sandbox and names its snapshots.
    pub key: String,
    pub tenant: String,
    pub definition_id: String,
    /// Non-secret environment of the agent and everything it starts.
    /// Secrets are passed per call to the agent, never here.
    pub env: BTreeMap<String, String>,
    /// Options of the Docker provider; the local provider ignores them.
    pub docker: DockerOptions,
}

impl SandboxSpec {
    /// The labels a sandbox of this spec carries.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_TENANT.to_string(), self.tenant.clone()),
            (LABEL_SANDBOX_KEY.to_string(), self.key.clone()),
            (LABEL_DEFINITION.to_string(), self.definition_id.clone()),
        ])
    }
}

/// A live sandbox: where its agent answers and the token it wants.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The provider's own id (local: the directory name; Docker: the
    /// container id). Store it to resume or destroy the sandbox later.
    pub provider_id: String,
    /// Where the agent listens, as seen from the control plane.
    pub address: Address,
    /// The agent's bearer token. Regenerated only when a sandbox is created.
    pub token: Secret,
    /// The workspace root as the agent (inside the sandbox) sees it.
    pub workspace: PathBuf,
}

/// A sandbox found by [`Provider::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSandbox {
    pub provider_id: String,
    pub labels: BTreeMap<String, String>,
    /// Whether its agent (local) or container (Docker) is running.
    pub running: bool,
    /// When the provider made it, when it can tell (Docker: the container's
    /// creation; local: when its labels were written). The reaper's grace
    /// period for orphans counts from here.
    pub created_at: Option<crate::store::Timestamp>,
    /// Made by this provider instance: its state lives under this server's
    /// data dir (local: always; Docker: the container's host dir is in our
    /// state dir). Another deployment sharing a Docker engine lists
    /// sandboxes that are not ours; the reaper never destroys those.
    pub own: bool,
}

/// A provider-native snapshot (Docker: a committed image).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// What [`Provider::restore`] takes (Docker: the image reference).
    pub id: String,
}

/// A place sandboxes live. Object-safe: held as `Arc<dyn Provider>`.
#[async_trait]
pub trait Provider: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> ProviderKind;

    fn capabilities(&self) -> Capabilities;

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

    /// Capture the sandbox's filesystem natively.
    async fn snapshot(&self, provider_id: &str) -> Result<Snapshot> {
        let _ = provider_id;
        Err(unsupported(self.kind(), "snapshots"))
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

/// The error of an optional operation a provider lacks: `UNIMPLEMENTED`
/// with the capability named in the message and in `ErrorInfo` metadata.
pub fn unsupported(kind: ProviderKind, capability: &str) -> Error {
    Error::new(
        ErrorCode::Unsupported,
        format!("the {kind} provider does not support the {capability} capability"),
    )
    .with_meta("capability", capability)
    .with_meta("provider", kind.as_str())
}

/// A fresh random token for a sandbox's agent (256 bits, hex).
pub(crate) fn new_token() -> Secret {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    Secret::new(hex::encode(bytes))
}

/// A short random name for a sandbox's host directory. Short on purpose:
/// the agent's socket lives in it and Unix socket paths are limited to 107
/// bytes.
pub(crate) fn new_short_id() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Longest path a Unix socket may have (`sun_path` is 108 bytes with the
/// terminating NUL).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// Refuse a socket path the kernel would refuse, with a message that says
/// what to shorten.
pub(crate) fn check_socket_path(path: &std::path::Path, what: &str) -> Result<()> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            format!(
                "{what} {} would put sandbox agent sockets at {len} bytes, over the {MAX_SOCKET_PATH}-byte limit \
                 of Unix socket paths; choose a shorter directory",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Write `contents` to a new file only its owner can read (tokens).
pub(crate) fn write_private_file(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// Where the agent binary is when none is configured: `sandhold-agent` next
/// to the current executable (an installed pair, or cargo's target dir,
/// whose test binaries live one level below in `deps/`), else on `PATH`.
pub fn default_agent_binary() -> Option<PathBuf> {
    const NAME: &str = "sandhold-agent";
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        for candidate in [dir.join(NAME), dir.join("..").join(NAME)] {
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(NAME)).find(|c| c.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Minimal;

    #[async_trait]
    impl Provider for Minimal {
        fn kind(&self) -> ProviderKind {
            ProviderKind::Local
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }
        async fn create(&self, _spec: &SandboxSpec) -> Result<Sandbox> {
            Err(Error::internal("not in this test"))
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
            assert_eq!(err.code, ErrorCode::Unsupported);
            assert!(err.message.contains(capability), "{}", err.message);
            assert_eq!(err.metadata.get("capability").map(String::as_str), Some(capability));
            assert_eq!(tonic::Status::from(err).code(), tonic::Code::Unimplemented);
        }
    }

    #[test]
    fn long_socket_paths_are_refused_with_advice() {
        let long = std::path::PathBuf::from(format!("/{}", "d".repeat(120)));
        let err = check_socket_path(&long, "data dir").unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(err.message.contains("shorter"), "{}", err.message);
        assert!(check_socket_path(std::path::Path::new("/tmp/x/agent.sock"), "data dir").is_ok());
    }

    #[test]
    fn tokens_and_ids_are_random() {
        assert_ne!(new_token().expose(), new_token().expose());
        assert_eq!(new_token().expose().len(), 64);
        assert_eq!(new_short_id().len(), 16);
    }
}
