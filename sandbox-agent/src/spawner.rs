//! Starting a child without copying the agent: `clone(CLONE_VM |
//! CLONE_VFORK)`, as `posix_spawn` does, from a spawner thread that already
//! carries the confinement every child of one kind needs.
//!
//! `std::process::Command` has to `fork` as soon as a command runs as the
//! run user or is confined (its `pre_exec` hook): a copy of the agent's
//! page tables, copy-on-write faults in both processes afterwards, and the
//! seccomp filters compiled again in every child. Here the child shares the
//! agent's memory until its `execve` (the calling thread waits meanwhile),
//! and the spawner thread it is cloned from set `no_new_privs` and
//! installed the seccomp filters on itself once: a child inherits both at
//! `clone` as it would have installed them, and they stay in force across
//! `execve`. What varies per start is applied in the child, from memory
//! prepared before the `clone` ([`Plan`]): stdio, the run user's ids
//! (supplementary groups dropped), the working directory, its own process
//! group, the Landlock ruleset of that start, then `execve` with the
//! prepared argv and environment. The child only makes system calls: it
//! allocates nothing, takes no lock, and returns no error but by writing
//! it beside the plan before it exits.
//!
//! A spawner thread serves one kind of confinement ([`Kind`]); each is
//! started at its first use. Where one cannot start (no pidfd to wait on,
//! as under gVisor 20221219; a thread that cannot confine itself)
//! [`Spawner::get`] says so, once in the log, and the caller falls back to
//! `std::process::Command`.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::isolation::Isolation;

/// The confinement a spawner thread carries itself, so that its children
/// inherit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Nothing (the operator's `--unconfined`).
    Plain,
    /// `no_new_privs`, which Landlock needs (a kernel without seccomp).
    NoNewPrivs,
    /// `no_new_privs` and the seccomp filters.
    Filtered,
}

impl Kind {
    /// The kind `isolation` asks for.
    pub fn of(isolation: &Isolation) -> Self {
        match (isolation.seccomp(), isolation.landlock()) {
            (true, _) => Kind::Filtered,
            (false, true) => Kind::NoNewPrivs,
            (false, false) => Kind::Plain,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Everything a child needs, prepared by the caller: the child reads it and
/// makes system calls, nothing else.
#[derive(Debug)]
pub struct Plan {
    /// The paths to try `execve` on, in order (the `PATH` search done
    /// beforehand, as `execvp` would in the child).
    pub candidates: Vec<CString>,
    /// `argv[0]` and the arguments.
    pub argv: Vec<CString>,
    /// The whole environment, `KEY=value`.
    pub envp: Vec<CString>,
    pub cwd: CString,
    /// The run user's uid and gid; `None` keeps the agent's.
    pub ids: Option<(u32, u32)>,
    /// The Landlock ruleset of this start (possibly shared with others).
    pub ruleset: Option<Arc<OwnedFd>>,
    /// What becomes the child's stdin, stdout and stderr (each above 2).
    pub stdio: [RawFd; 3],
    /// Lead a new process group (its pid).
    pub process_group: bool,
}

/// A program that is not a binary the kernel runs (a script without `#!`)
/// is run by the shell, as `execvp` does.
const SHELL: &CStr = c"/bin/sh";

/// The plan as raw pointers, built before the `clone`. Borrowed from a
/// [`Plan`] that the calling thread keeps alive until the child has exec'd
/// or exited.
struct Prepared<'a> {
    plan: &'a Plan,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// `/bin/sh`, a slot for the candidate, the arguments.
    shell_argv: Vec<*const libc::c_char>,
    /// What went wrong in the child: the step, shifted left 32, and errno.
    failure: AtomicI64,
}

/// The steps of the child, named in its errors.
#[derive(Debug, Clone, Copy)]
#[repr(i64)]
enum Step {
    Stdio = 1,
    SetGid,
    SetGroups,
    SetUid,
    Chdir,
    ProcessGroup,
    Landlock,
    SignalMask,
    Exec,
}

impl Step {
    fn from_code(code: i64) -> &'static str {
        match code {
            1 => "setting up stdio",
            2 => "setgid",
            3 => "setgroups",
            4 => "setuid",
            5 => "chdir",
            6 => "setpgid",
            7 => "landlock_restrict_self",
            8 => "restoring the signal mask",
            _ => "execve",
        }
    }
}

impl<'a> Prepared<'a> {
    fn new(plan: &'a Plan) -> Self {
        let pointers =
            |strings: &[CString]| strings.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect();
        let shell_argv = [SHELL.as_ptr(), std::ptr::null()]
            .into_iter()
            .chain(plan.argv.iter().skip(1).map(|s| s.as_ptr()))
            .chain([std::ptr::null()])
            .collect();
        Self {
            plan,
            argv: pointers(&plan.argv),
            envp: pointers(&plan.envp),
            shell_argv,
            failure: AtomicI64::new(0),
        }
    }
}

/// A started child: its pid (also its process group's when the plan asked
/// for one) and a pidfd to wait on without signals.
#[derive(Debug)]
pub struct Child {
    pid: u32,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Wait for the child to exit and reap it. Cancel-safe.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let pidfd = self.pidfd.as_ref().ok_or_else(|| std::io::Error::other("child already reaped"))?;
        loop {
            let mut ready = pidfd.readable().await?;
            match reap(self.pid, libc::WNOHANG)? {
                Some(status) => {
                    self.status = Some(status);
                    return Ok(status);
                }
                None => ready.clear_ready(),
            }
        }
    }
}

