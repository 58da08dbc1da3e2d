//! Where each CLI keeps a session's state, and how one session is carried
//! between that place and the workspace, so that it survives its sandbox.
//!
//! A portable snapshot captures the workspace. After a run that ended in a
//! session, the driver copies that session's files into
//! [`SESSIONS_DIR`]`/<harness>/` (the previous one's are replaced), where
//! the checkpoint taken next picks them up (secret values zeroed, like every
//! captured file). In a new sandbox restored from that checkpoint, the
//! files are copied back to where the CLI looks for them before the run
//! that continues the session starts. Both copies are small POSIX shell
//! scripts run in the sandbox with the run's own location variables
//! ([`LOCATION_VARS`]), the session id as `$1`, the run's working
//! directory as `$2` and the run's program (the CLI) as `$3`: exit 0 done,
//! [`NOT_FOUND`] no such session, anything else a failure.
//!
//! | harness | session state | carried |
//! |---|---|---|
//! | Claude Code | `$CLAUDE_CONFIG_DIR` (default `~/.claude`)`/projects/<cwd, non-alphanumerics as ->/<id>.jsonl` (and `<id>/`) | yes, into the new working directory's project |
//! | Codex | `$CODEX_HOME` (default `~/.codex`)`/sessions/YYYY/MM/DD/rollout-*-<id>.jsonl` | yes |
//! | OpenCode | `$XDG_DATA_HOME` (default `~/.local/share`)`/opencode/opencode.db`, a SQLite database whose sessions are keyed by project and directory | yes, with the CLI's own `opencode export` / `opencode import`, which re-keys the session to the new working directory |
//! | Gemini CLI | `$GEMINI_CLI_HOME` (default `~`)`/.gemini/tmp/<project>/chats/session-*-<id prefix>.jsonl` (and the session's tool outputs and logs), the project named in `.gemini/projects.json` or by the `.project_root` file in its folder | yes, into the folder of the new working directory's project (found, or made with its `.project_root`) |

pub use shared::snapshot::SESSIONS_DIR;

use super::Harness;

/// Exit code of a carry script that found no such session.
pub const NOT_FOUND: i32 = 3;

/// The variables that decide where a CLI keeps its state: a carry script
/// gets them as the run had them.
/// `PATH` too: the OpenCode scripts run the CLI.
pub const LOCATION_VARS: [&str; 6] =
    ["HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "GEMINI_CLI_HOME", "XDG_DATA_HOME", "PATH"];

/// Which way a session is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carry {
    /// From the CLI's state into the workspace.
    Export,
    /// From the workspace back into the CLI's state.
    Import,
}

