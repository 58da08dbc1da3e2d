//! `sandhold serve`: flags (each with its `SANDHOLD_*` variable), the layer
//! merge, `--print-config`, signals, and the server's lifetime.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{ApiToken, ConfigLayer, LogFormat, ServeConfig};

/// Flags of `sandhold serve`. All optional: unset flags leave the value of
/// the lower layers (environment, file, defaults).
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (keys as the flags, with `_`).
    #[arg(long, env = "SANDHOLD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print the merged configuration (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,

    /// gRPC listen address [default: 127.0.0.1:7443].
    #[arg(long, env = "SANDHOLD_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Serve Prometheus metrics at http://ADDR/metrics, apart from the gRPC
    /// port; no token needed, no tenant data [default: off].
    #[arg(long, env = "SANDHOLD_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Data directory [default: the user's data dir + /sandhold].
    #[arg(long, env = "SANDHOLD_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// sqlite://PATH or postgres://... [default: sqlite://<data-dir>/sandhold.db].
    #[arg(long, env = "SANDHOLD_DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,

    /// redis://... for leases shared by replicas [default: in-process leases].
    #[arg(long, env = "SANDHOLD_REDIS_URL", value_name = "URL")]
    pub redis_url: Option<String>,

    /// How long a run lease lives without renewal, in milliseconds [default: 15000].
    #[arg(long, env = "SANDHOLD_LEASE_TTL_MS", value_name = "MS")]
    pub lease_ttl_ms: Option<u64>,

    /// How often a held lease is renewed, in milliseconds; at most half the ttl [default: 5000].
    #[arg(long, env = "SANDHOLD_LEASE_RENEW_MS", value_name = "MS")]
    pub lease_renew_ms: Option<u64>,

    /// A takeover first waits until the run's stored log gained nothing for
    /// this long, in milliseconds; 0 = no wait (appends are fenced against
    /// the claim, so none is needed) [default: 0].
    #[arg(long, env = "SANDHOLD_TAKEOVER_QUIET_MS", value_name = "MS")]
    pub takeover_quiet_ms: Option<u64>,

    /// A log still growing this long into a takeover's wait fails the run
    /// with CLAIM_LOST, in milliseconds [default: 30000].
    #[arg(long, env = "SANDHOLD_TAKEOVER_QUIET_MAX_MS", value_name = "MS")]
    pub takeover_quiet_max_ms: Option<u64>,

    /// Log line format [default: pretty].
    #[arg(long, env = "SANDHOLD_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// Log filter in RUST_LOG syntax [default: info].
    #[arg(long, env = "SANDHOLD_LOG", value_name = "FILTER")]
    pub log_filter: Option<String>,

    /// Replica identifier reported by GetServerInfo [default: hostname + random suffix].
    #[arg(long, env = "SANDHOLD_REPLICA_ID", value_name = "ID")]
    pub replica_id: Option<String>,

    /// Time box for draining calls at shutdown, in milliseconds [default: 10000].
    #[arg(long, env = "SANDHOLD_SHUTDOWN_GRACE_MS", value_name = "MS")]
    pub shutdown_grace_ms: Option<u64>,

    /// The sandhold-agent binary of local sandboxes [default: next to this executable, else on PATH].
    #[arg(long, env = "SANDHOLD_AGENT_BINARY", value_name = "FILE")]
    pub agent_binary: Option<PathBuf>,

    /// The statically linked sandhold-agent copied into Docker sandboxes
    /// (scripts/build-agent-static) [default: --agent-binary; none: no Docker provider].
    #[arg(long, env = "SANDHOLD_AGENT_STATIC_BINARY", value_name = "FILE")]
    pub agent_static_binary: Option<PathBuf>,

    /// How often this server's reaper sweeps (one replica at a time, under a
    /// lease), in milliseconds; 0: never on a schedule, only through
    /// AdminService.Sweep [default: 60000].
    #[arg(long, env = "SANDHOLD_SWEEP_INTERVAL_MS", value_name = "MS")]
    pub sweep_interval_ms: Option<u64>,

    /// How long a detached durable run may keep producing before a sweep
    /// cancels it, in milliseconds [default: 1800000, 30 minutes].
    #[arg(long, env = "SANDHOLD_DETACHED_RUN_TTL_MS", value_name = "MS")]
    pub detached_run_ttl_ms: Option<u64>,

    /// Detached runs one sweep handles at most, oldest first [default: 100].
    #[arg(long, env = "SANDHOLD_SWEEP_MAX_RUNS", value_name = "N")]
    pub sweep_max_runs: Option<u32>,

    /// Time a sweep gives one run's drive to its terminal state, in
    /// milliseconds [default: 120000].
    #[arg(long, env = "SANDHOLD_SWEEP_RUN_BUDGET_MS", value_name = "MS")]
    pub sweep_run_budget_ms: Option<u64>,

    /// A journal with no run record is deleted only when older than this,
    /// in milliseconds [default: 86400000, one day].
    #[arg(long, env = "SANDHOLD_ORPHAN_JOURNAL_AGE_MS", value_name = "MS")]
    pub orphan_journal_age_ms: Option<u64>,

    /// Journals one sweep deletes at most [default: 1000].
    #[arg(long, env = "SANDHOLD_SWEEP_MAX_JOURNAL_DELETIONS", value_name = "N")]
    pub sweep_max_journal_deletions: Option<u32>,

    /// A sandbox with no instance record and no live run is destroyed once
    /// it is older than this, in milliseconds [default: 600000].
    #[arg(long, env = "SANDHOLD_ORPHAN_SANDBOX_GRACE_MS", value_name = "MS")]
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
    pub operator_tenants: Vec<String>,

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
    pub tokens: Vec<ApiToken>,
}

