//! The operator policy: what a tenant's sandbox definition may ask for.
//! Server configuration only; nothing a tenant sends can change it. The
//! checks against a definition live with the sandboxes
//! (`sandbox::policy`); this is the settings half.
//!
//! Limits are in the units of the definition (bytes, CPUs, pids); `0`
//! means "none" for a default and "no maximum" for a maximum.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// 2 GiB: a sandbox that names no memory limit gets this one.
pub const DEFAULT_DOCKER_MEMORY_BYTES: u64 = 2 << 30;
/// 16 GiB: the most a definition may ask for unless the operator says.
pub const DEFAULT_DOCKER_MAX_MEMORY_BYTES: u64 = 16 << 30;
/// Enough for a build with parallel jobs, too few for a fork bomb to hurt
/// the host.
pub const DEFAULT_DOCKER_PIDS_LIMIT: i64 = 1024;
pub const DEFAULT_DOCKER_MAX_PIDS_LIMIT: i64 = 8192;
/// 1 GiB: the journal byte cap of a run whose definition names none.
pub const DEFAULT_JOURNAL_BYTES: u64 = 1 << 30;
/// 8 GiB: the largest journal cap a definition may name unless the
/// operator says.
pub const DEFAULT_MAX_JOURNAL_BYTES: u64 = 8 << 30;
/// The most sandboxes one definition's warm pool may keep ready unless the
/// operator says: each is a running sandbox of the host's.
pub const DEFAULT_MAX_WARM_PER_DEFINITION: u32 = 8;
/// Egress connections one sandbox may hold open at once: each is a socket
/// of the server's.
pub const DEFAULT_EGRESS_MAX_CONNECTIONS_PER_SANDBOX: u32 = 64;
/// Egress connections all of one tenant's sandboxes may hold open at once
/// on one server.
pub const DEFAULT_EGRESS_MAX_CONNECTIONS_PER_TENANT: u32 = 256;

/// A provider tenants may be allowed to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProviderName {
    Local,
    Docker,
}

impl ProviderName {
    /// The provider called `name`, if the policy knows it.
    pub fn named(name: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(name, false).ok()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Docker => "docker",
        }
    }
}

/// A container runtime Docker sandboxes may run under.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// The engine's default: a Linux container on the host's kernel.
    Runc,
    /// gVisor (`runsc`): the sandbox's system calls go to a user-space
    /// kernel; the host kernel sees only gVisor's own narrow set.
    Gvisor,
}

impl Runtime {
    /// The runtime called `name` (as definitions spell it), if known.
    pub fn named(name: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(name, false).ok()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Gvisor => "gvisor",
        }
    }

    /// The name the Docker engine knows it by (`docker info`'s runtimes;
    /// `scripts/services` registers gVisor as `runsc`).
    pub fn engine_name(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Gvisor => "runsc",
        }
    }

    /// The runtime the engine calls `name`, if Sandhold knows it.
    pub fn of_engine_name(name: &str) -> Option<Self> {
        [Self::Runc, Self::Gvisor].into_iter().find(|r| r.engine_name() == name)
    }
}

/// What the config file may set for one tenant (`[tenants.NAME]`), over
/// the server-wide setting of the same name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker_runtimes: Option<Vec<Runtime>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_runtime: Option<Runtime>,
}

