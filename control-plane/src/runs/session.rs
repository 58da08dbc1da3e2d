//! Carrying a thread's harness session across sandboxes: the driver's side
//! of `harness::session` (which says where each CLI keeps its sessions).
//! After a run the session is copied into the workspace, for the checkpoint
//! that follows; in a new sandbox restored from a checkpoint it is copied
//! back before the run that continues it.

use std::collections::BTreeMap;

use shared::proto::agent::v1 as agent;

use crate::agent::AgentClient;
use crate::harness::Harness;
use crate::harness::session::{Carry, NOT_FOUND};

/// How long one copy may take.
const CARRY_TIMEOUT_MS: u64 = 60_000;

/// Copy `session` of `harness` one way. `Ok(false)`: there is no such
/// session (or the harness's sessions are not carried); `Err`: the copy
/// failed, with what it printed.
pub(super) async fn carry(
    agent: &AgentClient,
    harness: Harness,
    way: Carry,
    session: &str,
    cwd: &str,
    program: &str,
    env: BTreeMap<String, String>,
) -> Result<bool, String> {
    let Some(argv) = harness.carry_session(way, session, cwd, program) else { return Ok(false) };
    let request = agent::ExecRequest {
        command: Some(agent::Command { kind: Some(agent::command::Kind::Argv(agent::Argv { args: argv })) }),
        // The root: the scripts name the workspace's sessions folder from it.
        cwd: String::new(),
        env: env.into_iter().collect(),
        timeout_ms: Some(CARRY_TIMEOUT_MS),
        mask_secrets: true,
        ..Default::default()
    };
    let out = agent.process().exec(request).await.map_err(|s| s.message().to_owned())?.into_inner();
    use agent::exit_status::Status;
    match out.status.and_then(|s| s.status) {
        Some(Status::Code(0)) => Ok(true),
        Some(Status::Code(NOT_FOUND)) => Ok(false),
        status => Err(format!("{status:?}: {}", String::from_utf8_lossy(&out.stderr).trim())),
    }
}

/// The environment a carry script runs with: the sandbox's variables, then
/// the run's location variables (`RunSpec::session_env`) over them, and the
/// toolchain's `path` when neither sets PATH (as the run itself gets them).
pub(super) fn carry_env(
    sandbox: &BTreeMap<String, String>,
    run: &BTreeMap<String, String>,
    path: Option<&str>,
) -> BTreeMap<String, String> {
    let mut env = sandbox.clone();
    env.extend(run.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Some(path) = path {
        env.entry("PATH".into()).or_insert_with(|| path.to_owned());
    }
    env
}
