//! One layer of settings: what a TOML file, or the environment and flags
//! together, say. The flags and their `SANDHOLD_*` variables are declared
//! here, on the fields, once; `sandhold serve` flattens this struct into its
//! arguments and the TOML file deserializes into it (keys as the flags,
//! with `_`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use figment::Figment;
use figment::providers::Serialized;
use serde::{Deserialize, Serialize, Serializer};

use super::{ApiToken, LogFormat};

/// Every setting optional: a higher layer's `Some` replaces a lower layer's
/// value (lists included, as a whole); `None` is left out of the merge.
#[derive(Debug, Clone, Default, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ConfigLayer {
    /// gRPC listen address [default: 127.0.0.1:7443].
    #[arg(long, env = "SANDHOLD_LISTEN", value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,

    /// Serve Prometheus metrics at http://ADDR/metrics, apart from the gRPC
    /// port; no token needed, no tenant data [default: off].
    #[arg(long, env = "SANDHOLD_METRICS_LISTEN", value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,

    /// Data directory [default: the user's data dir + /sandhold].
    #[arg(long, env = "SANDHOLD_DATA_DIR", value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,

    /// sqlite://PATH or postgres://... [default: sqlite://<data-dir>/sandhold.db].
    #[arg(long, env = "SANDHOLD_DATABASE_URL", value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,

    /// redis://... for leases shared by replicas [default: in-process leases].
    #[arg(long, env = "SANDHOLD_REDIS_URL", value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,

    /// How long a run lease lives without renewal, in milliseconds [default: 15000].
    #[arg(long, env = "SANDHOLD_LEASE_TTL_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,

    /// How often a held lease is renewed, in milliseconds; at most half the ttl [default: 5000].
    #[arg(long, env = "SANDHOLD_LEASE_RENEW_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_renew_ms: Option<u64>,

    /// A takeover first waits until the run's stored log gained nothing for
    /// this long, in milliseconds; 0 = no wait (appends are fenced against
    /// the claim, so none is needed) [default: 0].
    #[arg(long, env = "SANDHOLD_TAKEOVER_QUIET_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover_quiet_ms: Option<u64>,

    /// A log still growing this long into a takeover's wait fails the run
    /// with CLAIM_LOST, in milliseconds [default: 30000].
    #[arg(long, env = "SANDHOLD_TAKEOVER_QUIET_MAX_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover_quiet_max_ms: Option<u64>,

    /// Log line format [default: pretty].
    #[arg(long, env = "SANDHOLD_LOG_FORMAT", value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,

    /// Log filter in RUST_LOG syntax [default: info].
    #[arg(long, env = "SANDHOLD_LOG", value_name = "FILTER")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_filter: Option<String>,

    /// Replica identifier reported by GetServerInfo [default: hostname + random suffix].
    #[arg(long, env = "SANDHOLD_REPLICA_ID", value_name = "ID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_id: Option<String>,

    /// Time box for draining calls at shutdown, in milliseconds [default: 10000].
    #[arg(long, env = "SANDHOLD_SHUTDOWN_GRACE_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_ms: Option<u64>,

    /// The sandhold-agent binary of local sandboxes [default: next to this executable, else on PATH].
    #[arg(long, env = "SANDHOLD_AGENT_BINARY", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_binary: Option<PathBuf>,

    /// The statically linked sandhold-agent copied into Docker sandboxes
    /// (scripts/build-agent-static) [default: --agent-binary; none: no Docker provider].
    #[arg(long, env = "SANDHOLD_AGENT_STATIC_BINARY", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_static_binary: Option<PathBuf>,

    /// How often this server's reaper sweeps (one replica at a time, under a
    /// lease), in milliseconds; 0: never on a schedule, only through
    /// AdminService.Sweep [default: 60000].
    #[arg(long, env = "SANDHOLD_SWEEP_INTERVAL_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep_interval_ms: Option<u64>,

    /// How long a detached durable run may keep producing before a sweep
    /// cancels it, in milliseconds [default: 1800000, 30 minutes].
    #[arg(long, env = "SANDHOLD_DETACHED_RUN_TTL_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detached_run_ttl_ms: Option<u64>,

    /// Detached runs one sweep handles at most, oldest first [default: 100].
    #[arg(long, env = "SANDHOLD_SWEEP_MAX_RUNS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep_max_runs: Option<u32>,

    /// Time a sweep gives one run's drive to its terminal state, in
    /// milliseconds [default: 120000].
    #[arg(long, env = "SANDHOLD_SWEEP_RUN_BUDGET_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep_run_budget_ms: Option<u64>,

    /// A journal with no run record is deleted only when older than this,
    /// in milliseconds [default: 86400000, one day].
    #[arg(long, env = "SANDHOLD_ORPHAN_JOURNAL_AGE_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphan_journal_age_ms: Option<u64>,

    /// Journals one sweep deletes at most [default: 1000].
    #[arg(long, env = "SANDHOLD_SWEEP_MAX_JOURNAL_DELETIONS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep_max_journal_deletions: Option<u32>,

    /// A sandbox with no instance record and no live run is destroyed once
    /// it is older than this, in milliseconds [default: 600000].
    #[arg(long, env = "SANDHOLD_ORPHAN_SANDBOX_GRACE_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphan_sandbox_grace_ms: Option<u64>,

    /// A tenant whose AdminService.Sweep covers every tenant; repeatable
    /// (the variable takes a comma-separated list). Other tenants' sweeps
    /// cover their own runs and sandboxes only [default: none].
    #[arg(
        long = "operator-tenant",
        env = "SANDHOLD_OPERATOR_TENANTS",
        value_name = "TENANT",
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator_tenants: Option<Vec<String>>,

    /// API token of a tenant, TENANT=TOKEN; repeatable. The variable takes a
    /// comma-separated list. Without any token the server runs in
    /// single-user mode and only on loopback.
    #[arg(
        long = "token",
        env = "SANDHOLD_TOKENS",
        value_name = "TENANT=TOKEN",
        value_delimiter = ',',
        hide_env_values = true
    )]
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "tokens_for_the_merge")]
    pub tokens: Option<Vec<ApiToken>>,
}

impl ConfigLayer {
    pub fn from_toml_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
    }

    /// `self` overridden by `higher`.
    pub fn merge(self, higher: ConfigLayer) -> ConfigLayer {
        Figment::from(Serialized::defaults(self))
            .merge(Serialized::defaults(higher))
            .extract()
            .expect("a merge of two layers is a layer")
    }
}

/// Tokens as the merge carries them, secret included: a layer is serialized
/// only into the in-memory merge, which deserializes them at once (printing
/// goes through `ServeConfig`, whose tokens serialize redacted).
fn tokens_for_the_merge<S: Serializer>(tokens: &Option<Vec<ApiToken>>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Exposed<'a> {
        tenant: &'a str,
        token: &'a str,
    }
    let exposed = tokens.as_ref().map(|tokens| {
        tokens.iter().map(|t| Exposed { tenant: &t.tenant, token: t.token.expose() }).collect::<Vec<_>>()
    });
    exposed.serialize(s)
}
