//! Scale: N concurrent durable runs at a model's pace and M more attached
//! streams on one `sandhold serve` process, on SQLite and on PostgreSQL.
//!
//! Each run is a light writer (one `perl` printing a line every 100 ms,
//! `SANDHOLD_BENCH_SCALE_LINES` lines, default 100) in one warm local
//! sandbox, so what grows with N is the control plane's work, not sandbox
//! start-up. Runs are started 32 at a time; `StartRun` latency is from the
//! call to its answer (the run recorded and accepted), and to the run's
//! first chunk on its stream (after its sandbox's ensure: runs of a thread
//! take turns on the sandbox's lease). Once all are started, M
//! `AttachRun` streams from the start are spread over the runs. Every
//! stream must end with the run's terminal chunk and every line. Per
//! configuration, a fresh server: its peak RSS (`VmHWM`), its CPU seconds
//! (user + system) per 1,000 stored chunks, `StartRun` p50/p99.
//!
//! `cargo bench -p control-plane --bench scale`. The PostgreSQL rows need
//! SANDHOLD_TEST_DATABASE_URL (scripts/bench sets it);
//! `SANDHOLD_BENCH_SCALE=10x0,500x1000` picks other configurations (runs x
//! attached streams), `SANDHOLD_BENCH_SCALE_DB=SQLite` one database.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandhold_tests::bench::{Row, ms, summary};
use sandhold_tests::provider::Kind;
use sandhold_tests::run::{definition, put_definition};
use sandhold_tests::server::{Runs, ServerOptions, ServerProcess};
use shared::proto::v1 as api;
use tokio::sync::Semaphore;

/// (runs, attached streams) per configuration.
const CONFIGS: [(usize, usize); 4] = [(10, 0), (100, 0), (500, 1_000), (500, 5_000)];
const STARTS_IN_FLIGHT: usize = 32;
/// Streams per client connection (the server allows 1,024).
const STREAMS_PER_CONNECTION: usize = 500;

struct Outcome {
    database: &'static str,
    runs: usize,
    streams: usize,
    chunks: usize,
    peak_rss_mb: f64,
    cpu_s: f64,
    start: Row,
    first_chunk: Row,
    wall: Duration,
}

/// What one stream saw: chunks, lines, and whether it ended with a
/// terminal chunk.
async fn drain(mut stream: tonic::Streaming<api::RunEvent>) -> (usize, usize, bool) {
    let (mut chunks, mut lines, mut terminal) = (0, 0, false);
    while let Some(event) = stream.message().await.expect("run stream") {
        let Some(api::run_event::Event::Chunk(c)) = event.event else { continue };
        let chunk = c.chunk.expect("a chunk");
        chunks += 1;
        match chunk.r#type() {
            api::ChunkType::TextMessageContent => lines += chunk.delta.matches("line ").count(),
            api::ChunkType::RunFinished => terminal = true,
            api::ChunkType::RunError => panic!("run failed: {chunk:?}"),
            _ => {}
        }
    }
    (chunks, lines, terminal)
}

/// `(VmHWM in MB, user + system CPU seconds)` of a process.
fn usage(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the whole line.
    let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = rest[11].parse::<f64>().unwrap() + rest[12].parse::<f64>().unwrap();
    let hz: f64 =
        String::from_utf8(std::process::Command::new("getconf").arg("CLK_TCK").output().unwrap().stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    (hwm_kb / 1024.0, ticks / hz)
}

async fn configuration(
    database: &'static str,
    database_url: Option<String>,
    runs: usize,
    streams: usize,
    lines: usize,
) -> Outcome {
    let dir = sandhold_tests::local::TestDir::new("shsc");
    let nonce = sandhold_tests::nonce();
    let token = format!("tok-{nonce}");
    let options = ServerOptions {
        data_dir: dir.path().join("data"),
        database_url,
        tokens: vec![format!("t{nonce}={token}")],
        extra_args: ["--max-running-runs-per-tenant", "0", "--log-filter", "info"].map(String::from).to_vec(),
        ..Default::default()
    };
    let server = ServerProcess::start(&options).await;
    let mut sandboxes = server.sandboxes(&token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let warm = api::EnsureSandboxRequest {
        definition_id: "def".into(),
        thread_id: "scale".into(),
        ..Default::default()
    };
    let mut ensure = sandboxes.ensure_sandbox(warm).await.unwrap().into_inner();
    while ensure.message().await.unwrap().is_some() {}

    let connections = (runs + streams).div_ceil(STREAMS_PER_CONNECTION);
    let mut clients: Vec<Runs> = Vec::with_capacity(connections);
    for _ in 0..connections {
        clients.push(server.runs(&token).await);
    }
    let script = format!(
        "$| = 1; for my $i (1..{lines}) {{ print \"line $i\\n\"; select(undef, undef, undef, 0.1) }}"
    );
    let began = Instant::now();
    let gate = Arc::new(Semaphore::new(STARTS_IN_FLIGHT));
    let (live, mut lives) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut started = Vec::with_capacity(runs);
    for i in 0..runs {
        let mut client = clients[i % connections].clone();
        let gate = gate.clone();
        let live = live.clone();
        let request = api::StartRunRequest {
            thread_id: "scale".into(),
            run_id: format!("sc{i}-{nonce}"),
            definition_id: "def".into(),
            harness: "command".into(),
            options: Some(api::HarnessOptions {
                command: vec!["perl".into(), "-e".into(), script.clone()],
                ..Default::default()
            }),
            durable: true,
            ..Default::default()
        };
        started.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await.unwrap();
            let t = Instant::now();
            let mut stream = client.start_run(request).await.expect("start run").into_inner();
            let accepted = t.elapsed();
            // The first chunk: the run is recorded and its stream is live.
            let first = loop {
                let event = stream.message().await.expect("run stream").expect("a first chunk");
                if let Some(api::run_event::Event::Chunk(c)) = event.event {
                    break c.chunk.expect("a chunk");
                }
            };
            let latency = t.elapsed();
            drop(permit);
            let _ = live.send(());
            let (chunks, lines, terminal) = drain(stream).await;
            let first_lines = first.delta.matches("line ").count();
            (accepted, latency, chunks + 1, lines + first_lines, terminal)
        }));
    }
    // Every run has its first chunk before the attaches begin.
    for _ in 0..runs {
        lives.recv().await.expect("a start reports");
    }
    let mut attached = Vec::with_capacity(streams);
    for j in 0..streams {
        let mut client = clients[(runs + j) % connections].clone();
        let request =
            api::AttachRunRequest { run_id: format!("sc{}-{nonce}", j % runs), ..Default::default() };
        attached.push(tokio::spawn(async move {
            drain(client.attach_run(request).await.expect("attach").into_inner()).await
        }));
    }
    let mut start = Vec::with_capacity(runs);
    let mut first_chunk = Vec::with_capacity(runs);
    let mut chunks = 0;
    for task in started {
        let (accepted, latency, n, seen_lines, terminal) = task.await.unwrap();
        assert!(
            terminal && seen_lines == lines,
            "a run's stream ended with {seen_lines} lines, terminal {terminal}"
        );
        start.push(accepted);
        first_chunk.push(latency);
        chunks += n;
    }
    for task in attached {
        let (_, seen_lines, terminal) = task.await.unwrap();
        assert!(terminal && seen_lines == lines, "an attached stream ended with {seen_lines} lines");
    }
    let wall = began.elapsed();
    let (peak_rss_mb, cpu_s) = usage(server.pid());
    drop(clients);
    drop(server);
    Outcome {
        database,
        runs,
        streams,
        chunks,
        peak_rss_mb,
        cpu_s,
        start: Row { name: "", samples: start },
        first_chunk: Row { name: "", samples: first_chunk },
        wall,
    }
}