const CLAUDE_EXPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/claude-code
config=${CLAUDE_CONFIG_DIR:-$HOME/.claude}
for f in "$config"/projects/*/"$id".jsonl; do
  [ -f "$f" ] || exit 3
  rm -rf "$carry" && mkdir -p "$carry" && cp "$f" "$carry/" || exit 1
  if [ -d "${f%.jsonl}" ]; then cp -R "${f%.jsonl}" "$carry/" || exit 1; fi
  exit 0
done
"#;

const CLAUDE_IMPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/claude-code
config=${CLAUDE_CONFIG_DIR:-$HOME/.claude}
[ -f "$carry/$id.jsonl" ] || exit 3
key=$(cd "${2:-.}" && pwd -P | sed 's/[^A-Za-z0-9]/-/g') || exit 1
mkdir -p "$config/projects/$key" && cp "$carry/$id.jsonl" "$config/projects/$key/" || exit 1
if [ -d "$carry/$id" ]; then cp -R "$carry/$id" "$config/projects/$key/" || exit 1; fi
"#;

const CODEX_EXPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/codex
sessions=${CODEX_HOME:-$HOME/.codex}/sessions
f=$(find "$sessions" -type f -name "rollout-*-$id.jsonl" 2>/dev/null | head -n 1)
[ -n "$f" ] || exit 3
rel=${f#"$sessions"/}
rm -rf "$carry" && mkdir -p "$carry/${rel%/*}" && cp "$f" "$carry/$rel" || exit 1
"#;

const CODEX_IMPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/codex
sessions=${CODEX_HOME:-$HOME/.codex}/sessions
f=$(cd "$carry" 2>/dev/null && find . -type f -name "rollout-*-$id.jsonl" | head -n 1)
[ -n "$f" ] || exit 3
rel=${f#./}
mkdir -p "$sessions/${rel%/*}" && cp "$carry/$rel" "$sessions/$rel" || exit 1
"#;

// OpenCode keeps sessions in a SQLite database: its own export writes one
// session as JSON, and its import files it under the working directory's
// project (an existing copy is re-keyed, its messages kept).
const OPENCODE_EXPORT: &str = r#"set -u
id=$1 carry=$PWD/.sandhold/sessions/opencode
out=$PWD/.sandhold/sessions/.opencode-$$
mkdir -p "${out%/*}" || exit 1
if ! (cd "${2:-.}" && "$3" export "$id" >"$out.json" 2>"$out.err"); then
  grep -q 'Session not found' "$out.err"; found=$?
  cat "$out.err" >&2; rm -f "$out.json" "$out.err"
  [ "$found" -eq 0 ] && exit 3
  exit 1
fi
rm -rf "$carry" && mkdir -p "$carry" && mv "$out.json" "$carry/$id.json" || exit 1
rm -f "$out.err"
"#;

const OPENCODE_IMPORT: &str = r#"set -u
id=$1 carry=$PWD/.sandhold/sessions/opencode
[ -f "$carry/$id.json" ] || exit 3
cd "${2:-.}" && "$3" import "$carry/$id.json" >/dev/null || exit 1
"#;

// Gemini CLI keeps a project's chats in a folder of its own, named in
// projects.json or claimed by a `.project_root` file holding the project's
// path: the import finds the new working directory's folder that way, or
// makes one with that file (which Gemini CLI adopts).
const GEMINI_EXPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/gemini
tmp=${GEMINI_CLI_HOME:-$HOME}/.gemini/tmp
short=$(printf %.8s "$id") found=
for f in "$tmp"/*/chats/session-*-"$short".json "$tmp"/*/chats/session-*-"$short".jsonl; do
  [ -f "$f" ] && grep -qF "\"sessionId\":\"$id\"" "$f" || continue
  if [ -z "$found" ]; then rm -rf "$carry" && mkdir -p "$carry/chats" || exit 1; fi
  found=1 project=${f%/chats/*}
  cp "$f" "$carry/chats/" || exit 1
  for d in "chats/$id" "tool-outputs/session-$id" "logs/session-$id.jsonl" "$id"; do
    [ -e "$project/$d" ] || continue
    into=$carry/$(dirname "$d")
    mkdir -p "$into" && cp -R "$project/$d" "$into/" || exit 1
  done
done
[ -n "$found" ] || exit 3
"#;

const GEMINI_IMPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/gemini
gemini=${GEMINI_CLI_HOME:-$HOME}/.gemini
grep -sqF "\"sessionId\":\"$id\"" "$carry"/chats/session-* || exit 3
root=$(cd "${2:-.}" && pwd -P) || exit 1
slug=$(awk -v k="\"$root\": \"" 'i = index($0, k) { s = substr($0, i + length(k)); sub(/".*/, "", s); print s; exit }' \
  "$gemini/projects.json" 2>/dev/null)
if [ -z "$slug" ]; then
  for m in "$gemini"/tmp/*/.project_root; do
    [ -f "$m" ] && [ "$(cat "$m")" = "$root" ] || continue
    slug=${m%/.project_root} && slug=${slug##*/}
    break
  done
fi
if [ -z "$slug" ]; then
  n=0 base=sandhold-$(printf %s "$root" | cksum | cut -d ' ' -f 1)
  while [ -e "$gemini/tmp/$base-$n" ]; do n=$((n + 1)); done
  slug=$base-$n
fi
mkdir -p "$gemini/tmp/$slug" || exit 1
[ -f "$gemini/tmp/$slug/.project_root" ] || printf '%s' "$root" >"$gemini/tmp/$slug/.project_root" || exit 1
cp -R "$carry"/. "$gemini/tmp/$slug/" || exit 1
"#;

