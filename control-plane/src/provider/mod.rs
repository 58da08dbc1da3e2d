//! Providers: where sandboxes live and how they come and go.
//!
//! A provider creates a sandbox with the `sandhold-agent` running inside and
//! answering on a Unix socket the control plane can reach; everything that
//! happens *in* a sandbox then goes through the agent (see
//! [`crate::agent::AgentClient`]). A provider registers itself in
//! [`kind`] (its name, how it reads its section of a definition, the
//! operator's checks of that section, how it is built from configuration);
//! the rest of the server asks a definition's [`ProviderKind`]. Two so far:
//!
//! - [`local`]: a directory on this host and the agent as a child process.
//!   No isolation at all: development only.
//! - [`docker`]: a container of any image; the static agent is copied in
//!   before start and is the container's entrypoint.

pub mod docker;
pub mod flags;
pub mod local;

mod canon;
mod error;
mod handle;
mod host;
mod interface;
mod kind;
mod spec;

pub use canon::Canon;
pub use docker::{DockerOptions, DockerProvider, DockerProviderOptions, MountSpec};
pub use error::Error;
pub use handle::{ListedSandbox, ResourceUse, Sandbox, Snapshot};
pub(crate) use host::{
    check_socket_path, is_agent_socket, new_short_id, new_token, own_uid, read_private_file,
    write_private_file,
};
pub use host::{default_agent_binary, default_static_agent_binary, is_static_executable};
pub(crate) use interface::with_capability_flags;
pub use interface::{Capabilities, Provider, Result};
pub use kind::{Built, Kind, NO_ISOLATION, ProviderKind, Violation, describe};
pub use local::{LocalProvider, LocalProviderOptions};
pub use spec::{LABEL_DEFINITION, LABEL_MANAGED, LABEL_SANDBOX_KEY, LABEL_TENANT, SandboxSpec};
