//! Event-log benchmark: append throughput (batches of 1, 16 and 256 chunks)
//! and read-after-append latency, SQLite vs PostgreSQL, against a plain
//! INSERT loop into an unfenced table of the same shape. Prints a table.
//!
//! Then group commit: 500 runs appending one chunk at a time at once
//! (SANDHOLD_BENCH_RUNS), each through its own `LogWriter`, with appends
//! grouped (the default) and with one transaction per append
//! (`GroupCommit::Off`, the path before grouping), and the latency of a
//! lone append both ways (grouping must not slow it down).
//!
//! `cargo bench -p control-plane --bench event_log`. PostgreSQL rows need
//! SANDHOLD_TEST_DATABASE_URL (see scripts/services); each run uses a
//! scratch database. SANDHOLD_BENCH_SECONDS sets the time per throughput
//! cell (default 2).

use std::str::FromStr;
use std::time::{Duration, Instant};

use control_plane::store::{
    EventLog, FIRST_EPOCH, GroupCommit, LogWriter, NewChunk, NewRun, Offset, RunId, RunKey, Stores,
    Timestamp, default_database_url,
};
use futures::StreamExt;
use sandhold_tests::bench::summary;
use sandhold_tests::database::ScratchDatabase;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};

const BATCH_SIZES: [usize; 3] = [1, 16, 256];
const LATENCY_SAMPLES: usize = 200;
/// Another instance on SQLite only learns of appends by its 1 s poll.
const CROSS_INSTANCE_SAMPLES: usize = 20;

const PLAIN_TABLE: &str = "CREATE TABLE IF NOT EXISTS bench_plain_events ( \
    run_id TEXT NOT NULL, seq BIGINT NOT NULL, epoch BIGINT NOT NULL, kind TEXT NOT NULL, \
    payload {BYTES} NOT NULL, appended_at BIGINT NOT NULL, PRIMARY KEY (run_id, seq))";

/// A plain pool on the same database, for the unfenced baseline.
enum Plain {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Plain {
    async fn connect(url: &str) -> Plain {
        if url.starts_with("sqlite:") {
            // The same durability settings the store uses.
            let options = SqliteConnectOptions::from_str(url)
                .unwrap()
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(30));
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            sqlx::query(&PLAIN_TABLE.replace("{BYTES}", "BLOB")).execute(&pool).await.unwrap();
            Plain::Sqlite(pool)
        } else {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query(&PLAIN_TABLE.replace("{BYTES}", "BYTEA")).execute(&pool).await.unwrap();
            Plain::Postgres(pool)
        }
    }

    /// One multi-row INSERT per batch, no transaction, no fence.
    async fn insert(&self, run: &str, first_seq: i64, chunks: &[NewChunk]) {
        let now = Timestamp::now().as_millis();
        macro_rules! insert {
            ($db:ty, $pool:expr) => {{
                let mut query = sqlx::QueryBuilder::<$db>::new(
                    "INSERT INTO bench_plain_events (run_id, seq, epoch, kind, payload, appended_at) ",
                );
                query.push_values(chunks.iter().enumerate(), |mut row, (i, chunk)| {
                    row.push_bind(run)
                        .push_bind(first_seq + i as i64)
                        .push_bind(1_i64)
                        .push_bind(chunk.kind.as_ref())
                        .push_bind(chunk.payload.as_ref())
                        .push_bind(now);
                });
                query.build().execute($pool).await.unwrap();
            }};
        }
        match self {
            Plain::Sqlite(pool) => insert!(sqlx::Sqlite, pool),
            Plain::Postgres(pool) => insert!(sqlx::Postgres, pool),
        }
    }
}

fn chunk_batch(size: usize, tag: usize) -> Vec<NewChunk> {
    (0..size)
        .map(|i| {
            let payload = format!(
                r#"{{"type":"TEXT_MESSAGE_CONTENT","messageId":"run-{tag}","delta":"chunk {i} of a reasonably sized model response line","timestamp":{}}}"#,
                Timestamp::now().as_millis()
            );
            NewChunk::new("TEXT_MESSAGE_CONTENT", payload.into_bytes())
        })
        .collect()
}

async fn new_run(stores: &Stores, id: &str) -> RunKey {
    let new = NewRun::bare(RunId::parse(id).unwrap(), "bench", "bench");
    let run = new.key();
    stores.runs.create_or_resume(new).await.unwrap();
    run
}

