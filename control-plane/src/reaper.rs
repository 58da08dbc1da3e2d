//! The reaper: closes out detached durable runs, prunes journals of
//! terminal runs, and destroys orphaned sandboxes.
//!
//! A sweep runs on one replica at a time, under the lease
//! [`SWEEP_LEASE`]: the server schedules one every
//! [`ReaperOptions::interval`] (a replica that finds the lease held skips
//! that turn) and `AdminService.Sweep` runs one on demand (waiting for the
//! lease). Each run it touches is also taken through its own run lease by
//! [`Runs::try_take_over`], so even two sweeps at once cannot act on one run
//! twice: a sweep whose drive was superseded (its record claimed again at a
//! later epoch) counts the run `not_claimed` and leaves it to the successor.
//!
//! Per detached run (oldest detachment first, at most
//! [`ReaperOptions::max_runs`]), the journal is probed (`ProbeExit`; an
//! unknown state is never taken as finished):
//!
//! | probe | what the sweep does | outcome |
//! |---|---|---|
//! | finished | drive it to its terminal state through the takeover path, wait (per-run budget), destroy its sandbox | `finalized` (`reclaim_failed` if the destroy failed) |
//! | finished, drive overran the budget | stop the drive as a cancel (record `aborted`, sandbox destroyed) | `budget_exceeded` |
//! | running, detached for less than the TTL | nothing | `producing` |
//! | running, detached for the TTL or longer | record a cancel, drive it (the driver destroys the sandbox, writes `aborted`) | `expired` |
//! | unknown, agent unreachable, no sandbox | nothing | `unknown` |
//! | another replica holds the run's lease, took it over during the sweep, or it ended (or a client came back) meanwhile | nothing (an expired run's cancel is recorded for its holder) | `not_claimed` |
//! | anything else failed | nothing more | `failed` |
//!
//! Journals: in every sandbox the provider reports running, each journal
//! whose run record is terminal is deleted; a journal with no record at all
//! only once older than [`ReaperOptions::orphan_journal_age`]; anything not
//! proven terminal (running record, undecodable name, store error, record
//! of another tenant) is kept. At most
//! [`ReaperOptions::max_journal_deletions`] per sweep.
//!
//! Orphaned sandboxes: a sandbox the provider lists with Sandhold's labels,
//! made through this server's data dir (never another deployment's on a
//! shared Docker engine), of a tenant this deployment knows, that no
//! instance record points at and
//! no unfinished run lives in, older than
//! [`ReaperOptions::orphan_sandbox_grace`], is destroyed (under its sandbox
//! lease, so never during an ensure).
//!
//! Scope: the scheduled sweep covers every tenant; `AdminService.Sweep`
//! covers the caller's tenant only, unless the caller is an operator tenant
//! (or the single user), whose sweep covers every tenant.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1 as agent;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use crate::config::ReaperOptions;
use crate::lease::Lease;
use crate::metrics::SweepOutcome;
use crate::provider::{LABEL_SANDBOX_KEY, LABEL_TENANT};
use crate::runs::{Runs, Takeover};
use crate::sandbox::Lifecycle;
use crate::server::{Ready, ServerState};
use crate::store::{self, RunId, RunRecord, Tenant, Timestamp};

/// The cluster-wide lease a sweep holds.
pub const SWEEP_LEASE: &str = "reaper:sweep";
/// Bound on reaching a sandbox's agent and asking it one thing.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a drive stopped for overrunning its budget may take to end.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// How long an on-demand sweep waits for another replica's sweep to end.
const LEASE_WAIT: Duration = Duration::from_secs(300);

/// Whose runs, journals and sandboxes a sweep covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Tenant(Tenant),
}

impl Scope {
    fn covers(&self, tenant: &Tenant) -> bool {
        match self {
            Scope::All => true,
            Scope::Tenant(t) => t == tenant,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::Tenant(_) => "tenant",
        }
    }
}

/// What a sweep did with one detached run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub run_id: RunId,
    pub outcome: SweepOutcome,
    pub detail: String,
    /// The drive overran its budget and was stopped; the record is terminal
    /// anyway (kept when `reclaim_failed` overwrote `budget_exceeded`).
    pub terminalized_anyway: bool,
}

