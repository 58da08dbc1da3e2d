//! The scripts that carry a OpenCode session between its state and the
//! workspace (the contract: [`crate::harness::session`]).

use crate::harness::session::CarryScripts;

// OpenCode keeps sessions in a SQLite database: its own export writes one
// session as JSON, and its import files it under the working directory's
// project (an existing copy is re-keyed, its messages kept).
const EXPORT: &str = r#"set -u
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

const IMPORT: &str = r#"set -u
id=$1 carry=$PWD/.sandhold/sessions/opencode
[ -f "$carry/$id.json" ] || exit 3
cd "${2:-.}" && "$3" import "$carry/$id.json" >/dev/null || exit 1
"#;

pub(super) const SCRIPTS: CarryScripts = CarryScripts { export: EXPORT, import: IMPORT };

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::harness::Harness;
    use crate::harness::session::{Carry, NOT_FOUND};
    use crate::harness::testing::{carry_of, copy_tree};

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
}
