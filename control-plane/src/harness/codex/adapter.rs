//! Codex as an [`Adapter`]: what the rest of Sandhold needs of it besides
//! its command line and translation (`mod.rs`).

use super::{CodexTranslator, command, session};
use crate::harness::adapter::Adapter;
use crate::harness::model_api::{ModelApi, set_default, toml_string};
use crate::harness::session::CarryScripts;
use crate::harness::skills::McpServer;
use crate::harness::toolchain::{Cli, Package};
use crate::harness::{CommandSpec, HarnessError, HarnessOptions, Output};

pub(crate) struct Codex;

/// The Codex provider Sandhold defines for the broker.
const PROVIDER: &str = "sandhold";
/// The variable Codex reads that provider's key from.
pub(crate) const KEY_VAR: &str = "SANDHOLD_MODEL_KEY";

const CLI: Cli = Cli {
    harness: "codex",
    program: "codex",
    version: "0.171.0",
    packages: &[Package {
        libc: None,
        spec: "@openai/codex@0.171.0-linux-x64",
        binary: "vendor/x86_64-unknown-linux-musl/bin/codex",
        integrity: "sha512-l66NZkQgdk2C3pbcfULDz42yEUB581MVA6I+Y43Wp4OIqEy73HCdmZ0GTjeAHY2ycuH4N00d9VsLrwT1jxshTw==",
    }],
};

impl Adapter for Codex {
    fn name(&self) -> &'static str {
        "codex"
    }

    fn command(&self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
        command(options, prompt)
    }

    fn translator(&self) -> Box<dyn crate::harness::emit::Translate> {
        Box::<CodexTranslator>::default()
    }

    fn model_api(&self) -> Option<ModelApi> {
        Some(ModelApi {
            default_upstream: "https://api.openai.com/v1",
            key_vars: &["OPENAI_API_KEY", "CODEX_API_KEY"],
        })
    }

    fn point_at(&self, spec: &mut CommandSpec, base_url: &str, key: &str) {
        set_default(spec, KEY_VAR, key);
        let provider = format!(
            "{{ name = \"Sandhold broker\", base_url = {}, env_key = \"{KEY_VAR}\", wire_api = \"responses\" }}",
            toml_string(base_url)
        );
        // Right after `exec` (or, under the ACP bridge, after
        // `codex-acp`), before the run's own overrides.
        let at = match spec.argv.iter().position(|a| a == "exec") {
            Some(i) if spec.output == Output::Native => i + 1,
            _ => spec.argv.iter().position(|a| a == "--").map_or(spec.argv.len(), |i| i + 2),
        };
        let at = at.min(spec.argv.len());
        let overrides = [
            "-c".to_string(),
            format!("model_provider=\"{PROVIDER}\""),
            "-c".to_string(),
            format!("model_providers.{PROVIDER}={provider}"),
        ];
        spec.argv.splice(at..at, overrides);
    }

    fn carry_scripts(&self) -> Option<&'static CarryScripts> {
        Some(&session::SCRIPTS)
    }

    fn skills_folder(&self) -> Option<&'static str> {
        Some(".codex/skills")
    }

    fn mcp_file(&self) -> Option<&'static str> {
        Some(".codex/config.toml")
    }

    fn mcp_config(&self, existing: Option<&[u8]>, servers: &[McpServer]) -> Result<Vec<u8>, String> {
        let mut doc: toml::Table = match existing {
            Some(b) => std::str::from_utf8(b)
                .map_err(|e| e.to_string())
                .and_then(|s| s.parse::<toml::Table>().map_err(|e| e.to_string()))?,
            None => toml::Table::new(),
        };
        let table = doc
            .entry("mcp_servers")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or("mcp_servers is not a table")?;
        for s in servers {
            let mut entry = toml::Table::new();
            entry.insert("url".into(), toml::Value::String(s.url.clone()));
            if !s.headers.is_empty() {
                let headers =
                    s.headers.iter().map(|(k, v)| (k.clone(), toml::Value::String(v.clone()))).collect();
                entry.insert("http_headers".into(), toml::Value::Table(headers));
            }
            table.insert(s.name.clone(), toml::Value::Table(entry));
        }
        toml::to_string(&doc).map(String::into_bytes).map_err(|e| e.to_string())
    }

    fn toolchain(&self) -> Option<&'static Cli> {
        Some(&CLI)
    }
}

#[cfg(test)]
mod tests {
    use super::KEY_VAR as CODEX_KEY_VAR;
    use crate::harness::{Harness, HarnessOptions};

    #[test]
    fn the_cli_gets_the_base_url_and_the_placeholder() {
        let options = HarnessOptions::default();
        let mut codex = Harness::Codex.command(&options, "p").unwrap();
        Harness::Codex.point_at(&mut codex, "http://127.0.0.1:5/v1", "ph");
        assert_eq!(&codex.argv[1..4], ["exec", "-c", "model_provider=\"sandhold\""]);
        assert!(codex.argv[5].contains("base_url = \"http://127.0.0.1:5/v1\""), "{:?}", codex.argv);
        assert_eq!(codex.env[CODEX_KEY_VAR], "ph");
    }
}
