//! Provider-level helpers: specs unique to a test, and running commands
//! through a sandbox's agent.

use std::collections::BTreeMap;
use std::time::Duration;

use control_plane::agent::AgentClient;
use control_plane::provider::{LABEL_TENANT, Sandbox, SandboxSpec};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    Command, ExecRequest, FollowRequest, StartRunRequest, command, exit_status, follow_response,
};

/// Which provider a test's sandboxes use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Local,
    Docker,
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
