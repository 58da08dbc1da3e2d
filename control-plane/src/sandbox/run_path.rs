//! The toolchain's harness CLIs on a run's `PATH`: after the image's own
//! directories (a CLI the image has wins), the `bin` dir of the toolchain
//! for the image's C library, as the sandbox sees it (Docker: the
//! read-only mount; local: the host directory). One probe in the sandbox
//! tells the image's `PATH`, its C library and whether it has the CLI.

use shared::proto::agent::v1 as agent;

use crate::agent::AgentClient;
use crate::harness::Harness;
use crate::provider::ProviderKind;
use crate::toolchain::{Cli, Libc, Toolchains};

/// What the probe found in the image.
#[derive(Debug, Default, PartialEq, Eq)]
struct Image {
    path: String,
    libc: Option<Libc>,
    /// The harness's program is on the image's own `PATH`.
    has_cli: bool,
}

fn probe_script(program: &str) -> String {
    format!(
        "{}; printf 'PATH=%s\\n' \"$PATH\"; command -v {program} >/dev/null 2>&1 && echo has-cli; true",
        Libc::PROBE
    )
}

fn parse(out: &str) -> Image {
    Image {
        path: out.lines().find_map(|l| l.strip_prefix("PATH=")).unwrap_or_default().to_string(),
        libc: Libc::of_image(out),
        has_cli: out.lines().any(|l| l == "has-cli"),
    }
}

/// The run's `PATH` with the toolchain on it, and a warning when the
/// harness's CLI is in neither the image nor a toolchain build that runs
/// there. `program` is what the run starts (`argv[0]`), `env` the run's
/// own variables (a `PATH` there is the run's and is kept). `None`, `None`
/// when there is no toolchain dir or the probe fails (the run then goes on
/// with the image's `PATH`, and the agent's error names a missing program).
pub(crate) async fn run_path(
    toolchains: Option<&Toolchains>,
    harness: Harness,
    program: &str,
    env: &std::collections::BTreeMap<String, String>,
    provider: ProviderKind,
    agent: &AgentClient,
) -> (Option<String>, Option<String>) {
    let Some(toolchains) = toolchains else { return (None, None) };
    if env.contains_key("PATH") {
        return (None, None);
    }
    let cli = Cli::named(harness.name());
    let quoted = format!("'{}'", program.replace('\'', r"'\''"));
    let probe = agent::ExecRequest {
        command: Some(agent::Command { kind: Some(agent::command::Kind::Shell(probe_script(&quoted))) }),
        timeout_ms: Some(30_000),
        ..Default::default()
    };
    let image = match agent.process().exec(probe).await {
        Ok(done) => parse(&String::from_utf8_lossy(&done.into_inner().stdout)),
        Err(status) => {
            tracing::warn!(error = %status, "probing the image for the toolchain failed");
            return (None, None);
        }
    };
    let root = provider.kind().toolchain_root(toolchains.root());
    // An image with no C library still runs a static build (Codex), which
    // every libc's bin dir links.
    let bin = format!("{root}/{}/bin", image.libc.unwrap_or(Libc::Musl).as_str());
    let path = if image.path.is_empty() { bin } else { format!("{}:{bin}", image.path) };
    let warning = match cli {
        Some(cli) if !image.has_cli => missing(cli, toolchains, image.libc),
        _ => None,
    };
    (Some(path), warning)
}

/// Why `cli` will not be found, if it will not.
fn missing(cli: &Cli, toolchains: &Toolchains, libc: Option<Libc>) -> Option<String> {
    let installed = Libc::ALL.iter().any(|l| toolchains.has(cli, *l));
    if !installed {
        return Some(format!(
            "{program} is not in the image and not installed for sandboxes: run `sandhold harness install {name}` \
             on the server's host (or use an image that has it)",
            program = cli.program,
            name = cli.harness,
        ));
    }
    let runs = match libc {
        Some(l) => toolchains.has(cli, l) && cli.runs_with(Some(l)),
        None => cli.runs_with(None),
    };
    (!runs).then(|| {
        let image = libc.map(|l| format!("{} only", l.as_str())).unwrap_or_else(|| "no C library".into());
        format!(
            "{program} is not in the image, and the installed {name} has no build for it ({image}): use an image \
             with glibc, or one that has {program}",
            program = cli.program,
            name = cli.harness,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_tells_path_libc_and_the_cli() {
        let image = parse("glibc\nPATH=/usr/local/bin:/usr/bin:/bin\nhas-cli\n");
        assert_eq!(
            image,
            Image { path: "/usr/local/bin:/usr/bin:/bin".into(), libc: Some(Libc::Glibc), has_cli: true }
        );
        assert_eq!(parse("PATH=/bin\n"), Image { path: "/bin".into(), libc: None, has_cli: false });
        assert!(probe_script("claude").contains("command -v claude"));
    }

    #[test]
    fn a_cli_that_cannot_run_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let chains = Toolchains::new(dir.path());
        let claude = Cli::named("claude-code").unwrap();
        let none = missing(claude, &chains, Some(Libc::Glibc)).unwrap();
        assert!(none.contains("sandhold harness install claude-code"), "{none}");
        // An installed glibc-only build, in a musl image.
        let bin = chains.bin_dir(Libc::Glibc);
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("claude"), "").unwrap();
        assert_eq!(missing(claude, &chains, Some(Libc::Glibc)), None);
        let musl = missing(claude, &chains, Some(Libc::Musl)).unwrap();
        assert!(musl.contains("musl only"), "{musl}");
        let bare = missing(claude, &chains, None).unwrap();
        assert!(bare.contains("no C library"), "{bare}");
    }
}
