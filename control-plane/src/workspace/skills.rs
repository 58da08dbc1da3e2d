//! Skills, projected per harness: where each harness reads skills and MCP
//! servers, and its MCP config format, are the harness's own
//! ([`Harness::skills_folder`], [`Harness::mcp_file`],
//! [`Harness::mcp_config`]); here the workspace side: secrets resolved,
//! repositories cloned, files written.
//!
//! | skill | Claude Code | Codex | OpenCode | Gemini CLI | ACP |
//! |---|---|---|---|---|---|
//! | file | the file | the file | the file | the file | the file |
//! | git | `.claude/skills/<name>` | `.codex/skills/<name>` | warning | warning | warning |
//! | MCP | `.mcp.json` | `.codex/config.toml` | `opencode.json` | `.gemini/settings.json` | `.sandhold/acp/mcp-servers.json`, passed to `session/new` |
//! | named | warning | warning | warning | warning | warning |
//!
//! A git skill is cloned at depth 1 into its `into` path (default
//! `.sandhold/skills/<name>`); every folder holding a `SKILL.md` up to 6
//! levels deep is linked (copied where links fail) into each harness's
//! skills folder under the folder's name (the skill's own name for a
//! `SKILL.md` at the top). MCP servers are merged into a config file the
//! repository may already have. A config file with a header drawn from a
//! secret is secret-bearing: it is written only right before a run, for
//! that run's harness, with the secret's current value, so it never sits
//! in a native snapshot taken after setup.

use std::collections::BTreeMap;
use std::time::Duration;

use shared::proto::v1::{McpSkill, Skill, WorkspaceDefinition, header_value, skill};

use super::git::{self, History};
use super::remote::Remote;
use crate::harness::Harness;
use crate::harness::skills::McpServer;
use crate::provision::{Error, Secrets};

/// How deep under a git skill's folder `SKILL.md` files are looked for.
const SKILL_SEARCH_DEPTH: u32 = 6;

/// Where a git skill is cloned, relative to the workspace root.
pub(crate) fn git_skill_dir(s: &shared::proto::v1::GitSkill) -> String {
    if s.into.is_empty() {
        format!(".sandhold/skills/{}", s.name)
    } else {
        s.into.trim_end_matches('/').to_string()
    }
}

fn mcp_skills(w: &WorkspaceDefinition) -> impl Iterator<Item = &McpSkill> {
    w.skills.iter().filter_map(|s| match &s.skill {
        Some(skill::Skill::Mcp(m)) => Some(m),
        _ => None,
    })
}

/// Whether the MCP config files carry a secret's value.
pub(crate) fn mcp_is_secret_bearing(w: &WorkspaceDefinition) -> bool {
    mcp_skills(w).any(|m| {
        m.headers.values().any(|h| {
            matches!(h.value, Some(header_value::Value::Secret(_) | header_value::Value::BearerSecret(_)))
        })
    })
}

/// What `harness` cannot use of the workspace's skills, as warnings.
pub(crate) fn warnings(w: &WorkspaceDefinition, harness: Harness) -> Vec<String> {
    // A harness that reads no skills at all (`command` runs anything) lacks nothing.
    if harness.mcp_file().is_none() && harness.skills_folder().is_none() {
        return Vec::new();
    }
    let name = harness.name();
    let mut out = Vec::new();
    for s in &w.skills {
        match &s.skill {
            Some(skill::Skill::Named(n)) => out
                .push(format!("skill {n:?} skipped: {name} has no skill registry Sandhold can install from")),
            Some(skill::Skill::Git(g)) if harness.skills_folder().is_none() => {
                out.push(format!("git skill {:?} skipped: {name} has no skills folder", g.name))
            }
            _ => {}
        }
    }
    out
}

/// Header values of one MCP server, secrets resolved.
fn resolve_headers(m: &McpSkill, secrets: &Secrets) -> Result<BTreeMap<String, String>, Error> {
    let secret = |name: &str, header: &str| {
        secrets.get(name).map(|s| s.expose().to_string()).ok_or_else(|| Error::SecretNotPassed {
            needs: format!("MCP skill {:?}: header {header:?} needs", m.name),
            name: name.to_string(),
        })
    };
    let mut out = BTreeMap::new();
    for (header, value) in &m.headers {
        let v = match &value.value {
            Some(header_value::Value::Literal(v)) => v.clone(),
            Some(header_value::Value::Secret(s)) => secret(s, header)?,
            Some(header_value::Value::BearerSecret(s)) => format!("Bearer {}", secret(s, header)?),
            None => continue,
        };
        out.insert(header.clone(), v);
    }
    Ok(out)
}

