//! How the client commands reach a server: `--server` / `SANDHOLD_SERVER`;
//! else the user's background server on a Unix socket in the data dir,
//! started when it is not running (`background.rs`, `daemon.rs`); or, with
//! `--embedded`, a server started in this process (SQLite under the data
//! dir, in-process leases, a random loopback port) that stops when the
//! command ends.
//!
//! The token: `SANDHOLD_TOKEN`; else, for a server on this machine, the
//! `local-token` file of the data dir (what a server without API tokens
//! demands; never sent anywhere but this machine); the embedded server's own.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use shared::proto::v1::run_service_client::RunServiceClient;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::background::{self, Files, Launch};
use super::format::OutputFormat;
use crate::config::{ConfigLayer, LogFormat, ServeConfig};
use crate::server::RunningServer;

/// The variable holding the API token of a `--server` that has tokens. Only
/// ever read from the environment: a token on the command line would be
/// visible to every user of the machine.
pub const TOKEN_VAR: &str = "SANDHOLD_TOKEN";

/// How long a remote server has to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the embedded server has to open its stores.
const EMBEDDED_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Time box for the embedded server's shutdown when the command ends.
const EMBEDDED_STOP_GRACE_MS: u64 = 3_000;

/// Flags every client command shares, after the command's own.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Server (every command)")]
pub struct ClientArgs {
    /// The server to talk to: HOST:PORT, http://HOST:PORT, https://HOST:PORT
    /// (TLS) or unix:PATH.
    /// Unset: your background server (see --data-dir), started when it is
    /// not running (`sandhold daemon status|stop`). The API token, if the
    /// server has tokens, is read from SANDHOLD_TOKEN; a server on this
    /// machine without tokens takes the one in <data-dir>/local-token.
    #[arg(long, env = "SANDHOLD_SERVER", value_name = "URL", global = true)]
    pub server: Option<String>,

    /// Without --server: a server in this process that stops when the
    /// command does, instead of the background server (for scripts that
    /// want nothing left running; a detached run waits for the next server).
    #[arg(
        long = "embedded",
        env = "SANDHOLD_EMBEDDED",
        global = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub embedded_only: bool,

    /// PEM file of the CA(s) an https:// server's certificate is checked
    /// against [default: the system's trusted roots].
    #[arg(long, env = "SANDHOLD_CA_CERT", value_name = "FILE", global = true)]
    pub ca_cert: Option<PathBuf>,

    /// human: for people; json: one JSON object per line, for scripts.
    #[arg(long, env = "SANDHOLD_OUTPUT", value_enum, default_value_t = OutputFormat::Human, global = true)]
    pub output: OutputFormat,

    #[command(flatten)]
    pub embedded: EmbeddedArgs,
}

/// Settings of the server on this machine (the background or the embedded
/// one; used when no --server is given). The same variables as `sandhold
/// serve`, so one environment configures them all.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Local server (without --server)")]
pub struct EmbeddedArgs {
    /// Data directory: the SQLite database, local sandboxes, the background
    /// server's socket and log (daemon/), the embedded server's log
    /// (embedded.log) [default: the user's data dir + /sandhold].
    #[arg(long, env = "SANDHOLD_DATA_DIR", value_name = "DIR", global = true)]
    pub data_dir: Option<PathBuf>,

    /// The sandhold-agent binary of local sandboxes [default: next to this executable, else on PATH].
    #[arg(long, env = "SANDHOLD_AGENT_BINARY", value_name = "FILE", global = true)]
    pub agent_binary: Option<PathBuf>,

    /// The statically linked sandhold-agent copied into Docker sandboxes
    /// [default: where scripts/build-agent-static puts it next to this build;
    /// none: no Docker].
    #[arg(long, env = "SANDHOLD_AGENT_STATIC_BINARY", value_name = "FILE", global = true)]
    pub agent_static_binary: Option<PathBuf>,

    /// Harness CLIs for sandboxes (`sandhold harness install`) [default: <data-dir>/toolchains].
    #[arg(long, env = "SANDHOLD_TOOLCHAIN_DIR", value_name = "DIR", global = true)]
    pub toolchain_dir: Option<PathBuf>,
}