/// Chunks per second appending `batch`-sized batches for `budget`.
async fn fenced_throughput(stores: &Stores, batch: usize, budget: Duration) -> f64 {
    let run = new_run(stores, &format!("tp-{batch}")).await;
    let writer = LogWriter::new(stores.events.clone(), run, FIRST_EPOCH);
    let started = Instant::now();
    let mut appended = 0;
    let mut round = 0;
    while started.elapsed() < budget || round < 3 {
        let chunks = chunk_batch(batch, round);
        writer.append(&chunks).await.unwrap();
        appended += chunks.len();
        round += 1;
    }
    appended as f64 / started.elapsed().as_secs_f64()
}

async fn plain_throughput(plain: &Plain, batch: usize, budget: Duration) -> f64 {
    let run = format!("plain-{batch}");
    let started = Instant::now();
    let mut appended = 0;
    let mut round = 0;
    while started.elapsed() < budget || round < 3 {
        let chunks = chunk_batch(batch, round);
        plain.insert(&run, appended as i64 + 1, &chunks).await;
        appended += chunks.len();
        round += 1;
    }
    appended as f64 / started.elapsed().as_secs_f64()
}

/// Time from starting a one-chunk append to a tailer (through `reader`)
/// receiving it; `(p50, p99)`.
async fn read_after_append(
    writer_stores: &Stores,
    reader: &dyn EventLog,
    id: &str,
    samples: usize,
) -> (Duration, Duration) {
    let run = new_run(writer_stores, id).await;
    let writer = LogWriter::new(writer_stores.events.clone(), run.clone(), FIRST_EPOCH);
    let mut tail = reader.read(&run, &Offset::start()).await.unwrap();
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        let offsets = writer.append(&chunk_batch(1, i)).await.unwrap();
        let got = tail.next().await.unwrap().unwrap();
        latencies.push(started.elapsed());
        assert_eq!(got.offset, offsets[0]);
    }
    latencies.sort();
    (latencies[samples / 2], latencies[(samples * 99 / 100).min(samples - 1)])
}

/// Chunks per second stored by `runs` runs appending one chunk per append
/// at once for `budget`, and the p50 of one append's latency meanwhile.
async fn many_runs(url: &str, grouping: GroupCommit, runs: usize, budget: Duration) -> (f64, Duration) {
    let stores = Stores::open_with(url, grouping).await.unwrap();
    let tag = if grouping == GroupCommit::Off { "off" } else { "grouped" };
    let mut writers = Vec::with_capacity(runs);
    for i in 0..runs {
        let run = new_run(&stores, &format!("many-{tag}-{i}")).await;
        writers.push(LogWriter::new(stores.events.clone(), run, FIRST_EPOCH));
    }
    let started = Instant::now();
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|writer| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut round = 0;
                while started.elapsed() < budget {
                    let began = Instant::now();
                    writer.append(&chunk_batch(1, round)).await.unwrap();
                    latencies.push(began.elapsed());
                    round += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    stores.close().await;
    (rate, latencies[latencies.len() / 2])
}

/// p50 and p99 of a lone one-chunk append (nothing else appending).
async fn lone_append(url: &str, grouping: GroupCommit, samples: usize) -> (Duration, Duration) {
    let stores = Stores::open_with(url, grouping).await.unwrap();
    let tag = if grouping == GroupCommit::Off { "off" } else { "grouped" };
    let run = new_run(&stores, &format!("lone-{tag}")).await;
    let writer = LogWriter::new(stores.events.clone(), run, FIRST_EPOCH);
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let began = Instant::now();
        writer.append(&chunk_batch(1, i)).await.unwrap();
        latencies.push(began.elapsed());
    }
    latencies.sort();
    stores.close().await;
    (latencies[samples / 2], latencies[(samples * 99 / 100).min(samples - 1)])
}

struct Grouping {
    backend: &'static str,
    runs: usize,
    grouped: (f64, Duration),
    off: (f64, Duration),
    lone_grouped: (Duration, Duration),
    lone_off: (Duration, Duration),
}

