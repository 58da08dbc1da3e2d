//! Any ACP agent as an [`Adapter`]: what the rest of Sandhold needs of it
//! besides its command line and translation (`mod.rs`). Its model API and
//! sessions are the agent's own CLI's business.

use serde_json::{Value, json};

use super::{AcpTranslator, MCP_SERVERS_FILE, command};
use crate::harness::adapter::Adapter;
use crate::harness::skills::McpServer;
use crate::harness::{CommandSpec, HarnessError, HarnessOptions};

pub(crate) struct Acp;

impl Adapter for Acp {
    fn name(&self) -> &'static str {
        "acp"
    }

    fn command(&self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
        command(options, prompt)
    }

    fn translator(&self) -> Box<dyn crate::harness::emit::Translate> {
        Box::<AcpTranslator>::default()
    }

    fn mcp_file(&self) -> Option<&'static str> {
        Some(MCP_SERVERS_FILE)
    }

    /// Sandhold's own file, not the repository's: written whole, as ACP's
    /// `mcpServers` (headers are name/value pairs).
    fn mcp_config(&self, _existing: Option<&[u8]>, servers: &[McpServer]) -> Result<Vec<u8>, String> {
        let servers: Vec<Value> = servers
            .iter()
            .map(|s| {
                let headers: Vec<Value> =
                    s.headers.iter().map(|(k, v)| json!({ "name": k, "value": v })).collect();
                json!({ "type": "http", "name": s.name, "url": s.url, "headers": headers })
            })
            .collect();
        let mut out = serde_json::to_vec_pretty(&servers).map_err(|e| e.to_string())?;
        out.push(b'\n');
        Ok(out)
    }
}
