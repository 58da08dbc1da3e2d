//! The reaper end to end: real `sandhold serve` replicas (PostgreSQL and
//! Redis shared), real agents in Docker and local sandboxes, sweeps through
//! `AdminService.Sweep` and on the server's own schedule. Every per-run
//! outcome is produced by real means: a dead driver, a lease held through
//! the real lease store, a drive longer than its budget, a sandbox
//! directory made immutable, a PostgreSQL trigger refusing one row's
//! updates, a replica paused past its leases.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sandhold_tests::cluster::Cluster;
use sandhold_tests::docker::{self, DockerCleanup};
use sandhold_tests::local::*;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::server::*;
use sandhold_tests::wait::*;
use shared::proto::v1 as api;
use sqlx::PgPool;

const LEASE_TTL_MS: u64 = 2000;
const LEASE_RENEW_MS: u64 = 500;

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
    entry_of(tally, run_id).map(|r| r.outcome.clone())
}

fn entry_of<'a>(tally: &'a api::SweepResponse, run_id: &str) -> Option<&'a api::SweptRun> {
    tally.runs.iter().find(|r| r.run_id == run_id)
}

fn sum(tallies: &[&api::SweepResponse], outcome: &str) -> u64 {
    tallies.iter().map(|t| t.outcomes.get(outcome).copied().unwrap_or(0)).sum()
}

/// One deployment ([`Cluster`]: PostgreSQL, Redis and a data dir shared by
/// its replicas) with two tenants.
struct Deployment {
    cluster: Cluster,
    token: String,
    other_token: String,
}

impl std::ops::Deref for Deployment {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl Deployment {
    async fn create() -> Option<Self> {
        let cluster = Cluster::create("reaper").await?;
        let nonce = &cluster.nonce;
        let (token, other_token) = (format!("tok-{nonce}"), format!("other-{nonce}"));
        Some(Self { cluster, token, other_token })
    }

    fn tenant(&self) -> String {
        format!("t{}", self.nonce)
    }

    /// Replica `name`: short leases, no scheduled sweep, then `more` flags.
    /// The first tenant is an operator: its sweeps are the cluster's (under
    /// `reaper:sweep`, taking turns), which is what these tests exercise; a
    /// tenant's own sweep is one at a time (see `fairness.rs`).
    async fn start(&self, name: &str, more: &[(&str, &str)]) -> ServerProcess {
        let mut extra_args = flags(&[("sweep-interval-ms", "0"), ("operator-tenant", &self.tenant())]);
        extra_args.extend(flags(more));
        let tokens = vec![
            format!("{}={}", self.tenant(), self.token),
            format!("other{}={}", self.nonce, self.other_token),
        ];
        self.replica(name, tokens, (LEASE_TTL_MS, LEASE_RENEW_MS), extra_args).await
    }

    /// A deployment whose replica `a` (the driver the tests kill) has put
    /// the local definition `def`.
    async fn local() -> Option<(Self, ServerProcess)> {
        let dep = Self::create().await?;
        let a = dep.start("a", &[]).await;
        put_definition(&mut a.sandboxes(&dep.token).await, definition("def", Kind::Local)).await;
        Some((dep, a))
    }

    /// The file the `gated` scripts wait for.
    fn gate(&self) -> PathBuf {
        self.dir.path().join("gate")
    }

    /// Whether the lease `name` is free within [`PATIENCE`] (the shared
    /// Redis store, read without taking it).
    async fn lease_freed(&self, name: &str) -> bool {
        eventually(PATIENCE, || async { !lease_held(&self.redis_url, name).await }).await
    }

    async fn pool(&self) -> PgPool {
        PgPool::connect(self.db.url()).await.unwrap()
    }

