//! Command line of `sandhold-agent`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use shared::secret::Secret;
use shared::transport::Address;

use crate::options::{AgentOptions, default_journal_dir};
use crate::run_user::RunUser;

#[derive(Debug, Parser)]
#[command(
    name = "sandhold-agent",
    version,
    about = "Sandhold's agent inside a sandbox: processes, shell, files, run journals, file watching"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "SANDHOLD_AGENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the agent API until SIGTERM/SIGINT.
    Serve(ServeArgs),
    /// Supervise one journaled run (started by the agent's StartRun).
    #[command(hide = true)]
    Shim(crate::shim::ShimArgs),
    /// Drive an Agent Client Protocol agent (the command after `--`) for one
    /// prompt read from stdin, writing one JSON line per ACP event to stdout
    /// (the `acp` harness runs this under the run journal).
    Acp(crate::acp::AcpArgs),
    /// The run's `sandhold` MCP server over stdio: the permission prompt
    /// tool and the client's tools, each call a durable request.
    Mcp(crate::mcp::McpArgs),
    /// Run as PID 1 of a container: reap orphans and keep the daemon given
    /// after `--` running (restarting it when it dies), e.g.
    /// `sandhold-agent init -- serve --listen unix:/run/sandhold/agent.sock ...`.
    Init {
        #[arg(last = true, required = true)]
        daemon_args: Vec<std::ffi::OsString>,
    },
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Where to listen: `unix:PATH` (the default for sandboxes) or
    /// `tcp:127.0.0.1:PORT` (loopback only; for development).
    #[arg(long, env = "SANDHOLD_AGENT_LISTEN")]
    pub listen: Address,
    /// The sandbox root: every path in a request is relative to it and
    /// confined to it.
    #[arg(long, env = "SANDHOLD_AGENT_ROOT")]
    pub root: PathBuf,
    /// File holding the bearer token every request must carry. Read once at
    /// start; the variable naming it is removed from every child's environment.
    #[arg(long, env = "SANDHOLD_AGENT_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// Directory for run journals. Default: `<root>/../.sandhold-journal` when
    /// writable, else `/tmp/sandhold-runs`.
    #[arg(long, env = "SANDHOLD_AGENT_JOURNAL_DIR")]
    pub journal_dir: Option<PathBuf>,
    /// Run every command (runs, setup steps, execs, shells) as this user:
    /// `uid[:gid]` or `name[:group]`, resolved in `/etc/passwd` and
    /// `/etc/group`; never root. The agent must be root. It adds a passwd
    /// entry and a HOME when the image lacks them, hands the root to the
    /// user and keeps the journal dir to itself. Unset: everything runs as
    /// the agent's own user.
    #[arg(long, env = "SANDHOLD_AGENT_RUN_USER")]
    pub run_user: Option<String>,
    /// HOME of the run user when the image's passwd gives it none.
    #[arg(long, env = "SANDHOLD_AGENT_RUN_HOME", default_value = crate::run_user::DEFAULT_HOME)]
    pub run_home: PathBuf,
    /// Start every command without Landlock and seccomp (by default both
    /// confine what the run user starts, where the kernel has them). For a
    /// kernel or a tool that cannot live with them; reported as a warning
    /// on every run.
    #[arg(long, env = "SANDHOLD_AGENT_UNCONFINED")]
    pub unconfined: bool,
}

impl AgentOptions {
    /// Read the token file and fill in the default journal dir.
    pub fn from_args(args: ServeArgs) -> anyhow::Result<Self> {
        let token = std::fs::read_to_string(&args.token_file)
            .with_context(|| format!("reading the token file {}", args.token_file.display()))?;
        let token = token.trim().to_string();
        anyhow::ensure!(!token.is_empty(), "the token file {} is empty", args.token_file.display());
        let journal_dir = args.journal_dir.unwrap_or_else(|| default_journal_dir(&args.root));
        let run_user = match &args.run_user {
            Some(spec) => {
                // SAFETY: geteuid has no preconditions.
                anyhow::ensure!(unsafe { libc::geteuid() } == 0, "--run-user needs the agent to run as root");
                Some(RunUser::resolve(spec, &args.run_home, Path::new("/etc"))?)
            }
            None => None,
        };
        Ok(Self {
            listen: args.listen,
            root: args.root,
            token: Secret::new(token),
            journal_dir,
            run_user,
            unconfined: args.unconfined,
        })
    }
}

pub fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SANDHOLD_AGENT_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

pub fn main(cli: Cli) -> ExitCode {
    // No core dumps, no ptrace or /proc/<pid>/mem and environ of the agent
    // (it holds the token, a shim the sentinel key) by anything else, even
    // a process of the same uid. Reset by exec, so children are unaffected.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    init_tracing(cli.log_format);
    match cli.command {
        Command::Shim(args) => crate::shim::main(args),
        Command::Acp(args) => crate::acp::main(args),
        Command::Mcp(args) => crate::mcp::main(args),
        Command::Init { daemon_args } => crate::init::run(daemon_args),
        Command::Serve(args) => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the async runtime");
                    return ExitCode::FAILURE;
                }
            };
            let result = runtime.block_on(async move {
                let options = AgentOptions::from_args(args)?;
                crate::server::serve(options, crate::server::shutdown_signal()).await
            });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "agent stopped with an error");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
