//! Fairness between tenants, attacked end to end: real `sandhold serve`
//! replicas with API tokens, PostgreSQL and Redis shared, local sandboxes.
//!
//! - A tenant's sweep neither takes nor waits for the cluster's sweep
//!   lease: while tenant A's sweep is stuck (its sandboxes' agents paused,
//!   SIGSTOP) and A keeps calling Sweep, the scheduled sweep of another
//!   replica still runs and finalizes tenant B's finished run; A's sweep
//!   never lists B's run, and a second sweep of A is refused at once.
//! - Per-tenant quotas: a tenant at its limit of running runs (or
//!   sandboxes) gets RESOURCE_EXHAUSTED naming the limit, another tenant
//!   is unaffected, two starts racing for the last slot admit one, and
//!   once a run ends (a sandbox is destroyed) the tenant can start again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use sandhold_tests::cluster::Cluster;
use sandhold_tests::local::*;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::sandbox::ensure;
use sandhold_tests::server::*;
use sandhold_tests::wait::*;
use shared::error::{Error, ErrorCode};
use shared::proto::v1 as api;

const LEASE_TTL_MS: u64 = 2000;
const LEASE_RENEW_MS: u64 = 500;

fn flags(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs.iter().flat_map(|(k, v)| [format!("--{k}"), v.to_string()]).collect()
}

/// A [`Cluster`] with three tenants: `a`, `b` and the operator `op`.
struct Deployment(Cluster);

impl std::ops::Deref for Deployment {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.0
    }
}

impl Deployment {
    async fn create() -> Option<Self> {
        Cluster::create("fairness").await.map(Self)
    }

    fn tenant(&self, who: &str) -> String {
        format!("{who}{}", self.nonce)
    }

    fn token(&self, who: &str) -> String {
        format!("tok-{who}-{}", self.nonce)
    }

    /// Replica `name`: short leases, no scheduled sweep unless `more` says.
    async fn start(&self, name: &str, more: &[(&str, &str)]) -> ServerProcess {
        let mut extra_args = flags(&[("operator-tenant", &self.tenant("op"))]);
        if !more.iter().any(|(k, _)| *k == "sweep-interval-ms") {
            extra_args.extend(flags(&[("sweep-interval-ms", "0")]));
        }
        extra_args.extend(flags(more));
        let tokens =
            ["a", "b", "op"].iter().map(|w| format!("{}={}", self.tenant(w), self.token(w))).collect();
        self.replica(name, tokens, (LEASE_TTL_MS, LEASE_RENEW_MS), extra_args).await
    }

    fn gate(&self) -> PathBuf {
        self.dir.path().join("gate")
    }

    async fn tear_down(self) {
        self.0.tear_down().await;
    }
}

fn ensure_request(thread: &str) -> api::EnsureSandboxRequest {
    api::EnsureSandboxRequest { definition_id: "def".into(), thread_id: thread.into(), ..Default::default() }
}

async fn get_run(runs: &mut Runs, run_id: &str) -> api::Run {
    runs.get_run(api::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap()
}

fn signal(pids: &[i32], signal: Signal) {
    for pid in pids {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), signal).unwrap();
    }
}

/// Asserts `status` is RESOURCE_EXHAUSTED (code and reason) and its
/// message contains each of `needles`.
fn assert_exhausted(status: &tonic::Status, needles: &[&str]) {
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(Error::from_status(status).code, ErrorCode::ResourceExhausted, "{status:?}");
    for needle in needles {
        assert!(status.message().contains(needle), "{needle:?} not in {:?}", status.message());
    }
}

/// Of two requests that raced for a tenant's last slot, one was admitted
/// and the other refused over `setting`.
fn assert_one_admitted(results: [Result<(), tonic::Status>; 2], setting: &str) {
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 1, "exactly one request takes the last slot: {results:?}");
    for status in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_exhausted(status, &[setting]);
    }
}