impl RunReport {
    fn new(run_id: &RunId, outcome: SweepOutcome, detail: impl Into<String>) -> Self {
        Self { run_id: run_id.clone(), outcome, detail: detail.into(), terminalized_anyway: false }
    }
}

/// A sweep's tally.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub runs: Vec<RunReport>,
    pub journals_pruned: u64,
    pub journals_kept: u64,
    pub sandboxes_reclaimed: u64,
    /// A bound of the sweep (runs, deletions, the lease) cut it short.
    pub truncated: bool,
    pub elapsed: Duration,
}

impl Tally {
    /// Runs with `outcome`.
    pub fn count(&self, outcome: SweepOutcome) -> u64 {
        self.runs.iter().filter(|r| r.outcome == outcome).count() as u64
    }
}

/// The reaper of one replica. Cheap to clone.
#[derive(Clone)]
pub struct Reaper {
    inner: Arc<Inner>,
}

struct Inner {
    state: ServerState,
    lifecycle: Lifecycle,
    runs: Runs,
    options: ReaperOptions,
    /// Single-user mode: the one tenant is known without a token.
    single_user: bool,
}

impl Reaper {
    pub fn new(
        state: ServerState,
        lifecycle: Lifecycle,
        runs: Runs,
        options: ReaperOptions,
        single_user: bool,
    ) -> Self {
        Self { inner: Arc::new(Inner { state, lifecycle, runs, options, single_user }) }
    }

    pub fn options(&self) -> &ReaperOptions {
        &self.inner.options
    }

    /// Sweep every `interval` until `shutdown`, when this replica gets the
    /// sweep lease (another replica sweeping means this turn is skipped).
    pub async fn run(self, shutdown: CancellationToken) {
        let interval = self.inner.options.interval;
        if interval.is_zero() {
            info!("scheduled sweeps are off (sweep interval 0)");
            return;
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let Ok(ready) = self.inner.state.ready() else { continue };
            let lease = match ready.leases.try_acquire(SWEEP_LEASE).await {
                Ok(Some(lease)) => lease,
                Ok(None) => {
                    debug!("another replica is sweeping; skipping this turn");
                    continue;
                }
                Err(e) => {
                    warn!(error = %e, "could not take the sweep lease");
                    continue;
                }
            };
            let swept = tokio::select! {
                _ = shutdown.cancelled() => None,
                tally = self.sweep_holding(&Scope::All, &lease) => Some(tally),
            };
            let _ = lease.release().await;
            if let Some(Err(e)) = swept {
                warn!(error = %e.message, "sweep failed");
            }
        }
    }

