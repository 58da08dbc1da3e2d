//! What a watch stream sends: events coalesced per file and kind, in
//! batches, behind a leading-edge throttle: the first event after a quiet
//! spell goes out at once, what follows within the window goes out at its
//! end.

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

/// A leading-edge throttle over file events.
///
/// On a quiet watch an event is ready at once and opens a window. Events
/// arriving while it is open are kept, one per (path, kind), a `change`
/// right after a `create` of the same path being part of the create. The
/// event sent at the window's leading edge does not count: what happened to
/// its file after it was sent is news (a client that read the file on its
/// `create` must learn that the content changed since), so a file created
/// and written in one burst is a `create` at once and a `change` at the
/// window's end. When the window ends, what it kept is one batch and a new
/// window opens; if it kept nothing the watch is quiet again. A continuous
/// stream of writes is so one batch per window.
/// A zero window coalesces nothing across calls: each [`Coalescer::take`]
/// returns what was pushed since the previous one. Order of first
/// occurrence is kept. Time is passed in, so the throttle is tested
/// without clocks.
pub struct Coalescer {
    window: Duration,
    /// To send now: a window's leading event, or a window's batch at its end.
    ready: Vec<FileEvent>,
    /// Kept for the end of the open window.
    pending: Vec<FileEvent>,
    /// What the open window has sent or kept.
    seen: HashSet<(String, i32)>,
    /// End of the open window; `None` while the watch is quiet.
    window_end: Option<Instant>,
}

impl Coalescer {
    pub fn new(window: Duration) -> Self {
        Self { window, ready: Vec::new(), pending: Vec::new(), seen: HashSet::new(), window_end: None }
    }

