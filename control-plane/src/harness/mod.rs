//! Harness adapters: for each agent CLI (and for any command), build the
//! command line of a run and translate the CLI's stdout, as journaled, line by
//! line into [`Chunk`]s.
//!
//! Translation is deterministic: ids come only from the run's
//! [`RunScopedIds`] counter, and nothing but the journal bytes (and the exit
//! code and stderr tail given to [`Translator::finish`]) decides a chunk. The
//! clock only stamps `timestamp_ms`, which fingerprints ignore. So a takeover
//! that re-translates a journal from byte 0 reproduces what is stored.
//!
//! Every sequence a [`Translator`] produces starts with RUN_STARTED and, once
//! finished, ends with exactly one RUN_FINISHED or RUN_ERROR; text, reasoning
//! and tool calls still open at that point are ended first. A line that is
//! not what the CLI should print becomes a `harness.warning` CUSTOM chunk; an
//! event type an adapter does not know produces nothing.

pub mod claude_code;
pub mod codex;
pub mod command;
pub mod opencode;

use std::collections::BTreeMap;

use serde_json::Value;
use shared::chunk::{self, Chunk, ChunkFactory, ChunkType, RunScopedIds, Usage};
use shared::ids::RunId;
use shared::proto::agent::v1 as agent;

/// The harnesses a run can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Harness {
    /// Any command: JSON chunk lines pass through, other lines are text.
    Command,
    /// `claude -p --output-format stream-json`.
    ClaudeCode,
    /// `codex exec --json`.
    Codex,
    /// `opencode run --format json`.
    OpenCode,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HarnessError {
    #[error("unknown harness {0:?} (known: command, claude-code, codex, opencode)")]
    Unknown(String),
    #[error("the command harness needs a command (argv) to run")]
    MissingCommand,
    #[error("invalid option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
}

impl Harness {
    pub const ALL: [Harness; 4] = [Harness::Command, Harness::ClaudeCode, Harness::Codex, Harness::OpenCode];

    /// The harness's name on the wire and in CUSTOM names
    /// (`claude-code.session-id`).
    pub fn name(self) -> &'static str {
        match self {
            Harness::Command => "command",
            Harness::ClaudeCode => "claude-code",
            Harness::Codex => "codex",
            Harness::OpenCode => "opencode",
        }
    }

    pub fn parse(name: &str) -> Result<Self, HarnessError> {
        Self::ALL.into_iter().find(|h| h.name() == name).ok_or_else(|| HarnessError::Unknown(name.to_owned()))
    }

    /// The command line, environment and stdin of a run of this harness.
    pub fn command(self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
        match self {
            Harness::Command => command::command(options, prompt),
            Harness::ClaudeCode => claude_code::command(options, prompt),
            Harness::Codex => codex::command(options, prompt),
            Harness::OpenCode => opencode::command(options, prompt),
        }
    }

    /// A translator for one run of this harness. `clock` stamps
    /// `timestamp_ms` only.
    pub fn translator(
        self,
        run_id: &RunId,
        thread_id: &str,
        clock: impl Fn() -> i64 + Send + Sync + 'static,
    ) -> Translator {
        let inner: Box<dyn Translate> = match self {
            Harness::Command => Box::new(command::CommandTranslator::default()),
            Harness::ClaudeCode => Box::new(claude_code::ClaudeCodeTranslator::default()),
            Harness::Codex => Box::new(codex::CodexTranslator::default()),
            Harness::OpenCode => Box::new(opencode::OpenCodeTranslator::default()),
        };
        Translator { em: Emitter::new(self, run_id, thread_id, clock), inner }
    }
}

