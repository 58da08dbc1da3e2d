//! The providers a configuration allows, built once at start-up.

use std::sync::Arc;

use tracing::{info, warn};

use crate::config::ServeConfig;
use crate::provider::{
    DockerProvider, DockerProviderOptions, LocalProvider, LocalProviderOptions, ProviderKind,
};
use crate::sandbox::Providers;

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
