//! Driving one run: sandbox, journal, translation, alignment, appends, and
//! exactly one way to end.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::ExponentialBuilder;
use futures::{FutureExt, StreamExt};
use prost::Message;
use shared::chunk::{self, ChunkFactory, FILE_CHANGED, SANDBOX_FILE};
use shared::error::{Error as WireError, ErrorCode};
use shared::proto::agent::v1 as agent;
use shared::proto::v1::{Chunk, ChunkType};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::align::Aligner;
use super::coalesce::Coalesced;
use super::egress::{ModelHealth, RunEgress};
use super::retry::{GaveUp, Interrupts, retry};
use super::session;
use super::{Error, RunSpec, Runs, StopReason};
use crate::agent::AgentClient;
use crate::egress::{Carriers, Connection};
use crate::harness::session::Carry;
use crate::harness::{CommandSpec, Harness, Translator};
use crate::lease::Lease;
use crate::provision::Masks;
use crate::provision::Progress;
use crate::provision::Secrets;
use crate::sandbox::EnsureInput;
use crate::store::{self, LogWriter, NewChunk, RunError, RunFinish, RunKey, RunStatus, RunUpdate, Timestamp};

/// `sandbox.file` chunks allowed in a row between two translated chunks:
/// kept under the aligner's limit of out-of-band chunks in a row, so a
/// successor can always skip them. Further file events in the same gap are
/// dropped (counted in the log).
const FILE_EVENT_BUDGET: usize = 48;
/// The longest pause between follows that fail or break.
const FOLLOW_PAUSE_MAX: Duration = Duration::from_secs(5);
/// `file.changed` chunks after a run, at most (the rest are summarized in a
/// `harness.warning`).
const MAX_CHANGED_FILES: usize = 40;
/// Bytes of one file's diff kept in its `file.changed` chunk.
const MAX_DIFF_BYTES: usize = 64 << 10;
/// Store writes that fail are retried this many times before the run fails.
const STORE_ATTEMPTS: usize = 5;

/// What a fresh run needs before its journal exists.
pub(crate) struct FreshStart {
    pub input: EnsureInput,
    pub command: CommandSpec,
    pub progress: Progress,
    /// `harness.warning`s decided before the run started.
    pub notes: Vec<String>,
    /// For when the ensure does not resume the thread's sandbox: `command`
    /// continues a session whose files lived there.
    pub unless_resumed: Option<Unresumed>,
}

/// What a run that continues a session does in a sandbox that is not the
/// one the session was left in.
pub(crate) struct Unresumed {
    /// Starts a new session instead.
    pub fresh: CommandSpec,
    /// Says so, as a `harness.warning`.
    pub note: String,
    /// The session, which a checkpoint restored into the new sandbox may
    /// carry.
    pub session: String,
}

/// One drive: who drives, under which epoch, for which run.
pub(crate) struct DriveCtx {
    /// The run (run ids are per tenant: the tenant is part of its name).
    pub key: RunKey,
    pub thread_id: String,
    pub spec: RunSpec,
    pub harness: Harness,
    pub sentinel_key: Vec<u8>,
    pub writer: LogWriter,
    pub lease: Lease,
    /// What ends this drive's pauses: the server's shutdown, `lease.lost()`
    /// and the drive's stop.
    pub(super) interrupts: Interrupts,
    /// The harness session the translation last reported (replays
    /// included, so a successor knows it too); recorded with the run's end.
    pub(super) session: std::sync::Mutex<Option<String>>,
}

/// How a drive ended.
#[derive(Debug)]
pub(crate) enum Ending {
    /// The journal's sentinel was read.
    Exited { terminal: Chunk },
    /// Cancelled, or the client of a run that does not detach left.
    Stopped(StopReason),
    /// A failure: the run fails with it.
    Failed(Error),
    /// The server is shutting down: another replica takes over.
    Detach,
    /// Lease lost or fenced by a successor: write nothing more.
    Superseded(String),
}

/// The state of the pump between journal reads.
struct Pump {
    translator: Translator,
    aligner: Aligner,
    factory: ChunkFactory,
    /// Translated terminal chunk, held back until the exit is known so that
    /// `file.changed` chunks come before it.
    held_terminal: Option<Chunk>,
    from_byte: u64,
    /// Out-of-band chunks appended since the last translated one.
    out_of_band_run: usize,
    dropped_file_events: u64,
    redactor: Masks,
}

