//! The resolved settings of a server: [`ServeConfig`], its defaults, the
//! merge of the layers onto them, and its printed (redacted) form.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::Serialized;
use serde::{Deserialize, Serialize, Serializer};
use shared::secret::Secret;

use super::options::millis;
use super::{
    ConfigLayer, LeaseOptions, Policy, QuietGate, Quotas, ReaperOptions, SnapshotLimits,
    default_database_url, redact_url,
};

/// Default listen address: loopback only, so a fresh install is never
/// reachable from the network without tokens.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7443";
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
/// How long a silent node is waited for before its sandboxes are given up.
pub const DEFAULT_NODE_GRACE_MS: u64 = 120_000;
pub const DEFAULT_LOG_FILTER: &str = "info";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// An API token and the tenant it authenticates. Serializes with the token
/// `[redacted]`; deserializes from `{ tenant, token }` (a `[[tokens]]` table).
#[derive(Clone, Debug, Serialize)]
pub struct ApiToken {
    pub tenant: String,
    pub token: Secret,
}

impl std::str::FromStr for ApiToken {
    type Err = String;

    /// `TENANT=TOKEN`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (tenant, token) =
            s.split_once('=').ok_or_else(|| "expected TENANT=TOKEN (e.g. acme=s3cr3t)".to_string())?;
        ApiToken::new(tenant, token)
    }
}

impl ApiToken {
    pub fn new(tenant: &str, token: &str) -> Result<Self, String> {
        let tenant = tenant.trim();
        if tenant.is_empty() || !tenant.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(format!(
                "tenant {tenant:?} must be non-empty ASCII letters, digits, '-', '_' or '.'"
            ));
        }
        if token.len() < 8 {
            return Err(format!("the token of tenant {tenant:?} is shorter than 8 characters"));
        }
        Ok(Self { tenant: tenant.to_string(), token: Secret::new(token) })
    }
}

impl<'de> Deserialize<'de> for ApiToken {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct FileToken {
            tenant: String,
            token: String,
        }
        let t = FileToken::deserialize(d)?;
        ApiToken::new(&t.tenant, &t.token).map_err(serde::de::Error::custom)
    }
}

/// The resolved configuration of a server. Serde names are the TOML keys:
/// it deserializes from the merged layers and serializes (secrets
/// redacted) as `--print-config` output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// Listen on this Unix socket instead of `listen`: the per-user
    /// background server's (`sandhold daemon`), never a setting.
    #[serde(skip)]
    pub listen_unix: Option<PathBuf>,
    /// Where Prometheus scrapes `/metrics`; `None`: no metrics endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    pub data_dir: PathBuf,
    /// May carry a password: print through [`redact_url`]. Empty only in
    /// the defaults, where it follows `data_dir` once the layers are merged.
    #[serde(default, skip_serializing_if = "String::is_empty", serialize_with = "redacted_url")]
    pub database_url: String,
    /// `None`: in-process leases (single server).
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "redacted_optional_url")]
    pub redis_url: Option<String>,
    #[serde(rename = "lease_ttl_ms", with = "millis")]
    pub lease_ttl: Duration,
    #[serde(rename = "lease_renew_ms", with = "millis")]
    pub lease_renew_every: Duration,
    /// A takeover's wait for the stored log to stop growing (0: none).
    #[serde(flatten)]
    pub takeover_quiet: QuietGate,
    pub log_format: LogFormat,
    pub log_filter: String,
    /// Identifies this replica in `GetServerInfo` and logs.
    pub replica_id: String,
    /// Time box for draining in-flight calls at shutdown.
    #[serde(rename = "shutdown_grace_ms", with = "millis")]
    pub shutdown_grace: Duration,
    /// The `sandhold-agent` of local sandboxes; `None`: next to this
    /// executable, else on `PATH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_binary: Option<PathBuf>,
    /// Harness CLIs for sandboxes. Empty only in the defaults, where it
    /// follows `data_dir` (`<data_dir>/toolchains`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolchain_dir: Option<PathBuf>,
    /// The statically linked agent copied into Docker sandboxes; `None`:
    /// where `scripts/build-agent-static` puts one, else `agent_binary` if
    /// static, and without either the Docker provider is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_static_binary: Option<PathBuf>,
    /// The reaper: schedule, TTL and bounds of a sweep.
    #[serde(flatten)]
    pub reaper: ReaperOptions,
    /// Tenants whose `AdminService.Sweep` covers every tenant (operators);
    /// anyone else's covers only their own.
    pub operator_tenants: Vec<String>,
    /// More API tokens, read from this file at start (see [`super::tokens_file`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_file: Option<PathBuf>,
    /// TLS certificate chain and key (PEM) of the gRPC listener; both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// The token nodes present to join; `None`: no node may join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_join_token_file: Option<PathBuf>,
    /// This control plane's identity towards nodes and the nodes' CA (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_tls_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_tls_key: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_tls_ca: Option<PathBuf>,
    /// A node silent this long is lost.
    #[serde(rename = "node_grace_ms", with = "millis")]
    pub node_grace: Duration,
    /// Tokens in plain text beyond loopback are allowed (the operator's call).
    #[serde(default)]
    pub insecure_listen: bool,
    /// Browser origins besides the server's own that may call the API
    /// through gRPC-Web (normalized; `*`: any). Empty: same origin only.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// Host names besides loopback a server without tokens answers to
    /// (normalized). Empty: loopback names only.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// What tenants' definitions may ask for (providers, Docker options,
    /// limits).
    #[serde(flatten)]
    pub policy: Policy,
    /// How many sandboxes and running runs one tenant may hold.
    #[serde(flatten)]
    pub quotas: Quotas,
    /// How large one file of a portable snapshot, and one snapshot, may be.
    #[serde(flatten)]
    pub snapshot_limits: SnapshotLimits,
    /// The `[[tokens]]` of the config file, or SANDHOLD_TOKENS. With
    /// `file_tokens` empty too: single-user mode (loopback only).
    pub tokens: Vec<ApiToken>,
    /// The tokens of `tokens_file` (printed as the file's path, not here).
    #[serde(skip)]
    pub file_tokens: Vec<ApiToken>,
}

