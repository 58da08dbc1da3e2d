//! Helpers for the adapters' unit tests.

use shared::chunk::{self, Chunk};
use shared::ids::RunId;
pub use shared::policy::{Action, Effect, Policy, Rule};
use shared::proto::agent::v1::ClientTool;

use super::Harness;

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

pub fn rule(action: Action, pattern: &str, effect: Effect) -> Rule {
    Rule { action, pattern: pattern.into(), effect }
}

pub fn policy(default: Effect, rules: Vec<Rule>) -> Policy {
    Policy { default, rules, request_timeout_ms: None, bounds: Vec::new() }
}

pub fn client_tool(name: &str) -> ClientTool {
    ClientTool { name: name.into(), ..Default::default() }
}
