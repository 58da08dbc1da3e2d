//! `JournalService`: journaled runs and reads of their journals.
//!
//! Everything a read needs is on disk (see `shared::journal` for the files),
//! so an agent restarted on the same journal dir serves the runs of its
//! predecessor, running ones included: the supervisor ([`crate::shim`]) holds
//! the run's lock and writes the sentinel; the agent only starts it and reads.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use futures::Stream;
use shared::error::{Error, ErrorCode};
use shared::ids::RunId;
use shared::journal::{self, JournalPaths, LineSplitter};
use shared::proto::agent::v1::journal_service_server::JournalService;
use shared::proto::agent::v1::{
    DeleteJournalsRequest, DeleteJournalsResponse, FollowRequest, FollowResponse, JournalInfo, JournalLine,
    JournalLines, ListJournalsRequest, ListJournalsResponse, ProbeExitRequest, ProbeExitResponse,
    ReadJournalRequest, ReadJournalResponse, RunExit, RunState, StartRunRequest, StartRunResponse,
    command::Kind as CommandKind, follow_response, start_run_request,
};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tonic::{Request, Response, Status};

use crate::confine::Root;
use crate::context::AgentContext;
use crate::shim::lock_is_held;

/// Default bound on the wait for a journal's first byte.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a follow re-reads the journal even without an inotify wake-up
/// (the fallback when inotify is unavailable, and a safety net when it is).
pub const FOLLOW_POLL: Duration = Duration::from_millis(250);
/// How often a follow re-reads when inotify could not be set up.
pub const FOLLOW_POLL_NO_INOTIFY: Duration = Duration::from_millis(50);
/// Default and largest `max_bytes` of a bounded read.
pub const DEFAULT_READ_BYTES: u64 = 1 << 20;
pub const MAX_READ_BYTES: u64 = 16 << 20;
/// How far back from the end `ProbeExit` looks for the sentinel. The
/// sentinel is the last thing the supervisor writes; only output of the
/// command's leftover descendants can follow it.
pub const PROBE_WINDOW: u64 = 1 << 20;
/// Bytes of lines per follow message.
const BATCH_BYTES: usize = 256 << 10;
/// How long `StartRun` waits for the supervisor to report.
const SHIM_START_TIMEOUT: Duration = Duration::from_secs(10);

static SHIM_PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Use `program` (a `sandhold-agent` binary) as the supervisor instead of the
/// current executable. For hosts that embed the agent (tests); first call
/// wins.
pub fn set_shim_program(program: impl Into<PathBuf>) {
    let _ = SHIM_PROGRAM.set(program.into());
}

fn shim_program() -> std::io::Result<PathBuf> {
    match SHIM_PROGRAM.get() {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe(),
    }
}

pub struct Journal {
    root: Root,
    journal_dir: PathBuf,
}

impl Journal {
    pub fn new(ctx: &AgentContext) -> Self {
        Self { root: ctx.root.clone(), journal_dir: ctx.journal_dir.clone() }
    }

    fn paths(&self, run_id: &RunId) -> JournalPaths {
        JournalPaths::new(&self.journal_dir, run_id)
    }
}

fn parse_run_id(s: &str) -> Result<RunId, Error> {
    RunId::parse(s).map_err(|e| Error::invalid_field("run_id", e.to_string()))
}

fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::internal(format!("{what}: {e}"))
}

/// Open a run's journal for reading, `NOT_FOUND` when it has none. Never
/// creates anything.
fn open_journal(paths: &JournalPaths, run_id: &RunId) -> Result<std::fs::File, Error> {
    std::fs::File::open(&paths.ndjson).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::not_found(format!("no journal for run {run_id}")),
        _ => io_error("opening the journal", e),
    })
}

/// The last [`journal::STDERR_TAIL_BYTES`] of the stderr sidecar.
pub fn stderr_tail(path: &Path) -> Vec<u8> {
    let Ok(file) = std::fs::File::open(path) else { return Vec::new() };
    let Ok(len) = file.metadata().map(|m| m.len()) else { return Vec::new() };
    let start = len.saturating_sub(journal::STDERR_TAIL_BYTES);
    let mut buf = vec![0u8; (len - start) as usize];
    match file.read_exact_at(&mut buf, start) {
        Ok(()) => buf,
        Err(_) => Vec::new(),
    }
}

