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
//! ([`LOCATION_VARS`]), the session id as `$1` and the run's working
//! directory as `$2`: exit 0 done, [`NOT_FOUND`] no such session, anything
//! else a failure.
//!
//! | harness | session state | carried |
//! |---|---|---|
//! | Claude Code | `$CLAUDE_CONFIG_DIR` (default `~/.claude`)`/projects/<cwd, non-alphanumerics as ->/<id>.jsonl` (and `<id>/`) | yes, into the new working directory's project |
//! | Codex | `$CODEX_HOME` (default `~/.codex`)`/sessions/YYYY/MM/DD/rollout-*-<id>.jsonl` | yes |
//! | OpenCode | `~/.local/share/opencode/storage/` (session, message and part records keyed by project) | no |
//! | Gemini CLI | `~/.gemini/tmp/<project>/chats/session-*-<id prefix>.jsonl`, the project named in `~/.gemini/projects.json` | no |

pub use shared::snapshot::SESSIONS_DIR;

use super::Harness;

/// Exit code of a carry script that found no such session.
pub const NOT_FOUND: i32 = 3;

/// The variables that decide where a CLI keeps its state: a carry script
/// gets them as the run had them.
pub const LOCATION_VARS: [&str; 5] =
    ["HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "GEMINI_CLI_HOME", "XDG_DATA_HOME"];

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

impl Harness {
    /// Whether a session of this CLI can be carried in a portable snapshot.
    pub fn carries_sessions(self) -> bool {
        matches!(self, Harness::ClaudeCode | Harness::Codex)
    }

    /// The argv (run from the sandbox root) that carries `session` of this
    /// CLI for a run in `cwd` (relative to the root; empty: the root).
    /// `None` when the CLI's sessions are not carried, or when the id is not
    /// one a CLI makes (it lands in file name patterns).
    pub fn carry_session(self, carry: Carry, session: &str, cwd: &str) -> Option<Vec<String>> {
        let plain = !session.is_empty()
            && session.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !session.starts_with('.');
        let script = match (self, carry) {
            (Harness::ClaudeCode, Carry::Export) => CLAUDE_EXPORT,
            (Harness::ClaudeCode, Carry::Import) => CLAUDE_IMPORT,
            (Harness::Codex, Carry::Export) => CODEX_EXPORT,
            (Harness::Codex, Carry::Import) => CODEX_IMPORT,
            _ => return None,
        };
        let cwd = if cwd.is_empty() { "." } else { cwd };
        plain.then(|| ["sh", "-c", script, "sh", session, cwd].into_iter().map(str::to_owned).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use super::*;

    /// Runs a carry script as the driver would, with `home` as HOME.
    fn carry(h: Harness, way: Carry, session: &str, root: &Path, cwd: &str, home: &Path) -> i32 {
        let argv = h.carry_session(way, session, cwd).expect("carried");
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

    #[test]
    fn only_carried_harnesses_and_plain_ids_get_a_script() {
        assert!(Harness::OpenCode.carry_session(Carry::Export, "ses_1", "").is_none());
        assert!(Harness::Gemini.carry_session(Carry::Import, "ab-12", "").is_none());
        for bad in ["", "../x", "a b", "*", ".hidden"] {
            assert!(Harness::Codex.carry_session(Carry::Export, bad, "").is_none(), "{bad:?}");
        }
        let argv = Harness::Codex.carry_session(Carry::Import, "0199-ab", "").unwrap();
        assert_eq!(argv[3..], ["sh", "0199-ab", "."]);
    }

    fn copy_tree(from: &Path, to: &Path) {
        let status = Command::new("cp").arg("-R").arg(from).arg(to).status().unwrap();
        assert!(status.success());
    }
}
