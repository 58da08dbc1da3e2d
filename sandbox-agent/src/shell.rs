//! `ShellService`: a persistent shell per session, which workspace setup runs
//! on.
//!
//! The shell (bash when installed, else `/bin/sh`; busybox `sh` works too)
//! reads commands from a pipe. Each command is sent as one line:
//!
//! ```text
//! { command eval '<command>'; } </dev/null 3>&-; command printf '%s %d\n' <nonce> "$?" >&3;
//! command printf '%s' <marker>; command printf '%s' <marker> >&2
//! ```
//!
//! - `eval` in a brace group runs in the shell itself, so `cd`, `export` and
//!   variables hold for the next command; `command eval` keeps a syntax
//!   error from ending a POSIX shell (it is a special built-in).
//! - The command's stdin is `/dev/null`, never the control pipe, so a
//!   command that reads stdin cannot eat the commands that follow.
//! - The exit status goes to fd 3, a pipe only the shell holds (the command
//!   runs with fd 3 closed), tagged with a fresh random nonce.
//! - A fresh random marker ends the command's output on stdout and on
//!   stderr; a command cannot print it, because it never sees it. Output
//!   after the marker (a background job) is dropped.
//! - A timeout SIGKILLs every process of the shell's process group except
//!   the shell (the shell runs without job control, so its commands and
//!   background jobs are in its group): the shell survives with its state
//!   and reports status 137. A shell that still does not answer (a built-in
//!   loop) is killed and reported as exited.
//!
//! `RunParallel` captures the shell's cwd (`/proc/<pid>/cwd`) and exported
//! environment (`env -0`) and starts each command as its own child in its own
//! process group from that state.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    CloseShellRequest, CloseShellResponse, OpenShellRequest, OpenShellResponse, OutputChunk, OutputStream,
    RunInShellRequest, RunInShellResponse, RunParallelRequest, RunParallelResponse, ShellCommandExit,
    run_in_shell_response, run_parallel_response, shell_service_server::ShellService,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::child::{self, ChildEvent, RunningChild};
use crate::confine::Root;
use crate::process::{resolve_cwd, spawn_error};
use crate::server::AgentState;

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
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ShellSession>>> {
        // Plain map of handles: nothing to repair after a panic elsewhere.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: &str) -> Result<Arc<ShellSession>, Error> {
        self.lock().get(id).cloned().ok_or_else(|| Error::not_found(format!("no shell session {id:?}")))
    }

    /// Forget a session and kill its shell and background jobs.
    fn close(&self, id: &str) -> bool {
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

/// One of the shell's two output streams, as an index.
fn stream_index(stream: OutputStream) -> usize {
    match stream {
        OutputStream::Stderr => 1,
        _ => 0,
    }
}

#[derive(Debug)]
enum ShellEvent {
    Output(OutputStream, Bytes),
    /// The command's end marker went past on this stream.
    Marker(OutputStream),
    /// The stream closed (the shell is gone).
    Eof(OutputStream),
}

/// The command currently owning an output stream of the shell.
#[derive(Debug, Clone)]
struct Slot {
    nonce: Arc<str>,
    marker: Arc<[u8]>,
    tx: mpsc::Sender<ShellEvent>,
}

type SlotCell = Arc<Mutex<Option<Slot>>>;

fn lock_slot(cell: &SlotCell) -> std::sync::MutexGuard<'_, Option<Slot>> {
    cell.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug)]
struct ShellSession {
    program: PathBuf,
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
enum Sink {
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
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, data: &[u8]) {
        self.0.extend_from_slice(data);
        if self.0.len() > OUTPUT_TAIL_BYTES {
            let excess = self.0.len() - OUTPUT_TAIL_BYTES;
            self.0.drain(..excess);
        }
    }
}

