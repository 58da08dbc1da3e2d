//! The README and the docs cannot drift from what works: the fenced blocks
//! marked ```` ```sh test ```` in `README.md` and every `docs/*.md` are
//! executed (the real binaries, an embedded server on a temporary data dir),
//! the `sandhold serve` settings table of `docs/settings.md` is checked
//! against the clap definitions, flag by flag and variable by variable, and
//! `docs/cli.md` and `docs/api.md` against the commands and error reasons.
//!
//! Each test block is followed by the output its text promises, in an HTML
//! comment (invisible on the rendered page):
//!
//! ````text
//! ```sh test
//! sandhold run --output json -- echo hi | tail -1
//! ```
//! <!-- expect:
//! "type":"RUN_FINISHED"
//! -->
//! ````
//!
//! Every line between `<!-- expect:` and `-->` must be part of a line the
//! block prints on stdout, the lines in that order (one stdout line per
//! expected line). A test block without one fails: say what it shows. The
//! JSON lines of a block with `--output json` are held to
//! `docs/schema/cli-output.schema.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `docs/<name>.md`.
fn doc(name: &str) -> String {
    let path = repo_root().join("docs").join(format!("{name}.md"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `README.md` and every `docs/*.md` (sorted), each with its path from the
/// repository's root.
fn documents() -> Vec<(String, String)> {
    let root = repo_root();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    std::iter::once(root.join("README.md"))
        .chain(docs)
        .map(|p| {
            let name = p.strip_prefix(&root).unwrap().display().to_string();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The text of one `## heading` section.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text.find(&format!("\n## {heading}\n")).unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map(|i| i + 3).unwrap_or(rest.len());
    &rest[..end]
}

/// A ```` ```sh test ```` block: the line it starts on, its script, and the
/// stdout lines its `<!-- expect: ... -->` comment promises.
#[derive(Debug)]
struct TestBlock {
    line: usize,
    body: String,
    expect: Vec<String>,
}

/// Blocks fenced with ```` ```sh test ````, each with its expectations (the
/// `<!-- expect:` comment right after it, blank lines between allowed).
fn test_blocks(text: &str) -> Vec<TestBlock> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut n = 0;
    while n < lines.len() {
        if lines[n].trim() != "```sh test" {
            n += 1;
            continue;
        }
        let start = n + 1;
        let end = (start..lines.len())
            .find(|&i| lines[i].trim() == "```")
            .unwrap_or_else(|| panic!("an unterminated ```sh test block at line {start}"));
        let body: String = lines[start..end].iter().map(|l| format!("{l}\n")).collect();
        let mut at = end + 1;
        while at < lines.len() && lines[at].trim().is_empty() {
            at += 1;
        }
        let mut expect = Vec::new();
        if lines.get(at).is_some_and(|l| l.trim() == "<!-- expect:") {
            let close = (at + 1..lines.len())
                .find(|&i| lines[i].trim() == "-->")
                .unwrap_or_else(|| panic!("an unterminated <!-- expect: at line {}", at + 1));
            expect =
                lines[at + 1..close].iter().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
            at = close + 1;
        }
        blocks.push(TestBlock { line: start, body, expect });
        n = at;
    }
    blocks
}

/// The first of `expect` that is not part of `stdout`'s lines in order, if
/// any.
fn missing_output<'a>(stdout: &str, expect: &'a [String]) -> Option<&'a str> {
    let mut lines = stdout.lines();
    expect.iter().find(|want| !lines.any(|line| line.contains(want.as_str()))).map(String::as_str)
}

#[test]
fn expectations_are_matched_in_order() {
    let blocks = test_blocks("```sh test\necho a\n```\n\n<!-- expect:\na\n b \n-->\n```sh test\ntrue\n```\n");
    assert_eq!(blocks.len(), 2);
    assert_eq!((blocks[0].line, blocks[0].body.as_str()), (1, "echo a\n"));
    assert_eq!(blocks[0].expect, ["a", "b"]);
    assert!(blocks[1].expect.is_empty());
    let want = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(missing_output("xa\nby\n", &want(&["a", "b"])), None);
    assert_eq!(missing_output("by\nxa\n", &want(&["a", "b"])), Some("b"), "in order");
    assert_eq!(missing_output("ab\n", &want(&["a", "b"])), Some("b"), "one line each");
    assert_eq!(
        missing_output("made at 1\nmade at 1\n", &want(&["made at", "made at", "made.txt"])),
        Some("made.txt")
    );
}

/// `--flag` -> its variable, from the settings table of
/// `docs/settings.md`.
fn documented_settings(text: &str) -> BTreeMap<String, String> {
    let code = |cell: &str| cell.split('`').nth(1).map(str::to_string);
    section(text, "Settings")
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let flag = code(cells[0]).unwrap().split_whitespace().next().unwrap().to_string();
            (flag, code(cells[1]).unwrap_or_default())
        })
        .collect()
}

