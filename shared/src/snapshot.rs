//! Rules of portable snapshots both sides apply: the default exclusions and
//! the checks a manifest must pass before anything is restored from it.

use std::collections::{BTreeMap, HashSet};

use crate::error::{Error, ErrorCode};
use crate::proto::agent::v1::{EntryKind, ManifestEntry};

/// A file the workspace projection writes at the root to mark what it
/// projected. Never captured, whatever the policy says.
pub const PROJECTION_MARKER: &str = ".sandhold/projection.json";

/// Where the workspace carries the harness sessions of its thread (one
/// folder per harness), so that portable snapshots take them along. A
/// policy's exclusions never reach inside it.
pub const SESSIONS_DIR: &str = ".sandhold/sessions";

/// Whether `path` is the sessions folder or inside it.
pub fn is_session_state(path: &str) -> bool {
    path.strip_prefix(SESSIONS_DIR).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Folders whose direct children are projected skills (`<folder>/<name>`).
pub const PROJECTED_SKILL_FOLDERS: [&str; 3] = [".claude/skills", ".codex/skills", ".sandhold/skills"];

/// Root files projected from the definition's instructions.
pub const PROJECTED_ROOT_FILES: [&str; 2] = ["CLAUDE.md", "GEMINI.md"];

/// Longest path a manifest may carry, and longest segment.
const MAX_PATH: usize = 4096;
const MAX_SEGMENT: usize = 255;

/// Whether the default policy leaves `path` (relative, `/`-separated) out:
/// `.git`, `node_modules` and `.env*` segments at any depth, root
/// `CLAUDE.md` / `GEMINI.md`, and projected skill folders' children. By
/// path, whatever the entry is (a regular file or a copy included).
pub fn default_excluded(path: &str) -> bool {
    if path.split('/').any(|seg| seg == ".git" || seg == "node_modules" || seg.starts_with(".env")) {
        return true;
    }
    if PROJECTED_ROOT_FILES.contains(&path) {
        return true;
    }
    PROJECTED_SKILL_FOLDERS.iter().any(|folder| {
        path.strip_prefix(folder).and_then(|rest| rest.strip_prefix('/')).is_some_and(|name| !name.is_empty())
    })
}

/// Whether `path` is always excluded (the exact projection marker).
pub fn always_excluded(path: &str) -> bool {
    path == PROJECTION_MARKER
}

/// Hex SHA-256 as manifests carry it: 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A manifest path must be relative, normalized and `/`-separated: no empty,
/// `.` or `..` segment, no NUL, no leading `/`.
pub fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.len() > MAX_PATH {
        return Err("path too long".into());
    }
    if path.starts_with('/') {
        return Err("absolute path".into());
    }
    if path.contains('\0') {
        return Err("NUL byte in path".into());
    }
    for seg in path.split('/') {
        match seg {
            "" => return Err("empty path segment".into()),
            "." | ".." => return Err(format!("{seg:?} segment")),
            s if s.len() > MAX_SEGMENT => return Err("path segment too long".into()),
            _ => {}
        }
    }
    Ok(())
}

/// What a valid manifest holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ManifestSummary {
    /// Every blob the files reference, with its size.
    pub blobs: BTreeMap<String, u64>,
    pub files: u64,
    pub dirs: u64,
    pub total_bytes: u64,
}

fn refused(path: &str, why: impl Into<String>) -> Error {
    let why = why.into();
    Error::new(ErrorCode::InvalidArgument, format!("manifest entry {path:?}: {why}"))
        .with_meta("path", path)
        .with_violation("manifest", why)
}

