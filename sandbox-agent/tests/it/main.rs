//! The sandbox-agent integration tests: one binary (linked once) with a module per area.

mod egress;
mod fs;
mod info_auth;
mod init;
mod isolation;
mod journal;
mod process;
mod requests;
mod shell;
mod snapshot;
mod watch;
