//! The per-user background server's files and its start: where its socket,
//! state and log are, whether one runs, and starting one that outlives the
//! command that needed it. The server itself is `sandhold daemon serve`
//! (`daemon.rs`); the client finds it here before each command
//! (`client.rs`).
//!
//! Everything lives in `<data-dir>/daemon/`, a folder only its user can
//! enter (0700): `sandhold.sock` (the socket, 0600), `lock` (a POSIX
//! record lock the server holds for its whole life: the kernel says who
//! holds it, so a crashed server never leaves a stale "running"),
//! `state.json` (what the server says about itself), `server.log` (its log)
//! and `start.err` (what a server that failed before logging printed).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// How long a background server may take to answer once started.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The variable of `--idle-stop`.
pub const IDLE_STOP_VAR: &str = "SANDHOLD_DAEMON_IDLE_STOP";

/// The files of the background server of one data dir.
#[derive(Debug, Clone)]
pub struct Files {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub lock: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub start_err: PathBuf,
}

impl Files {
    pub fn of(data_dir: &Path) -> Self {
        let dir = data_dir.join("daemon");
        Self {
            socket: dir.join("sandhold.sock"),
            lock: dir.join("lock"),
            state: dir.join("state.json"),
            log: dir.join("server.log"),
            start_err: dir.join("start.err"),
            dir,
        }
    }

    /// Make the folder, only its user may enter (0700); the server checks
    /// its owner again before it binds the socket in it.
    pub fn make_dir(&self) -> anyhow::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))
    }

    /// `unix:PATH`, as `--server` takes it.
    pub fn server(&self) -> String {
        format!("unix:{}", self.socket.display())
    }
}

/// What a running background server wrote about itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub pid: u32,
    pub version: String,
    pub started_at_ms: i64,
    pub idle_stop_ms: u64,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl State {
    pub fn read(files: &Files) -> Option<Self> {
        let text = std::fs::read_to_string(&files.state).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Written whole or not at all (a rename), readable by its user only
    /// (the folder is 0700).
    pub fn write(&self, files: &Files) -> anyhow::Result<()> {
        let temp = files.state.with_extension(format!("{}.tmp", std::process::id()));
        std::fs::write(&temp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", temp.display()))?;
        std::fs::rename(&temp, &files.state).with_context(|| format!("writing {}", files.state.display()))
    }
}

/// The lock a background server holds while it lives.
pub struct Held(#[allow(dead_code, reason = "held open: closing it releases the lock")] File);

/// A record lock of `kind` over the whole file.
fn flock(kind: libc::c_short) -> libc::flock {
    libc::flock { l_type: kind, l_whence: libc::SEEK_SET as libc::c_short, l_start: 0, l_len: 0, l_pid: 0 }
}

fn open_lock(files: &Files) -> std::io::Result<File> {
    std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&files.lock)
}

/// Take the lock; `None` when a live server holds it.
pub fn lock(files: &Files) -> anyhow::Result<Option<Held>> {
    let file = open_lock(files).with_context(|| format!("opening {}", files.lock.display()))?;
    let request = flock(libc::F_WRLCK as libc::c_short);
    match nix::fcntl::fcntl(file.as_fd(), nix::fcntl::FcntlArg::F_SETLK(&request)) {
        Ok(_) => Ok(Some(Held(file))),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("locking {}", files.lock.display())),
    }
}

/// The pid of the live background server of these files, as the kernel
/// knows it (the holder of the lock), without taking the lock.
pub fn running(files: &Files) -> Option<u32> {
    let file = open_lock(files).ok()?;
    let mut probe = flock(libc::F_WRLCK as libc::c_short);
    nix::fcntl::fcntl(file.as_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut probe)).ok()?;
    (probe.l_type != libc::F_UNLCK as libc::c_short).then(|| u32::try_from(probe.l_pid).ok()).flatten()
}

/// What starts a background server: the data dir and the settings of
/// the embedded server the command was given (absolute, since the server
/// runs from `/`).
pub struct Launch {
    pub data_dir: PathBuf,
    pub args: Vec<std::ffi::OsString>,
}

