//! Configuration of `sandhold serve`, merged from layers: built-in defaults,
//! then an optional TOML file (`--config`), then `SANDHOLD_*` environment
//! variables, then flags. Clap reads a flag and its variable together (the
//! flag wins), so the merge here is: defaults < file < (env < flag).
//!
//! Secrets (API tokens, passwords inside URLs) never reach `--print-config`
//! output or a log line: [`ServeConfig::to_redacted_toml`] and
//! [`redact_url`] are the only ways this module prints them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use shared::secret::Secret;

use crate::lease::LeaseOptions;

/// Default listen address: loopback only, so a fresh install is never
/// reachable from the network without tokens.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7443";
pub const DEFAULT_LEASE_TTL_MS: u64 = 15_000;
pub const DEFAULT_LEASE_RENEW_MS: u64 = 5_000;
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
pub const DEFAULT_LOG_FILTER: &str = "info";
/// The reaper's defaults (see [`crate::reaper::ReaperOptions`]).
pub const DEFAULT_SWEEP_INTERVAL_MS: u64 = 60_000;
/// 30 minutes: a detached run still producing after this is cancelled.
pub const DEFAULT_DETACHED_RUN_TTL_MS: u64 = 30 * 60_000;
pub const DEFAULT_SWEEP_MAX_RUNS: u32 = 100;
pub const DEFAULT_SWEEP_RUN_BUDGET_MS: u64 = 120_000;
pub const DEFAULT_ORPHAN_JOURNAL_AGE_MS: u64 = 24 * 60 * 60_000;
pub const DEFAULT_SWEEP_MAX_JOURNAL_DELETIONS: u32 = 1_000;
pub const DEFAULT_ORPHAN_SANDBOX_GRACE_MS: u64 = 10 * 60_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// An API token and the tenant it authenticates.
#[derive(Clone, Debug)]
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

/// A token as written in the TOML file: `[[tokens]] tenant = "..." token = "..."`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToken {
    tenant: String,
    token: String,
}

/// One layer of configuration: every setting optional, a higher layer's
/// `Some` replaces a lower layer's value (lists included, as a whole).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigLayer {
    pub listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub database_url: Option<String>,
    pub redis_url: Option<String>,
    pub lease_ttl_ms: Option<u64>,
    pub lease_renew_ms: Option<u64>,
    pub takeover_quiet_ms: Option<u64>,
    pub takeover_quiet_max_ms: Option<u64>,
    pub log_format: Option<LogFormat>,
    pub log_filter: Option<String>,
    pub replica_id: Option<String>,
    pub shutdown_grace_ms: Option<u64>,
    pub agent_binary: Option<PathBuf>,
    pub agent_static_binary: Option<PathBuf>,
    pub sweep_interval_ms: Option<u64>,
    pub detached_run_ttl_ms: Option<u64>,
    pub sweep_max_runs: Option<u32>,
    pub sweep_run_budget_ms: Option<u64>,
    pub orphan_journal_age_ms: Option<u64>,
    pub sweep_max_journal_deletions: Option<u32>,
    pub orphan_sandbox_grace_ms: Option<u64>,
    pub operator_tenants: Option<Vec<String>>,
    #[serde(default, deserialize_with = "file_tokens")]
    pub tokens: Option<Vec<ApiToken>>,
}

