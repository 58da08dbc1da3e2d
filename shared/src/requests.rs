//! Durable requests: what a harness asks its client (a permission, a call of
//! a client tool) and the answer, as records in the run's journal.
//!
//! The sandbox agent appends each request and each answer to the run's
//! journal as a sealed line, `{"__sandhold":<record>,"__mac":"<64 hex>"}`,
//! where the MAC is HMAC-SHA256 under the run's sentinel key over
//! `"sandhold/request/v1:" + run_id + ":" + <record as written>`. The command
//! cannot forge one (it never sees the key). Reads hand a verified record on
//! as a line with `sealed` set and the record alone as its data; a line that
//! only looks sealed is an ordinary line. Because the records are in the
//! journal, a replay after a takeover reproduces their chunks in place.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::ids::RunId;

const PREFIX: &[u8] = br#"{"__sandhold":"#;
const MAC_FIELD: &[u8] = br#","__mac":""#;
const MAC_HEX: usize = 64;
const DOMAIN: &str = "sandhold/request/v1:";

/// What is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// May the harness make this tool call?
    Permission,
    /// A call of a tool the client declared: the client runs it.
    ClientTool,
    /// May a process of the sandbox open this connection (a `network.ask`
    /// rule)? The input is `{host, port, method, path}`.
    Network,
}

impl RequestKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::Permission => "permission",
            RequestKind::ClientTool => "client_tool",
            RequestKind::Network => "network",
        }
    }
}

/// Who answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnsweredBy {
    /// A client, through `RunService.RespondToRequest`.
    Client,
    /// Nobody answered before the deadline: denied.
    Deadline,
    /// The run was cancelled: denied.
    Cancel,
}

impl AnsweredBy {
    pub fn as_str(self) -> &'static str {
        match self {
            AnsweredBy::Client => "client",
            AnsweredBy::Deadline => "deadline",
            AnsweredBy::Cancel => "cancel",
        }
    }
}

/// A request, as the asking process writes it and the journal records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Unique within the run: `[A-Za-z0-9_-]{1,64}`.
    pub request_id: String,
    pub kind: RequestKind,
    /// The tool the harness wants to call (a client tool: its declared
    /// name).
    pub tool: String,
    /// The tool's input (any JSON).
    #[serde(default)]
    pub input: Value,
    /// The CLI's own id of the tool call, when it gives one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool_call_id: String,
    /// What asked: the policy rule's text (`"ask command:git *"`, `"default"`);
    /// empty for client tools.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rule: String,
    /// When it is denied unless answered, milliseconds since the Unix epoch.
    pub deadline_ms: i64,
}

/// An answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub request_id: String,
    /// Permission: allowed or not. Client tool: false when `is_error`.
    pub allowed: bool,
    /// Permission: a message for the harness (why it was denied). Client
    /// tool: the result text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Client tool: the result is an error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// Permission: allow this tool for the rest of the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub always: bool,
    /// Network: what an allow covers, `once` (empty), `run` or `thread`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    pub by: AnsweredBy,
}

/// One sealed journal record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    Request(Request),
    Answer(Answer),
}

/// True for a request id the agent accepts.
pub fn valid_request_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn mac(key: &[u8], run_id: &RunId, record: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("hmac accepts any key length");
    mac.update(DOMAIN.as_bytes());
    mac.update(run_id.as_str().as_bytes());
    mac.update(b":");
    mac.update(record);
    mac
}

/// The journal line (with its newline) that records `record`.
pub fn seal(key: &[u8], run_id: &RunId, record: &Record) -> Vec<u8> {
    let body = serde_json::to_vec(record).expect("records serialize");
    let tag = hex::encode(mac(key, run_id, &body).finalize().into_bytes());
    let mut line = Vec::with_capacity(PREFIX.len() + body.len() + MAC_FIELD.len() + MAC_HEX + 3);
    line.extend_from_slice(PREFIX);
    line.extend_from_slice(&body);
    line.extend_from_slice(MAC_FIELD);
    line.extend_from_slice(tag.as_bytes());
    line.extend_from_slice(b"\"}\n");
    line
}

