//! Workspace provisioning (issue #6) through a real server, on the local
//! provider and on Docker (the Debian test image, with git and bash): git
//! sources, setup on the persistent shell, instructions, skills projected per
//! harness, and where secrets must never end up.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane::agent::AgentClient;
use control_plane::harness::Harness as Cli;
use control_plane::provider::{
    DockerOptions, DockerProvider, DockerProviderOptions, LocalProvider, LocalProviderOptions, Provider,
    SandboxSpec,
};
use control_plane::provision::Progress;
use control_plane::provision::{ProvisionContext, Provisioner, Secrets};
use control_plane::workspace::{WorkspaceProvisioner, project_for_run};
use sandhold_tests::docker::{self, DEBIAN_IMAGE as DEBIAN, DockerCleanup, ensure_debian_image};
use sandhold_tests::local::git;
use sandhold_tests::provider::{self, Kind};
use sandhold_tests::runtime::Runtime;
use sandhold_tests::sandbox::*;
use sandhold_tests::server::{Harness, captured_logs};
use sandhold_tests::under_each_runtime;
use shared::proto::v1 as api;
use shared::secret::Secret;

/// Where the fixtures directory is mounted in Docker sandboxes.
const FIXTURES_IN_CONTAINER: &str = "/fixtures";

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Bare repositories the tests clone, made with the host's git:
/// - `app.git`: 3 commits on `main` (app.txt v1..v3, a pnpm lockfile) and a
///   branch `other` with other.txt;
/// - `skills.git`: a SKILL.md at the top, `tools/lint/SKILL.md`, one 6
///   levels down (`p/q/r/s/near`) and one 7 levels down (`p/q/r/s/t/far`).
struct Fixtures {
    dir: sandhold_tests::local::TestDir,
}

impl Fixtures {
    fn new() -> Self {
        let dir = sandhold_tests::local::TestDir::new("ws-fixtures");
        let work = dir.path().join("work-app");
        std::fs::create_dir_all(&work).unwrap();
        git(&work, &["init", "-q"]);
        for v in 1..=3 {
            write(&work.join("app.txt"), &format!("v{v}\n"));
            if v == 1 {
                write(&work.join("pnpm-lock.yaml"), "lockfileVersion: '9.0'\n");
            }
            git(&work, &["add", "."]);
            git(&work, &["commit", "-q", "-m", &format!("v{v}")]);
        }
        git(&work, &["checkout", "-q", "-b", "other"]);
        write(&work.join("other.txt"), "on other\n");
        git(&work, &["add", "."]);
        git(&work, &["commit", "-q", "-m", "other"]);
        git(&work, &["checkout", "-q", "main"]);
        git(dir.path(), &["clone", "-q", "--bare", "work-app", "app.git"]);

        let skills = dir.path().join("work-skills");
        std::fs::create_dir_all(&skills).unwrap();
        git(&skills, &["init", "-q"]);
        write(&skills.join("SKILL.md"), "---\nname: top\n---\ntop skill\n");
        write(&skills.join("tools/lint/SKILL.md"), "---\nname: lint\n---\nlint skill\n");
        write(&skills.join("p/q/r/s/near/SKILL.md"), "near skill\n");
        write(&skills.join("p/q/r/s/t/far/SKILL.md"), "far skill\n");
        git(&skills, &["add", "."]);
        git(&skills, &["commit", "-q", "-m", "skills"]);
        git(dir.path(), &["clone", "-q", "--bare", "work-skills", "skills.git"]);
        Self { dir }
    }

    /// The URL of bare repo `name` as a sandbox of `kind` sees it.
    fn url(&self, kind: Kind, name: &str) -> String {
        match kind {
            Kind::Local => format!("file://{}", self.dir.path().join(name).display()),
            Kind::Docker => format!("file://{FIXTURES_IN_CONTAINER}/{name}"),
        }
    }
}

