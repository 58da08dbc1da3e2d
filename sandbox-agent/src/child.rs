//! How the agent starts every child process: its own process group (so a
//! timeout or a dropped stream kills the whole tree), and an environment
//! scrubbed of the agent's own configuration (the token file path and any
//! other `SANDHOLD_AGENT_*` variable never reach a child), and the run
//! user's confinement ([`Isolation`]).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use nix::sys::signal::Signal;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1 as proto;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::isolation::Isolation;
use crate::run_user::RunUser;
use crate::spawner::{self, Kind, Plan, Spawner};

/// Prefix of the agent's own environment variables; all are removed from
/// children.
pub const AGENT_ENV_PREFIX: &str = "SANDHOLD_AGENT_";

/// Whether `key` is one of the agent's own variables.
fn is_agent_var(key: &OsStr) -> bool {
    key.to_string_lossy().starts_with(AGENT_ENV_PREFIX)
}

/// Remove the agent's own variables from `cmd`'s inherited environment, then
/// apply `env`. Call for every child the agent starts.
pub fn scrub_env(cmd: &mut std::process::Command, env: &HashMap<String, String>) {
    for (key, _) in std::env::vars_os() {
        if is_agent_var(&key) {
            cmd.env_remove(&key);
        }
    }
    for (k, v) in env {
        if !is_agent_var(k.as_ref()) {
            cmd.env(k, v);
        }
    }
}

/// The whole environment [`command`] gives a child: the agent's own minus
/// its variables, the run user's HOME, USER and LOGNAME, then `env`.
fn environment(env: &HashMap<String, String>, user: Option<&RunUser>) -> BTreeMap<OsString, OsString> {
    let mut all: BTreeMap<OsString, OsString> =
        std::env::vars_os().filter(|(k, _)| !is_agent_var(k)).collect();
    if let Some(user) = user {
        all.extend(user.env().into_iter().map(|(k, v)| (OsString::from(k), v.to_os_string())));
    }
    all.extend(
        env.iter()
            .filter(|(k, _)| !is_agent_var(k.as_ref()))
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    all
}

/// What a child is and how it runs: the inputs of [`command`] and
/// [`start`].
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    pub program: &'a str,
    pub args: &'a [String],
    pub cwd: &'a Path,
    pub env: &'a HashMap<String, String>,
    pub user: Option<&'a RunUser>,
    pub isolation: &'a Isolation,
}

/// How [`start`] starts a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From a spawner thread (`crate::spawner`), without copying the agent;
    /// by `fork` where there is none.
    Spawner,
    /// By `std::process::Command` (`fork`, the confinement in its hook).
    Fork,
}

/// A started child's stdin.
pub type Stdin = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// Start `launch` as [`command`] describes it, with stdout and stderr read
/// by the returned [`RunningChild`] and stdin a pipe (returned) when
/// `piped_stdin`, else `/dev/null`.
pub fn start(
    launch: &Launch<'_>,
    piped_stdin: bool,
    kill_on_drop: bool,
    how: Start,
) -> std::io::Result<(RunningChild, Option<Stdin>)> {
    if how == Start::Spawner
        && let Some(spawner) = Spawner::get(Kind::of(launch.isolation))
    {
        return start_spawned(spawner, launch, piped_stdin, kill_on_drop);
    }
    let mut cmd =
        command(launch.program, launch.args, launch.cwd, launch.env, launch.user, launch.isolation)?;
    let stdin = if piped_stdin { std::process::Stdio::piped() } else { std::process::Stdio::null() };
    cmd.stdin(stdin).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = tokio::process::Command::from(cmd).spawn()?;
    let stdin = child.stdin.take().map(|s| Box::new(s) as Stdin);
    Ok((RunningChild::new(child, kill_on_drop)?, stdin))
}

