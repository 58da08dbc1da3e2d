//! Shell sessions: the registry of open ones, and one session's shell with
//! its pipes, running one command at a time.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    OutputChunk, OutputStream, RunInShellResponse, ShellCommandExit, run_in_shell_response,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::Status;

use super::marker::{
    ShellEvent, Slot, SlotCell, command_line, fresh_marker, lock_slot, read_output, read_status, stream_index,
};
use crate::child::{self, spawn_error};
use crate::isolation::Isolation;
use crate::run_user::RunUser;

/// Per-command timeout when the request sets none.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Bytes of combined output kept for a command's exit report.
pub const OUTPUT_TAIL_BYTES: usize = 1500;
/// After a timed-out command's processes were killed, how long the shell has
/// to report its status before the shell itself is killed.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// After the status arrived, how long to wait for the end markers (a
/// command may have closed or redirected the shell's stdout for good).
const MARKER_GRACE: Duration = Duration::from_secs(2);
/// After the shell exited, how long to read what is left of its output
/// (a background job may hold the pipes open).
const EXIT_DRAIN_GRACE: Duration = Duration::from_millis(500);
/// Bound on capturing the shell's environment for a parallel group.
const STATE_CAPTURE_TIMEOUT: Duration = Duration::from_secs(30);
/// Where bash is looked for; without it the session runs `/bin/sh`.
const BASH_PATHS: [&str; 3] = ["/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash"];

/// Open shell sessions by id. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ShellSessions {
    inner: Arc<Mutex<HashMap<String, Arc<ShellSession>>>>,
}

impl ShellSessions {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ShellSession>>> {
        // Plain map of handles: nothing to repair after a panic elsewhere.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn get(&self, id: &str) -> Result<Arc<ShellSession>, Error> {
        self.lock().get(id).cloned().ok_or_else(|| Error::not_found(format!("no shell session {id:?}")))
    }

    /// Forget a session and kill its shell and background jobs.
    pub(super) fn close(&self, id: &str) -> bool {
        let session = self.lock().remove(id);
        match session {
            Some(session) => {
                session.terminate();
                true
            }
            None => false,
        }
    }

