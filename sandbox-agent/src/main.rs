use clap::Parser;

fn main() -> std::process::ExitCode {
    sandbox_agent::cli::main(sandbox_agent::cli::Cli::parse())
}