#[test]
fn the_serve_settings_table_matches_the_flags() {
    let cli = control_plane::cli::Cli::command();
    let serve = cli.find_subcommand("serve").unwrap();
    let actual: BTreeMap<String, String> = serve
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_string_lossy().into_owned();
            Some((format!("--{}", a.get_long()?), env))
        })
        .collect();
    assert!(actual.len() > 10, "clap's view of serve: {actual:?}");
    let documented = documented_settings(&doc("settings"));
    assert_eq!(
        documented, actual,
        "docs/settings.md's `sandhold serve` table (left) must list every flag with its variable (right)"
    );
}

#[test]
fn the_cli_reference_names_every_command_and_variable() {
    let reference = doc("cli");
    let cli = control_plane::cli::Cli::command();
    for sub in cli.get_subcommands() {
        let name = format!("`sandhold {}", sub.get_name());
        assert!(reference.contains(&name), "docs/cli.md lacks {name}`");
    }
    let run = cli.find_subcommand("run").unwrap();
    for arg in run.get_arguments() {
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy();
            assert!(reference.contains(&*env), "docs/cli.md lacks {env}");
        }
        if let Some(long) =
            arg.get_long().filter(|l| !["help", "agent-binary", "agent-static-binary"].contains(l))
        {
            assert!(reference.contains(&format!("--{long}")), "docs/cli.md never mentions run --{long}");
        }
    }
    assert!(reference.contains(control_plane::cli::TOKEN_VAR));
}

#[test]
fn the_readme_commands_work() {
    let blocks: Vec<(String, TestBlock)> = documents()
        .into_iter()
        .flat_map(|(file, text)| test_blocks(&text).into_iter().map(move |b| (file.clone(), b)))
        .collect();
    assert!(blocks.len() >= 4, "test blocks: {blocks:?}");
    assert!(
        blocks.iter().filter(|(file, _)| file == "README.md").count() >= 4,
        "the README's quickstarts are tested: {blocks:?}"
    );
    let dir = sandhold_tests::local::TestDir::new("sh-readme");
    // The blocks use the background server a reader's commands start.
    let _daemon = sandhold_tests::cli::Background(dir.path().join("data"));
    // What the README calls `sandhold` is on PATH, as it tells readers to do.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sandhold"), bin.join("sandhold")).unwrap();
    std::os::unix::fs::symlink(sandhold_tests::agent::static_agent(), bin.join("sandhold-agent")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();

    for (file, TestBlock { line, body, expect }) in blocks {
        assert!(
            !expect.is_empty(),
            "{file} block at line {line} promises no output: add <!-- expect: ... -->"
        );
        let mut cmd = Command::new("bash");
        cmd.arg("-euo").arg("pipefail").arg("-c").arg(&body).current_dir(repo_root());
        for (k, _) in std::env::vars() {
            if k.starts_with("SANDHOLD_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd
            .env("PATH", &path)
            .env("TMPDIR", &tmp)
            .env("SANDHOLD_DATA_DIR", dir.path().join("data"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{file} block at line {line} failed ({:?}):\n{body}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status.code()
        );
        // What it shows of --output json is what docs/schema describes.
        if body.contains("--output json") {
            for json in stdout.lines().filter(|l| l.starts_with('{')) {
                let value = serde_json::from_str(json)
                    .unwrap_or_else(|e| panic!("README.md block at line {line}: not JSON ({e}): {json}"));
                if let Some(why) = sandhold_tests::cli::output_violation(&value) {
                    panic!(
                        "README.md block at line {line} printed a line docs/schema/cli-output.schema.json does not describe: {why}\n{json}"
                    );
                }
            }
        }
        // Outcomes the text promises, not only exit codes.
        if let Some(want) = missing_output(&stdout, &expect) {
            panic!(
                "{file} block at line {line} did not print {want:?} (after the lines before it in its <!-- expect: -->, in order):\n{body}\nstdout:\n{stdout}\nstderr:\n{stderr}"
            );
        }
        if body.contains("--repo .") {
            assert!(
                stdout.contains("Cargo.toml"),
                "the main job lists the cloned repository:\n{stdout}\n{stderr}"
            );
        }
        if body.contains("sandhold cancel") {
            assert!(stdout.contains("exit code 130"), "cancel ends the run with 130:\n{stdout}\n{stderr}");
        }
        if body.contains("step $i") {
            assert!(stdout.contains("step 1\nstep 2\nstep 3\n"), "attach shows the whole run:\n{stdout}");
        }
    }
}

/// The API guide's error table lists every reason of the closed set with
/// the gRPC code it travels as.
#[test]
fn the_api_guide_lists_every_error_reason() {
    let text = doc("api");
    let guide = section(&text, "Errors");
    for code in shared::error::ErrorCode::ALL {
        let grpc = format!("{:?}", code.grpc_code());
        let upper: String = grpc
            .chars()
            .enumerate()
            .flat_map(|(i, c)| {
                let sep = (c.is_uppercase() && i > 0).then_some('_');
                sep.into_iter().chain(c.to_uppercase())
            })
            .collect();
        let row = format!("| `{}` | {} |", code.reason(), upper);
        assert!(guide.contains(&row), "docs/api.md's errors lack the row starting {row:?}");
    }
}
