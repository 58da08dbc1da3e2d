//! The chunk model every harness translates into: constructors around the
//! generated [`Chunk`], the well-known CUSTOM names, run-scoped ids, the JSON
//! line shape a `command` harness may print, and fingerprints for replay
//! alignment.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::ids::RunId;
pub use crate::proto::v1::{Chunk, ChunkRequest, ChunkType, Usage};

/// First chunk of a fresh durable run, appended by the server.
pub const RUN_ACCEPTED: &str = "run.accepted";
/// A file event while the run is active: `{type, path, timestamp}`.
pub const SANDBOX_FILE: &str = "sandbox.file";
/// The workspace's git diff after the run: `{path, diff}`.
pub const FILE_CHANGED: &str = "file.changed";
/// Something the run goes on past: `{message, line?}`.
pub const HARNESS_WARNING: &str = "harness.warning";
/// A connection through the sandbox's egress (model broker or proxy):
/// `{host, port, purpose, allowed, error?, bytes_sent, bytes_received,
/// duration_ms}`.
pub const SANDBOX_NETWORK: &str = "sandbox.network";
/// What the sandbox's egress refused during the run, once at its end (when
/// anything was): `{blocked: [{host, port, count}], other}` (`other`:
/// refusals past the destinations listed).
pub const NETWORK_BLOCKED: &str = "network.blocked";
/// One change of the sandbox's live network rules (`UpdateNetworkPolicy`)
/// during the run, or before it (at the driver's first look): `{version,
/// changed_by, changed_at_ms, change: {allow_hosts, deny_hosts, reset},
/// allow_hosts?, deny_hosts?, missed?}`; the live lists it left on the
/// latest change recorded at once; `missed`: older changes no longer kept.
pub const NETWORK_POLICY: &str = "network.policy";
/// The run's model upstream could not be reached: `{upstream, error,
/// unreachable_ms}`.
pub const MODEL_UNAVAILABLE: &str = "model.unavailable";
/// Suffix of `<harness>.session-id`: `{session_id}`.
pub const SESSION_ID_SUFFIX: &str = ".session-id";
/// An ACP agent's plan: `{entries}`.
pub const ACP_PLAN: &str = "acp.plan";
/// A permission an ACP agent asked and the bridge's answer: `{toolCall,
/// optionId, allowed}`.
pub const ACP_PERMISSION: &str = "acp.permission";
/// Codex's todo list: `{items}`.
pub const CODEX_TODO_LIST: &str = "codex.todo_list";
/// One line the run's command wrote to stderr, masked: `{line, offset}`,
/// `offset` the byte just past it in the run's stderr (where a successor
/// resumes). Appended by the server in the order the agent read it
/// relative to stdout; never part of a replay.
pub const RUN_STDERR: &str = "run.stderr";

/// One model answer's usage, as the run's model broker read it: `{seq,
/// api, model, input_tokens, output_tokens, cache_read_tokens,
/// cache_write_tokens}`, `seq` its number in the run's usage records (where
/// a successor resumes); `input_tokens` is the uncached input. Appended by
/// the server as the broker records them; never part of a replay.
pub const MODEL_USAGE: &str = "model.usage";
/// The run's model usage reached its budget: `{limit, max, used}`. The
/// broker refuses further model requests; the run ends BUDGET_EXCEEDED.
pub const BUDGET_EXCEEDED: &str = "budget.exceeded";

/// Every CUSTOM name the system emits (the server's and the translators'),
/// besides each harness's `<harness>.session-id`. A new one belongs here.
pub const SYSTEM_NAMES: &[&str] = &[
    RUN_ACCEPTED,
    SANDBOX_FILE,
    FILE_CHANGED,
    HARNESS_WARNING,
    SANDBOX_NETWORK,
    NETWORK_BLOCKED,
    NETWORK_POLICY,
    MODEL_UNAVAILABLE,
    ACP_PLAN,
    ACP_PERMISSION,
    CODEX_TODO_LIST,
    RUN_STDERR,
    MODEL_USAGE,
    BUDGET_EXCEEDED,
];

/// The CUSTOM name carrying `harness`'s resumable session id.
pub fn session_id_name(harness: &str) -> String {
    format!("{harness}{SESSION_ID_SUFFIX}")
}

/// Whether only the system may emit a CUSTOM chunk named `name`: one of
/// [`SYSTEM_NAMES`], any other name in one of their namespaces (the part
/// before the first `.`, so `model.usage` is as reserved as
/// `model.unavailable`), or a `<harness>.session-id`. Case and surrounding
/// space do not matter. Clients and the server believe what these say (a
/// connection, a file change, an unreachable model, the session a thread
/// resumes), so what a run prints may not use them.
pub fn is_reserved_name(name: &str) -> bool {
    fn namespace(name: &str) -> Option<&str> {
        name.split_once('.').map(|(ns, _)| ns)
    }
    let name = name.trim().to_ascii_lowercase();
    name.ends_with(SESSION_ID_SUFFIX)
        || namespace(&name).is_some_and(|ns| SYSTEM_NAMES.iter().any(|s| namespace(s) == Some(ns)))
}

/// Mints `<run_id>-0`, `<run_id>-1`, ...: no clock, no randomness, so a
/// re-translation of the same journal mints the same ids.
#[derive(Debug, Clone)]
pub struct RunScopedIds {
    run_id: RunId,
    next: u64,
}

impl RunScopedIds {
    pub fn new(run_id: RunId) -> Self {
        Self { run_id, next: 0 }
    }

    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    pub fn next_id(&mut self) -> String {
        let id = self.run_id.scoped(self.next);
        self.next += 1;
        id
    }
}

/// Builds chunks of one run: every chunk carries the run and thread ids and
/// a timestamp from the given clock.
pub struct ChunkFactory {
    run_id: String,
    thread_id: String,
    clock: Box<dyn Fn() -> i64 + Send + Sync>,
}

