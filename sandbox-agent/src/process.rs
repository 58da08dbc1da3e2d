//! `ProcessService`: one-off (`Exec`) and interactive (`Spawn`) processes,
//! each in its own process group, and the table of processes the agent
//! started (`ListProcesses`, `SignalProcess`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    self as proto, Command, ExecRequest, ExecResponse, GitRequest, ListProcessesRequest,
    ListProcessesResponse, OutputChunk, OutputStream, ProcessInfo, SignalProcessRequest,
    SignalProcessResponse, SpawnRequest, SpawnResponse, SpawnStarted, TerminalSize,
    process_service_server::ProcessService, spawn_request, spawn_response,
};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub use crate::child::spawn_error;
use crate::child::{self, ChildEvent, Launch, Pty, RunningChild, Start};
use crate::confine::Root;
pub use crate::confine::resolve_cwd;
use crate::context::AgentContext;
use crate::git::Transfers;
use crate::isolation::Isolation;
use crate::run_user::RunUser;
use crate::vault::Vault;

/// Output kept per stream by `Exec` when the request sets no limit.
pub const DEFAULT_OUTPUT_LIMIT: u64 = shared::limits::MAX_EXEC_OUTPUT;
/// Finished processes remembered for `ListProcesses` (oldest forgotten
/// first); running ones are always kept.
const MAX_FINISHED: usize = 64;

/// Processes the agent started and still tracks, by pid. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ProcessTable {
    inner: Arc<Mutex<TableInner>>,
}

#[derive(Debug, Default)]
struct TableInner {
    entries: BTreeMap<u32, ProcessInfo>,
    finished: VecDeque<u32>,
}

impl ProcessTable {
    pub fn insert(&self, pid: u32, command: String, detached: bool) {
        let info =
            ProcessInfo { pid, command, started_at_ms: now_ms(), detached, running: true, status: None };
        let mut inner = self.lock();
        // A recycled pid replaces the finished process it belonged to.
        inner.finished.retain(|p| *p != pid);
        inner.entries.insert(pid, info);
    }

    pub fn finish(&self, pid: u32, status: proto::ExitStatus) {
        let mut inner = self.lock();
        let Some(entry) = inner.entries.get_mut(&pid) else { return };
        entry.running = false;
        entry.status = Some(status);
        inner.finished.push_back(pid);
        while inner.finished.len() > MAX_FINISHED {
            if let Some(old) = inner.finished.pop_front() {
                inner.entries.remove(&old);
            }
        }
    }