fn file_tokens<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<ApiToken>>, D::Error> {
    let raw: Vec<FileToken> = Vec::deserialize(d)?;
    raw.into_iter()
        .map(|t| ApiToken::new(&t.tenant, &t.token).map_err(serde::de::Error::custom))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl ConfigLayer {
    pub fn from_toml_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
    }

    /// `self` overridden by `higher`.
    pub fn merge(self, higher: ConfigLayer) -> ConfigLayer {
        ConfigLayer {
            listen: higher.listen.or(self.listen),
            metrics_listen: higher.metrics_listen.or(self.metrics_listen),
            data_dir: higher.data_dir.or(self.data_dir),
            database_url: higher.database_url.or(self.database_url),
            redis_url: higher.redis_url.or(self.redis_url),
            lease_ttl_ms: higher.lease_ttl_ms.or(self.lease_ttl_ms),
            lease_renew_ms: higher.lease_renew_ms.or(self.lease_renew_ms),
            takeover_quiet_ms: higher.takeover_quiet_ms.or(self.takeover_quiet_ms),
            takeover_quiet_max_ms: higher.takeover_quiet_max_ms.or(self.takeover_quiet_max_ms),
            log_format: higher.log_format.or(self.log_format),
            log_filter: higher.log_filter.or(self.log_filter),
            replica_id: higher.replica_id.or(self.replica_id),
            shutdown_grace_ms: higher.shutdown_grace_ms.or(self.shutdown_grace_ms),
            agent_binary: higher.agent_binary.or(self.agent_binary),
            agent_static_binary: higher.agent_static_binary.or(self.agent_static_binary),
            sweep_interval_ms: higher.sweep_interval_ms.or(self.sweep_interval_ms),
            detached_run_ttl_ms: higher.detached_run_ttl_ms.or(self.detached_run_ttl_ms),
            sweep_max_runs: higher.sweep_max_runs.or(self.sweep_max_runs),
            sweep_run_budget_ms: higher.sweep_run_budget_ms.or(self.sweep_run_budget_ms),
            orphan_journal_age_ms: higher.orphan_journal_age_ms.or(self.orphan_journal_age_ms),
            sweep_max_journal_deletions: higher
                .sweep_max_journal_deletions
                .or(self.sweep_max_journal_deletions),
            orphan_sandbox_grace_ms: higher.orphan_sandbox_grace_ms.or(self.orphan_sandbox_grace_ms),
            operator_tenants: higher.operator_tenants.or(self.operator_tenants),
            tokens: higher.tokens.or(self.tokens),
        }
    }
}

/// The resolved configuration of a server.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// Where Prometheus scrapes `/metrics`; `None`: no metrics endpoint.
    pub metrics_listen: Option<SocketAddr>,
    pub data_dir: PathBuf,
    /// May carry a password: print through [`redact_url`].
    pub database_url: String,
    /// `None`: in-process leases (single server).
    pub redis_url: Option<String>,
    pub lease_ttl: Duration,
    pub lease_renew_every: Duration,
    /// A takeover's wait for the stored log to stop growing (0: none).
    pub takeover_quiet: crate::runs::quiet::QuietGate,
    pub log_format: LogFormat,
    pub log_filter: String,
    /// Identifies this replica in `GetServerInfo` and logs.
    pub replica_id: String,
    /// Time box for draining in-flight calls at shutdown.
    pub shutdown_grace: Duration,
    /// Empty: single-user mode (loopback only).
    pub tokens: Vec<ApiToken>,
    /// The `sandhold-agent` of local sandboxes; `None`: next to this
    /// executable, else on `PATH`.
    pub agent_binary: Option<PathBuf>,
    /// The statically linked agent copied into Docker sandboxes; `None`:
    /// `agent_binary`, and without either the Docker provider is off.
    pub agent_static_binary: Option<PathBuf>,
    /// The reaper: schedule, TTL and bounds of a sweep.
    pub reaper: crate::reaper::ReaperOptions,
    /// Tenants whose `AdminService.Sweep` covers every tenant (operators);
    /// anyone else's covers only their own.
    pub operator_tenants: Vec<String>,
}

/// The user's data directory for Sandhold (e.g. `~/.local/share/sandhold`).
pub fn default_data_dir() -> PathBuf {
    dirs::data_dir()
        .or_else(|| dirs::home_dir().map(|h| h.join(".local/share")))
        .unwrap_or_else(|| ".".into())
        .join("sandhold")
}