impl std::fmt::Debug for ChunkFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkFactory")
            .field("run_id", &self.run_id)
            .field("thread_id", &self.thread_id)
            .finish()
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl ChunkFactory {
    pub fn new(run_id: &RunId, thread_id: &str, clock: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        Self { run_id: run_id.as_str().to_owned(), thread_id: thread_id.to_owned(), clock: Box::new(clock) }
    }

    /// A chunk of `ty` with the run's ids and a fresh timestamp; the caller
    /// fills the type's fields.
    pub fn chunk(&self, ty: ChunkType) -> Chunk {
        let mut c = Chunk { r#type: ty as i32, ..Default::default() };
        self.stamp(&mut c);
        c
    }

    /// Makes `c` this run's, now: its run and thread ids and a fresh
    /// timestamp (a chunk read from elsewhere speaks for this run only).
    pub fn stamp(&self, c: &mut Chunk) {
        c.run_id.clone_from(&self.run_id);
        c.thread_id.clone_from(&self.thread_id);
        c.timestamp_ms = (self.clock)();
    }

    pub fn run_started(&self) -> Chunk {
        self.chunk(ChunkType::RunStarted)
    }

    pub fn text_start(&self, message_id: &str) -> Chunk {
        Chunk { message_id: message_id.to_owned(), ..self.chunk(ChunkType::TextMessageStart) }
    }

    pub fn text_content(&self, message_id: &str, delta: &str) -> Chunk {
        Chunk {
            message_id: message_id.to_owned(),
            delta: delta.to_owned(),
            ..self.chunk(ChunkType::TextMessageContent)
        }
    }

    pub fn text_end(&self, message_id: &str) -> Chunk {
        Chunk { message_id: message_id.to_owned(), ..self.chunk(ChunkType::TextMessageEnd) }
    }

    pub fn reasoning_start(&self, message_id: &str) -> Chunk {
        Chunk { message_id: message_id.to_owned(), ..self.chunk(ChunkType::ReasoningStart) }
    }

    pub fn reasoning_content(&self, message_id: &str, delta: &str) -> Chunk {
        Chunk {
            message_id: message_id.to_owned(),
            delta: delta.to_owned(),
            ..self.chunk(ChunkType::ReasoningContent)
        }
    }

    pub fn reasoning_end(&self, message_id: &str) -> Chunk {
        Chunk { message_id: message_id.to_owned(), ..self.chunk(ChunkType::ReasoningEnd) }
    }

    pub fn tool_call_start(&self, tool_call_id: &str, tool_name: &str, parent_message_id: &str) -> Chunk {
        Chunk {
            tool_call_id: tool_call_id.to_owned(),
            tool_name: tool_name.to_owned(),
            parent_message_id: parent_message_id.to_owned(),
            ..self.chunk(ChunkType::ToolCallStart)
        }
    }

    pub fn tool_call_args(&self, tool_call_id: &str, delta: &str) -> Chunk {
        Chunk {
            tool_call_id: tool_call_id.to_owned(),
            delta: delta.to_owned(),
            ..self.chunk(ChunkType::ToolCallArgs)
        }
    }

    pub fn tool_call_end(&self, tool_call_id: &str) -> Chunk {
        Chunk { tool_call_id: tool_call_id.to_owned(), ..self.chunk(ChunkType::ToolCallEnd) }
    }

    pub fn tool_call_result(
        &self,
        tool_call_id: &str,
        content: &str,
        is_error: bool,
        exit_code: Option<i32>,
    ) -> Chunk {
        Chunk {
            tool_call_id: tool_call_id.to_owned(),
            content: content.to_owned(),
            is_error,
            exit_code,
            ..self.chunk(ChunkType::ToolCallResult)
        }
    }

    pub fn run_finished(&self, finish_reason: &str, usage: Option<Usage>) -> Chunk {
        Chunk { finish_reason: finish_reason.to_owned(), usage, ..self.chunk(ChunkType::RunFinished) }
    }

    pub fn run_error(&self, message: &str, code: &str) -> Chunk {
        Chunk {
            error_message: message.to_owned(),
            error_code: code.to_owned(),
            ..self.chunk(ChunkType::RunError)
        }
    }

    pub fn custom(&self, name: &str, value: &Value) -> Chunk {
        Chunk { name: name.to_owned(), value_json: value.to_string(), ..self.chunk(ChunkType::Custom) }
    }

    /// A [`RUN_STDERR`] chunk.
    pub fn stderr_line(&self, line: &str, offset: u64) -> Chunk {
        self.custom(RUN_STDERR, &serde_json::json!({"line": line, "offset": offset}))
    }

    pub fn warning(&self, message: &str, line: Option<&str>) -> Chunk {
        let mut value = Map::new();
        value.insert("message".into(), Value::String(message.to_owned()));
        if let Some(line) = line {
            value.insert("line".into(), Value::String(line.to_owned()));
        }
        self.custom(HARNESS_WARNING, &Value::Object(value))
    }
}

/// The stderr offset a [`RUN_STDERR`] chunk ends at; `None` for any other
/// chunk.
pub fn stderr_offset(chunk: &Chunk) -> Option<u64> {
    if chunk.r#type() != ChunkType::Custom || chunk.name != RUN_STDERR {
        return None;
    }
    serde_json::from_str::<Value>(&chunk.value_json).ok()?.get("offset")?.as_u64()
}

/// The `seq` of a `model.usage` chunk; `None` for any other chunk.
pub fn usage_seq(chunk: &Chunk) -> Option<u64> {
    if chunk.r#type() != ChunkType::Custom || chunk.name != MODEL_USAGE {
        return None;
    }
    serde_json::from_str::<Value>(&chunk.value_json).ok()?.get("seq")?.as_u64()
}

/// True for RUN_FINISHED and RUN_ERROR.
pub fn is_terminal(chunk: &Chunk) -> bool {
    matches!(chunk.r#type(), ChunkType::RunFinished | ChunkType::RunError)
}

/// The name of a chunk type as it appears in JSON lines: `TEXT_MESSAGE_CONTENT`.
pub fn type_name(ty: ChunkType) -> &'static str {
    ty.as_str_name().strip_prefix("CHUNK_TYPE_").unwrap_or("UNSPECIFIED")
}

