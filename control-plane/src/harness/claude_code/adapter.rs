//! Claude Code as an [`Adapter`]: what the rest of Sandhold needs of it
//! besides its command line and translation (`mod.rs`).

use serde_json::json;

use super::{ClaudeCodeTranslator, command, session};
use crate::harness::adapter::Adapter;
use crate::harness::model_api::{ModelApi, set_default};
use crate::harness::session::CarryScripts;
use crate::harness::skills::{McpServer, merge_into_json};
use crate::harness::toolchain::{Cli, Libc, Package};
use crate::harness::{CommandSpec, HarnessError, HarnessOptions};

pub(crate) struct ClaudeCode;

const CLI: Cli = Cli {
    harness: "claude-code",
    program: "claude",
    version: "2.1.197",
    packages: &[
        Package {
            libc: Some(Libc::Glibc),
            spec: "@anthropic-ai/claude-code-linux-x64@2.1.197",
            binary: "claude",
            integrity: "sha512-rIlKmrY0QMyHgPRX/MYWNj039vbypICvI9jVe3rs9Xy2RnNklySjyPxqh62QadznzoftEO23uYQ1tFePcQ//bg==",
        },
        Package {
            libc: Some(Libc::Musl),
            spec: "@anthropic-ai/claude-code-linux-x64-musl@2.1.197",
            binary: "claude",
            integrity: "sha512-/Ij3+inZf96Lb1BLnO0rWArRi1HqIMh6HeGrQoykrp7a8Yj0SA1EQIO42kpNeVxM9z3o3xUaiIf0FRMzLIp6oQ==",
        },
    ],
};

impl Adapter for ClaudeCode {
    fn name(&self) -> &'static str {
        "claude-code"
    }

    fn command(&self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
        command(options, prompt)
    }

    fn translator(&self) -> Box<dyn crate::harness::emit::Translate> {
        Box::<ClaudeCodeTranslator>::default()
    }

    fn model_api(&self) -> Option<ModelApi> {
        Some(ModelApi { default_upstream: "https://api.anthropic.com", key_vars: &["ANTHROPIC_API_KEY"] })
    }

    fn point_at(&self, spec: &mut CommandSpec, base_url: &str, key: &str) {
        set_default(spec, "ANTHROPIC_BASE_URL", base_url);
        set_default(spec, "ANTHROPIC_API_KEY", key);
    }

    fn carry_scripts(&self) -> Option<&'static CarryScripts> {
        Some(&session::SCRIPTS)
    }

    fn skills_folder(&self) -> Option<&'static str> {
        Some(".claude/skills")
    }

    fn mcp_file(&self) -> Option<&'static str> {
        Some(".mcp.json")
    }

    fn mcp_config(&self, existing: Option<&[u8]>, servers: &[McpServer]) -> Result<Vec<u8>, String> {
        merge_into_json(
            existing,
            json!({}),
            "mcpServers",
            servers,
            |s| json!({ "type": "http", "url": s.url, "headers": s.headers }),
        )
    }

    fn toolchain(&self) -> Option<&'static Cli> {
        Some(&CLI)
    }
}

#[cfg(test)]
mod tests {
    use crate::harness::{Harness, HarnessOptions};

    #[test]
    fn the_cli_gets_the_base_url_and_the_placeholder() {
        let options = HarnessOptions::default();
        let mut claude = Harness::ClaudeCode.command(&options, "p").unwrap();
        Harness::ClaudeCode.point_at(&mut claude, "http://127.0.0.1:5/", "ph");
        assert_eq!(claude.env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:5/");
        assert_eq!(claude.env["ANTHROPIC_API_KEY"], "ph");
    }

    #[test]
    fn what_the_run_set_itself_wins() {
        let mut options = HarnessOptions::default();
        options.env.insert("ANTHROPIC_BASE_URL".into(), "http://mine".into());
        let mut claude = Harness::ClaudeCode.command(&options, "p").unwrap();
        Harness::ClaudeCode.point_at(&mut claude, "http://127.0.0.1:5", "ph");
        assert_eq!(claude.env["ANTHROPIC_BASE_URL"], "http://mine");
        assert_eq!(Harness::Command.model_api(), None);
    }
}
