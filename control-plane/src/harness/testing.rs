//! Helpers for the adapters' unit tests.

use std::path::Path;
use std::process::Command;

use shared::chunk::{self, Chunk};
use shared::ids::RunId;
pub use shared::policy::{Action, Effect, Policy, Rule};
use shared::proto::agent::v1::ClientTool;

use super::Harness;
use super::session::Carry;

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

/// Runs a carry script as the driver would, with `home` as HOME.
pub fn carry(h: Harness, way: Carry, session: &str, root: &Path, cwd: &str, home: &Path) -> i32 {
    carry_of(h, "cli", way, session, root, cwd, home)
}

/// As [`carry`], for a run of `program`.
pub fn carry_of(
    h: Harness,
    program: &str,
    way: Carry,
    session: &str,
    root: &Path,
    cwd: &str,
    home: &Path,
) -> i32 {
    let argv = h.carry_session(way, session, cwd, program).expect("carried");
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(root)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .status()
        .unwrap();
    status.code().unwrap_or(-1)
}

pub fn copy_tree(from: &Path, to: &Path) {
    let status = Command::new("cp").arg("-R").arg(from).arg(to).status().unwrap();
    assert!(status.success());
}
