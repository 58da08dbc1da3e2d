//! The providers a configuration allows, built once at start-up.

use tracing::info;

use crate::config::ServeConfig;
use crate::provider::{Kind, ProviderKind, SandboxSpec};
use crate::sandbox::{OperatorPolicy, Providers};

/// The operator policy of a server's configuration.
pub fn policy_from_config(config: &ServeConfig) -> OperatorPolicy {
    OperatorPolicy::new(config.policy.clone(), !config.single_user())
        .protecting([config.data_dir.clone()].into_iter().chain(config.toolchain_dir.clone()))
}

/// The providers a server's configuration allows: every registered provider
/// the operator policy lets tenants use (never local with API tokens unless
/// `allow_local_with_tokens`) that builds here (local: an agent binary is
/// found; docker: the engine answers and a static agent is configured). A
/// missing provider is logged, not fatal: the server still serves everything
/// else, and a request for it says why it is off. A runtime the operator
/// requires (`require_runtime`, server-wide or for a tenant) that the
/// Docker engine lacks is fatal: the server would otherwise refuse every
/// Docker sandbox of those tenants, one ensure at a time.
pub async fn providers_from_config(config: &ServeConfig) -> anyhow::Result<Providers> {
    let policy = policy_from_config(config);
    let mut providers = Providers::new();
    for kind in ProviderKind::all() {
        if let Some(why) = policy.provider_refusal(kind) {
            info!("{kind} provider off: {why}");
            providers = providers.without(kind, why);
            continue;
        }
        providers = match kind.kind().build(config).await {
            Ok(p) => providers.with(p),
            Err(why) => providers.without(kind, why),
        };
    }
    let docker = ProviderKind::named(crate::provider::docker::KIND.name());
    if let Some(docker) = docker.and_then(|kind| providers.get(kind).ok()) {
        for runtime in config.policy.required_runtimes() {
            let mut spec = SandboxSpec::default();
            spec.docker.runtime = Some(runtime);
            docker.supports(&spec).await.map_err(|e| {
                anyhow::anyhow!(
                    "the operator policy requires the {} runtime (require_runtime): {e}",
                    runtime.as_str()
                )
            })?;
        }
    }
    Ok(providers)
}
