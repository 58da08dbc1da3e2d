//! Sandboxes as the public API sees them: definitions per tenant, the
//! lifecycle that ensures a sandbox for a thread (resume → restore the
//! native snapshot → create and provision, one at a time per sandbox key),
//! and what an ensure is asked for. [`Sandboxes`] holds the operations of
//! the public API (definitions, ensure, describe, destroy, a live
//! sandbox's processes and files, a named checkpoint), each failing with
//! [`Error`], as does the lifecycle below them; the `SandboxService` in
//! front of it is the `api::sandbox` adapter, the one place it becomes a
//! status.
//!
//! Secrets: values arrive with `EnsureSandbox` / `Exec`, live in memory for
//! the live sandbox (as [`shared::secret::Secret`]), go to the agent as the
//! environment of each call, and are never stored, logged, or put in a
//! progress event or error (setup output is redacted).

pub mod definition;
pub mod ensure;
pub mod key;
pub mod lifecycle;
pub mod policy;
pub mod quota;
mod run_policy;

mod checkpoint;
mod error;
mod files;
mod git;
mod gone;
mod network;
mod observe;
mod placement;
mod ports;
mod process;
mod run_path;
mod run_sandbox;
mod sandboxes;
mod warm;
mod warm_held;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use ensure::ensure_input;
pub use error::Error;
pub use files::{ReadFileStream, WatchStream};
pub use lifecycle::{EnsureInput, Lifecycle, Providers};
pub use policy::OperatorPolicy;
pub use ports::PortEvents;
pub use process::{ExecEvents, TerminalEvents};
pub use quota::SandboxQuota;
pub use run_policy::{policy_from_api, policy_to_api};
pub use run_sandbox::RunSandbox;
pub use sandboxes::{EnsureStream, Sandboxes};
pub use warm::run_warm_keeper;

/// How often idle sandboxes are looked for.
const IDLE_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Stop sandboxes idle past their `keep_alive` until `shutdown`.
pub async fn run_idle_sweeper(lifecycle: Lifecycle, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(IDLE_SWEEP_EVERY) => lifecycle.stop_idle().await,
        }
    }
}
