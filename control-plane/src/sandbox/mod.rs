//! Sandboxes as the public API sees them: definitions per tenant, the
//! lifecycle that ensures a sandbox for a thread (resume → restore the
//! native snapshot → create and provision, one at a time per sandbox key),
//! and the `SandboxService` that proxies a live sandbox's agent.
//!
//! Secrets: values arrive with `EnsureSandbox` / `Exec`, live in memory for
//! the live sandbox (as [`shared::secret::Secret`]), go to the agent as the
//! environment of each call, and are never stored, logged, or put in a
//! progress event or error (setup output is redacted).

pub mod definition;
pub mod key;
pub mod lifecycle;
pub mod progress;
pub mod provision;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use lifecycle::{EnsureInput, Lifecycle, Providers};
pub use provision::Provisioner;
pub use provision::Secrets;
pub use service::SandboxApi;

use crate::config::ServeConfig;
use crate::provider::{
    DockerProvider, DockerProviderOptions, LocalProvider, LocalProviderOptions, ProviderKind,
};

/// How often idle sandboxes are looked for.
const IDLE_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The providers a server's configuration allows: local whenever an agent
/// binary is found, Docker when the engine answers and a static agent is
/// configured. A missing provider is logged, not fatal: the server still
/// serves everything else.
pub async fn providers_from_config(config: &ServeConfig) -> Providers {
    let mut providers = Providers::new();
    let mut local = LocalProviderOptions::new(&config.data_dir);
    local.agent_binary = config.agent_binary.clone();
    match LocalProvider::new(local) {
        Ok(p) => {
            warn!("local provider enabled: its sandboxes are NOT isolated from this host (development only)");
            providers = providers.with(Arc::new(p));
        }
        Err(e) => {
            warn!(error = %e.message, "local provider unavailable");
            providers = providers.without(ProviderKind::Local, e.message);
        }
    }
    let static_agent = config.agent_static_binary.clone().or_else(|| config.agent_binary.clone());
    match static_agent {
        None => {
            info!("docker provider disabled: no --agent-static-binary configured");
            providers = providers.without(
                ProviderKind::Docker,
                "no static agent is configured (--agent-static-binary / SANDHOLD_AGENT_STATIC_BINARY; \
                 build one with scripts/build-agent-static)",
            );
        }
        Some(agent) => {
            let options = DockerProviderOptions::new(agent, config.data_dir.join("docker"));
            match DockerProvider::connect(options).await {
                Ok(p) => providers = providers.with(Arc::new(p)),
                Err(e) => {
                    warn!(error = %e.message, "docker provider unavailable");
                    providers = providers.without(ProviderKind::Docker, e.message);
                }
            }
        }
    }
    providers
}

/// Stop sandboxes idle past their `keep_alive` until `shutdown`.
pub async fn run_idle_sweeper(lifecycle: Lifecycle, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(IDLE_SWEEP_EVERY) => lifecycle.stop_idle().await,
        }
    }
}
