//! Capture: the manifest of the workspace, walked without following
//! anything, each kept file hashed after zeroing.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{BlobRef, EntryKind, ManifestEntry};

use super::policy::Policy;
use super::redaction::{Redactor, zero_file};
use crate::confine::{Root, io_error};

fn unsupported(path: &str, what: &str) -> Error {
    Error::new(
        ErrorCode::SnapshotUnsupportedEntry,
        format!(
            "{path:?} is {what}; portable snapshots hold regular files and directories only \
             (exclude it in the snapshot policy)"
        ),
    )
    .with_meta("path", path)
}

fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_symlink() {
        "a symlink"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// The manifest of the tree under `root`, sorted by path.
pub fn capture(root: &Path, policy: &Policy, redactor: &Redactor) -> Result<Vec<ManifestEntry>, Error> {
    let mut entries = Vec::new();
    walk(root, "", policy, redactor, &mut entries)?;
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

/// Capture below `dir`; true when anything below it was captured.
fn walk(
    dir: &Path,
    rel: &str,
    policy: &Policy,
    redactor: &Redactor,
    out: &mut Vec<ManifestEntry>,
) -> Result<bool, Error> {
    let shown = if rel.is_empty() { "." } else { rel };
    let mut children: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| io_error(e, shown))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| io_error(e, shown))?;
    children.sort();
    let mut captured_any = false;
    for name in children {
        let Some(name) = name.to_str() else {
            let lossy = format!("{rel}/{}", name.to_string_lossy());
            return Err(unsupported(lossy.trim_start_matches('/'), "named with bytes that are not UTF-8"));
        };
        let path = if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") };
        if policy.excluded(&path) {
            continue;
        }
        let abs = dir.join(name);
        // Removed while walking: simply not captured.
        let Ok(meta) = std::fs::symlink_metadata(&abs) else { continue };
        let ft = meta.file_type();
        if ft.is_dir() {
            let below = walk(&abs, &path, policy, redactor, out)?;
            if !below && policy.included(&path) {
                out.push(ManifestEntry {
                    path,
                    kind: EntryKind::Directory as i32,
                    size: 0,
                    mode: 0,
                    sha256: String::new(),
                });
                captured_any = true;
            }
            captured_any |= below;
        } else if !policy.included(&path) {
            continue;
        } else if ft.is_file() {
            if meta.mode() & 0o111 != 0 {
                return Err(unsupported(&path, "executable"));
            }
            let (size, sha256) = zero_file(&abs, &path, redactor, policy.redacted(&path), |_| Ok(()))?;
            out.push(ManifestEntry {
                kind: EntryKind::File as i32,
                size,
                mode: meta.mode() & 0o666,
                sha256,
                path,
            });
            captured_any = true;
        } else {
            return Err(unsupported(&path, kind_of(&ft)));
        }
    }
    Ok(captured_any)
}

/// Feed the zeroed bytes of the file `blob` names to `sink`, refusing it
/// when it is no longer a plain file or no longer hashes to the manifest's
/// entry (it changed since the capture).
pub(super) fn read_blob(
    root: &Root,
    blob: &BlobRef,
    policy: &Policy,
    redactor: &Redactor,
    sink: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    let path = blob.path.as_str();
    let abs = root.resolve_no_follow(path)?;
    let meta = std::fs::symlink_metadata(&abs).map_err(|e| io_error(e, path))?;
    if !meta.is_file() {
        return Err(unsupported(path, kind_of(&meta.file_type())));
    }
    if meta.mode() & 0o111 != 0 {
        return Err(unsupported(path, "executable"));
    }
    let (_, sha256) = zero_file(&abs, path, redactor, policy.redacted(path), sink)?;
    if sha256 != blob.sha256 {
        return Err(Error::new(
            ErrorCode::FailedPrecondition,
            format!("{path:?} changed while it was captured; capture again"),
        )
        .with_meta("path", path));
    }
    Ok(())
}
