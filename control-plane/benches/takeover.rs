//! Takeover time: from `kill -9` of the replica driving a run to the first
//! chunk the successor produced reaching a client already attached through
//! that successor. Two real `sandhold serve` processes on PostgreSQL and
//! Redis, local sandboxes; p50 and p95 over `SANDHOLD_BENCH_ROUNDS`
//! (default 20) trials, beside the lease TTL (the default, 15 s). A dead
//! driver's lease no longer has to run out: the successor sees in
//! PostgreSQL that the driver's replica is gone and breaks its lease, so
//! the TTL is the bound only when the database cannot tell (a host that
//! vanished without closing its connections).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sandhold_tests::bench::{Row, ms, summary};
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::server::*;
use shared::proto::v1 as api;

const LEASE_TTL_MS: u64 = control_plane::config::DEFAULT_LEASE_TTL_MS;
const LEASE_RENEW_MS: u64 = control_plane::config::DEFAULT_LEASE_RENEW_MS;

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::main]
async fn main() {
    let (Ok(database_url), Ok(redis_url)) =
        (std::env::var("SANDHOLD_TEST_DATABASE_URL"), std::env::var("SANDHOLD_TEST_REDIS_URL"))
    else {
        eprintln!(
            "takeover bench skipped: needs SANDHOLD_TEST_DATABASE_URL and SANDHOLD_TEST_REDIS_URL (scripts/bench sets them)"
        );
        return;
    };
    let rounds: usize =
        std::env::var("SANDHOLD_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(20);
    let dir = sandhold_tests::local::TestDir::new("shto");
    let nonce = sandhold_tests::nonce();
    let token = format!("tok-{nonce}");
    let options = |replica: &str| ServerOptions {
        data_dir: dir.path().join("data"),
        database_url: Some(database_url.clone()),
        redis_url: Some(redis_url.clone()),
        replica_id: Some(format!("{replica}-{nonce}")),
        lease_ttl_ms: Some(LEASE_TTL_MS),
        lease_renew_ms: Some(LEASE_RENEW_MS),
        tokens: vec![format!("t{nonce}={token}")],
        ..Default::default()
    };
    let successor = ServerProcess::start(&options("successor")).await;
    let mut sandboxes = successor.sandboxes(&token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let mut via_successor = successor.runs(&token).await;
    // Every line carries its write time, so the first line written after
    // the kill is known to come from the new driver.
    let script = "while true; do echo \"t $(date +%s%N)\"; sleep 0.05; done";

    let mut samples = Vec::new();
    for round in 0..rounds {
        let mut driver = ServerProcess::start(&options(&format!("driver{round}"))).await;
        let mut runs = driver.runs(&token).await;
        let run_id = format!("to{round}-{nonce}");
        let mut start =
            runs.start_run(command_run(&run_id, "thread", "def", script)).await.unwrap().into_inner();
        let mut seen = Seen::default();
        read_until(&mut start, &mut seen, |s| s.chunks.len() >= 5).await.unwrap();
        let request = api::AttachRunRequest { run_id: run_id.clone(), ..Default::default() };
        let mut attached = via_successor.attach_run(request).await.unwrap().into_inner();
        let mut through_successor = Seen::default();
        read_until(&mut attached, &mut through_successor, |s| s.chunks.len() >= 5).await.unwrap();

        let killed_ns = now_ns();
        let killed = Instant::now();
        driver.kill9().await;
        read_until(&mut attached, &mut through_successor, |s| {
            s.chunks
                .last()
                .and_then(|(_, c)| c.delta.trim().strip_prefix("t ")?.parse::<u128>().ok())
                .is_some_and(|written| written > killed_ns)
        })
        .await
        .unwrap();
        samples.push(killed.elapsed());
        via_successor.cancel_run(api::CancelRunRequest { run_id: run_id.clone() }).await.unwrap();
        wait_terminal(&mut via_successor, &run_id).await;
    }
    let row = Row { name: "kill -9 → first new chunk", samples };
    println!(
        "takeover over {rounds} trials (2 replicas, PostgreSQL + Redis, lease ttl {LEASE_TTL_MS} ms, renew {LEASE_RENEW_MS} ms, attach retries every 500 ms ± half)"
    );
    println!("{:<30} {:>10} {:>10} {:>12}", "", "p50 ms", "p95 ms", "lease ttl ms");
    println!(
        "{:<30} {:>10.0} {:>10.0} {:>12}",
        row.name,
        ms(row.quantile(0.5)),
        ms(row.quantile(0.95)),
        LEASE_TTL_MS
    );
    let p50 = ms(row.quantile(0.5));
    summary(
        90,
        "takeover after `kill -9` of the driver",
        &format!("{p50:.0} ms p50, {:.0} ms p95", ms(row.quantile(0.95))),
        &format!("the lease TTL {LEASE_TTL_MS} ms"),
        Some(p50 / LEASE_TTL_MS as f64),
        "≤ 1 s with the default TTL",
    );
}
