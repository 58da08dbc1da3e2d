//! An attempt's changes: the files of its checkpoint against the set's
//! base checkpoint (by content hash, from the two manifests), with text
//! lines added and removed, and the unified diff.

use std::collections::BTreeMap;

use prost::Message;
use shared::proto::agent::v1 as agent;
use similar::{ChangeTag, TextDiff};

use super::ChangedFile;
use crate::store::{Stores, Tenant};

/// A file larger than this is compared by hash only (its lines are not
/// counted, and the patch names it).
const TEXT_MAX: u64 = 1 << 20;

/// Bytes of a patch [`patch`] returns before it stops.
pub(super) const PATCH_MAX: usize = 1 << 20;

/// A checkpoint of a thread.
pub(super) struct At<'a> {
    pub thread_id: &'a str,
    pub checkpoint_id: &'a str,
}

/// One file's two sides: `None` where it does not exist.
struct Sides {
    path: String,
    before: Option<agent::ManifestEntry>,
    after: Option<agent::ManifestEntry>,
}

/// The files that differ between `base` and `head`, with their lines.
pub(super) async fn changed_files(
    stores: &Stores,
    tenant: &Tenant,
    base: At<'_>,
    head: At<'_>,
) -> Result<Vec<ChangedFile>, String> {
    let mut out = Vec::new();
    for sides in differing(stores, tenant, base, head).await? {
        let (before, after) = texts(stores, tenant, &sides).await?;
        let (lines_added, lines_removed, binary) = match (&before, &after) {
            (Some(b), Some(a)) => {
                let (added, removed) = count(b, a);
                (added, removed, false)
            }
            _ => (0, 0, true),
        };
        out.push(ChangedFile {
            change: change_of(&sides).into(),
            path: sides.path,
            lines_added,
            lines_removed,
            binary,
        });
    }
    Ok(out)
}

/// The unified diff of `base` against `head`, at most [`PATCH_MAX`] bytes
/// (and whether it was cut there).
pub(super) async fn patch(
    stores: &Stores,
    tenant: &Tenant,
    base: At<'_>,
    head: At<'_>,
) -> Result<(String, bool), String> {
    let mut out = String::new();
    for sides in differing(stores, tenant, base, head).await? {
        let (before, after) = texts(stores, tenant, &sides).await?;
        let path = &sides.path;
        let piece = match (before, after) {
            (Some(b), Some(a)) => {
                let from = if sides.before.is_some() { format!("a/{path}") } else { "/dev/null".into() };
                let to = if sides.after.is_some() { format!("b/{path}") } else { "/dev/null".into() };
                TextDiff::from_lines(&b, &a).unified_diff().header(&from, &to).to_string()
            }
            _ => format!("Binary or large file {path} {}\n", change_of(&sides)),
        };
        if out.len() + piece.len() > PATCH_MAX {
            return Ok((out, true));
        }
        out.push_str(&piece);
    }
    Ok((out, false))
}

fn change_of(sides: &Sides) -> &'static str {
    match (&sides.before, &sides.after) {
        (None, _) => "added",
        (_, None) => "removed",
        _ => "modified",
    }
}

/// Lines added and removed from `before` to `after`.
fn count(before: &str, after: &str) -> (u32, u32) {
    let diff = TextDiff::from_lines(before, after);
    let (mut added, mut removed) = (0u32, 0u32);
    for change in diff.iter_all_changes() {
        match change.tag() {
            ChangeTag::Insert => added += 1,
            ChangeTag::Delete => removed += 1,
            ChangeTag::Equal => {}
        }
    }
    (added, removed)
}

/// The files of the two checkpoints whose content differs, by path.
async fn differing(
    stores: &Stores,
    tenant: &Tenant,
    base: At<'_>,
    head: At<'_>,
) -> Result<Vec<Sides>, String> {
    let mut before = files(stores, tenant, base).await?;
    let after = files(stores, tenant, head).await?;
    let mut out = Vec::new();
    for (path, entry) in after {
        match before.remove(&path) {
            Some(old) if old.sha256 == entry.sha256 => {}
            old => out.push(Sides { path, before: old, after: Some(entry) }),
        }
    }
    out.extend(before.into_iter().map(|(path, old)| Sides { path, before: Some(old), after: None }));
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The regular files of a checkpoint, by path.
async fn files(
    stores: &Stores,
    tenant: &Tenant,
    at: At<'_>,
) -> Result<BTreeMap<String, agent::ManifestEntry>, String> {
    let (_, manifest) = stores
        .checkpoints
        .get(tenant, at.thread_id, at.checkpoint_id)
        .await
        .map_err(|e| format!("checkpoint {}: {e}", at.checkpoint_id))?;
    let entries = agent::CaptureResponse::decode(manifest.as_slice())
        .map_err(|e| format!("checkpoint {}: unreadable manifest: {e}", at.checkpoint_id))?
        .entries;
    Ok(entries
        .into_iter()
        .filter(|e| e.kind == agent::EntryKind::File as i32)
        .map(|e| (e.path.clone(), e))
        .collect())
}

/// Both sides as text (a missing side is empty), or `(None, None)` when
/// either is binary or too large to read.
async fn texts(
    stores: &Stores,
    tenant: &Tenant,
    sides: &Sides,
) -> Result<(Option<String>, Option<String>), String> {
    let mut out = [None, None];
    for (slot, entry) in out.iter_mut().zip([&sides.before, &sides.after]) {
        *slot = match entry {
            None => Some(String::new()),
            Some(e) if e.size > TEXT_MAX => return Ok((None, None)),
            Some(e) => {
                let bytes = crate::snapshot::read_blob(stores, tenant, &e.sha256)
                    .await
                    .map_err(|err| format!("reading {}: {err}", sides.path))?;
                match String::from_utf8(bytes.to_vec()) {
                    Ok(text) if !text.contains('\0') => Some(text),
                    _ => return Ok((None, None)),
                }
            }
        };
    }
    let [before, after] = out;
    Ok((before, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_counted_as_a_diff_would() {
        assert_eq!(count("a\nb\nc\n", "a\nB\nc\nd\n"), (2, 1));
        assert_eq!(count("", "x\ny\n"), (2, 0));
        assert_eq!(count("x\n", ""), (0, 1));
        assert_eq!(count("same\n", "same\n"), (0, 0));
    }
}