impl Drop for Child {
    /// A child still running is reaped once it exits, by a task (or, with
    /// no runtime, a thread), so it never stays a zombie.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let pid = self.pid;
        let Some(pidfd) = self.pidfd.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    while let Ok(mut ready) = pidfd.readable().await {
                        match reap(pid, libc::WNOHANG) {
                            Ok(None) => ready.clear_ready(),
                            _ => return,
                        }
                    }
                });
            }
            Err(_) => {
                std::thread::spawn(move || {
                    let _ = reap(pid, 0);
                });
            }
        }
    }
}

/// `waitpid` on our own child; `None` while it runs (with `WNOHANG`).
fn reap(pid: u32, flags: libc::c_int) -> std::io::Result<Option<ExitStatus>> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes one int to a local.
        let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, flags) };
        match rc {
            0 => return Ok(None),
            rc if rc > 0 => return Ok(Some(ExitStatus::from_raw(status))),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
}

/// Children started by spawner threads in this process (tests check that
/// a start took this path).
pub fn started() -> u64 {
    STARTED.load(Ordering::Relaxed)
}

static STARTED: AtomicU64 = AtomicU64::new(0);

/// A job for a spawner thread: the plan (alive until the answer), and where
/// the answer goes.
struct Job {
    plan: *const Plan,
    answer: mpsc::SyncSender<std::io::Result<u32>>,
}

// SAFETY: the plan is only read, and the thread that sent the job keeps
// it alive until it has the answer.
unsafe impl Send for Job {}

/// A thread that starts children of one [`Kind`].
#[derive(Debug)]
pub struct Spawner {
    jobs: mpsc::Sender<Job>,
}

/// Bytes of the stack the child runs on until its `execve`.
const CHILD_STACK: usize = 256 * 1024;

impl Spawner {
    /// The spawner thread for `kind`, started at the first call; `None`
    /// where there cannot be one (said once in the log).
    pub fn get(kind: Kind) -> Option<&'static Spawner> {
        static SPAWNERS: [OnceLock<Option<Spawner>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        SPAWNERS[kind.index()]
            .get_or_init(|| match Self::start(kind) {
                Ok(spawner) => Some(spawner),
                Err(e) => {
                    tracing::info!(
                        ?kind,
                        error = %e,
                        "no spawner thread: children are started by fork (slower, same confinement)"
                    );
                    None
                }
            })
            .as_ref()
    }

