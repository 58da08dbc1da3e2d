//! What makes a workspace definition invalid: every problem as a field
//! violation, checked before anything is provisioned (and, with the
//! declared secret names, when a definition is put).

use std::collections::HashSet;

use shared::proto::v1::{WorkspaceDefinition, git_source, header_value, skill, source};

use crate::provision::valid_env_name;

/// A path relative to the workspace root that stays inside it.
fn valid_relative_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\0')
        && p.trim_end_matches('/').split('/').all(|c| !c.is_empty() && c != ".." && c != ".")
}

/// A skill or server name: `[A-Za-z0-9_-][A-Za-z0-9._-]*`, 1-64 chars.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && !n.starts_with('.')
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Every problem of a workspace definition as `(field, why)`, fields under
/// `prefix`. With `declared`, secrets the workspace refers to must be
/// among them.
pub fn violations(
    w: &WorkspaceDefinition,
    declared: Option<&[String]>,
    prefix: &str,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut bad = |field: String, why: &str| out.push((format!("{prefix}.{field}"), why.to_string()));
    let secret_ref = |field: String, name: &str, bad: &mut dyn FnMut(String, &str)| {
        if !valid_env_name(name) {
            bad(field, "not a valid secret name");
        } else if declared.is_some_and(|d| !d.iter().any(|s| s == name)) {
            bad(field, "names a secret the definition does not declare in secret_names");
        }
    };
    if let Some(source::Source::Git(g)) = w.source.as_ref().and_then(|s| s.source.as_ref()) {
        if g.url.trim().is_empty() {
            bad("source.git.url".into(), "required");
        }
        if g.history == Some(git_source::History::Depth(0)) {
            bad("source.git.depth".into(), "must be at least 1 (or use full)");
        }
        if !g.auth_secret.is_empty() {
            secret_ref("source.git.auth_secret".into(), &g.auth_secret, &mut bad);
        }
    }
    if w.setup_step_timeout_ms == Some(0) {
        bad("setup_step_timeout_ms".into(), "must be positive (unset: 30 minutes)");
    }
    for (name, command) in &w.scripts {
        if !valid_name(name) {
            bad(format!("scripts[{name}]"), "script names are 1-64 characters of [A-Za-z0-9._-]");
        }
        if command.trim().is_empty() || command.contains('\n') || command.contains('`') {
            bad(format!("scripts[{name}]"), "a script is one non-empty line without backticks");
        }
    }
    if !w.package_manager.is_empty() && !valid_name(&w.package_manager) {
        bad("package_manager".into(), "a name such as pnpm, yarn, bun or npm");
    }
    let mut names = HashSet::new();
    for (i, s) in w.skills.iter().enumerate() {
        let field = |f: &str| format!("skills[{i}]{f}");
        match &s.skill {
            None => bad(field(""), "empty skill"),
            Some(skill::Skill::File(f)) => {
                if !valid_relative_path(&f.path) {
                    bad(field(".file.path"), "a relative path inside the workspace");
                }
            }
            Some(skill::Skill::Git(g)) => {
                name_and_url(&mut names, "git", &g.name, &g.url, &field(".git"), &mut bad);
                if !g.into.is_empty() && !valid_relative_path(&g.into) {
                    bad(field(".git.into"), "a relative path inside the workspace");
                }
                if !g.auth_secret.is_empty() {
                    secret_ref(field(".git.auth_secret"), &g.auth_secret, &mut bad);
                }
            }
            Some(skill::Skill::Mcp(m)) => {
                name_and_url(&mut names, "mcp", &m.name, &m.url, &field(".mcp"), &mut bad);
                for (header, value) in &m.headers {
                    let hf = field(&format!(".mcp.headers[{header}]"));
                    if header.is_empty()
                        || !header.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
                    {
                        bad(hf.clone(), "not a valid header name");
                    }
                    match &value.value {
                        None => bad(hf, "needs a literal, secret or bearer_secret"),
                        Some(header_value::Value::Literal(_)) => {}
                        Some(header_value::Value::Secret(s) | header_value::Value::BearerSecret(s)) => {
                            secret_ref(hf, s, &mut bad)
                        }
                    }
                }
            }
            Some(skill::Skill::Named(n)) => {
                if n.trim().is_empty() {
                    bad(field(".named"), "required");
                }
            }
        }
    }
    out
}

/// A git or MCP skill's name (valid, unique per kind) and URL (present).
fn name_and_url(
    names: &mut HashSet<(&'static str, String)>,
    kind: &'static str,
    name: &str,
    url: &str,
    field: &str,
    bad: &mut dyn FnMut(String, &str),
) {
    if !valid_name(name) {
        bad(format!("{field}.name"), "1-64 characters of [A-Za-z0-9._-], not starting with a dot");
    } else if !names.insert((kind, name.to_string())) {
        bad(format!("{field}.name"), "two skills of this kind have this name");
    }
    if url.trim().is_empty() {
        bad(format!("{field}.url"), "required");
    }
}

#[cfg(test)]
mod tests {
    use shared::error::ErrorCode;
    use shared::proto::v1::{GitSource, HeaderValue, McpSkill, Skill, Source};

    use super::*;
    use crate::provision::Provisioner;
    use crate::workspace::WorkspaceProvisioner;

    #[test]
    fn problems_are_field_violations_and_secrets_must_be_declared() {
        let w = WorkspaceDefinition {
            source: Some(Source {
                source: Some(source::Source::Git(GitSource {
                    url: String::new(),
                    history: Some(git_source::History::Depth(0)),
                    auth_secret: "GH".into(),
                    ..Default::default()
                })),
            }),
            skills: vec![
                Skill {
                    skill: Some(skill::Skill::File(shared::proto::v1::FileSkill {
                        path: "../x".into(),
                        content: String::new(),
                    })),
                },
                Skill {
                    skill: Some(skill::Skill::Mcp(McpSkill {
                        name: "m".into(),
                        url: "https://m".into(),
                        headers: [(
                            "Authorization".to_string(),
                            HeaderValue {
                                value: Some(header_value::Value::BearerSecret("MCP_TOKEN".into())),
                            },
                        )]
                        .into(),
                    })),
                },
            ],
            ..Default::default()
        };
        let declared = vec!["GH".to_string()];
        let fields: Vec<String> = violations(&w, Some(&declared), "w").into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            vec![
                "w.source.git.url",
                "w.source.git.depth",
                "w.skills[0].file.path",
                "w.skills[1].mcp.headers[Authorization]",
            ]
        );
        assert_eq!(
            violations(&w, None, "w").len(),
            3,
            "undeclared secrets are only checked with a definition"
        );
        let err = shared::error::Error::from(WorkspaceProvisioner.check(&w).unwrap_err());
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(WorkspaceProvisioner.check(&WorkspaceDefinition::default()).is_ok());
    }

    #[test]
    fn paths_stay_inside_the_workspace() {
        for ok in ["a", "a/b.md", ".claude/x", "dir/"] {
            assert!(valid_relative_path(ok), "{ok}");
        }
        for bad in ["", "/etc/x", "a/../../b", "..", "./a", "a//b"] {
            assert!(!valid_relative_path(bad), "{bad}");
        }
    }
}
