//! `sandhold-agent init -- serve ...`: PID 1 of a container sandbox.
//!
//! A container stops when its PID 1 exits, so the agent daemon cannot be PID
//! 1 itself: a crash or a `kill -9` of the daemon would take every journaled
//! run in the sandbox with it. This small supervisor is PID 1 instead. It
//! reaps every orphan (journal shims and their commands are reparented to it
//! when they outlive their parents), restarts the daemon when it dies, and
//! on SIGTERM/SIGINT forwards the signal to the daemon and exits once it is
//! gone.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// A daemon that dies sooner than this after its start is restarted only
/// after [`RESTART_BACKOFF`], so a daemon that cannot start does not spin.
const MIN_HEALTHY_UPTIME: Duration = Duration::from_secs(2);
const RESTART_BACKOFF: Duration = Duration::from_secs(1);

fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(s);
    }
    set
}

fn start_daemon(args: &[OsString]) -> std::io::Result<(Pid, Instant)> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args);
    // SAFETY: only async-signal-safe calls between fork and exec: restore
    // the signal mask PID 1 blocked so the daemon sees its signals.
    unsafe {
        cmd.pre_exec(|| {
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None).map_err(std::io::Error::from)
        });
    }
    let child = cmd.spawn()?;
    Ok((Pid::from_raw(child.id() as i32), Instant::now()))
}

/// Run as PID 1 with `daemon_args` (e.g. `serve --listen ...`) for the
/// supervised daemon.
pub fn run(daemon_args: Vec<OsString>) -> ExitCode {
    let signals = handled_signals();
    // Outside a PID namespace (tests, the local provider) become the
    // subreaper, so orphans are reparented here just as they are to PID 1.
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer argument
    // and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&signals), None) {
        eprintln!("sandhold-agent init: blocking signals: {e}");
        return ExitCode::FAILURE;
    }
    let (mut daemon, mut started) = match start_daemon(&daemon_args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sandhold-agent init: starting the agent daemon: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stopping = false;
    loop {
        let signal = match signals.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        match signal {
            Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP => {
                stopping = true;
                let _ = kill(daemon, Signal::SIGTERM);
            }
            _ => {}
        }
        // Reap every child that has exited: the daemon, and any orphan
        // that was reparented to us.
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(status) => {
                    if status.pid() != Some(daemon) {
                        continue;
                    }
                    if stopping {
                        return ExitCode::SUCCESS;
                    }
                    eprintln!("sandhold-agent init: agent daemon exited ({status:?}), restarting");
                    if started.elapsed() < MIN_HEALTHY_UPTIME {
                        std::thread::sleep(RESTART_BACKOFF);
                    }
                    match start_daemon(&daemon_args) {
                        Ok((pid, at)) => {
                            daemon = pid;
                            started = at;
                        }
                        Err(e) => {
                            eprintln!("sandhold-agent init: restarting the agent daemon: {e}");
                            return ExitCode::FAILURE;
                        }
                    }
                }
            }
        }
    }
}