    fn start(kind: Kind) -> std::io::Result<Self> {
        if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            return Err(std::io::Error::other("the child's signal reset is written for x86_64 and aarch64"));
        }
        // Waiting goes through a pidfd (Linux 5.3).
        drop(pidfd(std::process::id())?);
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready, confined) = mpsc::sync_channel(1);
        std::thread::Builder::new().name(format!("spawner-{kind:?}").to_lowercase()).spawn(move || {
            let setup = confine_thread(kind).and_then(|()| ChildStack::new());
            let stack = match setup {
                Ok(stack) => {
                    let _ = ready.send(Ok(()));
                    stack
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            for job in queue {
                // SAFETY: the sender keeps the plan alive until it has the answer.
                let plan = unsafe { &*job.plan };
                let _ = job.answer.send(clone_child(plan, &stack));
            }
        })?;
        confined.recv().map_err(|_| std::io::Error::other("the spawner thread ended"))??;
        Ok(Self { jobs })
    }

    /// Start `plan`. Blocks the calling thread until the child has exec'd
    /// (or failed to), as `posix_spawn` does.
    pub fn spawn(&self, plan: &Plan) -> std::io::Result<Child> {
        let (answer, answered) = mpsc::sync_channel(1);
        self.jobs
            .send(Job { plan: plan as *const Plan, answer })
            .map_err(|_| std::io::Error::other("the spawner thread ended"))?;
        let pid = answered.recv().map_err(|_| std::io::Error::other("the spawner thread ended"))??;
        STARTED.fetch_add(1, Ordering::Relaxed);
        let registered = pidfd(pid).and_then(|fd| {
            tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
            // SAFETY: the AsyncFd owns the descriptor, open for its lifetime.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)
        });
        match registered {
            Ok(pidfd) => Ok(Child { pid, pidfd: Some(pidfd), status: None }),
            Err(e) => {
                // SAFETY: a plain syscall on our own child.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                let _ = reap(pid, 0);
                Err(e)
            }
        }
    }
}

fn pidfd(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes integers and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns (pidfds are close-on-exec).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Confine the calling thread (only it) as its children of `kind` must
/// be, and block every signal on it: no handler of the agent ever runs on
/// it, nor in a child before the child has reset them.
fn confine_thread(kind: Kind) -> std::io::Result<()> {
    // SAFETY: a full set built by sigfillset, applied to this thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
    }
    match kind {
        Kind::Plain => Ok(()),
        Kind::NoNewPrivs => crate::isolation::confine_thread(false),
        Kind::Filtered => crate::isolation::confine_thread(true),
    }
}

