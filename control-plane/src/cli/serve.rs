//! `sandhold serve`: flags (each with its `SANDHOLD_*` variable), the layer
//! merge, `--print-config`, signals, and the server's lifetime.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{ConfigLayer, ServeConfig};

/// Flags of `sandhold serve`: the settings (each with its `SANDHOLD_*`
/// variable) and what to do with them. All optional: unset flags leave the
/// value of the lower layers (environment, file, defaults).
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (keys as the flags, with `_`).
    #[arg(long, env = "SANDHOLD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print the merged configuration (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,

    /// The environment-and-flags layer.
    #[command(flatten)]
    pub settings: ConfigLayer,
}

impl ServeArgs {
    /// defaults < file < env < flags (tokens: file < SANDHOLD_TOKENS, plus the tokens file).
    pub fn resolve(&self) -> anyhow::Result<ServeConfig> {
        let file = match &self.config {
            Some(path) => ConfigLayer::from_toml_file(path)?,
            None => ConfigLayer::default(),
        };
        let mut settings = self.settings.clone();
        settings.tokens = ConfigLayer::tokens_from_env()?;
        ServeConfig::resolve(file.merge(settings))
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
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandhold serve: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The exporter's channel lives on the runtime.
    let traces = runtime.block_on(async { crate::telemetry::Tracing::from_env("sandhold") });
    super::init_logging(config.log_format, &config.log_filter, traces.as_ref());
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        watch_signals(shutdown.clone())?;
        crate::server::serve(config, shutdown).await
    });
    if let Some(traces) = traces {
        traces.flush();
    }
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
pub(super) fn watch_signals(shutdown: CancellationToken) -> anyhow::Result<()> {
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