/// The operator policy as configured. Serde names are the TOML keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Providers definitions may name.
    pub providers: Vec<ProviderName>,
    /// With API tokens the local provider (tenant code on this host, as
    /// the server's user) is off unless this says otherwise.
    pub allow_local_with_tokens: bool,
    /// Docker networks a definition may join besides `none` (always
    /// allowed); `*`: any. `host` and `container:*` are refused whatever
    /// this says.
    pub docker_networks: Vec<String>,
    /// Host paths under which a definition may bind-mount, read-only.
    pub docker_bind_prefixes: Vec<PathBuf>,
    /// Host paths under which a definition may bind-mount read-write (and
    /// read-only).
    pub docker_writable_bind_prefixes: Vec<PathBuf>,
    /// Named volumes a definition may mount.
    pub docker_volumes: Vec<String>,
    /// Images a definition may run: `name` allows that image at any tag or
    /// digest, an entry ending in `*` is a prefix; `*` allows any image the
    /// engine holds (Sandhold never pulls).
    pub docker_images: Vec<String>,
    pub docker_default_memory_bytes: u64,
    pub docker_max_memory_bytes: u64,
    pub docker_default_cpus: f64,
    pub docker_max_cpus: f64,
    pub docker_default_pids_limit: i64,
    pub docker_max_pids_limit: i64,
    /// The journal byte cap of a run whose definition names none. Every run
    /// has one: journals sit on disks the server needs too.
    pub default_journal_bytes: u64,
    /// The largest `max_journal_bytes` a definition may name.
    pub max_journal_bytes: u64,
    /// The most sandboxes one definition's warm pool may keep ready
    /// (`lifecycle.warm`); 0: no warm pools.
    pub max_warm_per_definition: u32,
    /// Sandbox egress (the model broker's upstreams and the proxy's
    /// allowed hosts) may reach loopback, private and link-local addresses.
    /// Off by default: a tenant listing `10.0.0.5:5432` or `127.0.0.1`
    /// would otherwise reach the operator's own network through the
    /// control plane.
    pub egress_private_addresses: bool,
    /// Hosts tenants' `network.allow_hosts` may list (same patterns:
    /// `host`, `host:port`, `*.domain`); `*`: any public host.
    pub egress_hosts: Vec<String>,
    /// Egress connections one sandbox may hold open at once (each is a
    /// socket of this server's); one more is refused.
    pub egress_max_connections_per_sandbox: u32,
    /// Egress connections all of one tenant's sandboxes may hold open at
    /// once on this server.
    pub egress_max_connections_per_tenant: u32,
    /// Container runtimes Docker definitions may name.
    pub docker_runtimes: Vec<Runtime>,
    /// Every Docker sandbox runs under this runtime: a definition naming
    /// none gets it, one naming another is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_runtime: Option<Runtime>,
    /// Per-tenant forms of the settings above (config file only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, TenantPolicy>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            providers: vec![ProviderName::Local, ProviderName::Docker],
            allow_local_with_tokens: false,
            docker_networks: Vec::new(),
            docker_bind_prefixes: Vec::new(),
            docker_writable_bind_prefixes: Vec::new(),
            docker_volumes: Vec::new(),
            docker_images: vec!["*".into()],
            docker_default_memory_bytes: DEFAULT_DOCKER_MEMORY_BYTES,
            docker_max_memory_bytes: DEFAULT_DOCKER_MAX_MEMORY_BYTES,
            docker_default_cpus: 0.0,
            docker_max_cpus: 0.0,
            docker_default_pids_limit: DEFAULT_DOCKER_PIDS_LIMIT,
            docker_max_pids_limit: DEFAULT_DOCKER_MAX_PIDS_LIMIT,
            default_journal_bytes: DEFAULT_JOURNAL_BYTES,
            max_journal_bytes: DEFAULT_MAX_JOURNAL_BYTES,
            max_warm_per_definition: DEFAULT_MAX_WARM_PER_DEFINITION,
            egress_private_addresses: false,
            egress_hosts: vec!["*".into()],
            egress_max_connections_per_sandbox: DEFAULT_EGRESS_MAX_CONNECTIONS_PER_SANDBOX,
            egress_max_connections_per_tenant: DEFAULT_EGRESS_MAX_CONNECTIONS_PER_TENANT,
            // gVisor is allowed by default: an engine without it refuses a
            // definition that asks for it, naming the fix.
            docker_runtimes: vec![Runtime::Runc, Runtime::Gvisor],
            require_runtime: None,
            tenants: BTreeMap::new(),
        }
    }
}

/// A network mode that shares a namespace of the host or of another
/// container: never a tenant's.
pub fn forbidden_network(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "host" || lower.starts_with("container:")
}

