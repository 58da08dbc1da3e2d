//! Detached runs: probe each one's journal and drive the finished (or
//! expired) ones to their terminal state through the takeover path.
//!
//! Per detached run (oldest detachment first, at most
//! [`ReaperOptions::max_runs`](crate::config::ReaperOptions::max_runs)), the
//! journal is probed (`ProbeExit`; an unknown state is never taken as
//! finished):
//!
//! | probe | what the sweep does | outcome |
//! |---|---|---|
//! | finished | drive it to its terminal state through the takeover path, wait (per-run budget), destroy its sandbox | `finalized` (`reclaim_failed` if the destroy failed) |
//! | finished, drive overran the budget | stop the drive as a cancel (record `aborted`, sandbox destroyed) | `budget_exceeded` |
//! | running, detached for less than the TTL | nothing | `producing` |
//! | running, detached for the TTL or longer | record a cancel, drive it (the driver destroys the sandbox, writes `aborted`) | `expired` |
//! | its sandbox's node is gone (removed, lost past the grace) | drive it (it ends `SANDBOX_LOST`), forget the sandbox | `finalized` |
//! | unknown, agent unreachable, no sandbox | nothing | `unknown` |
//! | another replica holds the run's lease, took it over during the sweep, or it ended (or a client came back) meanwhile | nothing (an expired run's cancel is recorded for its holder) | `not_claimed` |
//! | anything else failed | nothing more | `failed` |

use std::time::Duration;

use shared::proto::agent::v1 as agent;
use tracing::{debug, info, warn};

use super::error::{Error, told};
use crate::context::Context;
use crate::metrics::SweepOutcome;
use crate::runs::Takeover;
use crate::store::{RunRecord, Timestamp};

use super::handle::PROBE_TIMEOUT;
use super::schedule::Bounds;
use super::{Reaper, RunReport, Scope, Tally};

/// How long a drive stopped for overrunning its budget may take to end.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// How a drive the sweep waited for ended.
enum Driven {
    Terminal,
    /// Overran the budget, was stopped, and the record is terminal.
    Overran,
}

