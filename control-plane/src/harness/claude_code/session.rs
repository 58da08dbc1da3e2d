//! The scripts that carry a Claude Code session between its state and the
//! workspace (the contract: [`crate::harness::session`]).

use crate::harness::session::CarryScripts;

const EXPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/claude-code
config=${CLAUDE_CONFIG_DIR:-$HOME/.claude}
for f in "$config"/projects/*/"$id".jsonl; do
  [ -f "$f" ] || exit 3
  rm -rf "$carry" && mkdir -p "$carry" && cp "$f" "$carry/" || exit 1
  if [ -d "${f%.jsonl}" ]; then cp -R "${f%.jsonl}" "$carry/" || exit 1; fi
  exit 0
done
"#;

const IMPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/claude-code
config=${CLAUDE_CONFIG_DIR:-$HOME/.claude}
[ -f "$carry/$id.jsonl" ] || exit 3
key=$(cd "${2:-.}" && pwd -P | sed 's/[^A-Za-z0-9]/-/g') || exit 1
mkdir -p "$config/projects/$key" && cp "$carry/$id.jsonl" "$config/projects/$key/" || exit 1
if [ -d "$carry/$id" ]; then cp -R "$carry/$id" "$config/projects/$key/" || exit 1; fi
"#;

pub(super) const SCRIPTS: CarryScripts = CarryScripts { export: EXPORT, import: IMPORT };

#[cfg(test)]
mod tests {
    use crate::harness::Harness;
    use crate::harness::session::{Carry, NOT_FOUND};
    use crate::harness::testing::{carry, copy_tree};

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
}
