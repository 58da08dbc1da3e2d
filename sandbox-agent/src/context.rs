//! What the agent's services share, built once from the options.
//!
//! A service is built from an [`AgentContext`] (taking the parts it uses),
//! so it can be built, and tested, without starting a server.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use shared::proto::agent::v1::Capabilities;

use crate::confine::Root;
use crate::isolation::Isolation;
use crate::options::AgentOptions;
use crate::run_user::RunUser;
use crate::vault::Vault;

/// The sandbox root, the journal dir and what the agent can do. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct AgentContext {
    pub root: Root,
    pub journal_dir: PathBuf,
    pub capabilities: Capabilities,
    /// Who commands run as (and files written for the API belong to);
    /// `None`: the agent's own user.
    pub run_user: Option<RunUser>,
    /// How everything the run user starts is confined.
    pub isolation: Isolation,
    /// The sandbox's secret values (memory only), masked in what is served.
    pub vault: Vault,
}

impl AgentContext {
    /// Create the root and the journal dir when missing, and resolve the
    /// root. With a run user: give it its passwd entry and HOME, hand it the
    /// root, and close the journal dir to everyone but the agent.
    pub fn new(options: &AgentOptions) -> anyhow::Result<Self> {
        let made = match options.run_user {
            Some(_) => crate::run_user::make_root(&options.root),
            None => std::fs::create_dir_all(&options.root),
        };
        made.with_context(|| format!("creating the sandbox root {}", options.root.display()))?;
        if let Some(user) = &options.run_user {
            let exe = std::env::current_exe().context("finding the agent's own binary")?;
            crate::run_user::check_root(&options.root, &[&options.journal_dir, &exe])?;
            user.prepare(Path::new("/etc"));
            user.adopt(&options.root)
                .with_context(|| format!("handing the root {} to the run user", options.root.display()))?;
        }
        let root = Root::new(&options.root)
            .with_context(|| format!("resolving the sandbox root {}", options.root.display()))?;
        std::fs::create_dir_all(&options.journal_dir)
            .with_context(|| format!("creating the journal dir {}", options.journal_dir.display()))?;
        // The run user writes its output through the descriptors the shim
        // hands it, never by opening a journal (nor forging another run's).
        std::fs::set_permissions(&options.journal_dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restricting the journal dir {}", options.journal_dir.display()))?;
        let home = match &options.run_user {
            Some(user) => Some(user.home.clone()),
            None => std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute()),
        };
        let (isolation, warnings) = Isolation::detect(root.path(), home.as_deref(), !options.unconfined);
        for warning in &warnings {
            tracing::warn!("{warning}");
        }
        Ok(Self {
            root,
            journal_dir: options.journal_dir.clone(),
            capabilities: capabilities(&isolation),
            isolation,
            run_user: options.run_user.clone(),
            vault: Vault::new(&options.journal_dir),
        })
    }
}

/// What this agent can do, confined as `isolation` says.
pub fn capabilities(isolation: &Isolation) -> Capabilities {
    Capabilities {
        background_processes: true,
        killable_processes: true,
        writable_stdin: true,
        journal: true,
        watch: true,
        inotify: true,
        snapshots: true,
        ports: true,
        pty: true,
        egress: true,
        requests: true,
        landlock: isolation.landlock(),
        seccomp: isolation.seccomp(),
    }
}
