//! The `sandhold` command line. `serve` runs the control plane; every other
//! command is a client of one: of `--server` / `SANDHOLD_SERVER`, or else of
//! an embedded server started in the same process on the user's data dir.

mod client;
mod definition_file;
mod logging;
mod output;
mod progress;
mod render;
mod run;
mod sandboxes;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use client::{ClientArgs, EmbeddedArgs, TOKEN_VAR};
pub use definition_file::load as load_definition_file;
pub use logging::init as init_logging;
pub use serve::ServeArgs;

#[derive(Debug, Parser)]
#[command(name = "sandhold", version, about = "Run coding-agent CLIs in sandboxes, durably")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the control plane's gRPC server.
    Serve(ServeArgs),
    /// Ensure a sandbox and run a command or an agent in it, streaming what it does.
    /// Ctrl-C once detaches (the run goes on), twice within 2 s cancels it.
    Run(Box<run::RunArgs>),
    /// Follow a run again (replays its log, then follows it live).
    Attach(run::AttachArgs),
    /// Cancel a run: its process is killed and its sandbox destroyed.
    Cancel(run::RunIdArgs),
    /// List runs, newest first.
    Runs(run::RunsArgs),
    /// Print a run's stored log without following or driving it.
    Logs(run::RunIdArgs),
    /// List or remove sandboxes.
    #[command(subcommand)]
    Sandboxes(sandboxes::SandboxesCommand),
    /// Run a command in a live sandbox.
    Exec(sandboxes::ExecArgs),
    /// Store, list or remove sandbox definitions.
    #[command(subcommand)]
    Definitions(sandboxes::DefinitionsCommand),
}

/// Entry point of the `sandhold` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        Command::Serve(args) => return serve::main(args),
        other => other,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(run::EXIT_USAGE);
        }
    };
    let code = runtime.block_on(async move {
        match command {
            Command::Serve(_) => unreachable!("handled above"),
            Command::Run(args) => run::run(*args).await,
            Command::Attach(args) => run::attach(args).await,
            Command::Cancel(args) => run::cancel(args).await,
            Command::Runs(args) => run::runs(args).await,
            Command::Logs(args) => run::logs(args).await,
            Command::Sandboxes(c) => sandboxes::sandboxes(c).await,
            Command::Exec(args) => sandboxes::exec(args).await,
            Command::Definitions(c) => sandboxes::definitions(c).await,
        }
    });
    // Background tasks of an embedded server (renewers, sandboxes' idle
    // sweeper) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
