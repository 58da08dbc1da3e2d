//! The one home of test support: outside services, the real binaries
//! (servers, the CLI, agents), Docker, local sandboxes and waits. Every
//! integration test and bench of the workspace imports from here.
//!
//! Tests that need PostgreSQL, Redis or Docker ask [`services`] for them.
//! When the service is missing they skip (plain `cargo test` on a laptop),
//! except when `SANDHOLD_REQUIRE_SERVICES=1` (set by `scripts/test`): then a
//! missing service is a failure, so CI can never pass by skipping.
//!
//! Nothing a test starts outlives it: servers stop on drop, local
//! sandboxes die with their [`local::TestDir`], Docker sandboxes with their
//! [`docker::DockerCleanup`], a test's own Docker engine with its
//! [`dockerd::Dockerd`].

pub mod agent;
pub mod attack;
pub mod auth;
pub mod bench;
pub mod cli;
pub mod cluster;
pub mod database;
pub mod docker;
pub mod dockerd;
pub mod fleet;
pub mod git_remote;
pub mod in_process;
pub mod local;
pub mod model;
pub mod provider;
pub mod run;
pub mod runtime;
pub mod sandbox;
pub mod server;
pub mod services;
pub mod tls;
pub mod tmux;
pub mod wait;

/// A short random tag (10 hex digits) that keeps the tenants, run ids and
/// containers of one test apart from every other test's.
pub fn nonce() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_string()
}