    /// One sweep now, waiting for the sweep lease while another replica
    /// holds it.
    pub async fn sweep(&self, scope: &Scope) -> Result<Tally, Error> {
        let ready = self.inner.state.ready()?;
        let cancel = CancellationToken::new();
        let timer = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(LEASE_WAIT).await;
                cancel.cancel();
            })
        };
        let lease = ready.leases.acquire(SWEEP_LEASE, &cancel).await;
        timer.abort();
        let lease = lease?.ok_or_else(|| {
            Error::new(ErrorCode::Unavailable, "another replica's sweep did not end in time; try again")
        })?;
        let tally = self.sweep_holding(scope, &lease).await;
        let _ = lease.release().await;
        tally
    }

    async fn sweep_holding(&self, scope: &Scope, lease: &Lease) -> Result<Tally, Error> {
        let started = Instant::now();
        let ready = self.inner.state.ready()?;
        let mut tally = Tally::default();
        self.sweep_runs(ready, scope, lease, &mut tally).await?;
        if !lease.is_lost() {
            self.prune_journals(ready, scope, &mut tally).await;
        }
        if !lease.is_lost() {
            self.reclaim_orphans(ready, scope, &mut tally).await;
        }
        tally.truncated |= lease.is_lost();
        tally.elapsed = started.elapsed();
        for report in &tally.runs {
            crate::metrics::sweeps().outcome(report.outcome);
        }
        crate::metrics::sweeps().outcomes_by(SweepOutcome::JournalPruned, tally.journals_pruned);
        crate::metrics::sweeps().outcomes_by(SweepOutcome::SandboxReclaimed, tally.sandboxes_reclaimed);
        let n = |o| tally.count(o);
        info!(
            scope = scope.name(),
            runs = tally.runs.len(),
            finalized = n(SweepOutcome::Finalized),
            expired = n(SweepOutcome::Expired),
            producing = n(SweepOutcome::Producing),
            unknown = n(SweepOutcome::Unknown),
            not_claimed = n(SweepOutcome::NotClaimed),
            budget_exceeded = n(SweepOutcome::BudgetExceeded),
            reclaim_failed = n(SweepOutcome::ReclaimFailed),
            failed = n(SweepOutcome::Failed),
            journals_pruned = tally.journals_pruned,
            journals_kept = tally.journals_kept,
            sandboxes_reclaimed = tally.sandboxes_reclaimed,
            truncated = tally.truncated,
            elapsed_ms = tally.elapsed.as_millis() as u64,
            "sweep done"
        );
        Ok(tally)
    }

    // ------------------------------------------------------------ runs

    async fn sweep_runs(
        &self,
        ready: &Ready,
        scope: &Scope,
        lease: &Lease,
        tally: &mut Tally,
    ) -> Result<(), Error> {
        self.detach_driverless(ready, scope).await;
        let now = Timestamp::now();
        let mut detached: Vec<RunRecord> = ready
            .stores
            .runs
            .list_reclaimable(now)
            .await?
            .into_iter()
            .filter(|r| scope.covers(&r.tenant))
            .collect();
        let max = self.inner.options.max_runs as usize;
        if detached.len() > max {
            detached.truncate(max);
            tally.truncated = true;
        }
        for record in detached {
            if lease.is_lost() {
                warn!("lost the sweep lease; stopping the sweep");
                break;
            }
            let report = self.sweep_run(ready, record, now).await;
            if matches!(report.outcome, SweepOutcome::Failed | SweepOutcome::ReclaimFailed) {
                warn!(run_id = %report.run_id, outcome = report.outcome.as_str(), detail = %report.detail, "swept a run");
            } else {
                debug!(run_id = %report.run_id, outcome = report.outcome.as_str(), detail = %report.detail, "swept a run");
            }
            tally.runs.push(report);
        }
        Ok(())
    }

    /// A run whose driver died while no client was attached anywhere is
    /// never marked detached (that happens when a client leaves), so it
    /// would never be swept. Every running, undetached run whose lease is
    /// free (no replica drives it) is marked detached now, while this sweep
    /// holds its lease; the rest of the sweep then treats it as any
    /// detached run (finished: finalized; producing: the TTL counts from
    /// now). A client attaching later clears the mark again.
    async fn detach_driverless(&self, ready: &Ready, scope: &Scope) {
        let candidates = match ready.stores.runs.list_undetached_running(self.inner.options.max_runs).await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "could not list undetached runs");
                return;
            }
        };
        for record in candidates.into_iter().filter(|r| scope.covers(&r.tenant)) {
            let run = &record.run_id;
            let lease = match ready.leases.try_acquire(&format!("run:{run}")).await {
                Ok(Some(lease)) => lease,
                Ok(None) => continue, // driven
                Err(e) => {
                    debug!(run_id = %run, error = %e, "could not probe the run's lease");
                    continue;
                }
            };
            match self.inner.runs.mark_detached(run).await {
                Ok(()) => {
                    info!(run_id = %run, "no replica drives this run and no client waits on it: marked detached")
                }
                Err(e) => {
                    warn!(run_id = %run, error = %e.message, "could not mark a driverless run detached")
                }
            }
            let _ = lease.release().await;
        }
    }

    async fn sweep_run(&self, ready: &Ready, listed: RunRecord, now: Timestamp) -> RunReport {
        let run = listed.run_id.clone();
        // The list is as old as the sweep: a run handled before this one may
        // have taken long enough for this one to end, or for its client to
        // come back, meanwhile.
        let record = match ready.stores.runs.get_unscoped(&run).await {
            Ok(r) if r.status.is_terminal() => {
                return RunReport::new(&run, SweepOutcome::NotClaimed, "the run ended meanwhile");
            }
            Ok(r) if r.detached_since.is_none() => {
                return RunReport::new(&run, SweepOutcome::NotClaimed, "a client attached meanwhile");
            }
            Ok(r) => r,
            Err(e) => return RunReport::new(&run, SweepOutcome::Failed, format!("reading the record: {e}")),
        };
        let Some(key) = record.sandbox_key.clone() else {
            return RunReport::new(&run, SweepOutcome::Unknown, "the run has no sandbox recorded");
        };
        let state = match self.probe(ready, &record, &key).await {
            Ok(state) => state,
            Err(e) => return RunReport::new(&run, SweepOutcome::Unknown, e.message),
        };
        match state {
            agent::RunState::Finished => self.finalize(ready, &record, &key).await,
            agent::RunState::Running => {
                let detached_at = record.detached_since.unwrap_or(now);
                let ttl = self.inner.options.detached_run_ttl;
                if detached_at.as_millis().saturating_add(ttl.as_millis() as i64) <= now.as_millis() {
                    self.expire(ready, &record, &key).await
                } else {
                    RunReport::new(&run, SweepOutcome::Producing, "")
                }
            }
            _ => RunReport::new(
                &run,
                SweepOutcome::Unknown,
                "the sandbox cannot tell whether the run finished",
            ),
        }
    }

    /// Whether the run's journal finished, asked of its sandbox.
    async fn probe(&self, ready: &Ready, record: &RunRecord, key: &str) -> Result<agent::RunState, Error> {
        let ask = async {
            let live = self.inner.lifecycle.agent(&ready.stores, &record.tenant, key).await?;
            let request = agent::ProbeExitRequest {
                run_id: record.run_id.to_string(),
                sentinel_key: record.sentinel_key.expose().as_bytes().to_vec(),
            };
            let response = live
                .agent
                .journal()
                .probe_exit(request)
                .await
                .map_err(|s| Error::from_status(&s).context("probing the journal"))?;
            Ok(agent::RunState::try_from(response.into_inner().state).unwrap_or(agent::RunState::Unknown))
        };
        tokio::time::timeout(PROBE_TIMEOUT, ask).await.unwrap_or_else(|_| {
            Err(Error::new(ErrorCode::Unavailable, "the sandbox's agent did not answer in time"))
        })
    }

    /// The journal finished: drive the run to its terminal state here, then
    /// reclaim its sandbox.
    async fn finalize(&self, ready: &Ready, record: &RunRecord, key: &str) -> RunReport {
        let overran = "the drive to the terminal state overran the per-run budget; stopped as cancelled";
        self.drive_and_reclaim(ready, record, key, SweepOutcome::Finalized, overran).await
    }

    /// Still producing past the TTL: record a cancel, drive it so the driver
    /// stops it (destroying the sandbox), and make sure the sandbox is gone.
    async fn expire(&self, ready: &Ready, record: &RunRecord, key: &str) -> RunReport {
        let run = &record.run_id;
        if let Err(e) = ready.stores.runs.request_cancel(&record.tenant, run).await {
            return RunReport::new(run, SweepOutcome::Failed, format!("recording the cancel: {e}"));
        }
        info!(run_id = %run, tenant = %record.tenant, "detached run past its TTL: cancelling");
        let overran = "stopping the expired run overran the per-run budget";
        let mut report = self.drive_and_reclaim(ready, record, key, SweepOutcome::Expired, overran).await;
        if report.outcome == SweepOutcome::NotClaimed {
            report.detail = format!("{}; its cancel is recorded for the replica holding it", report.detail);
        }
        report
    }

    /// Drive the run to its terminal state (`done` when it gets there within
    /// the budget), then reclaim its sandbox.
    async fn drive_and_reclaim(
        &self,
        ready: &Ready,
        record: &RunRecord,
        key: &str,
        done: SweepOutcome,
        overran_detail: &str,
    ) -> RunReport {
        let run = &record.run_id;
        let mut report = match self.take_over_and_wait(ready, record).await {
            Ok(Driven::Terminal) => RunReport::new(run, done, ""),
            Ok(Driven::Overran) => RunReport {
                terminalized_anyway: true,
                ..RunReport::new(run, SweepOutcome::BudgetExceeded, overran_detail)
            },
            Err(report) => return report,
        };
        if let Err(e) = self.reclaim(ready, record, key).await {
            report.outcome = SweepOutcome::ReclaimFailed;
            report.detail = e.message;
        }
        report
    }

    /// Take the run over and wait for its drive to end, within the budget.
    /// `Err` carries the report of a run this sweep could not drive.
    async fn take_over_and_wait(&self, ready: &Ready, record: &RunRecord) -> Result<Driven, RunReport> {
        let run = &record.run_id;
        let (handle, epoch) = match self.inner.runs.try_take_over(run).await {
            Ok(Takeover::Driving { drive, epoch }) => (drive, epoch),
            Ok(Takeover::HeldElsewhere) => {
                return Err(RunReport::new(
                    run,
                    SweepOutcome::NotClaimed,
                    "another replica holds the run's lease",
                ));
            }
            Ok(Takeover::AlreadyHere) => {
                return Err(RunReport::new(
                    run,
                    SweepOutcome::NotClaimed,
                    "this replica drives the run already",
                ));
            }
            Ok(Takeover::Ended) => {
                return Err(RunReport::new(run, SweepOutcome::NotClaimed, "the run ended meanwhile"));
            }
            Err(e) => return Err(RunReport::new(run, SweepOutcome::Failed, e.message)),
        };
        let mut handle = handle;
        let overran = match tokio::time::timeout(self.inner.options.run_budget, &mut handle).await {
            Ok(_) => false,
            Err(_) => {
                warn!(run_id = %run, budget_ms = self.inner.options.run_budget.as_millis() as u64,
                    "the drive overran the sweep's budget; stopping it");
                let _ = ready.stores.runs.request_cancel(&record.tenant, run).await;
                self.inner.runs.stop_overrun(run);
                if tokio::time::timeout(STOP_GRACE, &mut handle).await.is_err() {
                    handle.abort();
                    return Err(RunReport::new(
                        run,
                        SweepOutcome::Failed,
                        "the drive overran its budget and did not stop",
                    ));
                }
                true
            }
        };
        match ready.stores.runs.get_unscoped(run).await {
            // Claimed again after this sweep's claim: this drive was
            // superseded (its lease ran out, say, while this replica was
            // paused) and wrote nothing more; the successor ends the run and
            // counts it.
            Ok(r) if r.driver_epoch != epoch => Err(RunReport::new(
                run,
                SweepOutcome::NotClaimed,
                format!(
                    "another replica took the run over during the sweep (epoch {} after this sweep's {epoch})",
                    r.driver_epoch
                ),
            )),
            Ok(r) if r.status.is_terminal() => Ok(if overran { Driven::Overran } else { Driven::Terminal }),
            Ok(_) => Err(RunReport::new(
                run,
                SweepOutcome::Failed,
                "the drive ended without a terminal state (its lease was lost, or the server is shutting down)",
            )),
            Err(e) => Err(RunReport::new(run, SweepOutcome::Failed, format!("reading the record: {e}"))),
        }
    }

    /// Destroy the sandbox of a run that reached its terminal state, unless
    /// another unfinished run lives in it. Gone already is fine.
    async fn reclaim(&self, ready: &Ready, record: &RunRecord, key: &str) -> Result<(), Error> {
        let others: Vec<RunRecord> = ready
            .stores
            .runs
            .unfinished_in_sandbox(key)
            .await?
            .into_iter()
            .filter(|r| r.run_id != record.run_id)
            .collect();
        if let Some(other) = others.first() {
            info!(run_id = %record.run_id, sandbox_key = %key, other_run = %other.run_id,
                "sandbox kept: another run lives in it");
            return Ok(());
        }
        match self.inner.lifecycle.destroy(&ready.stores, &ready.leases, &record.tenant, key).await {
            Ok(()) => Ok(()),
            Err(e) if e.code == ErrorCode::NotFound => Ok(()),
            Err(e) => Err(e.context("reclaiming the run's sandbox")),
        }
    }

    // ------------------------------------------------------------ journals

    /// Provider ids of the sandboxes that are running now, per provider name.
    async fn running_sandboxes(&self, labels: &BTreeMap<String, String>) -> HashSet<(String, String)> {
        let mut running = HashSet::new();
        for provider in self.inner.lifecycle.providers.all() {
            match provider.list(labels).await {
                Ok(listed) => running.extend(
                    listed
                        .into_iter()
                        .filter(|s| s.running)
                        .map(|s| (provider.kind().as_str().to_string(), s.provider_id)),
                ),
                Err(e) => warn!(provider = %provider.kind(), error = %e.message, "listing sandboxes failed"),
            }
        }
        running
    }

    fn scope_labels(scope: &Scope) -> BTreeMap<String, String> {
        match scope {
            Scope::All => BTreeMap::new(),
            Scope::Tenant(t) => BTreeMap::from([(LABEL_TENANT.to_string(), t.as_str().to_string())]),
        }
    }

    async fn prune_journals(&self, ready: &Ready, scope: &Scope, tally: &mut Tally) {
        let tenant = match scope {
            Scope::All => None,
            Scope::Tenant(t) => Some(t),
        };
        let instances = match ready.stores.instances.list(tenant).await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "listing instances failed; no journals pruned");
                return;
            }
        };
        // Only running sandboxes: a sweep never wakes a stopped one.
        let running = self.running_sandboxes(&Self::scope_labels(scope)).await;
        let mut budget = u64::from(self.inner.options.max_journal_deletions);
        for instance in instances {
            if !running.contains(&(instance.provider.clone(), instance.provider_sandbox_id.clone())) {
                continue;
            }
            if budget == 0 {
                tally.truncated = true;
                break;
            }
            match tokio::time::timeout(PROBE_TIMEOUT, self.prune_sandbox(ready, &instance, budget)).await {
                Ok(Ok((pruned, kept))) => {
                    budget -= pruned.min(budget);
                    tally.journals_pruned += pruned;
                    tally.journals_kept += kept;
                }
                Ok(Err(e)) => {
                    debug!(sandbox_key = %instance.sandbox_key, error = %e.message, "journals not pruned")
                }
                Err(_) => {
                    debug!(sandbox_key = %instance.sandbox_key, "journals not pruned: the agent is slow")
                }
            }
        }
    }

    /// Delete the journals of one sandbox that are proven dead; returns
    /// (deleted, kept).
    async fn prune_sandbox(
        &self,
        ready: &Ready,
        instance: &store::Instance,
        budget: u64,
    ) -> Result<(u64, u64), Error> {
        let live = self.inner.lifecycle.agent(&ready.stores, &instance.tenant, &instance.sandbox_key).await?;
        let journals = live
            .agent
            .journal()
            .list_journals(agent::ListJournalsRequest {})
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner()
            .journals;
        let now = Timestamp::now().as_millis();
        let orphan_age = self.inner.options.orphan_journal_age.as_millis() as i64;
        let mut doomed = Vec::new();
        let mut kept = 0u64;
        for journal in journals {
            let dead = match RunId::parse(&journal.run_id) {
                Err(_) => false,
                Ok(run) => match ready.stores.runs.get_unscoped(&run).await {
                    Ok(r) => r.status.is_terminal() && r.tenant == instance.tenant,
                    Err(store::Error::NotFound(_)) => now.saturating_sub(journal.mtime_ms) >= orphan_age,
                    Err(_) => false,
                },
            };
            if dead && (doomed.len() as u64) < budget {
                doomed.push(journal.run_id);
            } else {
                kept += 1;
            }
        }
        if doomed.is_empty() {
            return Ok((0, kept));
        }
        let deleted = live
            .agent
            .journal()
            .delete_journals(agent::DeleteJournalsRequest { run_ids: doomed })
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner()
            .deleted;
        for run in &deleted {
            debug!(sandbox_key = %instance.sandbox_key, run_id = %run, "journal pruned");
        }
        Ok((deleted.len() as u64, kept))
    }

    // ------------------------------------------------------------ orphans

    /// Tenants this deployment knows: an orphan of an unknown tenant may
    /// belong to another deployment sharing the provider (a Docker engine).
    async fn known_tenants(&self, ready: &Ready) -> Result<HashSet<Tenant>, Error> {
        let mut known: HashSet<Tenant> = ready.stores.tokens.list_tenants().await?.into_iter().collect();
        if self.inner.single_user {
            known.insert(Tenant::new(crate::auth::SINGLE_USER_TENANT));
        }
        Ok(known)
    }

    async fn reclaim_orphans(&self, ready: &Ready, scope: &Scope, tally: &mut Tally) {
        let known = match self.known_tenants(ready).await {
            Ok(k) => k,
            Err(e) => {
                warn!(error = %e.message, "listing tenants failed; no orphaned sandboxes reclaimed");
                return;
            }
        };
        let grace = self.inner.options.orphan_sandbox_grace.as_millis() as i64;
        let now = Timestamp::now().as_millis();
        for provider in self.inner.lifecycle.providers.all() {
            let listed = match provider.list(&Self::scope_labels(scope)).await {
                Ok(l) => l,
                Err(e) => {
                    warn!(provider = %provider.kind(), error = %e.message, "listing sandboxes failed");
                    continue;
                }
            };
            for sandbox in listed {
                let (Some(key), Some(tenant)) =
                    (sandbox.labels.get(LABEL_SANDBOX_KEY), sandbox.labels.get(LABEL_TENANT))
                else {
                    continue;
                };
                let tenant = Tenant::new(tenant);
                if !known.contains(&tenant) || !scope.covers(&tenant) {
                    continue;
                }
                // Not made through our data dir (another deployment on the
                // same Docker engine), or no age to judge: keep it.
                if !sandbox.own {
                    continue;
                }
                let Some(created) = sandbox.created_at else { continue };
                if now.saturating_sub(created.as_millis()) < grace {
                    continue;
                }
                match self.orphan(ready, provider.kind().as_str(), key, &sandbox.provider_id).await {
                    Ok(false) => {}
                    Ok(true) => {
                        // Under the sandbox's lease: never during an ensure or destroy.
                        let Ok(Some(lease)) = ready.leases.try_acquire(&format!("sandbox:{key}")).await
                        else {
                            continue;
                        };
                        let still =
                            self.orphan(ready, provider.kind().as_str(), key, &sandbox.provider_id).await;
                        if matches!(still, Ok(true)) {
                            match provider.destroy(&sandbox.provider_id).await {
                                Ok(()) => {
                                    info!(sandbox_key = %key, tenant = %tenant, provider_id = %sandbox.provider_id,
                                        "orphaned sandbox destroyed");
                                    tally.sandboxes_reclaimed += 1;
                                }
                                Err(e) => warn!(sandbox_key = %key, error = %e.message,
                                    "destroying an orphaned sandbox failed"),
                            }
                        }
                        let _ = lease.release().await;
                    }
                    Err(e) => debug!(sandbox_key = %key, error = %e.message, "orphan check failed; kept"),
                }
            }
        }
    }

    /// No instance record points at this sandbox, and no unfinished run
    /// lives in its key when no record points anywhere.
    async fn orphan(
        &self,
        ready: &Ready,
        provider: &str,
        key: &str,
        provider_id: &str,
    ) -> Result<bool, Error> {
        match ready.stores.instances.get(key).await {
            Ok(i) if i.provider == provider && i.provider_sandbox_id == provider_id => Ok(false),
            // The key's record points at another sandbox: this one was replaced.
            Ok(_) => Ok(true),
            Err(store::Error::NotFound(_)) => {
                Ok(ready.stores.runs.unfinished_in_sandbox(key).await?.is_empty())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// How a drive the sweep waited for ended.
enum Driven {
    Terminal,
    /// Overran the budget, was stopped, and the record is terminal.
    Overran,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refuse_a_zero_ttl_or_budget() {
        assert!(ReaperOptions::default().validate().is_ok());
        let zero_ttl = ReaperOptions { detached_run_ttl: Duration::ZERO, ..Default::default() };
        assert!(zero_ttl.validate().is_err());
        let zero_budget = ReaperOptions { run_budget: Duration::ZERO, ..Default::default() };
        assert!(zero_budget.validate().is_err());
    }

    #[test]
    fn a_tenant_scope_covers_only_its_tenant() {
        let acme = Tenant::new("acme");
        assert!(Scope::All.covers(&acme));
        assert!(Scope::Tenant(acme.clone()).covers(&acme));
        assert!(!Scope::Tenant(Tenant::new("globex")).covers(&acme));
        assert_eq!(Reaper::scope_labels(&Scope::All), BTreeMap::new());
        assert_eq!(
            Reaper::scope_labels(&Scope::Tenant(acme)).get(LABEL_TENANT).map(String::as_str),
            Some("acme")
        );
    }
}
