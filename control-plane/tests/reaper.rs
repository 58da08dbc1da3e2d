//! The reaper end to end: real `sandhold serve` replicas (PostgreSQL and
//! Redis shared), real agents in Docker and local sandboxes, sweeps through
//! `AdminService.Sweep` and on the server's own schedule.

mod provider_support;
mod run_support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use control_plane::store::testing::ScratchDatabase;
use run_support::*;
use shared::proto::v1 as api;

const LEASE_TTL_MS: u64 = 2000;

fn flags(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs.iter().flat_map(|(k, v)| [format!("--{k}"), v.to_string()]).collect()
}

async fn get_run(runs: &mut Runs, run_id: &str) -> api::Run {
    runs.get_run(api::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap()
}

async fn sweep(admin: &mut Admin) -> api::SweepResponse {
    admin.sweep(api::SweepRequest {}).await.expect("sweep").into_inner()
}

fn outcome_of(tally: &api::SweepResponse, run_id: &str) -> Option<String> {
    tally.runs.iter().find(|r| r.run_id == run_id).map(|r| r.outcome.clone())
}

fn sum(tallies: &[&api::SweepResponse], outcome: &str) -> u64 {
    tallies.iter().map(|t| t.outcomes.get(outcome).copied().unwrap_or(0)).sum()
}

/// Start a durable run on `server`, read until its first line, drop the
/// client, and wait until the record says detached.
async fn start_and_detach(runs: &mut Runs, run_id: &str, thread: &str, script: &str) -> api::Run {
    let mut seen = Seen::default();
    {
        let mut stream =
            runs.start_run(command_run(run_id, thread, "def", script)).await.unwrap().into_inner();
        let ended = read_until(&mut stream, &mut seen, |s| s.has_text("start")).await.unwrap();
        assert!(!ended, "run {run_id} ended before its client left");
    }
    let detached = eventually(Duration::from_secs(20), || {
        let mut runs = runs.clone();
        async move { get_run(&mut runs, run_id).await.detached_since_ms.is_some() }
    })
    .await;
    assert!(detached, "run {run_id} was never marked detached");
    get_run(runs, run_id).await
}

fn container_of(key: &str) -> Vec<String> {
    docker_containers(&format!("dev.sandhold.sandbox-key={key}"))
}

/// Three detached runs whose driver was killed: one finished in its
/// sandbox, one still producing, one whose sandbox is gone. Two replicas
/// sweep at once, then one with a short TTL sweeps again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn detached_runs_are_finalized_left_alone_or_expired_once() {
    let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
    let Some(redis_url) = sandhold_tests::services::redis_url() else { return };
    if !sandhold_tests::services::docker() {
        return;
    }
    provider_support::ensure_test_image();
    let db = ScratchDatabase::create(&admin_url).await.unwrap();
    let dir = tempfile::Builder::new().prefix("reaper").tempdir_in("/tmp").unwrap();
    let nonce = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let tenant = format!("t{nonce}");
    let token = format!("tok-{nonce}");
    let other_token = format!("other-{nonce}");
    let _cleanup = DockerCleanup(tenant.clone());
    let replica = |name: &str, ttl_ms: &str| ServerOptions {
        data_dir: dir.path().join("data"),
        database_url: Some(db.url().to_string()),
        redis_url: Some(redis_url.clone()),
        replica_id: Some(format!("{name}-{nonce}")),
        lease_ttl_ms: Some(LEASE_TTL_MS),
        lease_renew_ms: Some(500),
        tokens: vec![format!("{tenant}={token}"), format!("other{nonce}={other_token}")],
        extra_args: flags(&[("sweep-interval-ms", "0"), ("detached-run-ttl-ms", ttl_ms)]),
    };

    let mut a = ServerProcess::start(&replica("a", "3600000")).await;
    let mut sandboxes = a.sandboxes(&token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Docker)).await;
    let mut runs_a = a.runs(&token).await;
    let (fin, prod, unk) = (format!("fin-{nonce}"), format!("prod-{nonce}"), format!("unk-{nonce}"));
    let prod_run = start_and_detach(&mut runs_a, &prod, "th-prod", "echo start; sleep 600").await;
    let unk_run = start_and_detach(&mut runs_a, &unk, "th-unk", "echo start; sleep 600").await;
    let fin_started = Instant::now();
    let fin_run = start_and_detach(&mut runs_a, &fin, "th-fin", "echo start; sleep 8; echo done").await;
    a.kill9().await; // the driver of all three is gone
    assert_eq!(container_of(&unk_run.sandbox_id).len(), 1);
    let removed = std::process::Command::new("docker")
        .args(["rm", "-f"])
        .args(container_of(&unk_run.sandbox_id))
        .output()
        .unwrap();
    assert!(removed.status.success());

    let b = ServerProcess::start(&replica("b", "3600000")).await;
    let c = ServerProcess::start(&replica("c", "3600000")).await;
    // The fin run has written its sentinel, and A's leases have run out.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(fin_started.elapsed())).await;
    tokio::time::sleep(Duration::from_millis(LEASE_TTL_MS + 500)).await;

    // Another tenant's sweep sees none of these runs and touches nothing.
    let other = sweep(&mut b.admin(&other_token).await).await;
    assert_eq!(other.scope, "tenant");
    assert!(other.runs.is_empty(), "{other:?}");
    let mut runs_b = b.runs(&token).await;
    assert_eq!(get_run(&mut runs_b, &fin).await.status, api::RunStatus::Running as i32);

    // Two replicas sweep at the same time.
    let (mut admin_b, mut admin_c) = (b.admin(&token).await, c.admin(&token).await);
    let (tb, tc) = tokio::join!(sweep(&mut admin_b), sweep(&mut admin_c));
    let both = [&tb, &tc];
    let context = format!("b: {tb:?}\nc: {tc:?}\nb log:\n{}\nc log:\n{}", b.log_text(), c.log_text());
    assert_eq!(sum(&both, "finalized"), 1, "{context}");
    assert_eq!(sum(&both, "expired") + sum(&both, "failed") + sum(&both, "reclaim_failed"), 0, "{context}");
    for t in both {
        assert_ne!(outcome_of(t, &fin).as_deref(), Some("not_claimed"), "{context}");
        assert_eq!(outcome_of(t, &prod).as_deref(), Some("producing"), "{context}");
        assert_eq!(outcome_of(t, &unk).as_deref(), Some("unknown"), "{context}");
    }

    // Finalized: completed, every line once, its sandbox gone.
    let record = get_run(&mut runs_b, &fin).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    assert!(container_of(&fin_run.sandbox_id).is_empty(), "the finished run's sandbox is gone");
    let mut log = Seen::default();
    let mut stream = runs_b
        .attach_run(api::AttachRunRequest { run_id: fin.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(read_until(&mut stream, &mut log, |_| false).await.unwrap());
    let lines: Vec<&str> = log
        .chunks
        .iter()
        .filter(|(_, c)| c.r#type() == api::ChunkType::TextMessageContent)
        .map(|(_, c)| c.delta.trim_end())
        .collect();
    assert_eq!(lines.iter().filter(|l| **l == "start").count(), 1, "{lines:?}");
    assert_eq!(lines.iter().filter(|l| **l == "done").count(), 1, "{lines:?}");
    let terminals = log
        .chunks
        .iter()
        .filter(|(_, c)| matches!(c.r#type(), api::ChunkType::RunFinished | api::ChunkType::RunError))
        .count();
    assert_eq!(terminals, 1, "one terminal chunk: nothing was appended twice");

    // Producing: untouched.
    let record = get_run(&mut runs_b, &prod).await;
    assert_eq!(record.status, api::RunStatus::Running as i32);
    assert!(!record.cancel_requested);
    assert_eq!(docker_running(&format!("dev.sandhold.sandbox-key={}", prod_run.sandbox_id)).len(), 1);

    // Unknown: untouched, its instance record kept.
    let record = get_run(&mut runs_b, &unk).await;
    assert_eq!(record.status, api::RunStatus::Running as i32);
    assert!(!record.cancel_requested);
    let mut sandboxes_b = b.sandboxes(&token).await;
    sandboxes_b
        .get_sandbox(api::GetSandboxRequest { sandbox_id: unk_run.sandbox_id.clone() })
        .await
        .expect("the unreachable sandbox's record is kept");

    // A replica with a short TTL: the producing run is now past it.
    let d = ServerProcess::start(&replica("d", "1000")).await;
    let td = sweep(&mut d.admin(&token).await).await;
    let context = format!("{td:?}\nd log:\n{}", d.log_text());
    assert_eq!(outcome_of(&td, &prod).as_deref(), Some("expired"), "{context}");
    assert_eq!(outcome_of(&td, &unk).as_deref(), Some("unknown"), "{context}");
    assert_eq!(outcome_of(&td, &fin), None, "a terminal run is not swept again");
    let record = get_run(&mut runs_b, &prod).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32, "{record:?}");
    assert!(record.cancel_requested);
    assert!(container_of(&prod_run.sandbox_id).is_empty(), "the expired run's sandbox is gone");
    assert_eq!(get_run(&mut runs_b, &unk).await.status, api::RunStatus::Running as i32);

    drop((b, c, d));
    let _ = db.drop_database().await;
}

fn write_labels(dir: &Path, tenant: &str, key: &str, age: Duration) {
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    let labels = serde_json::json!({
        "dev.sandhold.managed": "true",
        "dev.sandhold.tenant": tenant,
        "dev.sandhold.sandbox-key": key,
        "dev.sandhold.definition": "def",
    });
    let path = dir.join("labels.json");
    std::fs::write(&path, labels.to_string()).unwrap();
    set_age(&path, age);
}

fn set_age(path: &Path, age: Duration) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

fn hex16(c: char) -> String {
    std::iter::repeat_n(c, 16).collect()
}

const HOURS_2: Duration = Duration::from_secs(2 * 3600);

/// Journals of terminal runs and old orphans go; anything not proven dead
/// stays. Orphaned sandboxes of known tenants past the grace go. A
/// tenant's sweep touches only what is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn journals_and_orphaned_sandboxes_are_pruned_within_scope() {
    let dir = tempfile::Builder::new().prefix("reaper").tempdir_in("/tmp").unwrap();
    let data = dir.path().join("data");
    let nonce = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let (tenant, token) = (format!("t{nonce}"), format!("tok-{nonce}"));
    let (other, other_token) = (format!("o{nonce}"), format!("other-{nonce}"));
    let server = ServerProcess::start(&ServerOptions {
        data_dir: data.clone(),
        tokens: vec![format!("{tenant}={token}"), format!("{other}={other_token}")],
        extra_args: flags(&[
            ("sweep-interval-ms", "0"),
            ("orphan-journal-age-ms", "3600000"),
            ("orphan-sandbox-grace-ms", "3600000"),
        ]),
        ..Default::default()
    })
    .await;
    let mut runs = server.runs(&token).await;
    let mut sandboxes = server.sandboxes(&token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let mut other_runs = server.runs(&other_token).await;
    put_definition(&mut server.sandboxes(&other_token).await, definition("def", Kind::Local)).await;

    // A finished run, a running one (same thread, same sandbox), and a
    // finished run of the other tenant.
    let done = format!("done-{nonce}");
    let mut stream = runs.start_run(command_run(&done, "th", "def", "echo hi")).await.unwrap().into_inner();
    read_until(&mut stream, &mut Seen::default(), |_| false).await.unwrap();
    let done_run = wait_terminal(&mut runs, &done).await;
    assert_eq!(done_run.status, api::RunStatus::Completed as i32);
    let live = format!("live-{nonce}");
    let mut live_stream =
        runs.start_run(command_run(&live, "th", "def", "echo start; sleep 120")).await.unwrap().into_inner();
    read_until(&mut live_stream, &mut Seen::default(), |s| s.has_text("start")).await.unwrap();
    let foreign = format!("foreign-{nonce}");
    let mut stream =
        other_runs.start_run(command_run(&foreign, "th", "def", "echo hi")).await.unwrap().into_inner();
    read_until(&mut stream, &mut Seen::default(), |_| false).await.unwrap();
    assert_eq!(wait_terminal(&mut other_runs, &foreign).await.status, api::RunStatus::Completed as i32);

    let sandbox = sandboxes
        .get_sandbox(api::GetSandboxRequest { sandbox_id: done_run.sandbox_id.clone() })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    let journal_dir: PathBuf = data.join("sandboxes").join(&sandbox.provider_sandbox_id).join("journal");
    let journal = |name: &str| journal_dir.join(format!("{name}.ndjson"));
    let (old_orphan, young_orphan) = (format!("gone-old-{nonce}"), format!("gone-young-{nonce}"));
    for name in [&done, &foreign, &old_orphan, &young_orphan] {
        std::fs::write(journal(name), "{\"line\":1}\n").unwrap();
    }
    set_age(&journal(&old_orphan), HOURS_2);
    assert!(journal(&live).exists(), "the running run's journal");

    // Hand-made sandboxes no instance record points at.
    let sandboxes_dir = data.join("sandboxes");
    let orphan = |c: char| sandboxes_dir.join(hex16(c));
    write_labels(&orphan('a'), &tenant, "orphan-old", HOURS_2);
    write_labels(&orphan('b'), &tenant, "orphan-young", Duration::ZERO);
    write_labels(&orphan('c'), "stranger", "orphan-stranger", HOURS_2);
    write_labels(&orphan('d'), &other, "orphan-other", HOURS_2);

    // The other tenant's sweep: its own orphan only; nothing of ours.
    let t = sweep(&mut server.admin(&other_token).await).await;
    assert_eq!((t.scope.as_str(), t.journals_pruned, t.sandboxes_reclaimed), ("tenant", 0, 1), "{t:?}");
    assert!(!orphan('d').exists());
    assert!(orphan('a').exists());
    for name in [&done, &foreign, &old_orphan, &young_orphan, &live] {
        assert!(journal(name).exists(), "{name} kept by another tenant's sweep");
    }

    // Ours.
    let t = sweep(&mut server.admin(&token).await).await;
    let context = format!("{t:?}\n{}", server.log_text());
    assert_eq!(t.journals_pruned, 2, "{context}");
    assert_eq!(t.journals_kept, 3, "{context}");
    assert_eq!(t.sandboxes_reclaimed, 1, "{context}");
    assert!(!journal(&done).exists(), "a terminal run's journal goes");
    assert!(!journal(&old_orphan).exists(), "an orphan past its age goes");
    assert!(journal(&young_orphan).exists(), "a young orphan stays");
    assert!(journal(&live).exists(), "a running run's journal stays");
    assert!(journal(&foreign).exists(), "another tenant's run is not proof for this sandbox");
    assert!(!orphan('a').exists(), "an old orphan of ours goes");
    assert!(orphan('b').exists(), "an orphan within its grace stays");
    assert!(orphan('c').exists(), "a sandbox of a tenant this deployment does not know stays");
    assert!(journal_dir.exists(), "a recorded sandbox stays");
    assert_eq!(get_run(&mut runs, &live).await.status, api::RunStatus::Running as i32);

    // Without a token nothing is swept.
    let mut anonymous = api::admin_service_client::AdminServiceClient::new(server.channel().await);
    let err = anonymous.sweep(api::SweepRequest {}).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);

    runs.cancel_run(api::CancelRunRequest { run_id: live.clone() }).await.unwrap();
    drop(live_stream);
}

/// The server sweeps by itself: an old orphan of a known tenant goes
/// without anyone asking, and the sweep is counted in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_sweeps_on_its_own_schedule() {
    let dir = tempfile::Builder::new().prefix("reaper").tempdir_in("/tmp").unwrap();
    let data = dir.path().join("data");
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = ServerProcess::start(&ServerOptions {
        data_dir: data.clone(),
        extra_args: flags(&[
            ("sweep-interval-ms", "300"),
            ("orphan-sandbox-grace-ms", "60000"),
            ("metrics-listen", &format!("127.0.0.1:{metrics_port}")),
        ]),
        ..Default::default()
    })
    .await;
    // Single-user mode: the one tenant is `default`.
    let orphan = data.join("sandboxes").join(hex16('e'));
    write_labels(&orphan, "default", "orphan-scheduled", HOURS_2);
    let gone = eventually(Duration::from_secs(20), || {
        let orphan = orphan.clone();
        async move { !orphan.exists() }
    })
    .await;
    assert!(gone, "the scheduled sweep never reclaimed the orphan:\n{}", server.log_text());
    let logged = eventually(Duration::from_secs(10), || {
        let text = server.log_text();
        async move { text.contains("sweep done") && text.contains("orphaned sandbox destroyed") }
    })
    .await;
    assert!(logged, "one log line per sweep, with its tally:\n{}", server.log_text());
    let scrape = scrape(metrics_port);
    let reclaimed = scrape
        .get("sandhold_sweep_outcomes_total{outcome=\"sandbox_reclaimed\"}")
        .copied()
        .unwrap_or_default();
    assert_eq!(reclaimed, 1.0, "{scrape:?}");
}

/// `/metrics` as series -> value.
fn scrape(port: u16) -> HashMap<String, f64> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}