/// [`start`] through `spawner`: everything the child needs is prepared
/// here, the child only makes system calls.
fn start_spawned(
    spawner: &Spawner,
    launch: &Launch<'_>,
    piped_stdin: bool,
    kill_on_drop: bool,
) -> std::io::Result<(RunningChild, Option<Stdin>)> {
    let c_string = |bytes: Vec<u8>| {
        CString::new(bytes).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte"))
    };
    let env = environment(launch.env, launch.user);
    let candidates = search_path(launch.program, env.get(OsStr::new("PATH")).map(OsString::as_os_str))
        .into_iter()
        .map(c_string)
        .collect::<Result<_, _>>()?;
    let argv = std::iter::once(launch.program)
        .chain(launch.args.iter().map(String::as_str))
        .map(|a| c_string(a.as_bytes().to_vec()))
        .collect::<Result<_, _>>()?;
    let envp = env
        .into_iter()
        .map(|(k, v)| {
            let mut entry = k.into_vec();
            entry.push(b'=');
            entry.extend(v.into_vec());
            c_string(entry)
        })
        .collect::<Result<_, _>>()?;
    let (stdin_read, stdin_write) = match piped_stdin {
        true => {
            let (read, write) = pipe()?;
            (read, Some(write))
        }
        false => (OwnedFd::from(std::fs::File::open("/dev/null")?), None),
    };
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let stdio = [above_stdio(stdin_read)?, above_stdio(stdout_write)?, above_stdio(stderr_write)?];
    let plan = Plan {
        candidates,
        argv,
        envp,
        cwd: c_string(launch.cwd.as_os_str().as_bytes().to_vec())?,
        ids: launch.user.map(|u| (u.uid, u.gid)),
        ruleset: launch.isolation.ruleset()?,
        stdio: [stdio[0].as_raw_fd(), stdio[1].as_raw_fd(), stdio[2].as_raw_fd()],
        process_group: true,
    };
    let child = spawner.spawn(&plan)?;
    // The child's ends are its own now.
    drop((plan, stdio));
    let stdin = match stdin_write {
        Some(fd) => Some(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(fd)?) as Stdin),
        None => None,
    };
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_read)?;
    let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_read)?;
    Ok((RunningChild::spawned(child, stdout, stderr, kill_on_drop), stdin))
}

/// The paths `execvp` would try for `program` with `path` as `PATH`
/// (glibc's default without one).
fn search_path(program: &str, path: Option<&OsStr>) -> Vec<Vec<u8>> {
    if program.contains('/') {
        return vec![program.as_bytes().to_vec()];
    }
    let path = path.map(OsStr::as_bytes).unwrap_or(b"/bin:/usr/bin");
    path.split(|b| *b == b':')
        .map(|dir| match dir {
            // An empty entry is the working directory.
            b"" => program.as_bytes().to_vec(),
            dir => [dir, b"/", program.as_bytes()].concat(),
        })
        .collect()
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

/// `fd`, or a duplicate above 2 when it is one of 0..2 (the agent started
/// with some of its stdio closed): the child moves it onto 0..2.
fn above_stdio(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    match fd.as_raw_fd() {
        0..=2 => fd_above_stdio(&fd),
        _ => Ok(fd),
    }
}

/// A `std::process::Command` for `argv` (or `/bin/sh -c shell`) in `cwd`,
/// as `user` when there is one (the run user; else as the agent), with a
/// scrubbed environment, in a new process group, confined by `isolation`.
/// Convert with `tokio::process::Command::from` for async use.
pub fn command(
    program: &str,
    args: &[String],
    cwd: &Path,
    env: &HashMap<String, String>,
    user: Option<&RunUser>,
    isolation: &Isolation,
) -> std::io::Result<std::process::Command> {
    use std::os::unix::process::CommandExt;
    let mut cmd = command_in(program, args, cwd, env, user, isolation)?;
    cmd.process_group(0);
    Ok(cmd)
}

/// [`command`] without its process group: for a caller that gives the
/// child a session of its own instead ([`terminal_command`]).
fn command_in(
    program: &str,
    args: &[String],
    cwd: &Path,
    env: &HashMap<String, String>,
    user: Option<&RunUser>,
    isolation: &Isolation,
) -> std::io::Result<std::process::Command> {
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).current_dir(cwd);
    if let Some(user) = user {
        user.apply(&mut cmd);
    }
    scrub_env(&mut cmd, env);
    isolation.apply(&mut cmd)?;
    Ok(cmd)
}