/// Check every entry of a manifest: paths (see [`check_path`]), no
/// duplicate, no entry below a file, kinds, modes (no executable, setuid,
/// setgid or sticky bit), hashes, and one size per blob.
pub fn check_manifest(entries: &[ManifestEntry]) -> Result<ManifestSummary, Error> {
    let mut summary = ManifestSummary::default();
    let mut paths: HashSet<&str> = HashSet::with_capacity(entries.len());
    let mut files: HashSet<&str> = HashSet::new();
    for entry in entries {
        let path = entry.path.as_str();
        check_path(path).map_err(|why| refused(path, why))?;
        if !paths.insert(path) {
            return Err(refused(path, "duplicate path"));
        }
        match EntryKind::try_from(entry.kind) {
            Ok(EntryKind::File) => {
                if entry.mode & !0o666 != 0 {
                    return Err(refused(path, format!("mode {:o} is not allowed", entry.mode)));
                }
                if !is_sha256_hex(&entry.sha256) {
                    return Err(refused(path, "sha256 is not 64 lowercase hex digits"));
                }
                match summary.blobs.insert(entry.sha256.clone(), entry.size) {
                    Some(other) if other != entry.size => {
                        return Err(refused(path, "one blob with two sizes"));
                    }
                    _ => {}
                }
                files.insert(path);
                summary.files += 1;
                summary.total_bytes = summary.total_bytes.saturating_add(entry.size);
            }
            Ok(EntryKind::Directory) => {
                if entry.size != 0 || !entry.sha256.is_empty() {
                    return Err(refused(path, "a directory has no size or hash"));
                }
                summary.dirs += 1;
            }
            _ => return Err(refused(path, "unknown entry kind")),
        }
    }
    // Nothing may sit below a file (`a` a file and `a/b` anything).
    for entry in entries {
        let mut path = entry.path.as_str();
        while let Some((parent, _)) = path.rsplit_once('/') {
            if files.contains(parent) {
                return Err(refused(&entry.path, format!("below the file {parent:?}")));
            }
            path = parent;
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64, sha: char) -> ManifestEntry {
        ManifestEntry {
            path: path.into(),
            kind: EntryKind::File as i32,
            size,
            mode: 0o644,
            sha256: sha.to_string().repeat(64),
        }
    }

    #[test]
    fn default_exclusions_match_by_segment_and_root_path() {
        for p in [
            ".git",
            "a/.git/config",
            "node_modules/x",
            "pkg/node_modules",
            ".env",
            ".env.local",
            "sub/.envrc",
            "CLAUDE.md",
            "GEMINI.md",
            ".claude/skills/review",
            ".codex/skills/x/SKILL.md",
            ".sandhold/skills/y",
        ] {
            assert!(default_excluded(p), "{p} should be excluded");
        }
        for p in [
            "src/main.rs",
            "docs/CLAUDE.md",
            ".claude/settings.json",
            ".claude/skills",
            "environment",
            "a/env",
        ] {
            assert!(!default_excluded(p), "{p} should be kept");
        }
        assert!(always_excluded(PROJECTION_MARKER));
        assert!(!always_excluded("sub/.sandhold/projection.json"));
        assert!(is_session_state(SESSIONS_DIR) && is_session_state(".sandhold/sessions/codex/a.jsonl"));
        assert!(!is_session_state(".sandhold/sessionsX") && !is_session_state(".sandhold"));
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let ok = [file("a/b.txt", 3, 'a'), file("c", 3, 'a')];
        let summary = check_manifest(&ok).unwrap();
        assert_eq!(summary.blobs.len(), 1);
        assert_eq!(summary.total_bytes, 6);
        let cases: Vec<Vec<ManifestEntry>> = vec![
            vec![file("../x", 1, 'a')],
            vec![file("/etc/passwd", 1, 'a')],
            vec![file("a/../../x", 1, 'a')],
            vec![file("a//b", 1, 'a')],
            vec![file("./a", 1, 'a')],
            vec![file("x", 1, 'a'), file("x", 1, 'b')],
            vec![file("x", 1, 'a'), file("y", 2, 'a')],
            vec![file("x", 1, 'a'), file("x/y", 1, 'b')],
            vec![ManifestEntry { mode: 0o755, ..file("x", 1, 'a') }],
            vec![ManifestEntry { sha256: "zz".into(), ..file("x", 1, 'a') }],
            vec![ManifestEntry { kind: 0, ..file("x", 1, 'a') }],
        ];
        for case in cases {
            let err = check_manifest(&case).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidArgument, "{case:?}");
        }
    }
}