/// What a client may set for a run. Options a harness has no use for are
/// ignored by it (documented per field).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HarnessOptions {
    /// The program to run instead of the CLI's usual name (`claude`, `codex`,
    /// `opencode`), e.g. an absolute path. Not for `command`.
    pub program: Option<String>,
    /// `command` only: the argv to run.
    pub command: Vec<String>,
    pub model: Option<String>,
    /// Continue this CLI session (the value of a `<harness>.session-id`).
    pub resume_session_id: Option<String>,
    /// Claude Code `--permission-mode` (default `bypassPermissions`: the
    /// sandbox is the isolation).
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
    /// Codex `--sandbox` mode; unset means
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
    /// Deliver the prompt through this file (a path under the sandbox root)
    /// redirected to stdin, for providers without writable stdin. Unset: the
    /// prompt is written to stdin directly.
    pub prompt_file: Option<String>,
}

/// What to start in the sandbox: maps onto the agent's
/// `JournalService.StartRun`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    /// Added to the agent's environment.
    pub env: BTreeMap<String, String>,
    pub stdin: StdinSpec,
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
        }
    }
}

/// How the prompt reaches a stdin-fed CLI.
fn prompt_stdin(options: &HarnessOptions, prompt: &str) -> StdinSpec {
    match &options.prompt_file {
        Some(path) => StdinSpec::File { path: path.clone(), contents: prompt.as_bytes().to_vec() },
        None => StdinSpec::Bytes(prompt.as_bytes().to_vec()),
    }
}

fn program(options: &HarnessOptions, default: &str) -> String {
    options.program.clone().unwrap_or_else(|| default.to_owned())
}

/// Translates one run's journal into chunks. Feed it every line of the
/// journal in order (without the newline, never the exit sentinel), then
/// call [`finish`](Self::finish) once the run's exit is known.
pub struct Translator {
    em: Emitter,
    inner: Box<dyn Translate>,
}

impl std::fmt::Debug for Translator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Translator")
            .field("harness", &self.em.harness)
            .field("terminal", &self.em.terminal)
            .finish()
    }
}

impl Translator {
    /// The chunks of one journal line. The first call yields RUN_STARTED
    /// first; after the terminal chunk every line yields nothing.
    pub fn feed(&mut self, line: &[u8]) -> Vec<Chunk> {
        self.em.ensure_started();
        if !self.em.terminal {
            self.inner.line(&mut self.em, line);
        }
        std::mem::take(&mut self.em.out)
    }

    /// The run exited with `exit_code` (128 + signal for a signal); its
    /// stderr ended with `stderr_tail`. Yields the terminal chunk unless the
    /// CLI's own result event already did, and nothing on a second call.
    pub fn finish(&mut self, exit_code: i32, stderr_tail: &str) -> Vec<Chunk> {
        self.em.ensure_started();
        if !self.em.terminal {
            self.inner.finish(&mut self.em, exit_code, stderr_tail);
            if !self.em.terminal {
                // An adapter that forgot its terminal chunk must not leave
                // the run open.
                self.em.finish_from_exit(exit_code, stderr_tail, None, "stop", None);
            }
        }
        std::mem::take(&mut self.em.out)
    }

    /// True once RUN_FINISHED or RUN_ERROR was produced.
    pub fn is_terminal(&self) -> bool {
        self.em.terminal
    }
}

/// One harness's translation state.
trait Translate: Send {
    fn line(&mut self, em: &mut Emitter, line: &[u8]);
    fn finish(&mut self, em: &mut Emitter, exit_code: i32, stderr_tail: &str);
}

/// Longest piece of an offending line a warning carries.
const WARNING_LINE_MAX: usize = 512;

/// Builds a run's chunks and keeps the bookkeeping every adapter shares:
/// RUN_STARTED first, nothing after the terminal chunk, open messages and
/// tool calls ended before it.
struct Emitter {
    harness: Harness,
    f: ChunkFactory,
    ids: RunScopedIds,
    out: Vec<Chunk>,
    started: bool,
    terminal: bool,
    /// Started and not yet ended: (START type, id), oldest first.
    open: Vec<(ChunkType, String)>,
    /// The latest text message, the parent of tool calls that follow it.
    last_text_id: String,
}

