//! The scripts that carry a Codex session between its state and the
//! workspace (the contract: [`crate::harness::session`]).

use crate::harness::session::CarryScripts;

const EXPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/codex
sessions=${CODEX_HOME:-$HOME/.codex}/sessions
f=$(find "$sessions" -type f -name "rollout-*-$id.jsonl" 2>/dev/null | head -n 1)
[ -n "$f" ] || exit 3
rel=${f#"$sessions"/}
rm -rf "$carry" && mkdir -p "$carry/${rel%/*}" && cp "$f" "$carry/$rel" || exit 1
"#;

const IMPORT: &str = r#"set -u
id=$1 carry=.sandhold/sessions/codex
sessions=${CODEX_HOME:-$HOME/.codex}/sessions
f=$(cd "$carry" 2>/dev/null && find . -type f -name "rollout-*-$id.jsonl" | head -n 1)
[ -n "$f" ] || exit 3
rel=${f#./}
mkdir -p "$sessions/${rel%/*}" && cp "$carry/$rel" "$sessions/$rel" || exit 1
"#;

pub(super) const SCRIPTS: CarryScripts = CarryScripts { export: EXPORT, import: IMPORT };

#[cfg(test)]
mod tests {
    use crate::harness::Harness;
    use crate::harness::session::{Carry, NOT_FOUND};
    use crate::harness::testing::{carry, copy_tree};

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
}
