//! Reading the usage a model answer carries, as its bytes pass through the
//! broker: Anthropic Messages (`usage` in the message, or in its
//! `message_start` and cumulative `message_delta` stream events), OpenAI
//! Responses (`usage` of the response, or of its `response.completed`
//! event; Chat Completions' `prompt_tokens` too) and Gemini
//! (`usageMetadata` of each answer or stream chunk, the last one counting).
//! JSON bodies and server-sent events alike; the broker asks upstreams for
//! unencoded answers, so an encoded one is not read (and said so). The
//! shape of each answer says whose it is, not the route or the header the
//! request chose: a request cannot have its answer read as another API's.

use http::HeaderMap;
use http::header;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The most of a JSON answer (or of one stream event) held to be read:
/// larger ones pass unread.
pub const MAX_HELD: usize = 32 * 1024 * 1024;

/// Whose API an answer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Anthropic,
    OpenAi,
    Gemini,
}

impl Api {
    /// The API a route's requests speak: by its harness, else by the auth
    /// header the request carries the key in (`x-api-key`: Anthropic's,
    /// `authorization`: OpenAI's, `x-goog-api-key`: Gemini's). Used for the
    /// shape of the broker's own answers.
    pub fn of(label: &str, headers: &HeaderMap) -> Option<Self> {
        match label {
            "claude-code" | "opencode" => return Some(Self::Anthropic),
            "codex" => return Some(Self::OpenAi),
            "gemini" => return Some(Self::Gemini),
            _ => {}
        }
        if headers.contains_key("x-api-key") {
            Some(Self::Anthropic)
        } else if headers.contains_key("x-goog-api-key") {
            Some(Self::Gemini)
        } else if headers.contains_key(header::AUTHORIZATION) {
            Some(Self::OpenAi)
        } else {
            None
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::Gemini => "gemini",
        }
    }
}

/// The tokens of one model answer. `input_tokens` is the uncached input:
/// cache reads and writes are apart, and all three are input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Input tokens, cached ones included.
    pub fn input_side(&self) -> u64 {
        self.input_tokens.saturating_add(self.cache_read_tokens).saturating_add(self.cache_write_tokens)
    }
}

/// Reads one answer's usage from its body as it passes.
#[derive(Debug)]
pub struct Meter {
    sse: bool,
    held: Vec<u8>,
    /// SSE: the data lines of the event being read.
    data: Vec<u8>,
    /// Held past [`MAX_HELD`]: the rest is not read.
    overflowed: bool,
    usage: Option<Usage>,
    /// Whose shape the usage was read in.
    api: Option<Api>,
    done: bool,
}

impl Meter {
    /// A meter for an answer whose `content-type` is this.
    pub fn new(content_type: &str) -> Self {
        Self {
            sse: content_type.trim_start().to_ascii_lowercase().starts_with("text/event-stream"),
            held: Vec::new(),
            data: Vec::new(),
            overflowed: false,
            usage: None,
            api: None,
            done: false,
        }
    }

    /// Whether the answer's final usage is known (its last event was read).
    pub fn done(&self) -> bool {
        self.done
    }