/// Parses a chunk type name, with or without its `CHUNK_TYPE_` prefix.
/// `UNSPECIFIED` is not a chunk type.
pub fn parse_type_name(name: &str) -> Option<ChunkType> {
    const PREFIX: &str = "CHUNK_TYPE_";
    // Read for every line a command prints: the prefixed name is put
    // together on the stack (no type's name is near 64 bytes).
    let mut full = [0u8; 64];
    let full = if name.starts_with(PREFIX) {
        name
    } else {
        let len = PREFIX.len() + name.len();
        let full = full.get_mut(..len)?;
        full[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
        full[PREFIX.len()..].copy_from_slice(name.as_bytes());
        std::str::from_utf8(full).ok()?
    };
    ChunkType::from_str_name(full).filter(|t| *t != ChunkType::Unspecified)
}

/// The JSON line shape of a chunk, for a `command` harness's stdout and for
/// display: `{"type":"TEXT_MESSAGE_CONTENT","message_id":"m1","delta":"hi"}`.
/// Keys are the proto field names (snake_case) with `timestamp_ms` omitted;
/// CUSTOM carries `name` and `value` (any JSON value, not a string); `usage`
/// is an object with the `Usage` field names. Empty fields are left out.
pub fn to_json(chunk: &Chunk) -> Value {
    serde_json::to_value(JsonChunk { chunk, line: None }).expect("a chunk's JSON shape serializes")
}

/// A chunk in [`to_json`]'s shape, serialized as it is written (no map
/// built first): what `sandhold run --output json` prints for every chunk.
/// With [`Self::line`] it is a CLI line: the shape plus the chunk's
/// `offset`, its `timestamp_ms`, and `"stream": "stderr"` on a line of the
/// command's stderr. Keys come in the order [`to_json`]'s map keeps them
/// (sorted), so a line reads the same either way.
pub struct JsonChunk<'a> {
    chunk: &'a Chunk,
    /// A CLI line's offset.
    line: Option<&'a str>,
}

impl<'a> JsonChunk<'a> {
    /// The chunk as a CLI line at `offset`.
    pub fn line(offset: &'a str, chunk: &'a Chunk) -> Self {
        Self { chunk, line: Some(offset) }
    }
}

impl serde::Serialize for JsonChunk<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let c = self.chunk;
        let mut m = serializer.serialize_map(None)?;
        let text = |m: &mut S::SerializeMap, key: &str, v: &str| match v.is_empty() {
            true => Ok(()),
            false => m.serialize_entry(key, v),
        };
        // In sorted order, as a map of them would be.
        text(&mut m, "content", &c.content)?;
        text(&mut m, "delta", &c.delta)?;
        text(&mut m, "error_code", &c.error_code)?;
        text(&mut m, "error_message", &c.error_message)?;
        if let Some(code) = c.exit_code {
            m.serialize_entry("exit_code", &code)?;
        }
        text(&mut m, "finish_reason", &c.finish_reason)?;
        if c.is_error {
            m.serialize_entry("is_error", &true)?;
        }
        text(&mut m, "message_id", &c.message_id)?;
        text(&mut m, "name", &c.name)?;
        if let Some(offset) = self.line {
            m.serialize_entry("offset", offset)?;
        }
        text(&mut m, "parent_message_id", &c.parent_message_id)?;
        if let Some(r) = &c.request {
            m.serialize_entry("request", &request_to_json(r))?;
        }
        text(&mut m, "run_id", &c.run_id)?;
        if self.line.is_some() && stderr_offset(c).is_some() {
            m.serialize_entry("stream", "stderr")?;
        }
        text(&mut m, "thread_id", &c.thread_id)?;
        if self.line.is_some() {
            m.serialize_entry("timestamp_ms", &c.timestamp_ms)?;
        }
        text(&mut m, "tool_call_id", &c.tool_call_id)?;
        text(&mut m, "tool_name", &c.tool_name)?;
        m.serialize_entry("type", type_name(c.r#type()))?;
        if let Some(u) = &c.usage {
            m.serialize_entry("usage", &usage_to_json(u))?;
        }
        if c.r#type() == ChunkType::Custom {
            let value = serde_json::from_str(&c.value_json).unwrap_or(Value::Null);
            m.serialize_entry("value", &value)?;
        }
        m.end()
    }
}

/// The JSON shape of a chunk's request: its fields, empty ones left out,
/// the input as a JSON value (`input`), not text.
pub fn request_to_json(r: &ChunkRequest) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: &str| {
        if !v.is_empty() {
            m.insert(k.into(), Value::String(v.to_owned()));
        }
    };
    put("request_id", &r.request_id);
    put("kind", &r.kind);
    put("rule", &r.rule);
    put("answered_by", &r.answered_by);
    put("scope", &r.scope);
    if !r.input_json.is_empty() {
        let input = serde_json::from_str(&r.input_json).unwrap_or(Value::String(r.input_json.clone()));
        m.insert("input".into(), input);
    }
    if r.deadline_ms != 0 {
        m.insert("deadline_ms".into(), r.deadline_ms.into());
    }
    if !r.answered_by.is_empty() {
        m.insert("allowed".into(), Value::Bool(r.allowed));
    }
    if r.awaiting_client {
        m.insert("awaiting_client".into(), Value::Bool(true));
    }
    Value::Object(m)
}

fn request_from_json(value: &Value) -> Option<ChunkRequest> {
    let o = value.as_object()?;
    let s = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    Some(ChunkRequest {
        request_id: s("request_id"),
        kind: s("kind"),
        rule: s("rule"),
        deadline_ms: o.get("deadline_ms").and_then(Value::as_i64).unwrap_or(0),
        input_json: o.get("input").map(|v| v.to_string()).unwrap_or_default(),
        allowed: o.get("allowed").and_then(Value::as_bool).unwrap_or(false),
        answered_by: s("answered_by"),
        awaiting_client: o.get("awaiting_client").and_then(Value::as_bool).unwrap_or(false),
        scope: s("scope"),
    })
}