impl Runs {
    /// Drive `ctx`'s run to one ending and act on it. Never panics out, never
    /// leaves the run `running` unless another driver (or a shutdown
    /// detach) is meant to take it on.
    pub(crate) async fn drive(self, ctx: DriveCtx, fresh: Option<FreshStart>) {
        let started = Instant::now();
        let _active = crate::metrics::drives().start();
        let ending = match AssertUnwindSafe(self.drive_to_end(&ctx, fresh)).catch_unwind().await {
            Ok(ending) => ending,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Ending::Failed(Error::Panicked(what))
            }
        };
        info!(run_id = %ctx.key.run, epoch = ctx.writer.epoch(), ending = ?ending_name(&ending),
            elapsed_ms = started.elapsed().as_millis() as u64, "drive ended");
        self.conclude(&ctx, ending).await;
        self.unregister(&ctx.key);
        let DriveCtx { lease, .. } = ctx;
        let _ = lease.release().await;
    }

    async fn drive_to_end(&self, ctx: &DriveCtx, fresh: Option<FreshStart>) -> Ending {
        let cx = &self.inner.ctx;
        let (key, agent, secrets) = match fresh {
            Some(start) => match self.start_fresh(ctx, start).await {
                Ok(started) => started,
                Err(ending) => return ending,
            },
            None => {
                let record = match cx.stores.runs.get(&ctx.key).await {
                    Ok(r) => r,
                    Err(e) => return Ending::Failed(e.into()),
                };
                match self.inner.options.quiet.wait(cx.stores.events.as_ref(), &ctx.key).await {
                    Ok(0) => {}
                    Ok(grew) => info!(run_id = %ctx.key.run, grew, "the stored log grew after the claim"),
                    Err(e) => return Ending::Failed(e),
                }
                let last = match cx.stores.events.last(&ctx.key).await {
                    Ok(last) => last.as_ref().map(decode_chunk).transpose(),
                    Err(e) => Err(e.into()),
                };
                // Its driver died between the terminal chunk and the status:
                // the run is over, whatever its journal or sandbox became,
                // and only the record is left to finish.
                match last {
                    Ok(Some(terminal)) if chunk::is_terminal(&terminal) => {
                        info!(run_id = %ctx.key.run, "the stored log is complete; finishing the record");
                        return Ending::Exited { terminal };
                    }
                    Ok(_) => {}
                    Err(e) => return Ending::Failed(e),
                }
                if record.cancel_requested {
                    return Ending::Stopped(StopReason::Cancel);
                }
                let Some(key) = record.sandbox_key else {
                    return Ending::Failed(Error::SandboxNeverReady);
                };
                match self.reconnect(ctx, &key).await {
                    Ok((agent, secrets)) => (key, agent, secrets),
                    Err(ending) => return ending,
                }
            }
        };
        // The stored log is read after the start (a fresh run's accepted
        // and warning chunks are in it), page by page as the replay goes.
        let aligner = match Aligner::of_log(cx.stores.events.clone(), ctx.key.clone()).await {
            Ok(aligner) => aligner,
            Err(e) => return Ending::Failed(e),
        };
        self.pump(ctx, &key, agent, &secrets, aligner).await
    }

    /// Ensure the sandbox and start the journaled command.
    async fn start_fresh(
        &self,
        ctx: &DriveCtx,
        start: FreshStart,
    ) -> Result<(String, AgentClient, Arc<Secrets>), Ending> {
        let cx = &self.inner.ctx;
        let FreshStart { input, mut command, progress, mut notes, unless_resumed } = start;
        let workspace = input.definition.workspace.clone().unwrap_or_default();
        let journal_cap = cx.lifecycle.policy.journal_cap(&input.definition);
        let definition = input.definition.clone();
        let ensured = self
            .inner
            .ctx
            .lifecycle
            .ensure(&cx.stores, &cx.leases, input, &progress)
            .await
            .map_err(|e| Ending::Failed(e.into()))?;
        drop(progress); // ends the progress part of StartRun's stream
        let restored = !ensured.restored_checkpoint_id.is_empty();
        let unresumed =
            unless_resumed.filter(|_| ensured.outcome() != shared::proto::v1::EnsureOutcome::Resumed);
        let key = ensured.sandbox_id;
        let update = RunUpdate { sandbox_key: Some(Some(key.clone())), ..Default::default() };
        cx.stores.runs.update(&ctx.key, update).await.map_err(|e| Ending::Failed(e.into()))?;
        let live = self
            .inner
            .ctx
            .lifecycle
            .agent(&cx.stores, &ctx.key.tenant, &key)
            .await
            .map_err(|e| Ending::Failed(e.into()))?;
        if ctx.interrupts.drive.stop.is_cancelled() {
            // Stopped while the sandbox was being made: nothing to start.
            return Ok((key, live.agent, live.secrets));
        }
        let toolchains = cx.lifecycle.toolchains.as_ref();
        let program = command.cli_program();
        let (path, missing) = super::toolchain::run_path(
            toolchains,
            ctx.harness,
            program,
            &command.env,
            live.provider,
            &live.agent,
        )
        .await;
        if let Some(u) = unresumed {
            // A checkpoint restored into the new sandbox may carry the
            // session: put it back where the CLI looks for it.
            let env = session::carry_env(&live.env, &ctx.spec.session_env, path.as_deref());
            let carried = restored
                && match session::carry(
                    &live.agent,
                    ctx.harness,
                    Carry::Import,
                    &u.session,
                    &ctx.spec.cwd,
                    &ctx.spec.program,
                    env,
                )
                .await
                {
                    Ok(found) => found,
                    Err(e) => {
                        warn!(run_id = %ctx.key.run, error = %e, "could not restore the thread's session");
                        false
                    }
                };
            if carried {
                info!(run_id = %ctx.key.run, session = %u.session, "session restored from the checkpoint");
            } else {
                command = u.fresh;
                notes.push(u.note);
            }
        }
        // Files that carry secrets are written for each run, for its harness
        // only; what the harness cannot use is a warning, not an error.
        let mut warnings = notes;
        warnings.append(&mut command.warnings);
        warnings.extend(missing);
        warnings.extend(
            crate::workspace::project_for_run(&live.agent, &workspace, &live.secrets, ctx.harness)
                .await
                .map_err(|e| Ending::Failed(Error::Projecting(e)))?,
        );
        if !warnings.is_empty() {
            let factory = ChunkFactory::new(&ctx.key.run, &ctx.thread_id, chunk::now_ms);
            let chunks: Vec<Chunk> = warnings.iter().map(|w| factory.warning(w, None)).collect();
            self.append(ctx, &chunks).await?;
        }
        // The model broker's URL and placeholder key, and the proxy.
        let private_ok = cx.lifecycle.policy.egress_private_addresses();
        if let Some(egress) = RunEgress::of(&definition, ctx.harness, private_ok).map_err(Ending::Failed)? {
            super::egress::point(&egress, &definition, ctx.harness, &live.agent, &mut command)
                .await
                .map_err(Ending::Failed)?;
        }
        let mut request = command.start_run_request(&ctx.key.run, &ctx.spec.cwd, ctx.sentinel_key.clone());
        // Enforced by the sandbox agent, so it holds while no replica drives.
        request.max_journal_bytes = journal_cap;
        // Model keys stay with the agent.
        for (name, value) in live.process_secrets() {
            request.env.entry(name.clone()).or_insert_with(|| value.expose().to_string());
        }
        // The sandbox's SetEnv variables, below the harness's and the secrets.
        for (name, value) in &live.env {
            request.env.entry(name.clone()).or_insert_with(|| value.clone());
        }
        // The toolchain's CLIs, unless the run sets its own PATH.
        if let Some(path) = path {
            request.env.entry("PATH".into()).or_insert(path);
        }
        live.agent
            .journal()
            .start_run(request)
            .await
            .map_err(|status| Ending::Failed(Error::StartRefused(status)))?;
        Ok((key, live.agent, live.secrets))
    }

    /// A connected agent for the sandbox, retried within the budget.
    async fn reconnect(&self, ctx: &DriveCtx, key: &str) -> Result<(AgentClient, Arc<Secrets>), Ending> {
        let cx = &self.inner.ctx;
        let deadline = Instant::now() + self.inner.options.reconnect_budget;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(2))
            .without_max_times();
        let live = retry(
            ctx.interrupts.clone(),
            backoff,
            || cx.lifecycle.agent(&cx.stores, &ctx.key.tenant, key),
            |e: &crate::sandbox::Error| !e.is_not_found() && Instant::now() < deadline,
            |e, _| debug!(run_id = %ctx.key.run, error = %e, "sandbox agent unreachable; retrying"),
        )
        .await;
        match live {
            Ok(live) => Ok((live.agent, live.secrets)),
            Err(GaveUp::Failed(e)) => Err(Ending::Failed(Error::Unreachable(e))),
            Err(GaveUp::Interrupted(ending)) => Err(ending),
        }
    }

    /// Follow the journal from byte 0 to its sentinel, appending what the
    /// log does not hold yet.
    async fn pump(
        &self,
        ctx: &DriveCtx,
        key: &str,
        mut agent: AgentClient,
        secrets: &Secrets,
        aligner: Aligner,
    ) -> Ending {
        let cx = &self.inner.ctx;
        let redactor = match crate::provision::redactor(secrets) {
            Ok(r) => r,
            Err(e) => return Ending::Failed(e.into()),
        };
        let mut pump = Pump {
            translator: self.translator(ctx),
            aligner,
            factory: ChunkFactory::new(&ctx.key.run, &ctx.thread_id, chunk::now_ms),
            held_terminal: None,
            from_byte: 0,
            out_of_band_run: 0,
            dropped_file_events: 0,
            redactor,
        };
        let (file_tx, mut file_rx) = mpsc::channel::<Vec<agent::FileEvent>>(64);
        let watcher = tokio::spawn(watch_files(agent.clone(), ctx.spec.cwd.clone(), file_tx));
        // The sandbox's egress rides carriers this driver keeps open; a
        // successor opens its own.
        let egress = match self.run_egress(ctx).await {
            Ok(egress) => egress,
            Err(e) => return Ending::Failed(e),
        };
        let (net_tx, mut net_rx) = mpsc::unbounded_channel::<Connection>();
        let carry = |agent: &AgentClient| {
            egress.as_ref().map(|e| Carriers::open(agent.clone(), e.plan.clone(), net_tx.clone()))
        };
        let mut carriers = carry(&agent);
        let mut health = ModelHealth::default();
        // Between follows that fail or break without a line: a journal the
        // agent keeps refusing must not turn into a tight loop, and many
        // drives whose agent restarted must not come back in step.
        let mut pause = follow_backoff();
        let mut secrets_missing_since = None;
        let ending = 'follow: loop {
            let request = agent::FollowRequest {
                run_id: ctx.key.run.to_string(),
                from_byte: pump.from_byte,
                sentinel_key: ctx.sentinel_key.clone(),
                // Agents think for minutes without a byte; liveness is
                // judged by probing the supervisor instead.
                first_byte_timeout_ms: Some(0),
            };
            let mut stream = match agent.journal().follow(request).await {
                Ok(s) => Coalesced::new(s.into_inner()),
                Err(status) if status.code() == tonic::Code::NotFound => {
                    break Ending::Failed(Error::NoJournal);
                }
                Err(status) if WireError::from_status(&status).code == ErrorCode::SecretsMissing => {
                    // The agent restarted without the values: hand back what
                    // this replica holds, else wait for an ensure to.
                    let since = *secrets_missing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.inner.options.reconnect_budget {
                        break Ending::Failed(Error::SecretsMissing(status));
                    }
                    if let Err(e) = crate::provision::hand_over(&agent, secrets).await {
                        debug!(run_id = %ctx.key.run, error = %e.message(), "handing the secret values back failed");
                    }
                    if let Some(ending) = ctx.interrupts.during(Duration::from_millis(500)).await {
                        break ending;
                    }
                    continue;
                }
                Err(status) => {
                    if let Some(e) = Error::over_a_journal_bound(&status) {
                        break Ending::Failed(e);
                    }
                    debug!(run_id = %ctx.key.run, error = %status.message(), "follow failed; reconnecting");
                    if let Some(ending) =
                        ctx.interrupts.during(pause.next().unwrap_or(FOLLOW_PAUSE_MAX)).await
                    {
                        break ending;
                    }
                    match self.reconnect(ctx, key).await {
                        Ok((a, _)) => {
                            agent = a;
                            carriers = carry(&agent);
                        }
                        Err(ending) => break ending,
                    }
                    continue;
                }
            };
            let mut cancel_poll = tokio::time::interval(self.inner.options.cancel_poll);
            cancel_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_activity = Instant::now();
            let mut unknown_probes = 0u32;
            loop {
                tokio::select! {
                    biased;
                    _ = ctx.interrupts.shutdown.cancelled() => break 'follow Ending::Detach,
                    _ = ctx.interrupts.lease_lost.cancelled() => {
                        break 'follow Ending::Superseded("the run's lease was lost".into());
                    }
                    _ = ctx.interrupts.drive.stop.cancelled() => {
                        let reason = ctx.interrupts.drive.reason().unwrap_or(StopReason::Cancel);
                        break 'follow Ending::Stopped(reason);
                    }
                    _ = cancel_poll.tick() => {
                        match cx.stores.runs.get(&ctx.key).await {
                            Ok(r) if r.cancel_requested => break 'follow Ending::Stopped(StopReason::Cancel),
                            Ok(r) if r.driver_epoch != ctx.writer.epoch() => {
                                break 'follow Ending::Superseded(format!("run claimed at epoch {}", r.driver_epoch));
                            }
                            Ok(_) => {}
                            Err(e) => debug!(run_id = %ctx.key.run, error = %e, "cancel check failed"),
                        }
                        if let Some(e) = egress
                            .as_ref()
                            .and_then(|e| health.expired(e.unreachable_after, e.upstream.as_ref()))
                        {
                            break 'follow Ending::Failed(e);
                        }
                        if last_activity.elapsed() >= self.inner.options.liveness_probe {
                            last_activity = Instant::now();
                            match probe(&agent, ctx).await {
                                Some(agent::RunState::Unknown) => unknown_probes += 1,
                                Some(_) => unknown_probes = 0,
                                None => {}
                            }
                            if unknown_probes >= 2 {
                                break 'follow Ending::Failed(Error::SupervisorGone);
                            }
                        }
                    }
                    Some(events) = file_rx.recv() => {
                        if let Err(ending) = self.file_events(ctx, &mut pump, events).await {
                            break 'follow ending;
                        }
                    }
                    Some(connection) = net_rx.recv() => {
                        let upstream = egress.as_ref().and_then(|e| e.upstream.as_ref());
                        let chunks = health.observe(&connection, upstream, &pump.factory);
                        if let Err(ending) = self.out_of_band(ctx, &mut pump, chunks).await {
                            break 'follow ending;
                        }
                    }
                    message = stream.next() => match message {
                        Some(Ok(agent::FollowResponse { event: Some(agent::follow_response::Event::Lines(lines)) })) => {
                            last_activity = Instant::now();
                            unknown_probes = 0;
                            pause = follow_backoff();
                            if let Err(ending) = self.lines(ctx, &mut pump, lines.lines).await {
                                break 'follow ending;
                            }
                        }
                        Some(Ok(agent::FollowResponse { event: Some(agent::follow_response::Event::Exit(exit)) })) => {
                            let stderr = String::from_utf8_lossy(&exit.stderr_tail).into_owned();
                            break 'follow self.exited(ctx, &mut pump, &agent, exit.exit_code, &stderr).await;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(status)) => {
                            if let Some(e) = Error::over_a_journal_bound(&status) {
                                break 'follow Ending::Failed(e);
                            }
                            debug!(run_id = %ctx.key.run, error = %status.message(), "follow broke; reconnecting");
                            break;
                        }
                        None => break,
                    },
                }
            }
            if let Some(ending) = ctx.interrupts.during(pause.next().unwrap_or(FOLLOW_PAUSE_MAX)).await {
                break ending;
            }
            match self.reconnect(ctx, key).await {
                Ok((a, _)) => {
                    agent = a;
                    carriers = carry(&agent);
                }
                Err(ending) => break ending,
            }
        };
        watcher.abort();
        if matches!(ending, Ending::Stopped(StopReason::Cancel)) {
            self.deny_pending(ctx, &mut pump, &agent).await;
        }
        drop(carriers);
        if pump.dropped_file_events > 0 {
            info!(run_id = %ctx.key.run, dropped = pump.dropped_file_events, "file events over the per-gap budget were dropped");
        }
        ending
    }

    /// A cancelled run's waiting requests are denied, and the denials
    /// recorded before the run's end: the agent writes them to the journal,
    /// read here once more.
    async fn deny_pending(&self, ctx: &DriveCtx, pump: &mut Pump, agent: &AgentClient) {
        let request = agent::DenyPendingRequest {
            run_id: ctx.key.run.to_string(),
            sentinel_key: ctx.sentinel_key.clone(),
            by: shared::requests::AnsweredBy::Cancel.as_str().into(),
            message: "the run was cancelled".into(),
        };
        let denied = match agent.requests().deny_pending(request).await {
            Ok(r) => r.into_inner().request_ids,
            Err(status) => {
                debug!(run_id = %ctx.key.run, error = %status.message(), "denying the waiting requests failed");
                return;
            }
        };
        if denied.is_empty() {
            return;
        }
        info!(run_id = %ctx.key.run, denied = denied.len(), "waiting requests denied by the cancel");
        let read = agent::ReadJournalRequest {
            run_id: ctx.key.run.to_string(),
            from_byte: pump.from_byte,
            max_bytes: 0,
            sentinel_key: ctx.sentinel_key.clone(),
        };
        match agent.journal().read_journal(read).await {
            Ok(r) => {
                if let Err(e) = self.lines(ctx, pump, r.into_inner().lines).await {
                    debug!(run_id = %ctx.key.run, ending = ending_name(&e), "recording the denials failed");
                }
            }
            Err(status) => {
                debug!(run_id = %ctx.key.run, error = %status.message(), "reading the denials failed")
            }
        }
    }

    fn translator(&self, ctx: &DriveCtx) -> Translator {
        ctx.harness.translator_for(ctx.spec.output, &ctx.key.run, &ctx.thread_id, chunk::now_ms)
    }

    /// Translate, align and append one batch of journal lines.
    async fn lines(
        &self,
        ctx: &DriveCtx,
        pump: &mut Pump,
        lines: Vec<agent::JournalLine>,
    ) -> Result<(), Ending> {
        let mut batch = Vec::new();
        crate::metrics::journal().read(lines.iter().map(|l| l.data.len() as u64 + 1).sum());
        for line in &lines {
            let chunks = if line.sealed {
                pump.translator.feed_record(&line.data)
            } else {
                pump.translator.feed(&line.data)
            };
            for c in chunks {
                if let Some(session) = session_of(ctx.harness, &c) {
                    *ctx.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(session);
                }
                if chunk::is_terminal(&c) {
                    pump.held_terminal = Some(c);
                } else if pump.aligner.offer(&c).await.map_err(Ending::Failed)? {
                    batch.push(c);
                }
            }
        }
        if let Some(last) = lines.last() {
            pump.from_byte = last.end_offset;
        }
        if !batch.is_empty() {
            pump.out_of_band_run = 0;
            self.append(ctx, &batch).await?;
        }
        Ok(())
    }

    async fn file_events(
        &self,
        ctx: &DriveCtx,
        pump: &mut Pump,
        events: Vec<agent::FileEvent>,
    ) -> Result<(), Ending> {
        let mut batch = Vec::new();
        for e in events {
            let kind = match agent::FileEventType::try_from(e.r#type) {
                Ok(agent::FileEventType::Create) => "create",
                Ok(agent::FileEventType::Change) => "change",
                Ok(agent::FileEventType::Delete) => "delete",
                Ok(agent::FileEventType::Rename) => "rename",
                _ => continue,
            };
            if pump.out_of_band_run + batch.len() >= FILE_EVENT_BUDGET {
                pump.dropped_file_events += 1;
                continue;
            }
            let value = serde_json::json!({"type": kind, "path": e.path, "timestamp": e.timestamp_ms});
            batch.push(pump.factory.custom(SANDBOX_FILE, &value));
        }
        self.out_of_band(ctx, pump, batch).await
    }

    /// Append chunks the server adds outside translation (file and network
    /// events), within the per-gap budget.
    async fn out_of_band(&self, ctx: &DriveCtx, pump: &mut Pump, batch: Vec<Chunk>) -> Result<(), Ending> {
        if batch.is_empty() {
            return Ok(());
        }
        if pump.out_of_band_run + batch.len() > FILE_EVENT_BUDGET {
            pump.dropped_file_events += batch.len() as u64;
            return Ok(());
        }
        pump.out_of_band_run += batch.len();
        // Out of band: never offered to the aligner (a replay does not
        // produce them; the aligner skips the stored ones).
        if pump.aligner.caught_up() { self.append(ctx, &batch).await } else { Ok(()) }
    }

    /// The run's egress, from its definition as stored (a successor reads
    /// it too); `None` when the definition has none.
    async fn run_egress(&self, ctx: &DriveCtx) -> Result<Option<RunEgress>, Error> {
        let cx = &self.inner.ctx;
        let stored = match cx.stores.definitions.get(&ctx.key.tenant, &ctx.spec.definition_id).await {
            Ok(stored) => stored,
            // Deleted since: the run goes on without egress.
            Err(store::Error::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let definition = crate::sandbox::definition::from_stored(&stored.body)
            .map_err(|e| Error::Egress(e.to_string()))?;
        RunEgress::of(&definition, ctx.harness, cx.lifecycle.policy.egress_private_addresses())
    }

    /// The sentinel was read: the rest of the translation, the workspace's
    /// changes, then the terminal chunk.
    async fn exited(
        &self,
        ctx: &DriveCtx,
        pump: &mut Pump,
        agent: &AgentClient,
        exit_code: i32,
        stderr_tail: &str,
    ) -> Ending {
        let mut batch = Vec::new();
        for c in pump.translator.finish(exit_code, stderr_tail) {
            if chunk::is_terminal(&c) {
                pump.held_terminal.get_or_insert(c);
            } else {
                match pump.aligner.offer(&c).await {
                    Ok(true) => batch.push(c),
                    Ok(false) => {}
                    Err(e) => return Ending::Failed(e),
                }
            }
        }
        for c in changed_files(agent, &ctx.spec.cwd, &pump.factory, &pump.redactor).await {
            match pump.aligner.offer(&c).await {
                Ok(true) => batch.push(c),
                Ok(false) => {}
                Err(e) => return Ending::Failed(e),
            }
        }
        let terminal = pump.held_terminal.take().unwrap_or_else(|| {
            // Translator::finish always yields one; keep the run closable anyway.
            pump.factory.run_error("the run ended without a terminal event", "INTERNAL")
        });
        match pump.aligner.offer(&terminal).await {
            Ok(true) => batch.push(terminal.clone()),
            Ok(false) => {}
            Err(e) => return Ending::Failed(e),
        }
        if let Err(e) = pump.aligner.finish().await {
            return Ending::Failed(e);
        }
        if let Err(ending) = self.append(ctx, &batch).await {
            return ending;
        }
        Ending::Exited { terminal }
    }

    /// Append chunks under this drive's epoch, retrying store hiccups.
    async fn append(&self, ctx: &DriveCtx, chunks: &[Chunk]) -> Result<(), Ending> {
        let encoded: Vec<NewChunk> = chunks.iter().map(encode_chunk).collect();
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(400))
            .with_max_delay(Duration::from_secs(10))
            .with_max_times(STORE_ATTEMPTS - 1);
        let mut attempt = 0;
        let appended = retry(
            ctx.interrupts.clone(),
            backoff,
            || ctx.writer.append(&encoded),
            is_transient,
            |e, _| {
                attempt += 1;
                warn!(run_id = %ctx.key.run, attempt, error = %e, "append failed; retrying");
            },
        )
        .await;
        match appended {
            Ok(_) => Ok(()),
            Err(GaveUp::Failed(e @ (store::Error::Fenced { .. } | store::Error::LogClosed(_)))) => {
                Err(Ending::Superseded(e.to_string()))
            }
            Err(GaveUp::Failed(e)) => Err(Ending::Failed(e.into())),
            Err(GaveUp::Interrupted(ending)) => Err(ending),
        }
    }

    /// Act on how the drive ended: terminal chunk, status, log, sandbox.
    /// Stop the run's command. The CLI dies with its sandbox: destroying it
    /// is the one stop every provider can do, also for a wedged agent.
    async fn stop_command(&self, ctx: &DriveCtx, key: Option<&str>) {
        let cx = &self.inner.ctx;
        if let Some(key) = key
            && let Err(e) = cx.lifecycle.destroy(&cx.stores, &cx.leases, &ctx.key.tenant, key).await
            && !e.is_not_found()
        {
            warn!(run_id = %ctx.key.run, sandbox_key = %key, error = %e, "could not destroy the sandbox of a stopped run");
        }
    }

    async fn conclude(&self, ctx: &DriveCtx, ending: Ending) {
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
            if let Err(Ending::Superseded(why)) = self.append(ctx, &[chunk]).await {
                info!(run_id = %ctx.key.run, reason = %why, "superseded before the terminal chunk; writing nothing");
                return;
            }
        }
        let session_id = ctx.session.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let finish = RunFinish { status, error, usage, finished_at: Timestamp::now(), session_id };
        match cx.stores.runs.finish(&ctx.key, ctx.writer.epoch(), finish).await {
            Ok(_) | Err(store::Error::RunTerminal { .. }) => {}
            Err(store::Error::Fenced { .. }) => {
                info!(run_id = %ctx.key.run, "superseded before the terminal status; writing nothing");
                return;
            }
            Err(e) => {
                // The record stays running: a successor or the reaper closes it.
                warn!(run_id = %ctx.key.run, error = %e, "could not write the terminal status");
                return;
            }
        }
        if let Err(e) = cx.stores.events.close(&ctx.key).await {
            warn!(run_id = %ctx.key.run, error = %e, "could not close the run's log");
        }
        info!(run_id = %ctx.key.run, status = %status, "run finished");
        crate::metrics::runs().finished(status.as_str());
        let Some(key) = key else { return };
        if status == RunStatus::Completed {
            self.after_completion(ctx, &key).await;
        }
        self.drop_journal(ctx, &key).await;
    }

    async fn sandbox_key(&self, ctx: &DriveCtx) -> Option<String> {
        let cx = &self.inner.ctx;
        cx.stores.runs.get(&ctx.key).await.ok()?.sandbox_key
    }

    /// After a completed run: a portable checkpoint when the definition
    /// asks for them, then the sandbox goes when the definition says so.
    async fn after_completion(&self, ctx: &DriveCtx, key: &str) {
        if let Err(e) = self.checkpoint(ctx, key).await {
            warn!(run_id = %ctx.key.run, error = %e, "could not save the checkpoint after the run");
        }
        if self.inner.ctx.lifecycle.destroy_on_complete(key) == Some(true) {
            let cx = &self.inner.ctx;
            if let Err(e) =
                self.inner.ctx.lifecycle.destroy(&cx.stores, &cx.leases, &ctx.key.tenant, key).await
            {
                warn!(run_id = %ctx.key.run, sandbox_key = %key, error = %e, "destroy_on_complete failed");
            }
        }
    }

    async fn checkpoint(&self, ctx: &DriveCtx, key: &str) -> Result<(), crate::sandbox::Error> {
        let cx = &self.inner.ctx;
        let stored = cx.stores.definitions.get(&ctx.key.tenant, &ctx.spec.definition_id).await?;
        let definition = crate::sandbox::definition::from_stored(&stored.body)?;
        let live = self.inner.ctx.lifecycle.agent(&cx.stores, &ctx.key.tenant, key).await?;
        let session = ctx.session.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(session) = session.filter(|_| crate::snapshot::enabled(&definition)) {
            // Into the workspace, for the checkpoint to carry it along, with
            // the PATH the run had (OpenCode's export runs the CLI).
            let toolchains = cx.lifecycle.toolchains.as_ref();
            let (program, run_env) = (&ctx.spec.program, &ctx.spec.session_env);
            let path = if ctx.harness.carry_runs_the_cli() {
                let agent = &live.agent;
                super::toolchain::run_path(toolchains, ctx.harness, program, run_env, live.provider, agent)
                    .await
                    .0
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
            &definition,
            &live.secrets,
            cx.lifecycle.snapshot_limits(),
        )
        .await?;
        if let Some(checkpoint) = saved {
            info!(run_id = %ctx.key.run, checkpoint = ?checkpoint, "checkpoint saved after the run");
        }
        Ok(())
    }

    /// The journal of a terminal run is no longer needed.
    async fn drop_journal(&self, ctx: &DriveCtx, key: &str) {
        let Some(live) = self.inner.ctx.lifecycle.live(key) else { return };
        let request = agent::DeleteJournalsRequest { run_ids: vec![ctx.key.run.to_string()] };
        if let Err(status) = live.agent.journal().delete_journals(request).await {
            debug!(run_id = %ctx.key.run, error = %status.message(), "could not delete the journal");
        }
    }
}

