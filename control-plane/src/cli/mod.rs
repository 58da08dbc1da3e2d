//! The `sandhold` command line. `serve` runs the control plane; every other
//! command is a client of one: of `--server` / `SANDHOLD_SERVER`, or else of
//! an embedded server started in the same process on the user's data dir.

mod attempts;
mod background;
mod client;
mod daemon;
pub mod definition_file;
mod format;
mod git;
mod harness;
mod ids;
mod logging;
mod node;
mod nodes;
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
    #[command(
        after_help = "Examples:\n  sandhold serve\n  sandhold serve --listen 0.0.0.0:7443 --tokens-file /etc/sandhold/tokens --tls-cert cert.pem --tls-key key.pem"
    )]
    Serve(ServeArgs),
    /// Ensure a sandbox and run a command or an agent in it, streaming what it does.
    /// Ctrl-C once detaches (the run goes on), twice within 2 s cancels it.
    #[command(
        after_help = "Examples:\n  sandhold run -- sh -c 'echo hello'\n  sandhold run --thread demo --setup 'npm ci' --repo . -- npm test\n  sandhold run --image node:22 --harness claude-code --secret ANTHROPIC_API_KEY=ANTHROPIC_API_KEY -- 'fix the failing test'"
    )]
    Run(Box<run::RunArgs>),
    /// Follow a run again (replays its log, then follows it live).
    #[command(after_help = "Example:\n  sandhold attach run-3f2a9c1d0b7e")]
    Attach(run::AttachArgs),
    /// Cancel a run: its process is killed and its sandbox destroyed.
    #[command(after_help = "Example:\n  sandhold cancel run-3f2a9c1d0b7e")]
    Cancel(run::RunIdArgs),
    /// List runs, newest first.
    #[command(after_help = "Examples:\n  sandhold runs\n  sandhold runs --thread demo --output json")]
    Runs(run::RunsArgs),
    /// Print a run's stored log without following or driving it.
    #[command(after_help = "Example:\n  sandhold logs run-3f2a9c1d0b7e")]
    Logs(run::RunIdArgs),
    /// The requests a run waits on (permissions, client tool calls).
    #[command(after_help = "Example:\n  sandhold requests run-3f2a9c1d0b7e --all")]
    Requests(requests::RequestsArgs),
    /// Answer a run's request: allow or deny (any replica; once).
    #[command(
        after_help = "Examples:\n  sandhold respond run-3f2a9c1d0b7e perm-1 allow\n  sandhold respond run-3f2a9c1d0b7e perm-2 deny --message 'not on main'"
    )]
    Respond(requests::RespondArgs),
    /// List or remove sandboxes.
    #[command(subcommand)]
    Sandboxes(sandboxes::SandboxesCommand),
    /// Run a command in a live sandbox.
    #[command(
        after_help = "Examples:\n  sandhold exec 3f2a9c --cwd src -- sh -c 'ls -la'\n  sandhold exec --thread demo -- git log -1"
    )]
    Exec(sandboxes::ExecArgs),
    /// Store, list or remove sandbox definitions.
    #[command(subcommand)]
    Definitions(sandboxes::DefinitionsCommand),
    /// Warm pools: sandboxes kept ready for definitions that ask (`--warm N`).
    #[command(subcommand)]
    Pools(sandboxes::PoolsCommand),
    /// Sets of attempts (`sandhold run --attempts N`): compare, promote.
    #[command(subcommand)]
    Attempts(attempts::AttemptsCommand),
    /// Forward local connections to a port on a sandbox's loopback, until Ctrl-C.
    #[command(
        after_help = "Examples:\n  sandhold port-forward 3f2a9c 8080:3000\n  sandhold port-forward --thread demo 8080:3000",
        allow_missing_positional = true
    )]
    PortForward(port_forward::PortForwardArgs),
    /// Git on a sandbox's workspace: status, diff, add, commit, branch, push, pull.
    #[command(after_help = "Examples:\n  sandhold git 3f2a9c status\n  sandhold git --thread demo diff")]
    Git(git::GitArgs),
    /// An interactive terminal in a sandbox (a login shell, or CMD); exits with its code.
    #[command(after_help = "Examples:\n  sandhold shell 3f2a9c\n  sandhold shell --thread demo -- python3")]
    Shell(shell::ShellArgs),
    /// Your background server: status, stop, start (commands without --server use it).
    #[command(subcommand)]
    Daemon(daemon::DaemonCommand),
    /// Install or list the harness CLIs sandboxes get from this host (run on the server's host).
    #[command(subcommand)]
    Harness(harness::HarnessCommand),
    /// Serve this host's providers to a control plane as a node of its fleet
    /// (the join token in SANDHOLD_NODE_JOIN_TOKEN).
    #[command(
        after_help = "Example:\n  SANDHOLD_NODE_JOIN_TOKEN=... sandhold node --listen 10.0.0.5:7600 --advertise https://10.0.0.5:7600 \\\n    --server https://cp.example:7443 --name node-1 --label zone=a --tls-cert node.pem --tls-key node.key \\\n    --tls-ca ca.pem --data-dir /var/lib/sandhold-node"
    )]
    Node(Box<node::NodeArgs>),
    /// The fleet's nodes: list, drain, remove (operators).
    #[command(subcommand)]
    Nodes(nodes::NodesCommand),
}