/// The agent's side of a pseudo-terminal: what a terminal's user types is
/// written to it, what the programs on the terminal print is read from
/// it, and its size is set on it. The other side ([`Pty::open`]'s second
/// result) becomes a child's stdin, stdout, stderr and controlling
/// terminal through [`terminal_command`].
#[derive(Debug)]
pub struct Pty {
    master: OwnedFd,
}

impl Pty {
    /// A new terminal of `rows` x `cols`, and its other side for the child.
    pub fn open(rows: u16, cols: u16) -> std::io::Result<(Self, OwnedFd)> {
        let size = nix::pty::Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
        let pair = nix::pty::openpty(Some(&size), None).map_err(std::io::Error::from)?;
        // openpty's descriptors are inherited by default: no other child
        // may get either.
        for fd in [&pair.master, &pair.slave] {
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
                .map_err(std::io::Error::from)?;
        }
        Ok((Self { master: pair.master }, pair.slave))
    }

    /// Set the terminal's size; the kernel tells its foreground processes
    /// (SIGWINCH).
    pub fn resize(&self, rows: u16, cols: u16) -> std::io::Result<()> {
        let size = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which
        // outlives the call; the descriptor is ours.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
    }

    /// A handle on the terminal for reading or writing. Reads end with an
    /// error (EIO) once every process on the terminal has closed it.
    pub fn handle(&self) -> std::io::Result<tokio::fs::File> {
        Ok(tokio::fs::File::from_std(std::fs::File::from(self.master.try_clone()?)))
    }
}

/// As [`command`], but on the terminal whose other side is `terminal`: the
/// child leads a new session (so its pid is also its process group, as
/// with [`command`]) whose controlling terminal it is, and uses it as its
/// stdin, stdout and stderr.
pub fn terminal_command(
    program: &str,
    args: &[String],
    cwd: &Path,
    env: &HashMap<String, String>,
    user: Option<&RunUser>,
    isolation: &Isolation,
    terminal: OwnedFd,
) -> std::io::Result<std::process::Command> {
    use std::os::unix::process::CommandExt;
    let mut cmd = command_in(program, args, cwd, env, user, isolation)?;
    cmd.stdin(terminal.try_clone()?).stdout(terminal.try_clone()?).stderr(terminal);
    // SAFETY: between fork and exec, only setsid and ioctl, both
    // async-signal-safe; nothing is allocated or locked.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Stdin is the terminal by now (std sets up stdio first).
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// Kill a whole process group (ignores a group that is already gone).
pub fn kill_group(pgid: u32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid as i32), signal);
}

/// As [`command`], but the child's environment is exactly `env` (minus the
/// agent's own variables) instead of the agent's environment plus `env`: for
/// children that must reproduce an environment captured elsewhere (a shell
/// session's exported variables).
pub fn command_with_exact_env(
    program: &str,
    args: &[String],
    cwd: &Path,
    env: &HashMap<String, String>,
    user: Option<&RunUser>,
    isolation: &Isolation,
) -> std::io::Result<std::process::Command> {
    let mut cmd = command(program, args, cwd, &HashMap::new(), user, isolation)?;
    cmd.env_clear();
    for (k, v) in env {
        if !k.starts_with(AGENT_ENV_PREFIX) {
            cmd.env(k, v);
        }
    }
    Ok(cmd)
}

/// Refuse environment entries `std::process::Command` cannot pass on (it
/// would fail the spawn with a less helpful error).
pub fn validate_env(env: &HashMap<String, String>) -> Result<(), Error> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(Error::invalid_field("env", format!("invalid variable name {k:?}")));
        }
        if v.contains('\0') {
            return Err(Error::invalid_field("env", format!("value of {k} contains a NUL byte")));
        }
    }
    Ok(())
}

/// Whether `signo` is a signal number the kernel accepts (1..=SIGRTMAX).
pub fn is_valid_signal(signo: i32) -> bool {
    (1..=libc::SIGRTMAX()).contains(&signo)
}

