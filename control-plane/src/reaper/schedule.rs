//! When sweeps happen, and what one sweep does in order.
//!
//! A sweep runs on one replica at a time, under the lease [`SWEEP_LEASE`]:
//! the server schedules one every
//! [`ReaperOptions::interval`](crate::config::ReaperOptions::interval) (a
//! replica that finds the lease held skips that turn) and
//! `AdminService.Sweep` runs one on demand (waiting for the
//! lease). Each run it touches is also taken through its own run lease by
//! `Runs::try_take_over`, so even two sweeps at once cannot act on one run
//! twice: a sweep whose drive was superseded (its record claimed again at a
//! later epoch) counts the run `not_claimed` and leaves it to the successor.
//!
//! Scope: the scheduled sweep covers every tenant; `AdminService.Sweep`
//! covers the caller's tenant only, unless the caller is an operator tenant
//! (or the single user), whose sweep covers every tenant.

use std::time::{Duration, Instant};

use shared::error::{Error, ErrorCode};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::lease::Lease;
use crate::metrics::SweepOutcome;

use super::{Reaper, Scope, Tally};

/// The cluster-wide lease a sweep holds.
pub const SWEEP_LEASE: &str = "reaper:sweep";
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
        let lease = lease?.ok_or_else(|| {
            Error::new(ErrorCode::Unavailable, "another replica's sweep did not end in time; try again")
        })?;
        let tally = self.sweep_holding(scope, &lease).await;
        let _ = lease.release().await;
        tally
    }

    async fn sweep_holding(&self, scope: &Scope, lease: &Lease) -> Result<Tally, Error> {
        let started = Instant::now();
        let cx = &self.inner.cx;
        let mut tally = Tally::default();
        self.sweep_runs(cx, scope, lease, &mut tally).await?;
        if !lease.is_lost() {
            self.prune_journals(cx, scope, &mut tally).await;
        }
        if !lease.is_lost() {
            self.reclaim_orphans(cx, scope, &mut tally).await;
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
}
