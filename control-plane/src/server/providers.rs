//! The providers a configuration allows, built once at start-up.

use std::sync::Arc;

use tracing::{info, warn};

use crate::config::{ProviderName, ServeConfig};
use crate::provider::{
    DockerProvider, DockerProviderOptions, LocalProvider, LocalProviderOptions, ProviderKind,
};
use crate::sandbox::{OperatorPolicy, Providers};

/// The operator policy of a server's configuration.
pub fn policy_from_config(config: &ServeConfig) -> OperatorPolicy {
    OperatorPolicy::new(config.policy.clone(), !config.single_user())
        .protecting([config.data_dir.clone()].into_iter().chain(config.toolchain_dir.clone()))
}

/// The providers a server's configuration allows: those the operator
/// policy lets tenants use (never local with API tokens unless
/// `allow_local_with_tokens`), local when an agent binary is found, Docker
/// when the engine answers and a static agent is configured. A missing
/// provider is logged, not fatal: the server still serves everything else.
pub async fn providers_from_config(config: &ServeConfig) -> Providers {
    let policy = policy_from_config(config);
    let mut providers = Providers::new();
    if let Some(why) = policy.provider_refusal(ProviderName::Local) {
        info!("local provider off: {why}");
        providers = providers.without(ProviderKind::Local, why);
    } else {
        let mut local = LocalProviderOptions::new(&config.data_dir);
        local.agent_binary = config.agent_binary.clone();
        match LocalProvider::new(local) {
            Ok(p) if !config.single_user() => {
                warn!(
                    "local provider enabled with API tokens (allow_local_with_tokens): every tenant can run code                      on this host as this server's user, read its environment and files"
                );
                providers = providers.with(Arc::new(p));
            }
            Ok(p) => {
                warn!(
                    "local provider enabled: its sandboxes are NOT isolated from this host (development only)"
                );
                providers = providers.with(Arc::new(p));
            }
            Err(e) => {
                warn!(error = %e, "local provider unavailable");
                providers = providers.without(ProviderKind::Local, e.to_string());
            }
        }
    }
    if let Some(why) = policy.provider_refusal(ProviderName::Docker) {
        info!("docker provider off: {why}");
        return providers.without(ProviderKind::Docker, why);
    }
    // Configured, else the configured agent when it is static itself, else
    // where `scripts/build-agent-static` puts one.
    let static_agent = config
        .agent_static_binary
        .clone()
        .or_else(|| config.agent_binary.clone().filter(|p| crate::provider::is_static_executable(p)))
        .or_else(crate::provider::default_static_agent_binary);
    match static_agent {
        None => {
            info!("docker provider disabled: no static sandhold-agent found");
            providers = providers.without(
                ProviderKind::Docker,
                "no static sandhold-agent was found (containers need one: it runs in images without a libc). \
                 Run `scripts/build-agent-static` in the checkout this sandhold was built from (it puts the \
                 agent where sandhold looks), or set --agent-static-binary / SANDHOLD_AGENT_STATIC_BINARY",
            );
        }
        Some(agent) => {
            let mut options = DockerProviderOptions::new(agent, config.data_dir.join("docker"));
            options.toolchain_dir = config.toolchain_dir.clone();
            match DockerProvider::connect(options).await {
                Ok(p) => providers = providers.with(Arc::new(p)),
                Err(e) => {
                    warn!(error = %e, "docker provider unavailable");
                    providers = providers.without(ProviderKind::Docker, e.to_string());
                }
            }
        }
    }
    providers
}