fn provider(kind: Kind, fixtures: &Fixtures) -> api::ProviderSpec {
    let provider = match kind {
        Kind::Local => api::provider_spec::Provider::Local(api::LocalProvider {}),
        Kind::Docker => {
            ensure_debian_image();
            api::provider_spec::Provider::Docker(api::DockerProvider {
                image: DEBIAN.into(),
                mounts: vec![api::Mount {
                    source: fixtures.dir.path().display().to_string(),
                    target: FIXTURES_IN_CONTAINER.into(),
                    read_only: true,
                }],
                ..Default::default()
            })
        }
    };
    api::ProviderSpec { provider: Some(provider) }
}

fn git_source(url: &str, git_ref: &str, history: Option<api::git_source::History>) -> Option<api::Source> {
    Some(api::Source {
        source: Some(api::source::Source::Git(api::GitSource {
            url: url.into(),
            r#ref: git_ref.into(),
            history,
            auth_secret: String::new(),
        })),
    })
}

fn serial(cmd: &str) -> api::SetupStep {
    api::SetupStep { step: Some(api::setup_step::Step::Serial(cmd.into())) }
}

fn parallel(cmds: &[&str]) -> api::SetupStep {
    api::SetupStep {
        step: Some(api::setup_step::Step::Parallel(api::ParallelGroup {
            commands: cmds.iter().map(|c| c.to_string()).collect(),
        })),
    }
}

fn definition(
    id: &str,
    kind: Kind,
    fixtures: &Fixtures,
    workspace: api::WorkspaceDefinition,
) -> api::SandboxDefinition {
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(provider(kind, fixtures)),
        workspace: Some(workspace),
        secret_names: vec!["API_TOKEN".into(), "MCP_TOKEN".into()],
        lifecycle: Some(api::Lifecycle { snapshot: api::SnapshotPolicy::Never as i32, ..Default::default() }),
        ..Default::default()
    }
}

