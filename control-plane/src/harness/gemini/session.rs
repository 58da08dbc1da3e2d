//! The scripts that carry a Gemini CLI session between its state and the
//! workspace (the contract: [`crate::harness::session`]).

use crate::harness::session::CarryScripts;

// Gemini CLI keeps a project's chats in a folder of its own, named in
// projects.json or claimed by a `.project_root` file holding the project's
// path: the import finds the new working directory's folder that way, or
// makes one with that file (which Gemini CLI adopts).
const EXPORT: &str = r#"set -u
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

const IMPORT: &str = r#"set -u
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

pub(super) const SCRIPTS: CarryScripts = CarryScripts { export: EXPORT, import: IMPORT };

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use crate::harness::Harness;
    use crate::harness::session::{Carry, NOT_FOUND};
    use crate::harness::testing::{carry, copy_tree};

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
}