/// Write the MCP config of each of `harnesses` (when the workspace has MCP
/// skills). Returns warnings for config files that could not be merged.
pub(crate) async fn project_mcp(
    remote: &Remote<'_>,
    w: &WorkspaceDefinition,
    secrets: &Secrets,
    harnesses: &[Harness],
) -> Result<Vec<String>, Error> {
    let servers = mcp_skills(w)
        .map(|m| {
            Ok(McpServer { name: m.name.clone(), url: m.url.clone(), headers: resolve_headers(m, secrets)? })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let mut warnings = Vec::new();
    if servers.is_empty() {
        return Ok(warnings);
    }
    for &harness in harnesses {
        let Some(path) = harness.mcp_file() else { continue };
        let existing = remote.read(path).await?;
        match harness.mcp_config(existing.as_deref(), &servers) {
            Ok(bytes) => remote.write(path, &bytes, Some(0o600)).await?,
            Err(why) => warnings.push(format!(
                "MCP skills skipped for {}: the workspace's {path} is not valid ({why})",
                harness.name()
            )),
        }
    }
    Ok(warnings)
}

/// Write each file skill.
pub(crate) async fn write_file_skills(remote: &Remote<'_>, w: &WorkspaceDefinition) -> Result<(), Error> {
    for s in &w.skills {
        if let Some(skill::Skill::File(f)) = &s.skill {
            remote.write(&f.path, f.content.as_bytes(), None).await?;
        }
    }
    Ok(())
}

/// Clone each git skill (unless already there) and link its skill folders
/// into every harness's skills folder.
pub(crate) async fn install_git_skills(
    remote: &Remote<'_>,
    w: &WorkspaceDefinition,
    secrets: &Secrets,
    timeout: Duration,
) -> Result<Vec<String>, Error> {
    let mut notes = Vec::new();
    for s in &w.skills {
        let Some(skill::Skill::Git(g)) = &s.skill else { continue };
        let dir = git_skill_dir(g);
        if !remote.exists(&format!("{dir}/.git")).await? {
            let token = git::auth_token(secrets, &g.auth_secret, &format!("git skill {:?}", g.name))?;
            let clone =
                git::Clone { url: &g.url, git_ref: &g.r#ref, history: History::Depth(1), into: &dir, token };
            git::clone(remote, &clone, timeout).await?;
        }
        let found = skill_folders(remote, &dir, &g.name).await?;
        if found.is_empty() {
            notes.push(format!(
                "git skill {:?}: no SKILL.md within {SKILL_SEARCH_DEPTH} levels of {dir}",
                g.name
            ));
        }
        for (name, folder) in found {
            for harness in Harness::ALL {
                let Some(base) = harness.skills_folder() else { continue };
                let link = format!("{base}/{name}");
                remote.link_or_copy(&relative_target(&link, &folder), &link, &folder).await?;
            }
        }
    }
    Ok(notes)
}

/// `(skill name, folder)` for each `SKILL.md` under `dir`, shallowest
/// first; a name seen twice keeps its first folder.
async fn skill_folders(
    remote: &Remote<'_>,
    dir: &str,
    top_name: &str,
) -> Result<Vec<(String, String)>, Error> {
    let mut paths: Vec<String> = remote
        .list(dir, SKILL_SEARCH_DEPTH)
        .await?
        .into_iter()
        .filter(|e| e.name == "SKILL.md" && !e.path.split('/').any(|c| c == ".git"))
        .map(|e| e.path)
        .collect();
    paths.sort_by_key(|p| (p.matches('/').count(), p.clone()));
    let mut out: Vec<(String, String)> = Vec::new();
    for path in paths {
        let folder = path.strip_suffix("/SKILL.md").unwrap_or(dir).to_string();
        let name = if folder == dir {
            top_name.to_string()
        } else {
            folder.rsplit('/').next().unwrap_or(top_name).to_string()
        };
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, folder));
        }
    }
    Ok(out)
}

/// The symlink target that makes `link` point at `target` (both relative
/// to the workspace root).
fn relative_target(link: &str, target: &str) -> String {
    let ups = link.matches('/').count();
    format!("{}{target}", "../".repeat(ups))
}