/// Where the TLS certificate and key of the gRPC listener are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The user's data directory for Sandhold (e.g. `~/.local/share/sandhold`).
pub fn default_data_dir() -> PathBuf {
    dirs::data_dir()
        .or_else(|| dirs::home_dir().map(|h| h.join(".local/share")))
        .unwrap_or_else(|| ".".into())
        .join("sandhold")
}

impl ServeConfig {
    /// The bottom layer: every default (the database URL excepted, see
    /// [`ServeConfig::database_url`]).
    fn defaults() -> Self {
        let lease = LeaseOptions::default();
        ServeConfig {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            listen_unix: None,
            metrics_listen: None,
            data_dir: default_data_dir(),
            database_url: String::new(),
            redis_url: None,
            lease_ttl: lease.ttl,
            lease_renew_every: lease.renew_every,
            takeover_quiet: QuietGate::default(),
            log_format: LogFormat::default(),
            log_filter: DEFAULT_LOG_FILTER.into(),
            replica_id: default_replica_id(),
            shutdown_grace: Duration::from_millis(DEFAULT_SHUTDOWN_GRACE_MS),
            agent_binary: None,
            agent_static_binary: None,
            toolchain_dir: None,
            reaper: ReaperOptions::default(),
            operator_tenants: Vec::new(),
            tokens_file: None,
            tls_cert: None,
            tls_key: None,
            node_join_token_file: None,
            node_tls_cert: None,
            node_tls_key: None,
            node_tls_ca: None,
            node_grace: Duration::from_millis(DEFAULT_NODE_GRACE_MS),
            insecure_listen: false,
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            policy: Policy::default(),
            quotas: Quotas::default(),
            snapshot_limits: SnapshotLimits::default(),
            tokens: Vec::new(),
            file_tokens: Vec::new(),
        }
    }

