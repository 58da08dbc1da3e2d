//! The run supervisor: `sandhold-agent shim`, started by `StartRun` in its
//! own session so that nothing that happens to the agent daemon (kill -9
//! included) reaches it or the command.
//!
//! Protocol with the agent, over the shim's stdio:
//! - stdin: the sentinel key (raw bytes, at most [`MAX_KEY_LEN`]) until EOF.
//!   Read into memory, turned into the nonce at once, then stdin is replaced
//!   by `/dev/null`. The key is never in argv, env or a file, and the process
//!   is made non-dumpable first, so the command (same uid) cannot read it
//!   through `/proc/<shim>/mem` or ptrace.
//! - stdout: one status line, `ok <command pid>` or `err <message>`, then it
//!   is replaced by `/dev/null` so that an agent that goes away can never
//!   make a later write fail.
//!
//! The command's stdout and stderr are the journal files themselves (opened
//! `O_APPEND`), not pipes through the shim: if the shim dies too, the command
//! keeps writing and loses nothing. The shim only waits and appends the
//! sentinel line. It holds an exclusive `flock` on `<run_id>.lock` for its
//! whole life, which is how any agent (a restarted one included) tells a
//! live supervisor from a dead one.
//!
//! The run's byte cap (`--max-journal-bytes`) holds with nobody watching:
//! the command starts with `RLIMIT_FSIZE` at the cap (and `SIGXFSZ`
//! ignored), so the kernel refuses its writes past the cap on the journal
//! and the stderr sidecar (and on any other file it writes), whether or not
//! a control plane, the agent or even this shim is alive. The shim checks
//! both files' sizes while it waits: when one reaches the cap it kills the
//! command's process group, writes `<run_id>.full`, then the sentinel.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};

use anyhow::Context;
use shared::ids::RunId;
use shared::journal::{self, JournalPaths};

/// Longest accepted sentinel key.
pub const MAX_KEY_LEN: usize = 4096;

/// Arguments of the hidden `shim` subcommand (built by `StartRun`).
#[derive(Debug, clap::Args)]
pub struct ShimArgs {
    #[arg(long)]
    pub journal_dir: PathBuf,
    #[arg(long)]
    pub run_id: String,
    /// Working directory of the command (already confined by the agent).
    #[arg(long)]
    pub cwd: PathBuf,
    /// File to use as the command's stdin; `/dev/null` when absent.
    #[arg(long)]
    pub stdin_file: Option<PathBuf>,
    /// Unlink `stdin_file` once the command has it open (it is the run's
    /// `.in` file in the journal dir).
    #[arg(long)]
    pub remove_stdin_file: bool,
    /// Byte cap of the journal and of the stderr sidecar, each; 0: none.
    #[arg(long, default_value_t = 0)]
    pub max_journal_bytes: u64,
    /// `uid:gid` to run the command as (the run user); the shim itself
    /// keeps its user, so the command cannot reach it or the journal dir.
    #[arg(long, value_parser = parse_ids)]
    pub run_as: Option<(u32, u32)>,
    /// The run's request dir: before the sentinel, the shim records what is
    /// left there and closes it (so it keeps the key until then).
    #[arg(long)]
    pub requests: Option<PathBuf>,
    /// How the command is confined (JSON of [`crate::isolation::Isolation`]);
    /// absent: not at all.
    #[arg(long, value_parser = parse_isolation)]
    pub isolation: Option<crate::isolation::Isolation>,
    /// The command's argv.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

fn parse_ids(s: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = s.split_once(':').ok_or("expected UID:GID")?;
    Ok((uid.parse().map_err(|_| "bad uid")?, gid.parse().map_err(|_| "bad gid")?))
}

fn parse_isolation(s: &str) -> Result<crate::isolation::Isolation, String> {
    serde_json::from_str(s).map_err(|e| e.to_string())
}

/// Exit code recorded for a command killed by `signal` (the shell's
/// convention).
pub fn signal_exit_code(signal: i32) -> i32 {
    128 + signal
}

/// Acquire an exclusive lock on `file` without blocking.
pub fn try_lock_exclusive(file: &File) -> std::io::Result<()> {
    // SAFETY: flock on a valid open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a live process holds the lock at `path` (a missing file: no).
pub fn lock_is_held(path: &std::path::Path) -> bool {
    let Ok(file) = File::open(path) else { return false };
    // SAFETY: flock on a valid open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        false
    } else {
        std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
    }
}

/// How often the shim looks at the sizes of a capped run's files.
const CAP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

struct Started {
    child: std::process::Child,
    paths: JournalPaths,
    /// The cap and handles on the two files it bounds (0: no cap).
    cap: u64,
    watched: [File; 2],
    nonce: String,
    /// The run's id and key, kept only for a run with a request dir.
    requests: Option<(crate::request_dir::RequestDir, RunId, Vec<u8>)>,
    // Held until exit: the lock is released by the kernel when we die.
    _lock: File,
}

pub fn main(args: ShimArgs) -> ExitCode {
    // Before the key is in memory: no core dumps, no ptrace or /proc/<pid>/mem
    // access by processes of the same uid (the command among them).
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let mut status = std::io::stdout();
    let started = match start(&args) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(status, "err {}", format!("{e:#}").replace('\n', " "));
            let _ = status.flush();
            return ExitCode::FAILURE;
        }
    };
    let _ = writeln!(status, "ok {}", started.child.id());
    let _ = status.flush();
    detach_stdio();
    match finish(started) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

