//! `sandhold harness install NAME...` and `sandhold harness ls`: the
//! harness CLIs sandboxes get from the toolchain dir of this host (see
//! [`crate::toolchain`]). Local commands: run them on the server's host,
//! with the server's `--data-dir` / `--toolchain-dir`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

use super::output::{OutputFormat, json_line, print_error};
use super::run::EXIT_USAGE;
use crate::toolchain::{Cli, Toolchains, catalogue};

#[derive(Debug, Clone, Args)]
pub struct ToolchainArgs {
    /// The server's data directory [default: the user's data dir + /sandhold].
    #[arg(long, env = "SANDHOLD_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The toolchain dir [default: <data-dir>/toolchains].
    #[arg(long, env = "SANDHOLD_TOOLCHAIN_DIR", value_name = "DIR")]
    pub toolchain_dir: Option<PathBuf>,
    /// human: for people; json: one JSON object per line, for scripts.
    #[arg(long, env = "SANDHOLD_OUTPUT", value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

impl ToolchainArgs {
    fn toolchains(&self) -> Toolchains {
        let dir = self.toolchain_dir.clone().unwrap_or_else(|| {
            self.data_dir.clone().unwrap_or_else(crate::config::default_data_dir).join("toolchains")
        });
        Toolchains::new(dir)
    }
}

#[derive(Debug, Clone, Subcommand)]
pub enum HarnessCommand {
    /// Fetch harness CLIs (pinned versions, glibc and musl builds where they exist) from the npm
    /// registry into the toolchain dir, for sandboxes whose images lack them.
    #[command(after_help = "Example:\n  sandhold harness install claude-code codex")]
    Install {
        #[command(flatten)]
        dirs: ToolchainArgs,
        /// claude-code, codex, opencode.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
    /// The harness CLIs installed for sandboxes, with versions and C libraries.
    #[command(after_help = "Example:\n  sandhold harness ls")]
    Ls {
        #[command(flatten)]
        dirs: ToolchainArgs,
    },
}

pub fn harness(command: HarnessCommand) -> ExitCode {
    match command {
        HarnessCommand::Install { dirs, names } => {
            let clis: Result<Vec<&Cli>, String> = names
                .iter()
                .map(|n| {
                    Cli::named(n).ok_or_else(|| {
                        let known: Vec<&str> = catalogue().map(|c| c.harness).collect();
                        format!("no harness CLI named {n:?}: one of {}", known.join(", "))
                    })
                })
                .collect();
            let clis = match clis {
                Ok(c) => c,
                Err(e) => {
                    print_error(dirs.output, &anyhow::anyhow!(e));
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let toolchains = dirs.toolchains();
            for cli in clis {
                let mut say = |line: &str| match dirs.output {
                    OutputFormat::Human => eprintln!("{line}"),
                    OutputFormat::Json => json_line(&json!({"harness": cli.harness, "progress": line})),
                };
                if let Err(e) = toolchains.install(cli, &mut say) {
                    print_error(dirs.output, &e.context(format!("installing {}", cli.harness)));
                    return ExitCode::from(EXIT_USAGE);
                }
            }
            if dirs.output == OutputFormat::Human {
                eprintln!(
                    "sandboxes of servers with toolchain dir {} now find them",
                    toolchains.root().display()
                );
            }
            ExitCode::SUCCESS
        }
        HarnessCommand::Ls { dirs } => {
            let toolchains = dirs.toolchains();
            let installed = toolchains.list();
            match dirs.output {
                OutputFormat::Json => {
                    for i in &installed {
                        json_line(&json!({"harness": i.harness, "version": i.version, "libc": i.libcs}));
                    }
                }
                OutputFormat::Human if installed.is_empty() => {
                    eprintln!(
                        "no harness CLIs in {} (sandhold harness install claude-code codex opencode)",
                        toolchains.root().display()
                    );
                }
                OutputFormat::Human => {
                    println!("{:<12} {:<10} LIBC", "HARNESS", "VERSION");
                    for i in &installed {
                        println!("{:<12} {:<10} {}", i.harness, i.version, i.libcs.join(","));
                    }
                }
            }
            ExitCode::SUCCESS
        }
    }
}