    async fn tear_down(self) {
        self.cluster.tear_down().await;
    }
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

/// A run script that prints `start`, waits until `gate` exists, then runs
/// `body`. The gate path in its command line tells when it is gone.
fn gated(gate: &Path, body: &str) -> String {
    format!("echo start; while [ ! -e '{}' ]; do sleep 0.1; done; {body}", gate.display())
}

/// Kill `driver`, open the deployment's gate, and wait until every script
/// waiting on it exited, each of `runs` (local sandboxes) recorded its exit
/// in its journal, and the dead driver's leases on them ran out: they are
/// finished in their sandboxes, detached, with nobody driving them.
async fn finish_without_driver(dep: &Deployment, driver: &mut ServerProcess, runs: &[&str]) {
    driver.kill9().await;
    let gate = dep.gate();
    std::fs::write(&gate, "").unwrap();
    let marker = gate.display().to_string();
    let exited = process_gone_within(&marker, PATIENCE).await;
    assert!(exited, "the run scripts never exited");
    let data_dir = dep.data_dir();
    for run in runs {
        // The exit sentinel follows the exit, `<run>.exit` the sentinel.
        let recorded = eventually(PATIENCE, || std::future::ready(local_exit_recorded(&data_dir, run))).await;
        assert!(recorded, "run {run} never recorded its exit");
        // The lease ends a TTL after the kill.
        assert!(
            dep.lease_freed(&run_lease(&dep.tenant(), run)).await,
            "the dead driver's lease on {run} never ran out"
        );
    }
}

/// The whole log of a run, read through `runs` to its end.
async fn whole_log(runs: &mut Runs, run_id: &str) -> Seen {
    let mut log = Seen::default();
    let request = api::AttachRunRequest { run_id: run_id.into(), ..Default::default() };
    let mut stream = runs.attach_run(request).await.unwrap().into_inner();
    assert!(read_until(&mut stream, &mut log, |_| false).await.unwrap(), "the log of {run_id} ends");
    log
}

fn text_lines(log: &Seen) -> Vec<&str> {
    log.chunks
        .iter()
        .filter(|(_, c)| c.r#type() == api::ChunkType::TextMessageContent)
        .map(|(_, c)| c.delta.trim_end())
        .collect()
}

fn terminal_chunks(log: &Seen) -> Vec<&api::Chunk> {
    log.chunks
        .iter()
        .map(|(_, c)| c)
        .filter(|c| matches!(c.r#type(), api::ChunkType::RunFinished | api::ChunkType::RunError))
        .collect()
}

/// What PostgreSQL holds of a run, read behind the servers' backs.
#[derive(Debug, Clone, PartialEq)]
struct Stored {
    status: String,
    driver_epoch: i64,
    cancel_requested: bool,
    log_closed: bool,
    /// (epoch, kind) of every chunk, in log order.
    events: Vec<(i64, String)>,
}

async fn stored(pool: &PgPool, run_id: &str) -> Stored {
    let (status, driver_epoch, cancel_requested, log_closed): (String, i64, bool, bool) = sqlx::query_as(
        "SELECT status, driver_epoch, cancel_requested, log_closed FROM runs WHERE run_id = $1",
    )
    .bind(run_id)
    .fetch_one(pool)
    .await
    .unwrap();
    let events = sqlx::query_as("SELECT epoch, kind FROM run_events WHERE run_id = $1 ORDER BY seq")
        .bind(run_id)
        .fetch_all(pool)
        .await
        .unwrap();
    Stored { status, driver_epoch, cancel_requested, log_closed, events }
}

impl Stored {
    fn terminal_chunks(&self) -> usize {
        self.events.iter().filter(|(_, k)| k == "RUN_FINISHED" || k == "RUN_ERROR").count()
    }
}

/// Log lines of all `replicas` saying sandbox `key` was destroyed.
fn destroys(replicas: &[&ServerProcess], key: &str) -> usize {
    replicas
        .iter()
        .map(|r| r.log_text().lines().filter(|l| l.contains("sandbox destroyed") && l.contains(key)).count())
        .sum()
}

fn container_of(key: &str) -> Vec<String> {
    docker::containers(&format!("dev.sandhold.sandbox-key={key}"))
}

/// Three detached runs whose driver was killed: one finished in its
/// sandbox, one still producing, one whose sandbox is gone. Two replicas
/// sweep at once, then one with a short TTL sweeps again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn detached_runs_are_finalized_left_alone_or_expired_once() {
    let Some(dep) = Deployment::create().await else { return };
    if !sandhold_tests::services::docker() {
        return;
    }
    sandhold_tests::docker::ensure_test_image();
    let (nonce, token, other_token) = (dep.nonce.clone(), dep.token.clone(), dep.other_token.clone());
    let _cleanup = DockerCleanup { tenant: dep.tenant() };
    let long_ttl = [("detached-run-ttl-ms", "3600000")];

    let mut a = dep.start("a", &long_ttl).await;
    let mut sandboxes = a.sandboxes(&token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Docker)).await;
    let mut runs_a = a.runs(&token).await;
    let (fin, prod, unk) = (format!("fin-{nonce}"), format!("prod-{nonce}"), format!("unk-{nonce}"));
    let prod_run = start_and_detach(&mut runs_a, &prod, "th-prod", "echo start; sleep 600").await;
    let unk_run = start_and_detach(&mut runs_a, &unk, "th-unk", "echo start; sleep 600").await;
    let fin_run = start_and_detach(&mut runs_a, &fin, "th-fin", "echo start; sleep 8; echo done").await;
    a.kill9().await; // the driver of all three is gone
    assert_eq!(container_of(&unk_run.sandbox_id).len(), 1);
    let removed = std::process::Command::new("docker")
        .args(["rm", "-f"])
        .args(container_of(&unk_run.sandbox_id))
        .output()
        .unwrap();
    assert!(removed.status.success());

    let b = dep.start("b", &long_ttl).await;
    let c = dep.start("c", &long_ttl).await;
    // The fin run has written its sentinel, and A's leases have run out.
    let fin_container = container_of(&fin_run.sandbox_id);
    assert_eq!(fin_container.len(), 1, "the fin run's container");
    let recorded =
        eventually(PATIENCE, || std::future::ready(docker_exit_recorded(&fin_container[0], &fin))).await;
    assert!(recorded, "the fin run never recorded its exit");
    for run in [&fin, &prod, &unk] {
        assert!(dep.lease_freed(&run_lease(&dep.tenant(), run)).await, "A's lease on {run} never ran out");
    }

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
    let log = whole_log(&mut runs_b, &fin).await;
    assert_eq!(text_lines(&log), ["start", "done"], "every line once");
    assert_eq!(terminal_chunks(&log).len(), 1, "one terminal chunk: nothing was appended twice");

    // Producing: untouched.
    let record = get_run(&mut runs_b, &prod).await;
    assert_eq!(record.status, api::RunStatus::Running as i32);
    assert!(!record.cancel_requested);
    assert_eq!(docker::running(&format!("dev.sandhold.sandbox-key={}", prod_run.sandbox_id)).len(), 1);

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
    let d = dep.start("d", &[("detached-run-ttl-ms", "1000")]).await;
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
    dep.tear_down().await;
}

/// `not_claimed`: runs whose lease a live holder has are left to it. One
/// finished run whose lease is held through the real lease store (Redis),
/// as a replica driving it would: the sweep leaves it exactly as it was,
/// and finalizes it once the lease is free. One still producing past the
/// TTL, driven by a live replica: the sweep writes nothing to it; the
/// cancel it records is carried out by that replica, its driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_held_by_a_live_holder_are_not_claimed() {
    let Some((dep, mut a1)) = Deployment::local().await else { return }; // drives `held`, then dies
    let (nonce, token, gate) = (dep.nonce.clone(), dep.token.clone(), dep.gate());
    let a2 = dep.start("a2", &[]).await; // drives `live` throughout
    let (held, live) = (format!("held-{nonce}"), format!("live-{nonce}"));
    let held_run =
        start_and_detach(&mut a1.runs(&token).await, &held, "th-held", &gated(&gate, "echo done")).await;
    let live_run =
        start_and_detach(&mut a2.runs(&token).await, &live, "th-live", "echo start; sleep 600").await;
    finish_without_driver(&dep, &mut a1, &[&held]).await;

    // Another holder takes `held`'s lease, the way any replica takes it.
    let holder = lease_holder(&dep.redis_url, LEASE_TTL_MS, LEASE_RENEW_MS).await;
    let lease =
        holder.try_acquire(&run_lease(&dep.tenant(), &held)).await.unwrap().expect("a1's lease ran out");

    let pool = dep.pool().await;
    let (held_before, live_before) = (stored(&pool, &held).await, stored(&pool, &live).await);
    let b = dep.start("b", &[("detached-run-ttl-ms", "1000")]).await;
    let mut runs_b = b.runs(&token).await;
    let held_dir = dep.local_sandbox_dir(&mut b.sandboxes(&token).await, &held_run.sandbox_id).await;
    let t = sweep(&mut b.admin(&token).await).await;
    let context = format!("{t:?}\nb log:\n{}\na2 log:\n{}", b.log_text(), a2.log_text());
    assert_eq!(outcome_of(&t, &held).as_deref(), Some("not_claimed"), "{context}");
    assert_eq!(outcome_of(&t, &live).as_deref(), Some("not_claimed"), "{context}");
    assert_eq!(t.runs.len(), 2, "{context}");
    assert!(entry_of(&t, &held).unwrap().detail.contains("another replica holds"), "{context}");
    assert!(entry_of(&t, &live).unwrap().detail.contains("cancel is recorded"), "{context}");

    // `held`: exactly as it was: running, no cancel, no claim, no chunk,
    // its sandbox still there.
    assert_eq!(stored(&pool, &held).await, held_before, "{context}");
    assert_eq!(held_before.status, "running");
    assert!(!held_before.cancel_requested);
    assert!(held_dir.join("workspace").is_dir(), "the held run's sandbox is kept");

    // `live`: the sweep claimed nothing and appended nothing; its driver
    // a2 saw the recorded cancel and ended the run itself.
    let record = wait_terminal(&mut runs_b, &live).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32, "{record:?}\n{context}");
    assert_eq!(record.error.as_ref().unwrap().code, "CANCELLED");
    let live_after = stored(&pool, &live).await;
    assert_eq!(live_after.driver_epoch, live_before.driver_epoch, "nobody else claimed it");
    assert!(
        live_after.events.iter().all(|(epoch, _)| *epoch == live_before.driver_epoch),
        "every chunk is a2's: {:?}",
        live_after.events
    );
    assert_eq!(live_after.terminal_chunks(), 1);
    // The record turns terminal just before a2 logs the end: give the line
    // the moment it takes to be written.
    let deadline = std::time::Instant::now() + sandhold_tests::wait::PATIENCE;
    while !a2.log_text().contains("run finished") && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(a2.log_text().contains("run finished"), "a2 ended the run:\n{context}");
    assert_eq!(destroys(&[&b], &live_run.sandbox_id), 0, "the sweep destroyed nothing of a2's run");

