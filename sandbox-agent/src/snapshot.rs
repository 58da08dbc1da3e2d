//! `SnapshotService`: capture and restore of the workspace for portable
//! snapshots.
//!
//! Capture walks the root without following anything, applies the policy
//! (default exclusions unless the policy replaces them; the projection
//! marker always), and hashes every kept file's bytes *after* zeroing every
//! occurrence of a secret value, so neither the hash nor any stored byte
//! depends on a secret. Only regular files without an executable bit and
//! directories are supported; anything else that is not excluded fails the
//! capture with `SNAPSHOT_UNSUPPORTED_ENTRY` naming the path.
//!
//! Restore stages every blob outside the root (beside the journal dir),
//! checks the manifest (`shared::snapshot::check_manifest`), every blob's
//! size and SHA-256 and that every referenced blob arrived, then plans the
//! change against the workspace as it is (see [`plan`]): what to remove so
//! that the workspace ends up equal to the checkpoint outside the policy's
//! exclusions, which are never touched. Only when all of that passed does
//! it remove the first entry or write the first byte under the root.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;

use aho_corasick::AhoCorasick;
use futures::Stream;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use sha2::{Digest, Sha256};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    CapturePolicy, CaptureRequest, CaptureResponse, EntryKind, ManifestEntry, ReadBlobsRequest,
    ReadBlobsResponse, RestoreRequest, RestoreResponse, restore_request,
    snapshot_service_server::SnapshotService,
};
use shared::snapshot::{ManifestSummary, always_excluded, check_manifest, check_path, default_excluded};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::confine::Root;
use crate::fs::io_error;
use crate::server::AgentState;

/// Bytes read from a file at a time (and the largest blob message).
const CHUNK: usize = 1 << 20;
/// Manifest entries per `CaptureResponse`.
const ENTRIES_PER_MESSAGE: usize = 1000;

pub struct Snapshots {
    root: Root,
    staging_parent: PathBuf,
}

impl Snapshots {
    pub fn new(state: AgentState) -> Self {
        // Beside the journal dir: outside the workspace, inside whatever the
        // provider keeps for the sandbox.
        let staging_parent =
            state.journal_dir.parent().map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        Self { root: state.root.clone(), staging_parent }
    }
}

// ---------------------------------------------------------------- policy

/// A compiled [`CapturePolicy`].
#[derive(Debug, Clone)]
pub struct Policy {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
    redact: Option<GlobSet>,
}

fn glob_set(field: &str, patterns: &[String]) -> Result<Option<GlobSet>, Error> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut set = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p.trim_start_matches('/'))
            .literal_separator(true)
            .build()
            .map_err(|e| Error::invalid_field(format!("policy.{field}"), format!("{p:?}: {e}")))?;
        set.add(glob);
    }
    set.build().map(Some).map_err(|e| Error::invalid_field(format!("policy.{field}"), e.to_string()))
}

/// `path` and each of its ancestors (`a/b/c`, `a/b`, `a`).
fn self_and_ancestors(path: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(path), |p| p.rsplit_once('/').map(|(parent, _)| parent))
}

impl Policy {
    pub fn compile(policy: &CapturePolicy) -> Result<Self, Error> {
        Ok(Self {
            include: glob_set("include", &policy.include)?,
            exclude: glob_set("exclude", &policy.exclude)?,
            redact: glob_set("redact", &policy.redact)?,
        })
    }

    /// Left out, with everything below it.
    pub fn excluded(&self, path: &str) -> bool {
        always_excluded(path)
            || match &self.exclude {
                Some(set) => set.is_match(path),
                None => default_excluded(path),
            }
    }

    pub fn included(&self, path: &str) -> bool {
        match &self.include {
            None => true,
            Some(set) => self_and_ancestors(path).any(|p| set.is_match(p)),
        }
    }

    pub fn redacted(&self, path: &str) -> bool {
        self.redact.as_ref().is_some_and(|set| self_and_ancestors(path).any(|p| set.is_match(p)))
    }
}

// ---------------------------------------------------------------- zeroing

/// Replaces every occurrence of any of a set of values with zero bytes of
/// the same length (overlapping occurrences included).
#[derive(Debug, Clone)]
pub struct Redactor {
    matcher: Option<AhoCorasick>,
    /// Longest value minus one: what a match may still need of the next
    /// chunk, so that much is held back between chunks.
    hold: usize,
}

