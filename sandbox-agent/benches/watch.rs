//! Watch latency: a file is written, time until the event is received,
//! p50/p99, for `WatchService` over the Unix socket (inotify without and
//! with the default coalescing window, and polling) against `inotifywait`
//! (Debian `inotify-tools`) watching the same directory at the same time.
//! With the window, writes come back to back (each right after the previous
//! event arrived: a continuous stream, one batch per window) and after a
//! quiet spell longer than the window (the first event of a burst): a
//! write's `create` goes out at once and its `change` at the window's end,
//! which opens the next window, so the spell is counted from that `change`.
//!
//! Run with `cargo bench -p sandbox-agent --bench watch`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sandbox_agent::AgentOptions;
use shared::proto::agent::v1::watch_service_client::WatchServiceClient;
use shared::proto::agent::v1::{FileEventType, WatchRequest, watch_response};
use shared::secret::Secret;
use shared::transport::{Address, AuthedChannel, BearerToken, authed, connect};

type Client = WatchServiceClient<AuthedChannel>;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What a watcher reported: a file name, the event's kind, its arrival.
type Events = tokio::sync::mpsc::UnboundedReceiver<(String, FileEventType, Instant)>;

/// Events of one watch.
async fn open_watch(c: &mut Client, req: WatchRequest) -> Events {
    let mut stream = c.watch(req).await.expect("watch").into_inner();
    let first = stream.next().await.expect("started").expect("started");
    assert!(matches!(first.kind, Some(watch_response::Kind::Started(_))));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(msg)) = stream.next().await {
            let now = Instant::now();
            if let Some(watch_response::Kind::Events(e)) = msg.kind {
                for ev in e.events {
                    let name = ev.path.rsplit('/').next().unwrap_or_default().to_string();
                    let _ = tx.send((name, ev.r#type(), now));
                }
            }
        }
    });
    rx
}

fn inotifywait(dir: &Path) -> (std::process::Child, Events) {
    let mut child = std::process::Command::new("inotifywait")
        .args(["-m", "-q", "-e", "create", "--format", "%f"])
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("inotifywait (apt install inotify-tools)");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send((line, FileEventType::Create, Instant::now())).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// When the `create` of `name` arrived.
async fn recv_name(rx: &mut Events, name: &str) -> Instant {
    recv_event(rx, name, FileEventType::Create, Duration::from_secs(30)).await.expect("event in time")
}

/// When the event `kind` of `name` arrived, if it did within `within`.
async fn recv_event(rx: &mut Events, name: &str, kind: FileEventType, within: Duration) -> Option<Instant> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (n, k, t) = tokio::time::timeout_at(deadline, rx.recv()).await.ok()?.expect("watch open");
        if n == name && k == kind {
            return Some(t);
        }
    }
}

struct Case {
    label: &'static str,
    req: WatchRequest,
    n: usize,
    /// Pause before each write.
    quiet: Duration,
}

fn print_row(name: &str, lat: &mut [Duration]) {
    lat.sort();
    println!(
        "{name:<40} {:>6} {:>10.3} {:>10.3}",
        lat.len(),
        ms(percentile(lat, 50.0)),
        ms(percentile(lat, 99.0))
    );
}

async fn run(c: &mut Client, root: &Path) {
    let cases = [
        Case {
            label: "Watch inotify, coalesce 0",
            req: WatchRequest { path: "w0".into(), coalesce_ms: Some(0), ..Default::default() },
            n: 1000,
            quiet: Duration::ZERO,
        },
        Case {
            label: "Watch inotify, coalesce 50 ms (default)",
            req: WatchRequest { path: "w1".into(), ..Default::default() },
            n: 200,
            quiet: Duration::ZERO,
        },
        Case {
            label: "  same, each write after 60 ms quiet",
            req: WatchRequest { path: "w3".into(), ..Default::default() },
            n: 200,
            quiet: Duration::from_millis(60),
        },
        Case {
            label: "Watch poll, interval 100 ms",
            req: WatchRequest {
                path: "w2".into(),
                poll: true,
                poll_interval_ms: Some(100),
                ..Default::default()
            },
            n: 100,
            quiet: Duration::ZERO,
        },
    ];
    println!("\nwatch latency: file created -> event received");
    println!("{:<40} {:>6} {:>10} {:>10}", "watcher", "n", "p50 ms", "p99 ms");
    for case in cases {
        let dir = root.join(&case.req.path);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ours = open_watch(c, case.req.clone()).await;
        let (mut child, mut theirs) = inotifywait(&dir);
        // inotifywait has no "ready" signal with -q: probe until it reports.
        let mut k = 0;
        loop {
            let name = format!("probe{k}");
            std::fs::write(dir.join(&name), b"").unwrap();
            if tokio::time::timeout(Duration::from_millis(200), recv_name(&mut theirs, &name)).await.is_ok() {
                recv_name(&mut ours, &name).await;
                break;
            }
            k += 1;
        }
        let mut our_lat = Vec::with_capacity(case.n);
        let mut their_lat = Vec::with_capacity(case.n);
        for i in 0..case.n {
            let name = format!("f{i}");
            tokio::time::sleep(case.quiet).await;
            let t0 = Instant::now();
            std::fs::write(dir.join(&name), b"x").unwrap();
            let t_ours = recv_name(&mut ours, &name).await;
            let t_theirs = recv_name(&mut theirs, &name).await;
            our_lat.push(t_ours - t0);
            their_lat.push(t_theirs - t0);
            if case.quiet > Duration::ZERO {
                // The write's `change`, at the window's end: the quiet spell
                // before the next write starts there.
                let change = recv_event(&mut ours, &name, FileEventType::Change, case.quiet * 3).await;
                assert!(change.is_some(), "{name}: no change at the window's end");
            }
        }
        print_row(case.label, &mut our_lat);
        print_row("  inotifywait, same writes (baseline)", &mut their_lat);
        if case.quiet > Duration::ZERO {
            let (ours, theirs) = (ms(percentile(&our_lat, 50.0)), ms(percentile(&their_lat, 50.0)));
            sandhold_tests::bench::summary(
                80,
                "file event, default settings (first of a burst)",
                &format!("{ours:.2} ms p50"),
                &format!("`inotifywait` {theirs:.2} ms"),
                Some(ours / theirs),
                "≤ 1 ms p50",
            );
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("agent.sock");
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let root = dir.path().join("root");
    let options = AgentOptions {
        listen: Address::Unix(socket.clone()),
        root: root.clone(),
        token: Secret::new(token.clone()),
        journal_dir: dir.path().join("journal"),
        run_user: None,
        unconfined: false,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(sandbox_agent::serve(options, async move {
        let _ = stopped.await;
    }));
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "agent did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let channel = connect(&Address::Unix(socket.clone())).await.expect("connect");
        let mut client = WatchServiceClient::new(authed(channel, BearerToken::new(&token).unwrap()));
        run(&mut client, &root.canonicalize().unwrap()).await;
    });
    let _ = stop.send(());
    let _ = runtime.block_on(server);
}