impl EmbeddedArgs {
    /// The data dir, resolved.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(crate::config::default_data_dir)
    }

    /// What starts a background server with these settings (absolute
    /// paths: it runs from `/`).
    fn launch(&self, idle_stop: Option<Duration>) -> anyhow::Result<Launch> {
        let absolute = |p: &std::path::Path| {
            std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))
        };
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        for (flag, value) in [
            ("--agent-binary", &self.agent_binary),
            ("--agent-static-binary", &self.agent_static_binary),
            ("--toolchain-dir", &self.toolchain_dir),
        ] {
            if let Some(path) = value {
                args.push(flag.into());
                args.push(absolute(path)?.into());
            }
        }
        if let Some(idle) = idle_stop {
            args.push("--idle-stop".into());
            args.push(format!("{}s", idle.as_secs()).into());
        }
        Ok(Launch { data_dir: absolute(&self.data_dir())?, args })
    }

    pub fn config(&self) -> anyhow::Result<ServeConfig> {
        ServeConfig::resolve(ConfigLayer {
            listen: Some("127.0.0.1:0".parse().expect("valid address")),
            data_dir: self.data_dir.clone(),
            agent_binary: self.agent_binary.clone(),
            agent_static_binary: self.agent_static_binary.clone(),
            toolchain_dir: self.toolchain_dir.clone(),
            shutdown_grace_ms: Some(EMBEDDED_STOP_GRACE_MS),
            log_format: Some(LogFormat::Json),
            replica_id: Some(format!("embedded-{}", std::process::id())),
            // The embedded server is the caller's own, single-user: its
            // definitions may read any host path (`--repo ./dir` binds it
            // read-only), join any network but the host's, and reach
            // this machine's own addresses through sandbox egress.
            docker_bind_prefixes: Some(vec!["/".into()]),
            docker_networks: Some(vec!["*".into()]),
            egress_private_addresses: Some(true),
            ..Default::default()
        })
    }
}

/// Adds `authorization: Bearer` when a token is configured, and the
/// current trace context (`traceparent`) when traces are on.
#[derive(Clone, Default)]
pub struct Auth(Option<MetadataValue<Ascii>>);

impl Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        crate::telemetry::propagation::inject_current(req.metadata_mut());
        Ok(req)
    }
}

pub type Svc = InterceptedService<Channel, Auth>;

/// A connection to a server: remote, the background one, or embedded. Call
/// [`Connection::close`] at the end so an embedded server drains.
pub struct Connection {
    channel: Channel,
    auth: Auth,
    /// What was connected to, for messages.
    pub target: String,
    /// Reached through --server (a command that comes back must name it).
    pub remote: bool,
    embedded: Option<RunningServer>,
}

impl Auth {
    fn bearer(token: &str, from: &str) -> anyhow::Result<Self> {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| anyhow::anyhow!("{from} is not printable ASCII"))?;
        Ok(Self(Some(value)))
    }
}

impl Connection {
    pub async fn open(args: &ClientArgs) -> anyhow::Result<Self> {
        let server = args.server.as_deref().filter(|s| !s.is_empty());
        match server {
            Some(server) => Self::remote(server, args).await,
            None if args.embedded_only => Self::embedded(&args.embedded).await,
            None => {
                ensure_background(&args.embedded, None).await?;
                Self::background(&args.embedded).await
            }
        }
    }

    async fn remote(server: &str, args: &ClientArgs) -> anyhow::Result<Self> {
        let auth = Self::auth_for(server, &args.embedded)?;
        let channel = connect_remote(server, args.ca_cert.as_deref()).await?;
        Ok(Self { channel, auth, target: server.to_string(), remote: true, embedded: None })
    }

    /// The running background server of the data dir (not started here).
    pub async fn background(args: &EmbeddedArgs) -> anyhow::Result<Self> {
        let files = Files::of(&args.data_dir());
        let server = files.server();
        let auth = Self::auth_for(&server, args)?;
        let channel = connect_remote(&server, None).await?;
        let target = format!("background server (data dir {})", args.data_dir().display());
        Ok(Self { channel, auth, target, remote: false, embedded: None })
    }

