//! Capture: the manifest of the workspace, walked without following
//! anything, each kept file hashed after zeroing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{BlobRef, EntryKind, ManifestEntry};

use super::policy::Policy;
use super::redaction::{Redactor, zero_file};
use crate::confine::{Root, io_error};
use crate::run_user::{FsAs, RunUser};

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

/// Threads hashing a capture's files at most (the sandbox's CPUs allowing).
const HASHERS: usize = 4;

/// Files per hasher below which one thread hashes them all.
const FILES_PER_HASHER: usize = 256;

/// A file's size and hex SHA-256 after zeroing.
type Hashed = (u64, String);

/// The manifest of the tree under `root`, sorted by path, read as `user`
/// (the calling thread is already; the threads that hash files switch
/// too).
pub fn capture(
    root: &Path,
    policy: &Policy,
    redactor: &Redactor,
    user: Option<&RunUser>,
) -> Result<Vec<ManifestEntry>, Error> {
    let mut entries = Vec::new();
    let mut files = Vec::new();
    walk(root, "", policy, &mut entries, &mut files)?;
    let hashed = hash_files(&entries, &files, policy, redactor, user)?;
    for ((at, _), (size, sha256)) in files.iter().zip(hashed) {
        (entries[*at].size, entries[*at].sha256) = (size, sha256);
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

/// Zero and hash the `files` (the index of each one's entry, its path) on
/// up to [`HASHERS`] threads: a first capture of a source tree hashed one
/// file after another while the other CPUs idled. Returns what each file
/// hashed to, in the order of `files`; an error is the first file's.
fn hash_files(
    entries: &[ManifestEntry],
    files: &[(usize, PathBuf)],
    policy: &Policy,
    redactor: &Redactor,
    user: Option<&RunUser>,
) -> Result<Vec<Hashed>, Error> {
    let hash = |(at, abs): &(usize, PathBuf)| {
        let path = entries[*at].path.as_str();
        let mut hasher = Sha256::new();
        let size = zero_file(abs, path, redactor, policy.redacted(path), |out| {
            hasher.update(out);
            Ok(())
        })?;
        Ok((size, hex::encode(hasher.finalize())))
    };
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let hashers = cpus.min(HASHERS).min(files.len() / FILES_PER_HASHER).max(1);
    if hashers == 1 {
        return files.iter().map(hash).collect();
    }
    // Each thread takes the next file not taken (sizes vary), as the run
    // user; the results are put back in order.
    let next = AtomicUsize::new(0);
    let work = || {
        let _as_user = FsAs::new(user)?;
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(file) = files.get(i) else { return Ok::<_, Error>(done) };
            done.push((i, hash(file)));
        }
    };
    let mut results: Vec<Option<Result<Hashed, Error>>> = files.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..hashers).map(|_| scope.spawn(work)).collect();
        for thread in threads {
            let done = thread.join().unwrap_or_else(|_| Err(Error::internal("a capture hasher panicked")))?;
            for (i, result) in done {
                results[i] = Some(result);
            }
        }
        Ok::<_, Error>(())
    })?;
    results.into_iter().map(|r| r.expect("every file was taken")).collect()
}

/// Capture below `dir`; true when anything below it was captured. Its
/// files are in `out` with neither size nor hash yet, each also in `files`
/// (its index in `out`, its path) to be hashed.
fn walk(
    dir: &Path,
    rel: &str,
    policy: &Policy,
    out: &mut Vec<ManifestEntry>,
    files: &mut Vec<(usize, PathBuf)>,
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
            let below = walk(&abs, &path, policy, out, files)?;
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
            files.push((out.len(), abs));
            out.push(ManifestEntry {
                kind: EntryKind::File as i32,
                size: 0,
                mode: meta.mode() & 0o666,
                sha256: String::new(),
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
/// when it is no longer a plain file. Whether the bytes are still the
/// manifest's the control plane checks on receipt (it hashes every blob
/// it stores, and refuses the save naming the file): a second hash here
/// was a tenth of a first capture's time.
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
    zero_file(&abs, path, redactor, policy.redacted(path), sink).map(drop)
}