/// Read `len` bytes at `offset` (fewer at end of file).
fn read_at(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len as usize);
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    f.take(len).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Probe a run without a gRPC request (also used by tests): the supervisor's
/// lock is checked before the sentinel is looked for, so a supervisor that
/// writes its sentinel and exits in between is seen as finished, never as
/// unknown.
pub fn probe(paths: &JournalPaths, nonce: &str) -> (RunState, Option<i32>) {
    let alive = lock_is_held(&paths.lock);
    let Ok(file) = std::fs::File::open(&paths.ndjson) else { return (RunState::Unknown, None) };
    let Ok(len) = file.metadata().map(|m| m.len()) else { return (RunState::Unknown, None) };
    let start = len.saturating_sub(PROBE_WINDOW);
    let Ok(tail) = read_at(&file, start, len - start) else { return (RunState::Unknown, None) };
    if let Some(exit) = journal::find_exit(&tail, start, nonce) {
        return (RunState::Finished, Some(exit.code));
    }
    if alive { (RunState::Running, None) } else { (RunState::Unknown, None) }
}

type FollowStream = Pin<Box<dyn Stream<Item = Result<FollowResponse, Status>> + Send>>;

#[tonic::async_trait]
impl JournalService for Journal {
    async fn start_run(&self, req: Request<StartRunRequest>) -> Result<Response<StartRunResponse>, Status> {
        let mut req = req.into_inner();
        let run_id = parse_run_id(&req.run_id)?;
        let argv: Vec<String> = match req.command.take().and_then(|c| c.kind) {
            Some(CommandKind::Argv(a)) if !a.args.is_empty() && !a.args[0].is_empty() => a.args,
            Some(CommandKind::Shell(s)) if !s.is_empty() => vec!["/bin/sh".into(), "-c".into(), s],
            _ => return Err(Error::invalid_field("command", "an argv or a shell string is required").into()),
        };
        crate::child::validate_env(&req.env)?;
        if req.sentinel_key.len() > crate::shim::MAX_KEY_LEN {
            return Err(Error::invalid_field("sentinel_key", "longer than 4096 bytes").into());
        }
        let cwd = self.root.resolve(&req.cwd)?;
        if !cwd.is_dir() {
            return Err(Error::invalid_field("cwd", "not a directory under the sandbox root").into());
        }
        let stdin_file = match &req.stdin {
            Some(start_run_request::Stdin::StdinFile(p)) => {
                let path = self.root.resolve(p)?;
                // A FIFO is fine too (a prompt streamed in by another process).
                if !std::fs::metadata(&path).is_ok_and(|m| !m.is_dir()) {
                    return Err(
                        Error::invalid_field("stdin_file", "not a file under the sandbox root").into()
                    );
                }
                Some(path)
            }
            _ => None,
        };

        let paths = self.paths(&run_id);
        // The exclusive create is the one check that an id is new: a second
        // start of the same id never appends to the old run.
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&paths.ndjson) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::new(
                    ErrorCode::AlreadyExists,
                    format!("run {run_id} already has a journal"),
                )
                .into());
            }
            Err(e) => return Err(io_error("creating the journal", e).into()),
        }
        match start_supervisor(&paths, &run_id, &argv, &cwd, stdin_file, &req, &self.journal_dir).await {
            Ok((pid, supervisor_pid)) => {
                tracing::info!(run_id = %run_id, pid, supervisor_pid, "run started");
                Ok(Response::new(StartRunResponse {
                    pid,
                    supervisor_pid,
                    journal_path: paths.ndjson.display().to_string(),
                    stderr_path: paths.err.display().to_string(),
                }))
            }
            Err(e) => {
                // Nothing ran: leave no journal, so the id is not burnt.
                for p in paths.all() {
                    let _ = std::fs::remove_file(p);
                }
                Err(e.into())
            }
        }
    }

    type FollowStream = FollowStream;

    async fn follow(&self, req: Request<FollowRequest>) -> Result<Response<Self::FollowStream>, Status> {
        let req = req.into_inner();
        let run_id = parse_run_id(&req.run_id)?;
        let paths = self.paths(&run_id);
        let file = open_journal(&paths, &run_id)?;
        let size = file.metadata().map_err(|e| io_error("reading the journal", e))?.len();
        if req.from_byte > size {
            return Err(Error::invalid_field(
                "from_byte",
                format!("{} is past the end of the journal ({size} bytes)", req.from_byte),
            )
            .into());
        }
        let nonce = journal::nonce(&req.sentinel_key, &run_id);
        let bound = match req.first_byte_timeout_ms {
            None => Some(DEFAULT_FIRST_BYTE_TIMEOUT),
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
        };
        Ok(Response::new(Box::pin(follow_stream(file, paths, run_id, req.from_byte, nonce, bound))))
    }

    async fn read_journal(
        &self,
        req: Request<ReadJournalRequest>,
    ) -> Result<Response<ReadJournalResponse>, Status> {
        let req = req.into_inner();
        let run_id = parse_run_id(&req.run_id)?;
        let paths = self.paths(&run_id);
        let file = open_journal(&paths, &run_id)?;
        let nonce = journal::nonce(&req.sentinel_key, &run_id);
        let max = match req.max_bytes {
            0 => DEFAULT_READ_BYTES,
            n => n.min(MAX_READ_BYTES),
        };
        let resp =
            tokio::task::spawn_blocking(move || bounded_read(&file, &paths, req.from_byte, max, &nonce))
                .await
                .map_err(|e| Error::internal(e.to_string()))??;
        Ok(Response::new(resp))
    }

    async fn probe_exit(
        &self,
        req: Request<ProbeExitRequest>,
    ) -> Result<Response<ProbeExitResponse>, Status> {
        let req = req.into_inner();
        let run_id = parse_run_id(&req.run_id)?;
        let paths = self.paths(&run_id);
        let nonce = journal::nonce(&req.sentinel_key, &run_id);
        let (state, exit_code) = tokio::task::spawn_blocking(move || probe(&paths, &nonce))
            .await
            .map_err(|e| Error::internal(e.to_string()))?;
        Ok(Response::new(ProbeExitResponse { state: state as i32, exit_code }))
    }

    async fn list_journals(
        &self,
        _req: Request<ListJournalsRequest>,
    ) -> Result<Response<ListJournalsResponse>, Status> {
        let dir = self.journal_dir.clone();
        let journals = tokio::task::spawn_blocking(move || list(&dir))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
        Ok(Response::new(ListJournalsResponse { journals }))
    }

    async fn delete_journals(
        &self,
        req: Request<DeleteJournalsRequest>,
    ) -> Result<Response<DeleteJournalsResponse>, Status> {
        let ids = req.into_inner().run_ids.iter().map(|s| parse_run_id(s)).collect::<Result<Vec<_>, _>>()?;
        let mut resp = DeleteJournalsResponse::default();
        for id in ids {
            let paths = self.paths(&id);
            let existed = paths.ndjson.exists();
            for p in paths.all() {
                match std::fs::remove_file(p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_error("deleting a journal", e).into()),
                }
            }
            if existed {
                resp.deleted.push(id.to_string());
            } else {
                resp.not_found.push(id.to_string());
            }
        }
        Ok(Response::new(resp))
    }
}