/// True when `line` has the shape of a sealed line (cheap; no MAC check).
pub fn looks_sealed(line: &[u8]) -> bool {
    line.starts_with(PREFIX)
}

/// The record bytes of a sealed line (without newline) whose MAC holds
/// under `key`; None for any other line.
pub fn open<'a>(key: &[u8], run_id: &RunId, line: &'a [u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(PREFIX)?;
    let tail_len = MAC_FIELD.len() + MAC_HEX + 2;
    if rest.len() < tail_len || !rest.ends_with(b"\"}") {
        return None;
    }
    let (body, tail) = rest.split_at(rest.len() - tail_len);
    let tag_hex = tail.strip_prefix(MAC_FIELD)?.strip_suffix(b"\"}")?;
    let tag = hex::decode(tag_hex).ok()?;
    let expected = mac(key, run_id, body).finalize().into_bytes();
    bool::from(expected.as_slice().ct_eq(&tag)).then_some(body)
}

/// A value that proves knowledge of a run's key without revealing it: the
/// agent keeps it beside a run's requests, so a call with another key is
/// refused instead of sealing records no reader could open.
pub fn key_check(key: &[u8], run_id: &RunId) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("hmac accepts any key length");
    mac.update(b"sandhold/request-key-check/v1:");
    mac.update(run_id.as_str().as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Parse the record bytes [`open`] returned.
pub fn parse(record: &[u8]) -> Option<Record> {
    serde_json::from_slice(record).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run() -> RunId {
        RunId::parse("run-1").unwrap()
    }

    fn request() -> Record {
        Record::Request(Request {
            request_id: "r1".into(),
            kind: RequestKind::Permission,
            tool: "Bash".into(),
            input: json!({"command": "echo hi > f"}),
            tool_call_id: "toolu_1".into(),
            rule: "ask command:*".into(),
            deadline_ms: 1_700_000_000_000,
        })
    }

    #[test]
    fn a_sealed_line_opens_under_its_key_and_run_only() {
        let line = seal(b"key", &run(), &request());
        assert!(line.ends_with(b"\n"));
        let line = &line[..line.len() - 1];
        assert!(looks_sealed(line));
        let body = open(b"key", &run(), line).expect("opens");
        assert_eq!(parse(body), Some(request()));
        assert_eq!(open(b"other", &run(), line), None);
        assert_eq!(open(b"key", &RunId::parse("run-2").unwrap(), line), None);
    }

    #[test]
    fn a_forged_or_altered_line_does_not_open() {
        let line = seal(b"key", &run(), &request());
        let text = String::from_utf8(line[..line.len() - 1].to_vec()).unwrap();
        let altered = text.replace("echo hi", "echo HI");
        assert_eq!(open(b"key", &run(), altered.as_bytes()), None);
        let forged = r#"{"__sandhold":{"record":"answer","request_id":"r1","allowed":true,"by":"client"},"__mac":"0000000000000000000000000000000000000000000000000000000000000000"}"#;
        assert_eq!(open(b"key", &run(), forged.as_bytes()), None);
        assert_eq!(open(b"key", &run(), b"{\"__sandhold\":"), None);
        assert_eq!(open(b"key", &run(), b"{\"type\":\"result\"}"), None);
    }

    #[test]
    fn answers_round_trip_and_ids_are_checked() {
        let answer = Record::Answer(Answer {
            request_id: "r1".into(),
            allowed: false,
            message: "no".into(),
            is_error: false,
            always: false,
            scope: String::new(),
            by: AnsweredBy::Deadline,
        });
        let line = seal(b"k", &run(), &answer);
        assert_eq!(parse(open(b"k", &run(), &line[..line.len() - 1]).unwrap()), Some(answer));
        assert!(valid_request_id("req_0-A"));
        assert!(!valid_request_id(""));
        assert!(!valid_request_id("../x"));
        assert!(!valid_request_id(&"a".repeat(65)));
    }

    #[test]
    fn key_checks_differ_by_key_and_run() {
        assert_eq!(key_check(b"k", &run()), key_check(b"k", &run()));
        assert_ne!(key_check(b"k", &run()), key_check(b"j", &run()));
        assert_ne!(key_check(b"k", &run()), key_check(b"k", &RunId::parse("run-2").unwrap()));
    }
}
