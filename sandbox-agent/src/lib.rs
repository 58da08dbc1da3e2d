//! `sandhold-agent`: the small binary inside each sandbox.
//!
//! It serves `sandhold.agent.v1` on a Unix socket (or loopback TCP) to the
//! control plane: processes, a persistent shell, files confined to the
//! sandbox root, run journals and file watching. Every call must carry the
//! sandbox's bearer token.

pub mod auth;
pub mod child;
pub mod cli;
pub mod confine;
pub mod fs;
pub mod info;
pub mod init;
pub mod journal;
pub mod process;
pub mod server;
pub mod shell;
pub mod shim;
pub mod snapshot;
pub mod watch;

pub use server::{AgentOptions, serve};