    // Once the holder lets go, the next sweep finalizes `held`.
    assert!(lease.release().await.unwrap());
    let t = sweep(&mut b.admin(&token).await).await;
    assert_eq!(outcome_of(&t, &held).as_deref(), Some("finalized"), "{t:?}\n{}", b.log_text());
    assert_eq!(outcome_of(&t, &live), None, "a terminal run is not swept");
    assert_eq!(get_run(&mut runs_b, &held).await.status, api::RunStatus::Completed as i32);
    assert_eq!(text_lines(&whole_log(&mut runs_b, &held).await), ["start", "done"]);
    assert!(!held_dir.exists(), "the finalized run's sandbox is gone");

    drop((a2, b));
    dep.tear_down().await;
}

/// `budget_exceeded`: the drive of a finished run (50,000 lines its log
/// does not hold yet) takes longer than `--sweep-run-budget-ms`. The sweep
/// stops it as a cancel, and what is left is consistent: the record
/// `aborted` (CANCELLED), the log the replayed prefix in order plus one
/// CANCELLED terminal chunk, closed; the sandbox and its record gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drive_over_the_budget_is_stopped_and_left_terminal() {
    const LINES: u32 = 50_000;
    let Some((dep, mut a)) = Deployment::local().await else { return };
    let (nonce, token, gate) = (dep.nonce.clone(), dep.token.clone(), dep.gate());
    let slow = format!("slow-{nonce}");
    let body = format!("seq 1 {LINES} | sed 's/^/line /'");
    let run = start_and_detach(&mut a.runs(&token).await, &slow, "th", &gated(&gate, &body)).await;
    let mut sandboxes = a.sandboxes(&token).await;
    let dir = dep.local_sandbox_dir(&mut sandboxes, &run.sandbox_id).await;
    finish_without_driver(&dep, &mut a, &[&slow]).await;

    let b = dep.start("b", &[("sweep-run-budget-ms", "300")]).await;
    let t = sweep(&mut b.admin(&token).await).await;
    let context = format!("{t:?}\nb log:\n{}", b.log_text());
    let entry = entry_of(&t, &slow).unwrap_or_else(|| panic!("not swept: {context}"));
    assert_eq!(entry.outcome, "budget_exceeded", "{context}");
    assert!(entry.terminalized_anyway, "{context}");
    assert_eq!(t.outcomes.get("budget_exceeded"), Some(&1));