/// The JSON shape of token usage, as in a chunk's `usage` and a run
/// record's: every counter, and `cost_usd` when known.
pub fn usage_to_json(u: &Usage) -> Value {
    let mut um = Map::new();
    um.insert("input_tokens".into(), u.input_tokens.into());
    um.insert("output_tokens".into(), u.output_tokens.into());
    um.insert("cache_read_tokens".into(), u.cache_read_tokens.into());
    um.insert("cache_write_tokens".into(), u.cache_write_tokens.into());
    um.insert("reasoning_tokens".into(), u.reasoning_tokens.into());
    if let Some(c) = u.cost_usd.and_then(serde_json::Number::from_f64) {
        um.insert("cost_usd".into(), Value::Number(c));
    }
    Value::Object(um)
}

/// Reads [`usage_to_json`]'s shape; `None` unless `value` is an object.
/// Missing or mistyped counters read as 0.
pub fn usage_from_json(value: &Value) -> Option<Usage> {
    let o = value.as_object()?;
    let n = |k: &str| o.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        cache_read_tokens: n("cache_read_tokens"),
        cache_write_tokens: n("cache_write_tokens"),
        reasoning_tokens: n("reasoning_tokens"),
        cost_usd: o.get("cost_usd").and_then(Value::as_f64),
    })
}

/// Reads a line in the JSON shape of [`to_json`]. `None` unless the line
/// is a JSON object whose `type` names a chunk type; fields of the wrong
/// JSON type are ignored (skipped without recursion, however deep), and of
/// a key given twice the last counts. `name` and `value` are read for
/// CUSTOM only. `run_id`, `thread_id` and the timestamp are left for the
/// caller to set ([`ChunkFactory::stamp`]: a command cannot speak for
/// another run).
///
/// Read straight into the chunk, as a `command` harness reads every line
/// its command prints: no `Value` (a map with its keys) built first. Boxed
/// from the start: a chunk is some 550 bytes inline, and the reading and
/// the translation after it would otherwise copy it at every hand-off.
pub fn from_json_line(line: &[u8]) -> Option<Box<Chunk>> {
    let read: JsonLine = serde_json::from_slice(line).ok()?;
    let ty = parse_type_name(read.ty.as_deref()?)?;
    let mut c = read.chunk;
    c.r#type = ty as i32;
    if ty == ChunkType::Custom {
        c.value_json = read.value.unwrap_or(Value::Null).to_string();
    } else {
        c.name.clear();
    }
    Some(c)
}

/// What [`from_json_line`] reads: the fields as they came, the type and
/// CUSTOM's value still to judge.
struct JsonLine {
    ty: Option<String>,
    value: Option<Value>,
    chunk: Box<Chunk>,
}

impl<'de> serde::Deserialize<'de> for JsonLine {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(JsonLineVisitor)
    }
}

struct JsonLineVisitor;

impl<'de> serde::de::Visitor<'de> for JsonLineVisitor {
    type Value = JsonLine;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a chunk as a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<JsonLine, A::Error> {
        let mut read = JsonLine { ty: None, value: None, chunk: Box::default() };
        let c = &mut read.chunk;
        while let Some(key) = map.next_key::<Key>()? {
            let scalar = |map: &mut A| map.next_value::<Scalar>();
            let text = |map: &mut A| Ok::<_, A::Error>(scalar(map)?.text().unwrap_or_default());
            match key {
                Key::Type => read.ty = scalar(&mut map)?.text(),
                Key::MessageId => c.message_id = text(&mut map)?,
                Key::ParentMessageId => c.parent_message_id = text(&mut map)?,
                Key::ToolCallId => c.tool_call_id = text(&mut map)?,
                Key::ToolName => c.tool_name = text(&mut map)?,
                Key::Delta => c.delta = text(&mut map)?,
                Key::Content => c.content = text(&mut map)?,
                Key::FinishReason => c.finish_reason = text(&mut map)?,
                Key::ErrorMessage => c.error_message = text(&mut map)?,
                Key::ErrorCode => c.error_code = text(&mut map)?,
                Key::Name => c.name = text(&mut map)?,
                Key::IsError => c.is_error = matches!(scalar(&mut map)?, Scalar::Bool(true)),
                Key::ExitCode => {
                    c.exit_code = match scalar(&mut map)? {
                        Scalar::Int(code) => i32::try_from(code).ok(),
                        _ => None,
                    };
                }
                Key::Usage => c.usage = usage_from_json(&map.next_value::<Value>()?),
                Key::Request => c.request = request_from_json(&map.next_value::<Value>()?),
                Key::Value => read.value = Some(map.next_value()?),
                Key::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(read)
    }
}

/// The keys [`from_json_line`] reads; any other is skipped.
enum Key {
    Type,
    MessageId,
    ParentMessageId,
    ToolCallId,
    ToolName,
    Delta,
    Content,
    IsError,
    ExitCode,
    FinishReason,
    Usage,
    ErrorMessage,
    ErrorCode,
    Name,
    Value,
    Request,
    Other,
}

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl serde::de::Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "type" => Key::Type,
                    "message_id" => Key::MessageId,
                    "parent_message_id" => Key::ParentMessageId,
                    "tool_call_id" => Key::ToolCallId,
                    "tool_name" => Key::ToolName,
                    "delta" => Key::Delta,
                    "content" => Key::Content,
                    "is_error" => Key::IsError,
                    "exit_code" => Key::ExitCode,
                    "finish_reason" => Key::FinishReason,
                    "usage" => Key::Usage,
                    "error_message" => Key::ErrorMessage,
                    "error_code" => Key::ErrorCode,
                    "name" => Key::Name,
                    "value" => Key::Value,
                    "request" => Key::Request,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

/// A field's value as far as the shape reads it: a string, a bool, an
/// integer within `i64`, or anything else (skipped whole, without
/// recursion), as `Value::as_str`, `as_bool` and `as_i64` read one.
enum Scalar {
    Str(String),
    Bool(bool),
    Int(i64),
    Other,
}

impl Scalar {
    fn text(self) -> Option<String> {
        match self {
            Scalar::Str(text) => Some(text),
            _ => None,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> serde::de::Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_owned()))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }

    /// Past `i64::MAX` it is no `i64` (as `Value::as_i64` says).
    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(i64::try_from(v).map_or(Scalar::Other, Scalar::Int))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }

    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
}

