//! Local sandboxes outlive the servers that made them (each agent `init`
//! leads its own session, on purpose: a restarted server finds its
//! sandboxes running). In tests that means every local sandbox must be
//! killed by the test that made it, also when the test fails. [`TestDir`]
//! does it for a test's whole data directory; [`LocalCleanup`] for a
//! directory someone else owns.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// A temporary directory under `/tmp` (short paths: agent sockets live in
/// it) that, when dropped, first kills every process of the local
/// sandboxes under it and only then is deleted. Use it for every data dir a
/// test hands to a server, so no `sandhold-agent` outlives the test.
pub struct TestDir {
    // Declared first: dropped (processes killed) before the directory goes.
    _cleanup: LocalCleanup,
    dir: tempfile::TempDir,
}

impl TestDir {
    pub fn new(prefix: &str) -> Self {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp").expect("a temp dir in /tmp");
        let path = dir.path().canonicalize().expect("resolving the temp dir");
        Self { _cleanup: LocalCleanup(path), dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Kills, when dropped, whatever local sandboxes under a directory left
/// running: every agent whose `agent.pid` lies under it (its whole process
/// group) and every process whose command line or working directory lies
/// under it. Drop it before the directory goes.
pub struct LocalCleanup(pub PathBuf);

impl Drop for LocalCleanup {
    fn drop(&mut self) {
        // Again while supervisors restart what was killed under them.
        for _ in 0..5 {
            let groups = agent_pids(&self.0, 4);
            let left = processes_under(&self.0);
            if groups.is_empty() && left.is_empty() {
                return;
            }
            for pid in groups {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            for (pid, _) in left {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Pids in `agent.pid` files under `dir`, down to `depth` levels, of
/// processes still alive.
fn agent_pids(dir: &Path, depth: usize) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name() == "agent.pid" {
            if let Some(pid) = std::fs::read_to_string(&path).ok().and_then(|p| p.trim().parse::<i32>().ok())
                && Path::new("/proc").join(pid.to_string()).exists()
            {
                found.push(pid);
            }
        } else if depth > 0 && entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(agent_pids(&path, depth - 1));
        }
    }
    found
}

/// Processes whose command line or working directory lies under `dir`,
/// with their arguments (this test process excluded).
pub fn processes_under(dir: &Path) -> Vec<(i32, Vec<String>)> {
    let needle = dir.to_string_lossy().into_owned();
    let own = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let in_dir = std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir));
        if pid != own && (in_dir || args.iter().any(|a| a.contains(&needle))) {
            found.push((pid, args));
        }
    }
    found
}

/// Whether `pid` is a live process: not gone, and not a zombie waiting
/// for whoever reaps it.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Pids of agent daemons (`sandhold-agent serve`, not `init`) of sandboxes
/// under `data_dir`.
pub fn agent_daemons(data_dir: &Path) -> Vec<i32> {
    processes_under(data_dir)
        .into_iter()
        .filter(|(_, args)| {
            args.first().is_some_and(|a| a.ends_with("sandhold-agent"))
                && args.get(1).is_some_and(|a| a == "serve")
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Whether any process's command line contains `marker`.
pub fn process_with_marker(marker: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().any(|e| {
        let cmdline = Path::new("/proc").join(e.file_name()).join("cmdline");
        std::fs::read(cmdline).is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
    })
}

/// A command that says `started` and then sleeps, its command line marked
/// with `marker` so the test can find its process.
pub fn sleeper(marker: &str) -> String {
    format!("echo started; sleep 1000; echo {marker}")
}

/// Whether the process marked `marker` is gone within `within`.
pub async fn process_gone_within(marker: &str, within: Duration) -> bool {
    crate::wait::eventually(within, || std::future::ready(!process_with_marker(marker))).await
}

/// How many Unix sockets of this network namespace carry the address
/// `socket`: the listener, plus one per connection its owner has not yet
/// closed (also those waiting in its accept queue). A paused agent
/// (SIGSTOP) closes nothing, so a rise says someone connected to it.
pub fn unix_socket_entries(socket: &Path) -> usize {
    let socket = socket.canonicalize().unwrap_or_else(|_| socket.to_path_buf());
    let wanted = socket.to_string_lossy();
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|line| line.split_whitespace().nth(7) == Some(&*wanted))
        .count()
}

/// A child process a test spawned itself (an agent or server with no
/// directory of its own to die with), killed and reaped when dropped
/// unless the test took it back ([`ChildGuard::take`]) to stop it itself.
pub struct ChildGuard(Option<std::process::Child>);

impl ChildGuard {
    pub fn new(child: std::process::Child) -> Self {
        Self(Some(child))
    }

    pub fn id(&self) -> u32 {
        self.0.as_ref().map(std::process::Child::id).expect("not taken")
    }

    /// The child, no longer killed on drop.
    pub fn take(mut self) -> std::process::Child {
        self.0.take().expect("not taken")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A bare repository `origin.git` in `dir` with one commit of app.txt on
/// main.
pub fn bare_origin(dir: &Path) -> std::path::PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q"]);
    std::fs::write(work.join("app.txt"), "one\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-q", "-m", "first"]);
    git(dir, &["clone", "-q", "--bare", "work", "origin.git"]);
    dir.join("origin.git")
}

/// `git -C dir ARGS` with the host's git, as a fixed identity on branch
/// `main` by default; its trimmed stdout. Panics (with git's message) when
/// git fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"])
        .args(args)
        .output()
        .expect("git on the test host");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
