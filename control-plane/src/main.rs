//! `sandhold`: the control plane server and, later, its command-line client.
//! Everything lives in the library; see `control_plane::cli`.

fn main() -> std::process::ExitCode {
    control_plane::cli::main()
}
