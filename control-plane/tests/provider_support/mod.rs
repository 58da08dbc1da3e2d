//! Shared pieces of the provider tests: the static agent, running commands
//! through a sandbox's agent, and cleanup guards.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use control_plane::agent::AgentClient;
use control_plane::provider::{LABEL_TENANT, Sandbox, SandboxSpec};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    Command, ExecRequest, FollowRequest, StartRunRequest, command, exit_status, follow_response,
};

/// The statically linked agent: `SANDHOLD_AGENT_STATIC_BIN`, else built by
/// `scripts/build-agent-static` once per test binary. Static so the same
/// binary serves the local provider and any container image.
pub fn static_agent() -> PathBuf {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("SANDHOLD_AGENT_STATIC_BIN") {
                return PathBuf::from(path);
            }
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-agent-static");
            let out =
                std::process::Command::new(&script).output().expect("running scripts/build-agent-static");
            assert!(
                out.status.success(),
                "build-agent-static failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        })
        .clone()
}

/// A spec unique to one test: its tenant and key are random, so guards and
/// assertions can filter by them without seeing other tests' sandboxes.
pub fn unique_spec(test: &str) -> SandboxSpec {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    SandboxSpec {
        key: format!("key-{test}-{}", &nonce[..12]),
        tenant: format!("tenant-{}", &nonce[..12]),
        definition_id: format!("def-{test}"),
        env: BTreeMap::from([("SANDHOLD_TEST_SPEC_VAR".to_string(), "from-spec".to_string())]),
        ..Default::default()
    }
}

pub fn tenant_labels(spec: &SandboxSpec) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_TENANT.to_string(), spec.tenant.clone())])
}

pub async fn connect(sandbox: &Sandbox) -> AgentClient {
    AgentClient::connect_with_deadline(&sandbox.address, &sandbox.token, Duration::from_secs(60))
        .await
        .expect("connecting to the sandbox agent")
}

/// Run `script` with `/bin/sh -c` in the sandbox root and return its exit
/// code and stdout. Uses `ProcessService.Exec`; while an agent does not
/// serve it yet, a journaled run (`JournalService`) does the same job.
pub async fn sh(agent: &AgentClient, script: &str) -> Result<(i32, String), Error> {
    let command = Command { kind: Some(command::Kind::Shell(script.to_string())) };
    let exec = ExecRequest { command: Some(command.clone()), timeout_ms: Some(60_000), ..Default::default() };
    match agent.process().exec(exec).await {
        Ok(resp) => {
            let resp = resp.into_inner();
            let code = match resp.status.and_then(|s| s.status) {
                Some(exit_status::Status::Code(c)) => c,
                Some(exit_status::Status::Signal(s)) => 128 + s,
                None => -1,
            };
            return Ok((code, String::from_utf8_lossy(&resp.stdout).into_owned()));
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {}
        Err(status) => return Err(Error::from_status(&status)),
    }
    let run_id = format!("t-{}", uuid::Uuid::new_v4().simple());
    agent
        .journal()
        .start_run(StartRunRequest { run_id: run_id.clone(), command: Some(command), ..Default::default() })
        .await
        .map_err(|s| Error::from_status(&s))?;
    let mut stream = agent
        .journal()
        .follow(FollowRequest { run_id, first_byte_timeout_ms: Some(0), ..Default::default() })
        .await
        .map_err(|s| Error::from_status(&s))?
        .into_inner();
    let mut out = String::new();
    while let Some(msg) = stream.message().await.map_err(|s| Error::from_status(&s))? {
        match msg.event {
            Some(follow_response::Event::Lines(lines)) => {
                for line in lines.lines {
                    out.push_str(&String::from_utf8_lossy(&line.data));
                    out.push('\n');
                }
            }
            Some(follow_response::Event::Exit(exit)) => return Ok((exit.exit_code, out)),
            None => {}
        }
    }
    Err(Error::new(ErrorCode::Internal, "journal follow ended without an exit"))
}

/// As [`sh`], asserting exit code 0.
pub async fn sh_ok(agent: &AgentClient, script: &str) -> String {
    let (code, out) = sh(agent, script).await.unwrap_or_else(|e| panic!("{script}: {e}"));
    assert_eq!(code, 0, "{script} exited {code}, stdout: {out}");
    out
}

/// Wait until `cond` holds, up to `secs` seconds.
pub async fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Removes every container and image of a test's tenant when dropped, so a
/// failing Docker test leaves nothing behind.
pub struct DockerGuard {
    pub tenant: String,
}

impl Drop for DockerGuard {
    fn drop(&mut self) {
        let filter = format!("label={LABEL_TENANT}={}", self.tenant);
        for (list, remove) in
            [(vec!["ps", "-aq"], vec!["rm", "-fv"]), (vec!["images", "-q"], vec!["rmi", "-f"])]
        {
            let Ok(out) =
                std::process::Command::new("docker").args(&list).args(["--filter", &filter]).output()
            else {
                continue;
            };
            let ids: Vec<String> =
                String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker").args(&remove).args(&ids).output();
            }
        }
    }
}

/// Container ids carrying `label=value` (all states), by the docker CLI: an
/// observer independent of the provider under test.
pub fn docker_ps_by_label(label: &str, value: &str) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-aq", "--no-trunc", "--filter", &format!("label={label}={value}")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect()
}

pub fn docker_inspect(id: &str, format: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["inspect", "--format", format, id])
        .output()
        .expect("docker inspect");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Kills the agents of local sandboxes left by a failing test (each init is
/// the leader of its own session and process group).
pub struct LocalGuard {
    pub sandboxes_dir: PathBuf,
}

impl Drop for LocalGuard {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.sandboxes_dir) else { return };
        for entry in entries.flatten() {
            if let Some(pid) = std::fs::read_to_string(entry.path().join("agent.pid"))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
            {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

pub fn test_image() -> String {
    "sandhold-test-busybox:latest".to_string()
}

/// Make sure the busybox test image exists (built locally; no registry).
pub fn ensure_test_image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-test-images");
        let out = std::process::Command::new(&script).output().expect("running scripts/build-test-images");
        assert!(out.status.success(), "build-test-images failed: {}", String::from_utf8_lossy(&out.stderr));
    });
}
