//! A drive's conclusion: act on its ending (stop the command, write the
//! terminal chunk and status, close the log), then after a completed run
//! export the session and save the checkpoint, and after any ended run
//! destroy the sandbox as its definition says, or drop the journal.

use shared::chunk::{self, ChunkFactory};
use shared::error::Error as WireError;
use shared::proto::agent::v1 as agent;
use shared::proto::v1::ChunkType;
use tracing::{Instrument as _, debug, info, warn};

use super::ctx::DriveCtx;
use super::ending::{Ending, ending_name};
use super::retry::GaveUp;
use super::store_calls::stored_log;
use crate::harness::session::Carry;
use crate::runs::align::checkpoints;
use crate::runs::daily;
use crate::runs::log::encode_chunk;
use crate::runs::{Runs, session};
use crate::store::{self, RunError, RunFinish, RunStatus, Timestamp};

impl Runs {
    /// Act on how the drive ended: terminal chunk, status, log, sandbox.
    /// Stop the run's command. The CLI dies with its sandbox: destroying it
    /// is the one stop every provider can do, also for a wedged agent.
    async fn stop_command(&self, ctx: &DriveCtx, key: Option<&str>) {
        if let Some(key) = key
            && let Err(e) = self.inner.sandbox.destroy(&ctx.key.tenant, key).await
            && !e.is_not_found()
        {
            warn!(run_id = %ctx.key.run, sandbox_key = %key, error = %e, "could not destroy the sandbox of a stopped run");
        }
    }