/// Send signal number `signo` (any number, real-time ones included, which
/// `nix::sys::signal::Signal` cannot name) to process group `pgid`.
pub fn signal_group(pgid: u32, signo: i32) -> std::io::Result<()> {
    let pgid = i32::try_from(pgid)
        .ok()
        .filter(|p| *p > 1)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: killpg takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::killpg(pgid, signo) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Live (non-zombie) members of process group `pgid` other than `except`,
/// read from `/proc`.
pub fn group_members(pgid: u32, except: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut members = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == except {
            continue;
        }
        if let Some(stat) = ProcStat::read(pid)
            && stat.pgrp == pgid
            && stat.state != 'Z'
        {
            members.push(pid);
        }
    }
    members
}

/// Scans of a process group `kill_group_except` makes at most, and the
/// pause after each scan that found someone to kill.
const KILL_SCANS: usize = 50;
const KILL_RESCAN_DELAY: Duration = Duration::from_millis(5);

/// SIGKILL every member of process group `pgid` except `keep` (a shell that
/// leads the group and must survive its command). Repeats until a scan finds
/// nobody, so that children forked during a scan are caught by the next one.
pub async fn kill_group_except(pgid: u32, keep: u32) {
    use backon::{ConstantBuilder, Retryable};
    let scan_and_kill = || async {
        let members = group_members(pgid, keep);
        if members.is_empty() {
            return Ok(());
        }
        for pid in members {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        Err(())
    };
    let rescans = ConstantBuilder::default().with_delay(KILL_RESCAN_DELAY).with_max_times(KILL_SCANS - 1);
    if scan_and_kill.retry(rescans).await.is_err() {
        // The last scan killed someone too: give the kernel the same pause.
        tokio::time::sleep(KILL_RESCAN_DELAY).await;
    }
}

/// The fields of `/proc/<pid>/stat` the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub state: char,
    pub ppid: u32,
    pub pgrp: u32,
}

impl ProcStat {
    pub fn read(pid: u32) -> Option<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name is in parentheses and may itself contain spaces
        // and parentheses: the fields start after the last ')'.
        let rest = &text[text.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.chars().next()?;
        let ppid = fields.next()?.parse().ok()?;
        let pgrp = fields.next()?.parse().ok()?;
        Some(Self { state, ppid, pgrp })
    }
}

/// Duplicate `fd` onto descriptor `target` in the child (e.g. a status pipe
/// on fd 3). `fd` must not be 0, 1, 2 or `target` itself; see
/// [`fd_above_stdio`].
pub fn pass_fd(cmd: &mut std::process::Command, fd: RawFd, target: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and calls only dup2,
    // which is async-signal-safe; it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A close-on-exec duplicate of `fd` numbered 10 or above, so that it can
/// never collide with a child's stdio or with the low descriptor
/// [`pass_fd`] moves it to (the agent may have been started with some of
/// 0..2 closed, in which case a fresh pipe could land there).
pub fn fd_above_stdio(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new
    // descriptor that nothing else owns.
    let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A shell-style exit code: the code, or 128 + the signal that killed it.
pub fn shell_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => -1,
    }
}

/// The wire form of how a process ended.
pub fn exit_status(status: std::process::ExitStatus) -> proto::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    let status = match (status.code(), status.signal()) {
        (_, Some(sig)) => proto::exit_status::Status::Signal(sig),
        (Some(code), None) => proto::exit_status::Status::Code(code),
        (None, None) => proto::exit_status::Status::Code(-1),
    };
    proto::ExitStatus { status: Some(status) }
}

/// How long output is still read after a process exits, for descendants
/// that keep its stdout/stderr open (a background job). After that the
/// pipes are closed and such a descendant gets EPIPE/SIGPIPE on its next
/// write, as it would behind `ssh host 'cmd &'`.
pub const OUTPUT_DRAIN_GRACE: Duration = Duration::from_millis(500);

/// Size of one read from a child's stdout/stderr.
const READ_CHUNK: usize = 32 * 1024;

/// What a [`RunningChild`] reports.
#[derive(Debug)]
pub enum ChildEvent {
    Output(proto::OutputStream, Bytes),
    /// The process exited and its output was read to the end (or for
    /// [`OUTPUT_DRAIN_GRACE`] after its exit). Reported again on every later
    /// call.
    Finished(std::process::ExitStatus),
}