    fn auth_for(server: &str, args: &EmbeddedArgs) -> anyhow::Result<Auth> {
        Ok(match std::env::var(TOKEN_VAR) {
            Ok(t) if !t.is_empty() => Auth::bearer(&t, TOKEN_VAR)?,
            _ if is_on_this_machine(server) => match crate::auth::local::read(&args.data_dir()) {
                Some(token) => Auth::bearer(token.expose(), crate::auth::local::FILE_NAME)?,
                None => Auth(None),
            },
            _ => Auth(None),
        })
    }

    async fn embedded(args: &EmbeddedArgs) -> anyhow::Result<Self> {
        let config = args.config()?;
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating the data directory {}", config.data_dir.display()))?;
        let log = config.data_dir.join("embedded.log");
        super::logging::init_to_file(&log, &config.log_filter, None)
            .with_context(|| format!("opening the embedded server's log {}", log.display()))?;
        let data_dir = config.data_dir.clone();
        let server = crate::server::start(config, CancellationToken::new())
            .await
            .context("starting the embedded server")?;
        if server.ready(EMBEDDED_READY_TIMEOUT).await.is_none() {
            bail!(
                "the embedded server did not open its database under {} within {}s; see {}",
                data_dir.display(),
                EMBEDDED_READY_TIMEOUT.as_secs(),
                log.display()
            );
        }
        let addr = server.local_addr();
        let auth = match server.local_token() {
            Some(token) => Auth::bearer(token.expose(), crate::auth::local::FILE_NAME)?,
            None => Auth(None),
        };
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await
            .context("connecting to the embedded server")?;
        Ok(Self {
            channel,
            auth,
            target: format!("embedded server (data dir {})", data_dir.display()),
            remote: false,
            embedded: Some(server),
        })
    }

    pub fn sandboxes(&self) -> SandboxServiceClient<Svc> {
        shared::sized!(SandboxServiceClient::with_interceptor(self.channel.clone(), self.auth.clone()))
    }

    pub fn admin(&self) -> shared::proto::v1::admin_service_client::AdminServiceClient<Svc> {
        shared::proto::v1::admin_service_client::AdminServiceClient::with_interceptor(
            self.channel.clone(),
            self.auth.clone(),
        )
    }

    pub fn runs(&self) -> RunServiceClient<Svc> {
        shared::sized!(RunServiceClient::with_interceptor(self.channel.clone(), self.auth.clone()))
    }

    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// Stop the embedded server, if any (time-boxed: running durable runs
    /// detach and are taken over by the next server on this data dir).
    pub async fn close(self) {
        drop(self.channel);
        if let Some(server) = self.embedded {
            let _ =
                tokio::time::timeout(Duration::from_millis(EMBEDDED_STOP_GRACE_MS + 2_000), server.stop())
                    .await;
        }
    }
}

/// Make sure the background server of the data dir runs and serves,
/// starting it if it does not (and saying so, once, on stderr). True when
/// this call started it.
pub async fn ensure_background(args: &EmbeddedArgs, idle_stop: Option<Duration>) -> anyhow::Result<bool> {
    let files = Files::of(&args.data_dir());
    // A server that stops as we look (idle, or `daemon stop`) is replaced.
    for _ in 0..3 {
        if background::running(&files).is_some() {
            if !background::wait_serving(&files, None).await? {
                continue;
            }
            if let Some(state) = background::State::read(&files)
                && state.version != env!("CARGO_PKG_VERSION")
            {
                eprintln!(
                    "sandhold: the background server (pid {}) runs sandhold {}, this is {}: `sandhold daemon \
                     stop` restarts it with this version at the next command",
                    state.pid,
                    state.version,
                    env!("CARGO_PKG_VERSION")
                );
            }
            return Ok(false);
        }
        let mut child = background::spawn(&files, &args.launch(idle_stop)?)?;
        let serving = background::wait_serving(&files, Some(&mut child)).await?;
        // It lives on in its own process group; this process does not wait.
        drop(child);
        if !serving {
            continue;
        }
        let state = background::State::read(&files);
        let idle = state
            .as_ref()
            .map(|s| match s.idle_stop_ms {
                0 => "it keeps running until `sandhold daemon stop`".to_string(),
                ms => format!(
                    "it stops after {} with no run; `sandhold daemon stop` stops it now",
                    background::span_text(Duration::from_millis(ms))
                ),
            })
            .unwrap_or_default();
        eprintln!(
            "sandhold: started your background server (pid {}, data dir {}); {idle}",
            background::running(&files).map_or("?".to_string(), |p| p.to_string()),
            args.data_dir().display()
        );
        return Ok(true);
    }
    bail!(
        "the background server of {} kept stopping as it was reached; see {} (or run with --embedded)",
        args.data_dir().display(),
        files.log.display()
    )
}

