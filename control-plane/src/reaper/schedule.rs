//! When sweeps happen, and what one sweep does in order.
//!
//! A sweep of every tenant runs on one replica at a time, under the lease
//! [`SWEEP_LEASE`]: the server schedules one every
//! [`ReaperOptions::interval`](crate::config::ReaperOptions::interval) (a
//! replica that finds the lease held skips that turn) and an operator's
//! `AdminService.Sweep` runs one on demand (waiting for the lease).
//!
//! A tenant's own sweep (`AdminService.Sweep` of a tenant that is no
//! operator) covers that tenant's runs, journals and sandboxes only, and
//! never takes or waits for [`SWEEP_LEASE`]: a tenant calling it in a loop
//! cannot keep the cluster's sweep from running. It holds the tenant's own
//! lease ([`tenant_sweep_lease`]) instead, so one runs per tenant at a time
//! across replicas, and a second call while it runs is refused at once
//! (RESOURCE_EXHAUSTED); and it starts no new run after
//! [`ReaperOptions::tenant_sweep_budget`](crate::config::ReaperOptions::tenant_sweep_budget).
//!
//! A tenant's sweep and the cluster's may run at once: each run either
//! touches is taken through its own run lease by `Runs::try_take_over` (so
//! two sweeps at once cannot act on one run twice: a sweep whose drive was
//! superseded, its record claimed again at a later epoch, counts the run
//! `not_claimed` and leaves it to the successor), a driverless run is
//! marked detached under its run lease, an orphaned sandbox is destroyed
//! under its sandbox lease, and pruning deletes only journals of terminal
//! runs, which is the same however often it happens.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::lease::Lease;
use crate::metrics::SweepOutcome;
use crate::store::Tenant;

use super::{Error, Reaper, Scope, Tally};

/// The cluster-wide lease a sweep of every tenant holds.
pub const SWEEP_LEASE: &str = "reaper:sweep";

/// The lease a sweep of `tenant`'s own holds: one per tenant at a time.
pub fn tenant_sweep_lease(tenant: &Tenant) -> String {
    format!("reaper:sweep:tenant:{}", tenant.as_str())
}

/// What stops a sweep early: losing its lease, or (a tenant's sweep) its
/// time budget running out.
pub(super) struct Bounds<'a> {
    pub lease: &'a Lease,
    pub deadline: Option<Instant>,
}

impl Bounds<'_> {
    /// The sweep should start nothing more.
    pub fn exhausted(&self) -> bool {
        self.lease.is_lost() || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}
/// How long an on-demand sweep waits for another replica's sweep to end.
const LEASE_WAIT: Duration = Duration::from_secs(300);

impl Reaper {
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
            let cx = &self.inner.cx;
            let lease = match cx.leases.try_acquire(SWEEP_LEASE).await {
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
            let bounds = Bounds { lease: &lease, deadline: None };
            let swept = tokio::select! {
                _ = shutdown.cancelled() => None,
                tally = self.sweep_holding(&Scope::All, &bounds) => Some(tally),
            };
            let _ = lease.release().await;
            if let Some(Err(e)) = swept {
                warn!(error = %e, "sweep failed");
            }
        }
    }

    /// One sweep now. Of every tenant: waiting for the sweep lease while
    /// another replica holds it. Of one tenant: under that tenant's lease,
    /// refused at once while another sweep of the tenant runs.
    pub async fn sweep(&self, scope: &Scope) -> Result<Tally, Error> {
        match scope {
            Scope::All => self.sweep_all().await,
            Scope::Tenant(tenant) => self.sweep_tenant(scope, tenant).await,
        }
    }

    async fn sweep_all(&self) -> Result<Tally, Error> {
        let cx = &self.inner.cx;
        let cancel = CancellationToken::new();
        let timer = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(LEASE_WAIT).await;
                cancel.cancel();
            })
        };
        let lease = cx.leases.acquire(SWEEP_LEASE, &cancel).await;
        timer.abort();
        let lease = lease?.ok_or(Error::Busy)?;
        let tally = self.sweep_holding(&Scope::All, &Bounds { lease: &lease, deadline: None }).await;
        let _ = lease.release().await;
        tally
    }

    async fn sweep_tenant(&self, scope: &Scope, tenant: &Tenant) -> Result<Tally, Error> {
        let name = tenant_sweep_lease(tenant);
        let Some(lease) = self.inner.cx.leases.try_acquire(&name).await? else {
            return Err(Error::TenantBusy { tenant: tenant.to_string(), lease: name });
        };
        let deadline = Instant::now() + self.inner.options.tenant_sweep_budget;
        let tally = self.sweep_holding(scope, &Bounds { lease: &lease, deadline: Some(deadline) }).await;
        let _ = lease.release().await;
        tally
    }

    async fn sweep_holding(&self, scope: &Scope, bounds: &Bounds<'_>) -> Result<Tally, Error> {
        let started = Instant::now();
        let cx = &self.inner.cx;
        let mut tally = Tally::default();
        self.sweep_runs(cx, scope, bounds, &mut tally).await?;
        if !bounds.exhausted() {
            self.prune_journals(cx, scope, bounds, &mut tally).await;
        }
        if !bounds.exhausted() {
            self.reclaim_orphans(cx, scope, &mut tally).await;
        }
        if !bounds.exhausted() {
            self.forget_gone_nodes_sandboxes(cx, scope, bounds, &mut tally).await;
        }
        if !bounds.exhausted() {
            self.remove_expired_runs(cx, scope, &mut tally).await;
        }
        if !bounds.exhausted() {
            self.remove_unused_definitions(cx, scope, &mut tally).await;
        }
        tally.truncated |= bounds.exhausted();
        tally.elapsed = started.elapsed();
        for report in &tally.runs {
            crate::metrics::sweeps().outcome(report.outcome);
        }
        crate::metrics::sweeps().outcomes_by(SweepOutcome::JournalPruned, tally.journals_pruned);
        crate::metrics::sweeps().outcomes_by(SweepOutcome::SandboxReclaimed, tally.sandboxes_reclaimed);
        crate::metrics::sweeps().outcomes_by(SweepOutcome::RunRemoved, tally.runs_removed);
        crate::metrics::sweeps().outcomes_by(SweepOutcome::DefinitionRemoved, tally.definitions_removed);
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
            sandboxes_forgotten = tally.sandboxes_forgotten,
            runs_removed = tally.runs_removed,
            definitions_removed = tally.definitions_removed,
            truncated = tally.truncated,
            elapsed_ms = tally.elapsed.as_millis() as u64,
            "sweep done"
        );
        Ok(tally)
    }
}