async fn start_supervisor(
    paths: &JournalPaths,
    run_id: &RunId,
    argv: &[String],
    cwd: &Path,
    stdin_file: Option<PathBuf>,
    req: &StartRunRequest,
    journal_dir: &Path,
) -> Result<(u32, u32), Error> {
    let mut stdin_arg = stdin_file.map(|p| (p, false));
    if let Some(start_run_request::Stdin::StdinBytes(bytes)) = &req.stdin {
        std::fs::write(&paths.stdin, bytes).map_err(|e| io_error("writing stdin", e))?;
        stdin_arg = Some((paths.stdin.clone(), true));
    }
    // The previous owner of a deleted id may have left a sidecar behind.
    let _ = std::fs::remove_file(&paths.err);
    let _ = std::fs::remove_file(&paths.exit);

    let program = shim_program().map_err(|e| io_error("locating the agent binary", e))?;
    // Not `child::command`: that makes a process group, and a group leader
    // cannot start a session.
    let mut cmd = std::process::Command::new(&program);
    cmd.current_dir("/");
    crate::child::scrub_env(&mut cmd, &req.env);
    cmd.arg("shim")
        .arg("--journal-dir")
        .arg(journal_dir)
        .arg("--run-id")
        .arg(run_id.as_str())
        .arg("--cwd")
        .arg(cwd);
    if let Some((path, remove)) = &stdin_arg {
        cmd.arg("--stdin-file").arg(path);
        if *remove {
            cmd.arg("--remove-stdin-file");
        }
    }
    cmd.arg("--").args(argv);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    // A session of its own (which also makes it a group leader): no signal
    // aimed at the agent's group or terminal reaches the supervisor.
    // SAFETY: setsid is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = tokio::process::Command::from(cmd)
        .spawn()
        .map_err(|e| io_error(&format!("starting the supervisor {}", program.display()), e))?;
    let supervisor_pid = child.id().unwrap_or(0);
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(&req.sentinel_key).await.map_err(|e| io_error("handing over the key", e))?;
        // EOF ends the key.
        drop(stdin);
    }
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut status = Vec::new();
    let read = async {
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).await? == 1 && byte[0] != b'\n' {
            status.push(byte[0]);
        }
        Ok::<_, std::io::Error>(())
    };
    let read_result = tokio::time::timeout(SHIM_START_TIMEOUT, read).await;
    // Reap the supervisor whenever it ends, while this agent lives.
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    match read_result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(io_error("reading the supervisor status", e)),
        Err(_) => return Err(Error::new(ErrorCode::Unavailable, "the supervisor did not report in time")),
    }
    let status = String::from_utf8_lossy(&status).into_owned();
    if let Some(pid) = status.strip_prefix("ok ") {
        let pid =
            pid.trim().parse().map_err(|_| Error::internal(format!("bad supervisor status {status:?}")))?;
        Ok((pid, supervisor_pid))
    } else if let Some(msg) = status.strip_prefix("err ") {
        Err(Error::new(ErrorCode::FailedPrecondition, format!("cannot start the run: {msg}")))
    } else {
        Err(Error::internal(format!("the supervisor exited without a status ({status:?})")))
    }
}