/// The stack a child runs on until its `execve`: one per spawner thread,
/// free again once `clone` returns (the thread waits for the child to exec
/// or exit), with a guard page below it.
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    fn new() -> std::io::Result<Self> {
        let page = 4096;
        let len = CHILD_STACK + page;
        // SAFETY: an anonymous private mapping of our own; nothing aliases it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: the mapping made above, unused.
            unsafe { libc::munmap(base, len) };
            return Err(e);
        }
        Ok(Self { base, len })
    }

    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping; stacks grow down (on
        // x86_64 and aarch64), and the mapping is page-aligned.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no child running on it.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// On the spawner thread: clone the child and wait (CLONE_VFORK) until it
/// has exec'd or exited.
fn clone_child(plan: &Plan, stack: &ChildStack) -> std::io::Result<u32> {
    if plan.stdio.iter().any(|fd| *fd <= 2) || plan.candidates.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad spawn plan"));
    }
    let mut prepared = Prepared::new(plan);
    let data = &mut prepared as *mut Prepared<'_> as *mut libc::c_void;
    // SAFETY: the child runs `child_main` on its own stack, shares our
    // memory and only reads `prepared` (and writes its `failure`) until it
    // execs or exits; CLONE_VFORK suspends this thread until then, so
    // `prepared` and the stack outlive its use.
    let pid = unsafe {
        libc::clone(child_main, stack.top(), libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, data)
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let failure = prepared.failure.load(Ordering::SeqCst);
    if failure != 0 {
        let _ = reap(pid as u32, 0);
        let errno = (failure & 0xffff_ffff) as i32;
        let e = std::io::Error::from_raw_os_error(errno);
        // The kind is what callers map (not found, permission denied);
        // the message names the step.
        return Err(std::io::Error::new(e.kind(), format!("{}: {e}", Step::from_code(failure >> 32))));
    }
    Ok(pid as u32)
}

/// The kernel's `struct sigaction` (x86_64 and aarch64), for the raw
/// `rt_sigaction`: libc's has another layout.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Record what failed (the step and errno) for the parent and end the
/// child: exit_group ends only it (its own thread group), running nothing
/// of the agent's.
fn fail(failure: &AtomicI64, step: Step) -> ! {
    // SAFETY: reading this thread's errno; a plain system call.
    unsafe {
        let errno = *libc::__errno_location();
        failure.store(((step as i64) << 32) | i64::from(errno.max(1)), Ordering::SeqCst);
        libc::syscall(libc::SYS_exit_group, 127 as libc::c_long);
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

/// A system call argument: `syscall` reads every argument as a long.
fn arg(n: impl Into<i64>) -> libc::c_long {
    n.into() as libc::c_long
}

/// The child, between `clone` and `execve`: system calls on prepared
/// memory only (no allocation, no lock, no panic). Never returns.
extern "C" fn child_main(data: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `data` is the `Prepared` the parent made and does not touch
    // while it is suspended (CLONE_VFORK).
    let prepared = unsafe { &mut *(data as *mut Prepared<'_>) };
    let plan = prepared.plan;
    let failure = &prepared.failure;
    // SAFETY: each call below is a system call on memory the plan owns or
    // on locals.
    unsafe {
        // Handlers of the agent must not run here (this memory is the
        // agent's): every caught signal back to its default, and SIGPIPE
        // too (the agent ignores it; std's children get the default).
        // Signals stay blocked (the spawner thread's mask) until the end.
        let default = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
        let none = std::ptr::null_mut::<KernelSigaction>();
        for signal in 1..=64 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut old = KernelSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
            let rc = libc::syscall(
                libc::SYS_rt_sigaction,
                arg(signal),
                none,
                &mut old as *mut KernelSigaction,
                arg(8),
            );
            let caught = old.handler != libc::SIG_DFL && old.handler != libc::SIG_IGN;
            if rc == 0 && (caught || signal == libc::SIGPIPE) {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    arg(signal),
                    &default as *const KernelSigaction,
                    none,
                    arg(8),
                );
            }
        }
        for (target, fd) in (0..).zip(plan.stdio) {
            if libc::syscall(libc::SYS_dup3, arg(fd), arg(target), arg(0)) < 0 {
                fail(failure, Step::Stdio);
            }
        }
        if let Some((uid, gid)) = plan.ids {
            if libc::syscall(libc::SYS_setgid, arg(gid)) < 0 {
                fail(failure, Step::SetGid);
            }
            // Dropping from root drops the supplementary groups; without
            // CAP_SETGID there are none to drop (as std does).
            if libc::syscall(libc::SYS_setgroups, arg(0), std::ptr::null::<libc::gid_t>()) < 0
                && *libc::__errno_location() != libc::EPERM
            {
                fail(failure, Step::SetGroups);
            }
            if libc::syscall(libc::SYS_setuid, arg(uid)) < 0 {
                fail(failure, Step::SetUid);
            }
        }
        if libc::syscall(libc::SYS_chdir, plan.cwd.as_ptr()) < 0 {
            fail(failure, Step::Chdir);
        }
        if plan.process_group && libc::syscall(libc::SYS_setpgid, arg(0), arg(0)) < 0 {
            fail(failure, Step::ProcessGroup);
        }
        if let Some(ruleset) = &plan.ruleset
            && libc::syscall(libc::SYS_landlock_restrict_self, arg(ruleset.as_raw_fd()), arg(0)) < 0
        {
            fail(failure, Step::Landlock);
        }
        let empty: u64 = 0;
        let mask = libc::syscall(
            libc::SYS_rt_sigprocmask,
            arg(libc::SIG_SETMASK),
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            arg(8),
        );
        if mask < 0 {
            fail(failure, Step::SignalMask);
        }
        // As execvp: the first candidate that runs; EACCES is reported only
        // when no later one runs either; an error other than "not there"
        // stops the search.
        let mut denied = false;
        for candidate in &plan.candidates {
            libc::syscall(
                libc::SYS_execve,
                candidate.as_ptr(),
                prepared.argv.as_ptr(),
                prepared.envp.as_ptr(),
            );
            match *libc::__errno_location() {
                libc::ENOEXEC => {
                    prepared.shell_argv[1] = candidate.as_ptr();
                    libc::syscall(
                        libc::SYS_execve,
                        SHELL.as_ptr(),
                        prepared.shell_argv.as_ptr(),
                        prepared.envp.as_ptr(),
                    );
                    fail(failure, Step::Exec);
                }
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => fail(failure, Step::Exec),
            }
        }
        if denied {
            *libc::__errno_location() = libc::EACCES;
        }
        fail(failure, Step::Exec)
    }
}