impl Redactor {
    pub fn new(values: &[String]) -> Result<Self, Error> {
        let values: Vec<&[u8]> = values.iter().map(String::as_bytes).filter(|v| !v.is_empty()).collect();
        if values.is_empty() {
            return Ok(Self { matcher: None, hold: 0 });
        }
        let hold = values.iter().map(|v| v.len()).max().unwrap_or(1) - 1;
        let matcher = AhoCorasick::new(&values)
            .map_err(|e| Error::internal(format!("building the secret matcher: {e}")))?;
        Ok(Self { matcher: Some(matcher), hold })
    }

    /// A zeroing pass over one file; `all` zeroes every byte.
    pub fn stream(&self, all: bool) -> Zeroing<'_> {
        Zeroing { redactor: self, all, held: Vec::new(), held_zero: Vec::new() }
    }

    /// `data` zeroed in one go.
    pub fn apply(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        let mut z = self.stream(false);
        z.push(data, &mut out);
        z.finish(&mut out);
        out
    }
}

/// One file's pass through a [`Redactor`]: feed chunks, collect output.
/// Searches the original bytes (so overlapping values are all found) and
/// holds back the tail a match could still extend into.
pub struct Zeroing<'a> {
    redactor: &'a Redactor,
    all: bool,
    held: Vec<u8>,
    held_zero: Vec<bool>,
}

impl Zeroing<'_> {
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.all {
            out.resize(out.len() + chunk.len(), 0);
            return;
        }
        let Some(matcher) = &self.redactor.matcher else {
            out.extend_from_slice(chunk);
            return;
        };
        let mut window = std::mem::take(&mut self.held);
        window.extend_from_slice(chunk);
        let mut zero = std::mem::take(&mut self.held_zero);
        zero.resize(window.len(), false);
        for m in matcher.find_overlapping_iter(&window) {
            zero[m.start()..m.end()].fill(true);
        }
        let emit = window.len() - self.redactor.hold.min(window.len());
        out.extend(window[..emit].iter().zip(&zero[..emit]).map(|(b, z)| if *z { 0 } else { *b }));
        self.held = window[emit..].to_vec();
        self.held_zero = zero[emit..].to_vec();
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let held = std::mem::take(&mut self.held);
        let zero = std::mem::take(&mut self.held_zero);
        out.extend(
            held.iter()
                .zip(zero.iter().chain(std::iter::repeat(&false)))
                .map(|(b, z)| if *z { 0 } else { *b }),
        );
    }
}

// ---------------------------------------------------------------- capture

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

/// Open a regular file without following a symlink.
fn open_regular(abs: &Path, path: &str) -> Result<std::fs::File, Error> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(abs)
        .map_err(|e| io_error(e, path))
}