/// A durable run of `script` on thread `thread`, read until it printed
/// `start`; the stream is dropped (the run detaches and keeps running).
async fn start_running(runs: &mut Runs, run_id: &str, thread: &str, script: &str) {
    let mut stream = runs.start_run(command_run(run_id, thread, "def", script)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    let ended = read_until(&mut stream, &mut seen, |s| s.has_text("start")).await.unwrap();
    assert!(!ended, "run {run_id} ended before it printed start");
}

/// Tenant A's sweep is stuck on its own paused sandboxes and A calls Sweep
/// again and again; the scheduled sweep of another replica still finalizes
/// tenant B's finished run meanwhile, and A's sweep never lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_sweep_cannot_starve_the_cluster_sweep_or_touch_another_tenant() {
    let Some(dep) = Deployment::create().await else { return };
    let (tenant_a, token_a, token_b) = (dep.tenant("a"), dep.token("a"), dep.token("b"));
    let run_b = format!("b-{}", dep.nonce);

    let mut driver = dep.start("driver", &[]).await;
    let mut sandboxes_a = driver.sandboxes(&token_a).await;
    put_definition(&mut sandboxes_a, definition("def", Kind::Local)).await;
    put_definition(&mut driver.sandboxes(&token_b).await, definition("def", Kind::Local)).await;
    // A's sandboxes, each of which will stall a sweep of A for the probe
    // timeout once its agent is paused.
    let mut paused = Vec::new();
    for thread in ["a1", "a2", "a3"] {
        let (_, ready) = ensure(&mut sandboxes_a, ensure_request(thread)).await;
        let key = ready.expect("A's sandbox").sandbox_id;
        paused.extend(agent_daemons(&dep.local_sandbox_dir(&mut sandboxes_a, &key).await));
    }
    assert_eq!(paused.len(), 3, "one agent daemon per sandbox: {paused:?}");
    // B's durable run: it finishes once its driver is dead.
    let mut runs_b = driver.runs(&token_b).await;
    let script =
        format!("echo start; while [ ! -e '{}' ]; do sleep 0.1; done; echo done", dep.gate().display());
    start_running(&mut runs_b, &run_b, "b1", &script).await;
    driver.kill9().await;
    std::fs::write(dep.gate(), "").unwrap();
    let recorded =
        eventually(PATIENCE, || std::future::ready(local_exit_recorded(&dep.data_dir(), &run_b))).await;
    assert!(recorded, "B's run never recorded its exit");
    let freed = eventually(PATIENCE, || async {
        !lease_held(&dep.redis_url, &run_lease(&dep.tenant("b"), &run_b)).await
    })
    .await;
    assert!(freed, "the dead driver's lease on B's run never ran out");

    // A's sweep, stuck on its paused agents.
    signal(&paused, Signal::SIGSTOP);
    let replica = dep.start("b", &[]).await;
    let mut admin_a = replica.admin(&token_a).await;
    let stuck = tokio::spawn({
        let mut admin = admin_a.clone();
        async move { admin.sweep(api::SweepRequest {}).await }
    });
    let tenant_lease =
        control_plane::reaper::tenant_sweep_lease(&control_plane::store::Tenant::new(&tenant_a));
    let cluster_lease = control_plane::reaper::SWEEP_LEASE;
    let sweeping = eventually(PATIENCE, || async {
        lease_held(&dep.redis_url, &tenant_lease).await || lease_held(&dep.redis_url, cluster_lease).await
    })
    .await;
    assert!(sweeping, "A's sweep never started");
    assert!(
        !lease_held(&dep.redis_url, cluster_lease).await,
        "a tenant's sweep holds the cluster's sweep lease"
    );
    assert!(lease_held(&dep.redis_url, &tenant_lease).await, "a tenant's sweep holds its tenant's lease");
    // A sweeping again, here and on another replica, is refused at once.
    let asked = Instant::now();
    let again = admin_a.sweep(api::SweepRequest {}).await.expect_err("a second sweep of A while one runs");
    assert_exhausted(&again, &[&tenant_a, "one at a time"]);
    assert!(asked.elapsed() < Duration::from_secs(5), "refused promptly, not after a wait");

    // The cluster's scheduled sweep, on another replica, while A's sweep is
    // stuck and A keeps asking: B's finished run is finalized.
    let scheduler = dep.start("scheduler", &[("sweep-interval-ms", "300")]).await;
    let looping = tokio::spawn({
        let mut admin = scheduler.admin(&token_a).await;
        async move {
            let mut refused = 0u32;
            loop {
                match admin.sweep(api::SweepRequest {}).await {
                    Err(s) if s.code() == tonic::Code::ResourceExhausted => refused += 1,
                    other => return (refused, other.map(|_| ())),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let mut runs_b = replica.runs(&token_b).await;
    let finalized = eventually(PATIENCE, || {
        let mut runs = runs_b.clone();
        let run = run_b.clone();
        async move { get_run(&mut runs, &run).await.status == api::RunStatus::Completed as i32 }
    })
    .await;
    let context = format!("b log:\n{}\nscheduler log:\n{}", replica.log_text(), scheduler.log_text());
    assert!(finalized, "the scheduled sweep never finalized B's run\n{context}");
    assert!(!stuck.is_finished(), "B's run must be finalized while A's sweep is still running\n{context}");
    assert!(!looping.is_finished(), "A's looping sweeps are all refused while its sweep runs\n{context}");

    // A's sweep ends (its probes time out) having covered A only.
    let tally = stuck.await.unwrap().expect("A's sweep").into_inner();
    assert_eq!(tally.scope, "tenant");
    assert!(tally.runs.iter().all(|r| r.run_id != run_b), "A's sweep listed B's run: {tally:?}");
    looping.abort();
    signal(&paused, Signal::SIGCONT);
    // Its lease is released: A may sweep again (once a last call of the
    // loop, accepted before the abort, has ended too).
    let deadline = Instant::now() + PATIENCE;
    let next = loop {
        match admin_a.sweep(api::SweepRequest {}).await {
            Err(s) if s.code() == tonic::Code::ResourceExhausted && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => break other.expect("A sweeps again once its sweep ended"),
        }
    };
    assert_eq!(next.into_inner().scope, "tenant");
    let record = get_run(&mut runs_b, &run_b).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");

    drop((replica, scheduler));
    dep.tear_down().await;
}

/// A tenant at its limit of running runs: the next StartRun is refused with
/// the limit in the message, another tenant starts, two starts racing for
/// the last slot admit one, and a run that ends frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_over_the_tenants_quota_is_refused() {
    let Some(dep) = Deployment::create().await else { return };
    let (tenant_a, token_a, token_b) = (dep.tenant("a"), dep.token("a"), dep.token("b"));
    let server = dep.start("quota", &[("max-running-runs-per-tenant", "2")]).await;
    let (mut runs_a, mut runs_b) = (server.runs(&token_a).await, server.runs(&token_b).await);
    put_definition(&mut server.sandboxes(&token_a).await, definition("def", Kind::Local)).await;
    put_definition(&mut server.sandboxes(&token_b).await, definition("def", Kind::Local)).await;
    let n = &dep.nonce;
    let forever = "echo start; sleep 600";

    start_running(&mut runs_a, &format!("a1-{n}"), "t1", forever).await;
    start_running(&mut runs_a, &format!("a2-{n}"), "t2", forever).await;
    let refused = runs_a.start_run(command_run(&format!("a3-{n}"), "t3", "def", forever)).await;
    let status = refused.expect_err("a third running run of A");
    assert_exhausted(
        &status,
        &[&format!("tenant {tenant_a} has 2 running runs, the limit (max-running-runs-per-tenant) is 2")],
    );
    let missing = runs_a.get_run(api::GetRunRequest { run_id: format!("a3-{n}") }).await;
    assert_eq!(missing.unwrap_err().code(), tonic::Code::NotFound, "a refused run leaves no record");

    // Another tenant is unaffected.
    start_running(&mut runs_b, &format!("b1-{n}"), "t1", forever).await;

    // A run that ends frees its slot.
    runs_a.cancel_run(api::CancelRunRequest { run_id: format!("a1-{n}") }).await.unwrap();
    let ended = wait_terminal(&mut runs_a, &format!("a1-{n}")).await;
    assert_eq!(ended.status, api::RunStatus::Aborted as i32);
    start_running(&mut runs_a, &format!("a3-{n}"), "t3", forever).await;

    // Two starts racing for the last slot: one is admitted.
    runs_a.cancel_run(api::CancelRunRequest { run_id: format!("a2-{n}") }).await.unwrap();
    wait_terminal(&mut runs_a, &format!("a2-{n}")).await;
    let (mut x, mut y) = (runs_a.clone(), runs_a.clone());
    let (rx, ry) = tokio::join!(
        x.start_run(command_run(&format!("a4-{n}"), "t4", "def", forever)),
        y.start_run(command_run(&format!("a5-{n}"), "t5", "def", forever)),
    );
    assert_one_admitted([rx.map(drop), ry.map(drop)], "max-running-runs-per-tenant");

    drop(server);
    dep.tear_down().await;
}

/// The same for sandboxes: a tenant at its limit cannot ensure a new one
/// (but resumes its own), another tenant can, two ensures racing for the
/// last slot admit one, and a destroyed sandbox frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_over_the_tenants_quota_is_refused() {
    let Some(dep) = Deployment::create().await else { return };
    let (tenant_a, token_a, token_b) = (dep.tenant("a"), dep.token("a"), dep.token("b"));
    let server = dep.start("quota", &[("max-sandboxes-per-tenant", "2")]).await;
    let (mut sandboxes_a, mut sandboxes_b) =
        (server.sandboxes(&token_a).await, server.sandboxes(&token_b).await);
    put_definition(&mut sandboxes_a, definition("def", Kind::Local)).await;
    put_definition(&mut sandboxes_b, definition("def", Kind::Local)).await;

    let first = ensure(&mut sandboxes_a, ensure_request("t1")).await.1.expect("A's first sandbox");
    ensure(&mut sandboxes_a, ensure_request("t2")).await.1.expect("A's second sandbox");
    let status = ensure(&mut sandboxes_a, ensure_request("t3")).await.1.expect_err("a third sandbox of A");
    assert_exhausted(
        &status,
        &[&format!("tenant {tenant_a} has 2 sandboxes, the limit (max-sandboxes-per-tenant) is 2")],
    );
    // Its own sandboxes still come back; another tenant is unaffected.
    let again = ensure(&mut sandboxes_a, ensure_request("t1")).await.1.expect("A's own sandbox again");
    assert_eq!(again.sandbox_id, first.sandbox_id);
    ensure(&mut sandboxes_b, ensure_request("t1")).await.1.expect("B's sandbox");

    // A destroyed sandbox frees its slot.
    sandboxes_a.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: first.sandbox_id }).await.unwrap();
    ensure(&mut sandboxes_a, ensure_request("t3")).await.1.expect("A's sandbox after a destroy");

    // Two ensures racing for the last slot: one is admitted.
    let (_, t2) = ensure(&mut sandboxes_a, ensure_request("t2")).await;
    let t2 = t2.unwrap().sandbox_id;
    sandboxes_a.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: t2 }).await.unwrap();
    let (mut x, mut y) = (sandboxes_a.clone(), sandboxes_a.clone());
    let ((_, rx), (_, ry)) =
        tokio::join!(ensure(&mut x, ensure_request("t4")), ensure(&mut y, ensure_request("t5")));
    assert_one_admitted([rx.map(drop), ry.map(drop)], "max-sandboxes-per-tenant");

    drop(server);
    dep.tear_down().await;
}
