//! Setup steps over the agent's persistent shell: serial steps share the
//! shell's cwd and environment; a parallel group starts each command from
//! the shell's state. A failed step ends setup with the step, its exit code
//! and its output tail (secret values redacted); a step over its timeout is
//! killed by the agent and reported as timed out.

use std::collections::HashMap;
use std::time::Duration;

use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1 as agent;
use shared::proto::v1::{EnsurePhase, EnsureProgress, setup_step};

use crate::provision::Progress;
use crate::provision::{ProvisionContext, Redactor};

/// Unset `setup_step_timeout_ms`: 30 minutes.
pub(crate) const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Bytes of a failed step's output kept in its error.
const TAIL_BYTES: usize = 2048;

/// Run the workspace's setup steps on a fresh persistent shell in the
/// sandbox root, with the secrets and `extra_env` in its environment.
pub(crate) async fn run(
    ctx: &ProvisionContext<'_>,
    extra_env: HashMap<String, String>,
    timeout: Duration,
    redactor: &Redactor,
) -> Result<(), Error> {
    let steps = &ctx.workspace.setup;
    if steps.is_empty() {
        return Ok(());
    }
    let mut env: HashMap<String, String> =
        ctx.secrets.iter().map(|(k, v)| (k.clone(), v.expose().to_string())).collect();
    env.extend(extra_env);
    let session = ctx
        .agent
        .shell()
        .open_shell(agent::OpenShellRequest { cwd: String::new(), env, shell: String::new() })
        .await
        .map_err(|s| agent_error("opening the setup shell", &s, redactor))?
        .into_inner()
        .session_id;
    let total = steps.len() as u32;
    let mut outcome = Ok(());
    for (i, step) in steps.iter().enumerate() {
        let n = i as u32 + 1;
        let result = match &step.step {
            Some(setup_step::Step::Serial(cmd)) => {
                run_serial(ctx, &session, cmd, n, total, timeout, redactor).await
            }
            Some(setup_step::Step::Parallel(group)) => {
                run_parallel(ctx, &session, &group.commands, n, total, timeout, redactor).await
            }
            None => Err(Error::invalid_field(format!("workspace.setup[{i}]"), "empty setup step")),
        };
        if let Err(e) = result {
            outcome = Err(e);
            break;
        }
    }
    // A failed close is harmless: the shell dies with the sandbox.
    let _ = ctx.agent.shell().close_shell(agent::CloseShellRequest { session_id: session }).await;
    outcome
}

async fn run_serial(
    ctx: &ProvisionContext<'_>,
    session: &str,
    command: &str,
    n: u32,
    total: u32,
    timeout: Duration,
    redactor: &Redactor,
) -> Result<(), Error> {
    let shown = redactor.redact(command);
    step_progress(ctx.progress, n, total, &shown, String::new(), format!("setup step {n}/{total}"));
    let mut stream = ctx
        .agent
        .shell()
        .run_in_shell(agent::RunInShellRequest {
            session_id: session.to_string(),
            command: command.to_string(),
            timeout_ms: Some(millis(timeout)),
            // A timed-out step fails setup: nothing of it may run on.
            end_shell_on_timeout: true,
        })
        .await
        .map_err(|s| agent_error(&format!("setup step {n}/{total}"), &s, redactor))?
        .into_inner();
    let mut lines = LineSplitter::default();
    loop {
        let message = stream
            .message()
            .await
            .map_err(|s| agent_error(&format!("setup step {n}/{total}"), &s, redactor))?;
        let Some(message) = message else {
            return Err(Error::new(
                ErrorCode::Unavailable,
                format!("setup step {n}/{total}: the agent ended the step without an exit status"),
            ));
        };
        match message.event {
            Some(agent::run_in_shell_response::Event::Output(chunk)) => {
                for line in lines.push(&chunk.data) {
                    step_progress(ctx.progress, n, total, &shown, redactor.redact(&line), String::new());
                }
            }
            Some(agent::run_in_shell_response::Event::Exit(exit)) => {
                if let Some(line) = lines.finish() {
                    step_progress(ctx.progress, n, total, &shown, redactor.redact(&line), String::new());
                }
                return check_exit(&exit, n, total, &shown, None, redactor);
            }
            None => {}
        }
    }
}

