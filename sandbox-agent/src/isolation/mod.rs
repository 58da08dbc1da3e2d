//! Kernel confinement of everything the agent starts as the run user
//! (runs, setup steps, execs, shell sessions and terminals, and all they
//! start in turn): applied between `fork` and `exec`, inherited by every
//! descendant, and impossible to lift from inside.
//!
//! - Landlock ([`landlock`]): writes only beneath the sandbox root, the
//!   run user's HOME, the temporary directories and a few devices, plus
//!   what one start adds (a run's journal files and request dir), minus
//!   the directories a run's policy denies writes to.
//! - seccomp ([`seccomp`]): a denylist of calls answered `EPERM`.
//!
//! Both need `no_new_privs`, which the hook sets (setuid binaries then do
//! not gain privileges, as under Docker's `no-new-privileges`). A kernel
//! without one of them is detected at start: the capability says `false`,
//! the agent logs a warning, and the control plane adds a
//! `harness.warning` to each run. `docs/security.md` says what each layer
//! stops and what it does not.

pub mod landlock;
pub mod seccomp;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};

/// Where the run user may write besides the root and its HOME.
pub const SCRATCH: &[&str] = &["/tmp", "/var/tmp", "/dev/shm"];

/// Devices every program opens for writing.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// How the run user's processes are confined. Built once at start
/// ([`Isolation::detect`]), narrowed per start ([`Isolation::for_run`]);
/// serialized for the run supervisor, which applies it to the command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    landlock: bool,
    seccomp: bool,
    writable: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    files: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    denied: Vec<PathBuf>,
}

impl Isolation {
    /// No confinement at all (the operator's `--unconfined`, and tests
    /// that start children of their own).
    pub fn off() -> Self {
        Self::default()
    }

    /// What this kernel supports, confining writes to `root`, `home` and
    /// the scratch dirs (and `$TMPDIR`); with `enabled` false, nothing.
    /// Returns the warnings to report (a layer the kernel lacks).
    pub fn detect(root: &Path, home: Option<&Path>, enabled: bool) -> (Self, Vec<String>) {
        if !enabled {
            let warning = "confinement of the run user (Landlock, seccomp) is turned off by the operator";
            return (Self::off(), vec![warning.to_string()]);
        }
        let mut warnings = Vec::new();
        let landlock = landlock::abi_version().is_some();
        if !landlock {
            warnings.push(
                "this sandbox's kernel has no Landlock: the run user's writes are bounded only by file \
                 permissions"
                    .to_string(),
            );
        }
        let seccomp = programs().is_some() && seccomp_available();
        if !seccomp {
            warnings.push(
                "this sandbox's kernel (or architecture) has no seccomp filter for the run user: mount, bpf, \
                 io_uring and the rest of the denylist stay open to it"
                    .to_string(),
            );
        }
        let mut writable = vec![root.to_path_buf()];
        writable.extend(home.map(Path::to_path_buf));
        writable.extend(SCRATCH.iter().chain(DEVICES).map(PathBuf::from));
        if let Some(tmp) = std::env::var_os("TMPDIR").filter(|t| Path::new(t).is_absolute()) {
            writable.push(PathBuf::from(tmp));
        }
        (Self { landlock, seccomp, writable, files: Vec::new(), denied: Vec::new() }, warnings)
    }

    /// Whether Landlock confines the run user's writes.
    pub fn landlock(&self) -> bool {
        self.landlock
    }

    /// Whether the seccomp denylist applies to the run user.
    pub fn seccomp(&self) -> bool {
        self.seccomp
    }

    /// This confinement for one start: `dirs` writable too, `files` (a
    /// run's journal and stderr) writable, `denied` dirs (absolute) not.
    pub fn for_run(&self, dirs: &[PathBuf], files: &[PathBuf], denied: &[PathBuf]) -> Self {
        let mut run = self.clone();
        run.writable.extend(dirs.iter().cloned());
        run.files.extend(files.iter().cloned());
        run.denied.extend(denied.iter().cloned());
        run
    }

    /// Confine `cmd` before it execs: the ruleset is built and the filters
    /// compiled here, so the child only makes system calls.
    pub fn apply(&self, cmd: &mut std::process::Command) -> std::io::Result<()> {
        use std::os::unix::process::CommandExt;
        let ruleset = self.ruleset()?;
        let filters = filters(self.seccomp)?;
        if ruleset.is_none() && filters.is_empty() {
            return Ok(());
        }
        // SAFETY: the hook only makes system calls (prctl,
        // landlock_restrict_self, seccomp) on memory prepared before the
        // fork; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || enter(ruleset.as_deref(), &filters));
        }
        Ok(())
    }

    /// The Landlock ruleset of this confinement, for the child to restrict
    /// itself with; `None` without Landlock. The agent's own confinement
    /// (no run's files or denied dirs) shares one ruleset between starts.
    pub fn ruleset(&self) -> std::io::Result<Option<Arc<OwnedFd>>> {
        let built = match (self.landlock, self.files.is_empty() && self.denied.is_empty()) {
            (false, _) => return Ok(None),
            (true, true) => landlock::shared_ruleset(&self.writable),
            (true, false) => landlock::ruleset(&self.writable, &self.files, &self.denied)
                .map(|ruleset| ruleset.map(Arc::new)),
        };
        built.map_err(|e| std::io::Error::other(format!("building the Landlock ruleset: {e}")))
    }
}

/// Set `no_new_privs` on the calling thread only, and with `seccomp` the
/// seccomp filters too: for a thread whose children inherit both
/// (a spawner thread), as [`Isolation::apply`]'s hook would install them
/// in each child.
pub fn confine_thread(seccomp: bool) -> std::io::Result<()> {
    enter(None, &filters(seccomp)?)
}

/// The filters to install: all of them with `seccomp`, else none.
fn filters(seccomp: bool) -> std::io::Result<Arc<Vec<BpfProgram>>> {
    match seccomp {
        true => programs().ok_or_else(|| std::io::Error::other("no seccomp filter for this architecture")),
        false => Ok(Arc::new(Vec::new())),
    }
}

/// The compiled filters (once per process).
fn programs() -> Option<Arc<Vec<BpfProgram>>> {
    static PROGRAMS: std::sync::OnceLock<Option<Arc<Vec<BpfProgram>>>> = std::sync::OnceLock::new();
    PROGRAMS.get_or_init(|| seccomp::programs().map(Arc::new)).clone()
}

/// Whether the kernel filters system calls (`PR_GET_SECCOMP` answers).
fn seccomp_available() -> bool {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// In the child: no new privileges, then the ruleset, then the filters.
fn enter(ruleset: Option<&OwnedFd>, filters: &[BpfProgram]) -> std::io::Result<()> {
    let check = |rc: libc::c_long| if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
    // SAFETY: plain system calls; the filter program outlives the call.
    unsafe {
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long)?;
        if let Some(fd) = ruleset {
            check(libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32))?;
        }
        for filter in filters {
            let program = libc::sock_fprog {
                len: filter.len() as libc::c_ushort,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            check(libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0u32,
                &program as *const libc::sock_fprog,
            ))?;
        }
    }
    Ok(())
}
