//! The options of the Docker provider and of one Docker sandbox.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Runtime;

/// Per-sandbox Docker options (part of a sandbox definition).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DockerOptions {
    /// Image to run; `None`: the provider's default image. Must exist in the
    /// local engine (nothing is pulled).
    pub image: Option<String>,
    /// The run user every command runs as: `uid[:gid]` or `name[:group]`
    /// (names resolved in the image's `/etc/passwd` and `/etc/group`),
    /// never root. `None`: `10001:10001` (`sandhold`). The agent itself is
    /// root in the container whatever the image's `USER`.
    pub user: Option<String>,
    /// Workspace directory inside the container; `None`: `/workspace`.
    pub workdir: Option<String>,
    pub memory_bytes: Option<i64>,
    /// CPUs, fractional allowed (e.g. 1.5).
    pub cpus: Option<f64>,
    pub pids_limit: Option<i64>,
    /// Read-only root filesystem; the workspace then lives in the host
    /// directory (bind-mounted at the workdir) and `/tmp` is a tmpfs.
    pub read_only_root: bool,
    /// A Docker network to join; `None`: no network at all.
    pub network: Option<String>,
    pub mounts: Vec<MountSpec>,
    /// The container runtime; `None`: runc (the operator's policy fills in
    /// a required one before the provider sees the spec).
    pub runtime: Option<Runtime>,
}

/// An extra mount: an absolute `source` is a host path (bind), anything
/// else a named volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

#[derive(Debug, Clone)]
pub struct DockerProviderOptions {
    /// The statically linked `sandhold-agent` copied into every container
    /// (`scripts/build-agent-static` prints its path).
    pub agent_binary: PathBuf,
    /// Parent of the per-sandbox host directories. Keep it short: the
    /// agent's socket lives in it and socket paths are limited to 107 bytes.
    pub state_dir: PathBuf,
    /// Image for specs that name none.
    pub default_image: Option<String>,
    /// How long a new or restarted container's agent may take to answer.
    pub ready_timeout: Duration,
    /// Harness CLIs (`sandhold harness install`), bind-mounted read-only at
    /// [`crate::toolchain::MOUNT`] in every container; `None`: not mounted.
    pub toolchain_dir: Option<PathBuf>,
}

impl DockerProviderOptions {
    pub fn new(agent_binary: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            agent_binary: agent_binary.into(),
            state_dir: state_dir.into(),
            default_image: None,
            ready_timeout: Duration::from_secs(60),
            toolchain_dir: None,
        }
    }
}
