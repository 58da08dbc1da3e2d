//! The Sandhold control plane: the public gRPC API, stores, leases,
//! providers, harness adapters and the run driver.

pub mod agent;
pub mod allocator;
pub mod api;
pub mod auth;
pub mod cli;
pub mod config;
pub mod context;
pub mod egress;
pub mod harness;
pub mod lease;
pub mod metrics;
pub mod node;
pub mod provider;
pub mod provision;
pub mod reaper;
pub mod runs;
pub mod sandbox;
pub mod server;
pub mod snapshot;
pub mod store;
pub mod telemetry;
pub mod toolchain;
pub mod tunnel;
pub mod workspace;
