//! The sandbox key: which sandbox an ensure means.
//!
//! `sha256(canonical(tenant, definition id, provider options, definition
//! env and secret names, workspace, thread id [, run id]))`, hex. Secret
//! VALUES never enter it, so rotating a secret keeps the sandbox; anything
//! that changes what the sandbox is (image, repo, setup, ...) gives a new one.
//!
//! The canonical encoding is hand-rolled on purpose: protobuf encoding is not
//! canonical (map order is unspecified), and JSON would tie the key to a
//! serializer's choices. Every value is written as `tag` (a field name),
//! then its length as 8 bytes big-endian, then its bytes; nested messages are
//! written as their own canonical bytes; maps in key order; repeated fields
//! with their count first. Absent optional values are written as the tag
//! `-`. The encoding starts with a version tag (`sandhold.sandbox-key.v1`):
//! changing any rule here changes every key, so bump it.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use shared::proto::v1::{
    GitSource, SandboxDefinition, SetupStep, Skill, WorkspaceDefinition, git_source, header_value,
    setup_step, skill, source,
};

use crate::provider::{Canon, ProviderKind};

const VERSION: &str = "sandhold.sandbox-key.v1";

/// What identifies a sandbox besides its definition.
#[derive(Debug, Clone, Copy)]
pub struct KeyInput<'a> {
    pub tenant: &'a str,
    pub thread_id: &'a str,
    /// Folded in only with `reuse: none`.
    pub run_id: Option<&'a str>,
}

/// The sandbox key of `definition` for `input`: 64 hex characters.
pub fn sandbox_key(definition: &SandboxDefinition, input: KeyInput<'_>) -> String {
    let mut c = of_definition(definition, input.tenant);
    c.str("thread_id", input.thread_id);
    match input.run_id {
        Some(run) => c.str("run_id", run),
        None => c.absent("run_id"),
    };
    hex::encode(Sha256::digest(c.into_bytes()))
}

/// What a sandbox of `definition` is, for no thread yet: the digest a warm
/// pool's sandboxes are made under, which changes exactly when the
/// sandbox key of every thread would (a pooled sandbox of an older digest
/// is never claimed). 64 hex characters, never a sandbox key.
pub fn pool_digest(definition: &SandboxDefinition, tenant: &str) -> String {
    let mut c = of_definition(definition, tenant);
    c.absent("thread_id").str("warm_pool", "");
    hex::encode(Sha256::digest(c.into_bytes()))
}

fn of_definition(definition: &SandboxDefinition, tenant: &str) -> Canon {
    let mut c = Canon::default();
    c.str("version", VERSION).str("tenant", tenant).str("definition_id", &definition.id);
    match ProviderKind::of(definition) {
        Some((kind, section)) => {
            c.str("provider", kind.as_str());
            kind.kind().key(section, &mut c);
        }
        None => {
            c.absent("provider");
        }
    }
    c.map("env", &definition.env);
    let mut names = definition.secret_names.clone();
    names.sort();
    c.list("secret_names", &names, |n| {
        let mut i = Canon::default();
        i.str("name", n);
        i
    });
    match &definition.workspace {
        Some(w) => c.nested("workspace", workspace(w)),
        None => c.absent("workspace"),
    };
    c
}

fn workspace(w: &WorkspaceDefinition) -> Canon {
    let mut c = Canon::default();
    match w.source.as_ref().and_then(|s| s.source.as_ref()) {
        Some(source::Source::Git(g)) => c.nested("git", git(g)),
        Some(source::Source::None(_)) | None => c.str("source", "none"),
    };
    c.list("setup", &w.setup, setup);
    match w.setup_step_timeout_ms {
        Some(ms) => c.num("setup_step_timeout_ms", ms),
        None => c.absent("setup_step_timeout_ms"),
    };
    c.map("scripts", &w.scripts)
        .str("instructions", &w.instructions)
        .list("skills", &w.skills, skill_canon)
        .str("package_manager", &w.package_manager);
    c
}