    pub fn get(&self, pid: u32) -> Option<ProcessInfo> {
        self.lock().entries.get(&pid).cloned()
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        self.lock().entries.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TableInner> {
        // The table holds plain data; a panic elsewhere cannot leave it
        // half-updated in a way that matters, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// What to execute: program, arguments, and a human-readable form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub program: String,
    pub args: Vec<String>,
    pub display: String,
}

impl Program {
    /// An argv vector, or a shell string run by `/bin/sh -c`.
    pub fn from_command(command: Option<Command>) -> Result<Self, Error> {
        use proto::command::Kind;
        match command.and_then(|c| c.kind) {
            Some(Kind::Argv(argv)) => {
                let mut args = argv.args.into_iter();
                let program = args
                    .next()
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| Error::invalid_field("command.argv", "argv must name a program"))?;
                let args: Vec<String> = args.collect();
                if program.contains('\0') || args.iter().any(|a| a.contains('\0')) {
                    return Err(Error::invalid_field("command.argv", "argv contains a NUL byte"));
                }
                let display = std::iter::once(program.as_str())
                    .chain(args.iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(" ");
                Ok(Self { program, args, display })
            }
            Some(Kind::Shell(script)) => {
                if script.contains('\0') {
                    return Err(Error::invalid_field("command.shell", "shell string contains a NUL byte"));
                }
                Ok(Self {
                    program: "/bin/sh".into(),
                    args: vec!["-c".into(), script.clone()],
                    display: script,
                })
            }
            None => Err(Error::invalid_field("command", "set argv or shell")),
        }
    }
}

/// The first `limit` bytes of a stream, and whether more came.
struct Captured {
    data: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl Captured {
    fn new(limit: usize) -> Self {
        Self { data: Vec::new(), limit, truncated: false }
    }

    fn push(&mut self, chunk: &[u8]) {
        let room = self.limit.saturating_sub(self.data.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        self.data.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
}

pub struct Processes {
    root: Root,
    table: ProcessTable,
    run_user: Option<RunUser>,
    isolation: Isolation,
    vault: Vault,
    git: Transfers,
    /// How `Exec` and `Spawn` (without a terminal) start children.
    start: Start,
}

impl Processes {
    /// The table of started processes belongs to this service: nothing
    /// else lists or signals them.
    pub fn new(ctx: &AgentContext) -> Self {
        Self {
            root: ctx.root.clone(),
            table: ProcessTable::default(),
            run_user: ctx.run_user.clone(),
            isolation: ctx.isolation.clone(),
            vault: ctx.vault.clone(),
            git: Transfers::new(ctx.root.clone(), ctx.journal_dir.clone(), ctx.run_user.clone()),
            start: Start::Spawner,
        }
    }

    /// As [`Processes::new`], starting children as `start` says (tests
    /// attack both ways).
    pub fn starting(ctx: &AgentContext, start: Start) -> Self {
        Self { start, ..Self::new(ctx) }
    }

    fn launch<'a>(
        &'a self,
        program: &'a Program,
        cwd: &'a std::path::Path,
        env: &'a std::collections::HashMap<String, String>,
    ) -> Launch<'a> {
        Launch {
            program: &program.program,
            args: &program.args,
            cwd,
            env,
            user: self.run_user.as_ref(),
            isolation: &self.isolation,
        }
    }

    async fn exec_inner(&self, req: ExecRequest) -> Result<ExecResponse, Error> {
        let masks = match req.mask_secrets {
            true => Some(self.vault.masks(&self.vault.declared(), "masking the output")?),
            false => None,
        };
        let program = Program::from_command(req.command)?;
        child::validate_env(&req.env)?;
        let cwd = resolve_cwd(&self.root, &req.cwd)?;
        let launch = self.launch(&program, &cwd, &req.env);
        let started = Instant::now();
        // Dropping `running` (the client cancelled the call) kills the group.
        let (mut running, stdin) = child::start(&launch, !req.stdin.is_empty(), true, self.start)
            .map_err(|e| spawn_error(&program.program, e))?;
        if let Some(mut stdin) = stdin {
            let data = req.stdin;
            // A child that never reads its stdin must not stall the call:
            // the write runs beside it and ends with EPIPE when it exits.
            tokio::spawn(async move {
                let _ = stdin.write_all(&data).await;
            });
        }
        let pid = running.pid();
        self.table.insert(pid, program.display, false);
        tracing::debug!(pid, program = %program.program, "exec started");

        // Both streams travel in one answer: never more than a message holds.
        let limit =
            req.output_limit_bytes.unwrap_or(DEFAULT_OUTPUT_LIMIT).min(shared::limits::MAX_EXEC_OUTPUT);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let (mut stdout, mut stderr) = (Captured::new(limit), Captured::new(limit));
        let deadline = req
            .timeout_ms
            .filter(|ms| *ms > 0)
            .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
        let mut timed_out = false;
        let status = loop {
            tokio::select! {
                event = running.next_event() => match event {
                    Ok(ChildEvent::Output(OutputStream::Stderr, data)) => stderr.push(&data),
                    Ok(ChildEvent::Output(_, data)) => stdout.push(&data),
                    Ok(ChildEvent::Finished(status)) => break status,
                    Err(e) => {
                        running.kill_group();
                        return Err(Error::internal(format!("waiting for pid {pid}: {e}")));
                    }
                },
                _ = child::sleep_until(deadline), if !timed_out => {
                    tracing::debug!(pid, "exec timed out, killing its process group");
                    timed_out = true;
                    running.kill_group();
                }
            }
        };
        let status = child::exit_status(status);
        self.table.finish(pid, status);
        if let Some(masks) = &masks {
            stdout.data = masks.mask_bytes(&stdout.data);
            stderr.data = masks.mask_bytes(&stderr.data);
        }
        Ok(ExecResponse {
            status: Some(status),
            stdout: stdout.data,
            stderr: stderr.data,
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            timed_out,
            duration_ms: started.elapsed().as_millis() as u64,
        })
    }

    async fn start_spawn(
        &self,
        mut inbound: Streaming<SpawnRequest>,
    ) -> Result<ReceiverStream<Result<SpawnResponse, Status>>, Error> {
        let start = match inbound.message().await {
            Ok(Some(SpawnRequest { request: Some(spawn_request::Request::Start(start)) })) => start,
            Ok(Some(_)) => return Err(Error::invalid_field("start", "the first message must carry start")),
            Ok(None) => return Err(Error::invalid_field("start", "the stream ended before start")),
            Err(status) => return Err(Error::from_status(&status)),
        };
        let program = Program::from_command(start.command)?;
        child::validate_env(&start.env)?;
        let cwd = resolve_cwd(&self.root, &start.cwd)?;
        let user = self.run_user.as_ref();
        let internal = |e: std::io::Error| Error::internal(e.to_string());
        let (running, input) = match start.pty {
            Some(_) if start.detached => {
                return Err(Error::invalid_field(
                    "pty",
                    "a terminal ends with its client: not with detached",
                ));
            }
            Some(size) => {
                let (rows, cols) = terminal_size(&size)?;
                let (pty, terminal) = Pty::open(rows, cols).map_err(internal)?;
                let cmd = child::terminal_command(
                    &program.program,
                    &program.args,
                    &cwd,
                    &start.env,
                    user,
                    &self.isolation,
                    terminal,
                )
                .map_err(|e| spawn_error(&program.program, e))?;
                // The command (and with it the agent's copy of the
                // terminal's other side) is dropped here: reads end once
                // the child's processes close it.
                let spawned = tokio::process::Command::from(cmd)
                    .spawn()
                    .map_err(|e| spawn_error(&program.program, e))?;
                let running = RunningChild::on_terminal(spawned, pty.handle().map_err(internal)?, true)
                    .map_err(internal)?;
                let writer = pty.handle().map_err(internal)?;
                (running, Some(Input::Terminal(Box::new(writer), pty)))
            }
            None => {
                let launch = self.launch(&program, &cwd, &start.env);
                let (running, stdin) = child::start(&launch, true, !start.detached, self.start)
                    .map_err(|e| spawn_error(&program.program, e))?;
                (running, stdin.map(Input::Pipe))
            }
        };
        let pid = running.pid();
        self.table.insert(pid, program.display, start.detached);
        tracing::debug!(pid, program = %program.program, detached = start.detached, "spawn started");

        let (tx, rx) = mpsc::channel(32);
        let started = SpawnResponse { event: Some(spawn_response::Event::Started(SpawnStarted { pid })) };
        // The channel is empty, so this cannot wait.
        let _ = tx.send(Ok(started)).await;
        tokio::spawn(supervise_spawn(running, input, inbound, tx, start.detached, self.table.clone()));
        Ok(ReceiverStream::new(rx))
    }
}

/// Drive a spawned process: forward stdin and signals from the client,
/// stream its output, report its exit. When the client goes away the group
/// is killed, unless the process was started detached (then its output is
/// read and dropped until it exits, so it never blocks on a full pipe).
async fn supervise_spawn(
    mut running: RunningChild,
    input: Option<Input>,
    inbound: Streaming<SpawnRequest>,
    tx: mpsc::Sender<Result<SpawnResponse, Status>>,
    detached: bool,
    table: ProcessTable,
) {
    let pid = running.pid();
    let client_gone = tokio_util::sync::CancellationToken::new();
    let inbound_task = tokio::spawn(forward_inbound(inbound, input, pid, client_gone.clone()));
    let mut attached = true;
    let on_gone = |running: &RunningChild| {
        if detached {
            tracing::debug!(pid, "spawn client gone, detached process keeps running");
        } else {
            tracing::debug!(pid, "spawn client gone, killing its process group");
            running.kill_group();
        }
    };
    loop {
        tokio::select! {
            event = running.next_event() => match event {
                Ok(ChildEvent::Output(stream, data)) => {
                    if attached {
                        let chunk = OutputChunk { stream: stream as i32, data: data.to_vec() };
                        let msg = SpawnResponse { event: Some(spawn_response::Event::Output(chunk)) };
                        if tx.send(Ok(msg)).await.is_err() {
                            attached = false;
                            on_gone(&running);
                        }
                    }
                }
                Ok(ChildEvent::Finished(status)) => {
                    let status = child::exit_status(status);
                    table.finish(pid, status);
                    if attached {
                        let _ = tx.send(Ok(SpawnResponse { event: Some(spawn_response::Event::Exited(status)) })).await;
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(pid, error = %e, "waiting for a spawned process failed");
                    running.kill_group();
                    if attached {
                        let _ = tx.send(Err(Error::internal(format!("waiting for pid {pid}: {e}")).into())).await;
                    }
                    break;
                }
            },
            _ = tx.closed(), if attached => {
                attached = false;
                on_gone(&running);
            }
            _ = client_gone.cancelled(), if attached => {
                attached = false;
                on_gone(&running);
            }
        }
    }
    inbound_task.abort();
}

/// Where a spawned process's input goes: its stdin pipe, or the terminal
/// it runs on (which also takes resizes).
enum Input {
    Pipe(Box<dyn AsyncWrite + Send + Unpin>),
    Terminal(Box<dyn AsyncWrite + Send + Unpin>, Pty),
}

/// End-of-file typed at a terminal (^D): a terminal's input cannot be
/// closed, only told that nothing more comes.
const TERMINAL_EOF: u8 = 0x04;

/// The size of a `pty` spawn or a resize: rows and columns, 1-65535 each.
fn terminal_size(size: &TerminalSize) -> Result<(u16, u16), Error> {
    let side = |n: u32, name: &str| {
        u16::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| Error::invalid_field(format!("pty.{name}"), format!("{n} is not 1-65535")))
    };
    Ok((side(size.rows, "rows")?, side(size.cols, "cols")?))
}

/// Apply the client's messages after `start`: input bytes, close-stdin,
/// resizes, signals. The end of the client's stream closes stdin (nothing
/// more can come); a broken stream means the client is gone.
async fn forward_inbound(
    mut inbound: Streaming<SpawnRequest>,
    input: Option<Input>,
    pid: u32,
    client_gone: tokio_util::sync::CancellationToken,
) {
    let (writer, pty) = match input {
        Some(Input::Pipe(w)) => (Some(w), None),
        Some(Input::Terminal(w, pty)) => (Some(w), Some(pty)),
        None => (None, None),
    };
    // Input is written by its own task so that a child that does not read
    // (a full pipe) cannot hold up signals behind it for long: the queue
    // gives the client room before it is pushed back.
    let mut stdin_tx = writer.map(|mut writer| {
        let (tx, mut rx) = mpsc::channel::<Bytes>(64);
        tokio::spawn(async move {
            while let Some(data) = rx.recv().await {
                if writer.write_all(&data).await.is_err() || writer.flush().await.is_err() {
                    break;
                }
            }
        });
        tx
    });
    loop {
        match inbound.message().await {
            Ok(Some(msg)) => match msg.request {
                Some(spawn_request::Request::Stdin(data)) => {
                    if let Some(tx) = &stdin_tx
                        && tx.send(Bytes::from(data)).await.is_err()
                    {
                        stdin_tx = None;
                    }
                }
                Some(spawn_request::Request::CloseStdin(_)) if pty.is_some() => {
                    if let Some(tx) = &stdin_tx {
                        let _ = tx.send(Bytes::from_static(&[TERMINAL_EOF])).await;
                    }
                }
                Some(spawn_request::Request::CloseStdin(_)) => stdin_tx = None,
                Some(spawn_request::Request::Resize(size)) => match (&pty, terminal_size(&size)) {
                    (Some(pty), Ok((rows, cols))) => {
                        if let Err(e) = pty.resize(rows, cols) {
                            tracing::debug!(pid, error = %e, "terminal resize failed");
                        }
                    }
                    (Some(_), Err(e)) => tracing::warn!(pid, error = %e, "ignoring a bad terminal size"),
                    (None, _) => tracing::warn!(pid, "ignoring a resize of a process without a terminal"),
                },
                Some(spawn_request::Request::Signal(signo)) => {
                    if !child::is_valid_signal(signo) {
                        tracing::warn!(pid, signo, "ignoring an invalid signal number");
                    } else if let Err(e) = child::signal_group(pid, signo) {
                        tracing::debug!(pid, signo, error = %e, "signal not delivered");
                    }
                }
                Some(spawn_request::Request::Start(_)) => {
                    tracing::warn!(pid, "ignoring a second start message");
                }
                None => {}
            },
            Ok(None) if pty.is_some() => {
                // A terminal whose user left: the process is killed with
                // the stream (terminals are never detached).
                client_gone.cancel();
                return;
            }
            Ok(None) => return,
            Err(_) => {
                client_gone.cancel();
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl ProcessService for Processes {
    async fn exec(&self, req: Request<ExecRequest>) -> Result<Response<ExecResponse>, Status> {
        Ok(Response::new(self.exec_inner(req.into_inner()).await?))
    }

    type SpawnStream = ReceiverStream<Result<SpawnResponse, Status>>;

    async fn spawn(
        &self,
        req: Request<Streaming<SpawnRequest>>,
    ) -> Result<Response<Self::SpawnStream>, Status> {
        Ok(Response::new(self.start_spawn(req.into_inner()).await?))
    }

    async fn git(&self, req: Request<GitRequest>) -> Result<Response<ExecResponse>, Status> {
        Ok(Response::new(self.git.run(req.into_inner()).await?))
    }

    async fn list_processes(
        &self,
        _req: Request<ListProcessesRequest>,
    ) -> Result<Response<ListProcessesResponse>, Status> {
        Ok(Response::new(ListProcessesResponse { processes: self.table.list() }))
    }

    async fn signal_process(
        &self,
        req: Request<SignalProcessRequest>,
    ) -> Result<Response<SignalProcessResponse>, Status> {
        let req = req.into_inner();
        if !child::is_valid_signal(req.signal) {
            return Err(
                Error::invalid_field("signal", format!("{} is not a signal number", req.signal)).into()
            );
        }
        let info = self
            .table
            .get(req.pid)
            .ok_or_else(|| Error::not_found(format!("pid {} was not started by this agent", req.pid)))?;
        if !info.running {
            // Its pid may already belong to someone else.
            return Err(
                Error::new(ErrorCode::FailedPrecondition, format!("pid {} has exited", req.pid)).into()
            );
        }
        child::signal_group(req.pid, req.signal).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => {
                Error::new(ErrorCode::FailedPrecondition, format!("pid {} has exited", req.pid))
            }
            _ => Error::internal(format!("signalling pid {}: {e}", req.pid)),
        })?;
        Ok(Response::new(SignalProcessResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use proto::SpawnStart;
    use proto::process_service_client::ProcessServiceClient;
    use proto::process_service_server::ProcessServiceServer;
    use tonic::transport::Server;

    use super::*;
    use crate::testing;

    #[tokio::test]
    async fn exec_runs_in_the_cwd_asked_and_reports_output_and_status_through_the_real_stack() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = testing::context(dir.path());
        std::fs::create_dir_all(dir.path().join("root/sub")).unwrap();
        let channel =
            testing::channel(Server::builder().add_service(ProcessServiceServer::new(Processes::new(&ctx))))
                .await;
        let mut client = ProcessServiceClient::new(channel);
        let command =
            Command { kind: Some(proto::command::Kind::Shell("pwd; echo oops >&2; exit 7".into())) };
        let req = ExecRequest { command: Some(command), cwd: "sub".into(), ..Default::default() };
        let out = client.exec(req).await.unwrap().into_inner();
        let cwd = ctx.root.path().join("sub");
        assert_eq!(out.stdout, format!("{}\n", cwd.display()).into_bytes());
        assert_eq!(out.stderr, b"oops\n");
        assert_eq!(out.status.and_then(|s| s.status), Some(proto::exit_status::Status::Code(7)));
        assert!(!out.timed_out && !out.stdout_truncated);

        let true_cmd = Command { kind: Some(proto::command::Kind::Shell("true".into())) };
        let missing = ExecRequest { command: Some(true_cmd), cwd: "nowhere".into(), ..Default::default() };
        let err = client.exec(missing).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    }

    #[tokio::test]
    async fn a_pty_spawn_is_a_terminal_that_follows_resizes_and_reports_the_exit() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = testing::context(dir.path());
        let channel =
            testing::channel(Server::builder().add_service(ProcessServiceServer::new(Processes::new(&ctx))))
                .await;
        let mut client = ProcessServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(8);
        let script =
            "test -t 0 && test -t 1 && echo tty-yes; stty size; read line; stty size; echo got=$line; exit 3";
        let start = SpawnStart {
            command: Some(Command { kind: Some(proto::command::Kind::Shell(script.into())) }),
            pty: Some(TerminalSize { rows: 30, cols: 100 }),
            ..Default::default()
        };
        tx.send(SpawnRequest { request: Some(spawn_request::Request::Start(start)) }).await.unwrap();
        let mut events = client.spawn(ReceiverStream::new(rx)).await.unwrap().into_inner();
        let mut output = String::new();
        let mut typed = false;
        let status = loop {
            match events.message().await.unwrap().unwrap().event.unwrap() {
                spawn_response::Event::Started(_) => {}
                spawn_response::Event::Output(chunk) => {
                    output.push_str(&String::from_utf8_lossy(&chunk.data));
                    if !typed && output.contains("30 100") {
                        typed = true;
                        let resize = TerminalSize { rows: 40, cols: 120 };
                        tx.send(SpawnRequest { request: Some(spawn_request::Request::Resize(resize)) })
                            .await
                            .unwrap();
                        tx.send(SpawnRequest {
                            request: Some(spawn_request::Request::Stdin(b"hello\r".to_vec())),
                        })
                        .await
                        .unwrap();
                    }
                }
                spawn_response::Event::Exited(status) => break status,
            }
        };
        assert!(output.contains("tty-yes"), "{output:?}");
        assert!(output.contains("40 120"), "the resize reached the terminal: {output:?}");
        assert!(output.contains("got=hello"), "{output:?}");
        assert_eq!(status.status, Some(proto::exit_status::Status::Code(3)));

        // A terminal is never detached.
        let (tx, rx) = mpsc::channel(1);
        let start = SpawnStart {
            command: Some(Command { kind: Some(proto::command::Kind::Shell("true".into())) }),
            pty: Some(TerminalSize { rows: 1, cols: 1 }),
            detached: true,
            ..Default::default()
        };
        tx.send(SpawnRequest { request: Some(spawn_request::Request::Start(start)) }).await.unwrap();
        let err = client.spawn(ReceiverStream::new(rx)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }

    /// Both ways of starting a child confine it the same: the denied
    /// calls fail, a write outside the writable dirs is refused, and (as
    /// root) it runs as the run user with no supplementary group. Each
    /// would fail if that way skipped the layer.
    #[tokio::test]
    async fn an_exec_is_confined_the_same_whichever_way_it_starts() {
        if crate::isolation::landlock::abi_version().is_none() {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut ctx = testing::context(dir.path());
        std::fs::set_permissions(ctx.root.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        // SAFETY: a plain syscall.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            ctx.run_user = Some(RunUser {
                uid: 65534,
                gid: 65534,
                name: "nobody".into(),
                home: dir.path().join("home"),
            });
        }
        // Outside the root, HOME and the scratch dirs: beside this test
        // binary.
        let exe = std::env::current_exe().unwrap();
        let away = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
        std::fs::set_permissions(away.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let helper = sandhold_tests::attack::install_syscalls(ctx.root.path(), "syscalls");
        let script = format!(
            "echo ids=$(id -u):$(id -g):$(id -G); (echo x > {}/escaped) 2>/dev/null || echo write-refused; {}",
            away.path().display(),
            helper.display()
        );
        for start in [Start::Spawner, Start::Fork] {
            let spawned = crate::spawner::started();
            let processes = Processes::starting(&ctx, start);
            let req = ExecRequest {
                command: Some(Command { kind: Some(proto::command::Kind::Shell(script.clone())) }),
                ..Default::default()
            };
            let out = processes.exec_inner(req).await.unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            if start == Start::Spawner {
                assert!(crate::spawner::started() > spawned, "{start:?} did not use the spawner thread");
            }
            assert!(text.contains("write-refused\n"), "{start:?}: {text}");
            assert!(!away.path().join("escaped").exists(), "{start:?}");
            sandhold_tests::attack::assert_denied(&out.stdout);
            if root {
                assert!(text.contains("ids=65534:65534:65534\n"), "{start:?}: {text}");
            }
        }
    }

    #[test]
    fn captured_keeps_the_first_bytes_and_flags_truncation() {
        let mut c = Captured::new(5);
        c.push(b"abc");
        assert!(!c.truncated);
        c.push(b"defg");
        assert_eq!(c.data, b"abcde");
        assert!(c.truncated);
    }

    #[test]
    fn table_forgets_the_oldest_finished_processes() {
        let table = ProcessTable::default();
        table.insert(1, "running".into(), true);
        for pid in 100..(100 + MAX_FINISHED as u32 + 10) {
            table.insert(pid, "x".into(), false);
            table.finish(pid, proto::ExitStatus { status: Some(proto::exit_status::Status::Code(0)) });
        }
        let list = table.list();
        assert_eq!(list.len(), MAX_FINISHED + 1);
        assert!(table.get(1).unwrap().running);
        assert!(table.get(100).is_none());
    }

    #[test]
    fn programs_from_commands() {
        use proto::command::Kind;
        let argv = Command { kind: Some(Kind::Argv(proto::Argv { args: vec!["echo".into(), "hi".into()] })) };
        let p = Program::from_command(Some(argv)).unwrap();
        assert_eq!(
            (p.program.as_str(), p.args.as_slice(), p.display.as_str()),
            ("echo", &["hi".to_string()][..], "echo hi")
        );
        let shell = Command { kind: Some(Kind::Shell("echo $X".into())) };
        let p = Program::from_command(Some(shell)).unwrap();
        assert_eq!(p.args, vec!["-c".to_string(), "echo $X".to_string()]);
        assert!(Program::from_command(None).is_err());
        let empty = Command { kind: Some(Kind::Argv(proto::Argv { args: vec![] })) };
        assert_eq!(Program::from_command(Some(empty)).unwrap_err().code, ErrorCode::InvalidArgument);
    }
}