/// A started child in its own process group whose stdout/stderr are read
/// concurrently: the one place that pumps a child's output, waits for it,
/// and kills its group when the caller goes away.
#[derive(Debug)]
pub struct RunningChild {
    child: Process,
    pid: u32,
    output: mpsc::Receiver<(proto::OutputStream, Bytes)>,
    output_done: bool,
    /// Stdout and stderr read here rather than by pump tasks (a child a
    /// spawner thread started): no task or channel between a pipe and the
    /// caller; `None` once at its end.
    pipes: [Option<tokio::net::unix::pipe::Receiver>; 2],
    stop_readers: CancellationToken,
    status: Option<std::process::ExitStatus>,
    drain_until: Option<tokio::time::Instant>,
    kill_on_drop: bool,
}

impl RunningChild {
    /// Take over `child` (spawned from [`command`], so it leads its own
    /// process group) and start reading its piped stdout/stderr. With
    /// `kill_on_drop`, dropping this before the child finished kills the
    /// whole group.
    pub fn new(child: tokio::process::Child, kill_on_drop: bool) -> std::io::Result<Self> {
        Self::reading(child, None, kill_on_drop)
    }

    /// As [`RunningChild::new`] for a child a spawner thread started
    /// ([`start`]), with its stdout and stderr pipes.
    fn spawned(
        child: spawner::Child,
        stdout: tokio::net::unix::pipe::Receiver,
        stderr: tokio::net::unix::pipe::Receiver,
        kill_on_drop: bool,
    ) -> Self {
        let pid = child.id();
        let (mut running, _) = Self::around(Process::Spawned(child), pid, kill_on_drop);
        running.pipes = [Some(stdout), Some(stderr)];
        running
    }

    /// As [`RunningChild::new`] for a child on a terminal
    /// ([`terminal_command`]): its output is what `terminal` reads, as
    /// stdout.
    pub fn on_terminal(
        child: tokio::process::Child,
        terminal: tokio::fs::File,
        kill_on_drop: bool,
    ) -> std::io::Result<Self> {
        Self::reading(child, Some(terminal), kill_on_drop)
    }

    fn reading(
        mut child: tokio::process::Child,
        terminal: Option<tokio::fs::File>,
        kill_on_drop: bool,
    ) -> std::io::Result<Self> {
        let pid = child.id().ok_or_else(|| std::io::Error::other("child already reaped"))?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (running, tx) = Self::around(Process::Std(child), pid, kill_on_drop);
        let stop_readers = &running.stop_readers;
        if let Some(out) = stdout {
            tokio::spawn(pump(out, proto::OutputStream::Stdout, tx.clone(), stop_readers.clone()));
        }
        if let Some(terminal) = terminal {
            tokio::spawn(pump(terminal, proto::OutputStream::Stdout, tx.clone(), stop_readers.clone()));
        }
        if let Some(err) = stderr {
            tokio::spawn(pump(err, proto::OutputStream::Stderr, tx, stop_readers.clone()));
        }
        Ok(running)
    }

    /// A running child with no reader yet: the sender is for its readers.
    fn around(
        child: Process,
        pid: u32,
        kill_on_drop: bool,
    ) -> (Self, mpsc::Sender<(proto::OutputStream, Bytes)>) {
        let (tx, rx) = mpsc::channel(16);
        let running = Self {
            child,
            pid,
            output: rx,
            output_done: false,
            pipes: [None, None],
            stop_readers: CancellationToken::new(),
            status: None,
            drain_until: None,
            kill_on_drop,
        };
        (running, tx)
    }

    /// Process id, which is also the process group id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process itself has exited (its output may still be
    /// draining).
    pub fn has_exited(&self) -> bool {
        self.status.is_some()
    }

    /// SIGKILL the whole process group. Harmless once it is gone.
    pub fn kill_group(&self) {
        let _ = signal_group(self.pid, libc::SIGKILL);
    }

