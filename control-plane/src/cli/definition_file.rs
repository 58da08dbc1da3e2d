//! Sandbox definitions for the command line: read from a file (TOML or
//! JSON), or made from `sandhold run`'s flags.
//!
//! The file format is the `sandhold.v1.SandboxDefinition` message in the
//! proto3 JSON mapping, written as JSON or as the same structure in TOML:
//! field names as in `proto/sandhold/v1/sandbox.proto` (`secret_names`, or
//! their lowerCamelCase JSON names), a oneof as a table keyed by the chosen
//! field (`[provider.docker]`, `{ serial = "npm ci" }`), enums by name
//! (`reuse = "REUSE_NONE"`) or by the word CLI JSON prints (`reuse =
//! "none"`, so what `definitions ls --output json` prints applies again).
//! Unknown fields are refused, so a typo does not pass silently. Example:
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

use super::output::{POOL, each_enum, enum_name};

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
    from_value_text(text, ext).map_err(|e| match unknown_field(&format!("{e:#}")) {
        Some(name) => anyhow::anyhow!("{}", explain_unknown(text, name)),
        None => e,
    })
}

fn from_value_text(text: &str, ext: &str) -> anyhow::Result<api::SandboxDefinition> {
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
pub fn parse(mut value: serde_json::Value) -> anyhow::Result<api::SandboxDefinition> {
    let descriptor =
        POOL.get_message_by_name("sandhold.v1.SandboxDefinition").expect("SandboxDefinition is in the pool");
    each_enum(&descriptor, &mut value, &mut |e, v| {
        if let serde_json::Value::String(word) = v
            && let Some(name) = enum_name(e, word)
        {
            *word = name;
        }
    });
    let dynamic = DynamicMessage::deserialize_with_options(descriptor, value, &DeserializeOptions::new())
        .map_err(|e| anyhow::anyhow!("not a SandboxDefinition: {e}"))?;
    let definition: api::SandboxDefinition = dynamic.transcode_to()?;
    if definition.id.is_empty() {
        bail!("`id` is missing (the name the definition is stored under)");
    }
    Ok(definition)
}

/// The field a deserialization error says is unknown.
fn unknown_field(message: &str) -> Option<&str> {
    let rest = &message[message.find("unrecognized field name '")? + "unrecognized field name '".len()..];
    rest.split('\'').next()
}

/// An unknown field with where it is (line and column of its first use as
/// a key) and the nearest field the format has, if one is near.
fn explain_unknown(text: &str, name: &str) -> String {
    let position = key_position(text, name);
    let at = position.map(|(l, c, _)| format!("line {l}, column {c}: ")).unwrap_or_default();
    // A key of the definition itself is compared with its own fields only.
    let known = field_names(position.is_some_and(|(_, _, top)| top));
    let common = |k: &str| k.chars().zip(name.chars()).take_while(|(a, b)| a == b).count();
    let nearest = known
        .iter()
        .map(|k| (edit_distance(name, k), k))
        .filter(|(d, k)| *d <= (k.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
        // Else a field that begins the same way (`secrets`: `secret_names`).
        .or_else(|| known.iter().filter(|k| common(k) >= 5).max_by_key(|k| common(k)))
        .map(|k| format!("; did you mean `{k}`?"))
        .unwrap_or_default();
    format!(
        "{at}unknown field `{name}`{nearest} (the fields are those of sandhold.v1.SandboxDefinition in proto/sandhold/v1/sandbox.proto)"
    )
}

/// 1-based line and column of `name` used as a key: followed (after blanks
/// or a closing quote) by `=`, `:`, `.` or `]`; and whether it is a key of
/// the definition itself (TOML: before any table header, outside braces;
/// JSON: in the outermost object).
fn key_position(text: &str, name: &str) -> Option<(usize, usize, bool)> {
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut from = 0;
    while let Some(i) = text[from..].find(name).map(|i| i + from) {
        let end = i + name.len();
        let before_ok = i == 0 || !word(bytes[i - 1]);
        let after = text[end..].trim_start_matches(['"', '\'', ' ', '\t']);
        if before_ok && (end >= bytes.len() || !word(bytes[end])) && after.starts_with(['=', ':', '.', ']']) {
            let line = text[..i].matches('\n').count() + 1;
            let column = i - text[..i].rfind('\n').map_or(0, |n| n + 1) + 1;
            let before = &text[..i];
            let depth =
                before.matches(['{', '[']).count() as isize - before.matches(['}', ']']).count() as isize;
            let top = if text.trim_start().starts_with('{') {
                depth == 1
            } else {
                depth == 0 && !before.lines().any(|l| l.trim_start().starts_with('['))
            };
            return Some((line, column, top));
        }
        from = end;
    }
    None
}

/// Every field name (and JSON name) of the definition and, unless only its
/// own are asked for, of its messages.
fn field_names(own_only: bool) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec![POOL.get_message_by_name("sandhold.v1.SandboxDefinition").expect("in the pool")];
    while let Some(message) = todo.pop() {
        if !seen.insert(message.full_name().to_string()) {
            continue;
        }
        for field in message.fields() {
            names.insert(field.name().to_string());
            names.insert(field.json_name().to_string());
            if let prost_reflect::Kind::Message(m) = field.kind()
                && !own_only
            {
                todo.push(m);
            }
        }
    }
    names.into_iter().collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
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
    /// `--runtime` for containers.
    pub runtime: Option<String>,
    /// One-off runs (no `--thread`) remove their sandbox once completed.
    pub destroy_on_complete: bool,
    /// Model access through the broker (the harness and `--model-upstream`;
    /// the server settles which secret is the key).
    pub model_access: Vec<api::ModelAccess>,
    /// `--allow-host`: the egress proxy's allowlist.
    pub allow_hosts: Vec<String>,
    /// `--warm`: sandboxes kept ready (`lifecycle.warm`).
    pub warm: u32,
    /// Portable snapshots (what `--attempts` starts from and compares).
    pub portable_snapshots: bool,
    /// `--require`: labels the sandbox's node must carry.
    pub require: Vec<String>,
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
            runtime: self.runtime.as_deref(),
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
                warm: self.warm,
                portable_snapshots: self
                    .portable_snapshots
                    .then(|| api::PortableSnapshots { enabled: true, ..Default::default() }),
                ..Default::default()
            }),
            budget: None,
            env: Default::default(),
            secret_names: self.secret_names.clone(),
            max_journal_bytes: None,
            model_access: self.model_access.clone(),
            network: (!self.allow_hosts.is_empty())
                .then(|| api::Network { allow_hosts: self.allow_hosts.clone(), ..Default::default() }),
            // The run's --policy flags go on the run, within any definition.
            policy: None,
            placement: (!self.require.is_empty()).then(|| api::Placement { require: self.require.clone() }),
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
    fn an_unknown_field_is_placed_and_the_nearest_one_suggested() {
        let text = "id = \"x\"\n[provider.local]\n[workspace]\nsetup = [{ serail = \"npm ci\" }]\n";
        let e = format!("{:#}", from_text(text, "toml").unwrap_err());
        assert!(e.starts_with("line 4, column 12: unknown field `serail`; did you mean `serial`?"), "{e}");
        let e = format!("{:#}", from_text(r#"{"id": "x", "provider": {"dokcer": {}}}"#, "json").unwrap_err());
        assert!(e.contains("line 1, column 27") && e.contains("did you mean `docker`?"), "{e}");
        let e = format!("{:#}", from_text("id = \"x\"\nzzzzzz = 1\n", "toml").unwrap_err());
        assert!(e.contains("unknown field `zzzzzz`") && !e.contains("did you mean"), "{e}");
        let e = format!("{:#}", from_text("id = \"x\"\nsecrets = [\"A\"]\n", "toml").unwrap_err());
        assert!(e.contains("line 2, column 1") && e.contains("did you mean `secret_names`?"), "{e}");
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

    /// What `definitions ls --output json` prints (enum values as words)
    /// applies again as it is.
    #[test]
    fn a_definition_printed_as_cli_json_reads_back_the_same() {
        let d = api::SandboxDefinition {
            id: "x".into(),
            lifecycle: Some(api::Lifecycle {
                reuse: api::Reuse::None as i32,
                snapshot: api::SnapshotPolicy::AfterSetup as i32,
                ..Default::default()
            }),
            policy: Some(api::SandboxPolicy {
                default: api::PolicyEffect::Ask as i32,
                rules: vec![api::PolicyRule {
                    action: api::PolicyAction::FileWrite as i32,
                    pattern: "docs/**".into(),
                    effect: api::PolicyEffect::Allow as i32,
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let printed = super::super::output::message_json(&d, "SandboxDefinition");
        assert_eq!(printed["lifecycle"]["reuse"], "none");
        assert_eq!(printed["policy"]["rules"][0]["action"], "file_write");
        assert_eq!(parse(printed).unwrap(), d);
        let e = format!(
            "{:#}",
            from_text("id = \"x\"\n[lifecycle]\nreuse = \"sometimes\"\n", "toml").unwrap_err()
        );
        assert!(e.contains("sometimes"), "an unknown word is still refused: {e}");
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
