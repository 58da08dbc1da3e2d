//! A Docker engine of a test's own: a second `dockerd` on its own socket,
//! data and exec roots, with only the runtimes dockerd ships with (the
//! machine's `/etc/docker/daemon.json`, where `scripts/services` registers
//! runsc, is not read). For tests of what a server does on an engine that
//! lacks something. Stopped, unmounted and removed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::wait::PATIENCE;

/// A running `dockerd` whose engine answers at [`Dockerd::host`].
pub struct Dockerd {
    child: Child,
    /// Everything it has: config, data root, exec root, socket, log.
    dir: PathBuf,
    /// `unix://<dir>/docker.sock`, what `DOCKER_HOST` names.
    pub host: String,
}

impl Dockerd {
    /// A fresh engine, once `docker info` answers on its socket. `None` (a
    /// skip) when this machine cannot run one; a failure instead under
    /// `SANDHOLD_REQUIRE_SERVICES=1`, so CI never passes by skipping.
    pub fn start() -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            crate::services::missing_service("a second dockerd", "the tests do not run as root");
            return None;
        }
        let dockerd = crate::services::program("dockerd")?;
        // Short: the exec root holds containerd's sockets (108 bytes at most).
        let dir = PathBuf::from(format!("/tmp/shd-{}", crate::nonce()));
        std::fs::create_dir(&dir).expect("the dockerd dir");
        let config = dir.join("daemon.json");
        std::fs::write(&config, "{}\n").unwrap();
        let host = format!("unix://{}", dir.join("docker.sock").display());
        let log = dir.join("dockerd.log");
        let child = Command::new(dockerd)
            .args(["--bridge=none", "--iptables=false", "--ip6tables=false", "--storage-driver=vfs"])
            .arg("--config-file")
            .arg(&config)
            .arg("--data-root")
            .arg(dir.join("d"))
            .arg("--exec-root")
            .arg(dir.join("x"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .args(["-H", &host])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawning dockerd");
        let mut engine = Self { child, dir, host };
        let deadline = Instant::now() + PATIENCE;
        while !engine.answers() {
            let exited = engine.child.try_wait().unwrap();
            if exited.is_some() || Instant::now() >= deadline {
                let why = format!("it did not answer ({exited:?}):\n{}", engine.log());
                crate::services::missing_service("a second dockerd", &why);
                return None;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(engine)
    }

    /// The runtimes `docker info` lists, by the engine's names.
    pub fn runtimes(&self) -> String {
        let out = self.docker(&["info", "--format", "{{json .Runtimes}}"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }

    fn answers(&self) -> bool {
        self.docker(&["info", "--format", "{{.ID}}"]).status.success()
    }

    fn docker(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker").args(["-H", &self.host]).args(args).output().expect("the docker CLI")
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        // SIGTERM: it stops the containerd it started and unmounts what
        // it mounted; SIGKILL if it will not.
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its containerd (it names the exec root) dies with it, else here.
        for (pid, _) in crate::local::processes_under(&self.dir) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        for mount in mounts_under(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&mount).status();
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}

/// Mount points at or under `dir` in this mount namespace, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found
}