fn exit_message(paths: &JournalPaths, code: i32, sentinel_offset: u64) -> RunExit {
    RunExit { exit_code: code, stderr_tail: stderr_tail(&paths.err), sentinel_offset }
}

fn follow_stream(
    file: std::fs::File,
    paths: JournalPaths,
    run_id: RunId,
    from: u64,
    nonce: String,
    bound: Option<Duration>,
) -> impl Stream<Item = Result<FollowResponse, Status>> + Send {
    async_stream::try_stream! {
        // Woken by inotify; the periodic re-read covers filesystems where it
        // does not work and any missed wake-up.
        let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
        let watcher = {
            use notify::Watcher;
            notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
                let _ = wake_tx.try_send(());
            })
            .and_then(|mut w| w.watch(&paths.ndjson, notify::RecursiveMode::NonRecursive).map(|()| w))
        };
        let poll = if watcher.is_ok() { FOLLOW_POLL } else { FOLLOW_POLL_NO_INOTIFY };
        let _watcher = watcher.ok();

        let mut reader = tokio::fs::File::from_std(file);
        reader.seek(SeekFrom::Start(from)).await.map_err(|e| io_error("seeking the journal", e))?;
        let mut splitter = LineSplitter::new(from);
        let started = Instant::now();
        let mut got_first = false;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader.read(&mut buf).await.map_err(|e| io_error("reading the journal", e))?;
            if n > 0 {
                got_first = true;
                let mut batch = Vec::new();
                let mut batch_bytes = 0usize;
                for (bytes, end_offset) in splitter.push(&buf[..n]) {
                    if let Some(code) = journal::parse_sentinel(&bytes, &nonce) {
                        if !batch.is_empty() {
                            yield lines_message(std::mem::take(&mut batch));
                        }
                        let start = end_offset - bytes.len() as u64 - 1;
                        tracing::debug!(run_id = %run_id, code, "follow reached the exit sentinel");
                        yield FollowResponse { event: Some(follow_response::Event::Exit(exit_message(&paths, code, start))) };
                        return;
                    }
                    batch_bytes += bytes.len() + 16;
                    batch.push(JournalLine { data: bytes, end_offset });
                    if batch_bytes >= BATCH_BYTES {
                        yield lines_message(std::mem::take(&mut batch));
                        batch_bytes = 0;
                    }
                }
                if !batch.is_empty() {
                    yield lines_message(batch);
                }
                continue;
            }
            let stall_deadline = match (got_first, bound) {
                (false, Some(b)) => {
                    if started.elapsed() >= b {
                        Err(Status::from(Error::new(
                            ErrorCode::JournalStalled,
                            format!("no byte from the journal of run {run_id} within {} ms", b.as_millis()),
                        )))?;
                    }
                    Some(started + b)
                }
                _ => None,
            };
            let sleep_for = match stall_deadline {
                Some(d) => poll.min(d.saturating_duration_since(Instant::now())),
                None => poll,
            };
            tokio::select! {
                _ = wake_rx.recv() => {}
                _ = tokio::time::sleep(sleep_for) => {}
            }
        }
    }
}

