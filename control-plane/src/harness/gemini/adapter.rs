//! Gemini CLI as an [`Adapter`]: what the rest of Sandhold needs of it
//! besides its command line and translation (`mod.rs`).

use serde_json::json;

use super::{GeminiTranslator, command, session};
use crate::harness::adapter::Adapter;
use crate::harness::model_api::{ModelApi, set_default};
use crate::harness::session::CarryScripts;
use crate::harness::skills::{McpServer, merge_into_json};
use crate::harness::{CommandSpec, HarnessError, HarnessOptions};

pub(crate) struct Gemini;

impl Adapter for Gemini {
    fn name(&self) -> &'static str {
        "gemini"
    }

    fn command(&self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
        command(options, prompt)
    }

    fn translator(&self) -> Box<dyn crate::harness::emit::Translate> {
        Box::<GeminiTranslator>::default()
    }

    fn model_api(&self) -> Option<ModelApi> {
        Some(ModelApi {
            default_upstream: "https://generativelanguage.googleapis.com",
            key_vars: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        })
    }

    fn point_at(&self, spec: &mut CommandSpec, base_url: &str, key: &str) {
        set_default(spec, "GOOGLE_GEMINI_BASE_URL", base_url);
        set_default(spec, "GEMINI_API_KEY", key);
    }

    fn carry_scripts(&self) -> Option<&'static CarryScripts> {
        Some(&session::SCRIPTS)
    }

    fn mcp_file(&self) -> Option<&'static str> {
        Some(".gemini/settings.json")
    }

    fn mcp_config(&self, existing: Option<&[u8]>, servers: &[McpServer]) -> Result<Vec<u8>, String> {
        // `httpUrl` is streamable HTTP (`url` is SSE).
        merge_into_json(
            existing,
            json!({}),
            "mcpServers",
            servers,
            |s| json!({ "httpUrl": s.url, "headers": s.headers }),
        )
    }
}