/// Version tag of the canonical encoding; part of every fingerprint, so a
/// change of the encoding can never silently match an old fingerprint.
const FINGERPRINT_DOMAIN: &[u8] = b"sandhold/chunk-fingerprint/v1\0";

/// SHA-256 over the canonical encoding of every field but `timestamp_ms`.
///
/// Why not the prost encoding: protobuf bytes are not canonical (default
/// values are omitted, so "unset" and "empty" collide for optional fields
/// only by accident of the schema; field order and unknown fields are not
/// pinned), and CUSTOM values are JSON text whose key order is arbitrary.
///
/// The encoding, in this order: the domain tag; `type` as 4 bytes big-endian;
/// then each of run_id, thread_id, message_id, parent_message_id,
/// tool_call_id, tool_name, delta, content as a length-prefixed string (8
/// bytes big-endian length, then UTF-8); is_error as one byte; exit_code as a
/// presence byte then 4 bytes; finish_reason; usage as a presence byte then
/// its five counts (8 bytes each) and cost as a presence byte then the IEEE
/// bits (8 bytes); error_message; error_code; name; and value_json: a byte 1
/// then the canonical JSON (object keys sorted by their UTF-8 bytes, no
/// whitespace, numbers as serde_json prints them) when it parses, else a byte
/// 0 then the raw text. Then, only when the chunk has a request (so that
/// chunks from before requests keep their fingerprints): a byte 1, its
/// request_id, kind, rule, deadline_ms (8 bytes), input_json (canonical like
/// value_json), allowed (one byte), answered_by and awaiting_client (one
/// byte).
pub fn fingerprint(chunk: &Chunk) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(FINGERPRINT_DOMAIN);
    h.update(chunk.r#type.to_be_bytes());
    let str_field = |h: &mut Sha256, s: &str| {
        h.update((s.len() as u64).to_be_bytes());
        h.update(s.as_bytes());
    };
    for s in [
        &chunk.run_id,
        &chunk.thread_id,
        &chunk.message_id,
        &chunk.parent_message_id,
        &chunk.tool_call_id,
        &chunk.tool_name,
        &chunk.delta,
        &chunk.content,
    ] {
        str_field(&mut h, s);
    }
    h.update([u8::from(chunk.is_error)]);
    match chunk.exit_code {
        Some(c) => {
            h.update([1]);
            h.update(c.to_be_bytes());
        }
        None => h.update([0]),
    }
    str_field(&mut h, &chunk.finish_reason);
    match &chunk.usage {
        Some(u) => {
            h.update([1]);
            for n in [
                u.input_tokens,
                u.output_tokens,
                u.cache_read_tokens,
                u.cache_write_tokens,
                u.reasoning_tokens,
            ] {
                h.update(n.to_be_bytes());
            }
            match u.cost_usd {
                Some(c) => {
                    h.update([1]);
                    h.update(c.to_bits().to_be_bytes());
                }
                None => h.update([0]),
            }
        }
        None => h.update([0]),
    }
    str_field(&mut h, &chunk.error_message);
    str_field(&mut h, &chunk.error_code);
    str_field(&mut h, &chunk.name);
    match serde_json::from_str::<Value>(&chunk.value_json) {
        Ok(v) => {
            h.update([1]);
            let mut canon = String::new();
            canonical_json(&v, &mut canon);
            str_field(&mut h, &canon);
        }
        Err(_) => {
            h.update([0]);
            str_field(&mut h, &chunk.value_json);
        }
    }
    if let Some(r) = &chunk.request {
        h.update([1]);
        str_field(&mut h, &r.request_id);
        str_field(&mut h, &r.kind);
        str_field(&mut h, &r.rule);
        h.update(r.deadline_ms.to_be_bytes());
        match serde_json::from_str::<Value>(&r.input_json) {
            Ok(v) => {
                let mut canon = String::new();
                canonical_json(&v, &mut canon);
                str_field(&mut h, &canon);
            }
            Err(_) => str_field(&mut h, &r.input_json),
        }
        h.update([u8::from(r.allowed)]);
        str_field(&mut h, &r.answered_by);
        h.update([u8::from(r.awaiting_client)]);
    }
    h.finalize().into()
}

/// [`fingerprint`] as 64 lowercase hex characters, for logs and errors.
pub fn fingerprint_hex(chunk: &Chunk) -> String {
    hex::encode(fingerprint(chunk))
}