    let mut runs_b = b.runs(&token).await;
    let record = get_run(&mut runs_b, &slow).await;
    assert_eq!(record.status, api::RunStatus::Aborted as i32, "{record:?}\n{context}");
    assert_eq!(record.error.as_ref().unwrap().code, "CANCELLED");
    assert!(record.cancel_requested);
    let log = whole_log(&mut runs_b, &slow).await;
    let lines = log.line_numbers();
    let replayed = lines.len() as u32;
    assert!(replayed < LINES, "the drive was cut short ({replayed} lines)");
    assert_eq!(lines, (1..=replayed).collect::<Vec<_>>(), "a prefix of the journal, in order, once");
    let terminals = terminal_chunks(&log);
    assert_eq!(terminals.len(), 1);
    assert_eq!(terminals[0].error_code, "CANCELLED");
    assert_eq!(&log.chunks.last().unwrap().1, terminals[0], "nothing after the terminal chunk");
    let pool = dep.pool().await;
    let after = stored(&pool, &slow).await;
    assert!(after.log_closed, "the log is closed");
    assert_eq!(after.terminal_chunks(), 1);
    assert!(!dir.exists(), "the sandbox is destroyed");
    let mut sandboxes = b.sandboxes(&token).await;
    let gone = sandboxes.get_sandbox(api::GetSandboxRequest { sandbox_id: run.sandbox_id.clone() }).await;
    assert_eq!(gone.unwrap_err().code(), tonic::Code::NotFound, "and its record with it");

    let again = sweep(&mut b.admin(&token).await).await;
    assert_eq!(outcome_of(&again, &slow), None, "a terminal run is not swept again");
    drop(b);
    dep.tear_down().await;
}

/// Makes a directory immutable (`chattr +i`: not even root can remove its
/// entries) until dropped.
struct Immutable(PathBuf);

impl Immutable {
    fn set(dir: &Path) -> Result<Self, String> {
        let out =
            std::process::Command::new("chattr").arg("+i").arg(dir).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(Self(dir.to_path_buf()))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// `reclaim_failed`: a finished run is finalized but its sandbox directory
/// cannot be removed (immutable). The record is terminal and the log whole;
/// the sandbox stays, with its instance record, for an operator (a later
/// sweep does not retry it: the run is terminal).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_that_cannot_be_destroyed_is_reclaim_failed() {
    let Some((dep, mut a)) = Deployment::local().await else { return };
    let probe = dep.dir.path().join("immutable-probe");
    std::fs::create_dir_all(&probe).unwrap();
    if let Err(why) = Immutable::set(&probe) {
        assert!(!sandhold_tests::services::required(), "chattr +i is required (root, ext4/xfs): {why}");
        eprintln!("skipping: cannot make a directory immutable: {why}");
        return;
    }
    let (nonce, token, gate) = (dep.nonce.clone(), dep.token.clone(), dep.gate());
    let stuck = format!("stuck-{nonce}");
    let run = start_and_detach(&mut a.runs(&token).await, &stuck, "th", &gated(&gate, "echo done")).await;
    let mut sandboxes = a.sandboxes(&token).await;
    let dir = dep.local_sandbox_dir(&mut sandboxes, &run.sandbox_id).await;
    finish_without_driver(&dep, &mut a, &[&stuck]).await;

    let immutable = Immutable::set(&dir).unwrap();
    let b = dep.start("b", &[]).await;
    let t = sweep(&mut b.admin(&token).await).await;
    let context = format!("{t:?}\nb log:\n{}", b.log_text());
    let entry = entry_of(&t, &stuck).unwrap_or_else(|| panic!("not swept: {context}"));
    assert_eq!(entry.outcome, "reclaim_failed", "{context}");
    assert!(entry.detail.contains("reclaiming the run's sandbox"), "{context}");
    assert!(!entry.terminalized_anyway);

    let mut runs_b = b.runs(&token).await;
    let record = get_run(&mut runs_b, &stuck).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{context}");
    let log = whole_log(&mut runs_b, &stuck).await;
    assert_eq!(text_lines(&log), ["start", "done"]);
    assert_eq!(terminal_chunks(&log).len(), 1);
    assert!(stored(&dep.pool().await, &stuck).await.log_closed);
    assert!(dir.exists(), "the sandbox directory is still there");
    b.sandboxes(&token)
        .await
        .get_sandbox(api::GetSandboxRequest { sandbox_id: run.sandbox_id.clone() })
        .await
        .expect("the instance record is kept: the sandbox still exists");
    assert_eq!(destroys(&[&b], &run.sandbox_id), 0);

    let again = sweep(&mut b.admin(&token).await).await;
    assert_eq!(outcome_of(&again, &stuck), None, "a terminal run is not swept again");
    assert!(dir.exists(), "nor is its sandbox retried");

    // Once the cause is gone, an operator destroys it.
    drop(immutable);
    let request = api::DestroySandboxRequest { sandbox_id: run.sandbox_id.clone() };
    b.sandboxes(&token).await.destroy_sandbox(request).await.expect("destroy by hand");
    assert!(!dir.exists());
    drop(b);
    dep.tear_down().await;
}

/// `failed`: PostgreSQL refuses every update of one run's row (a trigger
/// raising an error), so the sweep cannot claim it. That run is `failed`
/// and left as it was; the run after it in the same sweep is finalized.
/// With the trigger gone, the next sweep finalizes the first one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_error_fails_one_run_and_the_sweep_goes_on() {
    let Some((dep, mut a)) = Deployment::local().await else { return };
    let (nonce, token, gate) = (dep.nonce.clone(), dep.token.clone(), dep.gate());
    let (broken, fine) = (format!("broken-{nonce}"), format!("fine-{nonce}"));
    let mut runs_a = a.runs(&token).await;
    // Detached in this order: the sweep handles `broken` first.
    let broken_run = start_and_detach(&mut runs_a, &broken, "th-broken", &gated(&gate, "echo done")).await;
    let fine_run = start_and_detach(&mut runs_a, &fine, "th-fine", &gated(&gate, "echo done")).await;
    let mut sandboxes = a.sandboxes(&token).await;
    let broken_dir = dep.local_sandbox_dir(&mut sandboxes, &broken_run.sandbox_id).await;
    let fine_dir = dep.local_sandbox_dir(&mut sandboxes, &fine_run.sandbox_id).await;
    finish_without_driver(&dep, &mut a, &[&broken, &fine]).await;