impl Emitter {
    fn new(
        harness: Harness,
        run_id: &RunId,
        thread_id: &str,
        clock: impl Fn() -> i64 + Send + Sync + 'static,
    ) -> Self {
        Self {
            harness,
            f: ChunkFactory::new(run_id, thread_id, clock),
            ids: RunScopedIds::new(run_id.clone()),
            out: Vec::new(),
            started: false,
            terminal: false,
            open: Vec::new(),
            last_text_id: String::new(),
        }
    }

    fn ensure_started(&mut self) {
        if !self.started {
            self.started = true;
            let c = self.f.run_started();
            self.out.push(c);
        }
    }

    fn new_id(&mut self) -> String {
        self.ids.next_id()
    }

    /// Emits `c` and tracks what it opens and closes.
    fn push(&mut self, c: Chunk) {
        if self.terminal {
            return;
        }
        self.ensure_started();
        match c.r#type() {
            ChunkType::RunStarted => return,
            ty @ (ChunkType::TextMessageStart | ChunkType::ReasoningStart) => {
                if ty == ChunkType::TextMessageStart {
                    self.last_text_id = c.message_id.clone();
                }
                self.open.push((ty, c.message_id.clone()));
            }
            ChunkType::ToolCallStart => self.open.push((ChunkType::ToolCallStart, c.tool_call_id.clone())),
            ChunkType::TextMessageEnd => self.forget(ChunkType::TextMessageStart, &c.message_id),
            ChunkType::ReasoningEnd => self.forget(ChunkType::ReasoningStart, &c.message_id),
            ChunkType::ToolCallEnd => self.forget(ChunkType::ToolCallStart, &c.tool_call_id),
            ChunkType::RunFinished | ChunkType::RunError => {
                self.close_all();
                self.terminal = true;
            }
            _ => {}
        }
        self.out.push(c);
    }

    fn forget(&mut self, start: ChunkType, id: &str) {
        if let Some(i) = self.open.iter().position(|(t, x)| *t == start && x == id) {
            self.open.remove(i);
        }
    }

    /// Ends everything still open, newest first.
    fn close_all(&mut self) {
        while let Some((ty, id)) = self.open.pop() {
            let end = match ty {
                ChunkType::TextMessageStart => self.f.text_end(&id),
                ChunkType::ReasoningStart => self.f.reasoning_end(&id),
                _ => self.f.tool_call_end(&id),
            };
            self.out.push(end);
        }
    }

    fn start_text(&mut self) -> String {
        let id = self.new_id();
        self.push(self.f.text_start(&id));
        id
    }

    fn start_reasoning(&mut self) -> String {
        let id = self.new_id();
        self.push(self.f.reasoning_start(&id));
        id
    }

    /// A whole text message; nothing for empty text.
    fn text_message(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let id = self.start_text();
        self.push(self.f.text_content(&id, text));
        self.push(self.f.text_end(&id));
    }

    /// A whole reasoning message; nothing for empty text.
    fn reasoning_message(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let id = self.start_reasoning();
        self.push(self.f.reasoning_content(&id, text));
        self.push(self.f.reasoning_end(&id));
    }

    fn start_tool(&mut self, name: &str) -> String {
        let id = self.new_id();
        let parent = self.last_text_id.clone();
        self.push(self.f.tool_call_start(&id, name, &parent));
        id
    }

    /// START, ARGS (the whole arguments as JSON text) and END of a call.
    fn tool_call(&mut self, name: &str, args: &Value) -> String {
        let id = self.start_tool(name);
        self.push(self.f.tool_call_args(&id, &args.to_string()));
        self.push(self.f.tool_call_end(&id));
        id
    }

    fn warning(&mut self, message: &str, line: Option<&[u8]>) {
        let snippet = line.map(|l| {
            let l = &l[..l.len().min(WARNING_LINE_MAX)];
            String::from_utf8_lossy(l).into_owned()
        });
        self.push(self.f.warning(message, snippet.as_deref()));
    }

    fn session_id(&mut self, session_id: &str) {
        let name = chunk::session_id_name(self.harness.name());
        self.push(self.f.custom(&name, &serde_json::json!({ "session_id": session_id })));
    }

    /// The terminal chunk decided by the exit code: RUN_FINISHED for 0,
    /// RUN_ERROR otherwise with the CLI's last error or the stderr tail.
    fn finish_from_exit(
        &mut self,
        exit_code: i32,
        stderr_tail: &str,
        last_error: Option<&str>,
        reason: &str,
        usage: Option<Usage>,
    ) {
        if exit_code == 0 {
            self.push(self.f.run_finished(reason, usage));
            return;
        }
        let mut message = format!("{} exited with code {exit_code}", self.harness.name());
        let detail = last_error.map(str::trim).filter(|s| !s.is_empty()).or_else(|| {
            let t = stderr_tail.trim();
            (!t.is_empty()).then_some(t)
        });
        if let Some(d) = detail {
            message.push_str(": ");
            message.push_str(d);
        }
        self.push(self.f.run_error(&message, ERROR_CODE_EXIT));
    }
}

