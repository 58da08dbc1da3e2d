//! The `sandhold` command line. `serve` runs the control plane; every other
//! command is a client of one: of `--server` / `SANDHOLD_SERVER`, or else of
//! an embedded server started in the same process on the user's data dir.

mod client;
pub mod definition_file;
mod format;
mod git;
mod harness;
mod logging;
mod output;
mod port_forward;
mod progress;
mod render;
mod requests;
mod run;
mod sandboxes;
mod serve;
mod shell;
mod terminal;
mod thread;

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
    /// The requests a run waits on (permissions, client tool calls).
    Requests(requests::RequestsArgs),
    /// Answer a run's request: allow or deny (any replica; once).
    Respond(requests::RespondArgs),
    /// List or remove sandboxes.
    #[command(subcommand)]
    Sandboxes(sandboxes::SandboxesCommand),
    /// Run a command in a live sandbox.
    Exec(sandboxes::ExecArgs),
    /// Store, list or remove sandbox definitions.
    #[command(subcommand)]
    Definitions(sandboxes::DefinitionsCommand),
    /// Forward local connections to a port on a sandbox's loopback, until Ctrl-C.
    PortForward(port_forward::PortForwardArgs),
    /// Git on a sandbox's workspace: status, diff, add, commit, branch, push, pull.
    Git(git::GitArgs),
    /// An interactive terminal in a sandbox (a login shell, or CMD); exits with its code.
    Shell(shell::ShellArgs),
    /// Install or list the harness CLIs sandboxes get from this host (run on the server's host).
    #[command(subcommand)]
    Harness(harness::HarnessCommand),
}

/// A flag that no longer exists and what to use instead (clap's own
/// message would echo the value, a token, and not say where tokens go).
/// Arguments after `--` belong to the command a run starts.
fn removed_flag(args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    for arg in args {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            return None;
        }
        if arg == "--token" || arg.starts_with("--token=") {
            return Some(format!(
                "--token was removed: a token on the command line is visible to every user of the machine \
                 (ps, /proc/PID/cmdline). Put tokens in a tokens file (--tokens-file FILE, one TENANT=TOKEN a \
                 line, mode 600), in {}=\"TENANT=TOKEN,...\", or in [[tokens]] tables of the --config file",
                crate::config::TOKENS_VAR
            ));
        }
    }
    None
}

/// Entry point of the `sandhold` binary.
pub fn main() -> ExitCode {
    if let Some(message) = removed_flag(std::env::args_os().skip(1)) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    let command = match cli.command {
        Command::Serve(args) => return serve::main(args),
        Command::Harness(c) => return harness::harness(c),
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
            Command::Serve(_) | Command::Harness(_) => unreachable!("handled above"),
            Command::Run(args) => run::run(*args).await,
            Command::Attach(args) => run::attach(args).await,
            Command::Cancel(args) => run::cancel(args).await,
            Command::Runs(args) => run::runs(args).await,
            Command::Logs(args) => run::logs(args).await,
            Command::Requests(args) => requests::requests(args).await,
            Command::Respond(args) => requests::respond(args).await,
            Command::Sandboxes(c) => sandboxes::sandboxes(c).await,
            Command::Exec(args) => sandboxes::exec(args).await,
            Command::Definitions(c) => sandboxes::definitions(c).await,
            Command::PortForward(args) => port_forward::port_forward(args).await,
            Command::Git(args) => git::git(args).await,
            Command::Shell(args) => shell::shell(args).await,
        }
    });
    // Background tasks of an embedded server (renewers, sandboxes' idle
    // sweeper) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_removed_token_flag_is_named_before_clap_sees_it() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>().into_iter();
        let message = removed_flag(args(&["serve", "--token", "a=secret-xyz"])).unwrap();
        assert!(message.contains("--tokens-file") && !message.contains("secret-xyz"), "{message}");
        assert!(removed_flag(args(&["serve", "--token=a=secret-xyz"])).is_some());
        assert!(
            removed_flag(args(&["run", "--", "tool", "--token", "x"])).is_none(),
            "the command's own flag"
        );
        assert!(removed_flag(args(&["serve", "--tokens-file", "/etc/t"])).is_none());
    }
}
