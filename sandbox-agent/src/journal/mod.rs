//! `JournalService`: journaled runs and reads of their journals.
//!
//! Everything a read needs is on disk (see `shared::journal` for the files),
//! so an agent restarted on the same journal dir serves the runs of its
//! predecessor, running ones included: the supervisor ([`crate::shim`]) holds
//! the run's lock and writes the sentinel; the agent only starts it and reads.

mod stderr;

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
use shared::mask::{LineMasker, Masks};
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
use crate::isolation::Isolation;
use crate::request_dir::{self, RequestDir, Setup};
use crate::run_user::RunUser;
use crate::shim::lock_is_held;
use crate::vault::{self, Vault};
use stderr::Sidecar;

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

/// The agent's own executable, as supervisors and `{{sandhold-agent}}` use it.
pub fn shim_program() -> std::io::Result<PathBuf> {
    match SHIM_PROGRAM.get() {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe(),
    }
}

pub struct Journal {
    root: Root,
    journal_dir: PathBuf,
    run_user: Option<RunUser>,
    isolation: Isolation,
    vault: Vault,
}

impl Journal {
    pub fn new(ctx: &AgentContext) -> Self {
        Self {
            root: ctx.root.clone(),
            journal_dir: ctx.journal_dir.clone(),
            run_user: ctx.run_user.clone(),
            isolation: ctx.isolation.clone(),
            vault: ctx.vault.clone(),
        }
    }

    fn paths(&self, run_id: &RunId) -> JournalPaths {
        JournalPaths::new(&self.journal_dir, run_id)
    }

    /// The run's request dir, when it has one.
    fn requests(&self, run_id: &RunId) -> Option<RequestDir> {
        RequestDir::find(&self.journal_dir, run_id)
    }

