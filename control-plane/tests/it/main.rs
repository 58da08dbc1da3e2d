//! The control-plane integration tests: one binary (linked once) with a module per area.
//! A test that must own its process (it changes the environment) is a binary of its own beside this folder.

mod api_in_process;
mod bounds;
mod broker;
mod cli;
mod config_cli;
mod conversations;
mod event_log_fault;
mod fairness;
mod harness_cli;
mod harness_golden;
mod hostile_egress;
mod hostile_git;
mod hostile_local_users;
mod hostile_policy;
mod hostile_requests;
mod hostile_run_ids;
mod hostile_run_user;
mod hostile_sandbox_paths;
mod metrics;
mod provider;
mod readme;
mod reaper;
mod requests;
mod requests_cli;
mod runs;
mod sandbox_handle;
mod sandbox_lifecycle;
mod secrets;
mod server;
mod snapshot;
mod takeover;
mod toolchain;
mod transport;
mod web;
mod workspace;
