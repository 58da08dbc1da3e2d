//! The one interface a harness implements ([`Adapter`]), and the handle the
//! rest of the crate holds ([`Harness`]): everything Sandhold knows about one
//! CLI is reached through it, and lives in that CLI's folder.

use super::emit::Translate;
use super::model_api::ModelApi;
use super::session::{self, Carry, CarryScripts};
use super::skills::McpServer;
use super::toolchain::Cli;
use super::{CommandSpec, HarnessError, HarnessOptions};

/// Everything about one CLI. Defaults are "this CLI has none of it", so an
/// adapter states only what its CLI has.
pub(super) trait Adapter: Send + Sync + 'static {
    /// The name on the wire and in CUSTOM names (`claude-code.session-id`).
    fn name(&self) -> &'static str;

    /// The command line, environment and stdin of a run.
    fn command(&self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError>;

    /// The translation of the CLI's own output ([`Output::Native`](super::Output::Native)).
    fn translator(&self) -> Box<dyn Translate>;

    /// Whether the CLI has sessions a later run can continue.
    fn has_sessions(&self) -> bool {
        true
    }

    /// The CLI's model API; `None`: nothing to broker.
    fn model_api(&self) -> Option<ModelApi> {
        None
    }

    /// Point `spec` (built by [`command`](Self::command)) at `base_url`
    /// with `key`; what the run set itself wins.
    fn point_at(&self, _spec: &mut CommandSpec, _base_url: &str, _key: &str) {}

    /// The scripts that carry a session (the contract:
    /// [`session`](super::session)); `None`: sessions are not carried.
    fn carry_scripts(&self) -> Option<&'static CarryScripts> {
        None
    }

    /// Whether carrying a session runs the CLI itself (with the run's PATH).
    fn carry_runs_the_cli(&self) -> bool {
        false
    }

    /// The folder (relative to the workspace root) the CLI reads skills from.
    fn skills_folder(&self) -> Option<&'static str> {
        None
    }

    /// The MCP config file (relative to the workspace root) the CLI reads.
    fn mcp_file(&self) -> Option<&'static str> {
        None
    }

    /// `existing` (the [`mcp_file`](Self::mcp_file) the workspace may
    /// already have) with `servers` merged in, in the CLI's format;
    /// `Err(why)` when `existing` cannot be read as that format.
    fn mcp_config(&self, _existing: Option<&[u8]>, _servers: &[McpServer]) -> Result<Vec<u8>, String> {
        Err(format!("the {} harness reads no MCP config", self.name()))
    }

    /// The CLI's package for the toolchain dir (`sandhold harness install`).
    fn toolchain(&self) -> Option<&'static Cli> {
        None
    }
}

/// A harness a run can use: one of the registry's
/// ([`Harness::ALL`], [`Harness::parse`]). Cheap to copy; equal by name.
#[derive(Clone, Copy)]
pub struct Harness(pub(super) &'static dyn Adapter);

impl PartialEq for Harness {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Harness {}

impl std::hash::Hash for Harness {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Harness({})", self.name())
    }
}

impl std::fmt::Display for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Harness {
    pub(super) fn adapter(self) -> &'static dyn Adapter {
        self.0
    }

    /// The harness's name on the wire and in CUSTOM names
    /// (`claude-code.session-id`).
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// Whether the CLI has sessions a later run can continue (everything
    /// but a plain command).
    pub fn has_sessions(self) -> bool {
        self.0.has_sessions()
    }

    /// The command line, environment and stdin of a run of this harness.
    pub fn command(self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
        self.0.command(options, prompt)
    }

    /// The model API of a CLI harness; `None` for `command` and `acp` (the
    /// ACP agent's own CLI decides).
    pub fn model_api(self) -> Option<ModelApi> {
        self.0.model_api()
    }

    /// Point `spec` (built by this harness) at `base_url` with `key`.
    /// Settings the run gave itself come later and win (Codex `-c`
    /// overrides are read in order; environment set by the run is kept).
    pub fn point_at(self, spec: &mut CommandSpec, base_url: &str, key: &str) {
        self.0.point_at(spec, base_url, key)
    }

    /// Whether a session of this CLI can be carried in a portable snapshot.
    pub fn carries_sessions(self) -> bool {
        self.0.carry_scripts().is_some()
    }

    /// Whether carrying a session runs the CLI itself (with the run's PATH).
    pub fn carry_runs_the_cli(self) -> bool {
        self.0.carry_runs_the_cli()
    }

    /// The argv (run from the sandbox root) that carries `session` of this
    /// CLI for a run of `program` in `cwd` (relative to the root; empty: the
    /// root).
    /// `None` when the CLI's sessions are not carried, or when the id is not
    /// one a CLI makes (it lands in file name patterns).
    pub fn carry_session(self, carry: Carry, session: &str, cwd: &str, program: &str) -> Option<Vec<String>> {
        session::carry_argv(self.0.carry_scripts()?.get(carry), session, cwd, program)
    }

    /// The skills folder of this harness, if it has one.
    pub fn skills_folder(self) -> Option<&'static str> {
        self.0.skills_folder()
    }

    /// The MCP config file of this harness, if it reads one.
    pub fn mcp_file(self) -> Option<&'static str> {
        self.0.mcp_file()
    }

    /// `existing` with `servers` merged in, in this harness's MCP config
    /// format; `Err(why)` when `existing` cannot be read as that format.
    pub fn mcp_config(self, existing: Option<&[u8]>, servers: &[McpServer]) -> Result<Vec<u8>, String> {
        self.0.mcp_config(existing, servers)
    }

    /// The CLI package `sandhold harness install` fetches for this harness.
    pub fn toolchain(self) -> Option<&'static Cli> {
        self.0.toolchain()
    }
}