fn read_key() -> anyhow::Result<Vec<u8>> {
    let mut key = Vec::new();
    std::io::stdin()
        .take(MAX_KEY_LEN as u64 + 1)
        .read_to_end(&mut key)
        .context("reading the sentinel key")?;
    anyhow::ensure!(key.len() <= MAX_KEY_LEN, "sentinel key longer than {MAX_KEY_LEN} bytes");
    Ok(key)
}

fn start(args: &ShimArgs) -> anyhow::Result<Started> {
    let run_id = RunId::parse(&args.run_id).context("run id")?;
    let mut key = read_key()?;
    let nonce = journal::nonce(&key, &run_id);
    let requests = match &args.requests {
        Some(dir) => {
            Some((crate::request_dir::RequestDir::new(dir), run_id.clone(), std::mem::take(&mut key)))
        }
        None => None,
    };
    key.fill(0);
    drop(key);

    let paths = JournalPaths::new(&args.journal_dir, &run_id);
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths.lock)
        .with_context(|| format!("opening {}", paths.lock.display()))?;
    try_lock_exclusive(&lock).context("another supervisor holds this run")?;
    // The agent created the journal (exclusively); never create it here, so
    // a shim can never start a second life for an old run.
    let stdout = OpenOptions::new()
        .append(true)
        .open(&paths.ndjson)
        .with_context(|| format!("opening {}", paths.ndjson.display()))?;
    let stderr = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&paths.err)
        .with_context(|| format!("opening {}", paths.err.display()))?;
    let stdin = match &args.stdin_file {
        Some(path) => {
            // A file of the sandbox is opened as the run user: the command
            // must not get what only the shim could read (a link swapped in
            // after the agent's check).
            let as_user = match args.remove_stdin_file {
                false => args.run_as.map(|(uid, gid)| crate::run_user::FsAs::ids(uid, gid)).transpose()?,
                true => None,
            };
            let f = File::open(path).with_context(|| format!("opening stdin {}", path.display()))?;
            drop(as_user);
            if args.remove_stdin_file {
                let _ = std::fs::remove_file(path);
            }
            Stdio::from(f)
        }
        None => Stdio::null(),
    };
    let (program, rest) = args.command.split_first().context("empty command")?;
    let mut command = std::process::Command::new(program);
    if let Some((uid, gid)) = args.run_as {
        // std drops the supplementary groups too (setgroups(0) as root).
        command.uid(uid).gid(gid);
    }
    let cap = args.max_journal_bytes;
    if cap > 0 {
        // SAFETY: the closure runs between fork and exec and calls only
        // setrlimit and signal, which are async-signal-safe; it allocates
        // nothing and takes no locks.
        unsafe {
            command.pre_exec(move || limit_file_size(cap));
        }
    }
    if let Some(isolation) = &args.isolation {
        // After the journal files exist: the command may reopen them.
        isolation.apply(&mut command).context("confining the command")?;
    }
    let watched = [
        stdout.try_clone().context("duplicating the journal descriptor")?,
        stderr.try_clone().context("duplicating the stderr descriptor")?,
    ];
    let child = command
        .args(rest)
        .current_dir(&args.cwd)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        // Its own group, so a cancel (killpg of the command's pid) does not
        // take the shim with it: the shim must survive to write the sentinel.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {program:?}"))?;
    Ok(Started { child, paths, cap, watched, nonce, requests, _lock: lock })
}

/// In the command, before exec: no file it writes may grow past `cap`
/// bytes, and a write past it fails with `EFBIG` instead of killing it
/// with `SIGXFSZ` (and a core dump in its working directory): the shim
/// does the stopping.
fn limit_file_size(cap: u64) -> std::io::Result<()> {
    let limit = libc::rlimit { rlim_cur: cap as libc::rlim_t, rlim_max: cap as libc::rlim_t };
    // SAFETY: setrlimit reads the struct we pass; signal sets a disposition.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    Ok(())
}

