//! What every adapter's translation uses: the [`Translate`] trait it
//! implements, the [`Emitter`] bookkeeping they share, and the JSON helpers.

use serde_json::Value;
use shared::chunk::{self, Chunk, ChunkFactory, ChunkType, RunScopedIds, Usage};
use shared::ids::RunId;

/// One harness's translation state.
pub(super) trait Translate: Send {
    fn line(&mut self, em: &mut Emitter, line: &[u8]);
    fn finish(&mut self, em: &mut Emitter, exit_code: i32, stderr_tail: &str);
    /// This run's id of the tool call the CLI calls `cli_id`, once seen.
    fn tool_call_id(&self, _cli_id: &str) -> Option<String> {
        None
    }
}

/// Longest piece of an offending line a warning carries.
pub(super) const WARNING_LINE_MAX: usize = 512;

/// Builds a run's chunks and keeps the bookkeeping every adapter shares:
/// RUN_STARTED first, nothing after the terminal chunk, open messages and
/// tool calls ended before it.
pub(super) struct Emitter {
    /// The harness's name, for CUSTOM names and error messages.
    pub(super) harness: &'static str,
    pub(super) f: ChunkFactory,
    pub(super) ids: RunScopedIds,
    pub(super) out: Vec<Chunk>,
    pub(super) started: bool,
    pub(super) terminal: bool,
    /// Started and not yet ended: (START type, id), oldest first.
    pub(super) open: Vec<(ChunkType, String)>,
    /// The latest text message, the parent of tool calls that follow it.
    pub(super) last_text_id: String,
}

impl Emitter {
    pub(super) fn new(
        harness: &'static str,
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

    pub(super) fn ensure_started(&mut self) {
        if !self.started {
            self.started = true;
            let c = self.f.run_started();
            self.out.push(c);
        }
    }

    pub(super) fn new_id(&mut self) -> String {
        self.ids.next_id()
    }

    /// Emits `c` and tracks what it opens and closes.
    pub(super) fn push(&mut self, c: Chunk) {
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

    pub(super) fn forget(&mut self, start: ChunkType, id: &str) {
        if let Some(i) = self.open.iter().position(|(t, x)| *t == start && x == id) {
            self.open.remove(i);
        }
    }

    /// Ends everything still open, newest first.
    pub(super) fn close_all(&mut self) {
        while let Some((ty, id)) = self.open.pop() {
            let end = match ty {
                ChunkType::TextMessageStart => self.f.text_end(&id),
                ChunkType::ReasoningStart => self.f.reasoning_end(&id),
                _ => self.f.tool_call_end(&id),
            };
            self.out.push(end);
        }
    }

    pub(super) fn start_text(&mut self) -> String {
        let id = self.new_id();
        self.push(self.f.text_start(&id));
        id
    }

    /// The text message open in `slot`, started (and kept there) when none is.
    pub(super) fn open_text(&mut self, slot: &mut Option<String>) -> String {
        if let Some(id) = slot {
            return id.clone();
        }
        let id = self.start_text();
        *slot = Some(id.clone());
        id
    }

    pub(super) fn start_reasoning(&mut self) -> String {
        let id = self.new_id();
        self.push(self.f.reasoning_start(&id));
        id
    }

    /// A whole text message; nothing for empty text.
    pub(super) fn text_message(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let id = self.start_text();
        self.push(self.f.text_content(&id, text));
        self.push(self.f.text_end(&id));
    }

    /// A whole reasoning message; nothing for empty text.
    pub(super) fn reasoning_message(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let id = self.start_reasoning();
        self.push(self.f.reasoning_content(&id, text));
        self.push(self.f.reasoning_end(&id));
    }

    pub(super) fn start_tool(&mut self, name: &str) -> String {
        let id = self.new_id();
        let parent = self.last_text_id.clone();
        self.push(self.f.tool_call_start(&id, name, &parent));
        id
    }

    /// START, ARGS (the whole arguments as JSON text) and END of a call.
    pub(super) fn tool_call(&mut self, name: &str, args: &Value) -> String {
        let id = self.start_tool(name);
        self.push(self.f.tool_call_args(&id, &args.to_string()));
        self.push(self.f.tool_call_end(&id));
        id
    }

    pub(super) fn warning(&mut self, message: &str, line: Option<&[u8]>) {
        let snippet = line.map(|l| {
            let l = &l[..l.len().min(WARNING_LINE_MAX)];
            String::from_utf8_lossy(l).into_owned()
        });
        self.push(self.f.warning(message, snippet.as_deref()));
    }

    pub(super) fn session_id(&mut self, session_id: &str) {
        let name = chunk::session_id_name(self.harness);
        self.push(self.f.custom(&name, &serde_json::json!({ "session_id": session_id })));
    }

    /// The session id, unless one was already reported (`seen`) or it is
    /// empty.
    pub(super) fn first_session_id(&mut self, seen: &mut bool, session_id: &str) {
        if !*seen && !session_id.is_empty() {
            *seen = true;
            self.session_id(session_id);
        }
    }

    /// The terminal chunk decided by the exit code: RUN_FINISHED for 0,
    /// RUN_ERROR otherwise with the CLI's last error or the stderr tail.
    pub(super) fn finish_from_exit(
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
        let mut message = format!("{} exited with code {exit_code}", self.harness);
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
pub(super) fn parse_object(line: &[u8]) -> Result<Option<serde_json::Map<String, Value>>, &'static str> {
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

/// A JSON harness's journal line as an event: `None` for a blank line, and
/// for one that is not a JSON object (said in a warning).
pub(super) fn parse_event(em: &mut Emitter, line: &[u8]) -> Option<Value> {
    match parse_object(line) {
        Ok(Some(e)) => Some(Value::Object(e)),
        Ok(None) => None,
        Err(why) => {
            em.warning(why, Some(line));
            None
        }
    }
}

/// Common finish reasons: the CLIs' words mapped onto `stop`, `length`,
/// `tool_calls`, `content_filter`; anything else kept (dashes as
/// underscores).
pub(super) fn finish_reason(raw: &str) -> String {
    match raw {
        "" | "end_turn" | "stop" | "stop_sequence" | "completed" => "stop".into(),
        "max_tokens" | "length" | "max_turns" => "length".into(),
        "tool_use" | "tool-calls" | "tool_calls" => "tool_calls".into(),
        "refusal" | "content-filter" | "content_filter" => "content_filter".into(),
        other => other.replace('-', "_"),
    }
}

pub(super) fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

pub(super) fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Sums `b` into `a` (costs too, when either knows one).
pub(super) fn add_usage(a: &mut Option<Usage>, b: &Usage) {
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
pub(super) fn result_text(v: &Value) -> String {
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
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::harness::Harness;

    #[test]
    fn terminal_closes_what_is_open_and_ends_the_run() {
        let mut t = Harness::Command.translator(&RunId::parse("r").unwrap(), "t", || 0);
        let first: Vec<_> = t.feed(br#"{"type":"REASONING_START","message_id":"x"}"#).collect();
        assert_eq!(types(&first), ["RUN_STARTED", "REASONING_START"]);
        let end = t.finish(1, "boom");
        assert_eq!(types(&end), ["REASONING_END", "RUN_ERROR"]);
        assert_eq!(end[0].message_id, "x");
        assert!(t.is_terminal());
        assert!(t.feed(b"more").next().is_none());
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
            "init",
            "message",
            "tool_result",
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
                        "role",
                        "tool_id",
                        "session_id",
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