    #[tracing::instrument(name = "run.conclude", skip_all)]
    pub(super) async fn conclude(&self, ctx: &DriveCtx, ending: Ending) {
        let cx = &self.inner.ctx;
        // Read once: the stop, the completion and the journal cleanup all
        // act on the same sandbox.
        let key = match &ending {
            Ending::Superseded(_) | Ending::Detach => None,
            _ => self.sandbox_key(ctx).await,
        };
        let (status, error, usage, appended) = match ending {
            Ending::Superseded(why) => {
                info!(run_id = %ctx.key.run, epoch = ctx.writer.epoch(), reason = %why, "no longer the run's driver; writing nothing");
                return;
            }
            Ending::Detach => {
                if let Err(e) = self.mark_detached(&ctx.key).await {
                    warn!(run_id = %ctx.key.run, error = %e, "could not mark the run detached at shutdown");
                }
                info!(run_id = %ctx.key.run, "shutting down: run detached for another replica to take over");
                return;
            }
            Ending::Exited { terminal } => match terminal.r#type() {
                ChunkType::RunError => (
                    RunStatus::Failed,
                    Some(RunError {
                        code: terminal.error_code.clone(),
                        message: terminal.error_message.clone(),
                    }),
                    None,
                    true,
                ),
                _ => (
                    RunStatus::Completed,
                    None,
                    terminal.usage.as_ref().map(shared::chunk::usage_to_json),
                    true,
                ),
            },
            Ending::Stopped(reason) => {
                self.stop_command(ctx, key.as_deref()).await;
                (
                    RunStatus::Aborted,
                    Some(RunError { code: reason.code().into(), message: reason.message().into() }),
                    None,
                    false,
                )
            }
            Ending::Failed(e) => {
                if e.outlives_the_command() {
                    self.stop_command(ctx, key.as_deref()).await;
                }
                let shown = e.to_string();
                // What the run records is what a client would have seen.
                let e = WireError::from(e);
                warn!(run_id = %ctx.key.run, code = e.code.reason(), error = %shown, "run failed");
                (
                    RunStatus::Failed,
                    Some(RunError { code: e.code.reason().into(), message: e.message }),
                    None,
                    false,
                )
            }
        };
        if !appended {
            let error = error.as_ref().expect("a stop or failure carries its error");
            let factory = ChunkFactory::new(&ctx.key.run, &ctx.thread_id, chunk::now_ms);
            let chunk = factory.run_error(&error.message, &error.code);
            if let Err(Ending::Superseded(why)) = self.append_last(ctx, &[encode_chunk(&chunk)]).await {
                info!(run_id = %ctx.key.run, reason = %why, "superseded before the terminal chunk; writing nothing");
                return;
            }
        }
        // However the run ended, its record carries what the broker metered
        // (marked so, for the tenant's daily budget).
        let usage = match (usage, self.metered(ctx).await) {
            (Some(reported), Some(_)) => Some(daily::marked(reported)),
            (None, Some(metered)) => Some(daily::marked(shared::chunk::usage_to_json(&metered))),
            (usage, None) => usage,
        };
        let session_id = ctx.session.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let finish = RunFinish { status, error, usage, finished_at: Timestamp::now(), session_id };
        let terminal_write = tracing::info_span!("store.finish", status = %status);
        let finished = self.write_finish(ctx, finish).instrument(terminal_write).await;
        match finished {
            Ok(_) | Err(GaveUp::Failed(store::Error::RunTerminal { .. })) => {}
            Err(GaveUp::Failed(store::Error::Fenced { .. })) => {
                info!(run_id = %ctx.key.run, "superseded before the terminal status; writing nothing");
                return;
            }
            // The record stays running: a successor or the reaper closes it.
            Err(GaveUp::Failed(e)) => {
                warn!(run_id = %ctx.key.run, error = %e, "could not write the terminal status");
                return;
            }
            Err(GaveUp::Interrupted(why)) => {
                info!(run_id = %ctx.key.run, ending = ending_name(&why), "the terminal status is left to a successor");
                return;
            }
        }
        if let Err(e) = cx.stores.events.close(&ctx.key).await {
            warn!(run_id = %ctx.key.run, error = %e, "could not close the run's log");
        }
        info!(run_id = %ctx.key.run, status = %status, "run finished");
        crate::metrics::runs().finished(status.as_str());
        let Some(key) = key else { return };
        if status == RunStatus::Completed
            && let Err(e) = self.checkpoint(ctx, &key).await
        {
            warn!(run_id = %ctx.key.run, error = %e, "could not save the checkpoint after the run");
        }
        // A stopped run's sandbox went with its command already.
        if status != RunStatus::Aborted && self.destroys_after_the_run(ctx).await {
            if let Err(e) = self.inner.sandbox.destroy(&ctx.key.tenant, &key).await
                && !e.is_not_found()
            {
                warn!(run_id = %ctx.key.run, sandbox_key = %key, error = %e, "destroy_on_complete failed");
            }
            return;
        }
        self.drop_journal(ctx, &key).await;
    }

    /// The run's metered usage, `None` when no answer was metered: as the
    /// pump left it, else (a drive that ended before its pump) from the
    /// stored log.
    async fn metered(&self, ctx: &DriveCtx) -> Option<shared::proto::v1::Usage> {
        let known = *ctx.usage.lock().unwrap_or_else(|e| e.into_inner());
        let tally = match known {
            Some(tally) => tally,
            None => checkpoints(stored_log(ctx, self.inner.ctx.stores.events.clone())).await.ok()?.1,
        };
        tally.metered().then(|| tally.usage(None))
    }

    async fn sandbox_key(&self, ctx: &DriveCtx) -> Option<String> {
        let cx = &self.inner.ctx;
        cx.stores.runs.get(&ctx.key).await.ok()?.sandbox_key
    }

    /// Whether the run's sandbox goes now that the run has ended, completed
    /// or failed: as the run's definition says (`destroy_on_complete`),
    /// however the run ended and whichever drive ended it (an `attach` from
    /// another process, a successor replica: neither ensured the sandbox).
    async fn destroys_after_the_run(&self, ctx: &DriveCtx) -> bool {
        let sandbox = &self.inner.sandbox;
        let of = |d: &shared::proto::v1::SandboxDefinition| {
            d.lifecycle.as_ref().is_some_and(|l| l.destroy_on_complete)
        };
        match ctx.definition.get() {
            Some(definition) => of(definition),
            None => match sandbox.definition(&ctx.key.tenant, &ctx.spec.definition_id).await {
                Ok(definition) => of(&definition),
                Err(e) => {
                    warn!(run_id = %ctx.key.run, error = %e, "cannot read the run's definition: its sandbox is kept");
                    false
                }
            },
        }
    }

    async fn checkpoint(&self, ctx: &DriveCtx, key: &str) -> Result<(), crate::sandbox::Error> {
        let cx = &self.inner.ctx;
        let sandbox = &self.inner.sandbox;
        // A drive that found its log complete never launched: read it now.
        let definition = match ctx.definition.get() {
            Some(definition) => definition,
            None => &sandbox.definition(&ctx.key.tenant, &ctx.spec.definition_id).await?,
        };
        let live = sandbox.agent(&ctx.key.tenant, key).await?;
        let session = ctx.session.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(session) = session.filter(|_| crate::snapshot::enabled(definition)) {
            // Into the workspace, for the checkpoint to carry it along, with
            // the PATH the run had (OpenCode's export runs the CLI).
            let (program, run_env) = (&ctx.spec.program, &ctx.spec.session_env);
            let path = if ctx.harness.carry_runs_the_cli() {
                sandbox.run_path(&live, ctx.harness, program, run_env).await.0
            } else {
                None
            };
            let env = session::carry_env(&live.env, run_env, path.as_deref());
            let (way, cwd) = (Carry::Export, &ctx.spec.cwd);
            match session::carry(&live.agent, ctx.harness, way, &session, cwd, program, env).await {
                Ok(true) => debug!(run_id = %ctx.key.run, %session, "session copied for the checkpoint"),
                Ok(false) => {}
                Err(e) => {
                    warn!(run_id = %ctx.key.run, error = %e, "could not copy the session for the checkpoint")
                }
            }
        }
        let saved = crate::snapshot::checkpoint_after_run(
            &cx.stores,
            &live.agent,
            &ctx.key.tenant,
            &ctx.thread_id,
            ctx.key.run.as_str(),
            definition,
            &live.secrets,
            sandbox.snapshot_limits(),
        )
        .await?;
        if let Some(checkpoint) = saved {
            info!(run_id = %ctx.key.run, checkpoint = ?checkpoint, "checkpoint saved after the run");
        }
        Ok(())
    }

    /// The journal of a terminal run is no longer needed.
    async fn drop_journal(&self, ctx: &DriveCtx, key: &str) {
        let Some(live) = self.inner.sandbox.live(key) else { return };
        let request = agent::DeleteJournalsRequest { run_ids: vec![ctx.key.run.to_string()] };
        if let Err(status) = live.agent.journal().delete_journals(request).await {
            debug!(run_id = %ctx.key.run, error = %status.message(), "could not delete the journal");
        }
    }
}
