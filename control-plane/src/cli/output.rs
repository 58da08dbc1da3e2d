//! Output of the client commands: `human` (for people) or `json` (one JSON
//! object per line on stdout, for scripts). Protobuf messages print in the
//! proto3 JSON mapping with the proto field names (`run_id`, enums by name),
//! the same shape `grpcurl` shows; chunks print in the shape of
//! [`shared::chunk::to_json`] with their `offset`.

use std::io::Write;
use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::{Value, json};
use shared::error::Error;

pub use super::format::OutputFormat;

/// The `sandhold.v1` descriptors, for printing and parsing messages as JSON.
pub static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(shared::PUBLIC_DESCRIPTOR_SET).expect("the built-in descriptor set decodes")
});

/// A `sandhold.v1` message as proto3 JSON (proto field names, enums by name,
/// 64-bit integers as numbers, default values left out).
pub fn message_json<M: prost::Message>(message: &M, name: &str) -> Value {
    let descriptor = POOL
        .get_message_by_name(&format!("sandhold.v1.{name}"))
        .unwrap_or_else(|| panic!("sandhold.v1.{name} is in the descriptor set"));
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .expect("a message decodes with its own descriptor");
    let options = SerializeOptions::new().use_proto_field_name(true).stringify_64_bit_integers(false);
    dynamic.serialize_with_options(serde_json::value::Serializer, &options).expect("serializes to JSON")
}

/// One line of JSON on stdout.
pub fn json_line(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
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
        assert_eq!(v["status"], "RUN_STATUS_COMPLETED");
        assert_eq!(v["started_at_ms"], 1_700_000_000_000i64);
        assert!(v.get("thread_id").is_none(), "defaults are left out: {v}");
    }
}