impl ServeConfig {
    /// Fill what the layers left open with defaults and check the result.
    pub fn resolve(layer: ConfigLayer) -> anyhow::Result<Self> {
        let data_dir = layer.data_dir.unwrap_or_else(default_data_dir);
        let database_url =
            layer.database_url.unwrap_or_else(|| crate::store::default_database_url(&data_dir));
        let config = ServeConfig {
            listen: layer.listen.unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default address")),
            metrics_listen: layer.metrics_listen,
            database_url,
            redis_url: layer.redis_url.filter(|u| !u.is_empty()),
            lease_ttl: Duration::from_millis(layer.lease_ttl_ms.unwrap_or(DEFAULT_LEASE_TTL_MS)),
            lease_renew_every: Duration::from_millis(layer.lease_renew_ms.unwrap_or(DEFAULT_LEASE_RENEW_MS)),
            takeover_quiet: {
                let default = crate::runs::quiet::QuietGate::default();
                crate::runs::quiet::QuietGate {
                    window: layer.takeover_quiet_ms.map_or(default.window, Duration::from_millis),
                    max_wait: layer.takeover_quiet_max_ms.map_or(default.max_wait, Duration::from_millis),
                }
            },
            log_format: layer.log_format.unwrap_or_default(),
            log_filter: layer.log_filter.unwrap_or_else(|| DEFAULT_LOG_FILTER.into()),
            replica_id: layer.replica_id.unwrap_or_else(default_replica_id),
            shutdown_grace: Duration::from_millis(
                layer.shutdown_grace_ms.unwrap_or(DEFAULT_SHUTDOWN_GRACE_MS),
            ),
            tokens: layer.tokens.unwrap_or_default(),
            agent_binary: layer.agent_binary,
            agent_static_binary: layer.agent_static_binary,
            reaper: crate::reaper::ReaperOptions {
                interval: Duration::from_millis(layer.sweep_interval_ms.unwrap_or(DEFAULT_SWEEP_INTERVAL_MS)),
                detached_run_ttl: Duration::from_millis(
                    layer.detached_run_ttl_ms.unwrap_or(DEFAULT_DETACHED_RUN_TTL_MS),
                ),
                max_runs: layer.sweep_max_runs.unwrap_or(DEFAULT_SWEEP_MAX_RUNS),
                run_budget: Duration::from_millis(
                    layer.sweep_run_budget_ms.unwrap_or(DEFAULT_SWEEP_RUN_BUDGET_MS),
                ),
                orphan_journal_age: Duration::from_millis(
                    layer.orphan_journal_age_ms.unwrap_or(DEFAULT_ORPHAN_JOURNAL_AGE_MS),
                ),
                max_journal_deletions: layer
                    .sweep_max_journal_deletions
                    .unwrap_or(DEFAULT_SWEEP_MAX_JOURNAL_DELETIONS),
                orphan_sandbox_grace: Duration::from_millis(
                    layer.orphan_sandbox_grace_ms.unwrap_or(DEFAULT_ORPHAN_SANDBOX_GRACE_MS),
                ),
            },
            operator_tenants: layer.operator_tenants.unwrap_or_default(),
            data_dir,
        };
        config.reaper.validate().map_err(|e| anyhow::anyhow!(e))?;
        config.takeover_quiet.validate().map_err(|e| anyhow::anyhow!(e))?;
        config
            .lease_options()
            .validate()
            .map_err(|e| anyhow::anyhow!("{e} (--lease-ttl-ms, --lease-renew-ms)"))?;
        let mut seen = std::collections::HashSet::new();
        for t in &config.tokens {
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
        self.tokens.is_empty()
    }

    /// The merged configuration as TOML, loadable again with `--config`,
    /// with every secret replaced by `[redacted]`.
    pub fn to_redacted_toml(&self) -> String {
        #[derive(Serialize)]
        struct Printed<'a> {
            listen: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            metrics_listen: Option<String>,
            data_dir: &'a Path,
            database_url: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            redis_url: Option<String>,
            lease_ttl_ms: u64,
            lease_renew_ms: u64,
            takeover_quiet_ms: u64,
            takeover_quiet_max_ms: u64,
            log_format: LogFormat,
            log_filter: &'a str,
            replica_id: &'a str,
            shutdown_grace_ms: u64,
            #[serde(skip_serializing_if = "Option::is_none")]
            agent_binary: Option<&'a Path>,
            #[serde(skip_serializing_if = "Option::is_none")]
            agent_static_binary: Option<&'a Path>,
            sweep_interval_ms: u64,
            detached_run_ttl_ms: u64,
            sweep_max_runs: u32,
            sweep_run_budget_ms: u64,
            orphan_journal_age_ms: u64,
            sweep_max_journal_deletions: u32,
            orphan_sandbox_grace_ms: u64,
            operator_tenants: &'a [String],
            tokens: Vec<FileToken>,
        }
        let printed = Printed {
            listen: self.listen.to_string(),
            metrics_listen: self.metrics_listen.map(|a| a.to_string()),
            data_dir: &self.data_dir,
            database_url: redact_url(&self.database_url),
            redis_url: self.redis_url.as_deref().map(redact_url),
            lease_ttl_ms: millis(self.lease_ttl),
            lease_renew_ms: millis(self.lease_renew_every),
            takeover_quiet_ms: millis(self.takeover_quiet.window),
            takeover_quiet_max_ms: millis(self.takeover_quiet.max_wait),
            log_format: self.log_format,
            log_filter: &self.log_filter,
            replica_id: &self.replica_id,
            shutdown_grace_ms: millis(self.shutdown_grace),
            agent_binary: self.agent_binary.as_deref(),
            agent_static_binary: self.agent_static_binary.as_deref(),
            sweep_interval_ms: millis(self.reaper.interval),
            detached_run_ttl_ms: millis(self.reaper.detached_run_ttl),
            sweep_max_runs: self.reaper.max_runs,
            sweep_run_budget_ms: millis(self.reaper.run_budget),
            orphan_journal_age_ms: millis(self.reaper.orphan_journal_age),
            sweep_max_journal_deletions: self.reaper.max_journal_deletions,
            orphan_sandbox_grace_ms: millis(self.reaper.orphan_sandbox_grace),
            operator_tenants: &self.operator_tenants,
            tokens: self
                .tokens
                .iter()
                .map(|t| FileToken { tenant: t.tenant.clone(), token: t.token.to_string() })
                .collect(),
        };
        toml::to_string(&printed).expect("config serializes to TOML")
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    if host.is_empty() { format!("replica-{suffix}") } else { format!("{host}-{suffix}") }
}

/// `scheme://user:password@host/...` with the password replaced by
/// `[redacted]`; also the `password=` query parameter. URLs without
/// credentials come back unchanged.
pub fn redact_url(url: &str) -> String {
    let mut out = match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(authority_end);
            match authority.rsplit_once('@') {
                Some((userinfo, host)) => {
                    let user = match userinfo.split_once(':') {
                        Some((user, _password)) => format!("{user}:[redacted]"),
                        // A lone userinfo is a password for Redis-style URLs
                        // (`redis://secret@host`) and a user elsewhere; hide it.
                        None if scheme.starts_with("redis") => "[redacted]".to_string(),
                        None => userinfo.to_string(),
                    };
                    format!("{scheme}://{user}@{host}{tail}")
                }
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    };
    if let Some((base, query)) = out.split_once('?') {
        let query: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=[redacted]"),
                _ => kv.to_string(),
            })
            .collect();
        out = format!("{base}?{}", query.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(redact_url("postgres://u:hunter2@db:5432/x"), "postgres://u:[redacted]@db:5432/x");
        assert_eq!(redact_url("redis://:hunter2@127.0.0.1:6379/0"), "redis://:[redacted]@127.0.0.1:6379/0");
        assert_eq!(redact_url("redis://hunter2@127.0.0.1:6379"), "redis://[redacted]@127.0.0.1:6379");
        assert_eq!(
            redact_url("postgres://db/x?user=u&password=hunter2"),
            "postgres://db/x?user=u&password=[redacted]"
        );
        assert_eq!(redact_url("sqlite:///tmp/a@b/sandhold.db"), "sqlite:///tmp/a@b/sandhold.db");
        assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

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
