//! The pump: follow the journal from byte 0 to its sentinel (reconnecting
//! when a follow breaks), feed what it reads, watch the run's liveness and
//! its egress, and end on an interrupt.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::ExponentialBuilder;
use futures::StreamExt;
use shared::chunk::{self, ChunkFactory};
use shared::error::{Error as WireError, ErrorCode};
use shared::proto::agent::v1 as agent;
use tokio::sync::mpsc;
use tracing::{debug, info};

use super::ctx::DriveCtx;
use super::ending::{Ending, ending_name};
use super::feed::{Last, Pump};
use super::files::watch_files;
use super::outbox::Outbox;
use crate::agent::AgentClient;
use crate::egress::{Carriers, Connection};
use crate::provision::Secrets;
use crate::runs::Runs;
use crate::runs::align::Aligner;
use crate::runs::coalesce::Coalesced;
use crate::runs::egress::{ModelHealth, RunEgress};
use crate::runs::error::Error;
use crate::runs::replica::StopReason;
use crate::runs::usage::Tally;

/// The longest pause between follows that fail or break.
const FOLLOW_PAUSE_MAX: Duration = Duration::from_secs(5);
/// How often a silent journal's liveness and the model upstream's health
/// are judged. Never a read of the run's record: cancels arrive on the
/// cancel bus, and a successor's claim ends this drive through its lease.
const HEALTH_EVERY: Duration = Duration::from_secs(1);

