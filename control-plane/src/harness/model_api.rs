//! How each CLI is pointed at a model endpoint: its public API, and the
//! settings that take a base URL and a key. The broker (module `egress`)
//! uses this to point a run's CLI at the sandbox's loopback with a
//! placeholder key.

use super::{CommandSpec, Harness, Output};

/// A CLI's model API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelApi {
    /// The base URL the CLI uses when told none, in the same convention
    /// as its base-URL setting (Codex's and OpenCode's end in `/v1`).
    pub default_upstream: &'static str,
    /// The variables the CLI reads its key from, by convention: a secret
    /// of one of these names is taken as the model key by `sandhold run`.
    pub key_vars: &'static [&'static str],
}

impl Harness {
    /// The model API of a CLI harness; `None` for `command` and `acp` (the
    /// ACP agent's own CLI decides).
    pub fn model_api(self) -> Option<ModelApi> {
        let (default_upstream, key_vars): (_, &[_]) = match self {
            Harness::ClaudeCode => ("https://api.anthropic.com", &["ANTHROPIC_API_KEY"]),
            Harness::Codex => ("https://api.openai.com/v1", &["OPENAI_API_KEY", "CODEX_API_KEY"]),
            Harness::OpenCode => ("https://api.anthropic.com/v1", &["ANTHROPIC_API_KEY"]),
            Harness::Gemini => {
                ("https://generativelanguage.googleapis.com", &["GEMINI_API_KEY", "GOOGLE_API_KEY"])
            }
            Harness::Command | Harness::Acp => return None,
        };
        Some(ModelApi { default_upstream, key_vars })
    }
}

/// The Codex provider Sandhold defines for the broker.
const CODEX_PROVIDER: &str = "sandhold";
/// The variable Codex reads that provider's key from.
const CODEX_KEY_VAR: &str = "SANDHOLD_MODEL_KEY";

/// Point `spec` (built by `harness`) at `base_url` with `key`. Settings the
/// run gave itself come later and win (Codex `-c` overrides are read in
/// order; environment set by the run is kept).
pub fn point_at(harness: Harness, spec: &mut CommandSpec, base_url: &str, key: &str) {
    let model = model_of(&spec.argv);
    let model = model.as_deref();
    let mut set = |name: &str, value: String| {
        spec.env.entry(name.to_string()).or_insert(value);
    };
    match harness {
        Harness::ClaudeCode => {
            set("ANTHROPIC_BASE_URL", base_url.to_string());
            set("ANTHROPIC_API_KEY", key.to_string());
        }
        Harness::Gemini => {
            set("GOOGLE_GEMINI_BASE_URL", base_url.to_string());
            set("GEMINI_API_KEY", key.to_string());
        }
        Harness::OpenCode => {
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
            super::policy::merge_json(&mut config, existing);
            spec.env.insert("OPENCODE_CONFIG_CONTENT".into(), config.to_string());
            spec.env.entry("ANTHROPIC_API_KEY".into()).or_insert_with(|| key.to_string());
        }
        Harness::Codex => {
            set(CODEX_KEY_VAR, key.to_string());
            let provider = format!(
                "{{ name = \"Sandhold broker\", base_url = {}, env_key = \"{CODEX_KEY_VAR}\", wire_api = \"responses\" }}",
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
                format!("model_provider=\"{CODEX_PROVIDER}\""),
                "-c".to_string(),
                format!("model_providers.{CODEX_PROVIDER}={provider}"),
            ];
            spec.argv.splice(at..at, overrides);
        }
        Harness::Command | Harness::Acp => {}
    }
}

/// The `--model` / `-m` value of an argv.
fn model_of(argv: &[String]) -> Option<String> {
    argv.windows(2).find(|w| w[0] == "--model" || w[0] == "-m").map(|w| w[1].clone())
}

/// `s` as a TOML basic string.
pub(super) fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::HarnessOptions;

    #[test]
    fn each_cli_gets_the_base_url_and_the_placeholder() {
        let options = HarnessOptions::default();
        let mut claude = Harness::ClaudeCode.command(&options, "p").unwrap();
        point_at(Harness::ClaudeCode, &mut claude, "http://127.0.0.1:5/", "ph");
        assert_eq!(claude.env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:5/");
        assert_eq!(claude.env["ANTHROPIC_API_KEY"], "ph");

        let mut codex = Harness::Codex.command(&options, "p").unwrap();
        point_at(Harness::Codex, &mut codex, "http://127.0.0.1:5/v1", "ph");
        assert_eq!(&codex.argv[1..4], ["exec", "-c", "model_provider=\"sandhold\""]);
        assert!(codex.argv[5].contains("base_url = \"http://127.0.0.1:5/v1\""), "{:?}", codex.argv);
        assert_eq!(codex.env[CODEX_KEY_VAR], "ph");

        let with_model = HarnessOptions { model: Some("anthropic/m-1".into()), ..Default::default() };
        let mut opencode = Harness::OpenCode.command(&with_model, "p").unwrap();
        point_at(Harness::OpenCode, &mut opencode, "http://127.0.0.1:5/v1", "ph");
        let config: serde_json::Value =
            serde_json::from_str(&opencode.env["OPENCODE_CONFIG_CONTENT"]).unwrap();
        assert_eq!(config["provider"]["anthropic"]["options"]["baseURL"], "http://127.0.0.1:5/v1");
        assert_eq!(config["provider"]["anthropic"]["options"]["apiKey"], "ph");
        assert!(config["provider"]["anthropic"]["models"]["m-1"].is_object());
    }

    #[test]
    fn what_the_run_set_itself_wins() {
        let mut options = HarnessOptions::default();
        options.env.insert("ANTHROPIC_BASE_URL".into(), "http://mine".into());
        let mut claude = Harness::ClaudeCode.command(&options, "p").unwrap();
        point_at(Harness::ClaudeCode, &mut claude, "http://127.0.0.1:5", "ph");
        assert_eq!(claude.env["ANTHROPIC_BASE_URL"], "http://mine");
        assert_eq!(Harness::Command.model_api(), None);
    }
}