/// Quote `s` as one single-quoted shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn random_hex() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The shell program for a session: the one asked for, or bash when
/// installed, or `/bin/sh`.
fn choose_shell(requested: &str) -> Result<PathBuf, Error> {
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
    async fn open(program: PathBuf, cwd: &Path, env: &HashMap<String, String>) -> Result<Arc<Self>, Error> {
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
        let mut cmd = child::command(&program_str, &args, cwd, env);
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

    fn exit_code(&self) -> Option<i32> {
        *self.exited.borrow()
    }

    /// Kill the shell and everything left in its process group.
    fn terminate(&self) {
        let _ = child::signal_group(self.pid, libc::SIGKILL);
    }

    async fn run(
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
        let nonce: Arc<str> = random_hex().into();
        let marker: Arc<[u8]> = format!("__sandhold_end_{nonce}__").into_bytes().into();
        let (events_tx, mut events) = mpsc::channel(32);
        for cell in &self.slots {
            *lock_slot(cell) =
                Some(Slot { nonce: nonce.clone(), marker: marker.clone(), tx: events_tx.clone() });
        }
        drop(events_tx);
        // Status lines of earlier commands that were given up on.
        while io.status.try_recv().is_ok() {}

        let marker_str = std::str::from_utf8(&marker).unwrap_or_default();
        let script = format!(
            "{{ command eval {}; }} </dev/null 3>&-; command printf '%s %d\\n' {nonce} \"$?\" >&3; \
             command printf '%s' {marker_str}; command printf '%s' {marker_str} >&2\n",
            sh_quote(command)
        );
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
    async fn capture_state(&self) -> Result<(PathBuf, HashMap<String, String>), Error> {
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
        let cwd = std::fs::read_link(format!("/proc/{}/cwd", self.pid))
            .map_err(|e| Error::internal(format!("reading the shell's cwd: {e}")))?;
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

/// Status lines `<nonce> <code>` from the shell's fd 3.
async fn read_status(pipe: tokio::net::unix::pipe::Receiver, tx: mpsc::Sender<(String, i32)>) {
    let mut lines = tokio::io::BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some((nonce, code)) = line.split_once(' ') else { continue };
        let Ok(code) = code.trim().parse() else { continue };
        if tx.send((nonce.to_owned(), code)).await.is_err() {
            return;
        }
    }
}

/// Where `needle` starts in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Length of the longest suffix of `buf` that is a proper prefix of
/// `marker`: bytes that may be the start of a marker split across reads.
fn partial_marker_len(buf: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(buf.len() + 1)).rev().find(|k| buf.ends_with(&marker[..*k])).unwrap_or(0)
}

/// Read one of the shell's output streams for as long as the shell lives,
/// handing bytes to the command that owns the stream, up to its marker.
/// Bytes nobody owns (a background job between commands) are dropped, so
/// such a job never blocks on a full pipe.
async fn read_output(mut reader: impl tokio::io::AsyncRead + Unpin, stream: OutputStream, cell: SlotCell) {
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_nonce: Option<Arc<str>> = None;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = reader.read(&mut buf).await.unwrap_or(0);
        let slot = lock_slot(&cell).clone();
        if n == 0 {
            if let Some(slot) = slot {
                if pending_nonce.as_ref() == Some(&slot.nonce) && !pending.is_empty() {
                    let _ = slot
                        .tx
                        .send(ShellEvent::Output(stream, Bytes::from(std::mem::take(&mut pending))))
                        .await;
                }
                let _ = slot.tx.send(ShellEvent::Eof(stream)).await;
            }
            return;
        }
        let Some(slot) = slot else {
            pending.clear();
            continue;
        };
        if pending_nonce.as_ref() != Some(&slot.nonce) {
            pending.clear();
            pending_nonce = Some(slot.nonce.clone());
        }
        pending.extend_from_slice(&buf[..n]);
        if let Some(pos) = find(&pending, &slot.marker) {
            if pos > 0 {
                let _ =
                    slot.tx.send(ShellEvent::Output(stream, Bytes::copy_from_slice(&pending[..pos]))).await;
            }
            let _ = slot.tx.send(ShellEvent::Marker(stream)).await;
            let mut current = lock_slot(&cell);
            if current.as_ref().is_some_and(|s| s.nonce == slot.nonce) {
                *current = None;
            }
            pending.clear();
        } else {
            let emit = pending.len() - partial_marker_len(&pending, &slot.marker);
            if emit > 0 {
                let data = Bytes::copy_from_slice(&pending[..emit]);
                pending.drain(..emit);
                let _ = slot.tx.send(ShellEvent::Output(stream, data)).await;
            }
        }
    }
}

pub struct Shells {
    root: Root,
    sessions: ShellSessions,
}

impl Shells {
    pub fn new(state: AgentState) -> Self {
        Self { root: state.root.clone(), sessions: state.shells.clone() }
    }
}

fn timeout_of(timeout_ms: Option<u64>) -> Duration {
    timeout_ms.filter(|ms| *ms > 0).map(Duration::from_millis).unwrap_or(DEFAULT_COMMAND_TIMEOUT)
}

/// Run one command of a parallel group to its end, streaming its output.
async fn drive_parallel(
    index: u32,
    mut running: RunningChild,
    timeout: Duration,
    tx: mpsc::Sender<Result<RunParallelResponse, Status>>,
) {
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let mut tail = Tail::default();
    loop {
        tokio::select! {
            event = running.next_event() => match event {
                Ok(ChildEvent::Output(stream, data)) => {
                    tail.push(&data);
                    let chunk = OutputChunk { stream: stream as i32, data: data.to_vec() };
                    let msg = RunParallelResponse { index, event: Some(run_parallel_response::Event::Output(chunk)) };
                    if tx.send(Ok(msg)).await.is_err() {
                        // Dropping `running` kills the group.
                        return;
                    }
                }
                Ok(ChildEvent::Finished(status)) => {
                    let exit = ShellCommandExit {
                        exit_code: child::shell_code(status),
                        timed_out,
                        output_tail: std::mem::take(&mut tail.0),
                        shell_exited: false,
                    };
                    let _ = tx.send(Ok(RunParallelResponse { index, event: Some(run_parallel_response::Event::Exit(exit)) })).await;
                    return;
                }
                Err(e) => {
                    running.kill_group();
                    let _ = tx.send(Err(Error::internal(format!("waiting for command {index}: {e}")).into())).await;
                    return;
                }
            },
            _ = tokio::time::sleep_until(deadline), if !timed_out => {
                timed_out = true;
                running.kill_group();
            }
            _ = tx.closed() => return,
        }
    }
}

#[tonic::async_trait]
impl ShellService for Shells {
    async fn open_shell(
        &self,
        req: Request<OpenShellRequest>,
    ) -> Result<Response<OpenShellResponse>, Status> {
        let req = req.into_inner();
        let program = choose_shell(&req.shell)?;
        child::validate_env(&req.env)?;
        let cwd = resolve_cwd(&self.root, &req.cwd)?;
        let session = ShellSession::open(program, &cwd, &req.env).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        self.sessions.lock().insert(id.clone(), session);
        Ok(Response::new(OpenShellResponse { session_id: id }))
    }

    type RunInShellStream = ReceiverStream<Result<RunInShellResponse, Status>>;

    async fn run_in_shell(
        &self,
        req: Request<RunInShellRequest>,
    ) -> Result<Response<Self::RunInShellStream>, Status> {
        let req = req.into_inner();
        let session = self.sessions.get(&req.session_id)?;
        if req.command.contains('\0') {
            return Err(Error::invalid_field("command", "contains a NUL byte").into());
        }
        let timeout = timeout_of(req.timeout_ms);
        let (tx, rx) = mpsc::channel(32);
        let sessions = self.sessions.clone();
        tokio::spawn(async move {
            let mut sink = Sink::Client(tx.clone());
            let result = session.run(&req.command, timeout, req.end_shell_on_timeout, &mut sink).await;
            match result {
                Ok(exit) => {
                    if exit.shell_exited {
                        // Background jobs of a dead shell go with it.
                        sessions.close(&req.session_id);
                    }
                    let _ = tx
                        .send(Ok(RunInShellResponse {
                            event: Some(run_in_shell_response::Event::Exit(exit)),
                        }))
                        .await;
                }
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type RunParallelStream = ReceiverStream<Result<RunParallelResponse, Status>>;

    async fn run_parallel(
        &self,
        req: Request<RunParallelRequest>,
    ) -> Result<Response<Self::RunParallelStream>, Status> {
        let req = req.into_inner();
        let session = self.sessions.get(&req.session_id)?;
        if req.commands.is_empty() {
            return Err(Error::invalid_field("commands", "no commands").into());
        }
        if req.commands.iter().any(|c| c.contains('\0')) {
            return Err(Error::invalid_field("commands", "a command contains a NUL byte").into());
        }
        let (cwd, env) = match session.capture_state().await {
            Ok(state) => state,
            Err(e) => {
                if session.exit_code().is_some() {
                    self.sessions.close(&req.session_id);
                }
                return Err(e.into());
            }
        };
        let program = session.program.to_string_lossy().into_owned();
        let mut children = Vec::with_capacity(req.commands.len());
        for command in &req.commands {
            let mut cmd =
                child::command_with_exact_env(&program, &["-c".to_owned(), command.clone()], &cwd, &env);
            cmd.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            // On an error the children already started are dropped, which
            // kills them.
            let spawned = tokio::process::Command::from(cmd).spawn().map_err(|e| spawn_error(&program, e))?;
            children.push(RunningChild::new(spawned, true).map_err(|e| Error::internal(e.to_string()))?);
        }
        let timeout = timeout_of(req.timeout_ms);
        let (tx, rx) = mpsc::channel(32);
        for (index, running) in children.into_iter().enumerate() {
            tokio::spawn(drive_parallel(index as u32, running, timeout, tx.clone()));
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn close_shell(
        &self,
        req: Request<CloseShellRequest>,
    ) -> Result<Response<CloseShellResponse>, Status> {
        let id = req.into_inner().session_id;
        if !self.sessions.close(&id) {
            return Err(Error::not_found(format!("no shell session {id:?}")).into());
        }
        Ok(Response::new(CloseShellResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("printf '%s' {}", sh_quote("a'b\"c$d`e\\f")))
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"a'b\"c$d`e\\f");
    }

    #[test]
    fn partial_marker_suffixes() {
        let m = b"__end_x__";
        assert_eq!(partial_marker_len(b"hello", m), 0);
        assert_eq!(partial_marker_len(b"hello_", m), 1);
        assert_eq!(partial_marker_len(b"hello__end", m), 5);
        assert_eq!(partial_marker_len(b"__end_x_", m), 8);
        assert_eq!(find(b"ab__end_x__cd", m), Some(2));
    }

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
