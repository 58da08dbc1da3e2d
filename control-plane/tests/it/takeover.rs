//! Takeover across replicas, end to end: three real `sandhold serve`
//! processes on loopback ports sharing PostgreSQL, Redis and a data dir (the
//! local provider's sandboxes), real agents, and faults: SIGKILL and SIGSTOP
//! of the driving replica, SIGKILL of the sandbox agent, a rewritten
//! journal, and a cancel landing on another replica.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandhold_tests::local::*;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::server::*;
use sandhold_tests::wait::*;
use shared::proto::v1 as api;

/// Short leases so a dead driver is replaced within seconds.
const LEASE_TTL_MS: u64 = 2000;
const LEASE_RENEW_MS: u64 = 500;

struct Cluster {
    replicas: Vec<ServerProcess>,
    /// Kills the local sandboxes (they outlive their servers), then goes.
    _dir: sandhold_tests::local::TestDir,
    data_dir: PathBuf,
    /// A database of its own: a replica's start keeps only the tokens of
    /// its configuration, so deployments do not share one.
    db: sandhold_tests::database::ScratchDatabase,
    database_url: String,
    redis_url: String,
    token: String,
    nonce: String,
}

impl Cluster {
    async fn start(n: usize) -> Option<Self> {
        Self::start_with(n, &[]).await
    }

    /// `n` replicas, each also given `extra` `sandhold serve` flags.
    async fn start_with(n: usize, extra: &[&str]) -> Option<Self> {
        Self::start_with_lease(n, extra, LEASE_TTL_MS, LEASE_RENEW_MS).await
    }

    /// As [`Cluster::start_with`], with leases of `ttl_ms`, renewed every `renew_ms`.
    async fn start_with_lease(n: usize, extra: &[&str], ttl_ms: u64, renew_ms: u64) -> Option<Self> {
        let admin_url = sandhold_tests::services::postgres_url()?;
        let redis_url = sandhold_tests::services::redis_url()?;
        let db = sandhold_tests::database::ScratchDatabase::create(&admin_url).await.unwrap();
        let database_url = db.url().to_string();
        let dir = sandhold_tests::local::TestDir::new("takeover");
        let nonce = sandhold_tests::nonce();
        let token = format!("tok-{nonce}");
        let data_dir = dir.path().join("data");
        let mut replicas = Vec::new();
        for i in 0..n {
            let mut options = Self::options(&data_dir, &database_url, &redis_url, &nonce, i);
            (options.lease_ttl_ms, options.lease_renew_ms) = (Some(ttl_ms), Some(renew_ms));
            options.extra_args = extra.iter().map(|a| a.to_string()).collect();
            replicas.push(ServerProcess::start(&options).await);
        }
        let mut sandboxes = replicas[0].sandboxes(&token).await;
        put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
        Some(Self { replicas, _dir: dir, data_dir, db, database_url, redis_url, token, nonce })
    }

    fn options(data_dir: &Path, database_url: &str, redis_url: &str, nonce: &str, i: usize) -> ServerOptions {
        ServerOptions {
            data_dir: data_dir.to_path_buf(),
            database_url: Some(database_url.to_string()),
            redis_url: Some(redis_url.to_string()),
            replica_id: Some(format!("r{i}-{}", &nonce[..4])),
            lease_ttl_ms: Some(LEASE_TTL_MS),
            lease_renew_ms: Some(LEASE_RENEW_MS),
            tokens: vec![format!("t{nonce}=tok-{nonce}")],
            ..Default::default()
        }
    }

    fn logs(&self) -> String {
        self.replicas.iter().map(|r| format!("=== {}\n{}", r.addr, tail(&r.log_text(), 40))).collect()
    }
}

fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Continue reading a run's stream until it ends or breaks; when it breaks
/// (the replica went away), reattach through `next` from the last offset
/// seen and read to the end.
async fn continue_with_failover(
    first: &mut tonic::Streaming<api::RunEvent>,
    next: &mut Runs,
    run_id: &str,
    mut seen: Seen,
) -> Seen {
    match read_until(first, &mut seen, |_| false).await {
        Ok(true) => {
            assert!(seen.terminal().is_some(), "a stream ended cleanly before the run did");
            return seen;
        }
        Ok(false) => unreachable!(),
        Err(_) => {} // the replica went away
    }
    let mut stream =
        attach_after(next, run_id, &seen).await.unwrap_or_else(|status| panic!("attach failed: {status}"));
    match read_until(&mut stream, &mut seen, |_| false).await {
        Ok(true) => seen,
        Ok(false) => unreachable!(),
        Err(status) => panic!("the successor's stream broke: {status}"),
    }
}

