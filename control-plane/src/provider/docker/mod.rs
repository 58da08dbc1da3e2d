//! The `docker` provider: one container per sandbox, of any image.
//!
//! The image needs nothing of ours. The statically linked `sandhold-agent`
//! is bound read-only at `/.sandhold/sandhold-agent` from the one copy the
//! host keeps (`agent_file.rs`) and is the entrypoint, as PID 1 in `init`
//! mode (reaps orphans, restarts the daemon). The agent listens on a Unix
//! socket in a per-sandbox host directory bind-mounted at `/run/sandhold`,
//! which also holds its token and the run journals:
//!
//! ```text
//! <state_dir>/agent/sandhold-agent-<hash>   bound read-only at /.sandhold/sandhold-agent
//! <state_dir>/<name>/           bind-mounted at /run/sandhold (0700, the server's user)
//!   token                       the agent's bearer token (0600)
//!   agent.sock                  created by the agent
//!   journal/                    run journals (kept out of committed snapshots)
//!   workspace/                  the workspace, only with a read-only root
//! ```
//!
//! The agent is root in the container and starts every command as the run
//! user (the definition's `user`, else `10001:10001`; `--run-user`), who
//! can neither enter this directory nor trace the agent (see `user.rs` and
//! `docs/security.md`).
//!
//! Containers get no network (`network_mode: none`) unless the spec names a
//! Docker network. Nothing is ever pulled: there is no registry here, a
//! missing image is an error that says so.
//!
//! Native snapshots commit the container to an image tagged by the sandbox
//! key; restore and fork start new containers from such images. Volumes and
//! bind mounts are not part of a commit, so a read-only-root sandbox (whose
//! workspace is a bind mount) refuses to snapshot.

mod agent_file;
mod container;
mod engine;
mod kind;
mod options;
mod policy;
mod provider;
mod stats;
mod user;

pub use container::image_tag;
pub(crate) use container::workdir_violation;
pub use engine::DockerProvider;
pub use kind::KIND;
pub use options::{DockerOptions, DockerProviderOptions, MountSpec};

/// Label holding the sandbox's host directory (to clean it up on destroy).
pub const LABEL_HOST_DIR: &str = "dev.sandhold.host-dir";
/// Label holding the image a forked sandbox was started from (removed with
/// it); empty for other sandboxes.
pub const LABEL_FORK_IMAGE: &str = "dev.sandhold.fork-image";

/// Where the agent binary goes inside a container.
const AGENT_DIR: &str = "/.sandhold";
const AGENT_PATH: &str = "/.sandhold/sandhold-agent";
/// Where the host directory is mounted inside a container.
const RUN_DIR: &str = "/run/sandhold";
const DEFAULT_WORKDIR: &str = "/workspace";
const SNAPSHOT_REPO: &str = "sandhold-snapshot";
const FORK_REPO: &str = "sandhold-fork";
