//! One layer of settings: what a TOML file, or the environment and flags
//! together, say. The flags and their `SANDHOLD_*` variables are declared
//! here, on the fields, once; `sandhold serve` flattens this struct into its
//! arguments and the TOML file deserializes into it (keys as the flags,
//! with `_`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use figment::Figment;
use figment::providers::Serialized;
use serde::{Deserialize, Serialize, Serializer};

use super::{ApiToken, LogFormat, ProviderName, Runtime, TenantPolicy};

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

    /// Harness CLIs for sandboxes (`sandhold harness install`), read-only in
    /// Docker sandboxes [default: <data-dir>/toolchains].
    #[arg(long, env = "SANDHOLD_TOOLCHAIN_DIR", value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toolchain_dir: Option<PathBuf>,

    /// The statically linked sandhold-agent copied into Docker sandboxes
    /// [default: where scripts/build-agent-static puts it next to this build,
    /// else --agent-binary if static; none: no Docker provider].
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

    /// Remove ended runs with their event logs and requests this long after
    /// they ended (e.g. 30d, 12h, 1d12h; units s, m, h, d, w), in sweeps of
    /// every tenant [default: keep them until `sandhold runs rm`].
    #[arg(long, env = "SANDHOLD_RETAIN_RUNS", value_name = "DURATION", value_parser = retention_arg)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retain_runs: Option<String>,

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

    /// A definition made from a run's flags (`def-...`) that no sandbox,
    /// unfinished run or thread's newest run names is removed once it was
    /// last put longer ago than this, in milliseconds [default: 86400000,
    /// one day].
    #[arg(long, env = "SANDHOLD_UNUSED_DEFINITION_GRACE_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unused_definition_grace_ms: Option<u64>,

    /// A tenant's own AdminService.Sweep (one at a time per tenant, never
    /// under the cluster's sweep lease) starts no new run after this long,
    /// in milliseconds [default: 120000].
    #[arg(long, env = "SANDHOLD_TENANT_SWEEP_BUDGET_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_sweep_budget_ms: Option<u64>,

    /// Sandboxes one tenant may hold at once (running or stopped); an
    /// EnsureSandbox that would create one more is refused with
    /// RESOURCE_EXHAUSTED; 0: no limit [default: 32].
    #[arg(long, env = "SANDHOLD_MAX_SANDBOXES_PER_TENANT", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sandboxes_per_tenant: Option<u32>,

    /// Runs not yet terminal one tenant may have at once; a StartRun over
    /// it is refused with RESOURCE_EXHAUSTED; 0: no limit [default: 32].
    #[arg(long, env = "SANDHOLD_MAX_RUNNING_RUNS_PER_TENANT", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_running_runs_per_tenant: Option<u32>,

    /// Model tokens the runs one tenant starts on one UTC day may use, as
    /// the model broker meters them (input, cache reads and writes, and
    /// output); a run that reaches it ends with BUDGET_EXCEEDED, and a
    /// brokered run started past it is refused; 0: no limit [default: 0].
    #[arg(long, env = "SANDHOLD_TENANT_DAILY_TOKENS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_daily_tokens: Option<u64>,

    /// Attempts one StartAttempts (`sandhold run --attempts N`) may fan a
    /// task out to; more is refused with INVALID_ARGUMENT [default: 8].
    #[arg(long, env = "SANDHOLD_MAX_ATTEMPTS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,

    /// Bytes of one file a portable snapshot captures; a save with a larger
    /// file is refused with SNAPSHOT_TOO_LARGE; a definition may set a
    /// lower maximum; 0: no maximum [default: 536870912 (512 MiB)].
    #[arg(long, env = "SANDHOLD_MAX_SNAPSHOT_FILE_BYTES", value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_snapshot_file_bytes: Option<u64>,

    /// Bytes of one portable snapshot, every file counted; a larger save is
    /// refused with SNAPSHOT_TOO_LARGE; a definition may set a lower
    /// maximum; 0: no maximum [default: 4294967296 (4 GiB)].
    #[arg(long, env = "SANDHOLD_MAX_SNAPSHOT_BYTES", value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_snapshot_bytes: Option<u64>,

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

    /// A file of API tokens, one `TENANT=TOKEN` a line (`#` comments),
    /// readable by its owner only; added to the `[[tokens]]` of the config
    /// file or SANDHOLD_TOKENS [default: none].
    #[arg(long, env = "SANDHOLD_TOKENS_FILE", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_file: Option<PathBuf>,

    /// TLS certificate chain of the gRPC listener (PEM); with --tls-key.
    /// Reloaded on SIGHUP and when the file changes [default: no TLS].
    #[arg(long, env = "SANDHOLD_TLS_CERT", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,

    /// TLS private key of the gRPC listener (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "SANDHOLD_TLS_KEY", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,

    /// A file holding the token sandbox nodes (`sandhold node`) present to
    /// join this control plane, readable by its owner only [default: no
    /// node may join].
    #[arg(long, env = "SANDHOLD_NODE_JOIN_TOKEN_FILE", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_join_token_file: Option<PathBuf>,

    /// This control plane's certificate towards nodes (PEM, from the
    /// operator's node CA); with --node-tls-key and --node-tls-ca.
    #[arg(long, env = "SANDHOLD_NODE_TLS_CERT", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_tls_cert: Option<PathBuf>,

    /// The private key of --node-tls-cert (PEM).
    #[arg(long, env = "SANDHOLD_NODE_TLS_KEY", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_tls_key: Option<PathBuf>,

    /// The CA a node's certificate must come from (PEM); a node presenting
    /// another is refused.
    #[arg(long, env = "SANDHOLD_NODE_TLS_CA", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_tls_ca: Option<PathBuf>,

    /// How long a node may miss its heartbeats before it is lost: its runs
    /// end SANDBOX_LOST and its threads continue on another node, in
    /// milliseconds [default: 120000].
    #[arg(long, env = "SANDHOLD_NODE_GRACE_MS", value_name = "MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_grace_ms: Option<u64>,

    /// Serve API tokens in plain text on a non-loopback address (behind a
    /// TLS-terminating proxy or on a network you trust) [default: refused].
    #[arg(long, env = "SANDHOLD_INSECURE_LISTEN")]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_listen: bool,

    /// A browser origin (`scheme://host[:port]`, or `*` for any) whose pages
    /// may call the API through gRPC-Web besides the server's own console;
    /// repeatable (comma-separated in the variable) [default: none, same origin only].
    #[arg(long = "cors-origin", env = "SANDHOLD_CORS_ORIGINS", value_name = "ORIGIN", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cors_origins: Option<Vec<String>>,

    /// A host name (no port) a server without API tokens also answers to,
    /// besides 127.0.0.1, ::1 and localhost; repeatable (comma-separated in
    /// the variable). Any other `Host` is refused: a DNS-rebinding page
    /// sends its own [default: none].
    #[arg(long = "allowed-host", env = "SANDHOLD_ALLOWED_HOSTS", value_name = "HOST", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_hosts: Option<Vec<String>>,

    /// Providers tenants may use; repeatable (the variable takes a
    /// comma-separated list) [default: local,docker].
    #[arg(long = "provider", env = "SANDHOLD_PROVIDERS", value_name = "PROVIDER", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub providers: Option<Vec<ProviderName>>,

    /// Keep the local provider on although API tokens are configured: its
    /// sandboxes run tenant code on this host as the server's user
    /// [default: false].
    #[arg(
        long,
        env = "SANDHOLD_ALLOW_LOCAL_WITH_TOKENS",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_local_with_tokens: Option<bool>,

    /// Let sandbox egress (model upstreams, allowed hosts) reach loopback,
    /// private and link-local addresses [default: false].
    #[arg(
        long,
        env = "SANDHOLD_EGRESS_PRIVATE_ADDRESSES",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_private_addresses: Option<bool>,

    /// A host pattern definitions' `network.allow_hosts` may list (`host`,
    /// `host:port`, `*.domain`, `*` for any; no port: any port);
    /// repeatable (comma-separated in the variable) [default: *].
    #[arg(
        long = "egress-host",
        env = "SANDHOLD_EGRESS_HOSTS",
        value_name = "PATTERN",
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_hosts: Option<Vec<String>>,

    /// Egress connections one sandbox may hold open at once (each is a
    /// socket of this server's); 0: no maximum [default: 64].
    #[arg(long, env = "SANDHOLD_EGRESS_MAX_CONNECTIONS_PER_SANDBOX", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_max_connections_per_sandbox: Option<u32>,

    /// Egress connections all of one tenant's sandboxes may hold open at
    /// once on this server; 0: no maximum [default: 256].
    #[arg(long, env = "SANDHOLD_EGRESS_MAX_CONNECTIONS_PER_TENANT", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_max_connections_per_tenant: Option<u32>,

    /// A Docker network definitions may join besides `none`, `*` for any;
    /// repeatable (comma-separated in the variable). `host` and
    /// `container:*` are refused [default: none].
    #[arg(
        long = "docker-network",
        env = "SANDHOLD_DOCKER_NETWORKS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_networks: Option<Vec<String>>,

    /// A host path under which definitions may bind-mount read-only;
    /// repeatable (comma-separated in the variable) [default: none].
    #[arg(
        long = "docker-bind-prefix",
        env = "SANDHOLD_DOCKER_BIND_PREFIXES",
        value_name = "DIR",
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_bind_prefixes: Option<Vec<PathBuf>>,

    /// A host path under which definitions may bind-mount read-write;
    /// repeatable (comma-separated in the variable) [default: none].
    #[arg(
        long = "docker-writable-bind-prefix",
        env = "SANDHOLD_DOCKER_WRITABLE_BIND_PREFIXES",
        value_name = "DIR",
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_writable_bind_prefixes: Option<Vec<PathBuf>>,

    /// A named volume definitions may mount; repeatable (comma-separated
    /// in the variable) [default: none].
    #[arg(
        long = "docker-volume",
        env = "SANDHOLD_DOCKER_VOLUMES",
        value_name = "NAME",
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_volumes: Option<Vec<String>>,

    /// An image definitions may run (any tag), or a prefix ending in `*`;
    /// repeatable (comma-separated in the variable) [default: *, any local image].
    #[arg(
        long = "docker-image",
        env = "SANDHOLD_DOCKER_IMAGES",
        value_name = "IMAGE",
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_images: Option<Vec<String>>,

    /// Container runtimes Docker definitions may name (`runc`, `gvisor`);
    /// comma-separated. A definition asking for gVisor where the engine
    /// has no `runsc` is refused, naming the fix [default: runc,gvisor].
    #[arg(long, env = "SANDHOLD_DOCKER_RUNTIMES", value_name = "RUNTIME", value_delimiter = ',', value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_runtimes: Option<Vec<Runtime>>,

    /// Every Docker sandbox of every tenant runs under this runtime; a
    /// server whose engine lacks it refuses to start [default: none].
    #[arg(long, env = "SANDHOLD_REQUIRE_RUNTIME", value_name = "RUNTIME", value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_runtime: Option<Runtime>,

    /// Per-tenant settings (`[tenants.NAME]` tables in the config file:
    /// `docker_runtimes`, `require_runtime`); no flag.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants: Option<BTreeMap<String, TenantPolicy>>,

    /// Memory limit of a Docker sandbox that names none, in bytes; 0: none [default: 2147483648].
    #[arg(long, env = "SANDHOLD_DOCKER_DEFAULT_MEMORY_BYTES", value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_default_memory_bytes: Option<u64>,

    /// Largest memory limit a definition may name, in bytes; 0: no maximum [default: 17179869184].
    #[arg(long, env = "SANDHOLD_DOCKER_MAX_MEMORY_BYTES", value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_max_memory_bytes: Option<u64>,

    /// CPUs of a Docker sandbox that names none; 0: no limit [default: 0].
    #[arg(long, env = "SANDHOLD_DOCKER_DEFAULT_CPUS", value_name = "CPUS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_default_cpus: Option<f64>,

    /// Most CPUs a definition may name; 0: no maximum [default: 0].
    #[arg(long, env = "SANDHOLD_DOCKER_MAX_CPUS", value_name = "CPUS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_max_cpus: Option<f64>,

    /// Process limit of a Docker sandbox that names none; 0: none [default: 1024].
    #[arg(long, env = "SANDHOLD_DOCKER_DEFAULT_PIDS_LIMIT", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_default_pids_limit: Option<i64>,

    /// Largest process limit a definition may name; 0: no maximum [default: 8192].
    #[arg(long, env = "SANDHOLD_DOCKER_MAX_PIDS_LIMIT", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_max_pids_limit: Option<i64>,

    /// Journal byte cap of a run whose definition names none [default: 1073741824].
    #[arg(long, env = "SANDHOLD_DEFAULT_JOURNAL_BYTES", value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_journal_bytes: Option<u64>,

    /// Largest journal byte cap a definition may name [default: 8589934592].
    #[arg(long, env = "SANDHOLD_MAX_JOURNAL_BYTES", value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_journal_bytes: Option<u64>,

    /// Most sandboxes one definition's warm pool may keep ready
    /// (`lifecycle.warm`); 0: no warm pools [default: 8].
    #[arg(long, env = "SANDHOLD_MAX_WARM_PER_DEFINITION", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_warm_per_definition: Option<u32>,

    /// API tokens (`[[tokens]]` tables in the config file, or
    /// SANDHOLD_TOKENS="TENANT=TOKEN,..."; never a flag: a command line is
    /// visible to every user of the machine). Without any token the server
    /// runs in single-user mode and only on loopback.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "tokens_for_the_merge")]
    pub tokens: Option<Vec<ApiToken>>,
}

/// The variable holding API tokens, `TENANT=TOKEN` pairs separated by commas.
pub const TOKENS_VAR: &str = "SANDHOLD_TOKENS";

impl ConfigLayer {
    /// The tokens of [`TOKENS_VAR`], if set and not empty.
    pub fn tokens_from_env() -> anyhow::Result<Option<Vec<ApiToken>>> {
        match std::env::var(TOKENS_VAR) {
            Ok(v) if !v.trim().is_empty() => v
                .split(',')
                .map(|t| t.parse::<ApiToken>().map_err(|e| anyhow::anyhow!("{TOKENS_VAR}: {e}")))
                .collect::<anyhow::Result<Vec<_>>>()
                .map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => anyhow::bail!("{TOKENS_VAR} is not UTF-8"),
        }
    }

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

/// `--retain-runs`: checked when parsed, kept as written (the merged
/// configuration reads it, from here or from the file, the same way).
fn retention_arg(text: &str) -> Result<String, String> {
    super::options::parse_span(text).map(|_| text.to_string())
}
