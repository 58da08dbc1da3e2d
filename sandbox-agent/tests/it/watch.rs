//! WatchService over a real Unix socket, with inotify and with polling.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use sandhold_tests::agent::TestAgent;
use shared::proto::agent::v1::watch_service_client::WatchServiceClient;
use shared::proto::agent::v1::{
    FileEvent, FileEventType, WatchMode, WatchRequest, WatchResponse, watch_response,
};
use shared::transport::AuthedChannel;
use tonic::{Code, Streaming};

const LONG: Duration = Duration::from_secs(120);

struct Events {
    stream: Streaming<WatchResponse>,
    seen: Vec<FileEvent>,
}

impl Events {
    async fn open(agent: &TestAgent, req: WatchRequest) -> (Self, WatchMode) {
        let mut client: WatchServiceClient<AuthedChannel> = WatchServiceClient::new(agent.channel().await);
        let mut stream = client.watch(req).await.unwrap().into_inner();
        let first = tokio::time::timeout(LONG, stream.next()).await.unwrap().unwrap().unwrap();
        let Some(watch_response::Kind::Started(s)) = first.kind else { panic!("started first") };
        (Self { stream, seen: Vec::new() }, s.mode())
    }

    /// Read events until `done` holds for everything seen so far.
    async fn until(&mut self, what: &str, done: impl Fn(&[FileEvent]) -> bool) {
        let deadline = tokio::time::Instant::now() + LONG;
        while !done(&self.seen) {
            let msg = tokio::time::timeout_at(deadline, self.stream.next())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}; seen {:?}", brief(&self.seen)))
                .expect("stream open")
                .expect("event");
            if let Some(watch_response::Kind::Events(e)) = msg.kind {
                self.seen.extend(e.events);
            }
        }
    }

    fn has(&self, kind: FileEventType, path: &str) -> bool {
        has(&self.seen, kind, path)
    }
}

