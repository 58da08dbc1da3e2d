//! The `sandhold` command line. `serve` runs the control plane; later
//! subcommands (`run`, `attach`, ...) are clients of it and get their own
//! module here.

mod logging;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

/// Entry point of the `sandhold` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::main(args),
    }
}