    let pool = dep.pool().await;
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'update refused by the test'; END $$; \
         CREATE TRIGGER refuse_update BEFORE UPDATE ON runs FOR EACH ROW \
         WHEN (OLD.run_id = '{broken}') EXECUTE FUNCTION refuse_update();"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let broken_before = stored(&pool, &broken).await;

    let b = dep.start("b", &[]).await;
    let t = sweep(&mut b.admin(&token).await).await;
    let context = format!("{t:?}\nb log:\n{}", b.log_text());
    let order: Vec<(&str, &str)> = t.runs.iter().map(|r| (r.run_id.as_str(), r.outcome.as_str())).collect();
    assert_eq!(order, [(broken.as_str(), "failed"), (fine.as_str(), "finalized")], "{context}");
    // Store internals stay in the server's log, out of the API.
    assert_eq!(entry_of(&t, &broken).unwrap().detail, "internal store error", "{context}");
    assert!(b.log_text().contains("update refused by the test"), "{context}");

    assert_eq!(stored(&pool, &broken).await, broken_before, "the failed run is left as it was");
    assert!(broken_dir.join("workspace").is_dir(), "its sandbox is kept");
    let mut runs_b = b.runs(&token).await;
    assert_eq!(get_run(&mut runs_b, &fine).await.status, api::RunStatus::Completed as i32);
    assert!(!fine_dir.exists(), "the run after the failure was finalized and reclaimed");

    sqlx::raw_sql("DROP TRIGGER refuse_update ON runs").execute(&pool).await.unwrap();
    let t = sweep(&mut b.admin(&token).await).await;
    assert_eq!(outcome_of(&t, &broken).as_deref(), Some("finalized"), "{t:?}\n{}", b.log_text());
    assert_eq!(get_run(&mut runs_b, &broken).await.status, api::RunStatus::Completed as i32);
    assert_eq!(text_lines(&whole_log(&mut runs_b, &broken).await), ["start", "done"]);
    assert!(!broken_dir.exists());
    drop(b);
    dep.tear_down().await;
}

/// Whether a line of `server`'s log holds every one of `needles`.
fn logged(server: &ServerProcess, needles: &[&str]) -> bool {
    server.log_text().lines().any(|l| needles.iter().all(|n| l.contains(n)))
}

fn signal_pid(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
}

/// A run that ends while the sweep is busy with an earlier one is counted
/// `not_claimed` from its fresh record. The earlier run's agent is paused
/// (SIGSTOP), so the sweep waits on its probe; meanwhile a client attaches
/// to the later run through another replica, which drives it to its end.
/// The sweep, reaching it, neither probes nor drives it (its journal is
/// gone by then: it would be `unknown`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_that_ends_during_the_sweep_is_not_claimed() {
    use nix::sys::signal::Signal;
    let Some((dep, mut a)) = Deployment::local().await else { return };
    let (nonce, token, gate) = (dep.nonce.clone(), dep.token.clone(), dep.gate());
    let (stalled, ended) = (format!("stalled-{nonce}"), format!("ended-{nonce}"));
    let mut runs_a = a.runs(&token).await;
    let stalled_run = start_and_detach(&mut runs_a, &stalled, "th-stalled", &gated(&gate, "echo done")).await;
    start_and_detach(&mut runs_a, &ended, "th-ended", &gated(&gate, "echo done")).await;
    let stalled_dir = dep.local_sandbox_dir(&mut a.sandboxes(&token).await, &stalled_run.sandbox_id).await;
    finish_without_driver(&dep, &mut a, &[&stalled, &ended]).await;
    let (b, c) = (dep.start("b", &[]).await, dep.start("c", &[]).await);

    let agent = agent_daemons(&stalled_dir);
    assert_eq!(agent.len(), 1, "the stalled run's agent daemon: {agent:?}");
    signal_pid(agent[0], Signal::SIGSTOP);
    let socket = stalled_dir.join("agent.sock");
    let connections_before = unix_socket_entries(&socket);
    let mut admin_b = b.admin(&token).await;
    let b_sweep = tokio::spawn(async move { sweep(&mut admin_b).await });
    let sweeping = eventually(Duration::from_secs(20), || {
        let sweeping = logged(&b, &["lease acquired", "reaper:sweep"]);
        async move { sweeping }
    })
    .await;
    assert!(sweeping, "B never started its sweep:\n{}", b.log_text());
    // B listed both runs: it is probing the first, connected to its paused
    // agent.
    let probing =
        eventually(PATIENCE, || std::future::ready(unix_socket_entries(&socket) > connections_before)).await;
    assert!(probing, "B never probed the stalled run:\n{}", b.log_text());

    let mut runs_c = c.runs(&token).await;
    let log = whole_log(&mut runs_c, &ended).await;
    assert_eq!(text_lines(&log), ["start", "done"]);
    assert_eq!(wait_terminal(&mut runs_c, &ended).await.status, api::RunStatus::Completed as i32);
    signal_pid(agent[0], Signal::SIGCONT);
    let t = tokio::time::timeout(PATIENCE, b_sweep).await.expect("B's sweep ends").unwrap();

    let context = format!("{t:?}\nb log:\n{}", b.log_text());
    let order: Vec<(&str, &str)> = t.runs.iter().map(|r| (r.run_id.as_str(), r.outcome.as_str())).collect();
    assert_eq!(order, [(stalled.as_str(), "finalized"), (ended.as_str(), "not_claimed")], "{context}");
    assert_eq!(entry_of(&t, &ended).unwrap().detail, "the run ended meanwhile", "{context}");
    assert!(logged(&c, &["run finished", &ended]), "C ended it:\n{}", c.log_text());
    drop((b, c));
    dep.tear_down().await;
}

