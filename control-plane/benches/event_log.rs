//! Event-log benchmark: append throughput (batches of 1, 16 and 256 chunks)
//! and read-after-append latency, SQLite vs PostgreSQL, against a plain
//! INSERT loop into an unfenced table of the same shape. Prints a table.
//!
//! `cargo bench -p control-plane --bench event_log`. PostgreSQL rows need
//! SANDHOLD_TEST_DATABASE_URL (see scripts/services); each run uses a
//! scratch database. SANDHOLD_BENCH_SECONDS sets the time per throughput
//! cell (default 2).

use std::str::FromStr;
use std::time::{Duration, Instant};

use control_plane::store::{
    EventLog, FIRST_EPOCH, LogWriter, NewChunk, NewRun, Offset, RunId, RunKey, Stores, Timestamp,
    default_database_url,
};
use futures::StreamExt;
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
                        .push_bind(chunk.kind.as_str())
                        .push_bind(chunk.payload.as_slice())
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
        let mut rows = Vec::new();
        let dir = tempfile::tempdir().unwrap();
        rows.push(bench_backend("sqlite", &default_database_url(dir.path()), budget).await);
        if let Some(admin_url) = sandhold_tests::services::postgres_url() {
            let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
            rows.push(bench_backend("postgres", scratch.url(), budget).await);
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
    });
}
