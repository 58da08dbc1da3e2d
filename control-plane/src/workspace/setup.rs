//! Setup steps over the agent's persistent shell: serial steps share the
//! shell's cwd and environment; a parallel group starts each command from
//! the shell's state. A failed step ends setup with the step, its exit code
//! and its output tail (secret values redacted); a step over its timeout is
//! killed by the agent and reported as timed out.

use std::collections::HashMap;
use std::time::Duration;

use shared::proto::agent::v1 as agent;
use shared::proto::v1::{EnsurePhase, EnsureProgress, OutputStream, setup_step};

use tracing::Instrument as _;

use crate::provision::{Error, InvalidField, Masks, ProvisionContext};
use crate::provision::{MAX_OUTPUT_LINE, Progress};

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
    redactor: &Masks,
) -> Result<(), Error> {
    let steps = &ctx.workspace.setup;
    if steps.is_empty() {
        return Ok(());
    }
    let mut env: HashMap<String, String> = ctx
        .secrets
        .iter()
        .filter(|(k, _)| !ctx.withheld.contains(*k))
        .map(|(k, v)| (k.clone(), v.expose().to_string()))
        .collect();
    env.extend(ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(extra_env);
    let session = ctx
        .agent
        .shell()
        .open_shell(agent::OpenShellRequest { cwd: String::new(), env, shell: String::new() })
        .await
        .map_err(|s| Error::agent("opening the setup shell", &s, redactor))?
        .into_inner()
        .session_id;
    let total = steps.len() as u32;
    let mut outcome = Ok(());
    for (i, step) in steps.iter().enumerate() {
        let n = i as u32 + 1;
        // The agent runs the step; its span is recorded here, around the call.
        let span =
            tracing::info_span!("setup.step", step = n, total, otel.status_code = tracing::field::Empty);
        let result = async {
            match &step.step {
                Some(setup_step::Step::Serial(cmd)) => {
                    run_serial(ctx, &session, cmd, n, total, timeout, redactor).await
                }
                Some(setup_step::Step::Parallel(group)) => {
                    run_parallel(ctx, &session, &group.commands, n, total, timeout, redactor).await
                }
                None => Err(InvalidField::new(format!("workspace.setup[{i}]"), "empty setup step").into()),
            }
        }
        .instrument(span.clone())
        .await;
        if result.is_err() {
            span.record("otel.status_code", "ERROR");
        }
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
    redactor: &Masks,
) -> Result<(), Error> {
    let shown = redactor.mask(command);
    step_progress(ctx.progress, n, total, &shown, format!("setup step {n}/{total}"));
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
        .map_err(|s| Error::agent(&format!("setup step {n}/{total}"), &s, redactor))?
        .into_inner();
    let mut lines = StepOutput::default();
    loop {
        let message = stream
            .message()
            .await
            .map_err(|s| Error::agent(&format!("setup step {n}/{total}"), &s, redactor))?;
        let Some(message) = message else {
            return Err(Error::StepLost(format!(
                "setup step {n}/{total}: the agent ended the step without an exit status"
            )));
        };
        match message.event {
            Some(agent::run_in_shell_response::Event::Output(chunk)) => {
                for line in lines.push(&chunk) {
                    output_progress(ctx.progress, n, total, &shown, line, redactor);
                }
            }
            Some(agent::run_in_shell_response::Event::Exit(exit)) => {
                for line in lines.finish() {
                    output_progress(ctx.progress, n, total, &shown, line, redactor);
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
    redactor: &Masks,
) -> Result<(), Error> {
    let shown: Vec<String> = commands.iter().map(|c| redactor.mask(c)).collect();
    let joined = shown.join(" & ");
    step_progress(
        ctx.progress,
        n,
        total,
        &joined,
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
        .map_err(|s| Error::agent(&format!("setup step {n}/{total}"), &s, redactor))?
        .into_inner();
    let mut lines: Vec<StepOutput> = commands.iter().map(|_| StepOutput::default()).collect();
    let mut exits: Vec<Option<agent::ShellCommandExit>> = vec![None; commands.len()];
    while let Some(message) =
        stream.message().await.map_err(|s| Error::agent(&format!("setup step {n}/{total}"), &s, redactor))?
    {
        let index = message.index as usize;
        let Some(splitter) = lines.get_mut(index) else { continue };
        let command = &shown[index];
        match message.event {
            Some(agent::run_parallel_response::Event::Output(chunk)) => {
                for line in splitter.push(&chunk) {
                    output_progress(ctx.progress, n, total, command, line, redactor);
                }
            }
            Some(agent::run_parallel_response::Event::Exit(exit)) => {
                for line in splitter.finish() {
                    output_progress(ctx.progress, n, total, command, line, redactor);
                }
                exits[index] = Some(exit);
            }
            None => {}
        }
    }
    for (index, exit) in exits.iter().enumerate() {
        let Some(exit) = exit else {
            return Err(Error::StepLost(format!(
                "setup step {n}/{total}: the agent reported no exit for command {}",
                index + 1
            )));
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
    redactor: &Masks,
) -> Result<(), Error> {
    if exit.exit_code == 0 && !exit.timed_out && !exit.shell_exited {
        return Ok(());
    }
    let tail_bytes = &exit.output_tail[exit.output_tail.len().saturating_sub(TAIL_BYTES)..];
    let tail = redactor.mask(&String::from_utf8_lossy(tail_bytes));
    let why = if exit.timed_out {
        "timed out".to_string()
    } else if exit.shell_exited {
        // `exit N` in a serial step ends the persistent shell itself.
        format!("failed with exit code {} (ending the setup shell)", exit.exit_code)
    } else {
        format!("failed with exit code {}", exit.exit_code)
    };
    Err(Error::SetupStepFailed {
        step: n,
        steps: total,
        parallel: parallel_index.map(|i| i + 1),
        command: command.to_string(),
        why,
        tail,
        exit_code: exit.exit_code,
        timed_out: exit.timed_out,
    })
}

fn step_progress(progress: &Progress, n: u32, total: u32, command: &str, message: String) {
    progress.send(EnsureProgress {
        phase: EnsurePhase::Setup as i32,
        message,
        step: n,
        steps: total,
        command: command.to_string(),
        ..Default::default()
    });
}

/// One line of a step's output as progress, masked, with its stream.
fn output_progress(
    progress: &Progress,
    n: u32,
    total: u32,
    command: &str,
    (line, stream): (String, OutputStream),
    redactor: &Masks,
) {
    progress.send(EnsureProgress {
        phase: EnsurePhase::Setup as i32,
        step: n,
        steps: total,
        command: command.to_string(),
        output_line: redactor.mask(&line),
        output_stream: stream as i32,
        ..Default::default()
    });
}

/// A step's stdout and stderr, each split into lines on its own (a line of
/// one is never cut by a chunk of the other).
#[derive(Debug, Default)]
struct StepOutput {
    stdout: LineSplitter,
    stderr: LineSplitter,
}

impl StepOutput {
    fn push(&mut self, chunk: &agent::OutputChunk) -> Vec<(String, OutputStream)> {
        let (splitter, stream) = match chunk.stream() {
            agent::OutputStream::Stderr => (&mut self.stderr, OutputStream::Stderr),
            _ => (&mut self.stdout, OutputStream::Stdout),
        };
        splitter.push(&chunk.data).into_iter().map(|l| (l, stream)).collect()
    }

    fn finish(&mut self) -> Vec<(String, OutputStream)> {
        let out = self.stdout.finish().map(|l| (l, OutputStream::Stdout));
        out.into_iter().chain(self.stderr.finish().map(|l| (l, OutputStream::Stderr))).collect()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Splits a byte stream into lines without their newline, each cut at
/// [`MAX_OUTPUT_LINE`] bytes: the rest of a longer line is dropped and
/// counted in a ` [N bytes cut]` suffix, so a step printing one endless line
/// costs the server at most that much.
#[derive(Debug, Default)]
struct LineSplitter {
    pending: Vec<u8>,
    cut: u64,
}

impl LineSplitter {
    fn push(&mut self, data: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        for piece in data.split_inclusive(|b| *b == b'\n') {
            let (body, ended) = match piece.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (piece, false),
            };
            let keep = body.len().min(MAX_OUTPUT_LINE.saturating_sub(self.pending.len()));
            self.pending.extend_from_slice(&body[..keep]);
            self.cut += (body.len() - keep) as u64;
            if ended {
                lines.push(self.take());
            }
        }
        lines
    }

    fn finish(&mut self) -> Option<String> {
        (!self.pending.is_empty() || self.cut > 0).then(|| self.take())
    }

    fn take(&mut self) -> String {
        let line = self.pending.strip_suffix(b"\r").unwrap_or(&self.pending);
        let mut line = String::from_utf8_lossy(line).into_owned();
        if self.cut > 0 {
            line.push_str(&format!(" [{} bytes cut]", self.cut));
        }
        self.pending.clear();
        self.cut = 0;
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_and_stderr_are_split_apart_and_keep_their_stream() {
        let chunk = |stream: agent::OutputStream, data: &[u8]| agent::OutputChunk {
            stream: stream as i32,
            data: data.to_vec(),
        };
        let mut o = StepOutput::default();
        assert!(o.push(&chunk(agent::OutputStream::Stdout, b"hal")).is_empty());
        assert_eq!(
            o.push(&chunk(
                agent::OutputStream::Stderr,
                b"warn
part"
            )),
            [("warn".to_string(), OutputStream::Stderr)]
        );
        assert_eq!(
            o.push(&chunk(
                agent::OutputStream::Stdout,
                b"f
"
            )),
            [("half".to_string(), OutputStream::Stdout)]
        );
        assert_eq!(o.finish(), [("part".to_string(), OutputStream::Stderr)]);
    }

    #[test]
    fn lines_split_across_chunks_and_the_last_partial_line_is_flushed() {
        let mut s = LineSplitter::default();
        assert!(s.push(b"hel").is_empty());
        assert_eq!(s.push(b"lo\r\nwor"), vec!["hello".to_string()]);
        assert_eq!(s.push(b"ld\n\nx"), vec!["world".to_string(), String::new()]);
        assert_eq!(s.finish(), Some("x".to_string()));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn a_long_line_is_cut_and_the_cut_counted_whatever_the_chunks() {
        let mut s = LineSplitter::default();
        let long = vec![b'y'; MAX_OUTPUT_LINE * 3 + 5];
        for piece in long.chunks(1000) {
            assert!(s.push(piece).is_empty());
            assert!(s.pending.len() <= MAX_OUTPUT_LINE);
        }
        let lines = s.push(b"\nnext\n");
        let want = format!("{} [{} bytes cut]", "y".repeat(MAX_OUTPUT_LINE), MAX_OUTPUT_LINE * 2 + 5);
        assert_eq!(lines, vec![want, "next".to_string()]);
        // A cut last line without a newline is flushed with its count.
        s.push(&long);
        assert_eq!(
            s.finish().map(|l| l.ends_with(&format!(" [{} bytes cut]", MAX_OUTPUT_LINE * 2 + 5))),
            Some(true)
        );
    }
}
