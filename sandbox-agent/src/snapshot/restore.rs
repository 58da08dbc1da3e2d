//! Restore: stage and verify every blob outside the root, plan the change
//! against the workspace as it is, and only then remove and write.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{EntryKind, ManifestEntry, RestoreBlob, RestoreHeader, RestoreResponse};
use shared::snapshot::{ManifestSummary, check_manifest};

use super::policy::{Policy, excluded_at, self_and_ancestors};
use crate::confine::{Root, io_error};
use crate::run_user::{FsAs, RunUser};

/// A staging directory outside the root, removed on drop. A large blob is
/// a file of its own; small ones follow one another in packs (a workspace
/// is mostly small files, and a file each cost a file creation each, twice
/// over with the restore's own). There are [`STAGING_PACKS`] packs, filled
/// in turns, so that many appends are made at once: one file's buffered
/// writes are one after another (the inode's lock), and one thread's
/// copies into the page cache were the stream's pace.
pub(super) struct Staging {
    dir: PathBuf,
    /// Where each small blob is: its pack, offset and length.
    packed: HashMap<String, (usize, u64, usize)>,
    pack_len: [u64; STAGING_PACKS],
    /// The pack the blobs now being placed go to.
    filling: usize,
}

/// Packs a restore stages small blobs in.
const STAGING_PACKS: usize = 2;

