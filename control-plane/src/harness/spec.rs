//! What a run asks of a harness: which CLI, its options, and the command
//! line, environment and prompt delivery built from them.

use std::collections::BTreeMap;

use shared::ids::RunId;
use shared::proto::agent::v1 as agent;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HarnessError {
    /// The name asked for, and the registry's names.
    #[error("unknown harness {0:?} (known: {1})")]
    Unknown(String, String),
    #[error("the command harness needs a command (argv) to run")]
    MissingCommand,
    #[error("invalid option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
}

/// What a run's command prints, for [`Harness::translator_for`](super::Harness::translator_for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// The CLI's own JSON lines (for `acp`: the bridge's, as always).
    #[default]
    Native,
    /// The sandbox agent's ACP bridge's lines: the CLI runs as an ACP agent
    /// under `sandhold-agent acp` (Codex and OpenCode under a policy they
    /// cannot ask by themselves).
    Acp,
}

/// What a client may set for a run. Options a harness has no use for are
/// ignored by it (documented per field).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HarnessOptions {
    /// The program to run instead of the CLI's usual name (`claude`, `codex`,
    /// `opencode`), e.g. an absolute path. Not for `command`.
    pub program: Option<String>,
    /// `command`: the argv to run; `acp`: the ACP agent's command line.
    pub command: Vec<String>,
    pub model: Option<String>,
    /// Continue this CLI session (the value of a `<harness>.session-id`).
    pub resume_session_id: Option<String>,
    /// Claude Code `--permission-mode` (default `bypassPermissions`: the
    /// sandbox is the isolation); Gemini CLI `--approval-mode` (default
    /// `yolo`, for the same reason).
    pub permission_mode: Option<String>,
    /// Claude Code `--max-turns`.
    pub max_turns: Option<u32>,
    /// Claude Code `--allowedTools` / `--disallowedTools`.
    pub allowed_tools: Vec<String>,
    pub disallowed_tools: Vec<String>,
    /// Claude Code `--append-system-prompt`.
    pub system_prompt: Option<String>,
    /// Claude Code `--mcp-config`, a path inside the sandbox.
    pub mcp_config_path: Option<String>,
    /// Claude Code `--include-partial-messages` (streamed text deltas).
    pub include_partial_messages: bool,
    /// Codex `--sandbox` mode (`acp`: the session mode to set, e.g. an
    /// agent's unsandboxed one); unset means
    /// `--dangerously-bypass-approvals-and-sandbox` (the sandbox is the
    /// isolation, and Codex's own sandbox does not work in most containers).
    pub sandbox_mode: Option<String>,
    /// Codex `-c key=value` overrides, in order (value parsed as TOML by
    /// Codex).
    pub config_overrides: Vec<(String, String)>,
    /// Appended to the CLI's argv before the prompt.
    pub extra_args: Vec<String>,
    /// Added to the run's environment (secrets included; never logged).
    pub env: BTreeMap<String, String>,
    /// What the harness may do without asking (the empty policy allows
    /// everything). Each adapter maps it onto the CLI's own permission
    /// settings and routes what asks through the agent's request tools.
    pub policy: shared::policy::Policy,
    /// Tools the client declared: served to the CLI as MCP tools of the
    /// `sandhold` server; every call is a request the client answers.
    pub client_tools: Vec<agent::ClientTool>,
    /// Deliver the prompt through this file (a path under the sandbox root)
    /// redirected to stdin, for providers without writable stdin. Unset: the
    /// prompt is written to stdin directly.
    pub prompt_file: Option<String>,
}

/// What to start in the sandbox: maps onto the agent's
/// `JournalService.StartRun`.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    /// Added to the agent's environment.
    pub env: BTreeMap<String, String>,
    pub stdin: StdinSpec,
    /// Set when the run may ask (a policy that is not allow-everything, or
    /// client tools): the agent sets up the run's request dir.
    pub requests: Option<agent::RequestSetup>,
    /// What the CLI cannot express of the policy (or of anything else the
    /// run asked for): each becomes a `harness.warning` chunk.
    pub warnings: Vec<String>,
    /// What the command prints: the driver translates with
    /// `Harness::translator_for(spec.output, ..)`, and a successor that
    /// re-translates the journal must use the same (keep it with the run).
    pub output: Output,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdinSpec {
    /// `/dev/null`.
    Null,
    /// These bytes are the command's stdin.
    Bytes(Vec<u8>),
    /// Write `contents` to `path` (under the sandbox root) first; that file
    /// becomes stdin.
    File { path: String, contents: Vec<u8> },
}