fn assert_every_line_once(seen: &Seen, n: u32, what: &str) {
    let lines = seen.line_numbers();
    let expected: Vec<u32> = (1..=n).collect();
    assert_eq!(lines.len(), n as usize, "{what}: every line exactly once");
    assert_eq!(lines, expected, "{what}: in order");
    let mut offsets: Vec<&String> = seen.chunks.iter().map(|(o, _)| o).collect();
    let len = offsets.len();
    offsets.dedup();
    assert_eq!(offsets.len(), len, "{what}: no offset twice");
    let terminal = seen.terminal().unwrap_or_else(|| panic!("{what}: no terminal chunk"));
    assert_eq!(terminal.r#type(), api::ChunkType::RunFinished, "{what}: {terminal:?}");
}

/// 20 durable runs driven by replica 0; it is SIGKILLed mid-stream; each
/// client reattaches through replica 1 or 2 from its last offset. Every run
/// completes and every client sees every line exactly once, in order. Five
/// rounds, killing at a different moment each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_driver_is_replaced_and_nothing_is_lost_or_doubled() {
    const RUNS: usize = 20;
    const LINES: u32 = 300;
    for (round, kill_after) in [0u64, 250, 600, 1000, 1500].into_iter().enumerate() {
        // A run whose client read its end just before the kill has nobody
        // attached to take it over; the reaper finishes its record.
        let Some(mut cluster) = Cluster::start_with(3, &["--sweep-interval-ms", "1000"]).await else {
            return;
        };
        let script = numbered_lines(LINES, 10, "0.1");
        let mut clients = Vec::new();
        let (streaming_tx, mut streaming_rx) = tokio::sync::mpsc::channel::<()>(RUNS);
        for i in 0..RUNS {
            let mut driver = cluster.replicas[0].runs(&cluster.token).await;
            let mut successor = cluster.replicas[1 + i % 2].runs(&cluster.token).await;
            let run_id = format!("kill{round}-{i}-{}", cluster.nonce);
            let thread = format!("thread-{}", i % 4);
            let stream =
                driver.start_run(command_run(&run_id, &thread, "def", &script)).await.unwrap().into_inner();
            let streaming = streaming_tx.clone();
            clients.push(tokio::spawn(async move {
                let mut stream = stream;
                let mut seen = Seen::default();
                let early = read_until(&mut stream, &mut seen, |s| !s.line_numbers().is_empty()).await;
                let _ = streaming.send(()).await;
                let seen = match early {
                    Ok(true) => seen,
                    _ => continue_with_failover(&mut stream, &mut successor, &run_id, seen).await,
                };
                (run_id, seen)
            }));
        }
        // Kill mid-stream: once every run is producing, after a delay that
        // differs per round.
        for _ in 0..RUNS {
            tokio::time::timeout(PATIENCE, streaming_rx.recv()).await.expect("every run streams");
        }
        tokio::time::sleep(Duration::from_millis(kill_after)).await;
        cluster.replicas[0].kill9().await;
        for client in clients {
            let (run_id, seen) = tokio::time::timeout(PATIENCE, client)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a client never finished:\n{}", cluster.logs()))
                .unwrap();
            assert_every_line_once(
                &seen,
                LINES,
                &format!("round {round} (kill after {kill_after} ms) run {run_id}"),
            );
            let mut runs = cluster.replicas[1].runs(&cluster.token).await;
            let record = wait_terminal(&mut runs, &run_id).await;
            assert_eq!(record.status, api::RunStatus::Completed as i32, "{run_id}: {record:?}");
        }
    }
}

/// One server on its embedded SQLite, 20 runs streaming at once (their
/// appends share group commits), SIGKILLed mid-stream and started again on
/// the same data: every chunk a client had received before the kill is in
/// its run's log at the offset the client saw it at, and each run, taken
/// over on attach, ends with every line exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_server_on_sqlite_keeps_every_chunk_its_clients_received() {
    const RUNS: usize = 20;
    const LINES: u32 = 400;
    let mut s = TenantServer::start("kill-group", &[]).await;
    put_definition(&mut s.server.sandboxes(&s.token).await, definition("def", Kind::Local)).await;
    let script = numbered_lines(LINES, 10, "0.05");
    let (streaming_tx, mut streaming_rx) = tokio::sync::mpsc::channel::<()>(RUNS);
    let mut clients = Vec::new();
    for i in 0..RUNS {
        let mut runs = s.server.runs(&s.token).await;
        let run_id = format!("group-{i}-{}", s.nonce);
        let request = command_run(&run_id, &format!("thread-{}", i % 4), "def", &script);
        let mut stream = runs.start_run(request).await.unwrap().into_inner();
        let streaming = streaming_tx.clone();
        clients.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            let _ = read_until(&mut stream, &mut seen, |s| !s.line_numbers().is_empty()).await;
            let _ = streaming.send(()).await;
            // Until the run ends or the server dies under the stream.
            let _ = read_until(&mut stream, &mut seen, |_| false).await;
            (run_id, seen)
        }));
    }
    for _ in 0..RUNS {
        tokio::time::timeout(PATIENCE, streaming_rx.recv()).await.expect("every run streams");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.server.kill9().await;
    let mut received = Vec::new();
    for client in clients {
        received.push(
            tokio::time::timeout(PATIENCE, client).await.expect("the stream ends with the server").unwrap(),
        );
    }

    let options = ServerOptions {
        data_dir: s.server.data_dir().to_path_buf(),
        tokens: vec![format!("{}={}", s.tenant, s.token)],
        ..Default::default()
    };
    s.server = ServerProcess::start(&options).await;
    let mut runs = s.server.runs(&s.token).await;
    let mut cut_short = 0;
    for (run_id, before) in received {
        let mut stream = attach_after(&mut runs, &run_id, &Seen::default()).await.unwrap();
        let mut log = Seen::default();
        assert!(read_until(&mut stream, &mut log, |_| false).await.unwrap(), "{run_id}: the log ends");
        let stored: std::collections::HashMap<&String, &api::Chunk> =
            log.chunks.iter().map(|(offset, chunk)| (offset, chunk)).collect();
        for (offset, chunk) in &before.chunks {
            assert_eq!(
                stored.get(offset).copied(),
                Some(chunk),
                "{run_id}: received at {offset}, not stored there"
            );
        }
        if before.terminal().is_none() {
            cut_short += 1;
        }
        assert_every_line_once(&log, LINES, &run_id);
    }
    assert!(cut_short > 0, "the kill came after every run had ended");
}

