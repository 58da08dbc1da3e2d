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
        Chunk {
            r#type: ty as i32,
            run_id: self.run_id.clone(),
            thread_id: self.thread_id.clone(),
            timestamp_ms: (self.clock)(),
            ..Default::default()
        }
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
    let full = if name.starts_with("CHUNK_TYPE_") { name.to_owned() } else { format!("CHUNK_TYPE_{name}") };
    ChunkType::from_str_name(&full).filter(|t| *t != ChunkType::Unspecified)
}

/// The JSON line shape of a chunk, for a `command` harness's stdout and for
/// display: `{"type":"TEXT_MESSAGE_CONTENT","message_id":"m1","delta":"hi"}`.
/// Keys are the proto field names (snake_case) with `timestamp_ms` omitted;
/// CUSTOM carries `name` and `value` (any JSON value, not a string); `usage`
/// is an object with the `Usage` field names. Empty fields are left out.
pub fn to_json(chunk: &Chunk) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), Value::String(type_name(chunk.r#type()).to_owned()));
    let mut put = |k: &str, v: &str| {
        if !v.is_empty() {
            m.insert(k.into(), Value::String(v.to_owned()));
        }
    };
    put("run_id", &chunk.run_id);
    put("thread_id", &chunk.thread_id);
    put("message_id", &chunk.message_id);
    put("parent_message_id", &chunk.parent_message_id);
    put("tool_call_id", &chunk.tool_call_id);
    put("tool_name", &chunk.tool_name);
    put("delta", &chunk.delta);
    put("content", &chunk.content);
    put("finish_reason", &chunk.finish_reason);
    put("error_message", &chunk.error_message);
    put("error_code", &chunk.error_code);
    put("name", &chunk.name);
    if chunk.is_error {
        m.insert("is_error".into(), Value::Bool(true));
    }
    if let Some(code) = chunk.exit_code {
        m.insert("exit_code".into(), code.into());
    }
    if let Some(u) = &chunk.usage {
        m.insert("usage".into(), usage_to_json(u));
    }
    if chunk.r#type() == ChunkType::Custom {
        let value = serde_json::from_str(&chunk.value_json).unwrap_or(Value::Null);
        m.insert("value".into(), value);
    }
    if let Some(r) = &chunk.request {
        m.insert("request".into(), request_to_json(r));
    }
    Value::Object(m)
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

/// Reads the JSON line shape of [`to_json`]. `None` unless `value` is an
/// object whose `type` names a chunk type; fields of the wrong JSON type are
/// ignored. `run_id`, `thread_id` and the timestamp are left for the caller
/// to set (a command cannot speak for another run).
pub fn from_json(value: &Value) -> Option<Chunk> {
    let obj = value.as_object()?;
    let ty = parse_type_name(obj.get("type")?.as_str()?)?;
    let s = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let usage = obj.get("usage").and_then(usage_from_json);
    let (name, value_json) = if ty == ChunkType::Custom {
        (s("name"), obj.get("value").unwrap_or(&Value::Null).to_string())
    } else {
        (String::new(), String::new())
    };
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
        usage,
        error_message: s("error_message"),
        error_code: s("error_code"),
        name,
        value_json,
        request: obj.get("request").and_then(request_from_json),
        ..Default::default()
    })
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
        let back = from_json(&to_json(&c)).unwrap();
        assert_eq!(back, c);
        let text = from_json(&serde_json::json!({"type": "TEXT_MESSAGE_CONTENT", "delta": "hi"})).unwrap();
        assert_eq!(text.r#type(), ChunkType::TextMessageContent);
        assert_eq!(text.delta, "hi");
        assert!(from_json(&serde_json::json!({"type": "NOPE"})).is_none());
        assert!(from_json(&serde_json::json!({"type": "UNSPECIFIED"})).is_none());
        assert!(from_json(&serde_json::json!(["TEXT_MESSAGE_CONTENT"])).is_none());
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