    /// The next output chunk, or the exit once output is done. Cancel-safe:
    /// may be used as a `tokio::select!` branch.
    pub async fn next_event(&mut self) -> std::io::Result<ChildEvent> {
        loop {
            let done = self.output_done && self.pipes.iter().all(Option::is_none);
            if let (Some(status), true) = (self.status, done) {
                return Ok(ChildEvent::Finished(status));
            }
            let drain_until = self.drain_until;
            let [stdout, stderr] = &mut self.pipes;
            tokio::select! {
                chunk = self.output.recv(), if !self.output_done => match chunk {
                    Some((stream, data)) => return Ok(ChildEvent::Output(stream, data)),
                    None => self.output_done = true,
                },
                data = read_chunk(stdout), if stdout.is_some() => match data {
                    Some(data) => return Ok(ChildEvent::Output(proto::OutputStream::Stdout, data)),
                    None => self.pipes[0] = None,
                },
                data = read_chunk(stderr), if stderr.is_some() => match data {
                    Some(data) => return Ok(ChildEvent::Output(proto::OutputStream::Stderr, data)),
                    None => self.pipes[1] = None,
                },
                status = self.child.wait(), if self.status.is_none() => {
                    self.status = Some(status?);
                    self.drain_until = Some(tokio::time::Instant::now() + OUTPUT_DRAIN_GRACE);
                }
                _ = sleep_until(drain_until), if drain_until.is_some() && !done => {
                    // The readers stop and drop their senders; what they
                    // already read is still delivered before `None`. Pipes
                    // read here are closed.
                    self.stop_readers.cancel();
                    self.pipes = [None, None];
                    self.drain_until = None;
                }
            }
        }
    }
}

/// The next chunk of `pipe` (which is `Some`); `None` at its end or on an
/// error. Cancel-safe: nothing is read unless it completes.
async fn read_chunk(pipe: &mut Option<tokio::net::unix::pipe::Receiver>) -> Option<Bytes> {
    use tokio::io::AsyncReadExt;
    let reader = pipe.as_mut()?;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    match reader.read_buf(&mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(buf.freeze()),
    }
}

impl Drop for RunningChild {
    fn drop(&mut self) {
        self.stop_readers.cancel();
        if self.kill_on_drop && self.status.is_none() {
            self.kill_group();
        }
    }
}

/// A child as std started it, or as a spawner thread did.
#[derive(Debug)]
enum Process {
    Std(tokio::process::Child),
    Spawned(spawner::Child),
}

impl Process {
    /// Cancel-safe, as both waits are.
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Process::Std(child) => child.wait().await,
            Process::Spawned(child) => child.wait().await,
        }
    }
}

/// Sleep until `at`, or forever when there is no deadline.
pub async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn pump(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    stream: proto::OutputStream,
    tx: mpsc::Sender<(proto::OutputStream, Bytes)>,
    stop: CancellationToken,
) {
    use tokio::io::AsyncReadExt;
    loop {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let read = tokio::select! {
            r = reader.read_buf(&mut buf) => r,
            _ = stop.cancelled() => return,
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if tx.send((stream, buf.freeze())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Map a failed spawn to an error code.
pub fn spawn_error(program: &str, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::NotFound => Error::not_found(format!("program {program:?} not found")),
        std::io::ErrorKind::PermissionDenied => {
            Error::new(ErrorCode::PermissionDenied, format!("program {program:?} is not executable"))
        }
        _ => Error::internal(format!("starting {program:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_variables_do_not_reach_children() {
        // SAFETY-free: set_var is unsafe in edition 2024 only because of
        // concurrent readers; this test process's other tests do not read it.
        unsafe { std::env::set_var("SANDHOLD_AGENT_TOKEN_FILE", "/secret/token") };
        let mut env = HashMap::new();
        env.insert("VISIBLE".to_string(), "yes".to_string());
        env.insert("SANDHOLD_AGENT_SMUGGLED".to_string(), "no".to_string());
        let out = command("/usr/bin/env", &[], Path::new("/"), &env, None, &Isolation::off())
            .unwrap()
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("VISIBLE=yes"));
        assert!(!text.contains("SANDHOLD_AGENT_"), "{text}");
    }
}
