//! Scale, as users load a control plane: N durable runs, each in a sandbox
//! of its own (a thread each), at a model's pace, and M more attached
//! streams, on one `sandhold serve` process, on SQLite and on PostgreSQL.
//!
//! Each run is a light writer (one `perl` printing a line every 100 ms,
//! `SANDHOLD_BENCH_SCALE_LINES` lines, default 600: a minute), each line
//! carrying the wall time it was written. Half the runs (even ones) use a
//! definition with a warm pool of N/2 sandboxes, filled before the runs
//! start; the other half a definition without one, so their sandboxes are
//! made cold (local provider). Runs are started 32 at a time; `StartRun`
//! latency is from the call to its answer (the run recorded and accepted),
//! first-chunk latency to the run's first chunk on its stream (after its
//! sandbox's ensure), per half; chunk latency from a line's write in the
//! sandbox to its receipt on the starting client's stream. Once all are
//! started, M `AttachRun` streams from the start are spread over the runs.
//! Every stream must end with the run's terminal chunk and every line,
//! each once; one the server ends UNAVAILABLE (a store request queued past
//! the pool's 30 s under load) is attached again after its last offset, as
//! the CLI and the clients do, and the table counts those. Per
//! configuration, a fresh server: its peak RSS (`VmHWM`), its CPU seconds
//! (user + system) per 1,000 stored chunks.
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
const CONFIGS: [(usize, usize); 4] = [(100, 1_000), (250, 1_000), (500, 1_000), (500, 5_000)];
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
    first_warm: Row,
    first_cold: Row,
    /// A line's write in the sandbox to its receipt by the starting client.
    chunk: Row,
    /// Streams attached again after an UNAVAILABLE, in all.
    reattached: usize,
    wall: Duration,
}

/// Each line's latency from its write (the wall time it carries) to now.
fn line_latencies(delta: &str, into: &mut Vec<Duration>) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    for line in delta.lines() {
        if let Some(written) = line.split(' ').nth(2).and_then(|t| t.parse::<f64>().ok()) {
            into.push(Duration::from_secs_f64((now - written).max(0.0)));
        }
    }
}

/// What one stream saw.
#[derive(Default)]
struct Seen {
    chunks: usize,
    lines: usize,
    /// It ended with a terminal chunk.
    terminal: bool,
    /// Times it was attached again after the server ended it UNAVAILABLE.
    reattached: usize,
}

/// Re-attaches of one stream, at most: past them the row fails.
const REATTACHES: usize = 50;