/// Start `sandhold daemon serve` in its own process group (a Ctrl-C at the
/// terminal is for the command, not for it), from `/`, its output in
/// `start.err` until it logs.
pub fn spawn(files: &Files, launch: &Launch) -> anyhow::Result<Child> {
    files.make_dir()?;
    let err =
        File::create(&files.start_err).with_context(|| format!("creating {}", files.start_err.display()))?;
    let exe = std::env::current_exe().context("finding this executable to start the background server")?;
    std::process::Command::new(exe)
        .args(["daemon", "serve", "--data-dir"])
        .arg(&launch.data_dir)
        .args(&launch.args)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .process_group(0)
        .spawn()
        .context("starting the background server")
}

/// Until the socket accepts a connection and the server says it serves
/// (`Ok(true)`); `Ok(false)` once no server holds the lock any more (it
/// stopped, or the one started here lost the race to another that then
/// stopped); an error when the process started here fails, or after
/// [`START_TIMEOUT`].
pub async fn wait_serving(files: &Files, mut child: Option<&mut Child>) -> anyhow::Result<bool> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let exited = match child.as_deref_mut() {
            Some(c) => match c.try_wait()? {
                Some(status) if !status.success() => {
                    bail!("the background server failed to start ({status}):\n{}", failure_text(files))
                }
                Some(_) => true,
                None => false,
            },
            None => true,
        };
        if serving(files).await {
            return Ok(true);
        }
        if exited && running(files).is_none() {
            return Ok(false);
        }
        if Instant::now() > deadline {
            bail!(
                "the background server did not answer within {}s:\n{}",
                START_TIMEOUT.as_secs(),
                failure_text(files)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the socket answers a health check with SERVING.
pub async fn serving(files: &Files) -> bool {
    use tonic_health::pb::health_check_response::ServingStatus;
    let address = shared::transport::Address::Unix(files.socket.clone());
    let Ok(Ok(channel)) =
        tokio::time::timeout(Duration::from_secs(2), shared::transport::connect(&address)).await
    else {
        return false;
    };
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), health.check(request)).await,
        Ok(Ok(answer)) if answer.get_ref().status() == ServingStatus::Serving
    )
}

/// The last lines of what a failed start left: `start.err`, else the log.
fn failure_text(files: &Files) -> String {
    let tail = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    let err = tail(&files.start_err);
    if !err.trim().is_empty() {
        return err;
    }
    let log = tail(&files.log);
    if log.trim().is_empty() {
        format!("(nothing in {} or {})", files.start_err.display(), files.log.display())
    } else {
        format!("{log}\n(from {})", files.log.display())
    }
}

/// `1h30m`, `15m`, `45s`: how a person reads a span.
pub fn span_text(span: Duration) -> String {
    let secs = span.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's record lock is the truth: held, the probe names the
    /// holder; released (or its process gone), nobody runs.
    #[test]
    fn the_lock_names_its_holder_and_only_one_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::of(dir.path());
        std::fs::create_dir_all(&files.dir).unwrap();
        assert_eq!(running(&files), None);
        // A record lock is per process (a second taker in the holder's own
        // process succeeds), so the probes run in a child process.
        let probe = || {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "cli::background::tests::probe_from_another_process",
                    "--nocapture",
                    "--ignored",
                ])
                .env("SANDHOLD_PROBE_DIR", dir.path())
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        let held = lock(&files).unwrap().expect("free");
        let out = probe();
        assert!(out.contains(&format!("holder={}", std::process::id())), "{out}");
        drop(held);
        let out = probe();
        assert!(out.contains("holder=none"), "{out}");
    }

    /// Run by the test above in a child process.
    #[test]
    #[ignore = "a helper of the_lock_names_its_holder_and_only_one_holds_it"]
    fn probe_from_another_process() {
        let Some(dir) = std::env::var_os("SANDHOLD_PROBE_DIR") else { return };
        let files = Files::of(Path::new(&dir));
        match running(&files) {
            Some(pid) => println!("holder={pid}"),
            None => println!("holder=none"),
        }
        assert!(lock(&files).unwrap().is_none() == running(&files).is_some());
    }

    #[test]
    fn spans_read_as_people_write_them() {
        assert_eq!(span_text(Duration::from_secs(15 * 60)), "15m");
        assert_eq!(span_text(Duration::from_secs(5400)), "1h30m");
        assert_eq!(span_text(Duration::from_secs(45)), "45s");
        assert_eq!(span_text(Duration::ZERO), "0s");
    }
}
