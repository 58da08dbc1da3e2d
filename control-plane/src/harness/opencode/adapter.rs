//! OpenCode as an [`Adapter`]: what the rest of Sandhold needs of it
//! besides its command line and translation (`mod.rs`).

use serde_json::json;

use super::{OpenCodeTranslator, command, session};
use crate::harness::adapter::Adapter;
use crate::harness::model_api::{ModelApi, model_of};
use crate::harness::policy::merge_json;
use crate::harness::session::CarryScripts;
use crate::harness::skills::{McpServer, merge_into_json};
use crate::harness::toolchain::{Cli, Libc, Package};
use crate::harness::{CommandSpec, HarnessError, HarnessOptions};

pub(crate) struct OpenCode;

const CLI: Cli = Cli {
    harness: "opencode",
    program: "opencode",
    version: "1.18.33",
    // OpenCode publishes no musl build of this version.
    packages: &[Package {
        libc: Some(Libc::Glibc),
        spec: "opencode-linux-x64@1.18.33",
        binary: "bin/opencode",
        integrity: "sha512-q/t/3p2CTxOT9y2kvjesb/LZab2+1eqlhhWA02Be6mjTtmYtNBcBsrI5yDo4Fw7ZSPBW2oyMIGMNRqiKQjiAWw==",
    }],
};

impl Adapter for OpenCode {
    fn name(&self) -> &'static str {
        "opencode"
    }

    fn command(&self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
        command(options, prompt)
    }

    fn translator(&self) -> Box<dyn crate::harness::emit::Translate> {
        Box::<OpenCodeTranslator>::default()
    }

    fn model_api(&self) -> Option<ModelApi> {
        Some(ModelApi { default_upstream: "https://api.anthropic.com/v1", key_vars: &["ANTHROPIC_API_KEY"] })
    }

    fn point_at(&self, spec: &mut CommandSpec, base_url: &str, key: &str) {
        let model = model_of(&spec.argv);
        let model = model.as_deref();
        // OpenCode's anthropic provider, pointed at the broker; the
        // run's model (`anthropic/<id>`) is declared so an id its
        // catalogue does not know still resolves.
        // The config the adapter wrote (policy, MCP, the model of an
        // ACP run) or the run set is kept, and wins key by key.
        let existing = spec.env.get("OPENCODE_CONFIG_CONTENT").map(|c| serde_json::from_str(c));
        let existing = match existing {
            None => serde_json::Value::Object(Default::default()),
            Some(Ok(v @ serde_json::Value::Object(_))) => v,
            // Not ours to fix: left as the run set it.
            Some(_) => return,
        };
        let model = model.or_else(|| existing.get("model").and_then(|m| m.as_str()));
        let mut provider = serde_json::json!({"options": {"baseURL": base_url, "apiKey": key}});
        if let Some(id) = model.and_then(|m| m.strip_prefix("anthropic/")) {
            provider["models"] = serde_json::json!({ id: {"name": id} });
        }
        let mut config = serde_json::json!({"provider": {"anthropic": provider}});
        merge_json(&mut config, existing);
        spec.env.insert("OPENCODE_CONFIG_CONTENT".into(), config.to_string());
        spec.env.entry("ANTHROPIC_API_KEY".into()).or_insert_with(|| key.to_string());
    }

    fn carry_scripts(&self) -> Option<&'static CarryScripts> {
        Some(&session::SCRIPTS)
    }

    fn carry_runs_the_cli(&self) -> bool {
        true
    }

    fn mcp_file(&self) -> Option<&'static str> {
        Some("opencode.json")
    }

    fn mcp_config(&self, existing: Option<&[u8]>, servers: &[McpServer]) -> Result<Vec<u8>, String> {
        let empty = json!({ "$schema": "https://opencode.ai/config.json" });
        merge_into_json(
            existing,
            empty,
            "mcp",
            servers,
            |s| json!({ "type": "remote", "url": s.url, "enabled": true, "headers": s.headers }),
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
        let with_model = HarnessOptions { model: Some("anthropic/m-1".into()), ..Default::default() };
        let mut opencode = Harness::OpenCode.command(&with_model, "p").unwrap();
        Harness::OpenCode.point_at(&mut opencode, "http://127.0.0.1:5/v1", "ph");
        let config: serde_json::Value =
            serde_json::from_str(&opencode.env["OPENCODE_CONFIG_CONTENT"]).unwrap();
        assert_eq!(config["provider"]["anthropic"]["options"]["baseURL"], "http://127.0.0.1:5/v1");
        assert_eq!(config["provider"]["anthropic"]["options"]["apiKey"], "ph");
        assert!(config["provider"]["anthropic"]["models"]["m-1"].is_object());
    }
}