/// RUN_ERROR code of a run whose CLI exited non-zero without saying why in
/// its own events.
pub const ERROR_CODE_EXIT: &str = "exit_code";

/// Parses a journal line of a JSON harness: a JSON object, after trimming
/// whitespace. `Err` carries why not, for the warning; `Ok(None)` is a blank
/// line (skipped).
fn parse_object(line: &[u8]) -> Result<Option<serde_json::Map<String, Value>>, &'static str> {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return Ok(None);
    }
    match serde_json::from_slice::<Value>(trimmed) {
        Ok(Value::Object(m)) => Ok(Some(m)),
        Ok(_) => Err("journal line is JSON but not an object"),
        Err(_) => Err("journal line is not JSON"),
    }
}

/// Common finish reasons: the CLIs' words mapped onto `stop`, `length`,
/// `tool_calls`, `content_filter`; anything else kept (dashes as
/// underscores).
fn finish_reason(raw: &str) -> String {
    match raw {
        "" | "end_turn" | "stop" | "stop_sequence" | "completed" => "stop".into(),
        "max_tokens" | "length" | "max_turns" => "length".into(),
        "tool_use" | "tool-calls" | "tool_calls" => "tool_calls".into(),
        "refusal" | "content-filter" | "content_filter" => "content_filter".into(),
        other => other.replace('-', "_"),
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Sums `b` into `a` (costs too, when either knows one).
fn add_usage(a: &mut Option<Usage>, b: &Usage) {
    let a = a.get_or_insert_with(Usage::default);
    a.input_tokens += b.input_tokens;
    a.output_tokens += b.output_tokens;
    a.cache_read_tokens += b.cache_read_tokens;
    a.cache_write_tokens += b.cache_write_tokens;
    a.reasoning_tokens += b.reasoning_tokens;
    a.cost_usd = match (a.cost_usd, b.cost_usd) {
        (None, None) => None,
        (x, y) => Some(x.unwrap_or(0.0) + y.unwrap_or(0.0)),
    };
}

/// The text of a tool result: a string as is, a list of content blocks as
/// their texts joined by newlines, anything else as JSON.
fn result_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(blocks) if blocks.iter().all(|b| b.get("text").is_some_and(Value::is_string)) => {
            blocks.iter().map(|b| str_of(b, "text")).collect::<Vec<_>>().join("\n")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the adapters' unit tests.
    use super::*;

    pub fn translate(h: Harness, journal: &str, exit_code: i32, stderr: &str) -> Vec<Chunk> {
        let mut t = h.translator(&RunId::parse("r").unwrap(), "t", || 0);
        let mut out = Vec::new();
        for line in journal.lines() {
            out.extend(t.feed(line.as_bytes()));
        }
        out.extend(t.finish(exit_code, stderr));
        out
    }

    pub fn types(chunks: &[Chunk]) -> Vec<&'static str> {
        chunks.iter().map(|c| chunk::type_name(c.r#type())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn names_round_trip() {
        for h in Harness::ALL {
            assert_eq!(Harness::parse(h.name()), Ok(h));
        }
        assert!(matches!(Harness::parse("gemini"), Err(HarnessError::Unknown(_))));
    }

    #[test]
    fn terminal_closes_what_is_open_and_ends_the_run() {
        let mut t = Harness::Command.translator(&RunId::parse("r").unwrap(), "t", || 0);
        let first = t.feed(br#"{"type":"REASONING_START","message_id":"x"}"#);
        assert_eq!(types(&first), ["RUN_STARTED", "REASONING_START"]);
        let end = t.feed(br#"{"type":"RUN_ERROR","error_message":"boom","error_code":"b"}"#);
        assert_eq!(types(&end), ["REASONING_END", "RUN_ERROR"]);
        assert_eq!(end[0].message_id, "x");
        assert!(t.is_terminal());
        assert!(t.feed(b"more").is_empty());
        assert!(t.finish(1, "x").is_empty());
    }

    #[test]
    fn finish_without_lines_still_starts_and_ends() {
        let chunks = translate(Harness::Codex, "", 0, "");
        assert_eq!(types(&chunks), ["RUN_STARTED", "RUN_FINISHED"]);
        let chunks = translate(Harness::ClaudeCode, "", 2, "no api key\n");
        assert_eq!(types(&chunks), ["RUN_STARTED", "RUN_ERROR"]);
        assert_eq!(chunks[1].error_message, "claude-code exited with code 2: no api key");
        assert_eq!(chunks[1].error_code, ERROR_CODE_EXIT);
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

    /// Lines shaped like each CLI's events, to steer arbitrary input into the
    /// adapters' deeper branches rather than only the "not JSON" one.
    fn event_line() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let types = prop::sample::select(vec![
            "system",
            "assistant",
            "user",
            "stream_event",
            "result",
            "thread.started",
            "turn.completed",
            "turn.failed",
            "error",
            "item.started",
            "item.updated",
            "item.completed",
            "text",
            "tool_use",
            "step_finish",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_RESULT",
            "RUN_FINISHED",
            "CUSTOM",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z_]{0,8}".prop_map(Value::String),
        ];
        let value = leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(vec![
                        "type",
                        "id",
                        "text",
                        "content",
                        "message",
                        "item",
                        "event",
                        "part",
                        "index",
                        "delta",
                        "tool_use_id",
                        "usage",
                        "subtype",
                        "status",
                        "exit_code",
                        "state",
                        "error",
                        "name",
                    ]),
                    inner,
                    0..5
                )
                .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
            ]
        });
        (types, value).prop_map(|(ty, v)| {
            let mut obj = v.as_object().cloned().unwrap_or_default();
            obj.insert("type".into(), Value::String(ty.into()));
            Value::Object(obj).to_string().into_bytes()
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_lines_never_panic_and_the_run_is_well_formed(
            lines in proptest::collection::vec(
                proptest::prop_oneof![proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), event_line()],
                0..24,
            ),
            exit in -2i32..3,
        ) {
            for h in Harness::ALL {
                let mut t = h.translator(&RunId::parse("p").unwrap(), "t", || 0);
                let mut all = Vec::new();
                for line in &lines {
                    all.extend(t.feed(line));
                }
                all.extend(t.finish(exit, "tail"));
                proptest::prop_assert_eq!(all[0].r#type(), ChunkType::RunStarted);
                proptest::prop_assert_eq!(all.iter().filter(|c| c.r#type() == ChunkType::RunStarted).count(), 1);
                let terminals = all.iter().filter(|c| chunk::is_terminal(c)).count();
                proptest::prop_assert_eq!(terminals, 1);
                proptest::prop_assert!(chunk::is_terminal(all.last().unwrap()));
            }
        }
    }

    #[test]
    fn finish_reasons_are_normalised() {
        for (raw, want) in [
            ("end_turn", "stop"),
            ("max_tokens", "length"),
            ("tool-calls", "tool_calls"),
            ("weird-one", "weird_one"),
        ] {
            assert_eq!(finish_reason(raw), want);
        }
    }
}
