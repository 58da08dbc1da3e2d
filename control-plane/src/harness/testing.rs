//! Helpers for the adapters' unit tests.

use shared::chunk::{self, Chunk};
use shared::ids::RunId;

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
