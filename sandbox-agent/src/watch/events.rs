//! What a watch stream sends: events coalesced per file and kind over a
//! short window, in batches.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use shared::proto::agent::v1::{
    FileEvent, FileEventType, FileEvents, WatchMode, WatchResponse, WatchStarted, watch_response,
};

/// Default coalescing window.
pub const DEFAULT_COALESCE: Duration = Duration::from_millis(50);

fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
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

pub(super) fn started(mode: WatchMode) -> WatchResponse {
    WatchResponse { kind: Some(watch_response::Kind::Started(WatchStarted { mode: mode as i32 })) }
}

pub(super) fn batch(events: Vec<FileEvent>) -> WatchResponse {
    WatchResponse { kind: Some(watch_response::Kind::Events(FileEvents { events })) }
}

#[cfg(test)]
mod tests {
    use super::*;

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
