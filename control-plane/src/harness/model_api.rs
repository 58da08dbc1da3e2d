//! How a CLI is pointed at a model endpoint: its public API
//! ([`Harness::model_api`](super::Harness::model_api)) and the settings that
//! take a base URL and a key ([`Harness::point_at`](super::Harness::point_at)),
//! each in its harness's folder; here what they share. The broker (module
//! `egress`) uses this to point a run's CLI at the sandbox's loopback with a
//! placeholder key.

use super::CommandSpec;

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

/// Set `name` in the run's environment unless the run set it itself.
pub(super) fn set_default(spec: &mut CommandSpec, name: &str, value: &str) {
    spec.env.entry(name.to_string()).or_insert_with(|| value.to_string());
}

/// The `--model` / `-m` value of an argv.
pub(super) fn model_of(argv: &[String]) -> Option<String> {
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