impl Reaper {
    pub(super) async fn sweep_runs(
        &self,
        cx: &Context,
        scope: &Scope,
        bounds: &Bounds<'_>,
        tally: &mut Tally,
    ) -> Result<(), Error> {
        self.detach_driverless(cx, scope).await;
        let now = Timestamp::now();
        let mut detached: Vec<RunRecord> = cx
            .stores
            .runs
            .list_reclaimable(now, scope.tenant())
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
            if bounds.lease.is_lost() {
                warn!("lost the sweep lease; stopping the sweep");
                break;
            }
            if bounds.exhausted() {
                info!(scope = scope.name(), "the sweep's time budget is spent; stopping the sweep");
                tally.truncated = true;
                break;
            }
            let report = self.sweep_run(cx, record, now).await;
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
    async fn detach_driverless(&self, cx: &Context, scope: &Scope) {
        let candidates =
            match cx.stores.runs.list_undetached_running(self.inner.options.max_runs, scope.tenant()).await {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "could not list undetached runs");
                    return;
                }
            };
        for record in candidates.into_iter().filter(|r| scope.covers(&r.tenant)) {
            let run = &record.run_id;
            let lease = match cx.leases.try_acquire(&crate::runs::lease_name(&record.key())).await {
                Ok(Some(lease)) => lease,
                Ok(None) => continue, // driven
                Err(e) => {
                    debug!(run_id = %run, error = %e, "could not probe the run's lease");
                    continue;
                }
            };
            match self.inner.runs.mark_detached(&record.key()).await {
                Ok(()) => {
                    info!(run_id = %run, "no replica drives this run and no client waits on it: marked detached")
                }
                Err(e) => {
                    warn!(run_id = %run, error = %e, "could not mark a driverless run detached")
                }
            }
            let _ = lease.release().await;
        }
    }

    async fn sweep_run(&self, cx: &Context, listed: RunRecord, now: Timestamp) -> RunReport {
        let run = listed.run_id.clone();
        // The list is as old as the sweep: a run handled before this one may
        // have taken long enough for this one to end, or for its client to
        // come back, meanwhile.
        let record = match cx.stores.runs.get(&listed.key()).await {
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
        let state = match self.probe(&record, &key).await {
            Ok(state) => state,
            // Its sandbox's node is gone for good: nothing will ever answer
            // the probe, so the drive ends the run `SANDBOX_LOST` (what it
            // delivered stays) and the sandbox is forgotten.
            Err(Error::Sandbox(e)) if e.is_lost() => return self.finalize(cx, &record, &key).await,
            Err(e) => return RunReport::new(&run, SweepOutcome::Unknown, told(e)),
        };
        match state {
            agent::RunState::Finished => self.finalize(cx, &record, &key).await,
            agent::RunState::Running => {
                let detached_at = record.detached_since.unwrap_or(now);
                let ttl = self.inner.options.detached_run_ttl;
                if detached_at.as_millis().saturating_add(ttl.as_millis() as i64) <= now.as_millis() {
                    self.expire(cx, &record, &key).await
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
    async fn probe(&self, record: &RunRecord, key: &str) -> Result<agent::RunState, Error> {
        let ask = async {
            let live = self.inner.sandbox.agent(&record.tenant, key).await?;
            let request = agent::ProbeExitRequest {
                run_id: record.run_id.to_string(),
                sentinel_key: record.sentinel_key.expose().as_bytes().to_vec(),
            };
            let response = live.agent.journal().probe_exit(request).await.map_err(Error::Probe)?;
            Ok(agent::RunState::try_from(response.into_inner().state).unwrap_or(agent::RunState::Unknown))
        };
        tokio::time::timeout(PROBE_TIMEOUT, ask).await.unwrap_or(Err(Error::ProbeTimedOut))
    }

    /// The journal finished: drive the run to its terminal state here, then
    /// reclaim its sandbox.
    async fn finalize(&self, cx: &Context, record: &RunRecord, key: &str) -> RunReport {
        let overran = "the drive to the terminal state overran the per-run budget; stopped as cancelled";
        self.drive_and_reclaim(cx, record, key, SweepOutcome::Finalized, overran).await
    }

    /// Still producing past the TTL: record a cancel, drive it so the driver
    /// stops it (destroying the sandbox), and make sure the sandbox is gone.
    async fn expire(&self, cx: &Context, record: &RunRecord, key: &str) -> RunReport {
        let run = &record.run_id;
        if let Err(e) = self.inner.runs.record_cancel(&record.key()).await {
            return RunReport::new(run, SweepOutcome::Failed, format!("recording the cancel: {e}"));
        }
        info!(run_id = %run, tenant = %record.tenant, "detached run past its TTL: cancelling");
        let overran = "stopping the expired run overran the per-run budget";
        let mut report = self.drive_and_reclaim(cx, record, key, SweepOutcome::Expired, overran).await;
        if report.outcome == SweepOutcome::NotClaimed {
            report.detail = format!("{}; its cancel is recorded for the replica holding it", report.detail);
        }
        report
    }

    /// Drive the run to its terminal state (`done` when it gets there within
    /// the budget), then reclaim its sandbox.
    async fn drive_and_reclaim(
        &self,
        cx: &Context,
        record: &RunRecord,
        key: &str,
        done: SweepOutcome,
        overran_detail: &str,
    ) -> RunReport {
        let run = &record.run_id;
        let mut report = match self.take_over_and_wait(cx, record).await {
            Ok(Driven::Terminal) => RunReport::new(run, done, ""),
            Ok(Driven::Overran) => RunReport {
                terminalized_anyway: true,
                ..RunReport::new(run, SweepOutcome::BudgetExceeded, overran_detail)
            },
            Err(report) => return report,
        };
        if let Err(e) = self.reclaim(cx, record, key).await {
            report.outcome = SweepOutcome::ReclaimFailed;
            report.detail = told(e);
        }
        report
    }

    /// Take the run over and wait for its drive to end, within the budget.
    /// `Err` carries the report of a run this sweep could not drive.
    async fn take_over_and_wait(&self, cx: &Context, record: &RunRecord) -> Result<Driven, RunReport> {
        let run = &record.run_id;
        let (handle, epoch) = match self.inner.runs.try_take_over(&record.key()).await {
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
            Err(e) => return Err(RunReport::new(run, SweepOutcome::Failed, told(e))),
        };
        let mut handle = handle;
        let overran = match tokio::time::timeout(self.inner.options.run_budget, &mut handle).await {
            Ok(_) => false,
            Err(_) => {
                warn!(run_id = %run, budget_ms = self.inner.options.run_budget.as_millis() as u64,
                    "the drive overran the sweep's budget; stopping it");
                let _ = cx.stores.runs.request_cancel(&record.key()).await;
                self.inner.runs.stop_overrun(&record.key());
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
        match cx.stores.runs.get(&record.key()).await {
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
    async fn reclaim(&self, cx: &Context, record: &RunRecord, key: &str) -> Result<(), Error> {
        let others: Vec<RunRecord> = cx
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
        match self.inner.sandbox.destroy(&record.tenant, key).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(Error::Reclaim(e)),
        }
    }
}
