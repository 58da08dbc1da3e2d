//! Sandbox definitions for the command line: read from a file (TOML or
//! JSON), or made from `sandhold run`'s flags.
//!
//! The file format is the `sandhold.v1.SandboxDefinition` message in the
//! proto3 JSON mapping, written as JSON or as the same structure in TOML:
//! field names as in `proto/sandhold/v1/sandbox.proto` (`secret_names`, or
//! their lowerCamelCase JSON names), a oneof as a table keyed by the chosen
//! field (`[provider.docker]`, `{ serial = "npm ci" }`), enums by name
//! (`reuse = "REUSE_NONE"`). Unknown fields are refused, so a typo does not
//! pass silently. Example:
//!
//! ```toml
//! id = "node-app"
//! secret_names = ["ANTHROPIC_API_KEY"]
//!
//! [provider.docker]
//! image = "node:22-bookworm"
//! network = "bridge"
//!
//! [workspace]
//! source = { git = { url = "https://github.com/acme/app", ref = "main" } }
//! setup = [{ serial = "npm ci" }, { parallel = { commands = ["npm run build", "npm run lint"] } }]
//!
//! [lifecycle]
//! keep_alive_ms = 600000
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use prost_reflect::{DeserializeOptions, DynamicMessage};
use shared::proto::v1 as api;

use super::output::POOL;

/// Read a definition file. `.toml` is TOML, `.json` JSON; any other name is
/// tried as JSON, then TOML.
pub fn load(path: &Path) -> anyhow::Result<api::SandboxDefinition> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the definition file {}", path.display()))?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
    from_text(&text, ext).with_context(|| format!("the definition file {}", path.display()))
}

/// A definition file's text, by its extension (`toml`, `json`, or anything
/// else: JSON, then TOML). Total: any text is a definition or an error
/// (`fuzz/fuzz_targets/definition.rs` holds it to that).
pub fn from_text(text: &str, ext: &str) -> anyhow::Result<api::SandboxDefinition> {
    let value = match ext {
        "toml" => from_toml(text)?,
        "json" => serde_json::from_str(text)?,
        _ => match serde_json::from_str(text) {
            Ok(v) => v,
            Err(_) => from_toml(text).context("neither JSON nor TOML")?,
        },
    };
    parse(value)
}

fn from_toml(text: &str) -> anyhow::Result<serde_json::Value> {
    let value: toml::Value = toml::from_str(text)?;
    Ok(serde_json::to_value(value)?)
}

/// A JSON value in the proto3 JSON mapping of `SandboxDefinition`.
pub fn parse(value: serde_json::Value) -> anyhow::Result<api::SandboxDefinition> {
    let descriptor =
        POOL.get_message_by_name("sandhold.v1.SandboxDefinition").expect("SandboxDefinition is in the pool");
    let dynamic = DynamicMessage::deserialize_with_options(descriptor, value, &DeserializeOptions::new())
        .map_err(|e| anyhow::anyhow!("not a SandboxDefinition: {e}"))?;
    let definition: api::SandboxDefinition = dynamic.transcode_to()?;
    if definition.id.is_empty() {
        bail!("`id` is missing (the name the definition is stored under)");
    }
    Ok(definition)
}

/// What `sandhold run` builds a definition from when no file is given.
#[derive(Debug, Clone, Default)]
pub struct FromFlags {
    /// `--image`: a container of this image; `None`: local.
    pub image: Option<String>,
    /// `--repo`: a git URL or a local path.
    pub repo: Option<String>,
    pub setup: Vec<String>,
    pub secret_names: Vec<String>,
    /// `--network` for containers.
    pub network: Option<String>,
    /// One-off runs (no `--thread`) remove their sandbox once completed.
    pub destroy_on_complete: bool,
    /// Model access through the broker (the harness and `--model-upstream`;
    /// the server settles which secret is the key).
    pub model_access: Vec<api::ModelAccess>,
    /// `--allow-host`: the egress proxy's allowlist.
    pub allow_hosts: Vec<String>,
}