impl Staging {
    pub(super) fn new(parent: &Path) -> Result<Self, Error> {
        let dir = parent.join(format!(".sandhold-restore-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::internal(format!("creating the restore staging dir: {e}")))?;
        Ok(Self { dir, packed: HashMap::new(), pack_len: [0; STAGING_PACKS], filling: 0 })
    }

    /// A large blob's own file.
    pub(super) fn blob(&self, sha256: &str) -> PathBuf {
        self.dir.join(sha256)
    }

    fn pack(&self, which: usize) -> PathBuf {
        self.dir.join(format!("pack{which}"))
    }

    /// Note `len` bytes of `sha256` as the next of the pack being filled.
    fn place(&mut self, sha256: String, len: usize) {
        let which = self.filling;
        self.packed.insert(sha256, (which, self.pack_len[which], len));
        self.pack_len[which] += len as u64;
    }

    /// The pack being filled; the next blobs placed go to the next one.
    fn next_pack(&mut self) -> usize {
        let which = self.filling;
        self.filling = (which + 1) % STAGING_PACKS;
        which
    }

    fn is_packed(&self, sha256: &str) -> bool {
        self.packed.contains_key(sha256)
    }

    /// Where the staged bytes of `sha256` are: a blob's own file opened now,
    /// as the agent (the staging dir is not the run user's).
    fn source(&self, sha256: &str) -> std::io::Result<Source> {
        match self.packed.get(sha256) {
            Some(&(which, offset, len)) => Ok(Source::Packed(which, offset, len)),
            None => std::fs::File::open(self.blob(sha256)).map(Source::Own),
        }
    }

    /// The packs, each open for reading (`None` when nothing is in it).
    fn open_packs(&self) -> std::io::Result<Vec<Option<std::fs::File>>> {
        (0..STAGING_PACKS)
            .map(|which| match self.pack_len[which] {
                0 => Ok(None),
                _ => std::fs::File::open(self.pack(which)).map(Some),
            })
            .collect()
    }
}

/// The staged bytes of one blob.
enum Source {
    /// In a pack: which, offset and length.
    Packed(usize, u64, usize),
    Own(std::fs::File),
}

impl Source {
    /// Copy the bytes to `out`; `packs` are the staging packs, open.
    fn copy_to(
        self,
        packs: &[Option<std::fs::File>],
        buf: &mut Vec<u8>,
        out: &mut std::fs::File,
    ) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::FileExt;
        match self {
            Source::Packed(which, offset, len) => {
                let pack = packs.get(which).and_then(Option::as_ref);
                let pack = pack.ok_or_else(|| std::io::Error::other("the staging pack is not open"))?;
                buf.resize(len, 0);
                pack.read_exact_at(buf, offset)?;
                out.write_all(buf)
            }
            Source::Own(mut file) => std::io::copy(&mut file, out).map(drop),
        }
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

/// A blob up to this size goes to the staging pack: held in memory with
/// the ones before it, appended with them in one blocking task (checked
/// by then: a blob that fails its check refuses the whole restore); a
/// larger one goes on to a staging file of its own as it comes.
const HELD_IN_MEMORY: usize = 1 << 20;

/// Small blobs are appended to a staging pack once this many bytes wait.
const STAGE_BATCH_BYTES: usize = 8 << 20;

fn staging_error(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("staging a blob: {e}"))
}

/// Run blocking staging work off the async workers.
async fn staged<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Error> {
    joined(tokio::task::spawn_blocking(work)).await
}

/// The end of staging work started before.
async fn joined<T>(task: tokio::task::JoinHandle<std::io::Result<T>>) -> Result<T, Error> {
    match task.await {
        Ok(result) => result.map_err(staging_error),
        Err(e) => Err(staging_error(e)),
    }
}

/// The blob being received.
struct Incoming {
    sha256: String,
    /// The bytes not yet written to `file` (of a blob not packed).
    held: Vec<u8>,
    /// Its staging file, once it outgrew [`HELD_IN_MEMORY`].
    file: Option<std::fs::File>,
    hasher: Sha256,
    size: u64,
    expected: u64,
}

impl Incoming {
    /// Whether it goes to a staging pack (its bytes, as they come, to
    /// [`Receiver::unpacked`]).
    fn packed(&self) -> bool {
        self.expected <= HELD_IN_MEMORY as u64
    }

    /// Hold `data` (of a blob not packed), moving what is held to the
    /// staging file once it is more than [`HELD_IN_MEMORY`].
    async fn push(&mut self, data: &[u8], staging: &Staging) -> Result<(), Error> {
        self.held.extend_from_slice(data);
        if self.held.len() <= HELD_IN_MEMORY {
            return Ok(());
        }
        let open = staging_file(self.file.take(), staging.blob(&self.sha256)).await?;
        self.file = Some(write_held(open, std::mem::take(&mut self.held)).await?);
        Ok(())
    }

    /// Check the blob against the manifest and stage the rest of a blob
    /// not packed; its name and whether it is packed.
    async fn finish(self, staging: &Staging) -> Result<(String, bool), Error> {
        let packed = self.packed();
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
        if packed {
            return Ok((self.sha256, true));
        }
        let open = staging_file(self.file, staging.blob(&self.sha256)).await?;
        write_held(open, self.held).await?;
        Ok((self.sha256, false))
    }
}

/// A blob's staging file: `file`, made before, or one made now at `path`.
async fn staging_file(file: Option<std::fs::File>, path: PathBuf) -> Result<std::fs::File, Error> {
    match file {
        Some(open) => Ok(open),
        None => staged(move || std::fs::File::create(path)).await,
    }
}

/// Append `held` to a blob's own staging file.
async fn write_held(mut file: std::fs::File, held: Vec<u8>) -> Result<std::fs::File, Error> {
    staged(move || {
        use std::io::Write;
        file.write_all(&held)?;
        Ok(file)
    })
    .await
}

/// What a restore stream delivered so far: the manifest, then its blobs,
/// each staged and checked as it arrives. Nothing under the root is touched.
pub(super) struct Receiver<'a> {
    staging: &'a mut Staging,
    entry_count: u64,
    blob_count: u64,
    entries: Vec<ManifestEntry>,
    /// Set by the first blob: the manifest is complete and checked.
    summary: Option<ManifestSummary>,
    current: Option<Incoming>,
    received: HashSet<String>,
    /// The bytes of the packed blobs not yet appended to the pack: the
    /// ones checked, then the current one's so far.
    unpacked: Vec<u8>,
    /// The append under way to each staging pack, if any: the stream goes
    /// on meanwhile (at most one a pack, so each grows in the order
    /// [`Staging::place`] counted). Each hands its buffer back, to be
    /// filled again (fresh memory for every few MiB was a page fault every
    /// 4 KiB).
    appending: [Option<tokio::task::JoinHandle<std::io::Result<Vec<u8>>>>; STAGING_PACKS],
    /// Buffers the appends handed back.
    spare: Vec<Vec<u8>>,
}

impl<'a> Receiver<'a> {
    pub(super) fn new(header: &RestoreHeader, staging: &'a mut Staging) -> Self {
        Self {
            staging,
            entry_count: header.entry_count,
            blob_count: header.blob_count,
            entries: Vec::new(),
            summary: None,
            current: None,
            received: HashSet::new(),
            unpacked: Vec::new(),
            appending: Default::default(),
            spare: Vec::new(),
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
        if self.current.as_ref().is_none_or(|c| c.sha256 != blob.sha256) {
            if let Some(done) = self.current.take() {
                self.complete(done).await?;
            }
            let known = self.summary.as_ref().expect("set above");
            let Some(&expected) = known.blobs.get(&blob.sha256) else {
                return Err(refuse(format!("blob {:?} is not in the manifest", blob.sha256)));
            };
            if self.received.contains(&blob.sha256) {
                return Err(refuse(format!("blob {} sent twice", blob.sha256)));
            }
            self.current = Some(Incoming {
                sha256: blob.sha256.clone(),
                held: Vec::new(),
                file: None,
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
        if incoming.packed() {
            self.unpacked.extend_from_slice(&blob.data);
            return Ok(());
        }
        incoming.push(&blob.data, self.staging).await
    }

    /// A blob ended: checked, and staged (a small one in the pack).
    async fn complete(&mut self, done: Incoming) -> Result<(), Error> {
        let len = done.size as usize;
        let (sha256, packed) = done.finish(self.staging).await?;
        if packed {
            self.staging.place(sha256.clone(), len);
        }
        self.received.insert(sha256);
        if self.unpacked.len() >= STAGE_BATCH_BYTES {
            self.pack_held().await?;
        }
        Ok(())
    }

    /// Start appending the small blobs waiting in memory to the pack they
    /// were placed in, once that pack's append before has ended; the
    /// stream is read on meanwhile (inline, these appends held it a
    /// quarter of the time), and the next blobs go to the next pack.
    async fn pack_held(&mut self) -> Result<(), Error> {
        if self.unpacked.is_empty() {
            return Ok(());
        }
        let which = self.staging.next_pack();
        self.appended(which).await?;
        let bytes = std::mem::replace(&mut self.unpacked, self.spare.pop().unwrap_or_default());
        let pack = self.staging.pack(which);
        self.appending[which] = Some(tokio::task::spawn_blocking(move || {
            use std::io::Write;
            std::fs::OpenOptions::new().create(true).append(true).open(pack)?.write_all(&bytes)?;
            Ok(bytes)
        }));
        Ok(())
    }

    /// Wait for the append under way to pack `which`.
    async fn appended(&mut self, which: usize) -> Result<(), Error> {
        if let Some(append) = self.appending[which].take() {
            let mut buffer = joined(append).await?;
            buffer.clear();
            self.spare.push(buffer);
        }
        Ok(())
    }

    /// The stream ended: the checked manifest, once every blob it
    /// references arrived whole and nothing else did.
    pub(super) async fn finish(mut self) -> Result<Vec<ManifestEntry>, Error> {
        if let Some(done) = self.current.take() {
            self.complete(done).await?;
        }
        self.pack_held().await?;
        for which in 0..STAGING_PACKS {
            self.appended(which).await?;
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
    let mut dirs_checked = HashSet::new();
    for entry in &write {
        check_target(root, entry, &gone, &mut dirs_checked)?;
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
/// an entry of another kind. `dirs_checked`: ancestors found fine already
/// (each is looked at once).
fn check_target<'p>(
    root: &Path,
    entry: &'p ManifestEntry,
    gone: &dyn Fn(&str) -> bool,
    dirs_checked: &mut HashSet<&'p str>,
) -> Result<(), Error> {
    let path = entry.path.as_str();
    for ancestor in self_and_ancestors(path).skip(1).filter(|a| !gone(a)) {
        if !dirs_checked.insert(ancestor) {
            continue;
        }
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

/// Threads writing a restore's files at most (the sandbox's CPUs
/// allowing): a restore is file creations, one system call after another.
const WRITERS: usize = 4;

/// Files per writer below which one thread writes them all.
const FILES_PER_WRITER: usize = 512;

/// Write the verified entries from the staged blobs: each blob opened as
/// the agent, everything in the workspace created as `user`. Empty
/// directories first, then the files, split between up to [`WRITERS`]
/// threads (each creates the parents it needs).
fn write_entries(
    root: &Root,
    staging: &Staging,
    entries: &[ManifestEntry],
    user: Option<&RunUser>,
) -> Result<RestoreResponse, Error> {
    let mut response = RestoreResponse::default();
    let (dirs, files): (Vec<&ManifestEntry>, Vec<&ManifestEntry>) =
        entries.iter().partition(|e| e.kind == EntryKind::Directory as i32);
    for entry in dirs {
        let _as_user = FsAs::new(user)?;
        std::fs::create_dir_all(root.path().join(&entry.path)).map_err(|e| io_error(e, &entry.path))?;
        response.dirs_created += 1;
    }
    // Opened as the agent: the staging dir is not the run user's.
    let packs = staging.open_packs().map_err(staging_error)?;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let writers = cpus.min(WRITERS).min(files.len() / FILES_PER_WRITER).max(1);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let write = |part: &[&ManifestEntry]| write_files(root, staging, &packs, part, user, &failed);
    let written: Vec<Result<(u64, u64), Error>> = if writers == 1 {
        vec![write(&files)]
    } else {
        let write = &write;
        std::thread::scope(|scope| {
            let parts: Vec<_> = files
                .chunks(files.len().div_ceil(writers))
                .map(|part| scope.spawn(move || write(part)))
                .collect();
            let joined = parts.into_iter().map(|p| p.join());
            joined.map(|r| r.unwrap_or_else(|_| Err(Error::internal("a restore writer panicked")))).collect()
        })
    };
    for part in written {
        let (files, bytes) = part?;
        response.files_written += files;
        response.bytes_written += bytes;
    }
    Ok(response)
}

/// Write `files` (one writer's part): how many and their bytes. Stops at
/// the first error, and when another writer's `failed`.
fn write_files(
    root: &Root,
    staging: &Staging,
    packs: &[Option<std::fs::File>],
    files: &[&ManifestEntry],
    user: Option<&RunUser>,
    failed: &std::sync::atomic::AtomicBool,
) -> Result<(u64, u64), Error> {
    use std::sync::atomic::Ordering;
    let mut writer = Writer {
        root,
        staging,
        packs,
        user,
        as_user: None,
        buf: Vec::new(),
        parents: HashSet::new(),
        temp_prefix: uuid::Uuid::new_v4().simple().to_string(),
        temps: 0,
    };
    let (mut count, mut bytes) = (0, 0);
    for entry in files {
        if failed.load(Ordering::Relaxed) {
            break;
        }
        if let Err(e) = writer.write(entry) {
            failed.store(true, Ordering::Relaxed);
            return Err(e);
        }
        count += 1;
        bytes += entry.size;
    }
    Ok((count, bytes))
}

/// What one writer of a restore keeps between its files.
struct Writer<'a> {
    root: &'a Root,
    staging: &'a Staging,
    packs: &'a [Option<std::fs::File>],
    user: Option<&'a RunUser>,
    /// Acting as `user` from one file to the next, but for opening a blob
    /// staged in a file of its own (as the agent).
    as_user: Option<FsAs>,
    buf: Vec<u8>,
    /// Directories this writer made or found.
    parents: HashSet<PathBuf>,
    /// Its temp files' names: `.<name>.restore-<prefix>-<n>`.
    temp_prefix: String,
    temps: u64,
}

impl Writer<'_> {
    /// Write one file entry as the user: made in place when its path is
    /// free, else beside it and renamed over it (a rename per file doubled
    /// the directory work of a restore into a new sandbox).
    fn write(&mut self, entry: &ManifestEntry) -> Result<(), Error> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = entry.path.as_str();
        if !self.staging.is_packed(&entry.sha256) {
            self.as_user = None;
        }
        let source = self.staging.source(&entry.sha256).map_err(|e| io_error(e, path))?;
        if self.as_user.is_none() {
            self.as_user = Some(FsAs::new(self.user)?);
        }
        let target = self.root.path().join(path);
        if let Some(parent) = target.parent()
            && !self.parents.contains(parent)
        {
            std::fs::create_dir_all(parent).map_err(|e| io_error(e, path))?;
            self.parents.insert(parent.to_path_buf());
        }
        // A file not there yet is made in place; one that is there is
        // replaced whole by a rename, so a reader sees the old or the new.
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&target);
        match created {
            Ok(out) => {
                let filled = self.fill(out, source, entry);
                if filled.is_err() {
                    let _ = std::fs::remove_file(&target);
                }
                return filled.map_err(|e| io_error(e, path));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_error(e, path)),
        }
        self.temps += 1;
        let temp = target.with_file_name(format!(
            ".{}.restore-{}-{}",
            target.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
            self.temp_prefix,
            self.temps
        ));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)
            .and_then(|out| self.fill(out, source, entry))
            .and_then(|()| std::fs::rename(&temp, &target));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(io_error(e, path));
        }
        Ok(())
    }

    /// Write the staged bytes to `out` and give it the entry's mode.
    fn fill(&mut self, mut out: std::fs::File, source: Source, entry: &ManifestEntry) -> std::io::Result<()> {
        source.copy_to(self.packs, &mut self.buf, &mut out)?;
        out.set_permissions(std::fs::Permissions::from_mode(entry.mode))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// A restore of many files, some sharing their bytes, one empty and one
    /// over what is held in memory: staged (small ones in the pack), then
    /// written by several writers, every file whole, with its mode.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restore_of_many_files_is_written_whole_by_several_writers() {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        assert!(cpus >= 2, "this test needs two CPUs to run more than one writer");
        let base = tempfile::tempdir().unwrap();
        let (root_dir, staging_parent) = (base.path().join("root"), base.path().join("staging"));
        std::fs::create_dir(&root_dir).unwrap();
        std::fs::create_dir(&staging_parent).unwrap();
        let root = Root::new(&root_dir).unwrap();
        let mut staging = Staging::new(&staging_parent).unwrap();

        let count = FILES_PER_WRITER * 2 + 77;
        let mut files: Vec<(String, Vec<u8>, u32)> = (0..count)
            .map(|i| {
                (
                    format!("d{:02}/f{i:05}.txt", i % 13),
                    format!("file {i}\n").repeat(i % 7 + 1).into_bytes(),
                    0o644,
                )
            })
            .collect();
        files.push(("same/a".into(), b"shared bytes".to_vec(), 0o600));
        files.push(("same/b".into(), b"shared bytes".to_vec(), 0o640));
        files.push(("zero".into(), Vec::new(), 0o644));
        // Small blobs worth several of the pack's batches: appended while
        // the stream goes on.
        for i in 0..(STAGE_BATCH_BYTES * 3 / HELD_IN_MEMORY) {
            files.push((format!("chunky/{i}"), vec![i as u8; HELD_IN_MEMORY - i], 0o644));
        }
        files.push((
            "big/blob.bin".into(),
            (0..HELD_IN_MEMORY * 2 + 5).map(|i| (i % 251) as u8).collect(),
            0o644,
        ));
        let mut entries: Vec<ManifestEntry> = files
            .iter()
            .map(|(path, data, mode)| ManifestEntry {
                path: path.clone(),
                kind: EntryKind::File as i32,
                size: data.len() as u64,
                mode: *mode,
                sha256: hex::encode(Sha256::digest(data)),
            })
            .collect();
        entries.push(ManifestEntry {
            path: "empty/dir".into(),
            kind: EntryKind::Directory as i32,
            ..Default::default()
        });
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        let mut blobs: BTreeMap<String, &[u8]> = BTreeMap::new();
        for (_, data, _) in &files {
            blobs.insert(hex::encode(Sha256::digest(data)), data);
        }

        let header =
            RestoreHeader { entry_count: entries.len() as u64, blob_count: blobs.len() as u64, policy: None };
        let mut receiver = Receiver::new(&header, &mut staging);
        receiver.entries(entries).unwrap();
        for (sha256, data) in &blobs {
            let mut pieces: Vec<&[u8]> = data.chunks(1 << 20).collect();
            if pieces.is_empty() {
                pieces.push(&[]);
            }
            for piece in pieces {
                receiver
                    .blob(RestoreBlob { sha256: sha256.clone(), data: piece.to_vec().into() })
                    .await
                    .unwrap();
            }
        }
        let entries = receiver.finish().await.unwrap();
        assert_eq!(staging.packed.len(), blobs.len() - 1, "every blob but the large one is in a pack");
        let staged = |which: usize| std::fs::metadata(staging.pack(which)).unwrap().len();
        assert_eq!([staged(0), staged(1)], staging.pack_len, "both packs filled, whole");
        assert!(
            staging.pack_len.iter().all(|&len| len >= STAGE_BATCH_BYTES as u64),
            "{:?}",
            staging.pack_len
        );
        // Files already there are replaced (renamed over), the others made
        // in place.
        for (path, old) in [("d00/f00000.txt", "old and longer than the new\n"), ("same/a", "")] {
            std::fs::create_dir_all(root_dir.join(path).parent().unwrap()).unwrap();
            std::fs::write(root_dir.join(path), old).unwrap();
        }
        let policy = Policy::compile(&Default::default()).unwrap();
        let response = apply(&root, staging, &policy, entries, None).unwrap();

        assert_eq!(response.files_written as usize, files.len());
        assert_eq!(response.dirs_created, 1);
        assert_eq!(response.bytes_written, files.iter().map(|(_, d, _)| d.len() as u64).sum::<u64>());
        for (path, data, mode) in &files {
            let target = root_dir.join(path);
            assert_eq!(&std::fs::read(&target).unwrap(), data, "{path}");
            assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, *mode, "{path}");
        }
        assert!(root_dir.join("empty/dir").is_dir());
        let stray = walkdir::WalkDir::new(&root_dir)
            .into_iter()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".restore-"))
            .count();
        assert_eq!(stray, 0, "no temp file is left in the workspace");
        assert_eq!(std::fs::read_dir(&staging_parent).unwrap().count(), 0, "the staging dir is gone");
    }

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
