//! `EgressService`: model access brokered and an HTTP proxy, for a sandbox
//! that has no network, carried by the control plane over the agent's
//! connection (see `proto/sandhold/agent/v1/egress.proto`).
//!
//! One listener on the sandbox's 127.0.0.1 serves both: an origin-form
//! request whose auth header is a route's placeholder goes to that route's
//! upstream with the secret's value in that header only (held in the
//! agent's memory, where the run user cannot read it; TLS to the upstream
//! is the agent's own), and `CONNECT` / absolute-form `http://` requests
//! are proxied, their target checked against the `Host` header and the
//! TLS server name. Every upstream connection travels on a carrier, a
//! `Carry` stream the control plane opened ahead of time; the control plane
//! checks every destination against the sandbox's allowlist, alone decides
//! and records each attempt.
//!
//! A route made for a run is metered: the usage each answer carries is read
//! as it passes (`usage`, `metered`) and kept per run in the journal dir
//! (`ledger`), where the control plane reads it (`ReadUsage`); once the
//! run's usage reaches its budget, the broker answers the route's requests
//! itself, in the API's own error shape.

mod ask;
mod ca;
mod carrier;
mod config;
mod credential;
mod ledger;
mod listener;
mod metered;
mod service;
pub mod tls;
mod usage;

pub use carrier::DialError;
pub use config::{CONFIG_FILE, MAX_ROUTES, MIN_PLACEHOLDER};
pub use service::{CARRIER_WAIT, DIAL_TIMEOUT, Egress, Settings};