impl FromFlags {
    /// The definition, with no id: the server gives it one derived from its
    /// content, so the same flags give the same definition (and so the same
    /// sandbox for a thread).
    pub fn build(&self) -> anyhow::Result<api::SandboxDefinition> {
        let local = match &self.repo {
            Some(repo) => local_repo(repo)?,
            None => None,
        };
        let (provider, local_url) = crate::provider::flags::section(crate::provider::flags::Flags {
            image: self.image.as_deref(),
            network: self.network.as_deref(),
            local_repo: local.as_deref(),
        });
        let source = match (&self.repo, local_url) {
            (None, _) => api::source::Source::None(api::NoSource {}),
            (Some(_), Some(url)) => api::source::Source::Git(api::GitSource { url, ..Default::default() }),
            (Some(repo), None) => {
                api::source::Source::Git(api::GitSource { url: repo.clone(), ..Default::default() })
            }
        };
        let mut definition = api::SandboxDefinition {
            id: String::new(),
            provider: Some(provider),
            workspace: Some(api::WorkspaceDefinition {
                source: Some(api::Source { source: Some(source) }),
                setup: self
                    .setup
                    .iter()
                    .map(|s| api::SetupStep { step: Some(api::setup_step::Step::Serial(s.clone())) })
                    .collect(),
                ..Default::default()
            }),
            lifecycle: Some(api::Lifecycle {
                destroy_on_complete: self.destroy_on_complete,
                ..Default::default()
            }),
            env: Default::default(),
            secret_names: self.secret_names.clone(),
            max_journal_bytes: None,
            model_access: self.model_access.clone(),
            network: (!self.allow_hosts.is_empty())
                .then(|| api::Network { allow_hosts: self.allow_hosts.clone(), ..Default::default() }),
            // The run's --policy flags go on the run, within any definition.
            policy: None,
        };
        definition.secret_names.sort();
        definition.secret_names.dedup();
        Ok(definition)
    }
}

/// `Some(absolute path)` when `repo` names a directory on this machine
/// rather than a URL.
fn local_repo(repo: &str) -> anyhow::Result<Option<PathBuf>> {
    if repo.contains("://") || repo.starts_with("git@") {
        return Ok(None);
    }
    let path = Path::new(repo);
    if !path.exists() {
        bail!("--repo {repo:?} is neither a URL (https://, ssh://, file://) nor an existing directory");
    }
    Ok(Some(path.canonicalize().with_context(|| format!("resolving --repo {repo}"))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_files_map_onto_the_definition() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("def.toml");
        std::fs::write(
            &file,
            r#"
id = "node-app"
secret_names = ["ANTHROPIC_API_KEY"]
[provider.docker]
image = "node:22"
memory_bytes = 1073741824
[workspace]
source = { git = { url = "https://example.invalid/app.git", ref = "main" } }
setup = [{ serial = "npm ci" }, { parallel = { commands = ["a", "b"] } }]
[lifecycle]
reuse = "REUSE_NONE"
keep_alive_ms = 600000
"#,
        )
        .unwrap();
        let d = load(&file).unwrap();
        assert_eq!(d.id, "node-app");
        assert_eq!(d.secret_names, ["ANTHROPIC_API_KEY"]);
        let Some(api::provider_spec::Provider::Docker(docker)) = d.provider.unwrap().provider else {
            panic!("docker provider expected")
        };
        assert_eq!(docker.image, "node:22");
        assert_eq!(docker.memory_bytes, 1 << 30);
        let ws = d.workspace.unwrap();
        let Some(api::source::Source::Git(git)) = ws.source.unwrap().source else { panic!("git source") };
        assert_eq!(git.r#ref, "main");
        assert_eq!(ws.setup.len(), 2);
        assert_eq!(ws.setup[0].step, Some(api::setup_step::Step::Serial("npm ci".into())));
        let lifecycle = d.lifecycle.unwrap();
        assert_eq!(lifecycle.reuse(), api::Reuse::None);
        assert_eq!(lifecycle.keep_alive_ms, 600_000);
    }

    #[test]
    fn json_files_and_typos() {
        let d =
            parse(serde_json::json!({"id": "x", "provider": {"local": {}}, "secretNames": ["A"]})).unwrap();
        assert_eq!(d.secret_names, ["A"], "lowerCamelCase JSON names work too");
        let typo = parse(serde_json::json!({"id": "x", "secrets": ["A"]})).unwrap_err();
        assert!(format!("{typo:#}").contains("secrets"), "{typo:#}");
        assert!(parse(serde_json::json!({"provider": {"local": {}}})).is_err(), "id is required");
    }

    #[test]
    fn flags_leave_the_id_to_the_server_and_a_local_repo_is_read_where_the_sandbox_sees_it() {
        let a = FromFlags { setup: vec!["echo hi".into()], ..Default::default() }.build().unwrap();
        assert_eq!(a.id, "", "the server derives the id from the content");
        let dir = tempfile::tempdir().unwrap();
        let flags = FromFlags {
            image: Some("alpine".into()),
            repo: Some(dir.path().display().to_string()),
            ..Default::default()
        };
        let d = flags.build().unwrap();
        let Some(api::source::Source::Git(git)) = d.workspace.unwrap().source.unwrap().source else {
            panic!("a git source")
        };
        assert_eq!(git.url, crate::provider::flags::CONTAINER_REPO_MOUNT);
        assert!(FromFlags { repo: Some("/no/such/dir".into()), ..Default::default() }.build().is_err());
        let remote = FromFlags { repo: Some("https://example.invalid/a.git".into()), ..Default::default() };
        let Some(api::source::Source::Git(git)) =
            remote.build().unwrap().workspace.unwrap().source.unwrap().source
        else {
            panic!("a git source")
        };
        assert_eq!(git.url, "https://example.invalid/a.git");
    }
}