    /// Number of open sessions.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug)]
pub(super) struct ShellSession {
    pub(super) program: PathBuf,
    /// Pid of the shell, which leads its own process group.
    pid: u32,
    /// Held for the whole of a command: commands run one at a time.
    io: tokio::sync::Mutex<ShellIo>,
    /// Stdout and stderr owners.
    slots: [SlotCell; 2],
    /// The shell's exit code (shell style: 128+signal when killed).
    exited: watch::Receiver<Option<i32>>,
}

#[derive(Debug)]
struct ShellIo {
    control: tokio::process::ChildStdin,
    status: mpsc::Receiver<(String, i32)>,
    status_closed: bool,
}

/// Where a command's output goes.
pub(super) enum Sink {
    Client(mpsc::Sender<Result<RunInShellResponse, Status>>),
    /// Internal commands: keep stdout, drop stderr.
    Capture(Vec<u8>),
}

impl Sink {
    async fn output(&mut self, stream: OutputStream, data: Bytes) {
        match self {
            Sink::Client(tx) => {
                let chunk = OutputChunk { stream: stream as i32, data: data.to_vec() };
                let _ = tx
                    .send(Ok(RunInShellResponse { event: Some(run_in_shell_response::Event::Output(chunk)) }))
                    .await;
            }
            Sink::Capture(buf) => {
                if stream == OutputStream::Stdout {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }

    async fn closed(&self) {
        match self {
            Sink::Client(tx) => tx.closed().await,
            Sink::Capture(_) => std::future::pending().await,
        }
    }
}

/// The last [`OUTPUT_TAIL_BYTES`] bytes of a command's combined output.
#[derive(Debug, Default)]
pub(super) struct Tail(pub(super) Vec<u8>);

impl Tail {
    pub(super) fn push(&mut self, data: &[u8]) {
        self.0.extend_from_slice(data);
        if self.0.len() > OUTPUT_TAIL_BYTES {
            let excess = self.0.len() - OUTPUT_TAIL_BYTES;
            self.0.drain(..excess);
        }
    }
}

/// The shell program for a session: the one asked for, or bash when
/// installed, or `/bin/sh`.
pub(super) fn choose_shell(requested: &str) -> Result<PathBuf, Error> {
    if !requested.is_empty() {
        let path = PathBuf::from(requested);
        if !path.is_absolute() {
            return Err(Error::invalid_field("shell", "must be an absolute path"));
        }
        if !path.is_file() {
            return Err(Error::not_found(format!("shell {requested:?} not found")));
        }
        return Ok(path);
    }
    Ok(BASH_PATHS.iter().map(PathBuf::from).find(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("/bin/sh")))
}

fn shell_exited_error() -> Error {
    Error::new(ErrorCode::FailedPrecondition, "the shell of this session has exited; open a new one")
}

impl ShellSession {
    pub(super) async fn open(
        program: PathBuf,
        cwd: &Path,
        env: &HashMap<String, String>,
        user: Option<&RunUser>,
        isolation: &Isolation,
    ) -> Result<Arc<Self>, Error> {
        let program_str =
            program.to_str().ok_or_else(|| Error::invalid_field("shell", "not UTF-8"))?.to_owned();
        let is_bash = program.file_name().is_some_and(|n| n == "bash");
        let args: Vec<String> = if is_bash {
            vec!["--noprofile".into(), "--norc".into(), "-s".into()]
        } else {
            vec!["-s".into()]
        };
        let internal = |e: std::io::Error| Error::internal(format!("status pipe: {e}"));
        let (status_read, status_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| internal(std::io::Error::from(e)))?;
        let status_write = child::fd_above_stdio(&status_write).map_err(internal)?;
        let mut cmd = child::command(&program_str, &args, cwd, env, user, isolation)
            .map_err(|e| spawn_error(&program_str, e))?;
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        child::pass_fd(&mut cmd, status_write.as_raw_fd(), 3);
        let mut shell =
            tokio::process::Command::from(cmd).spawn().map_err(|e| spawn_error(&program_str, e))?;
        // Only the shell may hold the write end, so that its death is EOF.
        drop(status_write);
        let pid = shell.id().ok_or_else(|| Error::internal("shell exited at once"))?;
        let (Some(control), Some(stdout), Some(stderr)) =
            (shell.stdin.take(), shell.stdout.take(), shell.stderr.take())
        else {
            return Err(Error::internal("shell pipes missing"));
        };

        let status_pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(status_read).map_err(internal)?;
        let (status_tx, status_rx) = mpsc::channel(16);
        tokio::spawn(read_status(status_pipe, status_tx));
        let slots: [SlotCell; 2] = Default::default();
        tokio::spawn(read_output(stdout, OutputStream::Stdout, slots[0].clone()));
        tokio::spawn(read_output(stderr, OutputStream::Stderr, slots[1].clone()));
        let (exit_tx, exit_rx) = watch::channel(None);
        tokio::spawn(async move {
            let code = match shell.wait().await {
                Ok(status) => child::shell_code(status),
                Err(_) => -1,
            };
            tracing::debug!(pid, code, "shell exited");
            let _ = exit_tx.send(Some(code));
        });
        tracing::debug!(pid, shell = %program.display(), "shell session opened");
        Ok(Arc::new(Self {
            program,
            pid,
            io: tokio::sync::Mutex::new(ShellIo { control, status: status_rx, status_closed: false }),
            slots,
            exited: exit_rx,
        }))
    }

    pub(super) fn exit_code(&self) -> Option<i32> {
        *self.exited.borrow()
    }

    /// Kill the shell and everything left in its process group.
    fn terminate(&self) {
        let _ = child::signal_group(self.pid, libc::SIGKILL);
    }

    pub(super) async fn run(
        &self,
        command: &str,
        timeout: Duration,
        end_shell_on_timeout: bool,
        sink: &mut Sink,
    ) -> Result<ShellCommandExit, Error> {
        let mut io = self.io.lock().await;
        self.run_locked(&mut io, command, timeout, end_shell_on_timeout, sink).await
    }

    async fn run_locked(
        &self,
        io: &mut ShellIo,
        command: &str,
        timeout: Duration,
        end_shell_on_timeout: bool,
        sink: &mut Sink,
    ) -> Result<ShellCommandExit, Error> {
        if command.contains('\0') {
            return Err(Error::invalid_field("command", "contains a NUL byte"));
        }
        if let Some(code) = self.exit_code() {
            return Ok(ShellCommandExit {
                exit_code: code,
                timed_out: false,
                output_tail: Vec::new(),
                shell_exited: true,
            });
        }
        let (nonce, marker) = fresh_marker();
        let (events_tx, mut events) = mpsc::channel(32);
        for cell in &self.slots {
            *lock_slot(cell) =
                Some(Slot { nonce: nonce.clone(), marker: marker.clone(), tx: events_tx.clone() });
        }
        drop(events_tx);
        // Status lines of earlier commands that were given up on.
        while io.status.try_recv().is_ok() {}

        let script = command_line(command, &nonce, &marker);
        // A failed write means the shell is gone; its exit is noticed below.
        let _ = async {
            io.control.write_all(script.as_bytes()).await?;
            io.control.flush().await
        }
        .await;

        let mut exited = self.exited.clone();
        let deadline = Instant::now() + timeout;
        let mut status: Option<i32> = None;
        let mut shell_exit: Option<i32> = None;
        let mut markers = [false; 2];
        let mut eof = [false; 2];
        let mut events_closed = false;
        let mut exit_watch_closed = false;
        let mut timed_out = false;
        let mut abandoned = false;
        let mut kill_shell_at: Option<Instant> = None;
        let mut marker_deadline: Option<Instant> = None;
        let mut drain_deadline: Option<Instant> = None;
        let mut tail = Tail::default();

        loop {
            let streams_done = (0..2).all(|i| markers[i] || eof[i]) || events_closed;
            if status.is_some() && streams_done {
                break;
            }
            if shell_exit.is_some() && (eof.iter().all(|e| *e) || events_closed) {
                break;
            }
            let waiting = status.is_none() && shell_exit.is_none();
            tokio::select! {
                event = events.recv(), if !events_closed => match event {
                    Some(ShellEvent::Output(stream, data)) => {
                        tail.push(&data);
                        sink.output(stream, data).await;
                    }
                    Some(ShellEvent::Marker(stream)) => markers[stream_index(stream)] = true,
                    Some(ShellEvent::Eof(stream)) => eof[stream_index(stream)] = true,
                    None => events_closed = true,
                },
                line = io.status.recv(), if status.is_none() && !io.status_closed => match line {
                    Some((n, code)) if *n == *nonce => {
                        status = Some(code);
                        marker_deadline = Some(Instant::now() + MARKER_GRACE);
                    }
                    Some(_) => {}
                    None => io.status_closed = true,
                },
                changed = exited.changed(), if shell_exit.is_none() && !exit_watch_closed => {
                    if changed.is_err() {
                        exit_watch_closed = true;
                    }
                    if let Some(code) = *exited.borrow_and_update() {
                        shell_exit = Some(code);
                        drain_deadline = Some(Instant::now() + EXIT_DRAIN_GRACE);
                    }
                }
                _ = tokio::time::sleep_until(deadline), if waiting && !timed_out => {
                    timed_out = true;
                    if end_shell_on_timeout {
                        // Killing only the running process would let the
                        // shell go on with the rest of the command.
                        tracing::debug!(pid = self.pid, "shell command timed out, killing the shell");
                        self.terminate();
                    } else {
                        tracing::debug!(pid = self.pid, "shell command timed out, killing its processes");
                        child::kill_group_except(self.pid, self.pid).await;
                        kill_shell_at = Some(Instant::now() + KILL_GRACE);
                    }
                }
                _ = sink.closed(), if waiting && !abandoned => {
                    tracing::debug!(pid = self.pid, "shell client gone, killing the command's processes");
                    abandoned = true;
                    child::kill_group_except(self.pid, self.pid).await;
                    kill_shell_at = Some(Instant::now() + KILL_GRACE);
                }
                _ = child::sleep_until(kill_shell_at), if waiting && kill_shell_at.is_some() => {
                    tracing::debug!(pid = self.pid, "shell does not answer after its command was killed, killing it");
                    kill_shell_at = None;
                    self.terminate();
                }
                _ = child::sleep_until(marker_deadline), if marker_deadline.is_some() => break,
                _ = child::sleep_until(drain_deadline), if drain_deadline.is_some() => break,
            }
        }
        for cell in &self.slots {
            let mut slot = lock_slot(cell);
            if slot.as_ref().is_some_and(|s| s.nonce == nonce) {
                *slot = None;
            }
        }
        let (exit_code, shell_exited) = match (status, shell_exit) {
            (Some(code), _) => (code, false),
            (None, Some(code)) => (code, true),
            // The loop ends only with a status or an exit.
            (None, None) => (-1, true),
        };
        Ok(ShellCommandExit { exit_code, timed_out, output_tail: tail.0, shell_exited })
    }

    /// The shell's current directory and exported environment, for a
    /// parallel group.
    pub(super) async fn capture_state(&self) -> Result<(PathBuf, HashMap<String, String>), Error> {
        let mut io = self.io.lock().await;
        let mut env_bytes = None;
        // `env -0` where it exists (coreutils, busybox); the kernel's copy of
        // a child's environment otherwise.
        for probe in ["command env -0", "command cat /proc/self/environ"] {
            let mut sink = Sink::Capture(Vec::new());
            let exit = self.run_locked(&mut io, probe, STATE_CAPTURE_TIMEOUT, false, &mut sink).await?;
            if exit.shell_exited {
                return Err(shell_exited_error());
            }
            if let Sink::Capture(bytes) = sink
                && exit.exit_code == 0
                && bytes.contains(&b'=')
            {
                env_bytes = Some(bytes);
                break;
            }
        }
        let env_bytes = env_bytes.ok_or_else(|| Error::internal("cannot read the shell's environment"))?;
        let cwd = match std::fs::read_link(format!("/proc/{}/cwd", self.pid)) {
            Ok(cwd) => cwd,
            // The shell of another user (the run user's, to an agent
            // without CAP_SYS_PTRACE): it says where it is itself.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                let mut sink = Sink::Capture(Vec::new());
                let exit = self
                    .run_locked(&mut io, "command pwd -P", STATE_CAPTURE_TIMEOUT, false, &mut sink)
                    .await?;
                if exit.shell_exited {
                    return Err(shell_exited_error());
                }
                match sink {
                    Sink::Capture(mut bytes) if exit.exit_code == 0 && bytes.ends_with(b"\n") => {
                        bytes.pop();
                        PathBuf::from(std::ffi::OsString::from_vec(bytes))
                    }
                    _ => {
                        return Err(Error::internal(format!(
                            "reading the shell's cwd: {e}; `pwd -P` failed"
                        )));
                    }
                }
            }
            Err(e) => return Err(Error::internal(format!("reading the shell's cwd: {e}"))),
        };
        Ok((cwd, parse_env(&env_bytes)))
    }
}

/// `KEY=VALUE\0...` into a map (entries without `=` are skipped).
fn parse_env(bytes: &[u8]) -> HashMap<String, String> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let entry = String::from_utf8_lossy(entry);
            let (k, v) = entry.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut t = Tail::default();
        t.push(&[b'a'; 1000]);
        t.push(&[b'b'; 1000]);
        assert_eq!(t.0.len(), OUTPUT_TAIL_BYTES);
        assert_eq!(&t.0[OUTPUT_TAIL_BYTES - 1000..], &[b'b'; 1000][..]);
        assert!(t.0.starts_with(b"aaa"));
    }

    #[test]
    fn env_parsing() {
        let env = parse_env(b"A=1\0B=x=y\0junk\0\0C=\0");
        assert_eq!(env.get("A").map(String::as_str), Some("1"));
        assert_eq!(env.get("B").map(String::as_str), Some("x=y"));
        assert_eq!(env.get("C").map(String::as_str), Some(""));
        assert_eq!(env.len(), 3);
    }
}
