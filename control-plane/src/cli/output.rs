//! Output of the client commands: `human` (for people) or `json` (one JSON
//! object per line on stdout, for scripts; every line is described by
//! `docs/schema/cli-output.schema.json`). Protobuf messages print in the
//! proto3 JSON mapping with the proto field names (`run_id`), as `grpcurl`
//! shows them but for enum values, which are the words the human output
//! uses ([`enum_word`]); chunks print in the shape of
//! [`shared::chunk::to_json`] with their `offset`.

use std::io::Write;
use std::sync::LazyLock;

use prost_reflect::{
    DescriptorPool, DynamicMessage, EnumDescriptor, Kind, MessageDescriptor, SerializeOptions,
};
use serde_json::{Value, json};
use shared::error::Error;

pub use super::format::OutputFormat;

/// The `sandhold.v1` descriptors, for printing and parsing messages as JSON.
pub static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(shared::PUBLIC_DESCRIPTOR_SET).expect("the built-in descriptor set decodes")
});

/// A `sandhold.v1` message as proto3 JSON (proto field names, 64-bit
/// integers as numbers, default values left out), its enum values spelled
/// as [`enum_word`] says.
pub fn message_json<M: prost::Message>(message: &M, name: &str) -> Value {
    let descriptor = POOL
        .get_message_by_name(&format!("sandhold.v1.{name}"))
        .unwrap_or_else(|| panic!("sandhold.v1.{name} is in the descriptor set"));
    let dynamic = DynamicMessage::decode(descriptor.clone(), message.encode_to_vec().as_slice())
        .expect("a message decodes with its own descriptor");
    let options = SerializeOptions::new().use_proto_field_name(true).stringify_64_bit_integers(false);
    let mut value =
        dynamic.serialize_with_options(serde_json::value::Serializer, &options).expect("serializes to JSON");
    each_enum(&descriptor, &mut value, &mut |e, v| {
        if let Value::String(name) = v {
            *name = enum_word(e, name);
        }
    });
    value
}

/// How CLI JSON spells an enum value, the one spelling of every status and
/// state in it: the value's name without its enum's prefix, lower-case, the
/// word the human output uses (`RUN_STATUS_COMPLETED` is `completed`,
/// `GIT_CHANGE_TYPE_CHANGED` `type_changed`). Codes are not enum values
/// here: error reasons and chunk types stay as the API names them
/// (`NOT_FOUND`, `RUN_FINISHED`).
pub fn enum_word(e: &EnumDescriptor, name: &str) -> String {
    name.strip_prefix(enum_prefix(e).as_str()).unwrap_or(name).to_ascii_lowercase()
}

/// The proto name of the value of `e` that `word` names: its proto name
/// itself, or its [`enum_word`]; `None` for neither.
pub fn enum_name(e: &EnumDescriptor, word: &str) -> Option<String> {
    let full = format!("{}{}", enum_prefix(e), word.to_ascii_uppercase());
    [word, full.as_str()].into_iter().find(|n| e.get_value_by_name(n).is_some()).map(str::to_string)
}

/// `RUN_STATUS_` of `RunStatus`: what its zero value, `RUN_STATUS_UNSPECIFIED`,
/// has before `UNSPECIFIED` (every `sandhold.v1` enum has one).
fn enum_prefix(e: &EnumDescriptor) -> String {
    let zero = e.get_value(0).map(|v| v.name().to_string()).unwrap_or_default();
    zero.strip_suffix("UNSPECIFIED").unwrap_or_default().to_string()
}

/// Calls `f` on every enum value in `value`, a JSON object of `message`'s
/// shape (keyed by proto or JSON field names), through nested messages,
/// lists and maps. Anything not of the shape is passed over.
pub fn each_enum(
    message: &MessageDescriptor,
    value: &mut Value,
    f: &mut dyn FnMut(&EnumDescriptor, &mut Value),
) {
    let Value::Object(object) = value else { return };
    for field in message.fields() {
        let key = if object.contains_key(field.name()) { field.name() } else { field.json_name() };
        let Some(v) = object.get_mut(key) else { continue };
        let kind = match field.kind() {
            Kind::Message(entry) if field.is_map() => entry.map_entry_value_field().kind(),
            kind => kind,
        };
        let items: Vec<&mut Value> = match v {
            Value::Array(list) if field.is_list() => list.iter_mut().collect(),
            Value::Object(map) if field.is_map() => map.values_mut().collect(),
            v => vec![v],
        };
        for item in items {
            match &kind {
                Kind::Enum(e) => f(e, item),
                Kind::Message(m) => each_enum(m, item, f),
                _ => {}
            }
        }
    }
}

/// Stdout for JSON lines, one buffer for the process, so lines written
/// deferred and flushed stay in order.
static JSON_OUT: LazyLock<std::sync::Mutex<std::io::BufWriter<std::io::Stdout>>> =
    LazyLock::new(|| std::sync::Mutex::new(std::io::BufWriter::with_capacity(64 << 10, std::io::stdout())));