impl CommandSpec {
    pub fn new(argv: Vec<String>, env: BTreeMap<String, String>, stdin: StdinSpec) -> Self {
        CommandSpec { argv, env, stdin, requests: None, warnings: Vec::new(), output: Output::Native }
    }

    /// The CLI this command runs: argv[0], or for a command under the
    /// agent's ACP bridge (`sandhold-agent acp ... -- CLI ...`) the agent's
    /// program after `--` (what to look for in the image, whose sessions
    /// to carry).
    pub fn cli_program(&self) -> &str {
        let first = self.argv.first().map_or("", String::as_str);
        if first != shared::journal::AGENT_PROGRAM {
            return first;
        }
        let after = self.argv.iter().position(|a| a == "--").and_then(|i| self.argv.get(i + 1));
        after.map_or(first, String::as_str)
    }

    /// The agent request that starts this command as journaled run `run_id`.
    /// For [`StdinSpec::File`] the caller writes the file (FsService) before
    /// sending it.
    pub fn start_run_request(
        &self,
        run_id: &RunId,
        cwd: &str,
        sentinel_key: Vec<u8>,
    ) -> agent::StartRunRequest {
        let stdin = match &self.stdin {
            StdinSpec::Null => None,
            StdinSpec::Bytes(b) => Some(agent::start_run_request::Stdin::StdinBytes(b.clone())),
            StdinSpec::File { path, .. } => Some(agent::start_run_request::Stdin::StdinFile(path.clone())),
        };
        agent::StartRunRequest {
            run_id: run_id.as_str().to_owned(),
            command: Some(agent::Command {
                kind: Some(agent::command::Kind::Argv(agent::Argv { args: self.argv.clone() })),
            }),
            cwd: cwd.to_owned(),
            env: self.env.clone().into_iter().collect(),
            stdin,
            sentinel_key,
            // The driver sets the run's cap.
            max_journal_bytes: 0,
            requests: self.requests.clone(),
        }
    }
}

/// How the prompt reaches a stdin-fed CLI.
pub(super) fn prompt_stdin(options: &HarnessOptions, prompt: &str) -> StdinSpec {
    match &options.prompt_file {
        Some(path) => StdinSpec::File { path: path.clone(), contents: prompt.as_bytes().to_vec() },
        None => StdinSpec::Bytes(prompt.as_bytes().to_vec()),
    }
}

pub(super) fn program(options: &HarnessOptions, default: &str) -> String {
    options.program.clone().unwrap_or_else(|| default.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Harness;

    #[test]
    fn names_round_trip() {
        for h in Harness::ALL {
            assert_eq!(Harness::parse(h.name()), Ok(*h));
        }
        assert!(matches!(Harness::parse("grok"), Err(HarnessError::Unknown(..))));
    }

    #[test]
    fn start_run_request_carries_argv_env_and_stdin() {
        let options = HarnessOptions { prompt_file: Some(".sandhold/prompt".into()), ..Default::default() };
        let spec = Harness::ClaudeCode.command(&options, "hi").unwrap();
        assert_eq!(spec.stdin, StdinSpec::File { path: ".sandhold/prompt".into(), contents: b"hi".to_vec() });
        let req = spec.start_run_request(&RunId::parse("r1").unwrap(), "ws", vec![1]);
        assert_eq!(req.run_id, "r1");
        assert_eq!(req.stdin, Some(agent::start_run_request::Stdin::StdinFile(".sandhold/prompt".into())));
        let Some(agent::command::Kind::Argv(argv)) = req.command.and_then(|c| c.kind) else { panic!("argv") };
        assert_eq!(argv.args, spec.argv);
        assert_eq!(req.env.get("IS_SANDBOX").map(String::as_str), Some("1"));
    }

    #[test]
    fn an_acp_output_is_read_by_the_acp_translator_under_the_harness_name() {
        let journal = [
            r#"{"type":"session","sessionId":"019a","loaded":false}"#,
            r#"{"type":"update","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}"#,
            r#"{"type":"stop","stopReason":"end_turn"}"#,
        ];
        let mut t = Harness::Codex.translator_for(Output::Acp, &RunId::parse("r").unwrap(), "t", || 0);
        let mut chunks = Vec::new();
        for line in journal {
            chunks.extend(t.feed(line.as_bytes()));
        }
        chunks.extend(t.finish(0, ""));
        assert_eq!(chunks[1].name, "codex.session-id");
        assert!(chunks.iter().any(|c| c.delta == "hi"));
        assert_eq!(chunks.last().map(|c| c.finish_reason.as_str()), Some("stop"));
        let plain = CommandSpec::new(vec!["claude".into()], BTreeMap::new(), StdinSpec::Null);
        assert_eq!(plain.cli_program(), "claude");
    }
}