/// The session a `<harness>.session-id` chunk reports.
fn session_of(harness: Harness, c: &Chunk) -> Option<String> {
    if c.r#type() != ChunkType::Custom || c.name != chunk::session_id_name(harness.name()) {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(&c.value_json).ok()?;
    value.get("session_id")?.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

fn ending_name(e: &Ending) -> &'static str {
    match e {
        Ending::Exited { .. } => "exited",
        Ending::Stopped(StopReason::Cancel) => "cancelled",
        Ending::Stopped(StopReason::Disconnected) => "disconnected",
        Ending::Failed(_) => "failed",
        Ending::Detach => "detached",
        Ending::Superseded(_) => "superseded",
    }
}

fn is_transient(e: &store::Error) -> bool {
    matches!(e, store::Error::Unavailable(_) | store::Error::Database(_))
}

/// How a chunk is stored: its protobuf encoding, kind = its type name.
pub(crate) fn encode_chunk(c: &Chunk) -> NewChunk {
    NewChunk::new(chunk::type_name(c.r#type()), c.encode_to_vec())
        .with_request(super::request_index::request_mark(c))
}

pub(crate) fn decode_chunk(stored: &store::StoredChunk) -> Result<Chunk, Error> {
    Chunk::decode(stored.payload.as_slice())
        .map_err(|e| Error::Corrupt(format!("stored chunk at offset {} does not decode: {e}", stored.offset)))
}

async fn probe(agent: &AgentClient, ctx: &DriveCtx) -> Option<agent::RunState> {
    let request =
        agent::ProbeExitRequest { run_id: ctx.key.run.to_string(), sentinel_key: ctx.sentinel_key.clone() };
    let response = agent.journal().probe_exit(request).await.ok()?.into_inner();
    agent::RunState::try_from(response.state).ok()
}

/// File events of the run's workspace while it runs, until the receiver
/// goes. Best effort: a sandbox that cannot watch yields no events.
async fn watch_files(agent: AgentClient, cwd: String, tx: mpsc::Sender<Vec<agent::FileEvent>>) {
    let request = agent::WatchRequest {
        path: if cwd.is_empty() { ".".into() } else { cwd },
        recursive: true,
        coalesce_ms: Some(100),
        ..Default::default()
    };
    let mut stream = match agent.watch().watch(request).await {
        Ok(s) => s.into_inner(),
        Err(status) => {
            debug!(error = %status.message(), "file watch unavailable");
            return;
        }
    };
    while let Some(Ok(message)) = stream.next().await {
        if let Some(agent::watch_response::Kind::Events(events)) = message.kind
            && tx.send(events.events).await.is_err()
        {
            return;
        }
    }
}

/// `git status` of the run's workspace after it ended, as `file.changed`
/// chunks (path, diff). Nothing when it is not a git work tree or git is
/// missing.
async fn changed_files(
    agent: &AgentClient,
    cwd: &str,
    factory: &ChunkFactory,
    redactor: &Masks,
) -> Vec<Chunk> {
    // NUL-separated: path, diff, path, diff, ... Untracked files diff
    // against /dev/null.
    const SCRIPT: &str = r#"git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 0
max=$1; limit=$2; n=0
printf 'total\0'
{ git -c core.quotepath=off diff --name-only HEAD 2>/dev/null || git -c core.quotepath=off diff --name-only; git -c core.quotepath=off ls-files --others --exclude-standard; } | sort -u > "${TMPDIR:-/tmp}/.sandhold-changed.$$"
printf '%s\0' "$(wc -l < "${TMPDIR:-/tmp}/.sandhold-changed.$$")"
while IFS= read -r f; do
  n=$((n+1)); [ "$n" -gt "$max" ] && break
  printf '%s\0' "$f"
  if git ls-files --error-unmatch -- "$f" >/dev/null 2>&1; then git -c core.quotepath=off diff HEAD -- "$f" 2>/dev/null | head -c "$limit"
  else git -c core.quotepath=off diff --no-index -- /dev/null "$f" 2>/dev/null | head -c "$limit"; fi
  printf '\0'
done < "${TMPDIR:-/tmp}/.sandhold-changed.$$"
rm -f "${TMPDIR:-/tmp}/.sandhold-changed.$$"
"#;
    let request = agent::ExecRequest {
        command: Some(agent::Command {
            kind: Some(agent::command::Kind::Argv(agent::Argv {
                args: vec![
                    "sh".into(),
                    "-c".into(),
                    SCRIPT.into(),
                    "sh".into(),
                    MAX_CHANGED_FILES.to_string(),
                    MAX_DIFF_BYTES.to_string(),
                ],
            })),
        }),
        cwd: cwd.to_owned(),
        timeout_ms: Some(30_000),
        // Masked by the agent, which holds the values also after a
        // takeover (this replica may never have had them).
        mask_secrets: true,
        ..Default::default()
    };
    let out = match agent.process().exec(request).await {
        Ok(r) => r.into_inner().stdout,
        Err(status) => {
            debug!(error = %status.message(), "git diff after the run failed");
            return Vec::new();
        }
    };
    let mut fields = out.split(|b| *b == 0).map(|f| String::from_utf8_lossy(f).into_owned());
    let total: usize = match (fields.next(), fields.next()) {
        (Some(t), Some(n)) if t == "total" => n.trim().parse().unwrap_or(0),
        _ => return Vec::new(), // not a git work tree
    };
    let rest: Vec<String> = fields.collect();
    let mut chunks = Vec::new();
    for pair in rest.chunks(2) {
        if let [path, diff] = pair {
            let value = serde_json::json!({"path": path, "diff": redactor.mask(diff)});
            chunks.push(factory.custom(FILE_CHANGED, &value));
        }
    }
    if total > chunks.len() {
        let message = format!("{} more changed files are not listed", total - chunks.len());
        chunks.push(factory.warning(&message, None));
    }
    chunks
}

/// Pauses between failed follows: from 100 ms doubling to
/// [`FOLLOW_PAUSE_MAX`], each with random jitter.
fn follow_backoff() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(FOLLOW_PAUSE_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}
