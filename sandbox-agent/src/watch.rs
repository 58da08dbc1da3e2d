//! `WatchService`: create/change/delete/rename events under the sandbox root.
//!
//! Two sources: inotify (through `notify`, one non-recursive watch per
//! directory so ignored trees such as `node_modules` cost no watches) or a
//! polling walk that diffs snapshots. Both feed a [`Coalescer`] that keeps one
//! event per (file, kind) per short window, so a burst of writes is one
//! `change`. Nothing is dropped silently: a kernel queue overflow rearms the
//! watches and sends a `rescan` event; a poll that cannot read a directory
//! keeps its previous state for it instead of reporting deletes.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime};

use futures::Stream;
use globset::{Glob, GlobMatcher};
use notify::event::{EventKind, ModifyKind, RenameMode};
use notify::{RecursiveMode, Watcher};
use shared::error::Error;
use shared::proto::agent::v1::watch_service_server::WatchService;
use shared::proto::agent::v1::{
    FileEvent, FileEventType, FileEvents, WatchMode, WatchRequest, WatchResponse, WatchStarted,
    watch_response,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use crate::confine::Root;
use crate::context::AgentContext;

/// Ignored unless the request says otherwise.
pub const DEFAULT_IGNORE: [&str; 2] = [".git", "node_modules"];
/// Default coalescing window.
pub const DEFAULT_COALESCE: Duration = Duration::from_millis(50);
/// Default poll interval.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(1000);

pub struct Watch {
    root: Root,
}

impl Watch {
    pub fn new(ctx: &AgentContext) -> Self {
        Self { root: ctx.root.clone() }
    }
}

/// Which paths a watch skips.
#[derive(Debug, Clone)]
pub struct Ignore {
    /// Matched against each path component below the watched directory.
    components: Vec<GlobMatcher>,
    /// Matched against the root-relative path and each of its prefixes.
    paths: Vec<GlobMatcher>,
}

impl Ignore {
    pub fn new(patterns: &[String], defaults: bool) -> Result<Self, Error> {
        let mut components = Vec::new();
        let mut paths = Vec::new();
        let defaults = if defaults { DEFAULT_IGNORE.as_slice() } else { &[] };
        for p in defaults.iter().copied().chain(patterns.iter().map(String::as_str)) {
            let p = p.trim_end_matches('/');
            if p.is_empty() {
                continue;
            }
            let glob = Glob::new(p).map_err(|e| Error::invalid_field("ignore", format!("{p:?}: {e}")))?;
            if p.contains('/') {
                let glob = globset::GlobBuilder::new(p)
                    .literal_separator(true)
                    .build()
                    .map_err(|e| Error::invalid_field("ignore", format!("{p:?}: {e}")))?;
                paths.push(glob.compile_matcher());
            } else {
                components.push(glob.compile_matcher());
            }
        }
        Ok(Self { components, paths })
    }

    /// `rel` is root-relative; `below` the part below the watched directory.
    pub fn is_ignored(&self, rel: &Path, below: &Path) -> bool {
        if below.components().any(|c| self.components.iter().any(|g| g.is_match(c.as_os_str()))) {
            return true;
        }
        if !self.paths.is_empty() {
            let mut prefix = PathBuf::new();
            for c in rel.components() {
                prefix.push(c);
                if self.paths.iter().any(|g| g.is_match(&prefix)) {
                    return true;
                }
            }
        }
        false
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Everything a watch loop needs to turn absolute paths into events.
#[derive(Clone)]
struct Scope {
    root: Root,
    dir: PathBuf,
    recursive: bool,
    ignore: Ignore,
}

impl Scope {
    /// Root-relative path of `abs` when it is in scope and not ignored.
    fn relevant(&self, abs: &Path) -> Option<String> {
        let below = abs.strip_prefix(&self.dir).ok()?;
        if below.as_os_str().is_empty() {
            return None;
        }
        if !self.recursive && below.components().count() > 1 {
            return None;
        }
        let rel = self.root.relative(abs)?;
        if self.ignore.is_ignored(rel, below) {
            return None;
        }
        Some(rel.to_string_lossy().into_owned())
    }

    fn rel_dir(&self) -> String {
        self.root.relative(&self.dir).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

/// One event per (path, kind) per window; a `change` right after a `create`
/// of the same path is part of the create. Order of first occurrence is kept.
#[derive(Default)]
pub struct Coalescer {
    events: Vec<FileEvent>,
    seen: HashSet<(String, i32)>,
    first_at: Option<Instant>,
}

impl Coalescer {
    pub fn push(&mut self, kind: FileEventType, path: String, from_path: String, is_dir: bool) {
        let k = kind as i32;
        if kind == FileEventType::Change && self.seen.contains(&(path.clone(), FileEventType::Create as i32))
        {
            return;
        }
        if kind != FileEventType::Rename && !self.seen.insert((path.clone(), k)) {
            return;
        }
        self.first_at.get_or_insert_with(Instant::now);
        self.events.push(FileEvent { r#type: k, path, timestamp_ms: now_ms(), from_path, is_dir });
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// When the pending batch is due.
    pub fn due(&self, window: Duration) -> Option<Instant> {
        self.first_at.map(|t| t + window)
    }

    pub fn take(&mut self) -> Vec<FileEvent> {
        self.seen.clear();
        self.first_at = None;
        std::mem::take(&mut self.events)
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl WatchService for Watch {
    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let req = req.into_inner();
        let dir = self.root.resolve(&req.path)?;
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(Error::invalid_field("path", "not a directory").into()),
            Err(_) => {
                return Err(
                    Error::not_found(format!("no directory {:?} under the sandbox root", req.path)).into()
                );
            }
        }
        let ignore = Ignore::new(&req.ignore, !req.no_default_ignore)?;
        let scope = Scope { root: self.root.clone(), dir, recursive: req.recursive, ignore };
        let window = req.coalesce_ms.map_or(DEFAULT_COALESCE, Duration::from_millis);
        let interval = match req.poll_interval_ms {
            Some(ms) if ms > 0 => Duration::from_millis(ms),
            _ => DEFAULT_POLL_INTERVAL,
        };
        let (tx, rx) = mpsc::channel::<Result<WatchResponse, Status>>(64);
        let inotify = if req.poll { None } else { InotifySource::new(&scope).ok() };
        match inotify {
            Some(source) => {
                tokio::spawn(run_inotify(source, scope, window, tx));
            }
            None => {
                // A poll is one batch per interval: that is its coalescing.
                tokio::spawn(run_poll(scope, interval, tx));
            }
        }
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

fn started(mode: WatchMode) -> WatchResponse {
    WatchResponse { kind: Some(watch_response::Kind::Started(WatchStarted { mode: mode as i32 })) }
}

fn batch(events: Vec<FileEvent>) -> WatchResponse {
    WatchResponse { kind: Some(watch_response::Kind::Events(FileEvents { events })) }
}

struct InotifySource {
    watcher: notify::RecommendedWatcher,
    events: mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
}

impl InotifySource {
    fn new(scope: &Scope) -> notify::Result<Self> {
        let (tx, events) = mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |res| {
            let _ = tx.send(res);
        })?;
        watcher.watch(&scope.dir, RecursiveMode::NonRecursive)?;
        let mut source = Self { watcher, events };
        if scope.recursive {
            source.watch_tree(scope, &scope.dir.clone(), None);
        }
        Ok(source)
    }

    /// Watch every non-ignored directory below `dir`. With `report`, also
    /// report what is already there as created (a directory that appears may
    /// have been filled before its watch existed).
    fn watch_tree(&mut self, scope: &Scope, dir: &Path, mut report: Option<&mut Coalescer>) {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                let Some(rel) = scope.relevant(&path) else { continue };
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if let Some(c) = report.as_deref_mut() {
                    c.push(FileEventType::Create, rel, String::new(), is_dir);
                }
                if is_dir {
                    let _ = self.watcher.watch(&path, RecursiveMode::NonRecursive);
                    stack.push(path);
                }
            }
        }
    }
}

async fn run_inotify(
    mut source: InotifySource,
    scope: Scope,
    window: Duration,
    tx: mpsc::Sender<Result<WatchResponse, Status>>,
) {
    if tx.send(Ok(started(WatchMode::Inotify))).await.is_err() {
        return;
    }
    let mut out = Coalescer::default();
    // MOVED_FROM halves waiting for their MOVED_TO, by cookie.
    let mut moves: HashMap<usize, (PathBuf, Instant)> = HashMap::new();
    loop {
        let deadline = out.due(window).or_else(|| moves.values().map(|(_, t)| *t + window).min());
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = source.events.recv() => {
                let Some(ev) = ev else { return };
                handle_notify(&mut source, &scope, &mut out, &mut moves, ev);
                // Take what is queued already, so a burst is one batch.
                while let Ok(ev) = source.events.try_recv() {
                    handle_notify(&mut source, &scope, &mut out, &mut moves, ev);
                }
                if window.is_zero() && !out.is_empty() && tx.send(Ok(batch(out.take()))).await.is_err() {
                    return;
                }
            }
            _ = sleep => {
                // A move out of the tree has no second half: it is a delete.
                let now = Instant::now();
                let expired: Vec<usize> = moves.iter().filter(|(_, (_, t))| *t + window <= now).map(|(k, _)| *k).collect();
                for k in expired {
                    if let Some((path, _)) = moves.remove(&k)
                        && let Some(rel) = scope.relevant(&path)
                    {
                        out.push(FileEventType::Delete, rel, String::new(), false);
                    }
                }
                if out.due(window).is_some_and(|d| d <= Instant::now()) && tx.send(Ok(batch(out.take()))).await.is_err() {
                    return;
                }
            }
            _ = tx.closed() => return,
        }
    }
}

fn handle_notify(
    source: &mut InotifySource,
    scope: &Scope,
    out: &mut Coalescer,
    moves: &mut HashMap<usize, (PathBuf, Instant)>,
    ev: notify::Result<notify::Event>,
) {
    let ev = match ev {
        Ok(ev) => ev,
        Err(e) => {
            tracing::warn!(error = %e, "watch error, rescanning");
            rescan(source, scope, out);
            return;
        }
    };
    if ev.need_rescan() {
        tracing::warn!(dir = %scope.dir.display(), "inotify queue overflow, rescanning");
        rescan(source, scope, out);
        return;
    }
    let Some(path) = ev.paths.first().cloned() else { return };
    match ev.kind {
        EventKind::Create(kind) => {
            let is_dir = matches!(kind, notify::event::CreateKind::Folder);
            created(source, scope, out, &path, is_dir);
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
            if let Some(cookie) = ev.attrs.tracker() {
                moves.insert(cookie, (path, Instant::now()));
            } else if let Some(rel) = scope.relevant(&path) {
                out.push(FileEventType::Delete, rel, String::new(), false);
            }
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
            // With a matching MOVED_FROM, the `Both` event that follows
            // reports the rename.
            let paired = ev.attrs.tracker().is_some_and(|c| moves.contains_key(&c));
            if !paired {
                let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
                created(source, scope, out, &path, is_dir);
            }
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            if let Some(c) = ev.attrs.tracker() {
                moves.remove(&c);
            }
            let (Some(from), Some(to)) = (ev.paths.first(), ev.paths.get(1)) else { return };
            let is_dir = std::fs::symlink_metadata(to).is_ok_and(|m| m.is_dir());
            match (scope.relevant(from), scope.relevant(to)) {
                (Some(f), Some(t)) => out.push(FileEventType::Rename, t, f, is_dir),
                (None, Some(t)) => out.push(FileEventType::Create, t, String::new(), is_dir),
                (Some(f), None) => out.push(FileEventType::Delete, f, String::new(), is_dir),
                (None, None) => {}
            }
            if is_dir && scope.recursive && scope.relevant(to).is_some() {
                let _ = source.watcher.watch(to, RecursiveMode::NonRecursive);
                source.watch_tree(scope, to, None);
            }
        }
        EventKind::Modify(_) => {
            if let Some(rel) = scope.relevant(&path) {
                out.push(FileEventType::Change, rel, String::new(), false);
            }
        }
        EventKind::Remove(kind) => {
            if let Some(rel) = scope.relevant(&path) {
                out.push(
                    FileEventType::Delete,
                    rel,
                    String::new(),
                    matches!(kind, notify::event::RemoveKind::Folder),
                );
            }
        }
        EventKind::Access(_) | EventKind::Any | EventKind::Other => {}
    }
}

fn created(source: &mut InotifySource, scope: &Scope, out: &mut Coalescer, path: &Path, is_dir: bool) {
    let Some(rel) = scope.relevant(path) else { return };
    out.push(FileEventType::Create, rel, String::new(), is_dir);
    if is_dir && scope.recursive {
        let _ = source.watcher.watch(path, RecursiveMode::NonRecursive);
        source.watch_tree(scope, path, Some(out));
    }
}

fn rescan(source: &mut InotifySource, scope: &Scope, out: &mut Coalescer) {
    let _ = source.watcher.watch(&scope.dir, RecursiveMode::NonRecursive);
    if scope.recursive {
        source.watch_tree(scope, &scope.dir.clone(), None);
    }
    out.push(FileEventType::Rescan, scope.rel_dir(), String::new(), true);
}

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
    let mut stack = vec![scope.dir.clone()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(_) => {
                if d == scope.dir {
                    snap.dir_ok = false;
                }
                snap.unreadable.push(d);
                continue;
            }
        };
        for entry in entries {
            let Ok(entry) = entry else {
                snap.unreadable.push(d.clone());
                continue;
            };
            let path = entry.path();
            if scope.relevant(&path).is_none() {
                continue;
            }
            // lstat: a symlink is an entry, never followed out of the root.
            let Ok(meta) = entry.metadata() else { continue };
            let e = Entry {
                is_dir: meta.is_dir(),
                len: meta.len(),
                mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
                ino: meta.ino(),
            };
            snap.entries.insert(path.clone(), e);
            if e.is_dir && scope.recursive {
                stack.push(path);
            }
        }
    }
    snap
}

async fn run_poll(scope: Scope, interval: Duration, tx: mpsc::Sender<Result<WatchResponse, Status>>) {
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
        let mut out = Coalescer::default();
        let mut created: Vec<(&PathBuf, &Entry)> =
            next.entries.iter().filter(|(p, _)| !prev.entries.contains_key(*p)).collect();
        created.sort_by(|a, b| a.0.cmp(b.0));
        for (path, e) in created {
            if let Some(rel) = scope.relevant(path) {
                out.push(FileEventType::Create, rel, String::new(), e.is_dir);
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
                out.push(FileEventType::Change, rel, String::new(), false);
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
                out.push(FileEventType::Delete, rel, String::new(), e.is_dir);
            }
        }
        next.entries.extend(carried);
        prev = next;
        if !out.is_empty() && tx.send(Ok(batch(out.take()))).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignore_matches_components_and_paths() {
        let ig = Ignore::new(&["*.tmp".into(), "build/out".into()], true).unwrap();
        let yes = |p: &str| ig.is_ignored(Path::new(p), Path::new(p));
        assert!(yes(".git/HEAD"));
        assert!(yes("a/node_modules/x/y.js"));
        assert!(yes("a/b.tmp"));
        assert!(yes("build/out/x.o"));
        assert!(!yes("build/outer.o"));
        assert!(!yes("src/main.rs"));
        assert!(!yes("a/.gitignore"));
        let none = Ignore::new(&[], false).unwrap();
        assert!(!none.is_ignored(Path::new(".git/HEAD"), Path::new(".git/HEAD")));
        assert!(Ignore::new(&["a[".into()], true).is_err());
    }

    #[test]
    fn coalescer_keeps_one_event_per_file_and_kind() {
        let mut c = Coalescer::default();
        c.push(FileEventType::Create, "a".into(), String::new(), false);
        c.push(FileEventType::Change, "a".into(), String::new(), false);
        c.push(FileEventType::Change, "b".into(), String::new(), false);
        c.push(FileEventType::Change, "b".into(), String::new(), false);
        c.push(FileEventType::Delete, "a".into(), String::new(), false);
        let got: Vec<(i32, String)> = c.take().into_iter().map(|e| (e.r#type, e.path)).collect();
        assert_eq!(
            got,
            vec![
                (FileEventType::Create as i32, "a".to_string()),
                (FileEventType::Change as i32, "b".to_string()),
                (FileEventType::Delete as i32, "a".to_string()),
            ]
        );
        assert!(c.is_empty() && c.due(DEFAULT_COALESCE).is_none());
    }
}