/// An absolute path without `.`, `..` or empty components, so comparing
/// components is comparing places.
pub fn plain_absolute(path: &Path) -> bool {
    path.is_absolute()
        && !path.as_os_str().as_encoded_bytes().windows(2).any(|w| w == b"//")
        && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path.as_os_str().as_encoded_bytes().split(|b| *b == b'/').all(|c| c != b"." && c != b"..")
}

impl Policy {
    /// Whether tenants may use `provider` on a server with (`tokens`) or
    /// without API tokens.
    pub fn allows_provider(&self, provider: ProviderName, tokens: bool) -> bool {
        self.providers.contains(&provider)
            && !(provider == ProviderName::Local && tokens && !self.allow_local_with_tokens)
    }

    /// The policy `tenant`'s definitions are held to: the server-wide
    /// one with the tenant's own `[tenants.NAME]` settings over it.
    pub fn for_tenant(&self, tenant: &str) -> Policy {
        let mut p = self.clone();
        if let Some(t) = self.tenants.get(tenant) {
            if let Some(runtimes) = &t.docker_runtimes {
                p.docker_runtimes = runtimes.clone();
            }
            if t.require_runtime.is_some() {
                p.require_runtime = t.require_runtime;
            }
        }
        p.tenants.clear();
        p
    }