/// An ensure of `def` for `thread`; the declared secrets not given in
/// `secrets` get placeholder values.
fn request(def: &str, thread: &str, secrets: &[(&str, &str)]) -> api::EnsureSandboxRequest {
    let mut all: std::collections::HashMap<String, String> =
        [("API_TOKEN", "unused-api"), ("MCP_TOKEN", "unused-mcp")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    all.extend(secrets.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    api::EnsureSandboxRequest {
        definition_id: def.into(),
        thread_id: thread.into(),
        secrets: all,
        run_id: String::new(),
    }
}

/// Put `def` and ensure it for `thread`; the ready sandbox's id.
async fn ensure_ok(
    h: &mut Harness,
    def: api::SandboxDefinition,
    thread: &str,
) -> (Vec<api::EnsureProgress>, String) {
    let id = def.id.clone();
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let (progress, ready) = ensure(&mut h.acme, request(&id, thread, &[])).await;
    (progress, ready.unwrap_or_else(|s| panic!("ensure {id}: {s:?}")).sandbox_id)
}

async fn out(h: &mut Harness, sandbox: &str, script: &str) -> String {
    let (code, out) = sh(&mut h.acme, sandbox, script).await;
    assert_eq!(code, 0, "{script}: {out}");
    out
}

/// No sandbox of the tenant is left (instance store and provider).
async fn assert_no_sandbox_left(h: &mut Harness, kind: Kind) {
    let listed = h.acme.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner();
    assert!(listed.sandboxes.is_empty(), "{:?}", listed.sandboxes);
    match kind {
        Kind::Docker => {
            assert!(
                docker::containers(&format!("dev.sandhold.tenant={}", h.tenant)).is_empty(),
                "a container is left"
            )
        }
        Kind::Local => {
            let dir = h.dir.path().join("sandboxes");
            let left = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
            assert_eq!(left, 0, "a local sandbox directory is left");
        }
    }
}

// ------------------------------------------------------------------ git

async fn git_suite(kind: Kind) {
    let fixtures = Fixtures::new();
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let app = fixtures.url(kind, "app.git");
    let ws = |source| api::WorkspaceDefinition {
        source,
        setup: vec![serial("echo \"pm=$SANDHOLD_PACKAGE_MANAGER\" > pm.txt")],
        ..Default::default()
    };

    // Shallow by default; a local path is accepted as well as a URL.
    let plain = match kind {
        Kind::Local => fixtures.dir.path().join("app.git").display().to_string(),
        Kind::Docker => format!("{FIXTURES_IN_CONTAINER}/app.git"),
    };
    let mut made = Vec::new();
    let (progress, sandbox) =
        ensure_ok(&mut h, definition("shallow", kind, &fixtures, ws(git_source(&plain, "", None))), "t")
            .await;
    assert!(phases(&progress).contains(&api::EnsurePhase::Cloning), "{:?}", phases(&progress));
    assert_eq!(out(&mut h, &sandbox, "git rev-list --count HEAD").await, "1\n");
    assert_eq!(
        out(&mut h, &sandbox, "cat app.txt pm.txt").await,
        "v3\npm=pnpm\n",
        "lockfile → $SANDHOLD_PACKAGE_MANAGER"
    );
    assert!(!out(&mut h, &sandbox, "git branch -r").await.contains("other"), "single branch");

    // The same thread again: resumed, no second clone, the checkout kept.
    out(&mut h, &sandbox, "echo mine > local-change.txt").await;
    let (progress, ready) = ensure(&mut h.acme, request("shallow", "t", &[])).await;
    assert_eq!(ready.unwrap().outcome, api::EnsureOutcome::Resumed as i32);
    assert!(!phases(&progress).contains(&api::EnsurePhase::Cloning), "{:?}", phases(&progress));
    assert_eq!(out(&mut h, &sandbox, "cat local-change.txt").await, "mine\n");
    made.push(sandbox);

    let depth2 = git_source(&app, "", Some(api::git_source::History::Depth(2)));
    let (_, sandbox) = ensure_ok(&mut h, definition("depth2", kind, &fixtures, ws(depth2)), "t").await;
    assert_eq!(out(&mut h, &sandbox, "git rev-list --count HEAD").await, "2\n");
    made.push(sandbox);

    let full = git_source(&app, "", Some(api::git_source::History::Full(true)));
    let (_, sandbox) = ensure_ok(&mut h, definition("full", kind, &fixtures, ws(full)), "t").await;
    assert_eq!(out(&mut h, &sandbox, "git rev-list --count HEAD").await, "3\n");
    assert!(
        out(&mut h, &sandbox, "git branch -r").await.contains("origin/other"),
        "full history has every branch"
    );
    made.push(sandbox);

    let other = git_source(&app, "other", None);
    let (_, sandbox) = ensure_ok(&mut h, definition("other-ref", kind, &fixtures, ws(other)), "t").await;
    assert_eq!(
        out(&mut h, &sandbox, "git rev-parse --abbrev-ref HEAD; cat other.txt").await,
        "other\non other\n"
    );
    assert_eq!(out(&mut h, &sandbox, "git rev-list --count HEAD").await, "1\n");
    made.push(sandbox);

    // A clone failure names the URL without its credentials, and git's error.
    let password = format!("pw-{}", h.nonce);
    let bad_url = format!("https://user:{password}@127.0.0.1:9/nothing.git");
    let def = definition("bad-clone", kind, &fixtures, ws(git_source(&bad_url, "", None)));
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let (progress, result) = ensure(&mut h.acme, request("bad-clone", "t", &[])).await;
    let status = result.expect_err("the clone fails");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let msg = status.message();
    assert!(msg.contains("https://127.0.0.1:9/nothing.git"), "{msg}");
    assert!(msg.contains("fatal:"), "git's own error: {msg}");
    assert!(!msg.contains(&password), "{msg}");
    assert!(progress.iter().all(|p| !p.message.contains(&password)), "{progress:?}");
    for id in made {
        h.acme.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: id }).await.unwrap();
    }
    assert_no_sandbox_left(&mut h, kind).await;
    h.stop().await;
    assert!(!contains(&captured_logs().lock().unwrap(), password.as_bytes()), "a URL password was logged");
}

