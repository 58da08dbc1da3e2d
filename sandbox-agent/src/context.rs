//! What the agent's services share, built once from the options.
//!
//! A service is built from an [`AgentContext`] (taking the parts it uses),
//! so it can be built, and tested, without starting a server.

use std::path::PathBuf;

use anyhow::Context;
use shared::proto::agent::v1::Capabilities;

use crate::confine::Root;
use crate::options::AgentOptions;

/// The sandbox root, the journal dir and what the agent can do. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct AgentContext {
    pub root: Root,
    pub journal_dir: PathBuf,
    pub capabilities: Capabilities,
}

impl AgentContext {
    /// Create the root and the journal dir when missing, and resolve the
    /// root.
    pub fn new(options: &AgentOptions) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&options.root)
            .with_context(|| format!("creating the sandbox root {}", options.root.display()))?;
        let root = Root::new(&options.root)
            .with_context(|| format!("resolving the sandbox root {}", options.root.display()))?;
        std::fs::create_dir_all(&options.journal_dir)
            .with_context(|| format!("creating the journal dir {}", options.journal_dir.display()))?;
        Ok(Self { root, journal_dir: options.journal_dir.clone(), capabilities: capabilities() })
    }
}

/// What this agent can do. Services that are not built yet say `false`.
pub fn capabilities() -> Capabilities {
    Capabilities {
        background_processes: true,
        killable_processes: true,
        writable_stdin: true,
        journal: true,
        watch: true,
        inotify: true,
        snapshots: true,
    }
}