async fn bench_grouping(backend: &'static str, url: &str, runs: usize, budget: Duration) -> Grouping {
    // Off first, so the grouped run does not start on a warmer database.
    let off = many_runs(url, GroupCommit::Off, runs, budget).await;
    let grouped = many_runs(url, GroupCommit::default(), runs, budget).await;
    let lone_off = lone_append(url, GroupCommit::Off, LATENCY_SAMPLES).await;
    let lone_grouped = lone_append(url, GroupCommit::default(), LATENCY_SAMPLES).await;
    Grouping { backend, runs, grouped, off, lone_grouped, lone_off }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

struct Row {
    backend: &'static str,
    throughput: Vec<(usize, f64, f64)>,
    same_instance: (Duration, Duration),
    other_instance: (Duration, Duration),
}

async fn bench_backend(backend: &'static str, url: &str, budget: Duration) -> Row {
    let stores = Stores::open(url).await.unwrap();
    let plain = Plain::connect(url).await;
    let mut throughput = Vec::new();
    for batch in BATCH_SIZES {
        let fenced = fenced_throughput(&stores, batch, budget).await;
        let baseline = plain_throughput(&plain, batch, budget).await;
        throughput.push((batch, fenced, baseline));
    }
    let same_instance = read_after_append(&stores, stores.events.as_ref(), "lat-same", LATENCY_SAMPLES).await;
    let replica = Stores::open(url).await.unwrap();
    let other_samples = if backend == "sqlite" { CROSS_INSTANCE_SAMPLES } else { LATENCY_SAMPLES };
    let other_instance =
        read_after_append(&stores, replica.events.as_ref(), "lat-other", other_samples).await;
    replica.close().await;
    stores.close().await;
    Row { backend, throughput, same_instance, other_instance }
}

fn main() {
    let budget = Duration::from_secs_f64(
        std::env::var("SANDHOLD_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0),
    );
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let runs = std::env::var("SANDHOLD_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(500);
        let mut rows = Vec::new();
        let mut groupings = Vec::new();
        let dir = tempfile::tempdir().unwrap();
        let sqlite = default_database_url(dir.path());
        rows.push(bench_backend("sqlite", &sqlite, budget).await);
        groupings.push(bench_grouping("sqlite", &sqlite, runs, budget).await);
        if let Some(admin_url) = sandhold_tests::services::postgres_url() {
            let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
            rows.push(bench_backend("postgres", scratch.url(), budget).await);
            groupings.push(bench_grouping("postgres", scratch.url(), runs, budget).await);
            scratch.drop_database().await.unwrap();
        }

        println!();
        println!("event log append throughput (chunks/s; {:.0} s per cell)", budget.as_secs_f64());
        println!(
            "{:<10} {:>6} {:>16} {:>16} {:>8}",
            "backend", "batch", "fenced append", "plain INSERT", "ratio"
        );
        for row in &rows {
            for (batch, fenced, baseline) in &row.throughput {
                println!(
                    "{:<10} {:>6} {:>16.0} {:>16.0} {:>7.2}x",
                    row.backend,
                    batch,
                    fenced,
                    baseline,
                    fenced / baseline
                );
            }
        }
        println!();
        println!("read-after-append latency, ms (append start -> tailer has the chunk)");
        println!(
            "{:<10} {:>14} {:>14} {:>16} {:>16}",
            "backend", "same p50", "same p99", "replica p50", "replica p99"
        );
        for row in &rows {
            println!(
                "{:<10} {:>14} {:>14} {:>16} {:>16}",
                row.backend,
                ms(row.same_instance.0),
                ms(row.same_instance.1),
                ms(row.other_instance.0),
                ms(row.other_instance.1)
            );
        }
        println!(
            "(replica = a second Stores on the same database: PostgreSQL wakes it by LISTEN/NOTIFY, \
             SQLite by its 1 s poll)"
        );
        println!();
        println!("group commit: runs appending one chunk per append at once, durable (chunks/s; append p50 ms)");
        println!(
            "{:<10} {:>5} {:>14} {:>10} {:>16} {:>10} {:>7} {:>16} {:>16}",
            "backend", "runs", "grouped", "p50", "one tx each", "p50", "ratio", "lone grouped", "lone one tx"
        );
        for g in &groupings {
            println!(
                "{:<10} {:>5} {:>14.0} {:>10} {:>16.0} {:>10} {:>6.2}x {:>16} {:>16}",
                g.backend,
                g.runs,
                g.grouped.0,
                ms(g.grouped.1),
                g.off.0,
                ms(g.off.1),
                g.grouped.0 / g.off.0,
                format!("{} / {}", ms(g.lone_grouped.0), ms(g.lone_grouped.1)),
                format!("{} / {}", ms(g.lone_off.0), ms(g.lone_off.1)),
            );
            let database = if g.backend == "sqlite" { "SQLite" } else { "PostgreSQL" };
            summary(
                25 + u32::from(g.backend != "sqlite"),
                &format!("{database} appends/s, {} runs appending at once (a lone append p50: grouped / one transaction each)", g.runs),
                &format!("{:.0} chunks/s grouped (lone {} ms)", g.grouped.0, ms(g.lone_grouped.0)),
                &format!("{:.0} chunks/s, one transaction per append (lone {} ms)", g.off.0, ms(g.lone_off.0)),
                Some(g.grouped.0 / g.off.0),
                "≥ 20,000 chunks/s durable",
            );
        }
        println!("(lone: p50 / p99 ms of one append with nothing else appending)");
    });
}
