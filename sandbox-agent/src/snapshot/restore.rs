//! Restore: stage and verify every blob outside the root, plan the change
//! against the workspace as it is, and only then remove and write.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{EntryKind, ManifestEntry, RestoreBlob, RestoreHeader, RestoreResponse};
use shared::snapshot::{ManifestSummary, check_manifest};
use tokio::io::AsyncWriteExt;

use super::policy::{Policy, excluded_at, self_and_ancestors};
use crate::confine::{Root, io_error};
use crate::run_user::{FsAs, RunUser};

/// A staging directory outside the root, removed on drop.
pub(super) struct Staging {
    dir: PathBuf,
}

impl Staging {
    pub(super) fn new(parent: &Path) -> Result<Self, Error> {
        let dir = parent.join(format!(".sandhold-restore-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::internal(format!("creating the restore staging dir: {e}")))?;
        Ok(Self { dir })
    }

    pub(super) fn blob(&self, sha256: &str) -> PathBuf {
        self.dir.join(sha256)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) fn refuse(what: impl Into<String>) -> Error {
    let what = what.into();
    Error::new(ErrorCode::InvalidArgument, format!("restore refused, nothing written: {what}"))
        .with_violation("manifest", what)
}

/// The blob being received.
struct Incoming {
    sha256: String,
    file: tokio::fs::File,
    hasher: Sha256,
    size: u64,
    expected: u64,
}

impl Incoming {
    async fn finish(mut self) -> Result<String, Error> {
        self.file.flush().await.map_err(|e| Error::internal(format!("staging a blob: {e}")))?;
        if self.size != self.expected {
            return Err(refuse(format!(
                "blob {} has {} bytes, the manifest says {}",
                self.sha256, self.size, self.expected
            )));
        }
        let actual = hex::encode(self.hasher.finalize());
        if actual != self.sha256 {
            return Err(refuse(format!("blob {} hashes to {actual}", self.sha256)));
        }
        Ok(self.sha256)
    }
}

/// What a restore stream delivered so far: the manifest, then its blobs,
/// each staged and checked as it arrives. Nothing under the root is touched.
pub(super) struct Receiver<'a> {
    staging: &'a Staging,
    entry_count: u64,
    blob_count: u64,
    entries: Vec<ManifestEntry>,
    /// Set by the first blob: the manifest is complete and checked.
    summary: Option<ManifestSummary>,
    current: Option<Incoming>,
    received: HashSet<String>,
}

impl<'a> Receiver<'a> {
    pub(super) fn new(header: &RestoreHeader, staging: &'a Staging) -> Self {
        Self {
            staging,
            entry_count: header.entry_count,
            blob_count: header.blob_count,
            entries: Vec::new(),
            summary: None,
            current: None,
            received: HashSet::new(),
        }
    }

    pub(super) fn entries(&mut self, batch: Vec<ManifestEntry>) -> Result<(), Error> {
        if self.summary.is_some() {
            return Err(refuse("manifest entries after the first blob"));
        }
        self.entries.extend(batch);
        if self.entries.len() as u64 > self.entry_count {
            return Err(refuse("more manifest entries than the header announced"));
        }
        Ok(())
    }

    fn check_manifest(&self) -> Result<ManifestSummary, Error> {
        if self.entries.len() as u64 != self.entry_count {
            return Err(refuse("fewer manifest entries than the header announced"));
        }
        check_manifest(&self.entries)
    }

    pub(super) async fn blob(&mut self, blob: RestoreBlob) -> Result<(), Error> {
        if self.summary.is_none() {
            self.summary = Some(self.check_manifest()?);
        }
        let known = self.summary.as_ref().expect("set above");
        if self.current.as_ref().is_none_or(|c| c.sha256 != blob.sha256) {
            if let Some(done) = self.current.take() {
                self.received.insert(done.finish().await?);
            }
            let Some(&expected) = known.blobs.get(&blob.sha256) else {
                return Err(refuse(format!("blob {:?} is not in the manifest", blob.sha256)));
            };
            if self.received.contains(&blob.sha256) {
                return Err(refuse(format!("blob {} sent twice", blob.sha256)));
            }
            let file = tokio::fs::File::create(self.staging.blob(&blob.sha256))
                .await
                .map_err(|e| Error::internal(format!("staging a blob: {e}")))?;
            self.current = Some(Incoming {
                sha256: blob.sha256.clone(),
                file,
                hasher: Sha256::new(),
                size: 0,
                expected,
            });
        }
        let incoming = self.current.as_mut().expect("set above");
        incoming.size += blob.data.len() as u64;
        if incoming.size > incoming.expected {
            return Err(refuse(format!(
                "blob {} is longer than the {} bytes the manifest says",
                incoming.sha256, incoming.expected
            )));
        }
        incoming.hasher.update(&blob.data);
        incoming.file.write_all(&blob.data).await.map_err(|e| Error::internal(format!("staging a blob: {e}")))
    }

    /// The stream ended: the checked manifest, once every blob it
    /// references arrived whole and nothing else did.
    pub(super) async fn finish(mut self) -> Result<Vec<ManifestEntry>, Error> {
        if let Some(done) = self.current.take() {
            self.received.insert(done.finish().await?);
        }
        let summary = match self.summary.take() {
            Some(s) => s,
            None => self.check_manifest()?,
        };
        if let Some(missing) = summary.blobs.keys().find(|h| !self.received.contains(*h)) {
            let path = self
                .entries
                .iter()
                .find(|e| &e.sha256 == missing)
                .map(|e| e.path.clone())
                .unwrap_or_default();
            return Err(refuse(format!("blob {missing} of {path:?} is missing")).with_meta("path", path));
        }
        if self.received.len() as u64 != self.blob_count {
            return Err(refuse("the blob count differs from the header"));
        }
        Ok(self.entries)
    }
}

/// Restore the verified `entries` from `staging` into `root`: plan against
/// the workspace as it is, then remove and write, as `user` (the run user,
/// when there is one).
///
/// The run user's processes may still run while a restore writes, and can
/// swap a directory the plan checked for a link to anywhere: every change
/// to the workspace is made with the run user's file credentials
/// ([`FsAs`]), so such a link leads only where the run user could write
/// itself. Only the staged blobs are opened as the agent.
pub(super) fn apply(
    root: &Root,
    staging: Staging,
    policy: &Policy,
    entries: Vec<ManifestEntry>,
    user: Option<&RunUser>,
) -> Result<RestoreResponse, Error> {
    let plan = plan(root.path(), policy, entries)?;
    // Verified and planned: the first change to the workspace.
    {
        let _as_user = FsAs::new(user)?;
        remove_paths(root.path(), &plan.remove)?;
    }
    let mut response = write_entries(root, &staging, &plan.write, user)?;
    response.paths_removed = plan.remove.len() as u64;
    response.entries_excluded = plan.excluded;
    drop(staging);
    Ok(response)
}

/// What a workspace entry is, by `lstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    File,
    Dir,
    /// A symlink, device, socket or FIFO.
    Other,
}

impl Found {
    fn of(ft: &std::fs::FileType) -> Self {
        if ft.is_dir() {
            Found::Dir
        } else if ft.is_file() {
            Found::File
        } else {
            Found::Other
        }
    }