async fn run_parallel(
    ctx: &ProvisionContext<'_>,
    session: &str,
    commands: &[String],
    n: u32,
    total: u32,
    timeout: Duration,
    redactor: &Redactor,
) -> Result<(), Error> {
    let shown: Vec<String> = commands.iter().map(|c| redactor.redact(c)).collect();
    let joined = shown.join(" & ");
    step_progress(
        ctx.progress,
        n,
        total,
        &joined,
        String::new(),
        format!("setup step {n}/{total} ({} in parallel)", commands.len()),
    );
    let mut stream = ctx
        .agent
        .shell()
        .run_parallel(agent::RunParallelRequest {
            session_id: session.to_string(),
            commands: commands.to_vec(),
            timeout_ms: Some(millis(timeout)),
        })
        .await
        .map_err(|s| agent_error(&format!("setup step {n}/{total}"), &s, redactor))?
        .into_inner();
    let mut lines: Vec<LineSplitter> = commands.iter().map(|_| LineSplitter::default()).collect();
    let mut exits: Vec<Option<agent::ShellCommandExit>> = vec![None; commands.len()];
    while let Some(message) =
        stream.message().await.map_err(|s| agent_error(&format!("setup step {n}/{total}"), &s, redactor))?
    {
        let index = message.index as usize;
        let Some(splitter) = lines.get_mut(index) else { continue };
        let command = &shown[index];
        match message.event {
            Some(agent::run_parallel_response::Event::Output(chunk)) => {
                for line in splitter.push(&chunk.data) {
                    step_progress(ctx.progress, n, total, command, redactor.redact(&line), String::new());
                }
            }
            Some(agent::run_parallel_response::Event::Exit(exit)) => {
                if let Some(line) = splitter.finish() {
                    step_progress(ctx.progress, n, total, command, redactor.redact(&line), String::new());
                }
                exits[index] = Some(exit);
            }
            None => {}
        }
    }
    for (index, exit) in exits.iter().enumerate() {
        let Some(exit) = exit else {
            return Err(Error::new(
                ErrorCode::Unavailable,
                format!("setup step {n}/{total}: the agent reported no exit for command {}", index + 1),
            ));
        };
        check_exit(exit, n, total, &shown[index], Some(index), redactor)?;
    }
    Ok(())
}

fn check_exit(
    exit: &agent::ShellCommandExit,
    n: u32,
    total: u32,
    command: &str,
    parallel_index: Option<usize>,
    redactor: &Redactor,
) -> Result<(), Error> {
    if exit.exit_code == 0 && !exit.timed_out && !exit.shell_exited {
        return Ok(());
    }
    let tail_bytes = &exit.output_tail[exit.output_tail.len().saturating_sub(TAIL_BYTES)..];
    let tail = redactor.redact(&String::from_utf8_lossy(tail_bytes));
    let why = if exit.timed_out {
        "timed out".to_string()
    } else if exit.shell_exited {
        // `exit N` in a serial step ends the persistent shell itself.
        format!("failed with exit code {} (ending the setup shell)", exit.exit_code)
    } else {
        format!("failed with exit code {}", exit.exit_code)
    };
    let which = match parallel_index {
        Some(i) => format!(" (parallel command {})", i + 1),
        None => String::new(),
    };
    let mut err = Error::new(
        ErrorCode::FailedPrecondition,
        format!("setup step {n}/{total}{which} `{command}` {why}; output tail:\n{tail}"),
    )
    .with_meta("reason_detail", "SETUP_STEP_FAILED")
    .with_meta("step", n.to_string())
    .with_meta("steps", total.to_string())
    .with_meta("exit_code", exit.exit_code.to_string())
    .with_meta("timed_out", exit.timed_out.to_string());
    if let Some(i) = parallel_index {
        err = err.with_meta("parallel_index", (i + 1).to_string());
    }
    Err(err)
}

fn step_progress(progress: &Progress, n: u32, total: u32, command: &str, line: String, message: String) {
    progress.send(EnsureProgress {
        phase: EnsurePhase::Setup as i32,
        message,
        step: n,
        steps: total,
        command: command.to_string(),
        output_line: line,
        elapsed_ms: 0,
    });
}

fn agent_error(what: &str, status: &tonic::Status, redactor: &Redactor) -> Error {
    let mut err = Error::from_status(status);
    err.message = redactor.redact(&format!("{what}: {}", err.message));
    err
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Splits a byte stream into lines without their newline.
#[derive(Debug, Default)]
struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    fn push(&mut self, data: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(data);
        let mut lines = Vec::new();
        while let Some(pos) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=pos).collect();
            let line = &line[..line.len() - 1];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            lines.push(String::from_utf8_lossy(line).into_owned());
        }
        lines
    }

    fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let line = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_and_the_last_partial_line_is_flushed() {
        let mut s = LineSplitter::default();
        assert!(s.push(b"hel").is_empty());
        assert_eq!(s.push(b"lo\r\nwor"), vec!["hello".to_string()]);
        assert_eq!(s.push(b"ld\n\nx"), vec!["world".to_string(), String::new()]);
        assert_eq!(s.finish(), Some("x".to_string()));
        assert_eq!(s.finish(), None);
    }
}
