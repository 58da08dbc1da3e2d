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

/// A CLI's two carry scripts (each harness folder's `session.rs`).
#[derive(Debug)]
pub struct CarryScripts {
    pub export: &'static str,
    pub import: &'static str,
}

impl CarryScripts {
    pub(super) fn get(&self, carry: Carry) -> &'static str {
        match carry {
            Carry::Export => self.export,
            Carry::Import => self.import,
        }
    }
}

/// The argv (run from the sandbox root) that runs carry `script` for
/// `session` of a run of `program` in `cwd` (relative to the root; empty:
/// the root). `None` when the id is not one a CLI makes (it lands in file
/// name patterns).
pub(super) fn carry_argv(script: &str, session: &str, cwd: &str, program: &str) -> Option<Vec<String>> {
    let plain = !session.is_empty()
        && session.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !session.starts_with('.');
    let cwd = if cwd.is_empty() { "." } else { cwd };
    plain.then(|| ["sh", "-c", script, "sh", session, cwd, program].into_iter().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Harness;

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
}
