//! `ShellService`: a persistent shell per session, which workspace setup runs
//! on.
//!
//! The shell (bash when installed, else `/bin/sh`; busybox `sh` works too)
//! reads commands from a pipe. Each command is sent as one line:
//!
//! ```text
//! { command eval '<command>'; } </dev/null 3>&-; command printf '%s %d\n' <nonce> "$?" >&3;
//! command printf '%s' <marker>; command printf '%s' <marker> >&2
//! ```
//!
//! - `eval` in a brace group runs in the shell itself, so `cd`, `export` and
//!   variables hold for the next command; `command eval` keeps a syntax
//!   error from ending a POSIX shell (it is a special built-in).
//! - The command's stdin is `/dev/null`, never the control pipe, so a
//!   command that reads stdin cannot eat the commands that follow.
//! - The exit status goes to fd 3, a pipe only the shell holds (the command
//!   runs with fd 3 closed), tagged with a fresh random nonce.
//! - A fresh random marker ends the command's output on stdout and on
//!   stderr; a command cannot print it, because it never sees it. Output
//!   after the marker (a background job) is dropped.
//! - A timeout SIGKILLs every process of the shell's process group except
//!   the shell (the shell runs without job control, so its commands and
//!   background jobs are in its group): the shell survives with its state
//!   and reports status 137. A shell that still does not answer (a built-in
//!   loop) is killed and reported as exited.
//!
//! `RunParallel` captures the shell's cwd (`/proc/<pid>/cwd`) and exported
//! environment (`env -0`) and starts each command as its own child in its own
//! process group from that state.

mod marker;
mod service;
mod session;

pub use service::Shells;
pub use session::{DEFAULT_COMMAND_TIMEOUT, OUTPUT_TAIL_BYTES, ShellSessions};
