//! Run journal benchmarks, each with its baseline in the same run:
//! - throughput: a command writes 1,000,000 lines of ~200 bytes; the journal
//!   is read back through `Follow` over the Unix socket, against `cat` of the
//!   same file into a pipe;
//! - follow latency: one line written, time until the client has it, p50/p99
//!   over 1,000 lines, against `tail -f` on the same file (both at once).
//!
//! Run with `cargo bench -p sandbox-agent --bench journal`. Set
//! `JOURNAL_BENCH_LINES` to change the line count.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sandbox_agent::AgentOptions;
use shared::proto::agent::v1::journal_service_client::JournalServiceClient;
use shared::proto::agent::v1::{
    Command, FollowRequest, ProbeExitRequest, RunState, StartRunRequest, command, follow_response,
    start_run_request,
};
use shared::secret::Secret;
use shared::transport::{Address, AuthedChannel, BearerToken, authed, connect};

const KEY: &[u8] = b"bench-sentinel-key";
const LATENCY_LINES: usize = 1000;

type Client = JournalServiceClient<AuthedChannel>;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn shell(s: &str) -> Option<Command> {
    Some(Command { kind: Some(command::Kind::Shell(s.into())) })
}

async fn wait_finished(c: &mut Client, run_id: &str) {
    loop {
        let r = c
            .probe_exit(ProbeExitRequest { run_id: run_id.into(), sentinel_key: KEY.to_vec() })
            .await
            .expect("probe")
            .into_inner();
        if r.state() == RunState::Finished {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn row(name: &str, lines: u64, bytes: u64, secs: f64) {
    println!(
        "{name:<28} {lines:>10} {:>9.1} {secs:>8.3} {:>12.0} {:>9.1}",
        bytes as f64 / 1e6,
        lines as f64 / secs,
        bytes as f64 / 1e6 / secs
    );
}

async fn throughput(c: &mut Client, journal_dir: &Path, lines: u64) {
    // ~200 bytes per line: a small JSON object with a padded field.
    let script = format!(
        "awk 'BEGIN {{ p = sprintf(\"%170s\", \"\"); gsub(/ /, \"x\", p); \
         for (i = 1; i <= {lines}; i++) printf \"{{\\\"type\\\":\\\"text\\\",\\\"n\\\":%d,\\\"p\\\":\\\"%s\\\"}}\\n\", i, p }}'"
    );
    let t = Instant::now();
    c.start_run(StartRunRequest {
        run_id: "throughput".into(),
        command: shell(&script),
        sentinel_key: KEY.to_vec(),
        ..Default::default()
    })
    .await
    .expect("start");
    wait_finished(c, "throughput").await;
    let write_secs = t.elapsed().as_secs_f64();
    let path = journal_dir.join("throughput.ndjson");
    let file_bytes = std::fs::metadata(&path).expect("journal").len();

    let t = Instant::now();
    let mut stream = c
        .follow(FollowRequest {
            run_id: "throughput".into(),
            from_byte: 0,
            sentinel_key: KEY.to_vec(),
            first_byte_timeout_ms: Some(0),
            ..Default::default()
        })
        .await
        .expect("follow")
        .into_inner();
    let (mut n, mut bytes) = (0u64, 0u64);
    while let Some(msg) = stream.next().await {
        match msg.expect("message").event.expect("event") {
            follow_response::Event::Lines(l) => {
                n += l.lines.len() as u64;
                bytes += l.lines.iter().map(|l| l.data.len() as u64 + 1).sum::<u64>();
            }
            follow_response::Event::Exit(_) => break,
        }
    }
    let follow_secs = t.elapsed().as_secs_f64();
    assert_eq!(n, lines, "every line delivered");

    // Counted outside the timed section: the baseline is cat's own speed.
    let cat_lines = std::fs::read(&path).expect("journal").iter().filter(|&&b| b == b'\n').count() as u64;
    let t = Instant::now();
    let mut cat = std::process::Command::new("cat")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cat");
    let mut out = cat.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut cat_bytes = 0u64;
    loop {
        let k = out.read(&mut buf).expect("read");
        if k == 0 {
            break;
        }
        cat_bytes += k as u64;
    }
    cat.wait().expect("cat exit");
    let cat_secs = t.elapsed().as_secs_f64();

    println!(
        "\njournal throughput: {lines} lines, {:.1} MB journal (written in {write_secs:.2} s)",
        file_bytes as f64 / 1e6
    );
    println!("{:<28} {:>10} {:>9} {:>8} {:>12} {:>9}", "reader", "lines", "MB", "secs", "lines/s", "MB/s");
    row("Follow over unix socket", n, bytes, follow_secs);
    row("cat FILE | pipe (baseline)", cat_lines, cat_bytes, cat_secs);
}

async fn latency(c: &mut Client, root: &Path, journal_dir: &Path) {
    // The run's command is `cat` reading a FIFO: each line this process
    // writes to the FIFO lands in the journal at once.
    let fifo = root.join("latency.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::OpenOptions::new().write(true).open(fifo).expect("fifo writer"))
    };
    c.start_run(StartRunRequest {
        run_id: "latency".into(),
        command: shell("cat"),
        stdin: Some(start_run_request::Stdin::StdinFile("latency.fifo".into())),
        sentinel_key: KEY.to_vec(),
        ..Default::default()
    })
    .await
    .expect("start");
    let mut writer = writer.join().unwrap();
    let path = journal_dir.join("latency.ndjson");

    let mut stream = c
        .follow(FollowRequest {
            run_id: "latency".into(),
            from_byte: 0,
            sentinel_key: KEY.to_vec(),
            first_byte_timeout_ms: Some(0),
            ..Default::default()
        })
        .await
        .expect("follow")
        .into_inner();
    let (follow_tx, mut follow_rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    tokio::spawn(async move {
        while let Some(Ok(msg)) = stream.next().await {
            if let Some(follow_response::Event::Lines(l)) = msg.event {
                let now = Instant::now();
                for line in l.lines {
                    let i: usize = String::from_utf8_lossy(&line.data).trim().parse().unwrap_or(usize::MAX);
                    let _ = follow_tx.send((i, now));
                }
            }
        }
    });
    let mut tail = std::process::Command::new("tail")
        .args(["-c", "+1", "-f"])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("tail");
    let tail_out = tail.stdout.take().unwrap();
    let (tail_tx, mut tail_rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    std::thread::spawn(move || {
        for line in BufReader::new(tail_out).lines() {
            let Ok(line) = line else { break };
            let now = Instant::now();
            if tail_tx.send((line.trim().parse().unwrap_or(usize::MAX), now)).is_err() {
                break;
            }
        }
    });

    // Let both readers reach the (empty) end of the file first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut follow_lat = Vec::with_capacity(LATENCY_LINES);
    let mut tail_lat = Vec::with_capacity(LATENCY_LINES);
    for i in 0..LATENCY_LINES {
        let t0 = Instant::now();
        writer.write_all(format!("{i}\n").as_bytes()).expect("fifo write");
        let (fi, ft) = follow_rx.recv().await.expect("follow line");
        let (ti, tt) = tail_rx.recv().await.expect("tail line");
        assert_eq!((fi, ti), (i, i), "lines arrive in order");
        follow_lat.push(ft - t0);
        tail_lat.push(tt - t0);
        // Pace the writes a little so that each line is its own event.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(writer); // EOF: cat exits, the supervisor writes the sentinel
    let _ = tail.kill();
    let _ = tail.wait();
    follow_lat.sort();
    tail_lat.sort();
    println!("\nfollow latency: one line written -> received, {LATENCY_LINES} lines");
    println!("{:<28} {:>10} {:>10}", "reader", "p50 ms", "p99 ms");
    for (name, lat) in [("Follow over unix socket", &follow_lat), ("tail -f (baseline)", &tail_lat)] {
        println!("{name:<28} {:>10.3} {:>10.3}", ms(percentile(lat, 50.0)), ms(percentile(lat, 99.0)));
    }
}

fn main() {
    sandbox_agent::journal::set_shim_program(env!("CARGO_BIN_EXE_sandhold-agent"));
    let lines: u64 =
        std::env::var("JOURNAL_BENCH_LINES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("agent.sock");
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let root = dir.path().join("root");
    let journal_dir = dir.path().join("journal");
    let options = AgentOptions {
        listen: Address::Unix(socket.clone()),
        root: root.clone(),
        token: Secret::new(token.clone()),
        journal_dir: journal_dir.clone(),
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
        let mut client = JournalServiceClient::new(authed(channel, BearerToken::new(&token).unwrap()))
            .max_decoding_message_size(64 << 20);
        throughput(&mut client, &journal_dir, lines).await;
        let root = root.canonicalize().unwrap();
        latency(&mut client, &root, &journal_dir).await;
    });
    let _ = stop.send(());
    let _ = runtime.block_on(server);
}