/// Whether the workspace has any skill at all.
pub(crate) fn any(w: &WorkspaceDefinition) -> bool {
    w.skills.iter().any(|s: &Skill| s.skill.is_some())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use shared::error::ErrorCode;
    use shared::proto::v1::{GitSkill, HeaderValue};
    use shared::secret::Secret;

    fn mcp(headers: Vec<(&str, header_value::Value)>) -> WorkspaceDefinition {
        WorkspaceDefinition {
            skills: vec![Skill {
                skill: Some(skill::Skill::Mcp(McpSkill {
                    name: "docs".into(),
                    url: "https://mcp.example/x".into(),
                    headers: headers
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), HeaderValue { value: Some(v) }))
                        .collect(),
                })),
            }],
            ..Default::default()
        }
    }

    fn servers(w: &WorkspaceDefinition, secrets: &Secrets) -> Vec<McpServer> {
        mcp_skills(w)
            .map(|m| McpServer {
                name: m.name.clone(),
                url: m.url.clone(),
                headers: resolve_headers(m, secrets).unwrap(),
            })
            .collect()
    }

    #[test]
    fn configs_per_harness_merge_into_what_is_there() {
        let w = mcp(vec![("Authorization", header_value::Value::BearerSecret("TOK".into()))]);
        let secrets: Secrets = [("TOK".to_string(), Secret::new("v-123"))].into();
        let s = servers(&w, &secrets);
        let claude: Value = serde_json::from_slice(
            &Harness::ClaudeCode
                .mcp_config(Some(br#"{"mcpServers":{"old":{"url":"u"}},"x":1}"#), &s)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claude["mcpServers"]["docs"]["headers"]["Authorization"], "Bearer v-123");
        assert_eq!(claude["mcpServers"]["old"]["url"], "u", "servers already there are kept");
        assert_eq!(claude["x"], 1);
        let codex =
            String::from_utf8(Harness::Codex.mcp_config(Some(b"model = \"m\"\n"), &s).unwrap()).unwrap();
        let parsed: toml::Table = codex.parse().unwrap();
        assert_eq!(parsed["model"].as_str(), Some("m"));
        assert_eq!(parsed["mcp_servers"]["docs"]["url"].as_str(), Some("https://mcp.example/x"));
        assert_eq!(
            parsed["mcp_servers"]["docs"]["http_headers"]["Authorization"].as_str(),
            Some("Bearer v-123")
        );
        let opencode: Value =
            serde_json::from_slice(&Harness::OpenCode.mcp_config(None, &s).unwrap()).unwrap();
        assert_eq!(opencode["mcp"]["docs"]["type"], "remote");
        assert_eq!(opencode["mcp"]["docs"]["headers"]["Authorization"], "Bearer v-123");
        assert!(Harness::ClaudeCode.mcp_config(Some(b"not json"), &s).is_err());
        // ACP's `mcpServers`, whatever the file held before.
        let acp: Value =
            serde_json::from_slice(&Harness::Acp.mcp_config(Some(b"stale"), &s).unwrap()).unwrap();
        let header = serde_json::json!([{ "name": "Authorization", "value": "Bearer v-123" }]);
        let want = serde_json::json!([{ "type": "http", "name": "docs", "url": "https://mcp.example/x", "headers": header }]);
        assert_eq!(acp, want);
    }

    #[test]
    fn a_missing_secret_is_named_without_a_value() {
        let w = mcp(vec![("X-Key", header_value::Value::Secret("KEY".into()))]);
        let m = mcp_skills(&w).next().unwrap();
        let err = shared::error::Error::from(resolve_headers(m, &Secrets::new()).unwrap_err());
        assert_eq!(err.code, ErrorCode::FailedPrecondition);
        assert!(err.message.contains("KEY"), "{}", err.message);
        assert!(mcp_is_secret_bearing(&w));
        assert!(!mcp_is_secret_bearing(&mcp(vec![("X", header_value::Value::Literal("l".into()))])));
    }

    #[test]
    fn what_a_harness_lacks_is_a_warning() {
        let w = WorkspaceDefinition {
            skills: vec![
                Skill { skill: Some(skill::Skill::Named("tanstack".into())) },
                Skill { skill: Some(skill::Skill::Git(GitSkill { name: "g".into(), ..Default::default() })) },
            ],
            ..Default::default()
        };
        assert_eq!(warnings(&w, Harness::ClaudeCode).len(), 1);
        let open = warnings(&w, Harness::OpenCode);
        assert_eq!(open.len(), 2, "{open:?}");
        assert!(open[1].contains("\"g\"") && open[1].contains("opencode"), "{open:?}");
        assert!(warnings(&w, Harness::Command).is_empty());
    }

    #[test]
    fn links_point_back_up_to_the_root() {
        assert_eq!(relative_target(".claude/skills/a", ".sandhold/skills/g/a"), "../../.sandhold/skills/g/a");
        assert_eq!(relative_target("CLAUDE.md", "AGENTS.md"), "AGENTS.md");
    }
}