/// Writes `v` with object keys sorted, independent of how the map type of
/// `serde_json` orders them (the `preserve_order` feature may be on through
/// some other crate).
fn canonical_json(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Chunk {
        Chunk {
            r#type: ChunkType::Custom as i32,
            run_id: "r".into(),
            thread_id: "t".into(),
            timestamp_ms: 1,
            message_id: "m".into(),
            parent_message_id: "p".into(),
            tool_call_id: "c".into(),
            tool_name: "n".into(),
            delta: "d".into(),
            content: "x".into(),
            is_error: false,
            exit_code: Some(0),
            finish_reason: "stop".into(),
            usage: Some(Usage {
                input_tokens: 1,
                output_tokens: 2,
                cache_read_tokens: 3,
                cache_write_tokens: 4,
                reasoning_tokens: 5,
                cost_usd: Some(0.5),
            }),
            error_message: "e".into(),
            error_code: "k".into(),
            name: "custom".into(),
            value_json: r#"{"a":1,"b":[true,null]}"#.into(),
            request: Some(ChunkRequest {
                request_id: "r1".into(),
                kind: "permission".into(),
                rule: "ask command:*".into(),
                deadline_ms: 7,
                input_json: r#"{"a":1}"#.into(),
                allowed: true,
                answered_by: "client".into(),
                awaiting_client: true,
                scope: "run".into(),
            }),
        }
    }

    #[test]
    fn usage_round_trips_through_its_json_shape() {
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 20,
            cache_read_tokens: 3,
            cache_write_tokens: 4,
            reasoning_tokens: 5,
            cost_usd: Some(0.25),
        };
        assert_eq!(usage_from_json(&usage_to_json(&usage)), Some(usage));
        assert_eq!(usage_from_json(&serde_json::json!("not usage")), None);
    }

    #[test]
    fn type_names_are_read_with_or_without_their_prefix_and_nothing_else() {
        let types: Vec<ChunkType> = (1..).map_while(|i| ChunkType::try_from(i).ok()).collect();
        assert_eq!(types.len(), 16, "every type of events.proto");
        for ty in types {
            assert_eq!(parse_type_name(type_name(ty)), Some(ty));
            assert_eq!(parse_type_name(ty.as_str_name()), Some(ty));
        }
        let long = "TEXT_MESSAGE_CONTENT".repeat(4);
        for name in
            ["", "UNSPECIFIED", "CHUNK_TYPE_UNSPECIFIED", "CHUNK_TYPE_", "text_message_content", &long]
        {
            assert_eq!(parse_type_name(name), None, "{name:?}");
        }
        assert_eq!(parse_type_name("CHUNK_TYPE_CHUNK_TYPE_RUN_STARTED"), None, "the prefix once");
    }

    #[test]
    fn the_systems_names_and_their_namespaces_are_reserved() {
        for name in SYSTEM_NAMES {
            assert!(is_reserved_name(name), "{name}");
        }
        for name in [
            "model.usage",
            "Sandbox.Network",
            " sandbox.network ",
            "run.finished",
            "acp.anything",
            "claude-code.session-id",
            "command.session-id",
            &session_id_name("gemini"),
        ] {
            assert!(is_reserved_name(name), "{name}");
        }
        for name in ["progress", "build.step", "usage", "sandboxed.thing", "my.session", ""] {
            assert!(!is_reserved_name(name), "{name}");
        }
    }

    #[test]
    fn run_scoped_ids_count_from_zero() {
        let mut ids = RunScopedIds::new(RunId::parse("run-7").unwrap());
        assert_eq!([ids.next_id(), ids.next_id(), ids.next_id()], ["run-7-0", "run-7-1", "run-7-2"]);
    }

    #[test]
    fn timestamp_is_not_fingerprinted() {
        let a = full();
        let b = Chunk { timestamp_ms: 999_999, ..full() };
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint_hex(&a).len(), 64);
    }

    #[test]
    fn json_key_order_is_not_fingerprinted_but_values_are() {
        let a = full();
        let b = Chunk { value_json: r#"{ "b": [true, null], "a": 1 }"#.into(), ..full() };
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let c = Chunk { value_json: r#"{"a":2,"b":[true,null]}"#.into(), ..full() };
        assert_ne!(fingerprint(&a), fingerprint(&c));
        let d = Chunk { value_json: r#"{"b":[null,true],"a":1}"#.into(), ..full() };
        assert_ne!(fingerprint(&a), fingerprint(&d));
    }

    #[test]
    fn every_other_field_is_fingerprinted() {
        type Mutate = fn(&mut Chunk);
        let mutations: Vec<(&str, Mutate)> = vec![
            ("type", |c| c.r#type = ChunkType::RunError as i32),
            ("run_id", |c| c.run_id.push('x')),
            ("thread_id", |c| c.thread_id.push('x')),
            ("message_id", |c| c.message_id.push('x')),
            ("parent_message_id", |c| c.parent_message_id.push('x')),
            ("tool_call_id", |c| c.tool_call_id.push('x')),
            ("tool_name", |c| c.tool_name.push('x')),
            ("delta", |c| c.delta.push('x')),
            ("content", |c| c.content.push('x')),
            ("is_error", |c| c.is_error = true),
            ("exit_code value", |c| c.exit_code = Some(1)),
            ("exit_code presence", |c| c.exit_code = None),
            ("finish_reason", |c| c.finish_reason.push('x')),
            ("usage presence", |c| c.usage = None),
            ("usage zeroed", |c| c.usage = Some(Usage::default())),
            ("input_tokens", |c| c.usage.as_mut().unwrap().input_tokens += 1),
            ("output_tokens", |c| c.usage.as_mut().unwrap().output_tokens += 1),
            ("cache_read_tokens", |c| c.usage.as_mut().unwrap().cache_read_tokens += 1),
            ("cache_write_tokens", |c| c.usage.as_mut().unwrap().cache_write_tokens += 1),
            ("reasoning_tokens", |c| c.usage.as_mut().unwrap().reasoning_tokens += 1),
            ("cost value", |c| c.usage.as_mut().unwrap().cost_usd = Some(0.25)),
            ("cost presence", |c| c.usage.as_mut().unwrap().cost_usd = None),
            ("error_message", |c| c.error_message.push('x')),
            ("error_code", |c| c.error_code.push('x')),
            ("name", |c| c.name.push('x')),
            ("value_json", |c| c.value_json = "[]".into()),
            ("value_json unparsable", |c| c.value_json = "{".into()),
            ("request presence", |c| c.request = None),
            ("request_id", |c| c.request.as_mut().unwrap().request_id.push('x')),
            ("kind", |c| c.request.as_mut().unwrap().kind.push('x')),
            ("rule", |c| c.request.as_mut().unwrap().rule.push('x')),
            ("deadline_ms", |c| c.request.as_mut().unwrap().deadline_ms += 1),
            ("input_json", |c| c.request.as_mut().unwrap().input_json = r#"{"a":2}"#.into()),
            ("allowed", |c| c.request.as_mut().unwrap().allowed = false),
            ("answered_by", |c| c.request.as_mut().unwrap().answered_by.push('x')),
            ("awaiting_client", |c| c.request.as_mut().unwrap().awaiting_client = false),
        ];
        let base = fingerprint(&full());
        let mut seen = std::collections::HashSet::new();
        for (what, mutate) in mutations {
            let mut c = full();
            mutate(&mut c);
            let fp = fingerprint(&c);
            assert_ne!(fp, base, "changing {what} must change the fingerprint");
            assert!(seen.insert(fp), "{what} collides with another mutation");
        }
    }

    #[test]
    fn length_prefixes_keep_adjacent_strings_apart() {
        let a = Chunk { run_id: "ab".into(), thread_id: "c".into(), ..Default::default() };
        let b = Chunk { run_id: "a".into(), thread_id: "bc".into(), ..Default::default() };
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn json_shape_round_trips() {
        let mut c = full();
        c.run_id.clear();
        c.thread_id.clear();
        c.timestamp_ms = 0;
        let back = from_json_line(to_json(&c).to_string().as_bytes()).unwrap();
        assert_eq!(*back, c);
        let line = |text: &str| from_json_line(text.as_bytes());
        let text = line(r#"{"type": "TEXT_MESSAGE_CONTENT", "delta": "hi"}"#).unwrap();
        assert_eq!(text.r#type(), ChunkType::TextMessageContent);
        assert_eq!(text.delta, "hi");
        assert!(line(r#"{"type": "NOPE"}"#).is_none());
        assert!(line(r#"{"type": "UNSPECIFIED"}"#).is_none());
        assert!(line(r#"["TEXT_MESSAGE_CONTENT"]"#).is_none());
    }

    /// What a command may print, read as the JSON it is: mistyped fields
    /// ignored (skipped whole, however nested), the last of a key given
    /// twice, CUSTOM's name and value for CUSTOM only, anything that is
    /// not one JSON object no chunk.
    #[test]
    fn json_lines_are_read_leniently_and_only_whole() {
        let line = |text: &str| from_json_line(text.as_bytes());
        let c = line(
            r#"{"delta": 5, "message_id": {"a": [1, {"b": "c"}]}, "content": ["x"], "tool_name": null,
                "unknown": {"deep": [[[]]]}, "is_error": "yes", "exit_code": 1.0, "type": "TOOL_CALL_RESULT",
                "tool_call_id": "t\u0031\n", "name": "not custom", "value": {"v": 1}}"#,
        )
        .unwrap();
        assert_eq!(c.r#type(), ChunkType::ToolCallResult);
        assert_eq!((c.delta.as_str(), c.message_id.as_str(), c.content.as_str()), ("", "", ""));
        assert_eq!(c.tool_call_id, "t1\n");
        assert!(!c.is_error && c.exit_code.is_none());
        assert_eq!((c.name.as_str(), c.value_json.as_str()), ("", ""), "name and value are CUSTOM's");

        let c = line(r#"{"type": "TEXT_MESSAGE_CONTENT", "delta": "first", "delta": "second"}"#).unwrap();
        assert_eq!(c.delta, "second");
        let c = line(r#"{"type": "TEXT_MESSAGE_CONTENT", "delta": "first", "delta": 2}"#).unwrap();
        assert_eq!(c.delta, "", "the last one counts, even mistyped");
        assert!(line(r#"{"type": "TEXT_MESSAGE_CONTENT", "type": 1}"#).is_none());

        let c = line(r#"{"exit_code": -3, "is_error": true, "type": "TOOL_CALL_RESULT"}"#).unwrap();
        assert_eq!((c.exit_code, c.is_error), (Some(-3), true));
        for big in ["2147483648", "9223372036854775808", "-2147483649"] {
            let c = line(&format!(r#"{{"type": "TOOL_CALL_RESULT", "exit_code": {big}}}"#)).unwrap();
            assert_eq!(c.exit_code, None, "{big} is no exit code");
        }

        let c = line(r#"{"value": {"b": 1, "a": [true]}, "name": "build.step", "type": "CUSTOM"}"#).unwrap();
        assert_eq!((c.name.as_str(), c.value_json.as_str()), ("build.step", r#"{"a":[true],"b":1}"#));
        let c = line(r#"{"type": "CUSTOM", "name": "progress"}"#).unwrap();
        assert_eq!(c.value_json, "null");
        let c = line(r#"{"type": "RUN_FINISHED", "usage": {"input_tokens": 3, "cost_usd": 0.5}}"#).unwrap();
        assert_eq!(c.usage.as_ref().map(|u| (u.input_tokens, u.cost_usd)), Some((3, Some(0.5))));
        assert!(line(r#"{"type": "RUN_FINISHED", "usage": [3]}"#).unwrap().usage.is_none());

        for not_one in [
            r#"{"type": "TEXT_MESSAGE_CONTENT", "delta": "hi"} trailing"#,
            r#"{"type": "TEXT_MESSAGE_CONTENT", "delta": "hi""#,
            r#"{"type": "TEXT_MESSAGE_CONTENT", "delta": "hi",}"#,
            r#"{"delta": "hi"}"#,
            r#""TEXT_MESSAGE_CONTENT""#,
            "",
        ] {
            assert!(line(not_one).is_none(), "{not_one}");
        }
        // A value skipped is skipped without recursion, however deep (a
        // `Value` stopped at 128 levels and took the line for text).
        let deep = format!(r#"{{"type": "TOOL_CALL_END", "x": {}{}}}"#, "[".repeat(200), "]".repeat(200));
        assert_eq!(line(&deep).map(|c| c.r#type()), Some(ChunkType::ToolCallEnd));
        let deep = format!(r#"{{"type": "CUSTOM", "value": {}{}}}"#, "[".repeat(200), "]".repeat(200));
        assert!(line(&deep).is_none(), "a CUSTOM value is read whole, within serde_json's limit");
    }

    /// How lines were read before [`from_json_line`]: into a `Value`, then
    /// field by field. The oracle the typed reader is held to.
    fn read_through_a_value(line: &str) -> Option<Chunk> {
        let value: Value = serde_json::from_str(line).ok()?;
        let obj = value.as_object()?;
        let ty = parse_type_name(obj.get("type")?.as_str()?)?;
        let s = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let custom = ty == ChunkType::Custom;
        Some(Chunk {
            r#type: ty as i32,
            message_id: s("message_id"),
            parent_message_id: s("parent_message_id"),
            tool_call_id: s("tool_call_id"),
            tool_name: s("tool_name"),
            delta: s("delta"),
            content: s("content"),
            is_error: obj.get("is_error").and_then(Value::as_bool).unwrap_or(false),
            exit_code: obj.get("exit_code").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok()),
            finish_reason: s("finish_reason"),
            usage: obj.get("usage").and_then(usage_from_json),
            error_message: s("error_message"),
            error_code: s("error_code"),
            name: if custom { s("name") } else { String::new() },
            value_json: if custom {
                obj.get("value").unwrap_or(&Value::Null).to_string()
            } else {
                String::new()
            },
            request: obj.get("request").and_then(request_from_json),
            ..Default::default()
        })
    }

    /// Any JSON value, as text: scalars of every kind (numbers past `i32`
    /// and `i64`, floats, escapes), and arrays and objects of them.
    fn any_json() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            1 => Just("null".to_string()),
            1 => any::<bool>().prop_map(|b| b.to_string()),
            2 => (-5i64..300).prop_map(|n| n.to_string()),
            1 => any::<i64>().prop_map(|n| n.to_string()),
            1 => any::<u64>().prop_map(|n| n.to_string()),
            1 => (-1e6f64..1e6).prop_map(|f| format!("{f:?}")),
            4 => "[a-z\\\"é]{0,6}".prop_map(|t| serde_json::to_string(&t).unwrap()),
            1 => Just(r#""\u0041\n""#.to_string()),
            1 => prop::sample::select(vec!["TEXT_MESSAGE_CONTENT", "CUSTOM", "RUN_FINISHED", "CHUNK_TYPE_TOOL_CALL_RESULT"])
                .prop_map(|t| format!("\"{t}\"")),
        ];
        let nested = leaf.clone().prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                proptest::collection::vec(("[a-z_]{1,4}", inner), 0..4).prop_map(|entries| {
                    let entries: Vec<String> = entries.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", entries.join(","))
                }),
            ]
        });
        prop_oneof![4 => leaf, 1 => nested]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
        /// Objects with the shape's keys (some twice, some mistyped) and
        /// others, of any values: the typed reader reads each as reading
        /// it through a `Value` did.
        #[test]
        fn json_lines_read_as_through_a_value(
            first in proptest::option::weighted(
                0.8,
                proptest::sample::select(vec!["TEXT_MESSAGE_CONTENT", "CUSTOM", "TOOL_CALL_RESULT", "RUN_FINISHED"]),
            ),
            entries in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "type", "message_id", "parent_message_id", "tool_call_id", "tool_name", "delta",
                        "content", "is_error", "exit_code", "finish_reason", "usage", "error_message",
                        "error_code", "name", "value", "request", "other",
                    ]),
                    any_json(),
                ),
                0..10,
            ),
        ) {
            let typed = first.map(|t| format!("\"type\": \"{t}\""));
            let body: Vec<String> =
                typed.into_iter().chain(entries.iter().map(|(k, v)| format!("\"{k}\": {v}"))).collect();
            let line = format!("{{{}}}", body.join(", "));
            proptest::prop_assert_eq!(from_json_line(line.as_bytes()).map(|c| *c), read_through_a_value(&line), "{}", line);
        }
    }

    #[test]
    fn a_json_line_is_the_shape_plus_its_place_written_in_sorted_order() {
        let c = Chunk { is_error: true, ..full() };
        let text = serde_json::to_string(&JsonChunk::line("42", &c)).unwrap();
        let line: Value = serde_json::from_str(&text).unwrap();
        let mut expected = to_json(&c);
        expected["offset"] = "42".into();
        expected["timestamp_ms"] = c.timestamp_ms.into();
        assert_eq!(line, expected);
        assert_eq!(line["is_error"], true);
        assert_eq!(line["value"], serde_json::json!({"a": 1, "b": [true, null]}), "a value, not its text");
        // Written as the map writes it: every key, in the map's order.
        assert_eq!(text, line.to_string());
        assert!(line.get("stream").is_none());
        let plain = serde_json::to_string(&to_json(&c)).unwrap();
        assert!(!plain.contains("offset") && !plain.contains("timestamp_ms"), "{plain}");

        let f = ChunkFactory::new(&RunId::parse("r1").unwrap(), "t1", || 7);
        let stderr: Value = serde_json::to_value(JsonChunk::line("3", &f.stderr_line("warn", 5))).unwrap();
        assert_eq!(stderr["stream"], "stderr");
        assert_eq!(stderr["name"], RUN_STDERR);
        assert_eq!(stderr["value"], serde_json::json!({"line": "warn", "offset": 5}));
        let text = serde_json::to_string(&JsonChunk::line("4", &f.text_content("m", "out"))).unwrap();
        assert_eq!(
            text,
            r#"{"delta":"out","message_id":"m","offset":"4","run_id":"r1","thread_id":"t1","timestamp_ms":7,"type":"TEXT_MESSAGE_CONTENT"}"#
        );
    }

    #[test]
    fn factory_stamps_run_thread_and_clock() {
        let f = ChunkFactory::new(&RunId::parse("r1").unwrap(), "t1", || 42);
        let c = f.text_content("r1-0", "hello");
        assert_eq!((c.run_id.as_str(), c.thread_id.as_str(), c.timestamp_ms), ("r1", "t1", 42));
        assert_eq!(c.r#type(), ChunkType::TextMessageContent);
        let w = f.warning("bad", Some("{"));
        assert_eq!(w.name, HARNESS_WARNING);
        let v: Value = serde_json::from_str(&w.value_json).unwrap();
        assert_eq!(v, serde_json::json!({"message": "bad", "line": "{"}));
        assert!(is_terminal(&f.run_error("x", "y")) && !is_terminal(&w));
    }
}