// ---------------------------------------------------------------- setup

async fn setup_suite(kind: Kind) {
    let fixtures = Fixtures::new();
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let ws = api::WorkspaceDefinition {
        setup: vec![
            serial("mkdir -p sub && cd sub"),
            serial("export GREETING=hello-$(basename \"$PWD\")"),
            parallel(&["echo \"$GREETING\" > p1.txt", "pwd > p2.txt"]),
            serial("echo \"$GREETING\" > after.txt"),
        ],
        ..Default::default()
    };
    let (_, sandbox) = ensure_ok(&mut h, definition("carry", kind, &fixtures, ws), "t").await;
    let got = out(&mut h, &sandbox, "cat sub/p1.txt sub/after.txt; basename \"$(cat sub/p2.txt)\"").await;
    assert_eq!(got, "hello-sub\nhello-sub\nsub\n", "cd and export carry over, parallel commands see them");
    h.acme.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: sandbox }).await.unwrap();

    // A step over its timeout is killed and fails the ensure; nothing is left.
    let ws = api::WorkspaceDefinition {
        setup: vec![serial("echo started; sleep 60")],
        setup_step_timeout_ms: Some(1_500),
        ..Default::default()
    };
    let def = definition("slow", kind, &fixtures, ws);
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let started = Instant::now();
    let (_, result) = ensure(&mut h.acme, request("slow", "t", &[])).await;
    let status = result.expect_err("the step times out");
    assert!(started.elapsed() < Duration::from_secs(45), "the step was not stopped at its timeout");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("timed out") && status.message().contains("started"),
        "{}",
        status.message()
    );
    let err = shared::error::Error::from_status(&status);
    assert_eq!(err.metadata.get("timed_out").map(String::as_str), Some("true"));

    // A failing step: its exit code and output tail; nothing is left.
    let ws = api::WorkspaceDefinition {
        setup: vec![serial("true"), serial("for i in 1 2 3; do echo line-$i; done; exit 42")],
        ..Default::default()
    };
    let def = definition("failing", kind, &fixtures, ws);
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let (_, result) = ensure(&mut h.acme, request("failing", "t", &[])).await;
    let status = result.expect_err("the step fails");
    let err = shared::error::Error::from_status(&status);
    assert_eq!(err.metadata.get("exit_code").map(String::as_str), Some("42"));
    assert_eq!(err.metadata.get("step").map(String::as_str), Some("2"));
    assert!(status.message().contains("line-1\nline-2\nline-3"), "{}", status.message());
    assert_no_sandbox_left(&mut h, kind).await;
    h.stop().await;
}

