//! The polling source: a walk of the watched tree per interval, diffed
//! against the previous one; a directory that cannot be read keeps its
//! previous state instead of reporting deletes.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use shared::proto::agent::v1::{FileEventType, WatchMode, WatchResponse};
use tokio::sync::mpsc;
use tonic::Status;

use super::events::{Coalescer, batch, started};
use super::scope::Scope;

/// What a poll remembers of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    is_dir: bool,
    len: u64,
    mtime_ns: i128,
    ino: u64,
}

/// A walk of the watched tree: entries by absolute path, and the
/// directories that could not be read (whose previous state is kept).
struct Snapshot {
    entries: HashMap<PathBuf, Entry>,
    unreadable: Vec<PathBuf>,
    dir_ok: bool,
}

fn walk(scope: &Scope) -> Snapshot {
    let mut snap = Snapshot { entries: HashMap::new(), unreadable: Vec::new(), dir_ok: true };
    for entry in scope.walk(&scope.dir) {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                if e.depth() == 0 {
                    snap.dir_ok = false;
                }
                if let Some(dir) = e.path() {
                    snap.unreadable.push(dir.to_path_buf());
                }
                continue;
            }
        };
        // lstat: the walk follows no symlink.
        let Ok(meta) = entry.metadata() else { continue };
        let e = Entry {
            is_dir: meta.is_dir(),
            len: meta.len(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            ino: meta.ino(),
        };
        snap.entries.insert(entry.into_path(), e);
    }
    snap
}

pub(super) async fn run_poll(
    scope: Scope,
    interval: Duration,
    tx: mpsc::Sender<Result<WatchResponse, Status>>,
) {
    let walk_scope = scope.clone();
    let Ok(mut prev) = tokio::task::spawn_blocking(move || walk(&walk_scope)).await else { return };
    if tx.send(Ok(started(WatchMode::Poll))).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tx.closed() => return,
        }
        let walk_scope = scope.clone();
        let Ok(mut next) = tokio::task::spawn_blocking(move || walk(&walk_scope)).await else { return };
        // A walk that could not read the watched directory says nothing
        // about its contents: no deletes from a failed poll.
        if !next.dir_ok {
            continue;
        }
        // A poll is one batch per interval already: the coalescer only
        // deduplicates within it.
        let mut out = Coalescer::new(Duration::ZERO);
        let now = Instant::now();
        let mut created: Vec<(&PathBuf, &Entry)> =
            next.entries.iter().filter(|(p, _)| !prev.entries.contains_key(*p)).collect();
        created.sort_by(|a, b| a.0.cmp(b.0));
        for (path, e) in created {
            if let Some(rel) = scope.relevant(path) {
                out.push(now, FileEventType::Create, rel, String::new(), e.is_dir);
            }
        }
        let mut changed: Vec<&PathBuf> = next
            .entries
            .iter()
            .filter(|(p, e)| prev.entries.get(*p).is_some_and(|old| !e.is_dir && old != *e))
            .map(|(p, _)| p)
            .collect();
        changed.sort();
        for path in changed {
            if let Some(rel) = scope.relevant(path) {
                out.push(now, FileEventType::Change, rel, String::new(), false);
            }
        }
        let mut carried = Vec::new();
        let mut deleted: Vec<(&PathBuf, &Entry)> = Vec::new();
        for (path, e) in &prev.entries {
            if next.entries.contains_key(path) {
                continue;
            }
            if next.unreadable.iter().any(|d| path.starts_with(d)) {
                carried.push((path.clone(), *e));
            } else {
                deleted.push((path, e));
            }
        }
        deleted.sort_by(|a, b| a.0.cmp(b.0));
        for (path, e) in deleted {
            if let Some(rel) = scope.relevant(path) {
                out.push(now, FileEventType::Delete, rel, String::new(), e.is_dir);
            }
        }
        next.entries.extend(carried);
        prev = next;
        if let Some(events) = out.take(now)
            && tx.send(Ok(batch(events))).await.is_err()
        {
            return;
        }
    }
}