/// Record every status change of a run in `status_writes` (a trigger).
async fn audit_status_writes(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE status_writes (run_id TEXT, old_status TEXT, new_status TEXT, epoch BIGINT); \
         CREATE FUNCTION audit_status() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         INSERT INTO status_writes VALUES (NEW.run_id, OLD.status, NEW.status, NEW.driver_epoch); \
         RETURN NEW; END $$; \
         CREATE TRIGGER audit_status AFTER UPDATE ON runs FOR EACH ROW \
         WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION audit_status();",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// (old status, new status, epoch) of every status change of `run_id`.
async fn status_writes(pool: &PgPool, run_id: &str) -> Vec<(String, String, i64)> {
    sqlx::query_as("SELECT old_status, new_status, epoch FROM status_writes WHERE run_id = $1")
        .bind(run_id)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Each of `runs` was finalized exactly once over all `tallies` (any other
/// entry of it says `not_claimed`: left alone), with one status write, one
/// terminal chunk after every line once, and one destroy of its sandbox.
async fn assert_finalized_once(
    pool: &PgPool,
    reader: &mut Runs,
    tallies: &[&api::SweepResponse],
    replicas: &[&ServerProcess],
    runs: &[(String, String)],
    lines: u32,
    context: &str,
) {
    for (run_id, key) in runs {
        let outcomes: Vec<&str> = tallies
            .iter()
            .flat_map(|t| t.runs.iter())
            .filter(|r| &r.run_id == run_id)
            .map(|r| r.outcome.as_str())
            .collect();
        assert_eq!(outcomes.iter().filter(|o| **o == "finalized").count(), 1, "{run_id}: {context}");
        assert!(outcomes.iter().all(|o| *o == "finalized" || *o == "not_claimed"), "{run_id}: {context}");
        let writes = status_writes(pool, run_id).await;
        assert_eq!(writes.len(), 1, "{run_id}: one status write: {writes:?}");
        assert_eq!((writes[0].0.as_str(), writes[0].1.as_str()), ("running", "completed"));
        let log = whole_log(reader, run_id).await;
        assert_eq!(
            log.line_numbers(),
            (1..=lines).collect::<Vec<_>>(),
            "{run_id}: every line once, in order"
        );
        let terminals = terminal_chunks(&log);
        assert_eq!(terminals.len(), 1, "{run_id}: one terminal chunk");
        assert_eq!(terminals[0].r#type(), api::ChunkType::RunFinished);
        assert_eq!(stored(pool, run_id).await.terminal_chunks(), 1, "{run_id}: one terminal chunk stored");
        assert_eq!(destroys(replicas, key), 1, "{run_id}: its sandbox destroyed once: {context}");
    }
}

/// Start `n` durable runs on `driver` that finish behind `gate`, each
/// printing `lines` numbered lines; (run id, sandbox key) of each, in the
/// order they were detached.
fn run_ids(runs: &[(String, String)]) -> Vec<&str> {
    runs.iter().map(|(run, _)| run.as_str()).collect()
}

async fn gated_runs(
    driver: &ServerProcess,
    token: &str,
    prefix: &str,
    n: usize,
    lines: u32,
    gate: &Path,
) -> Vec<(String, String)> {
    let mut runs = driver.runs(token).await;
    let body = format!("seq 1 {lines} | sed 's/^/line /'");
    let mut started = Vec::new();
    for i in 0..n {
        let run_id = format!("{prefix}{i}");
        let run = start_and_detach(&mut runs, &run_id, &format!("th-{run_id}"), &gated(gate, &body)).await;
        started.push((run_id, run.sandbox_id));
    }
    started
}

/// Two replicas sweep at the same moment through `AdminService.Sweep`:
/// the sweep lease makes them take turns, and every run is finalized
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sweeps_at_once_finalize_each_run_once() {
    let Some((dep, mut a)) = Deployment::local().await else { return };
    let (token, gate) = (dep.token.clone(), dep.gate());
    let runs = gated_runs(&a, &token, &format!("once-{}-", dep.nonce), 4, 200, &gate).await;
    let (b, c) = (dep.start("b", &[]).await, dep.start("c", &[]).await);
    let pool = dep.pool().await;
    audit_status_writes(&pool).await;
    finish_without_driver(&dep, &mut a, &run_ids(&runs)).await;

    let (mut admin_b, mut admin_c) = (b.admin(&token).await, c.admin(&token).await);
    let (tb, tc) = tokio::join!(sweep(&mut admin_b), sweep(&mut admin_c));
    let context = format!("b: {tb:?}\nc: {tc:?}\nb log:\n{}\nc log:\n{}", b.log_text(), c.log_text());
    assert_eq!(sum(&[&tb, &tc], "finalized"), 4, "{context}");
    let mut reader = b.runs(&token).await;
    assert_finalized_once(&pool, &mut reader, &[&tb, &tc], &[&a, &b, &c], &runs, 200, &context).await;
    drop((b, c));
    dep.tear_down().await;
}

/// Sweeps that really overlap: replica B is paused (SIGSTOP) in the middle
/// of driving a run for its sweep, past its sweep lease and the run's
/// lease. Replica C's sweep then gets the sweep lease and takes the runs
/// over, run lease by run lease. When B resumes, its drive is fenced off
/// and its sweep counts the run `not_claimed`: each run is finalized once,
/// by C, with one status write, one terminal chunk and one destroy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_paused_past_its_leases_does_nothing_twice() {
    const LINES: u32 = 10_000;
    let Some((dep, mut a)) = Deployment::local().await else { return };
    let (token, gate) = (dep.token.clone(), dep.gate());
    let runs = gated_runs(&a, &token, &format!("paused-{}-", dep.nonce), 2, LINES, &gate).await;
    let (b, c) = (dep.start("b", &[]).await, dep.start("c", &[]).await);
    let pool = dep.pool().await;
    audit_status_writes(&pool).await;
    finish_without_driver(&dep, &mut a, &run_ids(&runs)).await;
    let first = runs[0].0.clone();
    let a_epoch = stored(&pool, &first).await.driver_epoch;

    let mut admin_b = b.admin(&token).await;
    let b_sweep = tokio::spawn(async move { sweep(&mut admin_b).await });
    // B claimed the first run: it is driving it (replaying the journal).
    let driving = eventually(PATIENCE, || {
        let pool = pool.clone();
        let first = first.clone();
        async move {
            let (status, epoch): (String, i64) =
                sqlx::query_as("SELECT status, driver_epoch FROM runs WHERE run_id = $1")
                    .bind(&first)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            status == "running" && epoch > a_epoch
        }
    })
    .await;
    assert!(driving, "B never drove the first run:\n{}", b.log_text());
    b.signal("-STOP");
    let paused = stored(&pool, &first).await;
    assert_eq!(paused.status, "running", "B was paused mid-drive");
    // Past B's sweep lease and its run lease.
    assert!(dep.lease_freed(control_plane::reaper::SWEEP_LEASE).await, "B's sweep lease never ran out");
    assert!(dep.lease_freed(&run_lease(&dep.tenant(), &first)).await, "B's lease on {first} never ran out");
    let tc = sweep(&mut c.admin(&token).await).await;
    b.signal("-CONT");
    let tb = tokio::time::timeout(PATIENCE, b_sweep).await.expect("B's sweep ends").unwrap();

    let context = format!("b: {tb:?}\nc: {tc:?}\nb log:\n{}\nc log:\n{}", b.log_text(), c.log_text());
    assert_eq!(sum(&[&tc], "finalized"), 2, "C finalized both: {context}");
    let b_first = entry_of(&tb, &first).unwrap_or_else(|| panic!("B reports the run it drove: {context}"));
    assert_eq!(b_first.outcome, "not_claimed", "{context}");
    assert!(b_first.detail.contains("took the run over"), "{context}");
    assert!(tb.truncated, "B's sweep stopped when it found its lease lost: {context}");
    assert!(b.log_text().contains("writing nothing"), "B's drive was fenced off: {context}");
    let mut reader = c.runs(&token).await;
    assert_finalized_once(&pool, &mut reader, &[&tb, &tc], &[&a, &b, &c], &runs, LINES, &context).await;
    let finished_at = status_writes(&pool, &first).await[0].2;
    assert!(finished_at > paused.driver_epoch, "the status was written by C, after B's claim");
    drop((b, c));
    dep.tear_down().await;
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
    let dir = sandhold_tests::local::TestDir::new("reaper");
    let data = dir.path().join("data");
    let nonce = sandhold_tests::nonce();
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
    let foreign_run = wait_terminal(&mut other_runs, &foreign).await;
    assert_eq!(foreign_run.status, api::RunStatus::Completed as i32);
    // A driver deletes a finished run's journal just after writing its
    // status: wait for that, so no sweep below races the driver for it.
    for (token, run) in [(&token, &done_run), (&other_token, &foreign_run)] {
        let sandbox = server
            .sandboxes(token)
            .await
            .get_sandbox(api::GetSandboxRequest { sandbox_id: run.sandbox_id.clone() })
            .await
            .unwrap()
            .into_inner()
            .sandbox
            .unwrap();
        let real = data
            .join("sandboxes")
            .join(&sandbox.provider_sandbox_id)
            .join("journal")
            .join(format!("{}.ndjson", run.run_id));
        let dropped = eventually(PATIENCE, || std::future::ready(!real.exists())).await;
        assert!(dropped, "the driver never deleted {}", real.display());
    }

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
    assert!(journal(&foreign).exists(), "another tenant's run is not this sandbox's: a young orphan here");
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
    let dir = sandhold_tests::local::TestDir::new("reaper");
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

/// `--retain-runs`: a sweep of every tenant removes the runs that ended
/// longer ago than the retention, with their logs, of every tenant; a run
/// that ended since, and a live one, stay; a tenant's own sweep removes
/// nothing (the setting is the operator's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_past_the_retention_are_removed_by_the_operators_sweep() {
    const RETAIN: Duration = Duration::from_secs(10);
    let dir = TestDir::new("reap-retain");
    let opts = ServerOptions {
        data_dir: dir.path().join("data"),
        tokens: vec!["ops=tok-ops-retain".into(), "b=tok-b-retain".into()],
        extra_args: flags(&[("sweep-interval-ms", "0"), ("operator-tenant", "ops"), ("retain-runs", "10s")]),
        ..Default::default()
    };
    let server = ServerProcess::start(&opts).await;
    let (mut runs_ops, mut runs_b) = (server.runs("tok-ops-retain").await, server.runs("tok-b-retain").await);
    for token in ["tok-ops-retain", "tok-b-retain"] {
        put_definition(&mut server.sandboxes(token).await, definition("def", Kind::Local)).await;
    }
    run_to_end(&mut runs_b, "old-b", "t", "def", "echo old").await;
    run_to_end(&mut runs_ops, "old-ops", "t", "def", "echo old").await;
    let ended = std::time::Instant::now();
    let (_live, _) = start_and_read(&mut runs_b, "live-b", "t", "echo line 1; sleep 600", 1).await;

    let early = sweep(&mut server.admin("tok-ops-retain").await).await;
    if ended.elapsed() < RETAIN {
        assert_eq!(early.runs_removed, 0, "nothing ended {RETAIN:?} ago yet");
    }
    tokio::time::sleep(RETAIN.saturating_sub(ended.elapsed()) + Duration::from_millis(500)).await;
    run_to_end(&mut runs_b, "new-b", "t", "def", "echo new").await;

    let tenants_own = sweep(&mut server.admin("tok-b-retain").await).await;
    assert_eq!(tenants_own.runs_removed, 0, "a tenant's sweep removes nothing");
    assert!(runs_b.get_run(api::GetRunRequest { run_id: "old-b".into() }).await.is_ok());

    let swept = sweep(&mut server.admin("tok-ops-retain").await).await;
    assert_eq!(swept.runs_removed, 2, "{swept:?}\n{}", server.log_text());
    for (runs, id) in [(&mut runs_b, "old-b"), (&mut runs_ops, "old-ops")] {
        let gone = runs.get_run(api::GetRunRequest { run_id: id.into() }).await.unwrap_err();
        assert_eq!(gone.code(), tonic::Code::NotFound, "{id}");
    }
    assert_eq!(get_run(&mut runs_b, "new-b").await.status, api::RunStatus::Completed as i32);
    assert_eq!(get_run(&mut runs_b, "live-b").await.status, api::RunStatus::Running as i32);
    assert!(server.log_text().contains("ended before the retention"));
    runs_b.cancel_run(api::CancelRunRequest { run_id: "live-b".into() }).await.unwrap();
    wait_terminal(&mut runs_b, "live-b").await;
}

/// Definitions made from flags (sent with no id, so named `def-` and their
/// content's digest; every `sandhold run` with another combination of flags
/// makes one): an operator's sweep removes those that no sandbox,
/// unfinished run or thread's newest run names once they were last put
/// longer ago than `--unused-definition-grace-ms`; the thread's current
/// one and a definition stored under the tenant's own name stay, and the
/// thread's next run still finds its definition. A tenant's own sweep
/// removes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_definitions_made_from_flags_are_removed_by_the_operators_sweep() {
    let dir = TestDir::new("reap-defs");
    let opts = ServerOptions {
        data_dir: dir.path().join("data"),
        tokens: vec!["ops=tok-ops-defs".into(), "b=tok-b-defs".into()],
        extra_args: flags(&[
            ("sweep-interval-ms", "0"),
            ("operator-tenant", "ops"),
            ("unused-definition-grace-ms", "0"),
        ]),
        ..Default::default()
    };
    let server = ServerProcess::start(&opts).await;
    let mut sandboxes = server.sandboxes("tok-b-defs").await;
    let mut runs = server.runs("tok-b-defs").await;
    let mut put = async |variant: &str, id: &str| {
        let mut def = definition(id, Kind::Local);
        def.env.insert("VARIANT".into(), variant.into());
        def.lifecycle = Some(api::Lifecycle { destroy_on_complete: true, ..Default::default() });
        let request = api::PutDefinitionRequest { definition: Some(def) };
        sandboxes.put_definition(request).await.unwrap().into_inner().definition.unwrap().id
    };
    let first = put("first", "").await;
    let second = put("second", "").await;
    let never_run = put("never", "").await;
    let named = put("named", "mine").await;
    assert!(first.starts_with("def-") && second.starts_with("def-") && first != second, "{first} {second}");
    run_to_end(&mut runs, "r1", "t", &first, "echo one").await;
    run_to_end(&mut runs, "r2", "t", &second, "echo two").await;
    let ids = async |sandboxes: &mut Sandboxes| {
        let listed = sandboxes.list_definitions(api::ListDefinitionsRequest {}).await.unwrap().into_inner();
        let mut ids: Vec<String> = listed.definitions.into_iter().map(|d| d.id).collect();
        ids.sort();
        ids
    };
    let mut before = vec![first.clone(), second.clone(), never_run.clone(), named.clone()];
    before.sort();
    assert_eq!(ids(&mut server.sandboxes("tok-b-defs").await).await, before);

    let tenants_own = sweep(&mut server.admin("tok-b-defs").await).await;
    assert_eq!(tenants_own.definitions_removed, 0, "a tenant's sweep removes nothing");
    let swept = sweep(&mut server.admin("tok-ops-defs").await).await;
    assert_eq!(swept.definitions_removed, 2, "{swept:?}\n{}", server.log_text());
    let mut kept = vec![second.clone(), named];
    kept.sort();
    assert_eq!(ids(&mut server.sandboxes("tok-b-defs").await).await, kept);
    assert!(server.log_text().contains("definition removed: made from flags, unused"));

    // The thread's next run takes its definition from its newest run.
    let current = server
        .sandboxes("tok-b-defs")
        .await
        .get_definition(api::GetDefinitionRequest { thread_id: "t".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(current.definition.unwrap().id, second);
    run_to_end(&mut runs, "r3", "t", &second, "echo three").await;
    assert_eq!(wait_terminal(&mut runs, "r3").await.status, api::RunStatus::Completed as i32);
    assert_eq!(sweep(&mut server.admin("tok-ops-defs").await).await.definitions_removed, 0);
}