/// At the provisioner seam, on a sandbox the test keeps: a timed-out step's
/// processes are killed (not merely abandoned), and a workspace that is
/// already a git checkout is not cloned into.
async fn provisioner_suite(kind: Kind) {
    let dir = sandhold_tests::local::TestDir::new("ws-prov");
    let agent_bin = sandhold_tests::agent::static_agent();
    let provider: Arc<dyn Provider> = match kind {
        Kind::Local => {
            let mut options = LocalProviderOptions::new(dir.path());
            options.agent_binary = Some(agent_bin);
            Arc::new(LocalProvider::new(options).unwrap())
        }
        Kind::Docker => {
            ensure_debian_image();
            let options = DockerProviderOptions::new(agent_bin, dir.path().join("docker"));
            Arc::new(DockerProvider::connect(options).await.unwrap())
        }
    };
    let mut spec: SandboxSpec = provider::unique_spec("ws-prov");
    spec.docker = DockerOptions { image: Some(DEBIAN.into()), ..Default::default() };
    let _docker_guard = DockerCleanup { tenant: spec.tenant.clone() };
    let sandbox = provider.create(&spec).await.unwrap();
    let agent = provider::connect(&sandbox).await;

    let ws = api::WorkspaceDefinition {
        setup: vec![serial("sleep 4; echo late > late.txt")],
        setup_step_timeout_ms: Some(1_000),
        ..Default::default()
    };
    let secrets = Secrets::new();
    let progress = Progress::discard();
    let err = WorkspaceProvisioner
        .provision(ProvisionContext {
            agent: &agent,
            workspace: &ws,
            secrets: &secrets,
            withheld: &Default::default(),
            env: &Default::default(),
            progress: &progress,
        })
        .await
        .unwrap_err();
    let err = shared::error::Error::from(err);
    assert!(err.message.contains("timed out"), "{}", err.message);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, listing) = provider::sh(&agent, "ls").await.unwrap();
    assert!(!listing.contains("late.txt"), "the timed-out step kept running: {listing}");

    // Already a checkout: the (unreachable) source is not cloned.
    provider::sh_ok(&agent, "mkdir -p .git && echo mine > .git/marker").await;
    let ws = api::WorkspaceDefinition {
        source: git_source("file:///nowhere/at/all.git", "", None),
        ..Default::default()
    };
    WorkspaceProvisioner
        .provision(ProvisionContext {
            agent: &agent,
            workspace: &ws,
            secrets: &secrets,
            withheld: &Default::default(),
            env: &Default::default(),
            progress: &progress,
        })
        .await
        .expect("no clone is attempted into an existing checkout");
    assert_eq!(provider::sh_ok(&agent, "cat .git/marker").await, "mine\n");
    provider.destroy(&sandbox.provider_id).await.unwrap();
}

// ------------------------------------------------ instructions and skills

fn skill(s: api::skill::Skill) -> api::Skill {
    api::Skill { skill: Some(s) }
}

fn header(v: api::header_value::Value) -> api::HeaderValue {
    api::HeaderValue { value: Some(v) }
}

fn projected_workspace(fixtures: &Fixtures, kind: Kind, mcp_secret: bool) -> api::WorkspaceDefinition {
    let auth = if mcp_secret {
        api::header_value::Value::BearerSecret("MCP_TOKEN".into())
    } else {
        api::header_value::Value::Literal("Bearer public".into())
    };
    api::WorkspaceDefinition {
        instructions: "Always run the tests.".into(),
        scripts: [("test".to_string(), "make test".to_string())].into(),
        skills: vec![
            skill(api::skill::Skill::File(api::FileSkill {
                path: ".hints/style.md".into(),
                content: "Prefer pnpm.\n".into(),
            })),
            skill(api::skill::Skill::Git(api::GitSkill {
                name: "team".into(),
                url: fixtures.url(kind, "skills.git"),
                ..Default::default()
            })),
            skill(api::skill::Skill::Mcp(api::McpSkill {
                name: "docs".into(),
                url: "https://mcp.example/docs".into(),
                headers: [
                    ("Authorization".to_string(), header(auth)),
                    ("X-Team".to_string(), header(api::header_value::Value::Literal("core".into()))),
                ]
                .into(),
            })),
            skill(api::skill::Skill::Named("tanstack".into())),
        ],
        ..Default::default()
    }
}

/// A connected agent for the server's sandbox, through a second provider
/// instance over the same data dir.
async fn agent_of(h: &Harness, kind: Kind, provider_sandbox_id: &str) -> AgentClient {
    let agent_bin = sandhold_tests::agent::static_agent();
    let provider: Arc<dyn Provider> = match kind {
        Kind::Local => {
            let mut options = LocalProviderOptions::new(h.dir.path());
            options.agent_binary = Some(agent_bin);
            Arc::new(LocalProvider::new(options).unwrap())
        }
        Kind::Docker => {
            let options = DockerProviderOptions::new(agent_bin, h.dir.path().join("docker"));
            Arc::new(DockerProvider::connect(options).await.unwrap())
        }
    };
    let sandbox = provider.resume(provider_sandbox_id).await.unwrap().expect("the sandbox is running");
    provider::connect(&sandbox).await
}

