//! The inotify source (through `notify`): one non-recursive watch per
//! directory, so ignored trees cost no watches; a kernel queue overflow
//! rearms the watches and reports a `rescan`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use notify::event::{EventKind, ModifyKind, RenameMode};
use notify::{RecursiveMode, Watcher};
use shared::proto::agent::v1::{FileEventType, WatchMode, WatchResponse};
use tokio::sync::mpsc;
use tonic::Status;

use super::events::{Coalescer, batch, started};
use super::scope::Scope;

pub(super) struct InotifySource {
    watcher: notify::RecommendedWatcher,
    events: mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
}

impl InotifySource {
    pub(super) fn new(scope: &Scope) -> notify::Result<Self> {
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
        for entry in scope.walk(dir).flatten() {
            let Some(rel) = scope.relevant(entry.path()) else { continue };
            let is_dir = entry.file_type().is_dir();
            if let Some(c) = report.as_deref_mut() {
                c.push(Instant::now(), FileEventType::Create, rel, String::new(), is_dir);
            }
            if is_dir {
                let _ = self.watcher.watch(entry.path(), RecursiveMode::NonRecursive);
            }
        }
    }
}

pub(super) async fn run_inotify(
    mut source: InotifySource,
    scope: Scope,
    window: Duration,
    tx: mpsc::Sender<Result<WatchResponse, Status>>,
) {
    if tx.send(Ok(started(WatchMode::Inotify))).await.is_err() {
        return;
    }
    let mut out = Coalescer::new(window);
    // MOVED_FROM halves waiting for their MOVED_TO, by cookie.
    let mut moves: HashMap<usize, (PathBuf, Instant)> = HashMap::new();
    loop {
        let move_due = moves.values().map(|(_, t)| *t + window).min();
        let deadline = out.deadline().into_iter().chain(move_due).min();
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
            }
            _ = sleep => {
                // A move out of the tree has no second half: it is a delete.
                let now = Instant::now();
                let expired: Vec<usize> = moves.iter().filter(|(_, (_, t))| *t + window <= now).map(|(k, _)| *k).collect();
                for k in expired {
                    if let Some((path, _)) = moves.remove(&k)
                        && let Some(rel) = scope.relevant(&path)
                    {
                        out.push(now, FileEventType::Delete, rel, String::new(), false);
                    }
                }
            }
            _ = tx.closed() => return,
        }
        // A quiet watch's first event is ready at once; the rest at the end
        // of its window.
        if let Some(events) = out.take(Instant::now())
            && tx.send(Ok(batch(events))).await.is_err()
        {
            return;
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
    let now = Instant::now();
    match ev.kind {
        EventKind::Create(kind) => {
            let is_dir = matches!(kind, notify::event::CreateKind::Folder);
            created(source, scope, out, &path, is_dir);
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
            if let Some(cookie) = ev.attrs.tracker() {
                moves.insert(cookie, (path, now));
            } else if let Some(rel) = scope.relevant(&path) {
                out.push(now, FileEventType::Delete, rel, String::new(), false);
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
                (Some(f), Some(t)) => out.push(now, FileEventType::Rename, t, f, is_dir),
                (None, Some(t)) => out.push(now, FileEventType::Create, t, String::new(), is_dir),
                (Some(f), None) => out.push(now, FileEventType::Delete, f, String::new(), is_dir),
                (None, None) => {}
            }
            if is_dir && scope.recursive && scope.relevant(to).is_some() {
                let _ = source.watcher.watch(to, RecursiveMode::NonRecursive);
                source.watch_tree(scope, to, None);
            }
        }
        EventKind::Modify(_) => {
            if let Some(rel) = scope.relevant(&path) {
                out.push(now, FileEventType::Change, rel, String::new(), false);
            }
        }
        EventKind::Remove(kind) => {
            if let Some(rel) = scope.relevant(&path) {
                out.push(
                    now,
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
    out.push(Instant::now(), FileEventType::Create, rel, String::new(), is_dir);
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
    out.push(Instant::now(), FileEventType::Rescan, scope.rel_dir(), String::new(), true);
}
