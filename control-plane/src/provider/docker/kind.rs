//! The `docker` provider as the server knows it before any sandbox exists:
//! how it reads `provider.docker` of a definition, the operator's checks of
//! it, its part of the sandbox key, and how it is built from the server's
//! configuration.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use shared::proto::v1::{DockerProvider as Section, provider_spec};
use tracing::{info, warn};

use super::{DockerOptions, DockerProvider, DockerProviderOptions, MountSpec, policy};
use crate::config::{Policy, Runtime, ServeConfig};
use crate::provider::{Built, Canon, Kind, SandboxSpec, Violation};

pub struct Docker;

/// The `docker` provider's registration.
pub static KIND: Docker = Docker;

fn section(s: &provider_spec::Provider) -> Option<&Section> {
    match s {
        provider_spec::Provider::Docker(d) => Some(d),
        _ => None,
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

impl Kind for Docker {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn reads(&self, s: &provider_spec::Provider) -> bool {
        section(s).is_some()
    }

    fn validate(&self, s: &provider_spec::Provider, out: &mut Vec<Violation>) {
        let Some(docker) = section(s) else { return };
        let mut bad = |field: &str, why: &str| out.push((field.to_string(), why.to_string()));
        if docker.image.is_empty() {
            bad("definition.provider.docker.image", "required");
        }
        if docker.cpus < 0.0 || !docker.cpus.is_finite() {
            bad("definition.provider.docker.cpus", "must be a non-negative number");
        }
        if docker.pids_limit < 0 {
            bad("definition.provider.docker.pids_limit", "must not be negative");
        }
        if !docker.workdir.is_empty()
            && let Some(why) = super::workdir_violation(&docker.workdir)
        {
            bad("definition.provider.docker.workdir", &why);
        }
        if !docker.runtime.is_empty() && Runtime::named(&docker.runtime).is_none() {
            bad("definition.provider.docker.runtime", "must be \"runc\" or \"gvisor\"");
        }
        for (i, m) in docker.mounts.iter().enumerate() {
            if m.source.is_empty() || !m.target.starts_with('/') {
                bad(
                    &format!("definition.provider.docker.mounts[{i}]"),
                    "needs a source and an absolute target",
                );
            }
        }
    }

    fn violations(&self, s: &provider_spec::Provider, p: &Policy, on_host: bool, out: &mut Vec<Violation>) {
        if let Some(docker) = section(s) {
            policy::violations(docker, p, on_host, out);
        }
    }

    fn host_paths(&self, s: &provider_spec::Provider) -> Vec<(String, PathBuf)> {
        let Some(docker) = section(s) else { return Vec::new() };
        docker
            .mounts
            .iter()
            .enumerate()
            .filter(|(_, m)| m.source.starts_with('/'))
            .map(|(i, m)| (format!("definition.provider.docker.mounts[{i}]"), PathBuf::from(&m.source)))
            .collect()
    }

    fn configure(&self, s: &provider_spec::Provider, p: &Policy, spec: &mut SandboxSpec) {
        if let Some(d) = section(s) {
            spec.docker = DockerOptions {
                image: non_empty(&d.image),
                user: non_empty(&d.user),
                workdir: non_empty(&d.workdir),
                memory_bytes: (d.memory_bytes > 0).then(|| i64::try_from(d.memory_bytes).unwrap_or(i64::MAX)),
                cpus: (d.cpus > 0.0).then_some(d.cpus),
                pids_limit: (d.pids_limit > 0).then_some(d.pids_limit),
                read_only_root: d.read_only_root,
                network: non_empty(&d.network),
                mounts: d
                    .mounts
                    .iter()
                    .map(|m| MountSpec {
                        source: m.source.clone(),
                        target: m.target.clone(),
                        read_only: m.read_only,
                    })
                    .collect(),
                runtime: None,
            };
        }
        spec.docker.runtime = policy::runtime(section(s), p);
        policy::apply_limits(p, &mut spec.docker);
    }

    fn key(&self, s: &provider_spec::Provider, c: &mut Canon) {
        if let Some(d) = section(s) {
            c.nested("docker", canon(d));
        }
    }

    fn describe(&self, s: &provider_spec::Provider) -> String {
        match section(s) {
            Some(docker) => {
                let mut text = format!("docker {}", docker.image);
                if !docker.network.is_empty() {
                    text.push_str(&format!(" (network {})", docker.network));
                }
                if !docker.runtime.is_empty() {
                    text.push_str(&format!(" under {}", docker.runtime));
                }
                text
            }
            None => self.name().to_string(),
        }
    }

    fn detail(&self, s: &provider_spec::Provider) -> String {
        section(s).map(|d| d.image.clone()).unwrap_or_default()
    }

    fn toolchain_root(&self, _host_root: &Path) -> String {
        crate::toolchain::MOUNT.to_string()
    }

    fn build(&self, config: &ServeConfig) -> Built {
        // Configured, else the configured agent when it is static itself, else
        // where `scripts/build-agent-static` puts one.
        let static_agent = config
            .agent_static_binary
            .clone()
            .or_else(|| config.agent_binary.clone().filter(|p| crate::provider::is_static_executable(p)))
            .or_else(crate::provider::default_static_agent_binary);
        let options = static_agent.map(|agent| {
            let mut options = DockerProviderOptions::new(agent, config.data_dir.join("docker"));
            options.toolchain_dir = config.toolchain_dir.clone();
            options
        });
        Box::pin(async move {
            let Some(options) = options else {
                info!("docker provider disabled: no static sandhold-agent found");
                return Err("no static sandhold-agent was found (containers need one: it runs in images without a \
                            libc). Run `scripts/build-agent-static` in the checkout this sandhold was built from \
                            (it puts the agent where sandhold looks), or set --agent-static-binary / \
                            SANDHOLD_AGENT_STATIC_BINARY; a server looks once, when it starts, so restart it \
                            afterwards (your background server: `sandhold daemon stop`)"
                    .to_string());
            };
            match DockerProvider::connect(options).await {
                Ok(p) => Ok(Arc::new(p) as Arc<dyn crate::provider::Provider>),
                Err(e) => {
                    warn!(error = %e, "docker provider unavailable");
                    Err(e.to_string())
                }
            }
        })
    }
}

/// `provider.docker` in a sandbox key.
fn canon(d: &Section) -> Canon {
    let mut c = Canon::default();
    c.str("image", &d.image)
        .str("user", &d.user)
        .str("workdir", &d.workdir)
        .num("memory_bytes", d.memory_bytes)
        // Bits, not a decimal rendering: 1.5 and 1.50 are the same f64.
        .num("cpus", d.cpus.to_bits())
        .num("pids_limit", d.pids_limit)
        .num("read_only_root", d.read_only_root)
        .list("mounts", &d.mounts, |m| {
            let mut i = Canon::default();
            i.str("source", &m.source).str("target", &m.target).num("read_only", m.read_only);
            i
        })
        .str("network", &d.network);
    // Only when named, so the keys of sandboxes made before runtimes
    // existed do not change.
    if !d.runtime.is_empty() {
        c.str("runtime", &d.runtime);
    }
    c
}