fn has(events: &[FileEvent], kind: FileEventType, path: &str) -> bool {
    events.iter().any(|e| e.r#type() == kind && e.path == path)
}

fn brief(events: &[FileEvent]) -> Vec<(FileEventType, String)> {
    events.iter().map(|e| (e.r#type(), e.path.clone())).take(50).collect()
}

fn req(path: &str, poll: bool) -> WatchRequest {
    WatchRequest {
        path: path.into(),
        recursive: true,
        poll,
        poll_interval_ms: Some(50),
        ..Default::default()
    }
}

#[tokio::test]
async fn inotify_reports_nested_creates_changes_renames_and_deletes_but_not_ignored_dirs() {
    let agent = TestAgent::start().await;
    std::fs::create_dir_all(agent.root.join("w/.git")).unwrap();
    std::fs::create_dir_all(agent.root.join("w/node_modules/pkg")).unwrap();
    let (mut ev, mode) = Events::open(&agent, req("w", false)).await;
    assert_eq!(mode, WatchMode::Inotify);
    let w = agent.root.join("w");

    std::fs::write(w.join(".git/HEAD"), b"ref").unwrap();
    std::fs::write(w.join("node_modules/pkg/index.js"), b"x").unwrap();
    std::fs::create_dir_all(w.join("a/b")).unwrap();
    std::fs::write(w.join("a/b/f.txt"), b"one").unwrap();
    ev.until("nested create", |s| has(s, FileEventType::Create, "w/a/b/f.txt")).await;
    assert!(ev.has(FileEventType::Create, "w/a"));
    // Timestamps are wall-clock milliseconds.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!(ev.seen.iter().all(|e| (now - e.timestamp_ms).abs() < 600_000));

    // A burst of writes to one file: coalesced, yet reported.
    for i in 0..200 {
        std::fs::write(w.join("a/b/f.txt"), format!("v{i}")).unwrap();
    }
    std::fs::write(w.join("marker1"), b"").unwrap();
    ev.until("change", |s| {
        has(s, FileEventType::Change, "w/a/b/f.txt") && has(s, FileEventType::Create, "w/marker1")
    })
    .await;
    let changes =
        ev.seen.iter().filter(|e| e.r#type() == FileEventType::Change && e.path == "w/a/b/f.txt").count();
    assert!((1..200).contains(&changes), "{changes} change events for 200 writes");

    std::fs::rename(w.join("a/b/f.txt"), w.join("a/g.txt")).unwrap();
    ev.until("rename", |s| s.iter().any(|e| e.r#type() == FileEventType::Rename && e.path == "w/a/g.txt"))
        .await;
    let rename = ev.seen.iter().find(|e| e.r#type() == FileEventType::Rename).unwrap();
    assert_eq!(rename.from_path, "w/a/b/f.txt");

    std::fs::remove_file(w.join("a/g.txt")).unwrap();
    std::fs::remove_dir(w.join("a/b")).unwrap();
    ev.until("deletes", |s| {
        has(s, FileEventType::Delete, "w/a/g.txt") && has(s, FileEventType::Delete, "w/a/b")
    })
    .await;

    // Ignored dirs produced nothing at all.
    assert!(
        ev.seen.iter().all(|e| !e.path.contains(".git") && !e.path.contains("node_modules")),
        "{:?}",
        brief(&ev.seen)
    );
    agent.stop().await;
}

/// The next batch of a watch, within a minute.
async fn next_batch(ev: &mut Events) -> Vec<(FileEventType, String, String)> {
    let msg = tokio::time::timeout(Duration::from_secs(60), ev.stream.next())
        .await
        .expect("the first event is not held for the window")
        .expect("stream open")
        .expect("event");
    let Some(watch_response::Kind::Events(e)) = msg.kind else { panic!("a batch") };
    e.events.into_iter().map(|e| (e.r#type(), e.path, e.from_path)).collect()
}

#[tokio::test]
async fn the_first_event_of_a_burst_does_not_wait_for_the_window() {
    let agent = TestAgent::start().await;
    std::fs::create_dir_all(agent.root.join("l")).unwrap();
    std::fs::write(agent.root.join("l/old"), b"x").unwrap();
    // A window far longer than the wait below: only a leading event can
    // arrive in time.
    let long_window = WatchRequest { coalesce_ms: Some(3_600_000), ..req("l", false) };
    let (mut ev, _) = Events::open(&agent, long_window.clone()).await;
    // Created and written: the create alone, at once; the write is part of it.
    std::fs::write(agent.root.join("l/new"), b"x").unwrap();
    assert_eq!(next_batch(&mut ev).await, vec![(FileEventType::Create, "l/new".into(), String::new())]);

    // A move inside the tree is paired before it leads its own window.
    let (mut ev, _) = Events::open(&agent, long_window).await;
    std::fs::rename(agent.root.join("l/old"), agent.root.join("l/moved")).unwrap();
    assert_eq!(next_batch(&mut ev).await, vec![(FileEventType::Rename, "l/moved".into(), "l/old".into())]);
    agent.stop().await;
}

#[tokio::test]
async fn polling_reports_creates_changes_and_deletes() {
    let agent = TestAgent::start().await;
    std::fs::create_dir_all(agent.root.join("p/node_modules")).unwrap();
    std::fs::write(agent.root.join("p/existing"), b"1").unwrap();
    let (mut ev, mode) = Events::open(&agent, req("p", true)).await;
    assert_eq!(mode, WatchMode::Poll);
    let p = agent.root.join("p");
    std::fs::create_dir_all(p.join("d/e")).unwrap();
    std::fs::write(p.join("d/e/new.txt"), b"x").unwrap();
    std::fs::write(p.join("node_modules/ignored.js"), b"x").unwrap();
    ev.until("create", |s| has(s, FileEventType::Create, "p/d/e/new.txt")).await;
    std::fs::write(p.join("existing"), b"longer content").unwrap();
    ev.until("change", |s| has(s, FileEventType::Change, "p/existing")).await;
    std::fs::remove_file(p.join("d/e/new.txt")).unwrap();
    ev.until("delete", |s| has(s, FileEventType::Delete, "p/d/e/new.txt")).await;
    assert!(ev.seen.iter().all(|e| !e.path.contains("node_modules")));
    assert!(!ev.has(FileEventType::Create, "p/existing"), "existing files are not news");
    agent.stop().await;
}

#[tokio::test]
async fn a_failed_poll_reports_no_phantom_deletes() {
    let agent = TestAgent::start().await;
    std::fs::create_dir_all(agent.root.join("f/sub")).unwrap();
    for i in 0..20 {
        std::fs::write(agent.root.join(format!("f/sub/{i}")), b"x").unwrap();
    }
    let (mut ev, _) = Events::open(&agent, req("f", true)).await;
    // The watched directory vanishes for a while (an unreadable mount, a
    // swap by rename): the polls that cannot read it report nothing.
    std::fs::rename(agent.root.join("f"), agent.root.join("f-away")).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::rename(agent.root.join("f-away"), agent.root.join("f")).unwrap();
    std::fs::write(agent.root.join("f/marker"), b"").unwrap();
    ev.until("marker", |s| has(s, FileEventType::Create, "f/marker")).await;
    assert!(ev.seen.iter().all(|e| e.r#type() != FileEventType::Delete), "{:?}", brief(&ev.seen));
    agent.stop().await;
}

#[tokio::test]
async fn ten_thousand_files_at_once_lose_no_final_state() {
    let agent = TestAgent::start().await;
    std::fs::create_dir_all(agent.root.join("many")).unwrap();
    let (mut ev, _) = Events::open(&agent, req("many", false)).await;
    let dir = agent.root.join("many");
    tokio::task::spawn_blocking(move || {
        for i in 0..10_000 {
            std::fs::write(dir.join(format!("f{i:05}")), b"x").unwrap();
        }
    })
    .await
    .unwrap();
    ev.until("every file or a rescan", |s| {
        if s.iter().any(|e| e.r#type() == FileEventType::Rescan) {
            return true;
        }
        let created: HashSet<&str> =
            s.iter().filter(|e| e.r#type() == FileEventType::Create).map(|e| e.path.as_str()).collect();
        created.len() == 10_000
    })
    .await;
    if let Some(rescan) = ev.seen.iter().find(|e| e.r#type() == FileEventType::Rescan) {
        assert_eq!(rescan.path, "many");
    } else {
        for i in (0..10_000).step_by(1111) {
            assert!(ev.has(FileEventType::Create, &format!("many/f{i:05}")));
        }
    }
    agent.stop().await;
}

#[tokio::test]
async fn watch_paths_are_confined() {
    let agent = TestAgent::start().await;
    let mut client: WatchServiceClient<AuthedChannel> = WatchServiceClient::new(agent.channel().await);
    for (path, code) in
        [("..", Code::PermissionDenied), ("/etc", Code::PermissionDenied), ("missing", Code::NotFound)]
    {
        let st = client.watch(req(path, false)).await.map(|_| ()).unwrap_err();
        assert_eq!(st.code(), code, "{path}");
    }
    std::fs::write(agent.root.join("file"), b"").unwrap();
    let st = client.watch(req("file", false)).await.map(|_| ()).unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    let mut bad = req("", false);
    bad.ignore = vec!["a[".into()];
    assert_eq!(client.watch(bad).await.map(|_| ()).unwrap_err().code(), Code::InvalidArgument);
    agent.stop().await;
}