    /// The masks of the secrets recorded for a run (`None`: it has none),
    /// or `SECRETS_MISSING` when this agent lacks one of their values:
    /// never serve a run's output unmasked.
    fn masks(&self, paths: &JournalPaths, run_id: &RunId) -> Result<Option<Masks>, Error> {
        let names = vault::read_names(&paths.secrets);
        if names.is_empty() {
            return Ok(None);
        }
        let masks = self.vault.masks(&names, &format!("reading the journal of run {run_id}"))?;
        Ok(Some(masks))
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

/// The last [`journal::STDERR_TAIL_BYTES`] of the stderr sidecar, masked:
/// read with a longest value's worth more in front, so a value cut by the
/// tail's start is masked too.
pub fn stderr_tail(path: &Path, masks: Option<&Masks>) -> Vec<u8> {
    let Ok(file) = std::fs::File::open(path) else { return Vec::new() };
    let Ok(len) = file.metadata().map(|m| m.len()) else { return Vec::new() };
    let extra = masks.map_or(0, |m| m.longest() as u64);
    let start = len.saturating_sub(journal::STDERR_TAIL_BYTES + extra);
    let mut buf = vec![0u8; (len - start) as usize];
    if file.read_exact_at(&mut buf, start).is_err() {
        return Vec::new();
    }
    let Some(masks) = masks else { return buf };
    let masked = masks.mask_bytes(&buf);
    let keep = masked.len().min(journal::STDERR_TAIL_BYTES as usize);
    masked[masked.len() - keep..].to_vec()
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
    // A process the command left behind may have written more than the
    // window after the sentinel: look for it from the start (the first
    // valid one is the only real one).
    if !alive
        && start > 0
        && let Some(code) = first_exit(&file, nonce)
    {
        return (RunState::Finished, Some(code));
    }
    if alive { (RunState::Running, None) } else { (RunState::Unknown, None) }
}

/// The exit code of the first valid sentinel in `file`, reading forward.
fn first_exit(file: &std::fs::File, nonce: &str) -> Option<i32> {
    let mut splitter = LineSplitter::new(0);
    let mut offset = 0;
    loop {
        let chunk = read_at(file, offset, PROBE_WINDOW).ok()?;
        if chunk.is_empty() {
            // A sentinel is written in one write and may lack its newline.
            return journal::parse_sentinel(splitter.pending(), nonce);
        }
        offset += chunk.len() as u64;
        if let Some(code) = splitter.push(&chunk).iter().find_map(|(l, _)| journal::parse_sentinel(l, nonce))
        {
            return Some(code);
        }
    }
}

type FollowStream = Pin<Box<dyn Stream<Item = Result<FollowResponse, Status>> + Send>>;

#[tonic::async_trait]
impl JournalService for Journal {
    async fn start_run(&self, req: Request<StartRunRequest>) -> Result<Response<StartRunResponse>, Status> {
        let mut req = req.into_inner();
        let run_id = parse_run_id(&req.run_id)?;
        let mut argv: Vec<String> = match req.command.take().and_then(|c| c.kind) {
            Some(CommandKind::Argv(a)) if !a.args.is_empty() && !a.args[0].is_empty() => a.args,
            Some(CommandKind::Shell(s)) if !s.is_empty() => vec!["/bin/sh".into(), "-c".into(), s],
            _ => return Err(Error::invalid_field("command", "an argv or a shell string is required").into()),
        };
        if argv[0] == shared::journal::AGENT_PROGRAM {
            // This agent's own binary (its `acp` mode), wherever it is.
            let exe = shim_program().map_err(|e| io_error("finding the agent's binary", e))?;
            argv[0] = exe.display().to_string();
        }
        crate::child::validate_env(&req.env)?;
        if req.sentinel_key.len() > crate::shim::MAX_KEY_LEN {
            return Err(Error::invalid_field("sentinel_key", "longer than 4096 bytes").into());
        }
        let requests = match &req.requests {
            Some(setup) => {
                if req.sentinel_key.is_empty() {
                    return Err(
                        Error::invalid_field("sentinel_key", "a run with requests needs a key").into()
                    );
                }
                let setup = Setup::from_proto(setup)?;
                let dir = RequestDir::choose(&self.journal_dir, self.run_user.as_ref(), &run_id);
                let exe = shim_program().map_err(|e| io_error("finding the agent's binary", e))?;
                if let Some(user) = &self.run_user
                    && !runnable_by(&exe, user)
                {
                    tracing::warn!(run_id = %run_id, exe = %exe.display(), "the run user cannot run the agent's binary");
                }
                let (exe, path) = (exe.display().to_string(), dir.path().display().to_string());
                for arg in &mut argv {
                    *arg = request_dir::substitute(arg, &exe, &path);
                }
                for value in req.env.values_mut() {
                    *value = request_dir::substitute(value, &exe, &path);
                }
                Some((dir, setup))
            }
            None => None,
        };
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
        // The run's output is masked with the secrets held now, by this
        // agent and any after it (which refuse to serve it without them).
        let names = self.vault.names();
        if !names.is_empty()
            && let Err(e) = vault::write_names(&paths.secrets, &names)
        {
            let _ = std::fs::remove_file(&paths.ndjson);
            return Err(e.into());
        }
        let _ = std::fs::remove_file(&paths.cap);
        if req.max_journal_bytes > 0
            && let Err(e) = std::fs::write(&paths.cap, req.max_journal_bytes.to_string())
        {
            let _ = std::fs::remove_file(&paths.ndjson);
            let _ = std::fs::remove_file(&paths.secrets);
            return Err(io_error("writing the journal cap", e).into());
        }
        if let Some((dir, setup)) = &requests
            && let Err(e) = dir.create(setup, self.run_user.as_ref(), &req.sentinel_key, &run_id)
        {
            let _ = dir.remove();
            for p in paths.all() {
                let _ = std::fs::remove_file(p);
            }
            return Err(io_error("making the run's request dir", e).into());
        }
        let requests = requests.map(|(dir, _)| dir);
        match start_supervisor(&paths, &run_id, &argv, &cwd, stdin_file, &req, self).await {
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
                if let Some(dir) = &requests {
                    let _ = dir.remove();
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
        let masks = self.masks(&paths, &run_id)?;
        let cap = journal::read_cap(&paths.cap);
        let requests = self.requests(&run_id);
        let stderr = if req.include_stderr {
            let size = std::fs::metadata(&paths.err).map_or(0, |m| m.len());
            if req.stderr_from_byte > size {
                return Err(Error::invalid_field(
                    "stderr_from_byte",
                    format!("{} is past the end of the stderr sidecar ({size} bytes)", req.stderr_from_byte),
                )
                .into());
            }
            Some(req.stderr_from_byte)
        } else {
            None
        };
        let key = req.sentinel_key;
        let read = FollowRead { from: req.from_byte, nonce, bound, masks, cap, key, requests, stderr };
        Ok(Response::new(Box::pin(follow_stream(file, paths, run_id, read))))
    }

    async fn read_journal(
        &self,
        req: Request<ReadJournalRequest>,
    ) -> Result<Response<ReadJournalResponse>, Status> {
        let req = req.into_inner();
        let run_id = parse_run_id(&req.run_id)?;
        let paths = self.paths(&run_id);
        let file = open_journal(&paths, &run_id)?;
        let max = match req.max_bytes {
            0 => DEFAULT_READ_BYTES,
            n => n.min(MAX_READ_BYTES),
        };
        let masks = self.masks(&paths, &run_id)?;
        let requests = self.requests(&run_id);
        let resp = tokio::task::spawn_blocking(move || {
            if let Some(dir) = &requests {
                record_requests(dir, &req.sentinel_key, &run_id, &paths.ndjson);
            }
            let key = &req.sentinel_key;
            bounded_read(&file, &paths, &run_id, req.from_byte, max, key, masks.as_ref())
        })
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
            for dir in RequestDir::candidates(&self.journal_dir, &id) {
                dir.remove().map_err(|e| io_error("deleting a request dir", e))?;
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
    journal: &Journal,
) -> Result<(u32, u32), Error> {
    let requests = journal.requests(run_id);
    let (journal_dir, run_user) = (&journal.journal_dir, journal.run_user.as_ref());
    let mut stdin_arg = stdin_file.map(|p| (p, false));
    if let Some(start_run_request::Stdin::StdinBytes(bytes)) = &req.stdin {
        std::fs::write(&paths.stdin, bytes).map_err(|e| io_error("writing stdin", e))?;
        stdin_arg = Some((paths.stdin.clone(), true));
    }
    // The previous owner of a deleted id may have left a sidecar behind.
    let _ = std::fs::remove_file(&paths.err);
    let _ = std::fs::remove_file(&paths.exit);
    let _ = std::fs::remove_file(&paths.full);

    let program = shim_program().map_err(|e| io_error("locating the agent binary", e))?;
    // Not `child::command`: that makes a process group, and a group leader
    // cannot start a session.
    let mut cmd = std::process::Command::new(&program);
    cmd.current_dir("/");
    // The shim stays the agent's user (it must write the sentinel where
    // the command cannot) and starts the command as the run user.
    if let Some(user) = run_user {
        user.apply_env(&mut cmd);
    }
    crate::child::scrub_env(&mut cmd, &req.env);
    cmd.arg("shim")
        .arg("--journal-dir")
        .arg(journal_dir)
        .arg("--run-id")
        .arg(run_id.as_str())
        .arg("--cwd")
        .arg(cwd);
    if let Some(user) = run_user {
        cmd.arg("--run-as").arg(user.ids());
    }
    if let Some(dir) = &requests {
        cmd.arg("--requests").arg(dir.path());
    }
    let isolation = run_isolation(journal, paths, cwd, requests.as_ref(), req)?;
    if isolation != Isolation::off() {
        let json = serde_json::to_string(&isolation).map_err(|e| Error::internal(e.to_string()))?;
        cmd.arg("--isolation").arg(json);
    }
    if req.max_journal_bytes > 0 {
        cmd.arg("--max-journal-bytes").arg(req.max_journal_bytes.to_string());
    }
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

fn exit_message(paths: &JournalPaths, code: i32, sentinel_offset: u64, masks: Option<&Masks>) -> RunExit {
    RunExit { exit_code: code, stderr_tail: stderr_tail(&paths.err, masks), sentinel_offset }
}

/// What one follow reads: from where, the sentinel's nonce, the bound on
/// the first byte, and the masks of the run's secrets.
struct FollowRead {
    from: u64,
    nonce: String,
    bound: Option<Duration>,
    masks: Option<Masks>,
    /// The run's journal byte cap: a line ending past it is the one the
    /// cap cut, closed by the supervisor, and is never served.
    cap: Option<u64>,
    /// The run's key: opens sealed lines and records requests.
    key: Vec<u8>,
    /// The run's request dir, recorded from at each wake-up.
    requests: Option<RequestDir>,
    /// Where to serve the stderr sidecar from, when it is asked for.
    stderr: Option<u64>,
}

/// The confinement of one run's command: the agent's, plus its request
/// dir (its MCP server asks there) and its journal files (a command may
/// reopen its own stdout and stderr), minus the directories its policy
/// denies writes to (relative to its working directory).
fn run_isolation(
    journal: &Journal,
    paths: &JournalPaths,
    cwd: &Path,
    requests: Option<&RequestDir>,
    req: &StartRunRequest,
) -> Result<Isolation, Error> {
    if journal.isolation == Isolation::off() {
        return Ok(Isolation::off());
    }
    let dirs: Vec<PathBuf> = requests.map(|d| d.path().to_path_buf()).into_iter().collect();
    let policy_json = req.requests.as_ref().map_or("", |r| r.policy_json.trim());
    let denied = match policy_json {
        "" => Vec::new(),
        text => shared::policy::Policy::from_json(text)
            .map_err(|e| Error::invalid_field("requests.policy_json", e.0))?
            .denied_dirs()
            .iter()
            .map(|dir| lexical(&cwd.join(dir)))
            .collect(),
    };
    Ok(journal.isolation.for_run(&dirs, &[paths.ndjson.clone(), paths.err.clone()], &denied))
}

/// `path` with `.` and `..` taken away without looking at the disk (a
/// denied dir need not exist yet).
fn lexical(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether `user` may execute `exe` (checked with its file system ids).
fn runnable_by(exe: &Path, user: &RunUser) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(exe.as_os_str().as_bytes()) else { return false };
    let Ok(_as_user) = crate::run_user::FsAs::new(Some(user)) else { return false };
    // SAFETY: a valid C string; AT_EACCESS checks with the fs ids set above.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::X_OK, libc::AT_EACCESS) == 0 }
}

/// One recording pass over a run's request dir (blocking). A wrong key
/// records nothing: what it sealed could not be opened.
pub fn record_requests(dir: &RequestDir, key: &[u8], run_id: &RunId, journal: &Path) -> bool {
    match dir.lock(key, run_id, journal).and_then(|l| l.sync(request_dir::now_ms())) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(run_id = %run_id, error = %e, "not recording requests");
            false
        }
    }
}

/// The record of a sealed line whose MAC holds under the run's key.
fn sealed_record<'a>(key: &[u8], run_id: &RunId, line: &'a [u8]) -> Option<&'a [u8]> {
    if key.is_empty() || !shared::requests::looks_sealed(line) {
        return None;
    }
    shared::requests::open(key, run_id, line)
}

/// A verified record as a line: masked like any line, whole.
fn sealed_line(record: &[u8], end_offset: u64, masks: Option<&Masks>) -> JournalLine {
    let data = masks.map_or_else(|| record.to_vec(), |m| m.mask_bytes(record));
    JournalLine { data, end_offset, sealed: true, stderr: false }
}

/// Lines out of a reader, masked when the run has secrets: what a raw
/// line completes (a masked line may be held back until the next one shows
/// it does not continue a value).
fn masked_lines(masker: Option<&mut LineMasker<'_>>, bytes: Vec<u8>, end_offset: u64) -> Vec<JournalLine> {
    match masker {
        None => vec![JournalLine { data: bytes, end_offset, sealed: false, stderr: false }],
        Some(m) => m
            .push(&bytes)
            .into_iter()
            .map(|(data, end_offset)| JournalLine { data, end_offset, sealed: false, stderr: false })
            .collect(),
    }
}

/// The lines a masker still holds at the end of the output.
fn flushed_lines(masker: Option<&mut LineMasker<'_>>) -> Vec<JournalLine> {
    masker.map_or_else(Vec::new, |m| {
        m.finish()
            .into_iter()
            .map(|(data, end_offset)| JournalLine { data, end_offset, sealed: false, stderr: false })
            .collect()
    })
}

fn follow_stream(
    file: std::fs::File,
    paths: JournalPaths,
    run_id: RunId,
    read: FollowRead,
) -> impl Stream<Item = Result<FollowResponse, Status>> + Send {
    async_stream::try_stream! {
        let FollowRead { from, nonce, bound, masks, cap, key, mut requests, stderr } = read;
        let mut masker = masks.as_ref().map(|m| LineMasker::new(m, from));
        let mut sidecar = stderr.map(|from| Sidecar::new(paths.err.clone(), from, masks.as_ref(), cap));
        // Woken by inotify; the periodic re-read covers filesystems where it
        // does not work and any missed wake-up.
        let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
        let watcher = {
            use notify::Watcher;
            notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
                let _ = wake_tx.try_send(());
            })
            .and_then(|mut w| w.watch(&paths.ndjson, notify::RecursiveMode::NonRecursive).map(|()| w))
            .map(|mut w| {
                // The sidecar exists once the supervisor started (else the
                // periodic re-read finds it).
                if stderr.is_some() {
                    use notify::Watcher;
                    let _ = w.watch(&paths.err, notify::RecursiveMode::NonRecursive);
                }
                // New asks wake the recording pass too.
                if let Some(dir) = &requests {
                    use notify::Watcher;
                    let _ = w.watch(&dir.path().join(request_dir::ASK_DIR), notify::RecursiveMode::NonRecursive);
                }
                w
            })
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
                let lines = splitter.push(&buf[..n]);
                let overlong = splitter.overlong();
                for (bytes, end_offset) in lines {
                    if overlong.is_some_and(|start| end_offset > start) {
                        break;
                    }
                    if let Some(code) = journal::parse_sentinel(&bytes, &nonce) {
                        batch.extend(flushed_lines(masker.as_mut()));
                        if !batch.is_empty() {
                            yield lines_message(std::mem::take(&mut batch));
                        }
                        // The command is done: the rest of its stderr comes
                        // before the exit (or the read's end at the cap).
                        if let Some(side) = sidecar.as_mut() {
                            let rest = side.finish().map_err(|e| io_error("reading the stderr sidecar", e))?;
                            if !rest.is_empty() {
                                yield lines_message(rest);
                            }
                        }
                        let start = end_offset - bytes.len() as u64 - 1;
                        if let Some(e) = journal_full(&paths, &run_id, start) {
                            Err(Status::from(e))?;
                        }
                        tracing::debug!(run_id = %run_id, code, "follow reached the exit sentinel");
                        let exit = exit_message(&paths, code, start, masks.as_ref());
                        yield FollowResponse { event: Some(follow_response::Event::Exit(exit)) };
                        return;
                    }
                    if past_cap(cap, end_offset) {
                        continue;
                    }
                    if let Some(record) = sealed_record(&key, &run_id, &bytes) {
                        // Whole and in order: what the masker holds goes first.
                        batch.extend(flushed_lines(masker.as_mut()));
                        let line = sealed_line(record, end_offset, masks.as_ref());
                        batch_bytes += line.data.len() + 16;
                        batch.push(line);
                        masker = masks.as_ref().map(|m| LineMasker::new(m, end_offset));
                        continue;
                    }
                    for line in masked_lines(masker.as_mut(), bytes, end_offset) {
                        batch_bytes += line.data.len() + 16;
                        batch.push(line);
                    }
                    if batch_bytes >= BATCH_BYTES {
                        yield lines_message(std::mem::take(&mut batch));
                        batch_bytes = 0;
                    }
                }
                if overlong.is_some() {
                    batch.extend(flushed_lines(masker.as_mut()));
                }
                if !batch.is_empty() {
                    yield lines_message(batch);
                }
                if let Some(start) = overlong {
                    Err(Status::from(line_too_long(&run_id, start)))?;
                }
            }
            // Each pass reads the journal, then the stderr sidecar: lines are
            // served in the order the agent read them, which approximates
            // the order the command wrote them (two files, no common clock).
            if let Some(side) = sidecar.as_mut() {
                let lines = side.read().map_err(|e| io_error("reading the stderr sidecar", e))?;
                if !lines.is_empty() {
                    got_first = true;
                    yield lines_message(lines);
                }
            }
            if n > 0 {
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
            if let Some(dir) = requests.clone() {
                let (key, run_id, journal) = (key.clone(), run_id.clone(), paths.ndjson.clone());
                let ok = tokio::task::spawn_blocking(move || record_requests(&dir, &key, &run_id, &journal))
                    .await
                    .unwrap_or(false);
                if !ok {
                    requests = None;
                }
            }
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

/// Whether a line ending at `end_offset` ends past the run's cap.
fn past_cap(cap: Option<u64>, end_offset: u64) -> bool {
    cap.is_some_and(|cap| end_offset > cap)
}

/// `JOURNAL_FULL` when the run's supervisor stopped it at its byte cap
/// (it wrote `<run_id>.full` before the sentinel at `sentinel_offset`).
fn journal_full(paths: &JournalPaths, run_id: &RunId, sentinel_offset: u64) -> Option<Error> {
    let text = std::fs::read_to_string(&paths.full).ok()?;
    let (stream, cap) = crate::shim::parse_full_marker(&text).unwrap_or(("stdout".into(), 0));
    let file = if stream == "stderr" { "stderr" } else { "journal (stdout)" };
    Some(
        Error::new(
            ErrorCode::JournalFull,
            format!(
                "the {file} of run {run_id} reached its cap of {cap} bytes (max_journal_bytes): the command \
                 was stopped; its output up to byte {sentinel_offset} is delivered"
            ),
        )
        .with_meta("max", cap.to_string())
        .with_meta("stream", stream)
        .with_meta("offset", sentinel_offset.to_string()),
    )
}

/// The journal of `run_id` has a line longer than the agent serves,
/// starting at byte `start`.
fn line_too_long(run_id: &RunId, start: u64) -> Error {
    Error::new(
        ErrorCode::LineTooLong,
        format!(
            "the journal of run {run_id} has a line longer than {} bytes at byte {start}: the command printed \
             more than that without a newline",
            journal::MAX_LINE
        ),
    )
    .with_meta("offset", start.to_string())
}

fn lines_message(lines: Vec<JournalLine>) -> FollowResponse {
    FollowResponse { event: Some(follow_response::Event::Lines(JournalLines { lines })) }
}

fn bounded_read(
    file: &std::fs::File,
    paths: &JournalPaths,
    run_id: &RunId,
    from: u64,
    max: u64,
    key: &[u8],
    masks: Option<&Masks>,
) -> Result<ReadJournalResponse, Error> {
    let nonce = &journal::nonce(key, run_id);
    let size = file.metadata().map_err(|e| io_error("reading the journal", e))?.len();
    if from > size {
        return Err(Error::invalid_field(
            "from_byte",
            format!("{from} is past the end of the journal ({size} bytes)"),
        ));
    }
    let mut data = read_at(file, from, max).map_err(|e| io_error("reading the journal", e))?;
    // A first line longer than max_bytes is returned whole, or a reader
    // could never get past it; one longer than MAX_LINE is not served.
    if !data.contains(&b'\n') {
        let mut offset = from + data.len() as u64;
        // Checked before the end of the file is looked at: a line still
        // being written that is already past the maximum fails now, read
        // to the end in one piece or not.
        while !data.contains(&b'\n') {
            if data.len() > journal::MAX_LINE {
                return Err(line_too_long(run_id, from));
            }
            if offset >= size {
                break;
            }
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
    let mut masker = masks.map(|m| LineMasker::new(m, from));
    let cap = journal::read_cap(&paths.cap);
    let mut resp = ReadJournalResponse { next_offset: from, journal_size: size, ..Default::default() };
    let mut base = from;
    // With masks, lines a value may continue into are held back; read on
    // (a bounded amount) rather than answer nothing when more is there.
    let mut budget = shared::mask::MAX_SECRET_LEN as u64 * 2;
    loop {
        let (lines, consumed) = journal::split_lines(&data, base);
        for line in lines {
            let start = line.end_offset - line.bytes.len() as u64 - 1;
            if line.bytes.len() > journal::MAX_LINE {
                // Served up to it; the read that starts there fails.
                resp.lines.extend(flushed_lines(masker.as_mut()));
                if resp.lines.is_empty() {
                    return Err(line_too_long(run_id, start));
                }
                resp.next_offset = start;
                return Ok(resp);
            }
            if let Some(code) = journal::parse_sentinel(line.bytes, nonce) {
                resp.lines.extend(flushed_lines(masker.as_mut()));
                if let Some(e) = journal_full(paths, run_id, start) {
                    // Served up to it; the read that starts there fails.
                    if resp.lines.is_empty() {
                        return Err(e);
                    }
                    resp.next_offset = start;
                    return Ok(resp);
                }
                resp.exit = Some(exit_message(paths, code, start, masks));
                resp.next_offset = line.end_offset;
                return Ok(resp);
            }
            if past_cap(cap, line.end_offset) {
                continue;
            }
            if let Some(record) = sealed_record(key, run_id, line.bytes) {
                resp.lines.extend(flushed_lines(masker.as_mut()));
                resp.lines.push(sealed_line(record, line.end_offset, masks));
                resp.next_offset = line.end_offset;
                masker = masks.map(|m| LineMasker::new(m, line.end_offset));
                continue;
            }
            for l in masked_lines(masker.as_mut(), line.bytes.to_vec(), line.end_offset) {
                resp.next_offset = l.end_offset;
                resp.lines.push(l);
            }
        }
        let read_end = base + data.len() as u64;
        if !resp.lines.is_empty() || masker.is_none() || read_end >= size || budget == 0 {
            return Ok(resp);
        }
        let more =
            read_at(file, read_end, max.min(budget)).map_err(|e| io_error("reading the journal", e))?;
        if more.is_empty() {
            return Ok(resp);
        }
        budget = budget.saturating_sub(more.len() as u64);
        data.drain(..consumed);
        data.extend_from_slice(&more);
        base += consumed as u64;
    }
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