/// Feed a file through the zeroing pass; `sink` sees each output chunk.
/// Returns the size and hex SHA-256 of the output.
fn zero_file(
    abs: &Path,
    path: &str,
    redactor: &Redactor,
    all: bool,
    mut sink: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(u64, String), Error> {
    let mut file = open_regular(abs, path)?;
    let mut zeroing = redactor.stream(all);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; CHUNK];
    let mut out = Vec::with_capacity(CHUNK + redactor.hold);
    loop {
        let n = file.read(&mut buf).map_err(|e| io_error(e, path))?;
        if n == 0 {
            zeroing.finish(&mut out);
        } else {
            zeroing.push(&buf[..n], &mut out);
        }
        if !out.is_empty() {
            hasher.update(&out);
            size += out.len() as u64;
            sink(&out)?;
            out.clear();
        }
        if n == 0 {
            break;
        }
    }
    Ok((size, hex::encode(hasher.finalize())))
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

// ---------------------------------------------------------------- restore

/// A staging directory outside the root, removed on drop.
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn new(parent: &Path) -> Result<Self, Error> {
        let dir = parent.join(format!(".sandhold-restore-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::internal(format!("creating the restore staging dir: {e}")))?;
        Ok(Self { dir })
    }

    fn blob(&self, sha256: &str) -> PathBuf {
        self.dir.join(sha256)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn refuse(what: impl Into<String>) -> Error {
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

/// Whether the policy leaves `path` out, itself or through an ancestor (a
/// capture skips an excluded directory with everything below it).
fn excluded_at(policy: &Policy, path: &str) -> bool {
    self_and_ancestors(path).any(|p| policy.excluded(p))
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
    let mut found = Workspace::default();
    scan_dir(root, "", policy, &mut found)?;
    Ok(found)
}

fn scan_dir(dir: &Path, rel: &str, policy: &Policy, out: &mut Workspace) -> Result<(), Error> {
    let shown = if rel.is_empty() { "." } else { rel };
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(e, shown))? {
        let entry = entry.map_err(|e| io_error(e, shown))?;
        let name = entry.file_name();
        let path =
            name.to_str().map(|name| if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") });
        let Some(path) = path.filter(|p| !policy.excluded(p)) else {
            if !rel.is_empty() {
                out.holds_untouched.extend(self_and_ancestors(rel).map(str::to_string));
            }
            continue;
        };
        // `DirEntry::file_type` does not follow a symlink.
        let found = Found::of(&entry.file_type().map_err(|e| io_error(e, &path))?);
        if found == Found::Dir {
            scan_dir(&entry.path(), &path, policy, out)?;
        }
        out.entries.insert(path, found);
    }
    Ok(())
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

/// Write the verified entries from the staged blobs.
fn write_entries(
    root: &Root,
    staging: &Staging,
    entries: &[ManifestEntry],
) -> Result<RestoreResponse, Error> {
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for e in entries.iter().filter(|e| e.kind == EntryKind::File as i32) {
        *uses.entry(e.sha256.as_str()).or_default() += 1;
    }
    let mut response = RestoreResponse::default();
    for entry in entries {
        let path = entry.path.as_str();
        let target = root.path().join(path);
        if entry.kind == EntryKind::Directory as i32 {
            std::fs::create_dir_all(&target).map_err(|e| io_error(e, path))?;
            response.dirs_created += 1;
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error(e, path))?;
        }
        let blob = staging.blob(&entry.sha256);
        let left = uses.get_mut(entry.sha256.as_str()).expect("counted above");
        *left -= 1;
        std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(entry.mode))
            .map_err(|e| io_error(e, path))?;
        // The last use of a blob moves it; the others (and a move across
        // filesystems) copy it beside the target and rename it into place.
        let moved = *left == 0 && std::fs::rename(&blob, &target).is_ok();
        if !moved {
            let temp = target.with_file_name(format!(
                ".{}.restore-{}",
                target.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::copy(&blob, &temp).map_err(|e| io_error(e, path))?;
            std::fs::rename(&temp, &target).map_err(|e| {
                let _ = std::fs::remove_file(&temp);
                io_error(e, path)
            })?;
        }
        response.files_written += 1;
        response.bytes_written += entry.size;
    }
    Ok(response)
}

// ---------------------------------------------------------------- service

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(Status::from),
        Err(e) => Err(Error::internal(format!("snapshot task failed: {e}")).into()),
    }
}

#[tonic::async_trait]
impl SnapshotService for Snapshots {
    type CaptureStream = BoxStream<CaptureResponse>;
    type ReadBlobsStream = BoxStream<ReadBlobsResponse>;

    async fn capture(&self, req: Request<CaptureRequest>) -> Result<Response<Self::CaptureStream>, Status> {
        let req = req.into_inner();
        let policy = Policy::compile(&req.policy.unwrap_or_default())?;
        let redactor = Redactor::new(&req.redact_values)?;
        let root = self.root.path().to_path_buf();
        let entries = blocking(move || capture(&root, &policy, &redactor)).await?;
        let batches: Vec<Result<CaptureResponse, Status>> = entries
            .chunks(ENTRIES_PER_MESSAGE)
            .map(|c| Ok(CaptureResponse { entries: c.to_vec() }))
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(batches))))
    }

    async fn read_blobs(
        &self,
        req: Request<ReadBlobsRequest>,
    ) -> Result<Response<Self::ReadBlobsStream>, Status> {
        let req = req.into_inner();
        let policy = Policy::compile(&req.policy.unwrap_or_default())?;
        let redactor = Redactor::new(&req.redact_values)?;
        for blob in &req.blobs {
            check_path(&blob.path)
                .map_err(|why| Error::invalid_field("blobs.path", format!("{:?}: {why}", blob.path)))?;
        }
        let root = self.root.clone();
        let (tx, rx) = mpsc::channel::<Result<ReadBlobsResponse, Status>>(4);
        tokio::task::spawn_blocking(move || {
            for blob in req.blobs {
                let result = (|| {
                    let path = blob.path.as_str();
                    let abs = root.resolve_no_follow(path)?;
                    let meta = std::fs::symlink_metadata(&abs).map_err(|e| io_error(e, path))?;
                    if !meta.is_file() {
                        return Err(unsupported(path, kind_of(&meta.file_type())));
                    }
                    if meta.mode() & 0o111 != 0 {
                        return Err(unsupported(path, "executable"));
                    }
                    let (_, sha256) = zero_file(&abs, path, &redactor, policy.redacted(path), |data| {
                        let msg = ReadBlobsResponse {
                            sha256: blob.sha256.clone(),
                            data: data.to_vec(),
                            last: false,
                        };
                        tx.blocking_send(Ok(msg)).map_err(|_| Error::new(ErrorCode::Cancelled, "reader left"))
                    })?;
                    if sha256 != blob.sha256 {
                        return Err(Error::new(
                            ErrorCode::FailedPrecondition,
                            format!("{path:?} changed while it was captured; capture again"),
                        )
                        .with_meta("path", path));
                    }
                    let end = ReadBlobsResponse { sha256: blob.sha256.clone(), data: Vec::new(), last: true };
                    tx.blocking_send(Ok(end)).map_err(|_| Error::new(ErrorCode::Cancelled, "reader left"))
                })();
                if let Err(e) = result {
                    let _ = tx.blocking_send(Err(e.into()));
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn restore(
        &self,
        req: Request<Streaming<RestoreRequest>>,
    ) -> Result<Response<RestoreResponse>, Status> {
        let mut inbound = req.into_inner();
        let header = match inbound.message().await? {
            Some(RestoreRequest { request: Some(restore_request::Request::Header(h)) }) => h,
            _ => return Err(Error::invalid_field("header", "the first message must carry the header").into()),
        };
        let policy = Policy::compile(&header.policy.clone().unwrap_or_default())?;
        let staging = Staging::new(&self.staging_parent)?;
        let mut entries: Vec<ManifestEntry> = Vec::new();
        let mut summary: Option<ManifestSummary> = None;
        let mut current: Option<Incoming> = None;
        let mut received: HashSet<String> = HashSet::new();
        while let Some(msg) = inbound.message().await? {
            match msg.request {
                Some(restore_request::Request::Entries(batch)) => {
                    if summary.is_some() {
                        return Err(refuse("manifest entries after the first blob").into());
                    }
                    entries.extend(batch.entries);
                    if entries.len() as u64 > header.entry_count {
                        return Err(refuse("more manifest entries than the header announced").into());
                    }
                }
                Some(restore_request::Request::Blob(blob)) => {
                    if summary.is_none() {
                        if entries.len() as u64 != header.entry_count {
                            return Err(refuse("fewer manifest entries than the header announced").into());
                        }
                        summary = Some(check_manifest(&entries)?);
                    }
                    let known = summary.as_ref().expect("set above");
                    if current.as_ref().is_none_or(|c| c.sha256 != blob.sha256) {
                        if let Some(done) = current.take() {
                            received.insert(done.finish().await?);
                        }
                        let Some(&expected) = known.blobs.get(&blob.sha256) else {
                            return Err(
                                refuse(format!("blob {:?} is not in the manifest", blob.sha256)).into()
                            );
                        };
                        if received.contains(&blob.sha256) {
                            return Err(refuse(format!("blob {} sent twice", blob.sha256)).into());
                        }
                        let file = tokio::fs::File::create(staging.blob(&blob.sha256))
                            .await
                            .map_err(|e| Error::internal(format!("staging a blob: {e}")))?;
                        current = Some(Incoming {
                            sha256: blob.sha256.clone(),
                            file,
                            hasher: Sha256::new(),
                            size: 0,
                            expected,
                        });
                    }
                    let incoming = current.as_mut().expect("set above");
                    incoming.size += blob.data.len() as u64;
                    if incoming.size > incoming.expected {
                        return Err(refuse(format!(
                            "blob {} is longer than the {} bytes the manifest says",
                            incoming.sha256, incoming.expected
                        ))
                        .into());
                    }
                    incoming.hasher.update(&blob.data);
                    incoming
                        .file
                        .write_all(&blob.data)
                        .await
                        .map_err(|e| Error::internal(format!("staging a blob: {e}")))?;
                }
                Some(restore_request::Request::Header(_)) => return Err(refuse("a second header").into()),
                None => return Err(refuse("an empty message").into()),
            }
        }
        if let Some(done) = current.take() {
            received.insert(done.finish().await?);
        }
        let summary = match summary {
            Some(s) => s,
            None => {
                if entries.len() as u64 != header.entry_count {
                    return Err(refuse("fewer manifest entries than the header announced").into());
                }
                check_manifest(&entries)?
            }
        };
        if let Some(missing) = summary.blobs.keys().find(|h| !received.contains(*h)) {
            let path =
                entries.iter().find(|e| &e.sha256 == missing).map(|e| e.path.clone()).unwrap_or_default();
            return Err(Status::from(
                refuse(format!("blob {missing} of {path:?} is missing")).with_meta("path", path),
            ));
        }
        if received.len() as u64 != header.blob_count {
            return Err(refuse("the blob count differs from the header").into());
        }
        let root = self.root.clone();
        let response = blocking(move || {
            let plan = plan(root.path(), &policy, entries)?;
            // Verified and planned: the first change to the workspace.
            remove_paths(root.path(), &plan.remove)?;
            let mut response = write_entries(&root, &staging, &plan.write)?;
            response.paths_removed = plan.remove.len() as u64;
            response.entries_excluded = plan.excluded;
            drop(staging);
            Ok(response)
        })
        .await?;
        tracing::info!(
            files = response.files_written,
            dirs = response.dirs_created,
            bytes = response.bytes_written,
            removed = response.paths_removed,
            excluded = response.entries_excluded,
            "snapshot restored"
        );
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn zeroing_replaces_every_occurrence_including_overlaps() {
        let r = Redactor::new(&["abc".into(), "cde".into(), String::new()]).unwrap();
        assert_eq!(r.apply(b"xxabcdexx"), b"xx\0\0\0\0\0xx");
        assert_eq!(r.apply(b"abcabc"), vec![0u8; 6]);
        assert_eq!(r.apply(b"nothing"), b"nothing");
        let none = Redactor::new(&[]).unwrap();
        assert_eq!(none.apply(b"abc"), b"abc");
    }

    proptest! {
        /// Chunk boundaries never change the result: a value split across
        /// two reads is zeroed like one inside a single read.
        #[test]
        fn chunking_does_not_matter(
            data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'c')], 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let r = Redactor::new(&["abca".into(), "bb".into(), "cab".into()]).unwrap();
            let whole = r.apply(&data);
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= data.len()).collect();
            cuts.sort();
            let mut out = Vec::new();
            let mut z = r.stream(false);
            let mut from = 0;
            for c in cuts {
                z.push(&data[from..c], &mut out);
                from = c;
            }
            z.push(&data[from..], &mut out);
            z.finish(&mut out);
            prop_assert_eq!(out, whole);
        }
    }

    #[test]
    fn policies_include_exclude_and_redact_by_glob() {
        let p = Policy::compile(&CapturePolicy {
            include: vec!["src/**".into(), "README.md".into()],
            exclude: vec!["src/gen".into()],
            redact: vec!["src/*.key".into()],
        })
        .unwrap();
        assert!(p.included("src/a/b.rs"));
        assert!(!p.included("other.txt"));
        assert!(p.excluded("src/gen"));
        assert!(!p.excluded(".git"), "exclude replaces the defaults");
        assert!(p.excluded(shared::snapshot::PROJECTION_MARKER), "except the projection marker");
        assert!(p.redacted("src/x.key"));
        assert!(!p.redacted("src/a/x.key"), "`*` stays within a segment");
        let defaults = Policy::compile(&CapturePolicy::default()).unwrap();
        assert!(defaults.excluded("a/node_modules") && defaults.included("anything"));
    }
}