async fn projection_suite(kind: Kind) {
    let fixtures = Fixtures::new();
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let secret = format!("mcp-s3cret-{}", h.nonce);
    let ws = projected_workspace(&fixtures, kind, true);
    let def = definition("proj", kind, &fixtures, ws.clone());
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let (progress, ready) = ensure(&mut h.acme, request("proj", "t", &[("MCP_TOKEN", &secret)])).await;
    let ready = ready.unwrap();
    let sandbox = ready.sandbox_id.clone();
    assert!(phases(&progress).contains(&api::EnsurePhase::Projecting), "{:?}", phases(&progress));

    // Instructions: AGENTS.md, and CLAUDE.md / GEMINI.md symlinks to it.
    let agents = "Always run the tests.\n\n## Scripts\n\nRun these from the workspace root:\n\n- `test`: `make test`\n";
    assert_eq!(out(&mut h, &sandbox, "cat AGENTS.md").await, agents);
    for alias in ["CLAUDE.md", "GEMINI.md"] {
        let info = h
            .acme
            .stat_file(api::StatFileRequest {
                sandbox_id: sandbox.clone(),
                path: alias.into(),
                no_follow: true,
            })
            .await
            .unwrap()
            .into_inner()
            .info
            .unwrap();
        assert_eq!(
            (info.r#type, info.symlink_target.as_str()),
            (api::FileType::Symlink as i32, "AGENTS.md"),
            "{alias}"
        );
        assert_eq!(out(&mut h, &sandbox, &format!("cat {alias}")).await, agents);
    }
    assert_eq!(out(&mut h, &sandbox, "cat .hints/style.md").await, "Prefer pnpm.\n");

    // Git skill: cloned into .sandhold/skills/team, every SKILL.md folder
    // within 6 levels linked for Claude Code and Codex.
    assert_eq!(out(&mut h, &sandbox, "git -C .sandhold/skills/team rev-list --count HEAD").await, "1\n");
    for base in [".claude/skills", ".codex/skills"] {
        let names = out(&mut h, &sandbox, &format!("ls {base}")).await;
        assert_eq!(names, "lint\nnear\nteam\n", "{base}");
        assert_eq!(
            out(&mut h, &sandbox, &format!("cat {base}/lint/SKILL.md")).await,
            "---\nname: lint\n---\nlint skill\n"
        );
        assert_eq!(
            out(&mut h, &sandbox, &format!("cat {base}/team/SKILL.md")).await,
            "---\nname: top\n---\ntop skill\n"
        );
        assert!(out(&mut h, &sandbox, &format!("test -L {base}/lint && echo link")).await.contains("link"));
    }

    // The MCP config carries a secret: not written at ensure time.
    assert_eq!(
        out(&mut h, &sandbox, "ls -a .mcp.json opencode.json .codex/config.toml 2>/dev/null | wc -l")
            .await
            .trim(),
        "0"
    );

    let agent = agent_of(&h, kind, &ready.sandbox.unwrap().provider_sandbox_id).await;
    let secrets: Secrets = [("MCP_TOKEN".to_string(), Secret::new(secret.clone()))].into();
    let warnings = project_for_run(&agent, &ws, &secrets, Cli::ClaudeCode).await.unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("tanstack"), "{warnings:?}");
    let mcp: serde_json::Value = serde_json::from_str(&out(&mut h, &sandbox, "cat .mcp.json").await).unwrap();
    assert_eq!(mcp["mcpServers"]["docs"]["url"], "https://mcp.example/docs");
    assert_eq!(mcp["mcpServers"]["docs"]["headers"]["Authorization"], format!("Bearer {secret}"));
    assert_eq!(mcp["mcpServers"]["docs"]["headers"]["X-Team"], "core");
    // The secret is in the projected file and nowhere else in the workspace.
    let holders = out(&mut h, &sandbox, &format!("grep -rl -- '{secret}' . || true")).await;
    assert_eq!(holders, "./.mcp.json\n");

    // Rewritten on every run, for that run's harness, with the current value.
    let rotated = format!("mcp-rotated-{}", h.nonce);
    let secrets: Secrets = [("MCP_TOKEN".to_string(), Secret::new(rotated.clone()))].into();
    project_for_run(&agent, &ws, &secrets, Cli::Codex).await.unwrap();
    let codex: toml::Table = out(&mut h, &sandbox, "cat .codex/config.toml").await.parse().unwrap();
    assert_eq!(
        codex["mcp_servers"]["docs"]["http_headers"]["Authorization"].as_str(),
        Some(format!("Bearer {rotated}").as_str())
    );
    let warnings = project_for_run(&agent, &ws, &secrets, Cli::OpenCode).await.unwrap();
    assert!(
        warnings.iter().any(|w| w.contains("\"team\"") && w.contains("opencode")),
        "OpenCode has no skills folder: {warnings:?}"
    );
    let opencode: serde_json::Value =
        serde_json::from_str(&out(&mut h, &sandbox, "cat opencode.json").await).unwrap();
    assert_eq!(opencode["mcp"]["docs"]["type"], "remote");
    assert_eq!(opencode["mcp"]["docs"]["headers"]["Authorization"], format!("Bearer {rotated}"));
    assert!(project_for_run(&agent, &ws, &secrets, Cli::Command).await.unwrap().is_empty());
    // ACP agents get the servers in `session/new`, from Sandhold's own file.
    project_for_run(&agent, &ws, &secrets, Cli::Acp).await.unwrap();
    let acp: serde_json::Value =
        serde_json::from_str(&out(&mut h, &sandbox, "cat .sandhold/acp/mcp-servers.json").await).unwrap();
    let headers = serde_json::json!([
        { "name": "Authorization", "value": format!("Bearer {rotated}") },
        { "name": "X-Team", "value": "core" },
    ]);
    assert_eq!(acp[0]["url"], "https://mcp.example/docs");
    assert_eq!(acp[0]["headers"], headers);

    // Without a secret, the MCP configs of every harness are written once,
    // at ensure time.
    let plain = projected_workspace(&fixtures, kind, false);
    let (_, public) = ensure_ok(&mut h, definition("proj-public", kind, &fixtures, plain), "t").await;
    let mcp: serde_json::Value = serde_json::from_str(&out(&mut h, &public, "cat .mcp.json").await).unwrap();
    assert_eq!(mcp["mcpServers"]["docs"]["headers"]["Authorization"], "Bearer public");
    assert!(out(&mut h, &public, "cat .codex/config.toml").await.contains("[mcp_servers.docs]"));
    assert!(out(&mut h, &public, "cat opencode.json").await.contains("\"remote\""));
    assert!(out(&mut h, &public, "cat .sandhold/acp/mcp-servers.json").await.contains("Bearer public"));

    for id in [sandbox, public] {
        h.acme.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: id }).await.unwrap();
    }
    h.stop().await;
    for value in [&secret, &rotated] {
        for entry in std::fs::read_dir(h.dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().unwrap().to_string_lossy().starts_with("sandhold.db") {
                assert!(
                    !contains(&std::fs::read(&path).unwrap(), value.as_bytes()),
                    "{} holds a secret",
                    path.display()
                );
            }
        }
        assert!(!contains(&captured_logs().lock().unwrap(), value.as_bytes()), "the server logged a secret");
    }
}