impl Runs {
    /// Follow the journal from byte 0 to its sentinel, appending what the
    /// log does not hold yet.
    #[tracing::instrument(name = "run.replay_and_follow", skip_all)]
    pub(super) async fn pump(
        &self,
        ctx: &DriveCtx,
        key: &str,
        mut agent: AgentClient,
        secrets: &Secrets,
        aligner: Aligner,
        (stderr_from, usage, mut policy_seen): (u64, Tally, u64),
    ) -> Ending {
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
            stderr_from,
            usage,
            metered: false,
            out_of_band_run: 0,
            held_out_of_band: Vec::new(),
            dropped_file_events: 0,
            redactor,
            outbox: Outbox::default(),
        };
        let (file_tx, mut file_rx) = mpsc::channel::<Vec<agent::FileEvent>>(64);
        let watcher = tokio::spawn(watch_files(agent.clone(), ctx.spec.cwd.clone(), file_tx));
        // The sandbox's egress rides carriers this driver keeps open; a
        // successor opens its own.
        let egress = match self.run_egress(ctx, key) {
            Ok(egress) => egress,
            Err(e) => return Ending::Failed(e),
        };
        // Only a proxied sandbox has live network rules to record.
        let proxied = ctx.definition.get().is_some_and(crate::egress::proxied);
        // Only a route to a model upstream is metered.
        pump.metered = egress.as_ref().is_some_and(|e| e.upstream.is_some());
        let (net_tx, mut net_rx) = mpsc::unbounded_channel::<Connection>();
        let carry = |agent: &AgentClient| {
            egress.as_ref().map(|e| Carriers::open(agent.clone(), e.plan.clone(), net_tx.clone()))
        };
        let mut carriers = carry(&agent);
        let mut health = ModelHealth::new(egress.as_ref().map_or(0, |e| e.log_budget));
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
                include_stderr: true,
                stderr_from_byte: pump.stderr_from,
            };
            let mut stream = match agent.journal().follow(request).await {
                Ok(s) => Coalesced::new(s.into_inner()),
                Err(status) if status.code() == tonic::Code::NotFound => {
                    // A launch stopped before its start leaves no journal:
                    // the stop is the ending, not the missing journal.
                    break ctx.interrupts.stopped().unwrap_or(Ending::Failed(Error::NoJournal));
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
            let mut health_check = tokio::time::interval(HEALTH_EVERY);
            health_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_activity = Instant::now();
            let mut unknown_probes = 0u32;
            loop {
                // What the last turn made goes to the log, unless an append
                // is in flight: then it goes once that one lands, and the
                // pump reads and translates meanwhile.
                pump.outbox.send(|chunks| Box::pin(async move { (self.append(ctx, &chunks).await, chunks) }));
                tokio::select! {
                    biased;
                    _ = ctx.interrupts.shutdown.cancelled() => break 'follow Ending::Detach,
                    _ = ctx.interrupts.lease_lost.cancelled() => {
                        break 'follow Ending::Superseded("the run's lease was lost".into());
                    }
                    _ = ctx.interrupts.drive.stop.cancelled() => {
                        break 'follow ctx.interrupts.stopped().unwrap_or(Ending::Stopped(StopReason::Cancel));
                    }
                    landed = pump.outbox.landed() => {
                        if let Err(ending) = landed {
                            break 'follow ending;
                        }
                    }
                    _ = health_check.tick() => {
                        pump.outbox.trim();
                        if let Some(e) = egress
                            .as_ref()
                            .and_then(|e| health.expired(e.unreachable_after, e.upstream.as_ref()))
                        {
                            break 'follow Ending::Failed(e);
                        }
                        if let Err(ending) = self.meter(ctx, &mut pump, &agent).await {
                            break 'follow ending;
                        }
                        if proxied {
                            self.record_policy(ctx, &mut pump, key, &mut policy_seen).await;
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
                    Some(events) = file_rx.recv() => pump.file_events(events),
                    Some(connection) = net_rx.recv() => {
                        let upstream = egress.as_ref().and_then(|e| e.upstream.as_ref());
                        pump.out_of_band(health.observe(&connection, upstream, &pump.factory));
                    }
                    // Read no further while the outbox is full: the journal
                    // holds the lines until an append lands.
                    message = stream.next(), if pump.outbox.has_room() => match message {
                        Some(Ok(agent::FollowResponse { event: Some(agent::follow_response::Event::Lines(lines)) })) => {
                            last_activity = Instant::now();
                            unknown_probes = 0;
                            pause = follow_backoff();
                            if let Err(ending) = self.lines(ctx, &mut pump, lines.lines).await {
                                break 'follow ending;
                            }
                        }
                        Some(Ok(agent::FollowResponse { event: Some(agent::follow_response::Event::Exit(exit)) })) => {
                            // The connections the run made before it ended are its record too.
                            let upstream = egress.as_ref().and_then(|e| e.upstream.as_ref());
                            while let Ok(connection) = net_rx.try_recv() {
                                pump.out_of_band(health.observe(&connection, upstream, &pump.factory));
                            }
                            if let Some(blocked) = health.take_blocked(&pump.factory) {
                                pump.out_of_band(vec![blocked]);
                            }
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
            // What was read is in the log before the pause and the
            // reconnect (nothing drives the outbox meanwhile).
            if let Err(ending) = self.flush(ctx, &mut pump).await {
                break ending;
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
        // What was refused, in one record before the run's end (an exit
        // wrote it before its terminal chunk; a successor's drive says its
        // own).
        if !matches!(ending, Ending::Detach | Ending::Superseded(_))
            && let Some(blocked) = health.take_blocked(&pump.factory)
        {
            pump.out_of_band(vec![blocked]);
        }
        watcher.abort();
        if matches!(ending, Ending::Stopped(StopReason::Cancel)) {
            self.deny_pending(ctx, &mut pump, &agent).await;
        }
        drop(carriers);
        if pump.dropped_file_events > 0 {
            info!(run_id = %ctx.key.run, dropped = pump.dropped_file_events, "file events over the per-gap budget were dropped");
        }
        self.flush_at_the_end(ctx, &mut pump, ending).await
    }

    /// What the pump made goes to the log before the run's end is written,
    /// retried as that is (past a stop, through a full disk); a failed
    /// append is the ending instead. A detached or superseded drive leaves
    /// what waits to its successor's replay of the journal.
    async fn flush_at_the_end(&self, ctx: &DriveCtx, pump: &mut Pump<'_>, ending: Ending) -> Ending {
        if matches!(ending, Ending::Detach | Ending::Superseded(_)) {
            // The append in flight lands or fails on its own.
            let _ = pump.outbox.settle().await;
            return ending;
        }
        match self.flush_as(ctx, pump, Last::Yes).await {
            Ok(()) => ending,
            Err(failed) => failed,
        }
    }

    /// A cancelled run's waiting requests are denied, and the denials
    /// recorded before the run's end: the agent writes them to the journal,
    /// read here once more.
    async fn deny_pending(&self, ctx: &DriveCtx, pump: &mut Pump<'_>, agent: &AgentClient) {
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

    /// The run's egress, from its definition as the launch read it (a
    /// successor reads it too); `None` when the definition has none or was
    /// deleted since.
    /// Record each change of the sandbox's live network rules since the
    /// version last recorded on the run (`network.policy`, one per change
    /// it still keeps; the latest with the rules it made); rules that
    /// cannot be read now are read at the next call.
    async fn record_policy(&self, ctx: &DriveCtx, pump: &mut Pump<'_>, key: &str, seen: &mut u64) {
        let network = match self.inner.sandbox.live_network(key).await {
            Ok(network) if network.version > *seen => network,
            Ok(_) => return,
            Err(e) => {
                debug!(run_id = %ctx.key.run, error = %e, "reading the sandbox's live network rules failed");
                return;
            }
        };
        let fresh: Vec<_> = network.history.iter().filter(|c| c.version > *seen).collect();
        // Changes older than the ones kept are counted, not listed.
        let missed = fresh.first().map_or(0, |c| c.version.saturating_sub(*seen + 1));
        let chunks = fresh
            .iter()
            .map(|c| {
                let mut value = serde_json::json!({
                    "version": c.version,
                    "changed_by": c.changed_by,
                    "changed_at_ms": c.changed_at_ms,
                    "change": c.change,
                });
                if c.version == network.version {
                    value["allow_hosts"] = serde_json::json!(network.allow_hosts);
                    value["deny_hosts"] = serde_json::json!(network.deny_hosts);
                }
                if missed > 0 && c.version == fresh[0].version {
                    value["missed"] = missed.into();
                }
                pump.factory.custom(shared::chunk::NETWORK_POLICY, &value)
            })
            .collect();
        *seen = network.version;
        pump.out_of_band(chunks);
    }

    fn run_egress(&self, ctx: &DriveCtx, key: &str) -> Result<Option<RunEgress>, Error> {
        let Some(definition) = ctx.definition.get() else { return Ok(None) };
        let egress =
            RunEgress::of(definition, ctx.harness, &self.inner.sandbox, (ctx.key.tenant.as_str(), key))?;
        let stores = &self.inner.ctx.stores;
        let asks = crate::runs::egress::StoredAsks {
            events: stores.events.clone(),
            runs: stores.runs.clone(),
            key: ctx.key.clone(),
            thread: ctx.thread_id.clone(),
            wait: crate::runs::egress::ANSWER_INDEXED_WITHIN,
        };
        Ok(egress.map(|e| e.asking(Arc::new(asks))))
    }
}

async fn probe(agent: &AgentClient, ctx: &DriveCtx) -> Option<agent::RunState> {
    let request =
        agent::ProbeExitRequest { run_id: ctx.key.run.to_string(), sentinel_key: ctx.sentinel_key.clone() };
    let response = agent.journal().probe_exit(request).await.ok()?.into_inner();
    agent::RunState::try_from(response.state).ok()
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
