//! The control plane's gRPC server: health, reflection, the public
//! services behind tenant auth, readiness, and graceful shutdown.
//!
//! Lifecycle: bind (refusing a non-loopback address without tokens, or
//! with tokens but neither TLS nor `insecure_listen`), serve
//! at once with health NOT_SERVING ([`start`]), open the stores and leases
//! in the background (retrying), then SERVING ([`ready`]). On shutdown
//! ([`shutdown`]): NOT_SERVING, release leases, stop accepting, drain
//! in-flight calls within a time box, close the stores. Unary calls have
//! deadlines ([`deadline`]); each call of the API is a span ([`spans`]).
//! Browsers reach the same services through gRPC-Web on the same port, and
//! get the web console for plain `GET`s ([`web`], [`console`]).

mod activity;
mod built;
mod console;
mod deadline;
mod gate;
mod health;
mod providers;
mod ready;
mod shutdown;
mod spans;
mod start;
mod tls;
mod web;

pub use providers::providers_from_config;
pub use start::{Listening, RunningServer, serve, start};