// -------------------------------------------------------------- secrets

/// A full ensure (git source with an auth secret, instructions, every kind
/// of skill with an MCP header from a secret) whose setup echoes the secret
/// and fails: the secret is in no database row, log line, progress event or
/// error.
async fn secrets_suite(kind: Kind, runtime: Runtime, postgres: bool) {
    let fixtures = Fixtures::new();
    let db = if postgres {
        let Some(admin) = sandhold_tests::services::postgres_url() else { return };
        Some(sandhold_tests::database::ScratchDatabase::create(&admin).await.unwrap())
    } else {
        None
    };
    let mut h = Harness::start_with(db.as_ref().map(|d| d.url().to_string())).await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let secret = format!("full-s3cret-{}", h.nonce);
    let mut ws = projected_workspace(&fixtures, kind, true);
    ws.source = Some(api::Source {
        source: Some(api::source::Source::Git(api::GitSource {
            url: fixtures.url(kind, "app.git"),
            auth_secret: "API_TOKEN".into(),
            ..Default::default()
        })),
    });
    // The git source's auth secret is withheld from every process of the
    // sandbox (issue 33); the same value as an MCP header secret reaches
    // setup, and is masked there.
    ws.setup = vec![serial(
        "echo \"token is $MCP_TOKEN\"; echo \"auth is [$API_TOKEN]\"; echo \"again $MCP_TOKEN\" >&2; exit 3",
    )];
    let mut def = definition("full", kind, &fixtures, ws);
    if kind == Kind::Docker {
        runtime.apply(&mut def);
    }
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let (progress, result) =
        ensure(&mut h.acme, request("full", "t", &[("API_TOKEN", &secret), ("MCP_TOKEN", &secret)])).await;
    let status = result.expect_err("the setup step fails");
    assert!(status.message().contains("exit code 3"), "{}", status.message());
    assert!(status.message().contains("token is [secret:API_TOKEN]"), "{}", status.message());
    assert!(!status.message().contains(&secret));
    assert!(
        progress.iter().any(|p| p.output_line == "token is [secret:API_TOKEN]"),
        "the output was streamed, redacted"
    );
    assert!(
        progress.iter().any(|p| p.output_line == "auth is []"),
        "the auth secret was withheld: {progress:?}"
    );
    let events = format!("{progress:?}");
    assert!(!events.contains(&secret), "a progress event holds the secret");
    assert_no_sandbox_left(&mut h, kind).await;
    h.stop().await;

    match &db {
        Some(db) => assert!(!table_dump(db.url()).await.contains(&secret), "a secret reached PostgreSQL"),
        None => {
            let mut seen = 0;
            for entry in std::fs::read_dir(h.dir.path()).unwrap() {
                let path = entry.unwrap().path();
                if path.file_name().unwrap().to_string_lossy().starts_with("sandhold.db") {
                    seen += 1;
                    assert!(
                        !contains(&std::fs::read(&path).unwrap(), secret.as_bytes()),
                        "{} holds the secret",
                        path.display()
                    );
                }
            }
            assert!(seen > 0, "the SQLite database was searched");
        }
    }
    {
        let logs = captured_logs().lock().unwrap();
        assert!(!logs.is_empty());
        assert!(!contains(&logs, secret.as_bytes()), "the server logged the secret");
    }
    if let Some(db) = db {
        db.drop_database().await.unwrap();
    }
}

