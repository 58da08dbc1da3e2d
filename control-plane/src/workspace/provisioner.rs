//! The provisioner. In order, right after the sandbox is created (the
//! lifecycle's [`Provisioner`] seam):
//!
//! 1. **Source** ([`git`](super::git)): clone the git source into the
//!    workspace root, shallow unless told otherwise; skipped when `.git` is
//!    already there.
//! 2. **Package manager** ([`package_manager`](super::package_manager)): the
//!    definition's, else detected from lockfiles, exposed to setup as
//!    `$SANDHOLD_PACKAGE_MANAGER`.
//! 3. **Setup** ([`setup`](super::setup)): serial steps and parallel groups
//!    on the agent's persistent shell, each step bounded by
//!    `setup_step_timeout_ms`.
//! 4. **Projection** ([`instructions`](super::instructions),
//!    [`skills`](super::skills)): `AGENTS.md` and its aliases, file and git
//!    skills, and the MCP config files of every harness unless one of them
//!    carries a secret.
//!
//! Before each run, [`project_for_run`] rewrites the secret-bearing files
//! for the run's harness with the current secret values and says what of
//! the workspace that harness cannot use. Secret values reach the sandbox
//! only: errors and progress pass through the
//! [`Masks`](crate::provision::Masks).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use shared::proto::v1::{EnsurePhase, WorkspaceDefinition, git_source, source};

use super::remote::Remote;
use super::{git, instructions, package_manager, setup, skills, violations};
use crate::agent::AgentClient;
use crate::harness::Harness;
use crate::provision::{Error, ProvisionContext, Provisioner, Secrets};

/// Builds workspaces: git source, setup, instructions and skills.
#[derive(Debug, Default, Clone)]
pub struct WorkspaceProvisioner;

#[async_trait]
impl Provisioner for WorkspaceProvisioner {
    fn check(&self, workspace: &WorkspaceDefinition) -> Result<(), Error> {
        Ok(crate::provision::refuse("workspace", violations(workspace, None, "workspace"))?)
    }

    async fn provision(&self, ctx: ProvisionContext<'_>) -> Result<(), Error> {
        self.check(ctx.workspace)?;
        let w = ctx.workspace;
        let redactor = crate::provision::redactor(ctx.secrets)?;
        let remote = Remote { agent: ctx.agent, redactor: &redactor };
        let timeout =
            w.setup_step_timeout_ms.map(Duration::from_millis).unwrap_or(setup::DEFAULT_STEP_TIMEOUT);

        if let Some(source::Source::Git(g)) = w.source.as_ref().and_then(|s| s.source.as_ref()) {
            let shown = git::display_url(&g.url);
            if remote.exists(".git").await? {
                ctx.progress.phase(
                    EnsurePhase::Cloning,
                    format!("{shown}: the workspace is already a git checkout; not cloning"),
                );
            } else {
                ctx.progress.phase(EnsurePhase::Cloning, format!("cloning {shown}"));
                let history = match g.history {
                    Some(git_source::History::Full(true)) => git::History::Full,
                    Some(git_source::History::Depth(d)) if d > 0 => git::History::Depth(d),
                    _ => git::History::Depth(1),
                };
                let token = git::auth_token(ctx.secrets, &g.auth_secret, "the git source")?;
                let clone = git::Clone { url: &g.url, git_ref: &g.r#ref, history, into: ".", token };
                git::clone(&remote, &clone, timeout).await?;
            }
        }

        let manager = package_manager::detect(&remote, &w.package_manager).await?;
        let env: HashMap<String, String> =
            manager.iter().map(|m| (package_manager::VARIABLE.to_string(), m.clone())).collect();
        setup::run(&ctx, env, timeout, &redactor).await?;

        let text = instructions::render(w, manager.as_deref());
        if text.is_none() && !skills::any(w) {
            return Ok(());
        }
        ctx.progress.phase(EnsurePhase::Projecting, "writing instructions and skills");
        let mut projected: Vec<String> = Vec::new();
        if text.is_some() {
            projected.extend(
                std::iter::once(instructions::FILE).chain(instructions::ALIASES).map(|f| format!("/{f}")),
            );
        }
        if skills::any(w) {
            projected.extend(shared::snapshot::PROJECTED_SKILL_FOLDERS.iter().map(|f| format!("/{f}/")));
        }
        git::exclude(&remote, &projected).await?;
        if let Some(text) = text {
            let linked = instructions::write(&remote, &text).await?;
            if !linked {
                ctx.progress.phase(
                    EnsurePhase::Projecting,
                    "symlinks are not possible here: CLAUDE.md and GEMINI.md are copies of AGENTS.md",
                );
            }
        }
        skills::write_file_skills(&remote, w).await?;
        for note in skills::install_git_skills(&remote, w, ctx.secrets, timeout).await? {
            ctx.progress.phase(EnsurePhase::Projecting, note);
        }
        if skills::mcp_is_secret_bearing(w) {
            ctx.progress.phase(
                EnsurePhase::Projecting,
                "MCP config carries secrets: written before each run, for that run's harness only",
            );
        } else {
            for warning in skills::project_mcp(&remote, w, ctx.secrets, Harness::ALL).await? {
                ctx.progress.phase(EnsurePhase::Projecting, warning);
            }
        }
        Ok(())
    }
}

/// Right before each run: (re)write the secret-bearing files of the
/// workspace for `harness` with the current secret values, and return what
/// of the workspace `harness` cannot use, as warnings (never an error).
pub async fn project_for_run(
    agent: &AgentClient,
    workspace: &WorkspaceDefinition,
    secrets: &Secrets,
    harness: Harness,
) -> Result<Vec<String>, Error> {
    let redactor = crate::provision::redactor(secrets)?;
    let remote = Remote { agent, redactor: &redactor };
    let mut warnings = skills::warnings(workspace, harness);
    if skills::mcp_is_secret_bearing(workspace) {
        warnings.extend(skills::project_mcp(&remote, workspace, secrets, &[harness]).await?);
    }
    Ok(warnings)
}

/// Whether provisioning leaves anything in the sandbox worth a native
/// snapshot.
pub fn provisions_anything(w: &WorkspaceDefinition) -> bool {
    matches!(w.source.as_ref().and_then(|s| s.source.as_ref()), Some(source::Source::Git(_)))
        || !w.setup.is_empty()
        || !w.instructions.is_empty()
        || !w.scripts.is_empty()
        || skills::any(w)
}