fn lines_message(lines: Vec<JournalLine>) -> FollowResponse {
    FollowResponse { event: Some(follow_response::Event::Lines(JournalLines { lines })) }
}

fn bounded_read(
    file: &std::fs::File,
    paths: &JournalPaths,
    from: u64,
    max: u64,
    nonce: &str,
) -> Result<ReadJournalResponse, Error> {
    let size = file.metadata().map_err(|e| io_error("reading the journal", e))?.len();
    if from > size {
        return Err(Error::invalid_field(
            "from_byte",
            format!("{from} is past the end of the journal ({size} bytes)"),
        ));
    }
    let mut data = read_at(file, from, max).map_err(|e| io_error("reading the journal", e))?;
    // A first line longer than max_bytes is returned whole, or a reader
    // could never get past it.
    if !data.contains(&b'\n') {
        let mut offset = from + data.len() as u64;
        while offset < size && !data.contains(&b'\n') {
            let more = read_at(file, offset, max).map_err(|e| io_error("reading the journal", e))?;
            if more.is_empty() {
                break;
            }
            offset += more.len() as u64;
            data.extend_from_slice(&more);
        }
        if let Some(i) = data.iter().position(|&b| b == b'\n') {
            data.truncate(i + 1);
        }
    }
    let (lines, _) = journal::split_lines(&data, from);
    let mut resp = ReadJournalResponse { next_offset: from, journal_size: size, ..Default::default() };
    for line in lines {
        if let Some(code) = journal::parse_sentinel(line.bytes, nonce) {
            let start = line.end_offset - line.bytes.len() as u64 - 1;
            resp.exit = Some(exit_message(paths, code, start));
            resp.next_offset = line.end_offset;
            break;
        }
        resp.next_offset = line.end_offset;
        resp.lines.push(JournalLine { data: line.bytes.to_vec(), end_offset: line.end_offset });
    }
    Ok(resp)
}

fn list(dir: &Path) -> Result<Vec<JournalInfo>, Error> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| io_error("listing the journal dir", e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(run_id) = name.to_str().and_then(journal::run_id_of_journal_file) else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        let paths = JournalPaths::new(dir, &run_id);
        let stderr_bytes = std::fs::metadata(&paths.err).map(|m| m.len()).unwrap_or(0);
        let mtime_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        let exit_code = std::fs::read_to_string(&paths.exit).ok().and_then(|s| s.trim().parse::<i32>().ok());
        let state = match exit_code {
            Some(_) => RunState::Finished,
            None if lock_is_held(&paths.lock) => RunState::Running,
            None => RunState::Unknown,
        };
        out.push(JournalInfo {
            run_id: run_id.to_string(),
            journal_bytes: meta.len(),
            stderr_bytes,
            mtime_ms,
            state: state as i32,
            exit_code,
        });
    }
    out.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    Ok(out)
}