// ---------------------------------------------------------------- tests

macro_rules! on_both {
    ($local:ident, $docker:ident, $suite:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $local() {
            let suite = $suite;
            suite(Kind::Local).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $docker() {
            if !sandhold_tests::services::docker() {
                return;
            }
            let suite = $suite;
            suite(Kind::Docker).await;
        }
    };
}

on_both!(local_git_sources, docker_git_sources, git_suite);
on_both!(local_setup_on_the_persistent_shell, docker_setup_on_the_persistent_shell, setup_suite);
on_both!(
    local_provisioner_kills_timed_out_steps_and_skips_checkouts,
    docker_provisioner_kills_timed_out_steps_and_skips_checkouts,
    provisioner_suite
);
on_both!(
    local_instructions_and_skills_per_harness,
    docker_instructions_and_skills_per_harness,
    projection_suite
);
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_secrets_stay_out_of_sqlite_and_logs() {
    secrets_suite(Kind::Local, Runtime::Runc, false).await;
}

under_each_runtime! {
#[tokio_test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_secrets_stay_out_of_sqlite_and_logs(runtime) {
    secrets_suite(Kind::Docker, runtime, false).await;
}
}

on_both!(local_secrets_stay_out_of_postgres_and_logs, docker_secrets_stay_out_of_postgres_and_logs, |k| {
    secrets_suite(k, Runtime::Runc, true)
});