/// `HOST:PORT`, `http(s)://HOST:PORT` or `unix:PATH`, connected eagerly so a
/// server that is not there is reported here, with what to do about it.
/// `https://` is TLS, checked against `ca_cert` or else the system's roots.
async fn connect_remote(server: &str, ca_cert: Option<&std::path::Path>) -> anyhow::Result<Channel> {
    let unreachable = |e: &dyn std::fmt::Display| {
        anyhow::anyhow!(
            "no Sandhold server is reachable at {server}: {e}\n\
             Start one with `sandhold serve` (it listens on {} by default), point --server / SANDHOLD_SERVER \
             at a running one, or leave both unset to use an embedded server in this process.",
            crate::config::DEFAULT_LISTEN
        )
    };
    if let Some(path) = server.strip_prefix("unix:") {
        let address = shared::transport::Address::Unix(path.into());
        return tokio::time::timeout(CONNECT_TIMEOUT, shared::transport::connect(&address))
            .await
            .map_err(|e| unreachable(&e))?
            .map_err(|e| unreachable(&source_chain(&e)));
    }
    if let Some((scheme, _)) = server.split_once("://")
        && scheme != "http"
        && scheme != "https"
    {
        bail!(
            "--server {server:?}: {scheme}:// is not a way to reach a server; write HOST:PORT, http://HOST:PORT, https://HOST:PORT (TLS) or unix:PATH"
        );
    }
    let url = if server.contains("://") { server.to_string() } else { format!("http://{server}") };
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| {
            anyhow::anyhow!("--server {server:?} is not a valid address ({e}); e.g. 127.0.0.1:7443")
        })?
        .connect_timeout(CONNECT_TIMEOUT);
    let endpoint = if url.starts_with("https://") {
        let tls = match ca_cert {
            Some(path) => {
                let pem = std::fs::read(path)
                    .with_context(|| format!("reading the CA certificate {} (--ca-cert)", path.display()))?;
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))
            }
            None => ClientTlsConfig::new().with_native_roots(),
        };
        endpoint
            .tls_config(tls)
            .map_err(|e| anyhow::anyhow!("TLS settings for {server}: {}", source_chain(&e)))?
    } else {
        if ca_cert.is_some() {
            bail!(
                "--ca-cert is for TLS: write the server as https://{}",
                server.trim_start_matches("http://")
            );
        }
        endpoint
    };
    endpoint.connect().await.map_err(|e| {
        let cause = source_chain(&e);
        if url.starts_with("https://") && (cause.contains("InvalidContentType") || cause.contains("corrupt message")) {
            // A TLS hello answered in plain text.
            anyhow::anyhow!(
                "{server} does not speak TLS ({cause}): a server without --tls-cert is plain text; write it as {}",
                url.replacen("https://", "http://", 1)
            )
        } else {
            unreachable(&cause)
        }
    })
}

/// Whether `server` (as --server takes it) is on this machine: the only
/// servers the local token file is sent to.
fn is_on_this_machine(server: &str) -> bool {
    if server.starts_with("unix:") {
        return true;
    }
    let rest = server.split_once("://").map_or(server, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// tonic's transport errors say only "transport error"; the cause is below.
fn source_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.dedup();
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_token_goes_only_to_servers_on_this_machine() {
        for local in [
            "127.0.0.1:7443",
            "http://127.0.0.1:7443",
            "localhost:7443",
            "[::1]:7443",
            "https://[::1]",
            "unix:/x",
        ] {
            assert!(is_on_this_machine(local), "{local}");
        }
        for remote in [
            "sandhold.example:7443",
            "https://10.0.0.1:7443",
            "127.0.0.1.evil.example:7443",
            "localhost.evil",
        ] {
            assert!(!is_on_this_machine(remote), "{remote}");
        }
    }
}