    fn of_entry(entry: &ManifestEntry) -> Self {
        if entry.kind == EntryKind::Directory as i32 { Found::Dir } else { Found::File }
    }
}

/// The parent of a relative path (`""` at the top).
fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(parent, _)| parent)
}

/// The workspace as a restore finds it, outside the policy's exclusions.
#[derive(Debug, Default)]
struct Workspace {
    /// Every entry the policy does not exclude, by path.
    entries: BTreeMap<String, Found>,
    /// Directories holding, somewhere below, an entry that is left alone:
    /// an excluded one, or one whose name is not UTF-8 (no manifest can
    /// name it). They are never removed.
    holds_untouched: HashSet<String>,
}

/// Walk the root without following anything, skipping excluded subtrees.
fn scan(root: &Path, policy: &Policy) -> Result<Workspace, Error> {
    let mut out = Workspace::default();
    let mut walk = walkdir::WalkDir::new(root).min_depth(1).into_iter();
    while let Some(entry) = walk.next() {
        let entry = entry.map_err(|e| {
            let shown = e.path().and_then(|p| p.strip_prefix(root).ok()).and_then(Path::to_str);
            let shown = shown.filter(|p| !p.is_empty()).unwrap_or(".").to_string();
            io_error(e.into(), &shown)
        })?;
        // Entered directories are named in UTF-8 (the others are skipped).
        let rel = entry.path().strip_prefix(root).expect("a walk stays below its root");
        let path = rel.to_str().filter(|p| !policy.excluded(p));
        let Some(path) = path else {
            let parent = rel.parent().and_then(Path::to_str).unwrap_or("");
            if !parent.is_empty() {
                out.holds_untouched.extend(self_and_ancestors(parent).map(str::to_string));
            }
            if entry.file_type().is_dir() {
                walk.skip_current_dir();
            }
            continue;
        };
        // The walk follows no symlink: this is the entry's own type.
        out.entries.insert(path.to_string(), Found::of(&entry.file_type()));
    }
    Ok(out)
}

