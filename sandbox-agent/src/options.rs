//! What the agent is told to serve with: the settings, validated.

use std::path::{Path, PathBuf};

use shared::secret::Secret;
use shared::transport::Address;

use crate::run_user::RunUser;

/// Everything the agent needs to serve, validated.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub listen: Address,
    pub root: PathBuf,
    pub token: Secret,
    pub journal_dir: PathBuf,
    /// Who every command runs as; `None`: the agent's own user.
    pub run_user: Option<RunUser>,
    /// Start the run user's processes without Landlock and seccomp (the
    /// operator's escape hatch; the capabilities and every run say so).
    pub unconfined: bool,
}

/// `<root>/../.sandhold-journal`: beside the workspace, so the workspace
/// (what snapshots and diffs see) holds no journal, yet inside whatever the
/// provider keeps for the sandbox. Falls back to `/tmp/sandhold-runs` when
/// the root has no writable parent.
pub fn default_journal_dir(root: &Path) -> PathBuf {
    match root.parent() {
        Some(parent) if parent != Path::new("/") => parent.join(".sandhold-journal"),
        _ => PathBuf::from("/tmp/sandhold-runs"),
    }
}