impl Harness {
    /// Whether a session of this CLI can be carried in a portable snapshot.
    pub fn carries_sessions(self) -> bool {
        matches!(self, Harness::ClaudeCode | Harness::Codex | Harness::OpenCode | Harness::Gemini)
    }

    /// Whether carrying a session runs the CLI itself (with the run's PATH).
    pub fn carry_runs_the_cli(self) -> bool {
        self == Harness::OpenCode
    }

    /// The argv (run from the sandbox root) that carries `session` of this
    /// CLI for a run of `program` in `cwd` (relative to the root; empty: the
    /// root).
    /// `None` when the CLI's sessions are not carried, or when the id is not
    /// one a CLI makes (it lands in file name patterns).
    pub fn carry_session(self, carry: Carry, session: &str, cwd: &str, program: &str) -> Option<Vec<String>> {
        let plain = !session.is_empty()
            && session.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !session.starts_with('.');
        let script = match (self, carry) {
            (Harness::ClaudeCode, Carry::Export) => CLAUDE_EXPORT,
            (Harness::ClaudeCode, Carry::Import) => CLAUDE_IMPORT,
            (Harness::Codex, Carry::Export) => CODEX_EXPORT,
            (Harness::Codex, Carry::Import) => CODEX_IMPORT,
            (Harness::OpenCode, Carry::Export) => OPENCODE_EXPORT,
            (Harness::OpenCode, Carry::Import) => OPENCODE_IMPORT,
            (Harness::Gemini, Carry::Export) => GEMINI_EXPORT,
            (Harness::Gemini, Carry::Import) => GEMINI_IMPORT,
            _ => return None,
        };
        let cwd = if cwd.is_empty() { "." } else { cwd };
        plain.then(|| {
            ["sh", "-c", script, "sh", session, cwd, program].into_iter().map(str::to_owned).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use super::*;

    /// Runs a carry script as the driver would, with `home` as HOME.
    fn carry(h: Harness, way: Carry, session: &str, root: &Path, cwd: &str, home: &Path) -> i32 {
        carry_of(h, "cli", way, session, root, cwd, home)
    }

    /// As [`carry`], for a run of `program`.
    fn carry_of(
        h: Harness,
        program: &str,
        way: Carry,
        session: &str,
        root: &Path,
        cwd: &str,
        home: &Path,
    ) -> i32 {
        let argv = h.carry_session(way, session, cwd, program).expect("carried");
        let status = Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(root)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .status()
            .unwrap();
        status.code().unwrap_or(-1)
    }

    #[test]
    fn claude_code_sessions_move_into_the_new_working_directorys_project() {
        let tmp = tempfile::tempdir().unwrap();
        let (old_home, new_home) = (tmp.path().join("h1"), tmp.path().join("h2"));
        let (old_root, new_root) = (tmp.path().join("sbx.1/ws"), tmp.path().join("sbx_2/ws"));
        std::fs::create_dir_all(new_root.join("sub")).unwrap();
        let project = old_home.join(".claude/projects/-elsewhere");
        std::fs::create_dir_all(project.join("s-1/tool-results")).unwrap();
        std::fs::create_dir_all(&old_root).unwrap();
        std::fs::write(project.join("s-1.jsonl"), "turn one\n").unwrap();
        std::fs::write(project.join("s-1/tool-results/a"), "out").unwrap();
        std::fs::write(project.join("other.jsonl"), "not this one").unwrap();

        assert_eq!(carry(Harness::ClaudeCode, Carry::Export, "s-1", &old_root, "", &old_home), 0);
        let carried = old_root.join(".sandhold/sessions/claude-code");
        assert_eq!(std::fs::read_to_string(carried.join("s-1.jsonl")).unwrap(), "turn one\n");
        assert!(carried.join("s-1/tool-results/a").is_file());
        assert!(!carried.join("other.jsonl").exists(), "only the run's session is carried");
        assert_eq!(carry(Harness::ClaudeCode, Carry::Export, "s-2", &old_root, "", &old_home), NOT_FOUND);

        // The restore brought the workspace over; the session goes where
        // Claude Code looks for it from the run's working directory.
        copy_tree(&old_root.join(".sandhold"), &new_root.join(".sandhold"));
        assert_eq!(carry(Harness::ClaudeCode, Carry::Import, "s-1", &new_root, "sub", &new_home), 0);
        let real = std::fs::canonicalize(new_root.join("sub")).unwrap();
        let key: String =
            real.to_str().unwrap().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let restored = new_home.join(".claude/projects").join(key);
        assert_eq!(std::fs::read_to_string(restored.join("s-1.jsonl")).unwrap(), "turn one\n");
        assert_eq!(std::fs::read_to_string(restored.join("s-1/tool-results/a")).unwrap(), "out");
        assert_eq!(carry(Harness::ClaudeCode, Carry::Import, "s-2", &new_root, "", &new_home), NOT_FOUND);
    }

    #[test]
    fn codex_sessions_keep_their_dated_path() {
        let tmp = tempfile::tempdir().unwrap();
        let (old_home, new_home) = (tmp.path().join("h1"), tmp.path().join("h2"));
        let (old_root, new_root) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&new_root).unwrap();
        std::fs::create_dir_all(&old_root).unwrap();
        let day = old_home.join(".codex/sessions/2026/12/02");
        std::fs::create_dir_all(&day).unwrap();
        std::fs::write(day.join("rollout-2026-12-02T08-00-00-0199-ab.jsonl"), "rollout").unwrap();
        std::fs::write(day.join("rollout-2026-12-02T08-00-00-0199-cd.jsonl"), "another").unwrap();

        assert_eq!(carry(Harness::Codex, Carry::Export, "0199-ab", &old_root, "", &old_home), 0);
        copy_tree(&old_root.join(".sandhold"), &new_root.join(".sandhold"));
        assert_eq!(carry(Harness::Codex, Carry::Import, "0199-ab", &new_root, "", &new_home), 0);
        let restored = new_home.join(".codex/sessions/2026/12/02");
        let names: Vec<_> = std::fs::read_dir(&restored).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["rollout-2026-12-02T08-00-00-0199-ab.jsonl"]);
        assert_eq!(carry(Harness::Codex, Carry::Import, "0199-cd", &new_root, "", &new_home), NOT_FOUND);
    }

    /// A stand-in for `opencode export/import`: it keeps one session,
    /// `ses_1`, and logs where each import ran and what it was given.
    const FAKE_OPENCODE: &str = r#"#!/bin/sh
case $1 in
export)
  echo "Exporting session: $2" >&2
  [ "$2" = ses_1 ] || { echo "Error: Session not found: $2" >&2; exit 1; }
  [ -f "$HOME/broken" ] && { echo "Error: database is locked" >&2; exit 1; }
  printf '{"info":{"id":"%s","directory":"%s"}}\n' "$2" "$PWD" ;;
import)
  printf '%s %s\n' "$PWD" "$(cat "$2")" >>"$HOME/imports"
  echo "Imported session: x" ;;