/// What a restore changes, decided before the first change.
#[derive(Debug)]
struct Plan {
    /// Workspace paths to remove first, outermost only, in path order.
    remove: Vec<(String, Found)>,
    /// The manifest entries to write (none at an excluded path).
    write: Vec<ManifestEntry>,
    /// Manifest entries not written: the policy excludes their path.
    excluded: u64,
}

/// Plan a restore of `entries` (a checked manifest) into the workspace at
/// `root`, so that afterwards the workspace holds exactly those entries
/// outside the paths `policy` excludes, which stay as they are:
///
/// - a manifest entry at an excluded path is not written;
/// - a workspace entry of the same kind as the manifest's at its path, or a
///   directory the manifest's entries lie in, stays (a file is overwritten);
/// - one of another kind there (a directory where the checkpoint has a
///   file, a symlink where it has a directory, ...) is removed, with
///   everything in it; a directory in the way that holds an excluded path
///   refuses the restore;
/// - one the manifest lacks is removed when the policy would capture it
///   (a symlink or special file included), a directory only once nothing
///   stays in it.
///
/// Then every target is checked against the planned tree: each ancestor a
/// directory (never a symlink) or gone, the entry itself absent or of its
/// kind.
fn plan(root: &Path, policy: &Policy, entries: Vec<ManifestEntry>) -> Result<Plan, Error> {
    let (write, left_out): (Vec<_>, Vec<_>) =
        entries.into_iter().partition(|e| !excluded_at(policy, &e.path));
    let mut wanted: HashMap<&str, Found> = HashMap::new();
    for entry in &write {
        wanted.extend(self_and_ancestors(&entry.path).skip(1).map(|a| (a, Found::Dir)));
    }
    wanted.extend(write.iter().map(|e| (e.path.as_str(), Found::of_entry(e))));
    let workspace = scan(root, policy)?;
    // Children come before their parents in reverse path order, so a
    // directory is decided once everything in it is.
    let mut keeps_something: HashSet<&str> = HashSet::new();
    let mut removed: HashMap<&str, Found> = HashMap::new();
    for (path, &found) in workspace.entries.iter().rev() {
        let path = path.as_str();
        let remove = match wanted.get(path) {
            Some(&want) if want == found => false,
            Some(_) if found == Found::Dir && workspace.holds_untouched.contains(path) => {
                return Err(refuse(format!(
                    "{path:?} is a directory in the way of the checkpoint's entry, and holds paths \
                     the snapshot policy excludes"
                )));
            }
            Some(_) => true,
            None if found == Found::Dir => {
                policy.included(path)
                    && !keeps_something.contains(path)
                    && !workspace.holds_untouched.contains(path)
            }
            None => policy.included(path),
        };
        if remove {
            removed.insert(path, found);
        } else {
            keeps_something.insert(parent_of(path));
        }
    }
    let gone = |path: &str| self_and_ancestors(path).any(|p| removed.contains_key(p));
    for entry in &write {
        check_target(root, entry, &gone)?;
    }
    let mut remove: Vec<(String, Found)> = removed
        .iter()
        .filter(|(path, _)| !self_and_ancestors(path).skip(1).any(|p| removed.contains_key(p)))
        .map(|(path, found)| (path.to_string(), *found))
        .collect();
    remove.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Plan { remove, write, excluded: left_out.len() as u64 })
}