fn git(g: &GitSource) -> Canon {
    let mut c = Canon::default();
    c.str("url", &g.url).str("ref", &g.r#ref);
    match g.history {
        Some(git_source::History::Depth(d)) => c.num("depth", d),
        Some(git_source::History::Full(f)) => c.num("full", f),
        None => c.absent("history"),
    };
    // The secret's NAME only: its value may rotate freely.
    c.str("auth_secret", &g.auth_secret);
    c
}

fn setup(step: &SetupStep) -> Canon {
    let mut c = Canon::default();
    match &step.step {
        Some(setup_step::Step::Serial(cmd)) => c.str("serial", cmd),
        Some(setup_step::Step::Parallel(group)) => c.list("parallel", &group.commands, |cmd| {
            let mut i = Canon::default();
            i.str("command", cmd);
            i
        }),
        None => c.absent("step"),
    };
    c
}

fn skill_canon(s: &Skill) -> Canon {
    let mut c = Canon::default();
    match &s.skill {
        Some(skill::Skill::File(f)) => c.str("kind", "file").str("path", &f.path).str("content", &f.content),
        Some(skill::Skill::Git(g)) => c
            .str("kind", "git")
            .str("name", &g.name)
            .str("url", &g.url)
            .str("ref", &g.r#ref)
            .str("into", &g.into)
            .str("auth_secret", &g.auth_secret),
        Some(skill::Skill::Mcp(m)) => {
            let headers: BTreeMap<&String, String> = m
                .headers
                .iter()
                .map(|(k, v)| {
                    // Literal values are part of the definition; secret
                    // headers contribute only the secret's name.
                    let v = match v.value.as_ref() {
                        Some(header_value::Value::Literal(l)) => format!("literal:{l}"),
                        Some(header_value::Value::Secret(n)) => format!("secret:{n}"),
                        Some(header_value::Value::BearerSecret(n)) => format!("bearer_secret:{n}"),
                        None => "-".to_string(),
                    };
                    (k, v)
                })
                .collect();
            c.str("kind", "mcp").str("name", &m.name).str("url", &m.url);
            let mut h = Canon::default();
            h.num("len", headers.len());
            for (k, v) in headers {
                h.str("k", k).str("v", &v);
            }
            c.nested("headers", h)
        }
        Some(skill::Skill::Named(n)) => c.str("kind", "named").str("name", n),
        None => c.absent("skill"),
    };
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::proto::v1::{DockerProvider, ParallelGroup, ProviderSpec, Source, provider_spec};

    fn definition() -> SandboxDefinition {
        SandboxDefinition {
            id: "web".into(),
            provider: Some(ProviderSpec {
                provider: Some(provider_spec::Provider::Docker(DockerProvider {
                    image: "busybox:1".into(),
                    ..Default::default()
                })),
            }),
            workspace: Some(WorkspaceDefinition {
                source: Some(Source {
                    source: Some(source::Source::Git(GitSource {
                        url: "https://example.test/repo.git".into(),
                        auth_secret: "GIT_TOKEN".into(),
                        ..Default::default()
                    })),
                }),
                setup: vec![SetupStep { step: Some(setup_step::Step::Serial("make deps".into())) }],
                ..Default::default()
            }),
            env: [("A".to_string(), "1".to_string()), ("B".to_string(), "2".to_string())].into(),
            secret_names: vec!["GIT_TOKEN".into()],
            ..Default::default()
        }
    }

    fn key(d: &SandboxDefinition) -> String {
        sandbox_key(d, KeyInput { tenant: "acme", thread_id: "t1", run_id: None })
    }

    #[test]
    fn the_key_is_stable_and_hex() {
        let k = key(&definition());
        assert_eq!(k.len(), 64);
        assert!(k.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(k, key(&definition()));
    }

    #[test]
    fn changing_image_repo_or_setup_changes_the_key() {
        let base = key(&definition());
        let mut d = definition();
        if let Some(provider_spec::Provider::Docker(docker)) =
            d.provider.as_mut().and_then(|p| p.provider.as_mut())
        {
            docker.image = "busybox:2".into();
        }
        assert_ne!(key(&d), base, "image");

        let mut d = definition();
        if let Some(source::Source::Git(g)) =
            d.workspace.as_mut().and_then(|w| w.source.as_mut()).and_then(|s| s.source.as_mut())
        {
            g.url = "https://example.test/other.git".into();
        }
        assert_ne!(key(&d), base, "repo");

        let mut d = definition();
        d.workspace.as_mut().unwrap().setup.push(SetupStep {
            step: Some(setup_step::Step::Parallel(ParallelGroup { commands: vec!["a".into(), "b".into()] })),
        });
        assert_ne!(key(&d), base, "setup");
    }

    #[test]
    fn tenant_thread_and_run_are_part_of_the_key() {
        let d = definition();
        let base = key(&d);
        assert_ne!(sandbox_key(&d, KeyInput { tenant: "other", thread_id: "t1", run_id: None }), base);
        assert_ne!(sandbox_key(&d, KeyInput { tenant: "acme", thread_id: "t2", run_id: None }), base);
        assert_ne!(sandbox_key(&d, KeyInput { tenant: "acme", thread_id: "t1", run_id: Some("r") }), base);
    }

    #[test]
    fn map_order_does_not_matter_and_fields_do_not_run_together() {
        let mut a = definition();
        a.env = [("A".to_string(), "1".to_string()), ("B".to_string(), "2".to_string())].into();
        let mut b = definition();
        b.env = [("B".to_string(), "2".to_string()), ("A".to_string(), "1".to_string())].into();
        assert_eq!(key(&a), key(&b));
        // Length prefixes keep "AB"+"C" apart from "A"+"BC".
        let mut c = definition();
        c.env = [("AB".to_string(), "C".to_string())].into();
        let mut d = definition();
        d.env = [("A".to_string(), "BC".to_string())].into();
        assert_ne!(key(&c), key(&d));
    }
}