#[tokio::main]
async fn main() {
    let lines: usize =
        std::env::var("SANDHOLD_BENCH_SCALE_LINES").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let mut databases: Vec<(&'static str, Option<String>)> = vec![("SQLite", None)];
    match std::env::var("SANDHOLD_TEST_DATABASE_URL") {
        Ok(url) => databases.push(("PostgreSQL", Some(url))),
        Err(_) => eprintln!(
            "PostgreSQL rows skipped: SANDHOLD_TEST_DATABASE_URL is not set (scripts/bench sets it)"
        ),
    }
    if let Ok(only) = std::env::var("SANDHOLD_BENCH_SCALE_DB") {
        databases.retain(|(name, _)| *name == only);
    }
    let configs: Vec<(usize, usize)> = match std::env::var("SANDHOLD_BENCH_SCALE") {
        Ok(list) => list
            .split(',')
            .map(|c| {
                let (runs, streams) = c.split_once('x').expect("RUNSxSTREAMS");
                (runs.trim().parse().unwrap(), streams.trim().parse().unwrap())
            })
            .collect(),
        Err(_) => CONFIGS.to_vec(),
    };
    let mut outcomes = Vec::new();
    for (database, url) in &databases {
        for &(runs, streams) in &configs {
            outcomes.push(configuration(database, url.clone(), runs, streams, lines).await);
        }
    }
    println!("durable runs at a model's pace ({lines} lines, one every 100 ms) on one server, local sandbox");
    println!(
        "{:<11} {:>5} {:>9} {:>7} {:>8} {:>10} {:>11} {:>11} {:>13} {:>13} {:>7}",
        "database",
        "runs",
        "attached",
        "chunks",
        "RSS MB",
        "CPU s/1k",
        "start p50",
        "start p99",
        "1st chunk p50",
        "1st chunk p99",
        "wall s"
    );
    for o in &outcomes {
        println!(
            "{:<11} {:>5} {:>9} {:>7} {:>8.0} {:>10.3} {:>8.1} ms {:>8.1} ms {:>10.0} ms {:>10.0} ms {:>7.1}",
            o.database,
            o.runs,
            o.streams,
            o.chunks,
            o.peak_rss_mb,
            o.cpu_s / (o.chunks as f64 / 1000.0),
            ms(o.start.quantile(0.5)),
            ms(o.start.quantile(0.99)),
            ms(o.first_chunk.quantile(0.5)),
            ms(o.first_chunk.quantile(0.99)),
            o.wall.as_secs_f64()
        );
        summary(
            100 + o.runs as u32 / 10 + o.streams as u32 / 100 + u32::from(o.database == "PostgreSQL") * 1000,
            &format!("scale, {}: {} runs + {} attached streams", o.database, o.runs, o.streams),
            &format!(
                "RSS {:.0} MB, {:.2} CPU s/1k chunks, StartRun p50 {:.1} / p99 {:.1} ms (first chunk p99 {:.0} ms), all streams complete",
                o.peak_rss_mb,
                o.cpu_s / (o.chunks as f64 / 1000.0),
                ms(o.start.quantile(0.5)),
                ms(o.start.quantile(0.99)),
                ms(o.first_chunk.quantile(0.99))
            ),
            "",
            None,
            "RSS ≤ 150 MB at 500 + 5,000; StartRun p99 ≤ 100 ms at 500",
        );
    }
}