/// Check where `entry` would go in the planned tree (`gone` says what the
/// plan removes): inside the root through directories only, and not onto
/// an entry of another kind.
fn check_target(root: &Path, entry: &ManifestEntry, gone: &dyn Fn(&str) -> bool) -> Result<(), Error> {
    let path = entry.path.as_str();
    for ancestor in self_and_ancestors(path).skip(1).filter(|a| !gone(a)) {
        match std::fs::symlink_metadata(root.join(ancestor)) {
            Ok(m) if !m.is_dir() => {
                return Err(refuse(format!("{path:?}: {ancestor:?} exists and is not a directory")));
            }
            _ => {}
        }
    }
    if gone(path) {
        return Ok(());
    }
    match std::fs::symlink_metadata(root.join(path)) {
        Ok(m) if Found::of(&m.file_type()) != Found::of_entry(entry) => {
            Err(refuse(format!("{path:?} exists as another kind of entry")))
        }
        _ => Ok(()),
    }
}

/// Remove the planned paths (a directory with everything in it; a symlink
/// itself, never what it points to).
fn remove_paths(root: &Path, remove: &[(String, Found)]) -> Result<(), Error> {
    for (path, found) in remove {
        let abs = root.join(path);
        let result =
            if *found == Found::Dir { std::fs::remove_dir_all(&abs) } else { std::fs::remove_file(&abs) };
        match result {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(e, path)),
            _ => {}
        }
    }
    Ok(())
}

/// Write the verified entries from the staged blobs: each blob opened as
/// the agent, everything in the workspace created as `user`.
fn write_entries(
    root: &Root,
    staging: &Staging,
    entries: &[ManifestEntry],
    user: Option<&RunUser>,
) -> Result<RestoreResponse, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut response = RestoreResponse::default();
    for entry in entries {
        let path = entry.path.as_str();
        let target = root.path().join(path);
        if entry.kind == EntryKind::Directory as i32 {
            let _as_user = FsAs::new(user)?;
            std::fs::create_dir_all(&target).map_err(|e| io_error(e, path))?;
            response.dirs_created += 1;
            continue;
        }
        let mut blob = std::fs::File::open(staging.blob(&entry.sha256)).map_err(|e| io_error(e, path))?;
        let _as_user = FsAs::new(user)?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error(e, path))?;
        }
        // Written beside the target and renamed into place: a reader never
        // sees half a file.
        let temp = target.with_file_name(format!(
            ".{}.restore-{}",
            target.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
            uuid::Uuid::new_v4().simple()
        ));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)
            .and_then(|mut out| {
                std::io::copy(&mut blob, &mut out)?;
                out.set_permissions(std::fs::Permissions::from_mode(entry.mode))
            })
            .and_then(|()| std::fs::rename(&temp, &target));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(io_error(e, path));
        }
        response.files_written += 1;
        response.bytes_written += entry.size;
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// The run user swapped a directory the plan checked for a link to a
    /// directory outside the root (here, after the plan): the restore
    /// writes nothing there and chowns nothing there.
    #[test]
    fn a_parent_swapped_for_a_link_leads_the_restore_nowhere() {
        // SAFETY: a plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let user = RunUser { uid: 10001, gid: 10001, name: "u".into(), home: "/nonexistent".into() };
        let base = tempfile::tempdir().unwrap();
        let (root_dir, outside, staging_parent) =
            (base.path().join("root"), base.path().join("outside"), base.path().join("staging"));
        for dir in [&root_dir, &outside, &staging_parent] {
            std::fs::create_dir(dir).unwrap();
        }
        std::os::unix::fs::lchown(&root_dir, Some(user.uid), Some(user.gid)).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&outside, root_dir.join("dir")).unwrap();
        let root = Root::new(&root_dir).unwrap();
        let staging = Staging::new(&staging_parent).unwrap();
        let data = b"planted";
        let sha256 = hex::encode(Sha256::digest(data));
        std::fs::write(staging.blob(&sha256), data).unwrap();
        let entry = ManifestEntry {
            path: "dir/f".into(),
            kind: EntryKind::File as i32,
            mode: 0o644,
            size: data.len() as u64,
            sha256,
        };
        let written = write_entries(&root, &staging, &[entry], Some(&user));
        assert!(written.is_err(), "the restore wrote through the link: {written:?}");
        let left: Vec<_> = std::fs::read_dir(&outside).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "written outside the root: {left:?}");
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0, "chowned outside the root");
    }
}