esac
"#;

    #[test]
    fn opencode_sessions_go_through_its_own_export_and_import() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let (old_home, new_home) = (tmp.path().join("h1"), tmp.path().join("h2"));
        let (old_root, new_root) = (tmp.path().join("a"), tmp.path().join("b"));
        for d in [&old_home, &new_home, &old_root.join("sub"), &new_root.join("sub")] {
            std::fs::create_dir_all(d).unwrap();
        }
        let cli = tmp.path().join("opencode");
        std::fs::write(&cli, FAKE_OPENCODE).unwrap();
        std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cli = cli.to_str().unwrap();
        let oc = |way, session: &str, root: &Path, home: &Path| {
            carry_of(Harness::OpenCode, cli, way, session, root, "sub", home)
        };

        assert_eq!(oc(Carry::Export, "ses_1", &old_root, &old_home), 0);
        let carried = old_root.join(".sandhold/sessions/opencode/ses_1.json");
        let exported = std::fs::read_to_string(&carried).unwrap();
        let sub = old_root.join("sub").display().to_string();
        assert_eq!(exported, format!("{{\"info\":{{\"id\":\"ses_1\",\"directory\":\"{sub}\"}}}}\n"));
        // No such session, or a failing CLI: the carried copy stays as it was.
        assert_eq!(oc(Carry::Export, "ses_2", &old_root, &old_home), NOT_FOUND);
        std::fs::write(old_home.join("broken"), "").unwrap();
        assert_eq!(oc(Carry::Export, "ses_1", &old_root, &old_home), 1);
        assert_eq!(std::fs::read_to_string(&carried).unwrap(), exported);
        let left: Vec<_> = std::fs::read_dir(old_root.join(".sandhold/sessions")).unwrap().collect();
        assert_eq!(left.len(), 1, "no temp file left: {left:?}");

        copy_tree(&old_root.join(".sandhold"), &new_root.join(".sandhold"));
        assert_eq!(oc(Carry::Import, "ses_1", &new_root, &new_home), 0);
        let imports = std::fs::read_to_string(new_home.join("imports")).unwrap();
        let into = new_root.join("sub").display().to_string();
        assert_eq!(imports, format!("{into} {exported}"), "imported from the run's working directory");
        assert_eq!(oc(Carry::Import, "ses_2", &new_root, &new_home), NOT_FOUND);
    }

    const GEMINI_ID: &str = "833a190a-6ac3-450e-ba47-4531e154b860";

    fn gemini_chat(id: &str, text: &str) -> String {
        format!("{{\"sessionId\":\"{id}\",\"kind\":\"main\"}}\n{text}\n")
    }

    #[test]
    fn gemini_sessions_move_into_the_new_working_directorys_project() {
        let tmp = tempfile::tempdir().unwrap();
        let old_home = tmp.path().join("h1");
        let (old_root, new_root) = (tmp.path().join("a/ws"), tmp.path().join("b/ws"));
        std::fs::create_dir_all(&old_root).unwrap();
        std::fs::create_dir_all(new_root.join("sub")).unwrap();
        let project = old_home.join(".gemini/tmp/ws");
        std::fs::create_dir_all(project.join("chats")).unwrap();
        std::fs::create_dir_all(project.join(format!("tool-outputs/session-{GEMINI_ID}"))).unwrap();
        std::fs::create_dir_all(project.join("logs")).unwrap();
        std::fs::write(
            project.join("chats/session-2026-12-02T10-43-833a190a.jsonl"),
            gemini_chat(GEMINI_ID, "one"),
        )
        .unwrap();
        std::fs::write(
            project.join("chats/session-2026-12-02T10-44-833a190a.jsonl"),
            gemini_chat(GEMINI_ID, "two"),
        )
        .unwrap();
        // The same eight first characters, another session.
        let other = "833a190a-0000-0000-0000-000000000000";
        std::fs::write(
            project.join("chats/session-2026-12-02T10-45-833a190a.jsonl"),
            gemini_chat(other, "no"),
        )
        .unwrap();
        std::fs::write(project.join(format!("tool-outputs/session-{GEMINI_ID}/shell_1.txt")), "out").unwrap();
        std::fs::write(project.join(format!("logs/session-{GEMINI_ID}.jsonl")), "log").unwrap();

        assert_eq!(carry(Harness::Gemini, Carry::Export, GEMINI_ID, &old_root, "", &old_home), 0);
        let carried = old_root.join(".sandhold/sessions/gemini");
        let mut chats: Vec<_> =
            std::fs::read_dir(carried.join("chats")).unwrap().map(|e| e.unwrap().file_name()).collect();
        chats.sort();
        assert_eq!(
            chats,
            ["session-2026-12-02T10-43-833a190a.jsonl", "session-2026-12-02T10-44-833a190a.jsonl"]
        );
        assert_eq!(
            std::fs::read_to_string(carried.join(format!("tool-outputs/session-{GEMINI_ID}/shell_1.txt")))
                .unwrap(),
            "out"
        );
        assert_eq!(
            std::fs::read_to_string(carried.join(format!("logs/session-{GEMINI_ID}.jsonl"))).unwrap(),
            "log"
        );
        assert_eq!(
            carry(
                Harness::Gemini,
                Carry::Export,
                "deadbeef-0000-0000-0000-000000000000",
                &old_root,
                "",
                &old_home
            ),
            NOT_FOUND
        );

        let real = std::fs::canonicalize(new_root.join("sub")).unwrap().display().to_string();
        let restore = |home: &Path| {
            let root = tmp.path().join(format!("r-{}", home.file_name().unwrap().to_str().unwrap()));
            std::fs::create_dir_all(&root).unwrap();
            copy_tree(&old_root.join(".sandhold"), &root.join(".sandhold"));
            // The run's working directory is the new sandbox's `sub`,
            // wherever the restore put the carried files.
            let status = Command::new("sh")
                .args(["-c", "ln -s \"$1\" sub", "sh", &new_root.join("sub").display().to_string()])
                .current_dir(&root)
                .status()
                .unwrap();
            assert!(status.success());
            carry(Harness::Gemini, Carry::Import, GEMINI_ID, &root, "sub", home)
        };
        let chat =
            |dir: &Path| std::fs::read_to_string(dir.join("chats/session-2026-12-02T10-44-833a190a.jsonl"));

        // A home that has never seen the project: a new folder, claimed by
        // its `.project_root`, not the folder of another `ws`.
        let fresh = tmp.path().join("h2");
        let taken = fresh.join(".gemini/tmp/ws");
        std::fs::create_dir_all(&taken).unwrap();
        std::fs::write(taken.join(".project_root"), "/elsewhere/ws").unwrap();
        assert_eq!(restore(&fresh), 0);
        let made: Vec<_> = std::fs::read_dir(fresh.join(".gemini/tmp"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p != &taken)
            .collect();
        assert_eq!(made.len(), 1, "{made:?}");
        assert!(made[0].file_name().unwrap().to_str().unwrap().starts_with("sandhold-"));
        assert_eq!(std::fs::read_to_string(made[0].join(".project_root")).unwrap(), real);
        assert_eq!(chat(&made[0]).unwrap(), gemini_chat(GEMINI_ID, "two"));
        assert!(made[0].join(format!("tool-outputs/session-{GEMINI_ID}/shell_1.txt")).is_file());
        assert!(chat(&taken).is_err(), "another project's folder is left alone");
        // Again: the same folder, found by its `.project_root`.
        assert_eq!(restore(&fresh), 0);
        assert_eq!(std::fs::read_dir(fresh.join(".gemini/tmp")).unwrap().count(), 2);

        // A home whose registry names the project's folder already.
        let known = tmp.path().join("h3");
        std::fs::create_dir_all(known.join(".gemini")).unwrap();
        let registry =
            format!("{{\n  \"projects\": {{\n    \"/x\": \"x\",\n    \"{real}\": \"mine-1\"\n  }}\n}}");
        std::fs::write(known.join(".gemini/projects.json"), registry).unwrap();
        assert_eq!(restore(&known), 0);
        assert_eq!(chat(&known.join(".gemini/tmp/mine-1")).unwrap(), gemini_chat(GEMINI_ID, "two"));

        let empty = tmp.path().join("h4");
        std::fs::create_dir_all(&empty).unwrap();
        assert_eq!(carry(Harness::Gemini, Carry::Import, other, &new_root, "", &empty), NOT_FOUND);
    }

    #[test]
    fn only_carried_harnesses_and_plain_ids_get_a_script() {
        assert!(Harness::Command.carry_session(Carry::Export, "s1", "", "sh").is_none());
        assert!(Harness::Acp.carry_session(Carry::Import, "ab-12", "", "agent").is_none());
        for bad in ["", "../x", "a b", "*", ".hidden"] {
            assert!(Harness::Codex.carry_session(Carry::Export, bad, "", "codex").is_none(), "{bad:?}");
        }
        let argv = Harness::OpenCode.carry_session(Carry::Import, "ses_1", "", "/bin/opencode").unwrap();
        assert_eq!(argv[3..], ["sh", "ses_1", ".", "/bin/opencode"]);
    }

    fn copy_tree(from: &Path, to: &Path) {
        let status = Command::new("cp").arg("-R").arg(from).arg(to).status().unwrap();
        assert!(status.success());
    }
}