    /// The defaults overridden by `layer` (itself the file overridden by
    /// the environment and flags), checked.
    pub fn resolve(layer: ConfigLayer) -> anyhow::Result<Self> {
        let figment =
            Figment::from(Serialized::defaults(Self::defaults())).merge(Serialized::defaults(layer));
        let mut config: ServeConfig = figment.extract().context("merging the configuration layers")?;
        if !figment.contains("database_url") {
            config.database_url = default_database_url(&config.data_dir);
        }
        if config.toolchain_dir.is_none() {
            config.toolchain_dir = Some(config.data_dir.join("toolchains"));
        }
        config.redis_url = config.redis_url.filter(|u| !u.is_empty());
        config.reaper.validate().map_err(|e| anyhow::anyhow!(e))?;
        config.takeover_quiet.validate().map_err(|e| anyhow::anyhow!(e))?;
        config.policy.validate().map_err(|e| anyhow::anyhow!("invalid operator policy: {e}"))?;
        config.lease_options().check().map_err(|e| {
            anyhow::anyhow!("invalid lease configuration: {e} (--lease-ttl-ms, --lease-renew-ms)")
        })?;
        if config.tls_cert.is_some() != config.tls_key.is_some() {
            bail!(
                "TLS needs both a certificate and a key (--tls-cert and --tls-key, or tls_cert and tls_key)"
            );
        }
        let node_tls = [&config.node_tls_cert, &config.node_tls_key, &config.node_tls_ca];
        if node_tls.iter().any(|f| f.is_some()) && !node_tls.iter().all(|f| f.is_some()) {
            bail!("nodes need all of --node-tls-cert, --node-tls-key and --node-tls-ca");
        }
        if config.node_join_token_file.is_some() && config.node_tls_cert.is_none() {
            bail!(
                "--node-join-token-file lets nodes join, which needs --node-tls-cert, --node-tls-key and \
                 --node-tls-ca (the control plane dials nodes with mutual TLS)"
            );
        }
        config.cors_origins = normalized(
            &config.cors_origins,
            super::normalize_origin,
            "--cors-origin, SANDHOLD_CORS_ORIGINS, cors_origins",
        )?;
        config.allowed_hosts = normalized(
            &config.allowed_hosts,
            super::normalize_host,
            "--allowed-host, SANDHOLD_ALLOWED_HOSTS, allowed_hosts",
        )?;
        if let Some(path) = &config.tokens_file {
            config.file_tokens = super::tokens_file::read(path)?;
        }
        let mut seen = HashSet::new();
        for t in config.all_tokens() {
            if !seen.insert(t.token.expose()) {
                bail!("the same API token is configured twice (tenant {:?})", t.tenant);
            }
        }
        Ok(config)
    }

    pub fn lease_options(&self) -> LeaseOptions {
        LeaseOptions { ttl: self.lease_ttl, renew_every: self.lease_renew_every, ..LeaseOptions::default() }
    }

    /// Single-user mode: no tokens, every caller is tenant `default`.
    pub fn single_user(&self) -> bool {
        self.all_tokens().next().is_none()
    }

    /// Every API token: the configured ones, then the tokens file's.
    pub fn all_tokens(&self) -> impl Iterator<Item = &ApiToken> {
        self.tokens.iter().chain(&self.file_tokens)
    }

    /// The TLS files of the gRPC listener; `None`: plain text.
    pub fn tls(&self) -> Option<TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert: cert.clone(), key: key.clone() }),
            _ => None,
        }
    }

    /// The merged configuration as TOML, loadable again with `--config`,
    /// with every secret replaced by `[redacted]`.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string(self).expect("config serializes to TOML")
    }
}

/// The non-blank entries of a list setting, normalized; an error names
/// where the setting comes from.
fn normalized(
    values: &[String],
    normalize: fn(&str) -> Result<String, String>,
    names: &str,
) -> anyhow::Result<Vec<String>> {
    values
        .iter()
        .filter(|v| !v.trim().is_empty())
        .map(|v| normalize(v))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{e} ({names})"))
}

fn redacted_url<S: Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&redact_url(url))
}

fn redacted_optional_url<S: Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(url) => s.serialize_some(&redact_url(url)),
        None => s.serialize_none(),
    }
}

fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    if host.is_empty() { format!("replica-{suffix}") } else { format!("{host}-{suffix}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_layers_win_field_by_field() {
        let file: ConfigLayer = toml::from_str(
            "listen = \"127.0.0.1:1000\"\nlease_ttl_ms = 12000\n[[tokens]]\ntenant = \"a\"\ntoken = \"token-aaaa\"\n",
        )
        .unwrap();
        let flags = ConfigLayer { listen: Some("127.0.0.1:2000".parse().unwrap()), ..Default::default() };
        let merged = ServeConfig::resolve(file.merge(flags)).unwrap();
        assert_eq!(merged.listen.port(), 2000);
        assert_eq!(merged.lease_ttl, Duration::from_millis(12000));
        assert_eq!(merged.tokens.len(), 1);
        assert_eq!(merged.tokens[0].tenant, "a");
    }

    #[test]
    fn defaults_put_sqlite_under_the_data_dir() {
        let layer = ConfigLayer { data_dir: Some("/srv/sh".into()), ..Default::default() };
        let c = ServeConfig::resolve(layer).unwrap();
        assert_eq!(c.database_url, "sqlite:///srv/sh/sandhold.db");
        assert!(c.listen.ip().is_loopback());
        assert!(c.redis_url.is_none());
        assert!(c.single_user());
    }

    #[test]
    fn the_takeover_quiet_window_is_off_unless_set_and_needs_a_longer_bound() {
        let c = ServeConfig::resolve(ConfigLayer::default()).unwrap();
        assert!(c.takeover_quiet.window.is_zero());
        let file: ConfigLayer =
            toml::from_str("takeover_quiet_ms = 2000\ntakeover_quiet_max_ms = 9000\n").unwrap();
        let c = ServeConfig::resolve(file).unwrap();
        assert_eq!(c.takeover_quiet.window, Duration::from_secs(2));
        assert_eq!(c.takeover_quiet.max_wait, Duration::from_secs(9));
        assert!(c.to_redacted_toml().contains("takeover_quiet_ms = 2000"));
        let layer = ConfigLayer { takeover_quiet_ms: Some(40_000), ..Default::default() };
        let err = ServeConfig::resolve(layer).unwrap_err().to_string();
        assert!(err.contains("--takeover-quiet-max-ms"), "{err}");
    }

    #[test]
    fn bad_settings_are_refused() {
        let layer = ConfigLayer { lease_ttl_ms: Some(1000), lease_renew_ms: Some(900), ..Default::default() };
        assert!(ServeConfig::resolve(layer).is_err());
        assert!("no-equals".parse::<ApiToken>().is_err());
        assert!("a=short".parse::<ApiToken>().is_err());
        assert!("bad tenant=long-enough".parse::<ApiToken>().is_err());
        assert!(toml::from_str::<ConfigLayer>("unknown_key = 1").is_err());
        let layer = ConfigLayer { detached_run_ttl_ms: Some(0), ..Default::default() };
        assert!(ServeConfig::resolve(layer).is_err(), "a zero detached-run TTL would expire every run");
        let layer = ConfigLayer { sweep_run_budget_ms: Some(0), ..Default::default() };
        assert!(ServeConfig::resolve(layer).is_err());
    }

    #[test]
    fn the_operator_policy_layers_prints_and_refuses_host_networks() {
        let file: ConfigLayer =
            toml::from_str("docker_networks = [\"sandnet\"]\ndocker_bind_prefixes = [\"/srv/ro\"]\n")
                .unwrap();
        let flags = ConfigLayer { allow_local_with_tokens: Some(true), ..Default::default() };
        let c = ServeConfig::resolve(file.merge(flags)).unwrap();
        assert_eq!(c.policy.docker_networks, ["sandnet"]);
        assert!(c.policy.allow_local_with_tokens);
        assert_eq!(c.policy.docker_default_memory_bytes, 2 << 30);
        let printed = c.to_redacted_toml();
        assert!(printed.contains("allow_local_with_tokens = true"), "{printed}");
        assert!(printed.contains("docker_images = [\"*\"]"), "{printed}");
        let reparsed = ServeConfig::resolve(toml::from_str(&printed).unwrap()).unwrap();
        assert_eq!(reparsed.policy, c.policy);
        assert_eq!(
            (c.policy.egress_max_connections_per_sandbox, c.policy.egress_max_connections_per_tenant),
            (64, 256)
        );
        let egress: ConfigLayer = toml::from_str("egress_max_connections_per_sandbox = 8\n").unwrap();
        let flags = ConfigLayer { egress_max_connections_per_tenant: Some(20), ..Default::default() };
        let c = ServeConfig::resolve(egress.merge(flags)).unwrap();
        assert_eq!(
            (c.policy.egress_max_connections_per_sandbox, c.policy.egress_max_connections_per_tenant),
            (8, 20)
        );
        let host: ConfigLayer = toml::from_str("docker_networks = [\"host\"]\n").unwrap();
        let err = ServeConfig::resolve(host).unwrap_err().to_string();
        assert!(err.contains("never allowed"), "{err}");
    }

    #[test]
    fn tenant_quotas_have_limits_by_default_layer_and_print() {
        let c = ServeConfig::resolve(ConfigLayer::default()).unwrap();
        assert_eq!(c.quotas, Quotas::default());
        assert_eq!((c.quotas.max_sandboxes_per_tenant, c.quotas.max_running_runs_per_tenant), (32, 32));
        assert_eq!(c.reaper.tenant_sweep_budget, Duration::from_secs(120));
        let file: ConfigLayer = toml::from_str(
            "max_sandboxes_per_tenant = 4
max_running_runs_per_tenant = 9
",
        )
        .unwrap();
        let flags = ConfigLayer {
            max_running_runs_per_tenant: Some(2),
            tenant_sweep_budget_ms: Some(5_000),
            ..Default::default()
        };
        let c = ServeConfig::resolve(file.merge(flags)).unwrap();
        assert_eq!(
            c.quotas,
            Quotas { max_sandboxes_per_tenant: 4, max_running_runs_per_tenant: 2, ..Default::default() }
        );
        assert_eq!(c.reaper.tenant_sweep_budget, Duration::from_secs(5));
        let printed = c.to_redacted_toml();
        for line in [
            "max_sandboxes_per_tenant = 4",
            "max_running_runs_per_tenant = 2",
            "tenant_sweep_budget_ms = 5000",
        ] {
            assert!(printed.contains(line), "{line} missing:\n{printed}");
        }
        let reparsed = ServeConfig::resolve(toml::from_str(&printed).unwrap()).unwrap();
        assert_eq!(reparsed.quotas, c.quotas);
        let off = ConfigLayer { max_sandboxes_per_tenant: Some(0), ..Default::default() };
        assert_eq!(ServeConfig::resolve(off).unwrap().quotas.sandboxes().max, None, "0 turns it off");
        let zero = ConfigLayer { tenant_sweep_budget_ms: Some(0), ..Default::default() };
        assert!(ServeConfig::resolve(zero).is_err());
    }

    #[test]
    fn cors_origins_are_normalized_and_checked() {
        assert!(ServeConfig::resolve(ConfigLayer::default()).unwrap().cors_origins.is_empty());
        let file: ConfigLayer =
            toml::from_str("cors_origins = [\"HTTPS://Console.Example.com:443\"]\n").unwrap();
        let c = ServeConfig::resolve(file).unwrap();
        assert_eq!(c.cors_origins, ["https://console.example.com"]);
        assert!(c.to_redacted_toml().contains("cors_origins = [\"https://console.example.com\"]"));
        let bad = ConfigLayer { cors_origins: Some(vec!["https://x/path".into()]), ..Default::default() };
        let err = ServeConfig::resolve(bad).unwrap_err().to_string();
        assert!(err.contains("--cors-origin"), "{err}");
    }

    #[test]
    fn allowed_hosts_are_names_without_ports() {
        let file: ConfigLayer = toml::from_str("allowed_hosts = [\"DevBox.Internal.\"]\n").unwrap();
        let c = ServeConfig::resolve(file).unwrap();
        assert_eq!(c.allowed_hosts, ["devbox.internal"]);
        assert!(c.to_redacted_toml().contains("allowed_hosts = [\"devbox.internal\"]"));
        for bad in ["http://devbox", "devbox:7443", "dev box", "a/b"] {
            let layer = ConfigLayer { allowed_hosts: Some(vec![bad.into()]), ..Default::default() };
            let err = ServeConfig::resolve(layer).unwrap_err().to_string();
            assert!(err.contains("--allowed-host"), "{bad}: {err}");
        }
    }

    #[test]
    fn printed_config_redacts_and_reloads() {
        let layer = ConfigLayer {
            database_url: Some("postgres://u:dbpass-xyz@127.0.0.1/db".into()),
            redis_url: Some("redis://:redispass-xyz@127.0.0.1:6379".into()),
            tokens: Some(vec!["acme=token-secret-xyz".parse().unwrap()]),
            ..Default::default()
        };
        let printed = ServeConfig::resolve(layer).unwrap().to_redacted_toml();
        for secret in ["dbpass-xyz", "redispass-xyz", "token-secret-xyz"] {
            assert!(!printed.contains(secret), "{secret} leaked:\n{printed}");
        }
        assert!(printed.contains("tenant = \"acme\""), "{printed}");
        // The output is a valid config file (with placeholder secrets).
        let reparsed: ConfigLayer = toml::from_str(&printed).unwrap();
        assert_eq!(reparsed.tokens.unwrap()[0].tenant, "acme");
    }
}