fn json_out() -> std::sync::MutexGuard<'static, std::io::BufWriter<std::io::Stdout>> {
    JSON_OUT.lock().unwrap_or_else(|e| e.into_inner())
}

/// One line of JSON on stdout, now.
pub fn json_line(value: &(impl serde::Serialize + ?Sized)) {
    json_line_deferred(value);
    json_flush();
}

/// One line of JSON on stdout at the next [`json_flush`] (or [`json_line`]):
/// a burst of a run's chunks goes out in one `write`, not one per line.
pub fn json_line_deferred(value: &(impl serde::Serialize + ?Sized)) {
    let mut out = json_out();
    let _ = serde_json::to_writer(&mut *out, value);
    let _ = out.write_all(b"\n");
}

/// Write what [`json_line_deferred`] left in the buffer.
pub fn json_flush() {
    let _ = json_out().flush();
}

/// Calls [`json_flush`] when dropped: deferred lines are written on every
/// way out of a loop that defers them.
pub struct FlushJsonOnDrop;

impl Drop for FlushJsonOnDrop {
    fn drop(&mut self) {
        json_flush();
    }
}

/// A failure, as the user sees it: `error: ...` (with the reason) on
/// stderr, or under `json` an `{"error": {...}}` line on stdout.
pub fn print_error(format: OutputFormat, error: &anyhow::Error) {
    match format {
        OutputFormat::Human => eprintln!("error: {error:#}"),
        OutputFormat::Json => {
            let (reason, message) = match error.downcast_ref::<Error>() {
                Some(e) => (e.code.reason().to_string(), e.message.clone()),
                None => ("CLIENT".to_string(), format!("{error:#}")),
            };
            json_line(&json!({"error": {"reason": reason, "message": message}}));
        }
    }
}

/// A gRPC status as an error that keeps its Sandhold reason, with a hint
/// of what to do next where there is an obvious one.
pub fn status_error(status: tonic::Status) -> anyhow::Error {
    let mut error = Error::from_status(&status);
    match status.code() {
        tonic::Code::Unauthenticated => error.message.push_str(&format!(
            "\nThe server has API tokens: put yours in {} (never on the command line).",
            super::client::TOKEN_VAR
        )),
        tonic::Code::Unavailable if status.message().contains("transport") => {
            error.message.push_str("\nThe server went away; is it still running?")
        }
        // Not gRPC at all: a plain HTTP/1 server, a TLS server spoken to in
        // plain text, or a proxy that does not carry gRPC.
        tonic::Code::Internal if status.message().contains("h2 protocol error") => {
            error.message = format!(
                "the server does not speak gRPC ({}): is --server the address `sandhold serve` listens on? \
                 A server with --tls-cert is written https://HOST:PORT",
                status.message()
            )
        }
        // The client cancels no call of its own: the connection broke before
        // the call went out, which a non-gRPC server does too, depending
        // on when its answer arrives.
        tonic::Code::Cancelled if status.message().contains("operation was canceled") => {
            error.message = format!(
                "the connection ended before the server answered ({}): the server may not speak gRPC (is \
                 --server the address `sandhold serve` listens on? A server with --tls-cert is written \
                 https://HOST:PORT), or it went away",
                status.message()
            )
        }
        tonic::Code::Unknown if status.message().contains("grpc-status header missing") => {
            error.message = format!(
                "an HTTP server answered, not a Sandhold server ({}): check --server's host and port, and that a \
                 proxy in between carries gRPC (HTTP/2)",
                status.message()
            )
        }
        tonic::Code::NotFound => error.message.push_str(
            "\nWhat this server has: `sandhold runs`, `sandhold sandboxes ls`, `sandhold definitions ls` \
             (the same --server, or the same --data-dir for the embedded server).",
        ),
        tonic::Code::Unimplemented if status.message().is_empty() => {
            error.message =
                "this server does not serve that call (is it an older version than this client?)".into()
        }
        _ => {}
    }
    anyhow::Error::new(error)
}

/// The exit code of a CLI that ends with a sandbox process: its code, or
/// 128 + the signal that killed it (as a shell says).
pub fn process_exit_code(status: Option<shared::proto::v1::exit_status::Status>) -> u8 {
    use shared::proto::v1::exit_status::Status;
    match status {
        Some(Status::Code(c)) => u8::try_from(c).unwrap_or(1),
        Some(Status::Signal(s)) => u8::try_from(128 + s).unwrap_or(1),
        None => 1,
    }
}

#[cfg(test)]
mod tests {
    use shared::proto::v1 as api;

    use super::*;