    /// Every runtime some tenant is required to run under.
    pub fn required_runtimes(&self) -> impl Iterator<Item = Runtime> + '_ {
        self.require_runtime.into_iter().chain(self.tenants.values().filter_map(|t| t.require_runtime))
    }

    /// Settings that cannot mean anything sensible are refused at start.
    pub fn validate(&self) -> Result<(), String> {
        for (who, p) in std::iter::once(("the server", self.for_tenant("")))
            .chain(self.tenants.keys().map(|t| (t.as_str(), self.for_tenant(t))))
        {
            if let Some(r) = p.require_runtime.filter(|r| !p.docker_runtimes.contains(r)) {
                return Err(format!(
                    "{who} requires the {} runtime but does not list it among the allowed runtimes \
                     (--require-runtime, --docker-runtimes, [tenants.NAME])",
                    r.as_str()
                ));
            }
        }
        if let Some(n) = self.docker_networks.iter().find(|n| forbidden_network(n)) {
            return Err(format!(
                "docker network {n:?} would share the host's or another container's namespaces; \
                 it is never allowed (--docker-network)"
            ));
        }
        for p in self.docker_bind_prefixes.iter().chain(&self.docker_writable_bind_prefixes) {
            if !plain_absolute(p) {
                return Err(format!(
                    "bind prefix {} must be an absolute path without `.` or `..` \
                     (--docker-bind-prefix, --docker-writable-bind-prefix)",
                    p.display()
                ));
            }
        }
        let limits = [
            ("memory", self.docker_default_memory_bytes as f64, self.docker_max_memory_bytes as f64),
            ("cpus", self.docker_default_cpus, self.docker_max_cpus),
            ("pids", self.docker_default_pids_limit as f64, self.docker_max_pids_limit as f64),
        ];
        for (what, default, max) in limits {
            if !(default.is_finite() && max.is_finite()) || default < 0.0 || max < 0.0 {
                return Err(format!("the docker {what} limits must be non-negative numbers"));
            }
            if max > 0.0 && (default == 0.0 || default > max) {
                return Err(format!(
                    "the default docker {what} limit ({default}) must be set and at most its maximum ({max}) \
                     (--docker-default-*, --docker-max-*)"
                ));
            }
        }
        if self.default_journal_bytes == 0
            || self.max_journal_bytes == 0
            || self.default_journal_bytes > self.max_journal_bytes
        {
            return Err(format!(
                "the default journal cap ({}) and its maximum ({}) must be positive, the default at most the \
                 maximum (--default-journal-bytes, --max-journal-bytes)",
                self.default_journal_bytes, self.max_journal_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_runtime_settings_override_the_servers_and_must_agree() {
        let toml = "docker_runtimes = [\"runc\", \"gvisor\"]\n[tenants.acme]\nrequire_runtime = \"gvisor\"\n";
        let p: TenantPolicy = toml::from_str("require_runtime = \"gvisor\"").unwrap();
        assert_eq!(p.require_runtime, Some(Runtime::Gvisor));
        let mut policy = Policy::default();
        policy.tenants.insert("acme".into(), p);
        assert_eq!(policy.for_tenant("acme").require_runtime, Some(Runtime::Gvisor));
        assert_eq!(policy.for_tenant("other").require_runtime, None);
        assert!(policy.for_tenant("acme").tenants.is_empty());
        assert_eq!(policy.required_runtimes().collect::<Vec<_>>(), [Runtime::Gvisor]);
        assert!(policy.validate().is_ok(), "{toml}");
        policy.tenants.get_mut("acme").unwrap().docker_runtimes = Some(vec![Runtime::Runc]);
        assert!(policy.validate().unwrap_err().contains("acme requires the gvisor runtime"));
        let p = Policy {
            docker_runtimes: vec![Runtime::Runc],
            require_runtime: Some(Runtime::Gvisor),
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().contains("the server requires"));
        assert_eq!(Runtime::of_engine_name("runsc"), Some(Runtime::Gvisor));
        assert_eq!(Runtime::named("gvisor"), Some(Runtime::Gvisor));
        assert_eq!(Runtime::named("kata"), None);
    }

    #[test]
    fn host_and_container_networks_are_never_allowed() {
        for n in ["host", "HOST", "container:abc", "Container:x"] {
            assert!(forbidden_network(n), "{n}");
            let p = Policy { docker_networks: vec![n.into()], ..Default::default() };
            assert!(p.validate().unwrap_err().contains("never allowed"), "{n}");
        }
        assert!(!forbidden_network("sandnet") && !forbidden_network("none"));
        assert!(Policy::default().validate().is_ok());
    }

    #[test]
    fn prefixes_are_plain_absolute_paths() {
        assert!(plain_absolute(Path::new("/srv/data")));
        for bad in ["srv", "/srv/../etc", "/srv/./x", "/srv//x", "/srv/.."] {
            assert!(!plain_absolute(Path::new(bad)), "{bad}");
        }
        let p = Policy { docker_bind_prefixes: vec!["/a/../b".into()], ..Default::default() };
        assert!(p.validate().is_err());
    }

    #[test]
    fn the_local_provider_needs_an_opt_in_with_tokens() {
        let p = Policy::default();
        assert!(p.allows_provider(ProviderName::Local, false));
        assert!(!p.allows_provider(ProviderName::Local, true));
        assert!(p.allows_provider(ProviderName::Docker, true));
        let p = Policy { allow_local_with_tokens: true, ..Default::default() };
        assert!(p.allows_provider(ProviderName::Local, true));
        let p = Policy { providers: vec![ProviderName::Docker], allow_local_with_tokens: true, ..p };
        assert!(!p.allows_provider(ProviderName::Local, false), "not listed");
    }

    #[test]
    fn defaults_must_fit_under_their_maximum() {
        let p = Policy { docker_default_pids_limit: 9000, ..Default::default() };
        assert!(p.validate().is_err());
        let p = Policy { docker_max_cpus: 2.0, ..Default::default() };
        assert!(p.validate().is_err(), "a maximum needs a default");
        let p = Policy { docker_max_cpus: 2.0, docker_default_cpus: 1.0, ..Default::default() };
        assert!(p.validate().is_ok());
    }

    #[test]
    fn every_run_has_a_journal_cap_within_the_maximum() {
        for (default_journal_bytes, max_journal_bytes) in [(0, 1 << 30), (1 << 20, 0), (2 << 20, 1 << 20)] {
            let p = Policy { default_journal_bytes, max_journal_bytes, ..Default::default() };
            assert!(p.validate().unwrap_err().contains("--max-journal-bytes"), "{p:?}");
        }
        let p = Policy { default_journal_bytes: 1 << 20, max_journal_bytes: 1 << 20, ..Default::default() };
        assert!(p.validate().is_ok());
    }
}
