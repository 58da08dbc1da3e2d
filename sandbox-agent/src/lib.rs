//! `sandhold-agent`: the small binary inside each sandbox.
//!
//! It serves `sandhold.agent.v1` on a Unix socket (or loopback TCP) to the
//! control plane: processes, a persistent shell, files confined to the
//! sandbox root, run journals and file watching. Every call must carry the
//! sandbox's bearer token.

// Bottom to top: a module imports only modules declared before it.
// Mechanisms and settings:
pub mod acp;
pub mod auth;
pub mod child;
pub mod confine;
pub mod git;
pub mod init;
pub mod isolation;
pub mod mcp;
pub mod options;
pub mod request_dir;
pub mod run_user;
pub mod shim;
pub mod spawner;
pub mod vault;
// What the services share:
pub mod context;
// The services (one per gRPC service, none importing another):
pub mod egress;
pub mod fs;
pub mod info;
pub mod journal;
pub mod port;
pub mod process;
pub mod requests;
pub mod secrets;
pub mod shell;
pub mod snapshot;
pub mod watch;
// Assembly:
pub mod server;
// The command line (above everything; `main.rs` calls it):
pub mod cli;

// In-process gRPC for the services' unit tests.
#[cfg(test)]
mod testing;

pub use options::AgentOptions;
pub use server::serve;