/// A flag that no longer exists and what to use instead (clap's own
/// message would echo the value, a token, and not say where tokens go).
/// Arguments after `--` belong to the command a run starts.
fn removed_flag(args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    let mut command = None;
    for arg in args {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            return None;
        }
        if command.is_none() && !arg.starts_with('-') {
            command = Some(arg.to_string());
        }
        if (arg == "--token" || arg.starts_with("--token=")) && command.as_deref() != Some("serve") {
            return Some(format!(
                "--token is not a flag: a token on the command line is visible to every user of the machine \
                 (ps, /proc/PID/cmdline). Put the server's API token in {} instead",
                client::TOKEN_VAR
            ));
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

/// A word clap did not expect where a command or prompt goes after `--`
/// (`sandhold run echo hi`): say where it belongs.
fn missing_separator(e: &clap::Error, command: &str) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(word)) = e.get(ContextKind::InvalidArg) else { return None };
    if word.starts_with('-') {
        return None;
    }
    Some(format!(
        "tip: the command (or prompt) goes after `--`, so no flag of sandhold is taken for one of it: \
         sandhold {command} [...] -- {word} ..."
    ))
}

/// Entry point of the `sandhold` binary.
pub fn main() -> ExitCode {
    if let Some(message) = removed_flag(std::env::args_os().skip(1)) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let command = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_default();
            if let Some(hint) = missing_separator(&e, &command) {
                let _ = e.print();
                eprintln!("\n{hint}");
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    let command = match cli.command {
        Command::Serve(args) => return serve::main(args),
        Command::Harness(c) => return harness::harness(c),
        Command::Daemon(c) => return daemon::daemon(c),
        Command::Node(args) => return node::main(*args),
        other => other,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(run::EXIT_USAGE);
        }
    };
    // A client's spans: the command is the root of the trace its calls
    // continue on the server (they carry `traceparent`).
    let traces = runtime.block_on(async { crate::telemetry::Tracing::from_env("sandhold-cli") });
    if let Some(traces) = &traces {
        logging::init_client(traces);
    }
    let word = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_default();
    let root = tracing::info_span!("sandhold", otel.name = %format!("sandhold {word}"), otel.kind = "client");
    let code = runtime.block_on(tracing::Instrument::instrument(client(command), root));
    if let Some(traces) = traces {
        traces.flush();
    }
    // Background tasks of an embedded server (renewers, sandboxes' idle
    // sweeper) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// A client command, to its exit code.
async fn client(command: Command) -> ExitCode {
    match command {
        Command::Serve(_) | Command::Harness(_) | Command::Daemon(_) | Command::Node(_) => {
            unreachable!("handled above")
        }
        Command::Nodes(c) => nodes::nodes(c).await,
        Command::Run(args) if args.fans_out() => attempts::run(*args).await,
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
        Command::Pools(c) => sandboxes::pools(c).await,
        Command::Attempts(c) => attempts::attempts(c).await,
        Command::PortForward(args) => port_forward::port_forward(args).await,
        Command::Git(args) => git::git(args).await,
        Command::Shell(args) => shell::shell(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_where_the_command_goes_says_to_put_it_after_the_separator() {
        use clap::Parser;
        let e = Cli::try_parse_from(["sandhold", "run", "echo", "hi"]).unwrap_err();
        assert!(missing_separator(&e, "run").unwrap().contains("sandhold run [...] -- echo"));
        let e = Cli::try_parse_from(["sandhold", "run", "--no-such-flag", "--", "x"]).unwrap_err();
        assert!(missing_separator(&e, "run").is_none(), "a flag is not a command");
    }

    #[test]
    fn a_client_given_a_token_flag_is_told_about_its_variable() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>().into_iter();
        let message = removed_flag(args(&["runs", "--token", "secret-xyz"])).unwrap();
        assert!(message.contains("SANDHOLD_TOKEN") && !message.contains("--tokens-file"), "{message}");
        assert!(!message.contains("secret-xyz"));
    }

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

    /// Every leaf subcommand with its path (`sandboxes rm`).
    fn leaves(cmd: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
        if cmd.get_subcommands().next().is_none() {
            out.push((path.clone(), cmd.clone()));
        }
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            leaves(sub, format!("{path} {}", sub.get_name()).trim().to_string(), out);
        }
    }

    /// A newcomer reads `--help`: each subcommand's own flags first, the
    /// shared ones after under their own headings, every argument described
    /// and an example to copy.
    #[test]
    fn every_subcommand_describes_its_arguments_and_shows_an_example() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        cli.build();
        let mut all = Vec::new();
        leaves(&cli, String::new(), &mut all);
        let shared = [
            "server",
            "embedded_only",
            "ca_cert",
            "output",
            "data_dir",
            "agent_binary",
            "agent_static_binary",
            "toolchain_dir",
        ];
        let mut problems = Vec::new();
        for (path, cmd) in &all {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    problems.push(format!("{path}: {id} has no description"));
                }
                let heading = arg.get_help_heading();
                if path != "serve" && !shared.contains(&id) && heading.is_some() {
                    problems.push(format!("{path}: its own {id} is under {heading:?}"));
                }
            }
            let after = cmd.get_after_help().or(cmd.get_after_long_help()).map(|h| h.to_string());
            if !after.is_some_and(|h| h.contains("Example")) {
                problems.push(format!("{path}: no example"));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// `--thread` names the sandbox wherever an id would: the positional
    /// arguments after it still land where they belong.
    #[test]
    fn thread_stands_in_for_the_sandbox_id() {
        use clap::Parser;
        let parse =
            |args: &[&str]| Cli::try_parse_from(std::iter::once("sandhold").chain(args.iter().copied()));
        let Command::Exec(exec) = parse(&["exec", "--thread", "t", "--", "ls", "-l"]).unwrap().command else {
            panic!("exec")
        };
        assert_eq!((exec.process.target.thread.as_deref(), exec.command.len()), (Some("t"), 2));
        let Command::Git(git) = parse(&["git", "--thread", "t", "status"]).unwrap().command else {
            panic!("git")
        };
        assert!(git.target.sandbox_id.is_none() && matches!(git.command, git::GitCommand::Status));
        let Command::Git(git) = parse(&["git", "abc", "status"]).unwrap().command else { panic!("git") };
        assert_eq!(git.target.sandbox_id.as_deref(), Some("abc"));
        let Command::PortForward(pf) =
            parse(&["port-forward", "--thread", "t", "8080:3000"]).unwrap().command
        else {
            panic!("port-forward")
        };
        assert_eq!((pf.target.sandbox_id, pf.ports.sandbox_port), (None, 3000));
        assert!(parse(&["shell", "--thread", "t"]).is_ok());
        assert!(parse(&["exec", "--", "ls"]).is_err(), "a sandbox is named");
        assert!(parse(&["exec", "abc", "--thread", "t", "--", "ls"]).is_err(), "once");
    }
}
