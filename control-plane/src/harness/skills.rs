//! What a workspace's MCP skills give each harness: the servers, resolved
//! (`workspace::skills` reads the secrets), and the JSON config shape most
//! CLIs share. Each folder says where its CLI reads MCP servers and skills
//! from ([`Harness::mcp_file`](super::Harness::mcp_file),
//! [`Harness::skills_folder`](super::Harness::skills_folder)).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One MCP server of a workspace, its header values resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    pub name: String,
    pub url: String,
    pub headers: BTreeMap<String, String>,
}

/// `existing` (a JSON config, `empty` when there is none) with each server
/// written by `entry` into the object under `key`.
pub(super) fn merge_into_json(
    existing: Option<&[u8]>,
    empty: Value,
    key: &str,
    servers: &[McpServer],
    entry: impl Fn(&McpServer) -> Value,
) -> Result<Vec<u8>, String> {
    let mut doc: Value = match existing {
        Some(b) => serde_json::from_slice(b).map_err(|e| e.to_string())?,
        None => empty,
    };
    let root = doc.as_object_mut().ok_or("not a JSON object")?;
    let table = root
        .entry(key)
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or(format!("{key} is not an object"))?;
    for s in servers {
        table.insert(s.name.clone(), entry(s));
    }
    let mut out = serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?;
    out.push(b'\n');
    Ok(out)
}