/// Read `stream` (of run `run_id`, after `offset`) to its end; with `latencies`, each
/// line's from its write. A stream the server ends with UNAVAILABLE (a
/// store request queued past the pool's timeout under load) is attached
/// again after the last offset seen, as the CLI and the clients do, and
/// counted.
async fn drain(
    mut client: Runs,
    run_id: String,
    mut offset: String,
    mut stream: tonic::Streaming<api::RunEvent>,
    mut latencies: Option<&mut Vec<Duration>>,
) -> Seen {
    let mut seen = Seen::default();
    loop {
        let event = match stream.message().await {
            Ok(Some(event)) => event,
            Ok(None) => break,
            Err(status) if status.code() == tonic::Code::Unavailable => {
                // A stream that ended with an error only says `None` after
                // it: keep attaching until a new stream is there.
                let again = api::AttachRunRequest {
                    run_id: run_id.clone(),
                    after_offset: offset.clone(),
                    ..Default::default()
                };
                stream = loop {
                    seen.reattached += 1;
                    assert!(
                        seen.reattached <= REATTACHES,
                        "{run_id}: UNAVAILABLE past {REATTACHES} re-attaches: {status:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    match client.attach_run(again.clone()).await {
                        Ok(attached) => break attached.into_inner(),
                        Err(status) if status.code() == tonic::Code::Unavailable => {}
                        Err(status) => panic!("attaching {run_id} again: {status:?}"),
                    }
                };
                continue;
            }
            Err(status) => panic!("run stream of {run_id}: {status:?}"),
        };
        let Some(api::run_event::Event::Chunk(c)) = event.event else { continue };
        offset = c.offset;
        let chunk = c.chunk.expect("a chunk");
        seen.chunks += 1;
        match chunk.r#type() {
            api::ChunkType::TextMessageContent => {
                seen.lines += chunk.delta.matches("line ").count();
                if let Some(into) = latencies.as_deref_mut() {
                    line_latencies(&chunk.delta, into);
                }
            }
            api::ChunkType::RunFinished => seen.terminal = true,
            api::ChunkType::RunError => panic!("run failed: {chunk:?}"),
            _ => {}
        }
    }
    seen
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
    // The even runs' sandboxes come from the pool.
    let pool = runs.div_ceil(2);
    let dir = sandhold_tests::local::TestDir::new("shsc");
    let nonce = sandhold_tests::nonce();
    let token = format!("tok-{nonce}");
    let options = ServerOptions {
        data_dir: dir.path().join("data"),
        database_url,
        tokens: vec![format!("t{nonce}={token}")],
        extra_args: vec![
            "--max-running-runs-per-tenant".into(),
            "0".into(),
            "--max-sandboxes-per-tenant".into(),
            "0".into(),
            "--max-warm-per-definition".into(),
            pool.max(1).to_string(),
            "--log-filter".into(),
            "info".into(),
        ],
        ..Default::default()
    };
    let server = ServerProcess::start(&options).await;
    let mut sandboxes = server.sandboxes(&token).await;
    put_definition(&mut sandboxes, definition("cold", Kind::Local)).await;
    let mut warm = definition("warm", Kind::Local);
    warm.lifecycle = Some(api::Lifecycle { warm: pool as u32, ..Default::default() });
    put_definition(&mut sandboxes, warm).await;
    let filling = Instant::now();
    loop {
        let pools = sandboxes.list_warm_pools(api::ListWarmPoolsRequest {}).await.unwrap().into_inner().pools;
        let ready = pools.iter().find(|p| p.definition_id == "warm").map_or(0, |p| p.ready as usize);
        if ready >= pool {
            break;
        }
        assert!(filling.elapsed() < Duration::from_secs(900), "the warm pool reached {ready} of {pool}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("scale: {runs} runs, warm pool of {pool} filled in {:.1} s", filling.elapsed().as_secs_f64());

    let connections = (runs + streams).div_ceil(STREAMS_PER_CONNECTION);
    let mut clients: Vec<Runs> = Vec::with_capacity(connections);
    for _ in 0..connections {
        clients.push(server.runs(&token).await);
    }
    let script = format!(
        "use Time::HiRes qw(time); $| = 1; \
         for my $i (1..{lines}) {{ printf \"line %d %.6f\\n\", $i, time; select(undef, undef, undef, 0.1) }}"
    );
    let began = Instant::now();
    let gate = Arc::new(Semaphore::new(STARTS_IN_FLIGHT));
    let (live, mut lives) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut started = Vec::with_capacity(runs);
    for i in 0..runs {
        let mut client = clients[i % connections].clone();
        let gate = gate.clone();
        let live = live.clone();
        let warm = i % 2 == 0;
        let run_id = format!("sc{i}-{nonce}");
        let request = api::StartRunRequest {
            thread_id: format!("scale-{i}"),
            run_id: run_id.clone(),
            definition_id: if warm { "warm" } else { "cold" }.into(),
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
            let (first, offset) = loop {
                let event = stream.message().await.expect("run stream").expect("a first chunk");
                if let Some(api::run_event::Event::Chunk(c)) = event.event {
                    break (c.chunk.expect("a chunk"), c.offset);
                }
            };
            let latency = t.elapsed();
            drop(permit);
            let _ = live.send(());
            let mut latencies = Vec::new();
            line_latencies(&first.delta, &mut latencies);
            let seen = drain(client, run_id, offset, stream, Some(&mut latencies)).await;
            let first_lines = first.delta.matches("line ").count();
            (warm, accepted, latency, latencies, seen.chunks + 1, seen.lines + first_lines, seen)
        }));
    }
    // Every run has its first chunk before the attaches begin. A start
    // that failed ends its task without reporting: once every task has
    // reported or ended the channel closes, and that start's own panic is
    // what the configuration fails with.
    drop(live);
    for _ in 0..runs {
        if lives.recv().await.is_none() {
            for task in started {
                if let Err(e) = task.await {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
            panic!("a run's start ended without its first chunk");
        }
    }
    let mut attached = Vec::with_capacity(streams);
    for j in 0..streams {
        let mut client = clients[(runs + j) % connections].clone();
        let run_id = format!("sc{}-{nonce}", j % runs);
        let request = api::AttachRunRequest { run_id: run_id.clone(), ..Default::default() };
        attached.push(tokio::spawn(async move {
            let mut refused = 0;
            let stream = loop {
                match client.attach_run(request.clone()).await {
                    Ok(stream) => break stream.into_inner(),
                    Err(status) if status.code() == tonic::Code::Unavailable && refused < REATTACHES => {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(status) => panic!("attaching {run_id}: {status:?}"),
                }
            };
            let mut seen = drain(client, run_id, String::new(), stream, None).await;
            seen.reattached += refused;
            seen
        }));
    }
    let mut start = Vec::with_capacity(runs);
    let (mut first_warm, mut first_cold) = (Vec::new(), Vec::new());
    let mut chunk = Vec::with_capacity(runs * lines);
    let (mut chunks, mut reattached) = (0, 0);
    for task in started {
        let (warm, accepted, latency, latencies, n, seen_lines, seen) = task.await.unwrap();
        assert!(
            seen.terminal && seen_lines == lines,
            "a run's stream ended with {seen_lines} lines, terminal {}",
            seen.terminal
        );
        reattached += seen.reattached;
        start.push(accepted);
        if warm { &mut first_warm } else { &mut first_cold }.push(latency);
        chunk.extend(latencies);
        chunks += n;
    }
    for task in attached {
        let seen = task.await.unwrap();
        assert!(
            seen.terminal && seen.lines == lines,
            "an attached stream ended with {} lines, terminal {}, after {} re-attaches",
            seen.lines,
            seen.terminal,
            seen.reattached
        );
        reattached += seen.reattached;
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
        first_warm: Row { name: "", samples: first_warm },
        first_cold: Row { name: "", samples: first_cold },
        chunk: Row { name: "", samples: chunk },
        reattached,
        wall,
    }
}

#[tokio::main]
async fn main() {
    let lines: usize =
        std::env::var("SANDHOLD_BENCH_SCALE_LINES").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
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
    // A configuration that fails (a run's error, a stream past its
    // re-attaches) is a row saying so; the next one still runs.
    let mut outcomes = Vec::new();
    let mut failed = Vec::new();
    for (database, url) in &databases {
        for &(runs, streams) in &configs {
            match tokio::spawn(configuration(database, url.clone(), runs, streams, lines)).await {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => {
                    let why = match e.try_into_panic() {
                        Ok(panic) => panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default(),
                        Err(e) => e.to_string(),
                    };
                    let why: String = why.replace(['\n', '\t'], " ").chars().take(300).collect();
                    eprintln!("scale: {database}, {runs} runs + {streams} streams failed: {why}");
                    failed.push((*database, runs, streams, why));
                }
            }
        }
    }
    println!(
        "durable runs at a model's pace ({lines} lines, one every 100 ms) on one server, each in its own local \
         sandbox: half from a warm pool, half made cold"
    );
    println!(
        "{:<11} {:>5} {:>9} {:>7} {:>7} {:>9} {:>15} {:>19} {:>19} {:>17} {:>9} {:>7}",
        "database",
        "runs",
        "attached",
        "chunks",
        "RSS MB",
        "CPU s/1k",
        "start p50/p99",
        "1st chunk warm p50/99",
        "1st chunk cold p50/99",
        "chunk lat p50/99",
        "re-attach",
        "wall s"
    );
    let pair = |row: &Row| match row.samples.is_empty() {
        true => "—".to_string(),
        false => format!("{:.0} / {:.0} ms", ms(row.quantile(0.5)), ms(row.quantile(0.99))),
    };
    for o in &outcomes {
        let cpu = o.cpu_s / (o.chunks as f64 / 1000.0);
        println!(
            "{:<11} {:>5} {:>9} {:>7} {:>7.0} {:>9.3} {:>15} {:>19} {:>19} {:>17} {:>9} {:>7.1}",
            o.database,
            o.runs,
            o.streams,
            o.chunks,
            o.peak_rss_mb,
            cpu,
            pair(&o.start),
            pair(&o.first_warm),
            pair(&o.first_cold),
            pair(&o.chunk),
            o.reattached,
            o.wall.as_secs_f64()
        );
        summary(
            100 + o.runs as u32 / 10 + o.streams as u32 / 100 + u32::from(o.database == "PostgreSQL") * 1000,
            &format!(
                "scale, {}: {} runs (own sandboxes) + {} attached streams",
                o.database, o.runs, o.streams
            ),
            &format!(
                "RSS {:.0} MB, {cpu:.2} CPU s/1k chunks, StartRun {}, first chunk warm {} / cold {}, chunk latency {}, \
                 every stream complete ({} re-attached after UNAVAILABLE)",
                o.peak_rss_mb,
                pair(&o.start),
                pair(&o.first_warm),
                pair(&o.first_cold),
                pair(&o.chunk),
                o.reattached
            ),
            "",
            None,
            "first chunk p99 ≤ 1 s (warm pool), chunk latency p99 ≤ 250 ms, RSS ≤ 150 MB, ≤ 0.1 CPU s per 1,000 chunks",
        );
    }
    for (database, runs, streams, why) in &failed {
        println!("{database:<11} {runs:>5} {streams:>9} failed: {why}");
        summary(
            100 + *runs as u32 / 10 + *streams as u32 / 100 + u32::from(*database == "PostgreSQL") * 1000,
            &format!("scale, {database}: {runs} runs (own sandboxes) + {streams} attached streams"),
            &format!("failed: {why}"),
            "",
            None,
            "first chunk p99 ≤ 1 s (warm pool), chunk latency p99 ≤ 250 ms, RSS ≤ 150 MB, ≤ 0.1 CPU s per 1,000 chunks",
        );
    }
}
