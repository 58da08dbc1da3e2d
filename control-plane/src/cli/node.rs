//! `sandhold node`: run this host's providers as a node of a control plane.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::config::{LogFormat, ServeConfig};

/// The variable holding the join token (never a flag: a command line is
/// visible to every user of the machine).
pub const JOIN_TOKEN_VAR: &str = "SANDHOLD_NODE_JOIN_TOKEN";

#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Where NodeService listens (the control plane dials it with mutual TLS).
    #[arg(long, env = "SANDHOLD_NODE_LISTEN", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// The URL the control plane dials this node at: https://HOST:PORT (HOST in --tls-cert).
    #[arg(long, env = "SANDHOLD_NODE_ADVERTISE", value_name = "URL")]
    pub advertise: String,
    /// The control plane's public API: http(s)://HOST:PORT.
    #[arg(long, env = "SANDHOLD_SERVER", value_name = "URL")]
    pub server: String,
    /// This node's name in the fleet: [A-Za-z0-9._-], 1-63 characters.
    #[arg(long, env = "SANDHOLD_NODE_NAME", value_name = "NAME")]
    pub name: String,
    /// A label placement matches, KEY=VALUE; repeatable (docker=true and
    /// runtime=gvisor are added when true).
    #[arg(long = "label", value_name = "K=V", value_parser = label)]
    pub labels: Vec<(String, String)>,
    /// This node's certificate (PEM, from the operator's CA).
    #[arg(long, env = "SANDHOLD_NODE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "SANDHOLD_NODE_TLS_KEY", value_name = "FILE")]
    pub tls_key: PathBuf,
    /// The CA a control plane's certificate must come from (PEM).
    #[arg(long, env = "SANDHOLD_NODE_TLS_CA", value_name = "FILE")]
    pub tls_ca: PathBuf,
    /// Where the node's sandboxes live (local sandboxes, Docker sandboxes' host dirs).
    #[arg(long, env = "SANDHOLD_DATA_DIR", value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Sandboxes this node holds at most [default: 64].
    #[arg(long, env = "SANDHOLD_NODE_SANDBOX_SLOTS", value_name = "N", default_value_t = 64)]
    pub sandbox_slots: u32,
    /// Providers this node offers; repeatable [default: local,docker, those that start here].
    #[arg(long = "provider", env = "SANDHOLD_PROVIDERS", value_name = "PROVIDER", value_delimiter = ',')]
    pub providers: Vec<crate::config::ProviderName>,
    /// The sandhold-agent binary of local sandboxes [default: next to this executable, else on PATH].
    #[arg(long, env = "SANDHOLD_AGENT_BINARY", value_name = "FILE")]
    pub agent_binary: Option<PathBuf>,
    /// The statically linked sandhold-agent copied into Docker sandboxes.
    #[arg(long, env = "SANDHOLD_AGENT_STATIC_BINARY", value_name = "FILE")]
    pub agent_static_binary: Option<PathBuf>,
    /// Log line format.
    #[arg(long, env = "SANDHOLD_LOG_FORMAT", value_enum, default_value = "pretty")]
    pub log_format: LogFormat,
    /// Log filter in RUST_LOG syntax.
    #[arg(long, env = "SANDHOLD_LOG", value_name = "FILTER", default_value = "info")]
    pub log_filter: String,
}

fn label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
            Ok((k.trim().into(), v.trim().into()))
        }
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

impl NodeArgs {
    /// The settings the node's providers are built from: a server's, with
    /// this node's data dir and agents (local sandboxes allowed: the node
    /// serves one operator's control plane, not tenants' tokens).
    fn provider_config(&self) -> anyhow::Result<ServeConfig> {
        let mut layer = crate::config::ConfigLayer {
            data_dir: Some(self.data_dir.clone()),
            agent_binary: self.agent_binary.clone(),
            agent_static_binary: self.agent_static_binary.clone(),
            ..Default::default()
        };
        if !self.providers.is_empty() {
            layer.providers = Some(self.providers.clone());
        }
        ServeConfig::resolve(layer)
    }
}

pub(super) fn main(args: NodeArgs) -> ExitCode {
    let join_token = match std::env::var(JOIN_TOKEN_VAR) {
        Ok(t) if !t.trim().is_empty() => shared::secret::Secret::new(t.trim().to_string()),
        _ => {
            eprintln!("sandhold node: set {JOIN_TOKEN_VAR} to the control plane's node join token");
            return ExitCode::from(2);
        }
    };
    let config = match args.provider_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandhold node: {e:#}");
            return ExitCode::from(2);
        }
    };
    let tls = match crate::node::NodeTls::load(&args.tls_cert, &args.tls_key, &args.tls_ca) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sandhold node: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandhold node: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    super::init_logging(args.log_format, &args.log_filter, None);
    let options = crate::node::daemon::NodeOptions {
        name: args.name.clone(),
        listen: args.listen,
        advertise: args.advertise.clone(),
        server: args.server.clone(),
        labels: args.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
        tls,
        join_token,
        sandbox_slots: args.sandbox_slots,
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        super::serve::watch_signals(shutdown.clone())?;
        let providers = crate::server::providers_from_config(&config).await?;
        let providers = providers.all().cloned().collect();
        crate::node::daemon::run(options, providers, shutdown).await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => {
            info!("stopped; the sandboxes go on");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = format!("{e:#}"), "node failed");
            eprintln!("sandhold node: {e:#}");
            ExitCode::FAILURE
        }
    }
}