    /// Read the next bytes of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.overflowed || self.done {
            return;
        }
        self.held.extend_from_slice(bytes);
        if self.sse {
            self.lines();
        }
        if self.held.len() + self.data.len() > MAX_HELD {
            tracing::warn!("egress broker: a model answer too large to read its usage");
            self.overflowed = true;
            self.held = Vec::new();
            self.data = Vec::new();
        }
    }

    /// The usage the answer carried, and whose API it read it as, once its
    /// body ended (or was cut off): `None` when it carried none.
    pub fn finish(mut self) -> Option<(Api, Usage)> {
        if !self.overflowed && !self.done {
            if self.sse {
                self.held.push(b'\n');
                self.lines();
                self.dispatch();
            } else if let Ok(value) = serde_json::from_slice::<Value>(&self.held) {
                match value {
                    // Gemini's stream without `alt=sse`: an array of chunks.
                    Value::Array(items) => items.iter().for_each(|v| self.event(v)),
                    v => self.event(&v),
                }
            }
        }
        Some((self.api?, self.usage?))
    }

    /// SSE: take the complete lines held; a blank one ends an event.
    fn lines(&mut self) {
        let mut start = 0;
        while let Some(n) = memchr::memchr(b'\n', &self.held[start..]) {
            let line = &self.held[start..start + n];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            start += n + 1;
            if line.is_empty() {
                self.dispatch();
            } else if let Some(data) = line.strip_prefix(b"data:") {
                let data = data.strip_prefix(b" ").unwrap_or(data);
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(data);
            }
        }
        self.held.drain(..start);
    }

    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        if let Ok(value) = serde_json::from_slice::<Value>(&data) {
            self.event(&value);
        }
    }

    /// One JSON answer, or one stream event, read as the API whose shape
    /// it has.
    fn event(&mut self, v: &Value) {
        let kind = v["type"].as_str().unwrap_or_default();
        if kind.starts_with("message") {
            self.anthropic(v);
        } else if v.get("usageMetadata").is_some() {
            self.gemini(v);
        } else if kind.starts_with("response.") || v.get("usage").is_some() {
            self.openai(v);
        }
    }

    fn anthropic(&mut self, v: &Value) {
        match v["type"].as_str() {
            Some("message") => self.anthropic_usage(&v["model"], &v["usage"]),
            Some("message_start") => self.anthropic_usage(&v["message"]["model"], &v["message"]["usage"]),
            // Cumulative: the fields it carries replace the start's.
            Some("message_delta") => self.anthropic_usage(&Value::Null, &v["usage"]),
            Some("message_stop") => self.done = self.usage.is_some(),
            _ => {}
        }
    }

    fn anthropic_usage(&mut self, model: &Value, usage: &Value) {
        if !usage.is_object() {
            return;
        }
        self.api = Some(Api::Anthropic);
        let u = self.usage.get_or_insert_with(Usage::default);
        if let Some(m) = model.as_str() {
            u.model = m.to_string();
        }
        let set = |field: &mut u64, name: &str| {
            if let Some(n) = usage[name].as_u64() {
                *field = n;
            }
        };
        set(&mut u.input_tokens, "input_tokens");
        set(&mut u.output_tokens, "output_tokens");
        set(&mut u.cache_read_tokens, "cache_read_input_tokens");
        set(&mut u.cache_write_tokens, "cache_creation_input_tokens");
    }

    fn openai(&mut self, v: &Value) {
        let response = match v["type"].as_str() {
            Some("response.completed" | "response.incomplete" | "response.failed" | "response.done") => {
                self.done = true;
                &v["response"]
            }
            Some(_) if v.get("response").is_some() => &v["response"],
            _ => v,
        };
        let usage = &response["usage"];
        if !usage.is_object() {
            return;
        }
        let n = |path: &[&str]| path.iter().fold(usage, |v, k| &v[*k]).as_u64();
        // Responses (`input_tokens`), else Chat Completions (`prompt_tokens`);
        // either counts cached input within the input.
        let input = n(&["input_tokens"]).or(n(&["prompt_tokens"])).unwrap_or(0);
        let cached = n(&["input_tokens_details", "cached_tokens"])
            .or(n(&["prompt_tokens_details", "cached_tokens"]))
            .unwrap_or(0)
            .min(input);
        let output = n(&["output_tokens"]).or(n(&["completion_tokens"])).unwrap_or(0);
        let model = response["model"].as_str().map(str::to_string);
        self.api = Some(Api::OpenAi);
        let u = self.usage.get_or_insert_with(Usage::default);
        if let Some(m) = model {
            u.model = m;
        }
        u.input_tokens = input - cached;
        u.cache_read_tokens = cached;
        u.output_tokens = output;
    }

    fn gemini(&mut self, v: &Value) {
        let usage = &v["usageMetadata"];
        if !usage.is_object() {
            return;
        }
        let n = |k: &str| usage[k].as_u64().unwrap_or(0);
        // Each chunk's counts are the answer's so far: the last one counts.
        let prompt = n("promptTokenCount");
        let cached = n("cachedContentTokenCount").min(prompt);
        self.api = Some(Api::Gemini);
        let u = self.usage.get_or_insert_with(Usage::default);
        if let Some(m) = v["modelVersion"].as_str() {
            u.model = m.to_string();
        }
        u.input_tokens = prompt - cached;
        u.cache_read_tokens = cached;
        u.output_tokens = n("candidatesTokenCount").saturating_add(n("thoughtsTokenCount"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The usage of `body` fed in pieces of `step` bytes.
    fn meter(content_type: &str, body: &str, step: usize) -> (Option<Usage>, bool) {
        let (api, usage) = metered(content_type, body, step);
        (usage, api.1)
    }

    /// Whose API the answer was read as, whether it was done before its
    /// end, and its usage.
    fn metered(content_type: &str, body: &str, step: usize) -> ((Option<Api>, bool), Option<Usage>) {
        let mut m = Meter::new(content_type);
        for piece in body.as_bytes().chunks(step) {
            m.feed(piece);
        }
        let done = m.done();
        match m.finish() {
            Some((api, usage)) => ((Some(api), done), Some(usage)),
            None => ((None, done), None),
        }
    }

    fn usage(model: &str, input: u64, output: u64, read: u64, write: u64) -> Option<Usage> {
        Some(Usage {
            model: model.into(),
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: read,
            cache_write_tokens: write,
        })
    }

    #[test]
    fn anthropic_json_and_stream() {
        let json = r#"{"id":"msg_1","type":"message","model":"claude-x","content":[],
            "usage":{"input_tokens":12,"output_tokens":7,"cache_creation_input_tokens":3,"cache_read_input_tokens":5}}"#;
        assert_eq!(
            metered("application/json", json, 5),
            ((Some(Api::Anthropic), false), usage("claude-x", 12, 7, 5, 3))
        );
        let sse = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\
            \"usage\":{\"input_tokens\":12,\"output_tokens\":1,\"cache_creation_input_tokens\":3,\
            \"cache_read_input_tokens\":5}}}\r\n\r\n\
            event: ping\ndata: {\"type\":\"ping\"}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"usage\"}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n\
            event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        for step in [1, 7, 64, 4096] {
            assert_eq!(meter("text/event-stream", sse, step), (usage("claude-x", 12, 7, 5, 3), true));
        }
        // Cut off before its end: what was read so far.
        let cut = &sse[..sse.find("event: message_delta").unwrap()];
        assert_eq!(meter("text/event-stream", cut, 3), (usage("claude-x", 12, 1, 5, 3), false));
        // No usage at all, or an error.
        let error = r#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#;
        assert_eq!(meter("application/json", error, 9).0, None);
    }

    #[test]
    fn openai_responses_json_and_stream() {
        let json = r#"{"id":"resp_1","object":"response","model":"gpt-x","output":[],
            "usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":5},"output_tokens":7,"total_tokens":19}}"#;
        assert_eq!(
            metered("application/json", json, 4),
            ((Some(Api::OpenAi), false), usage("gpt-x", 7, 7, 5, 0))
        );
        let sse = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"gpt-x\",\"usage\":null}}\n\n\
            event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n\
            event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-x\",\
            \"usage\":{\"input_tokens\":12,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":7}}}\n\n";
        for step in [1, 13, 4096] {
            assert_eq!(
                meter("text/event-stream; charset=utf-8", sse, step),
                (usage("gpt-x", 12, 7, 0, 0), true)
            );
        }
        let chat = r#"{"model":"gpt-y","usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert_eq!(meter("application/json", chat, 100).0, usage("gpt-y", 6, 2, 4, 0));
    }

    #[test]
    fn gemini_json_and_stream() {
        let chunk = |prompt: u64, out: u64| {
            format!(
                r#"{{"candidates":[],"usageMetadata":{{"promptTokenCount":{prompt},"candidatesTokenCount":{out},"cachedContentTokenCount":2,"thoughtsTokenCount":1}},"modelVersion":"gemini-x"}}"#
            )
        };
        assert_eq!(
            metered("application/json", &chunk(12, 6), 3),
            ((Some(Api::Gemini), false), usage("gemini-x", 10, 7, 2, 0))
        );
        let sse = format!("data: {}\r\n\r\ndata: {}\r\n\r\n", chunk(12, 2), chunk(12, 6));
        assert_eq!(meter("text/event-stream", &sse, 11).0, usage("gemini-x", 10, 7, 2, 0));
        // Without alt=sse: one JSON array of the chunks.
        let array = format!("[{},\n{}]", chunk(12, 2), chunk(12, 6));
        assert_eq!(meter("application/json", &array, 8).0, usage("gemini-x", 10, 7, 2, 0));
    }

    #[test]
    fn the_api_is_the_auth_header_and_the_input_side_counts_the_cache() {
        let mut h = HeaderMap::new();
        h.insert("x-goog-api-key", "k".parse().unwrap());
        assert_eq!(Api::of("", &h), Some(Api::Gemini));
        assert_eq!(Api::of("codex", &h), Some(Api::OpenAi));
        h.clear();
        h.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        assert_eq!(Api::of("", &h), Some(Api::OpenAi));
        assert_eq!(Api::of("claude-code", &h), Some(Api::Anthropic));
        h.insert("x-api-key", "k".parse().unwrap());
        assert_eq!(Api::of("", &h), Some(Api::Anthropic));
        assert_eq!(usage("m", 12, 7, 5, 3).unwrap().input_side(), 20);
    }
}