impl ServeArgs {
    /// The environment-and-flags layer.
    fn layer(&self) -> ConfigLayer {
        ConfigLayer {
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            data_dir: self.data_dir.clone(),
            database_url: self.database_url.clone(),
            redis_url: self.redis_url.clone(),
            lease_ttl_ms: self.lease_ttl_ms,
            lease_renew_ms: self.lease_renew_ms,
            takeover_quiet_ms: self.takeover_quiet_ms,
            takeover_quiet_max_ms: self.takeover_quiet_max_ms,
            log_format: self.log_format,
            log_filter: self.log_filter.clone(),
            replica_id: self.replica_id.clone(),
            shutdown_grace_ms: self.shutdown_grace_ms,
            agent_binary: self.agent_binary.clone(),
            agent_static_binary: self.agent_static_binary.clone(),
            sweep_interval_ms: self.sweep_interval_ms,
            detached_run_ttl_ms: self.detached_run_ttl_ms,
            sweep_max_runs: self.sweep_max_runs,
            sweep_run_budget_ms: self.sweep_run_budget_ms,
            orphan_journal_age_ms: self.orphan_journal_age_ms,
            sweep_max_journal_deletions: self.sweep_max_journal_deletions,
            orphan_sandbox_grace_ms: self.orphan_sandbox_grace_ms,
            operator_tenants: (!self.operator_tenants.is_empty()).then(|| self.operator_tenants.clone()),
            tokens: (!self.tokens.is_empty()).then(|| self.tokens.clone()),
        }
    }

    /// defaults < file < env < flags.
    pub fn resolve(&self) -> anyhow::Result<ServeConfig> {
        let file = match &self.config {
            Some(path) => ConfigLayer::from_toml_file(path)?,
            None => ConfigLayer::default(),
        };
        ServeConfig::resolve(file.merge(self.layer()))
    }
}

pub(super) fn main(args: ServeArgs) -> ExitCode {
    let config = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandhold serve: {e:#}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        print!("{}", config.to_redacted_toml());
        return ExitCode::SUCCESS;
    }
    super::init_logging(config.log_format, &config.log_filter);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        watch_signals(shutdown.clone())?;
        crate::server::serve(config, shutdown).await
    });
    // Background tasks (renewers, pool reapers) must not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = format!("{e:#}"), "server failed");
            let _ = writeln!(std::io::stderr(), "sandhold serve: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// First SIGTERM/SIGINT: begin graceful shutdown. Second: exit at once.
fn watch_signals(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        // Cancel before logging: shutdown must not depend on stderr.
        shutdown.cancel();
        info!(signal = name, "shutting down gracefully; send it again to exit at once");
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        warn!(signal = name, "second signal, exiting at once");
        std::process::exit(130);
    });
    Ok(())
}