/// The driver is paused (SIGSTOP) past its lease; a successor takes over;
/// when the old driver resumes, nothing it writes lands: the log's epochs
/// never go back, and the record is completed by the successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_driver_is_fenced_after_it_resumes() {
    let Some(cluster) = Cluster::start(2).await else { return };
    let run_id = format!("pause-{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    let mut successor = cluster.replicas[1].runs(&cluster.token).await;
    const LINES: u32 = 200;
    let script = numbered_lines(LINES, 10, "0.1");
    let (stream, mut seen) = start_and_read(&mut driver, &run_id, "thread", &script, 20).await;
    drop(stream);

    cluster.replicas[0].signal("-STOP");
    // Attach through the successor while the driver is frozen: once the
    // lease runs out the successor drives.
    let mut attached = attach_after(&mut successor, &run_id, &seen).await.unwrap();
    let took_over = {
        let mut more = Seen::default();
        let r = read_until(&mut attached, &mut more, |m| m.line_numbers().len() >= 40).await;
        seen.chunks.extend(more.chunks);
        r
    };
    assert!(took_over.is_ok(), "the successor never delivered:\n{}", cluster.logs());
    tokio::time::sleep(Duration::from_millis(LEASE_TTL_MS * 2)).await;
    cluster.replicas[0].signal("-CONT");
    assert!(read_until(&mut attached, &mut seen, |_| false).await.unwrap());
    assert_every_line_once(&seen, LINES, "paused driver");

    // Epochs in log order never decrease: nothing of epoch 1 after epoch 2.
    let pool = sqlx::PgPool::connect(&cluster.database_url).await.unwrap();
    let epochs: Vec<i64> = sqlx::query_scalar("SELECT epoch FROM run_events WHERE run_id = $1 ORDER BY seq")
        .bind(&run_id)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(epochs.windows(2).all(|w| w[0] <= w[1]), "an old epoch landed after the claim: {epochs:?}");
    assert!(epochs.last().copied().unwrap_or(0) >= 2, "the successor wrote under a new epoch: {epochs:?}");
    // The resumed driver finds itself superseded.
    let old = &cluster.replicas[0];
    eventually(PATIENCE, || std::future::ready(old.log_text().contains("writing nothing"))).await;
    let record = wait_terminal(&mut successor, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", cluster.logs());
    assert!(
        cluster.replicas[0].log_text().contains("writing nothing"),
        "the old driver did not notice it was superseded:\n{}",
        cluster.logs()
    );
}

/// Lines of the run [`kill_the_driver_mid_run`] starts.
const KILLED_RUN_LINES: u32 = 150;

/// A run of [`KILLED_RUN_LINES`] lines started on replica 0, read for 20 lines, and
/// replica 0 SIGKILLed: the run's id, a client of replica 1, what was
/// seen, and when the kill was.
async fn kill_the_driver_mid_run(cluster: &mut Cluster, name: &str) -> (String, Runs, Seen, Instant) {
    let run_id = format!("{name}-{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    let successor = cluster.replicas[1].runs(&cluster.token).await;
    let (stream, seen) =
        start_and_read(&mut driver, &run_id, "thread", &numbered_lines(KILLED_RUN_LINES, 10, "0.1"), 20)
            .await;
    drop(stream);
    let killed_at = Instant::now();
    cluster.replicas[0].kill9().await;
    (run_id, successor, seen, killed_at)
}

/// With a quiet window configured (`--takeover-quiet-ms`), a successor
/// waits it out after its claim before it reads the stored log and drives
/// on: its first new chunk comes no sooner than the window after the kill
/// (without the window it comes within the lease TTL plus a retry), and
/// still nothing is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_window_holds_the_successor_back_for_the_window() {
    const QUIET_MS: u64 = 5_000;
    let flags = ["--takeover-quiet-ms", "5000", "--takeover-quiet-max-ms", "20000"];
    let Some(mut cluster) = Cluster::start_with(2, &flags).await else { return };
    let (run_id, mut successor, mut seen, killed_at) = kill_the_driver_mid_run(&mut cluster, "quiet").await;
    let pool = sqlx::PgPool::connect(&cluster.database_url).await.unwrap();
    let stored_at_kill: i64 = sqlx::query_scalar("SELECT MAX(seq) FROM run_events WHERE run_id = $1")
        .bind(&run_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut attached = attach_after(&mut successor, &run_id, &seen).await.unwrap();
    let past_kill = |s: &Seen| s.chunks.iter().any(|(o, _)| o.parse::<i64>().unwrap() > stored_at_kill);
    let delivered = read_until(&mut attached, &mut seen, past_kill).await;
    let first_new_after = killed_at.elapsed();
    assert!(delivered.is_ok(), "the successor never delivered:\n{}", cluster.logs());
    assert!(
        first_new_after >= Duration::from_millis(QUIET_MS),
        "the successor drove on {first_new_after:?} after the kill, inside its {QUIET_MS} ms quiet window"
    );
    assert!(read_until(&mut attached, &mut seen, |_| false).await.unwrap());
    assert_every_line_once(&seen, KILLED_RUN_LINES, "quiet window");
    let record = wait_terminal(&mut successor, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", cluster.logs());
}

/// The database goes away for seconds right after a successor claimed a
/// run whose driver was killed (new connections refused, open ones
/// terminated), while the successor reads what its predecessor left: those
/// reads are retried as appends are, so the outage delays the takeover
/// instead of failing the run, its client's stream waits it out, and
/// nothing is lost or doubled. (The quiet window holds the successor's
/// reads until the outage has begun.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_during_a_takeover_delays_the_run_without_failing_it() {
    const OUTAGE: Duration = Duration::from_secs(4);
    let flags = ["--takeover-quiet-ms", "1500", "--takeover-quiet-max-ms", "20000"];
    let Some(mut cluster) = Cluster::start_with(2, &flags).await else { return };
    let (run_id, mut successor, mut seen, _) = kill_the_driver_mid_run(&mut cluster, "outage").await;

    let pool = sqlx::PgPool::connect(&cluster.database_url).await.unwrap();
    let epoch = || {
        sqlx::query_scalar::<_, i64>("SELECT driver_epoch FROM runs WHERE run_id = $1")
            .bind(&run_id)
            .fetch_one(&pool)
    };
    let first_epoch = epoch().await.unwrap();
    let mut attached = attach_after(&mut successor, &run_id, &seen).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while epoch().await.unwrap() == first_epoch {
        assert!(Instant::now() < deadline, "the successor never claimed the run:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pool.close().await;
    cluster.db.outage(OUTAGE).await.unwrap();

    // The client attached to the successor sees the outage as a pause.
    let ended = read_until(&mut attached, &mut seen, |_| false).await;
    assert!(matches!(ended, Ok(true)), "{ended:?}\n{}", cluster.logs());
    let record = wait_terminal(&mut successor, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", cluster.logs());
    assert_every_line_once(&seen, KILLED_RUN_LINES, "database outage");
}

/// The sandbox agent and the driving replica die together; the agent's
/// init restarts it, a successor takes over, and the run completes with
/// nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_and_driver_killed_together() {
    let Some(mut cluster) = Cluster::start(2).await else { return };
    let run_id = format!("agent-{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    let mut successor = cluster.replicas[1].runs(&cluster.token).await;
    const LINES: u32 = 200;
    let script = numbered_lines(LINES, 10, "0.1");
    let (mut stream, seen) = start_and_read(&mut driver, &run_id, "thread", &script, 30).await;

    let agents = agent_daemons(&cluster.data_dir);
    assert!(!agents.is_empty(), "no agent daemon found under {}", cluster.data_dir.display());
    for pid in &agents {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
    }
    cluster.replicas[0].kill9().await;
    let seen = continue_with_failover(&mut stream, &mut successor, &run_id, seen).await;
    assert_every_line_once(&seen, LINES, "agent and driver killed");
    let record = wait_terminal(&mut successor, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    let restarted = agent_daemons(&cluster.data_dir);
    assert!(restarted.iter().all(|p| !agents.contains(p)), "the agent daemon was restarted");
}

/// A cancel sent to replica B stops the run replica A drives at once: the
/// CLI is dead within a second, the record `aborted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_through_another_replica_stops_the_run_at_once() {
    let Some(cluster) = Cluster::start(2).await else { return };
    let run_id = format!("xcancel-{}", cluster.nonce);
    let marker = format!("xc{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    let mut other = cluster.replicas[1].runs(&cluster.token).await;
    let mut stream = driver
        .start_run(command_run(&run_id, "thread", "def", &sleeper(&marker)))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.has_text("started")).await.unwrap();
    assert!(process_with_marker(&marker));

    let at = Instant::now();
    other.cancel_run(api::CancelRunRequest { run_id: run_id.clone() }).await.unwrap();
    let dead = process_gone_within(&marker, Duration::from_secs(5)).await;
    let took = at.elapsed();
    assert!(dead, "the CLI survived the cancel:\n{}", cluster.logs());
    assert!(took <= Duration::from_secs(1), "the remote cancel took {took:?}:\n{}", cluster.logs());
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    assert_eq!(seen.terminal().unwrap().error_code, "CANCELLED");
    let record = wait_terminal(&mut other, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32);
}

/// A cancel recorded without its notification (the pub/sub message lost
/// while the driver's subscription was down) is not polled for: the run goes
/// on until the replica's subscription is back, which then reads the records
/// of the runs it drives and stops this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recorded_cancel_whose_message_was_missed_still_stops_the_run() {
    let Some(cluster) = Cluster::start(1).await else { return };
    let run_id = format!("silentcancel-{}", cluster.nonce);
    let marker = format!("sc{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    let (mut stream, mut seen) = start_sleeper(&mut driver, &run_id, &marker).await;
    record_cancel_silently(&cluster.database_url, &run_id).await;
    // No driver polls the record: three times the old poll's interval later
    // the CLI still runs.
    let gone_unannounced = process_gone_within(&marker, Duration::from_secs(3)).await;
    assert!(!gone_unannounced, "the driver polled the record:\n{}", cluster.logs());
    // The driver's subscription breaks (as a network fault would) and comes back.
    let killed = kill_pubsub_connections_of(&cluster.redis_url, cluster.replicas[0].pid()).await;
    assert!(killed >= 1, "the replica held no pub/sub connection");
    let dead = process_gone_within(&marker, Duration::from_secs(10)).await;
    assert!(dead, "the driver never found the recorded cancel:\n{}", cluster.logs());
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    assert_eq!(seen.terminal().unwrap().error_code, "CANCELLED");
    let record = wait_terminal(&mut driver, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32);
}

/// A cancel recorded while no driver listened (its replica died, nothing
/// was published) is honoured by the next driver when it starts: the
/// takeover an attach sets off stops the run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_recorded_while_no_driver_listened_is_honoured_when_one_starts() {
    let Some(mut cluster) = Cluster::start(2).await else { return };
    let run_id = format!("orphancancel-{}", cluster.nonce);
    let marker = format!("oc{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    drop(start_sleeper(&mut driver, &run_id, &marker).await);
    cluster.replicas[0].kill9().await;
    // The journal's supervisor outlives the replica.
    assert!(process_with_marker(&marker));
    record_cancel_silently(&cluster.database_url, &run_id).await;
    let mut other = cluster.replicas[1].runs(&cluster.token).await;
    let mut attached = attach_after(&mut other, &run_id, &Seen::default()).await.unwrap();
    let mut after = Seen::default();
    assert!(read_until(&mut attached, &mut after, |_| false).await.unwrap());
    assert_eq!(after.terminal().unwrap().error_code, "CANCELLED", "{}", cluster.logs());
    assert!(process_gone_within(&marker, Duration::from_secs(10)).await, "the CLI survived the cancel");
    let record = wait_terminal(&mut other, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32);
}

/// Start a run of [`sleeper`] and read it until its command started.
async fn start_sleeper(
    runs: &mut Runs,
    run_id: &str,
    marker: &str,
) -> (tonic::Streaming<api::RunEvent>, Seen) {
    let request = command_run(run_id, "thread", "def", &sleeper(marker));
    let mut stream = runs.start_run(request).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.has_text("started")).await.unwrap();
    assert!(process_with_marker(marker));
    (stream, seen)
}

/// Record a cancel the way `CancelRun` does, but announce nothing.
async fn record_cancel_silently(database_url: &str, run_id: &str) {
    let pool = sqlx::PgPool::connect(database_url).await.unwrap();
    let updated = sqlx::query("UPDATE runs SET cancel_requested = TRUE WHERE run_id = $1")
        .bind(run_id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(updated.rows_affected(), 1);
}

/// Kill the Redis pub/sub connections process `pid` holds (its cancel
/// subscription); how many were killed.
async fn kill_pubsub_connections_of(redis_url: &str, pid: u32) -> usize {
    let ports = local_tcp_ports(pid);
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let list: String =
        redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("pubsub").query_async(&mut conn).await.unwrap();
    let mut killed = 0;
    for line in list.lines() {
        let field = |k: &str| line.split(' ').find_map(|f| f.strip_prefix(k));
        let (Some(id), Some(addr)) = (field("id="), field("addr=")) else { continue };
        let port = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
        if port.is_some_and(|p| ports.contains(&p)) {
            let n: i64 =
                redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query_async(&mut conn).await.unwrap();
            killed += n as usize;
        }
    }
    killed
}

/// Local ports of the TCP sockets process `pid` has open.
fn local_tcp_ports(pid: u32) -> std::collections::HashSet<u16> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| Some(l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_string()))
        .collect();
    let mut ports = std::collections::HashSet::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else { continue };
        for line in text.lines().skip(1) {
            // sl local_address rem_address st queues tr retrnsmt uid timeout inode
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && inodes.contains(cols[9]) {
                let port = cols[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
                ports.extend(port);
            }
        }
    }
    ports
}

/// A driver that dies between its run's terminal chunk and its terminal
/// status leaves a log that ends while the record says running. A client
/// attached elsewhere reads to the end and leaves while the dead driver's
/// lease still holds; its replica goes on trying without it and, once the
/// lease runs out, replays the log to its end and writes the status,
/// appending nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_whose_driver_died_before_its_status_is_finished_after_its_client_left() {
    // No scheduled sweep: the attach's replica must finish it by itself.
    let Some(cluster) = Cluster::start_with(2, &["--sweep-interval-ms", "0"]).await else { return };
    let run_id = format!("unfinished-{}", cluster.nonce);
    let mut first = cluster.replicas[0].runs(&cluster.token).await;
    let mut other = cluster.replicas[1].runs(&cluster.token).await;
    let mut stream = first
        .start_run(command_run(&run_id, "thread", "def", "echo line 1; echo line 2"))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    assert_eq!(wait_terminal(&mut first, &run_id).await.status, api::RunStatus::Completed as i32);

    // The state a driver killed after its terminal chunk leaves: the status
    // and the close were never written, and its lease has not run out.
    let pool = sqlx::PgPool::connect(&cluster.database_url).await.unwrap();
    sqlx::query(
        "UPDATE runs SET status = 'running', finished_at = NULL, usage = NULL, log_closed = FALSE \
         WHERE run_id = $1",
    )
    .bind(&run_id)
    .execute(&pool)
    .await
    .unwrap();
    let events_before: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM run_events WHERE run_id = $1")
        .bind(&run_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let dead_driver = lease_holder(&cluster.redis_url, LEASE_TTL_MS, LEASE_RENEW_MS).await;
    // The first driver writes the terminal status, then releases its
    // lease: take it as soon as it is free.
    let name = run_lease(&format!("t{}", cluster.nonce), &run_id);
    let deadline = Instant::now() + PATIENCE;
    let lease = loop {
        if let Some(lease) = dead_driver.try_acquire(&name).await.unwrap() {
            break lease;
        }
        assert!(Instant::now() < deadline, "the finished driver's lease was never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let mut attached = attach_after(&mut other, &run_id, &Seen::default()).await.unwrap();
    let mut again = Seen::default();
    assert!(read_until(&mut attached, &mut again, |_| false).await.unwrap());
    assert_eq!(seen.line_numbers(), [1, 2]);
    assert_eq!(again.line_numbers(), [1, 2]);
    drop(attached);
    tokio::time::sleep(Duration::from_millis(LEASE_TTL_MS)).await;
    let _ = lease.release().await;

    let record = wait_terminal(&mut other, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", cluster.logs());
    let events_after: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM run_events WHERE run_id = $1")
        .bind(&run_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(events_after, events_before, "the finishing replay appended to a complete log");
}

/// The driver dies and its client never comes back: nobody attached would
/// take the run over, and nobody marked it detached. The reaper of another
/// replica finds it running with a free lease, marks it detached, and once
/// the command finished drives it to its end: completed, every line once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_left_with_no_driver_and_no_client_is_finished_by_the_reaper() {
    let Some(mut cluster) = Cluster::start_with(2, &["--sweep-interval-ms", "1000"]).await else { return };
    let run_id = format!("driverless-{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    const LINES: u32 = 30;
    let (stream, _) =
        start_and_read(&mut driver, &run_id, "thread", &numbered_lines(LINES, 10, "1"), 5).await;
    drop(stream);
    cluster.replicas[0].kill9().await;

    let mut other = cluster.replicas[1].runs(&cluster.token).await;
    let record = wait_terminal(&mut other, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", cluster.logs());
    assert!(
        cluster.replicas[1].log_text().contains("marked detached"),
        "finished by something other than the reaper:\n{}",
        cluster.logs()
    );
    let mut seen = Seen::default();
    let mut log = attach_after(&mut other, &run_id, &Seen::default()).await.unwrap();
    assert!(read_until(&mut log, &mut seen, |_| false).await.unwrap());
    assert_every_line_once(&seen, LINES, "driverless run");
}

/// A journal rewritten under a stored log: the successor's replay diverges,
/// the run fails with REPLAY_DIVERGED, and nothing past the stored prefix is
/// delivered but the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rewritten_journal_fails_the_run_with_replay_diverged() {
    let Some(mut cluster) = Cluster::start(2).await else { return };
    let run_id = format!("diverge-{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    let mut successor = cluster.replicas[1].runs(&cluster.token).await;
    let script = numbered_lines(100, 5, "0.2");
    let (_stream, seen) = start_and_read(&mut driver, &run_id, "thread", &script, 10).await;
    cluster.replicas[0].kill9().await;
    let stored_before = seen.chunks.len();

    let journal = find_journal(&cluster.data_dir, &run_id).expect("the run's journal");
    let text = std::fs::read_to_string(&journal).unwrap();
    std::fs::write(&journal, text.replacen("line 3\n", "line 9999\n", 1)).unwrap();

    let request = api::AttachRunRequest { run_id: run_id.clone(), ..Default::default() };
    let mut attached = successor.attach_run(request).await.unwrap().into_inner();
    let mut replay = Seen::default();
    assert!(read_until(&mut attached, &mut replay, |_| false).await.unwrap());
    let terminal = replay.terminal().expect("a terminal chunk");
    assert_eq!(terminal.error_code, "REPLAY_DIVERGED", "{terminal:?}\n{}", cluster.logs());
    assert!(!replay.has_text("line 9999"), "the rewritten line was delivered");
    // What the stored log held (at least what the client saw), then only the error.
    let after_prefix: Vec<&api::Chunk> = replay.chunks.iter().skip(stored_before).map(|(_, c)| c).collect();
    assert!(
        after_prefix.iter().all(|c| c.r#type() != api::ChunkType::TextMessageContent
            || replay.chunks[..stored_before].iter().all(|(_, p)| p.delta != c.delta)),
        "chunks past the divergence were delivered"
    );
    let last = &replay.chunks.last().unwrap().1;
    assert_eq!(last.r#type(), api::ChunkType::RunError);
    let record = wait_terminal(&mut successor, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Failed as i32);
    assert_eq!(record.error.unwrap().code, "REPLAY_DIVERGED");
}

fn find_journal(data_dir: &Path, run_id: &str) -> Option<PathBuf> {
    let sandboxes = data_dir.join("sandboxes");
    for entry in std::fs::read_dir(sandboxes).ok()?.flatten() {
        let candidate = entry.path().join("journal").join(format!("{run_id}.ndjson"));
        if candidate.exists() {
            return Some(candidate);
        }
    }
    None
}

/// SIGTERM detaches the runs a replica drives instead of failing them; the
/// client gets UNAVAILABLE, reattaches elsewhere, and the run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_detaches_runs_for_another_replica() {
    let Some(mut cluster) = Cluster::start(2).await else { return };
    let run_id = format!("term-{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    let mut successor = cluster.replicas[1].runs(&cluster.token).await;
    const LINES: u32 = 150;
    let script = numbered_lines(LINES, 10, "0.1");
    let (mut stream, mut seen) = start_and_read(&mut driver, &run_id, "thread", &script, 20).await;
    cluster.replicas[0].signal("-TERM");
    let ended = read_until(&mut stream, &mut seen, |_| false).await;
    let status = ended.expect_err("the stream ends with an error at shutdown, not cleanly");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    let exit = cluster.replicas[0].wait_exit().await;
    assert_eq!(exit.code(), Some(0), "{}", cluster.logs());
    assert!(
        cluster.replicas[0].log_text().contains("run detached for another replica"),
        "{}",
        cluster.logs()
    );

    let mut attached = attach_after(&mut successor, &run_id, &seen).await.unwrap();
    assert!(read_until(&mut attached, &mut seen, |_| false).await.unwrap());
    assert_every_line_once(&seen, LINES, "after a graceful shutdown");
    let record = wait_terminal(&mut successor, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32);
}

/// With a lease TTL of a minute, a driver killed with SIGKILL is replaced as
/// soon as the database sees its presence connection close: the client,
/// attached through the other replica, gets the rest of the run (every line
/// once) long before the dead driver's lease could have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_driver_is_replaced_without_waiting_out_its_lease() {
    const TTL_MS: u64 = 60_000;
    let Some(mut cluster) = Cluster::start_with_lease(2, &[], TTL_MS, 5_000).await else { return };
    let run_id = format!("gone-{}", cluster.nonce);
    let mut driver = cluster.replicas[0].runs(&cluster.token).await;
    let mut successor = cluster.replicas[1].runs(&cluster.token).await;
    const LINES: u32 = 300;
    let script = numbered_lines(LINES, 10, "0.1");
    let (mut stream, mut seen) = start_and_read(&mut driver, &run_id, "thread", &script, 20).await;
    cluster.replicas[0].kill9().await;
    let killed = Instant::now();
    let broke = read_until(&mut stream, &mut seen, |_| false).await;
    assert!(broke.is_err(), "the dead replica's stream breaks");
    let mut attached = attach_after(&mut successor, &run_id, &seen).await.unwrap();
    assert!(read_until(&mut attached, &mut seen, |_| false).await.unwrap());
    let took = killed.elapsed();
    eprintln!("the rest of the run arrived {took:?} after the kill (lease ttl {TTL_MS} ms)");
    assert_every_line_once(&seen, LINES, "after the driver's kill");
    assert!(
        took < Duration::from_millis(TTL_MS / 2),
        "the successor waited for the dead driver's lease ({took:?}):\n{}",
        cluster.logs()
    );
    assert!(
        cluster.replicas[1].log_text().contains("the run's driver replica is gone; its lease is broken"),
        "{}",
        cluster.logs()
    );
    let record = wait_terminal(&mut successor, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32);
}

/// A driver whose lease lapses with nobody else taking it (its replica
/// stalled past the TTL under load, say) stops writing, as it must. Its
/// clients must not be left waiting on a run that nobody drives: the
/// replica they are attached to takes the run over again and it completes,
/// every line once. Both the starting client's stream and an attached
/// one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_driver_whose_lease_lapsed_to_nobody_is_replaced_for_its_clients() {
    // No scheduled sweep: the clients' replica must drive it again by itself.
    let Some(cluster) = Cluster::start_with(1, &["--sweep-interval-ms", "0"]).await else { return };
    let run_id = format!("lapsed-{}", cluster.nonce);
    let mut runs = cluster.replicas[0].runs(&cluster.token).await;
    const LINES: u32 = 300;
    let script = numbered_lines(LINES, 5, "0.1");
    let (mut started, mut seen) = start_and_read(&mut runs, &run_id, "thread", &script, 10).await;
    let mut attached = attach_after(&mut runs, &run_id, &seen).await.unwrap();
    let mut seen_attached = seen.clone();

    let leases = lease_holder(&cluster.redis_url, LEASE_TTL_MS, LEASE_RENEW_MS).await;
    let key = leases.key(&run_lease(&format!("t{}", cluster.nonce), &run_id));
    let client = redis::Client::open(cluster.redis_url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let deleted: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await.unwrap();
    assert_eq!(deleted, 1, "the run's lease {key} was not held");
    let replica = &cluster.replicas[0];
    eventually(PATIENCE, || std::future::ready(replica.log_text().contains("writing nothing"))).await;

    for (stream, seen, what) in [
        (&mut started, &mut seen, "the starting client"),
        (&mut attached, &mut seen_attached, "an attached client"),
    ] {
        let ended = read_until(stream, seen, |_| false).await;
        assert!(matches!(ended, Ok(true)), "{what}: {ended:?}\n{}", cluster.logs());
        assert_every_line_once(seen, LINES, what);
    }
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    let pool = sqlx::PgPool::connect(&cluster.database_url).await.unwrap();
    let epoch: i64 = sqlx::query_scalar("SELECT driver_epoch FROM runs WHERE run_id = $1")
        .bind(&run_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(epoch >= 2, "the run was not taken over (epoch {epoch})");
}

/// The sandbox's ensure lease lapses while a run's sandbox is being set up
/// (its renewals starved on an overloaded host, here: its Redis key
/// deleted): the record is refused, so nothing another holder made could be
/// overwritten, what was made is removed, and the ensure starts again under
/// a new lease. The run completes instead of failing with `LEASE_LOST`, and
/// one sandbox of the key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_lease_lapsing_mid_ensure_starts_the_ensure_again() {
    let Some(cluster) = Cluster::start(1).await else { return };
    let tenant = format!("t{}", cluster.nonce);
    let mut sandboxes = cluster.replicas[0].sandboxes(&cluster.token).await;
    let mut slow = definition("slow", Kind::Local);
    let setup = api::SetupStep { step: Some(api::setup_step::Step::Serial("sleep 2".into())) };
    slow.workspace = Some(api::WorkspaceDefinition { setup: vec![setup], ..Default::default() });
    put_definition(&mut sandboxes, slow.clone()).await;
    let key = control_plane::sandbox::key::sandbox_key(
        &slow,
        control_plane::sandbox::key::KeyInput { tenant: &tenant, thread_id: "thread", run_id: None },
    );
    let lease = format!("sandbox:{key}");
    let run_id = format!("lapse-{}", cluster.nonce);
    let mut runs = cluster.replicas[0].runs(&cluster.token).await;
    let start = command_run(&run_id, "thread", "slow", "echo line 1");
    let mut stream = runs.start_run(start).await.unwrap().into_inner();

    eventually(PATIENCE, || lease_held(&cluster.redis_url, &lease)).await;
    let client = redis::Client::open(cluster.redis_url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let redis_key = format!("{}{lease}", control_plane::lease::DEFAULT_NAMESPACE);
    let deleted: i64 = redis::cmd("DEL").arg(&redis_key).query_async(&mut conn).await.unwrap();
    assert_eq!(deleted, 1, "the sandbox lease {redis_key} was not held");

    let mut seen = Seen::default();
    let ended = read_until(&mut stream, &mut seen, |_| false).await;
    assert!(matches!(ended, Ok(true)), "{ended:?}\n{}", cluster.logs());
    assert_eq!(seen.line_numbers(), vec![1]);
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{}", cluster.logs());
    let log = cluster.replicas[0].log_text();
    assert!(log.contains("the sandbox lease lapsed while ensuring it; starting again"), "{}", cluster.logs());
    let left = std::fs::read_dir(cluster.data_dir.join("sandboxes")).unwrap().count();
    assert_eq!(left, 1, "the sandbox made under the lapsed lease is removed");
}