    #[test]
    fn messages_print_in_the_proto_json_mapping() {
        let run = api::Run {
            run_id: "r1".into(),
            status: api::RunStatus::Completed as i32,
            started_at_ms: 1_700_000_000_000,
            ..Default::default()
        };
        let v = message_json(&run, "Run");
        assert_eq!(v["run_id"], "r1");
        assert_eq!(v["status"], "completed", "the word the human output uses");
        assert_eq!(v["started_at_ms"], 1_700_000_000_000i64);
        assert!(v.get("thread_id").is_none(), "defaults are left out: {v}");
    }

    #[test]
    fn enum_values_are_words_in_nested_messages_lists_and_oneofs() {
        let status = api::GitStatusResponse {
            branch: "main".into(),
            files: vec![api::GitFileStatus {
                path: "a".into(),
                staged: api::GitChange::TypeChanged as i32,
                unstaged: api::GitChange::Untracked as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = message_json(&status, "GitStatusResponse");
        assert_eq!(
            (&v["files"][0]["staged"], &v["files"][0]["unstaged"]),
            (&json!("type_changed"), &json!("untracked"))
        );
        let output = api::ExecStreamResponse {
            event: Some(api::exec_stream_response::Event::Output(api::OutputChunk {
                stream: api::OutputStream::Stderr as i32,
                data: b"x".to_vec(),
            })),
        };
        assert_eq!(message_json(&output, "ExecStreamResponse")["output"]["stream"], "stderr");
        let progress =
            api::EnsureProgress { phase: api::EnsurePhase::RestoringSnapshot as i32, ..Default::default() };
        assert_eq!(message_json(&progress, "EnsureProgress")["phase"], "restoring_snapshot");
    }

    #[test]
    fn a_word_names_its_value_and_so_does_the_proto_name() {
        let e = POOL.get_enum_by_name("sandhold.v1.Reuse").unwrap();
        assert_eq!(enum_name(&e, "none").as_deref(), Some("REUSE_NONE"));
        assert_eq!(enum_name(&e, "REUSE_NONE").as_deref(), Some("REUSE_NONE"));
        assert_eq!(enum_name(&e, "nothing"), None);
        for value in e.values() {
            assert_eq!(enum_name(&e, &enum_word(&e, value.name())).as_deref(), Some(value.name()));
        }
    }

    /// `docs/schema/cli-output.schema.json` follows the API: each `$defs`
    /// entry marked `x-proto` lists its message's every field, or its
    /// enum's every value as [`enum_word`] spells it; the chunk types, the
    /// system's CUSTOM names and the error reasons are all there.
    #[test]
    fn the_output_schema_names_every_field_and_value_of_the_api() {
        use std::collections::BTreeSet;
        let schema: Value =
            serde_json::from_str(include_str!("../../../docs/schema/cli-output.schema.json")).unwrap();
        let defs = schema["$defs"].as_object().unwrap();
        let strings = |v: &Value| -> BTreeSet<String> {
            v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
        };
        let consts = |v: &Value| -> BTreeSet<String> {
            v.as_array().unwrap().iter().map(|c| c["const"].as_str().unwrap().to_string()).collect()
        };
        let mut checked = 0;
        for (name, def) in defs {
            let Some(proto) = def.get("x-proto").and_then(Value::as_str) else { continue };
            if let Some(message) = POOL.get_message_by_name(proto) {
                let fields: BTreeSet<String> = message.fields().map(|f| f.name().to_string()).collect();
                let listed: BTreeSet<String> =
                    def["properties"].as_object().unwrap().keys().cloned().collect();
                assert_eq!(listed, fields, "$defs/{name}: the fields of {proto}");
            } else if let Some(e) = POOL.get_enum_by_name(proto) {
                let values = e.values().filter(|v| v.number() != 0);
                // Chunk types are codes: their names without the prefix.
                let (listed, want): (_, BTreeSet<String>) = match def.get("oneOf") {
                    Some(documented) => (
                        consts(documented),
                        values.map(|v| v.name().trim_start_matches("CHUNK_TYPE_").to_string()).collect(),
                    ),
                    None => (strings(&def["enum"]), values.map(|v| enum_word(&e, v.name())).collect()),
                };
                assert_eq!(listed, want, "$defs/{name}: the values of {proto}");
            } else {
                panic!("$defs/{name}: {proto} is not in sandhold.v1");
            }
            checked += 1;
        }
        assert!(checked > 30, "{checked} definitions checked");
        let system: BTreeSet<String> = shared::chunk::SYSTEM_NAMES.iter().map(|s| s.to_string()).collect();
        assert_eq!(consts(&defs["reserved_custom_name"]["oneOf"]), system, "the system's CUSTOM names");
        let mut reasons: BTreeSet<String> =
            shared::error::ErrorCode::ALL.iter().map(|c| c.reason().to_string()).collect();
        reasons.insert("CLIENT".into());
        assert_eq!(strings(&defs["error_reason"]["enum"]), reasons, "the error reasons");
    }
}