/// Which of a run's files reached the cap: `stdout` (the journal) or
/// `stderr` (the sidecar).
fn over_cap(cap: u64, watched: &[File; 2]) -> Option<&'static str> {
    if cap == 0 {
        return None;
    }
    let len = |f: &File| f.metadata().map(|m| m.len()).unwrap_or(0);
    if len(&watched[0]) >= cap {
        Some("stdout")
    } else if len(&watched[1]) >= cap {
        Some("stderr")
    } else {
        None
    }
}

/// The body of `<run_id>.full`: which stream reached the cap, and the cap.
pub fn full_marker(stream: &str, cap: u64) -> String {
    format!("{stream} {cap}\n")
}

/// Parse `<run_id>.full`: `(stream, cap)`.
pub fn parse_full_marker(text: &str) -> Option<(String, u64)> {
    let (stream, cap) = text.trim().split_once(' ')?;
    Some((stream.to_string(), cap.parse().ok()?))
}

/// Point stdin and stdout at /dev/null: the agent's pipes may be gone.
fn detach_stdio() {
    if let Ok(null) = OpenOptions::new().read(true).write(true).open("/dev/null") {
        // SAFETY: dup2 onto the standard descriptors of this process.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}

/// Wait for the command, stopping its group when a file reaches the cap.
/// Returns its exit status and the stream that reached the cap, if one did.
/// The wait is on a thread of its own, so an exit is seen at once and the
/// sizes are looked at between.
fn wait_capped(
    child: std::process::Child,
    cap: u64,
    watched: &[File; 2],
) -> anyhow::Result<(std::process::ExitStatus, Option<&'static str>)> {
    use std::sync::mpsc::RecvTimeoutError;
    let pgid = child.id();
    let mut child = child;
    if cap == 0 {
        return Ok((child.wait().context("waiting for the command")?, None));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let mut full = None;
    loop {
        match rx.recv_timeout(CAP_POLL) {
            Ok(status) => {
                let status = status.context("waiting for the command")?;
                // It may have stopped at the cap itself (a write failing
                // with EFBIG): what it left in its group goes too.
                let full = full.or_else(|| over_cap(cap, watched));
                if full.is_some() {
                    crate::child::kill_group(pgid, nix::sys::signal::Signal::SIGKILL);
                }
                return Ok((status, full));
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Some(stream) = over_cap(cap, watched) {
                    full.get_or_insert(stream);
                    crate::child::kill_group(pgid, nix::sys::signal::Signal::SIGKILL);
                }
            }
            Err(RecvTimeoutError::Disconnected) => anyhow::bail!("the waiting thread is gone"),
        }
    }
}

fn finish(started: Started) -> anyhow::Result<()> {
    let (status, full) = wait_capped(started.child, started.cap, &started.watched)?;
    let code = status.code().unwrap_or_else(|| signal_exit_code(status.signal().unwrap_or(0)));
    if let Some(stream) = full {
        // Before the sentinel: a reader that sees the sentinel sees this.
        let tmp = started.paths.full.with_extension("full.tmp");
        std::fs::write(&tmp, full_marker(stream, started.cap))?;
        std::fs::rename(&tmp, &started.paths.full)?;
    }
    if let Some((dir, run_id, key)) = &started.requests {
        // Nothing is recorded after the sentinel: the last pass is this one.
        let closed =
            dir.lock(key, run_id, &started.paths.ndjson).and_then(|l| l.close(crate::request_dir::now_ms()));
        if let Err(e) = closed {
            tracing::warn!(run_id = %run_id, error = %e, "cannot close the run's requests");
        }
    }
    append_sentinel(&started.paths, code, &started.nonce)?;
    // The hint for listings without a key; written after the sentinel, so a
    // present hint implies a written sentinel.
    let tmp = started.paths.exit.with_extension("exit.tmp");
    std::fs::write(&tmp, code.to_string())?;
    std::fs::rename(&tmp, &started.paths.exit)?;
    Ok(())
}

/// Append the sentinel in a single write, after a newline when the command's
/// last line lacks one (the sentinel must be a line of its own).
pub fn append_sentinel(paths: &JournalPaths, code: i32, nonce: &str) -> anyhow::Result<()> {
    let file = OpenOptions::new().append(true).read(true).open(&paths.ndjson)?;
    let len = file.metadata()?.len();
    let mut line = Vec::with_capacity(64);
    if len > 0 {
        let mut last = [0u8; 1];
        file.read_exact_at(&mut last, len - 1)?;
        if last[0] != b'\n' {
            line.push(b'\n');
        }
    }
    line.extend_from_slice(journal::sentinel_line(code, nonce).as_bytes());
    (&file).write_all(&line)?;
    file.sync_data()?;
    Ok(())
}