    pub fn push(&mut self, now: Instant, kind: FileEventType, path: String, from_path: String, is_dir: bool) {
        self.advance(now);
        let k = kind as i32;
        if kind == FileEventType::Change && self.seen.contains(&(path.clone(), FileEventType::Create as i32))
        {
            return;
        }
        if kind != FileEventType::Rename && !self.seen.insert((path.clone(), k)) {
            return;
        }
        let event = FileEvent { r#type: k, path, timestamp_ms: now_ms(), from_path, is_dir };
        if self.window.is_zero() {
            self.ready.push(event);
        } else if self.window_end.is_some() {
            self.pending.push(event);
        } else {
            self.window_end = Some(now + self.window);
            self.ready.push(event);
            // Sent: later events of its file in this window are news.
            self.seen.clear();
        }
    }

    /// The batch to send at `now`, if there is one.
    pub fn take(&mut self, now: Instant) -> Option<Vec<FileEvent>> {
        self.advance(now);
        if self.window.is_zero() {
            self.seen.clear();
        }
        if self.ready.is_empty() { None } else { Some(std::mem::take(&mut self.ready)) }
    }

    /// When [`Coalescer::take`] has a batch again without a new push: the end
    /// of a window that kept events. A window that kept nothing needs no
    /// wake-up; it is closed by the next push.
    pub fn deadline(&self) -> Option<Instant> {
        if self.pending.is_empty() { None } else { self.window_end }
    }

    /// Close the window if it has ended: its events become ready and a new
    /// window opens, or, with nothing kept, the watch is quiet again.
    fn advance(&mut self, now: Instant) {
        let Some(end) = self.window_end else { return };
        if now < end {
            return;
        }
        self.seen.clear();
        if self.pending.is_empty() {
            self.window_end = None;
        } else {
            self.ready.append(&mut self.pending);
            self.window_end = Some(now + self.window);
        }
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

    const W: Duration = DEFAULT_COALESCE;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn push(c: &mut Coalescer, at: Instant, kind: FileEventType, path: &str) {
        c.push(at, kind, path.into(), String::new(), false);
    }

    fn brief(batch: Option<Vec<FileEvent>>) -> Option<Vec<(FileEventType, String)>> {
        batch.map(|b| b.into_iter().map(|e| (e.r#type(), e.path)).collect())
    }

    fn one(kind: FileEventType, path: &str) -> Option<Vec<(FileEventType, String)>> {
        Some(vec![(kind, path.to_string())])
    }

    #[test]
    fn the_first_event_goes_out_at_once_and_the_rest_at_the_window_end() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W);
        push(&mut c, t0, FileEventType::Create, "a");
        assert_eq!(brief(c.take(t0)), one(FileEventType::Create, "a"));
        assert_eq!(c.deadline(), None, "nothing kept, no wake-up");

        push(&mut c, t0 + ms(10), FileEventType::Change, "b");
        assert_eq!(c.take(t0 + ms(10)), None);
        assert_eq!(c.deadline(), Some(t0 + W));
        assert_eq!(c.take(t0 + W - ms(1)), None);
        assert_eq!(brief(c.take(t0 + W)), one(FileEventType::Change, "b"));

        // The batch opened a new window: the next event waits for its end.
        push(&mut c, t0 + W + ms(10), FileEventType::Change, "b");
        assert_eq!(c.take(t0 + W + ms(10)), None);
        assert_eq!(c.deadline(), Some(t0 + W * 2));
        assert_eq!(brief(c.take(t0 + W * 2)), one(FileEventType::Change, "b"));

        // That window keeps nothing: it closes, and the next event leads.
        assert_eq!(c.take(t0 + W * 3), None);
        assert_eq!(c.deadline(), None);
        push(&mut c, t0 + ms(500), FileEventType::Delete, "a");
        assert_eq!(brief(c.take(t0 + ms(500))), one(FileEventType::Delete, "a"));
    }

    #[test]
    fn a_window_keeps_one_event_per_file_and_kind_after_its_leading_event() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W);
        push(&mut c, t0, FileEventType::Create, "a");
        assert_eq!(brief(c.take(t0)), one(FileEventType::Create, "a"));
        // The create is sent: a change after it is news, once.
        push(&mut c, t0 + ms(1), FileEventType::Change, "a");
        push(&mut c, t0 + ms(1), FileEventType::Change, "a");
        push(&mut c, t0 + ms(2), FileEventType::Change, "b");
        push(&mut c, t0 + ms(3), FileEventType::Change, "b");
        push(&mut c, t0 + ms(4), FileEventType::Delete, "a");
        c.push(t0 + ms(6), FileEventType::Rename, "c".into(), "b".into(), false);
        c.push(t0 + ms(7), FileEventType::Rename, "b".into(), "c".into(), false);
        assert_eq!(c.take(t0 + ms(7)), None);
        let got = c.take(t0 + W).unwrap();
        let got: Vec<(FileEventType, &str, &str)> =
            got.iter().map(|e| (e.r#type(), e.path.as_str(), e.from_path.as_str())).collect();
        assert_eq!(
            got,
            vec![
                (FileEventType::Change, "a", ""),
                (FileEventType::Change, "b", ""),
                (FileEventType::Delete, "a", ""),
                (FileEventType::Rename, "c", "b"),
                (FileEventType::Rename, "b", "c"),
            ]
        );
        // A new window, a new set: the same change is news again.
        push(&mut c, t0 + W + ms(1), FileEventType::Change, "b");
        assert_eq!(brief(c.take(t0 + W * 2)), one(FileEventType::Change, "b"));
    }

    #[test]
    fn a_continuous_stream_is_one_batch_per_window_and_loses_nothing() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W);
        let mut sent: Vec<(Duration, Vec<FileEvent>)> = Vec::new();
        // What the inotify loop does: wake at the deadline or on an event,
        // then send what is ready. One new file per millisecond.
        for i in 0..500u64 {
            let now = t0 + ms(i);
            if c.deadline().is_some_and(|d| d <= now)
                && let Some(b) = c.take(now)
            {
                sent.push((now - t0, b));
            }
            push(&mut c, now, FileEventType::Create, &format!("f{i}"));
            if let Some(b) = c.take(now) {
                sent.push((now - t0, b));
            }
        }
        let end = c.deadline().unwrap();
        sent.push((end - t0, c.take(end).unwrap()));

        let at: Vec<Duration> = sent.iter().map(|(t, _)| *t).collect();
        assert_eq!(at, (0..=10).map(|k| W * k).collect::<Vec<_>>());
        assert_eq!(sent[0].1.len(), 1, "the leading event alone");
        let paths: Vec<String> = sent.into_iter().flat_map(|(_, b)| b).map(|e| e.path).collect();
        assert_eq!(paths, (0..500).map(|i| format!("f{i}")).collect::<Vec<_>>());
        assert_eq!(c.take(end + W), None);
    }

    #[test]
    fn writes_to_one_file_are_one_change_per_window_and_the_last_is_never_lost() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W);
        let mut at = Vec::new();
        for i in 0..200u64 {
            let now = t0 + ms(i);
            if c.deadline().is_some_and(|d| d <= now)
                && let Some(b) = c.take(now)
            {
                assert_eq!(b.len(), 1);
                at.push(now - t0);
            }
            push(&mut c, now, FileEventType::Change, "f");
            if let Some(b) = c.take(now) {
                assert_eq!(b.len(), 1);
                at.push(now - t0);
            }
        }
        // The writes after the leading one are one change at each window's
        // end, the last window's included: the final content is announced.
        let end = c.deadline().expect("the last writes are kept");
        assert_eq!(brief(c.take(end)), one(FileEventType::Change, "f"));
        at.push(end - t0);
        assert_eq!(at, vec![ms(0), W, W * 2, W * 3, W * 4]);
        assert_eq!(c.take(end + W), None, "then the watch is quiet");
    }

    #[test]
    fn a_zero_window_sends_everything_at_once() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::ZERO);
        push(&mut c, t0, FileEventType::Create, "a");
        push(&mut c, t0, FileEventType::Change, "a");
        push(&mut c, t0, FileEventType::Change, "b");
        push(&mut c, t0, FileEventType::Change, "b");
        push(&mut c, t0, FileEventType::Delete, "a");
        // One call's worth is deduplicated, as one kernel read is.
        assert_eq!(
            brief(c.take(t0)),
            Some(vec![
                (FileEventType::Create, "a".to_string()),
                (FileEventType::Change, "b".to_string()),
                (FileEventType::Delete, "a".to_string()),
            ])
        );
        assert_eq!(c.deadline(), None);
        push(&mut c, t0, FileEventType::Change, "b");
        assert_eq!(brief(c.take(t0)), one(FileEventType::Change, "b"));
    }
}
