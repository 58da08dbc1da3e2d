//! Reading a run: a client's stream of its log (stored, then live), and
//! the takeover that an attach to a run nobody drives sets off.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use shared::proto::v1 as api;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, warn};

use super::drive::{DriveCtx, Interrupts};
use super::log::decode_chunk_into;
use super::{Error, RunSpec, Runs};
use crate::harness::Harness;
use crate::provision::InvalidField;
use crate::store::{self, LogWriter, Offset, RunKey, Tenant};

/// A client's view of a run: events in order, each chunk with its offset.
pub type RunEvents = Pin<Box<dyn Stream<Item = Result<api::RunEvent, Error>> + Send + 'static>>;

/// How long an attach whose client left at the run's end keeps trying to
/// take the run over to write its status: well past any lease TTL.
const FINISH_ORPHANED_FOR: Duration = Duration::from_secs(120);

impl Runs {
    /// Stream the tenant's run from after `after`: the stored log, then
    /// (unless `stored_only`) what is appended until its terminal chunk.
    /// Attaching to a run nobody drives takes its drive over here.
    pub async fn attach(
        &self,
        tenant: &Tenant,
        run_id: &str,
        thread_id: &str,
        after_offset: &str,
        stored_only: bool,
    ) -> Result<RunEvents, Error> {
        let run = RunKey::new(tenant.clone(), super::run_id_field("run_id", run_id)?);
        let after = if after_offset.is_empty() {
            Offset::start()
        } else {
            Offset::parse(after_offset).map_err(|e| InvalidField::new("after_offset", e.to_string()))?
        };
        let record = self.record(&run).await?;
        if !thread_id.is_empty() && thread_id != record.thread_id {
            return Err(InvalidField::new(
                "thread_id",
                format!("run {} is not a run of this thread", run.run),
            )
            .into());
        }
        if stored_only {
            // Page by page: a reader of a long log holds one page, and a
            // client that reads slowly holds back the next page's query.
            let stored = crate::store::stored_after(self.inner.ctx.stores.events.clone(), run, after);
            return Ok(Box::pin(stored.map(|c| c.map_err(Error::Store).and_then(|c| chunk_event(&c)))));
        }
        let log_ended = CancellationToken::new();
        let log = self.log_stream(run.clone(), after, log_ended.clone());
        let (stream, gone) = self.client_stream(run.clone(), log);
        if !record.status.is_terminal() {
            self.mark_attached(&record).await;
            self.keep_taking_over(run, gone, log_ended);
        }
        Ok(stream)
    }

    /// The run's log after `after`, then what is appended, until it closes
    /// or the server shuts down. `ended` fires when the stream reaches the
    /// run's terminal chunk.
    pub(super) fn log_stream(&self, run: RunKey, after: Offset, ended: CancellationToken) -> RunEvents {
        let events = self.inner.ctx.stores.events.clone();
        let shutdown = self.inner.ctx.shutdown.clone();
        let stream = async_stream::stream! {
            let mut chunks = match events.read(&run, &after).await {
                Ok(chunks) => chunks,
                Err(e) => {
                    yield Err(Error::Store(e));
                    return;
                }
            };
            loop {
                tokio::select! {
                    biased;
                    // A server going away ends the stream with UNAVAILABLE,
                    // never with a clean end a client could take for the
                    // run's end.
                    _ = shutdown.cancelled() => {
                        yield Err(Error::ShuttingDown);
                        break;
                    }
                    item = chunks.next() => match item {
                        None => break,
                        Some(Err(e)) => {
                            yield Err(Error::Store(e));
                            break;
                        }
                        Some(Ok(stored)) => {
                            let event = chunk_event(&stored);
                            // Nothing follows a terminal chunk: end here even
                            // if the log was never closed (its driver died
                            // between the terminal chunk and the close).
                            let terminal = matches!(
                                &event,
                                Ok(api::RunEvent { event: Some(api::run_event::Event::Chunk(c)) })
                                    if c.chunk.as_deref().is_some_and(shared::chunk::is_terminal)
                            );
                            if terminal {
                                ended.cancel();
                            }
                            yield event;
                            if terminal {
                                break;
                            }
                        }
                    },
                }
            }
        };
        Box::pin(stream)
    }

    /// Count `inner` as a client of `run` until it ends or is dropped.
    pub(super) fn client_stream(&self, run: RunKey, inner: RunEvents) -> (RunEvents, CancellationToken) {
        self.client_arrived(&run);
        let gone = CancellationToken::new();
        let stream = ClientStream { inner, runs: self.clone(), run, gone: gone.clone() };
        (Box::pin(stream), gone)
    }

    /// Try to become the driver of a running run: take its lease, claim it
    /// (bump the epoch) and drive it on from its journal.
    pub async fn try_take_over(&self, run: &RunKey) -> Result<Takeover, Error> {
        if self.registry().drives.contains_key(run) {
            return Ok(Takeover::AlreadyHere);
        }
        let cx = &self.inner.ctx;
        let name = super::lease_name(run);
        let lease = match cx.leases.try_acquire(&name).await? {
            Some(lease) => lease,
            None if self.broke_a_gone_holders_lease(run, &name).await => {
                match cx.leases.try_acquire(&name).await? {
                    Some(lease) => lease,
                    None => return Ok(Takeover::HeldElsewhere),
                }
            }
            None => return Ok(Takeover::HeldElsewhere),
        };
        let record = match cx.stores.runs.claim(run).await {
            Ok(r) => r,
            Err(store::Error::RunTerminal { .. } | store::Error::NotFound(_)) => {
                let _ = lease.release().await;
                return Ok(Takeover::Ended);
            }
            Err(e) => {
                // The API error keeps store internals out; the log has them.
                warn!(run_id = %run.run, tenant = %run.tenant, error = %e, "could not claim the run");
                let _ = lease.release().await;
                return Err(e.into());
            }
        };
        let spec = RunSpec::of(&record)?;
        let harness = Harness::parse(&spec.harness).map_err(|e| Error::Corrupt(e.to_string()))?;
        let Some(drive) = self.register(run, spec.detach_on_disconnect) else {
            let _ = lease.release().await;
            return Ok(Takeover::AlreadyHere);
        };
        info!(run_id = %run.run, tenant = %run.tenant, epoch = record.driver_epoch, "taking the run over");
        crate::metrics::takeovers().inc();
        let ctx = DriveCtx {
            key: run.clone(),
            thread_id: record.thread_id.clone(),
            spec,
            harness,
            sentinel_key: record.sentinel_key.expose().as_bytes().to_vec(),
            writer: LogWriter::new(cx.stores.events.clone(), run.clone(), record.driver_epoch),
            interrupts: Interrupts { shutdown: cx.shutdown.clone(), lease_lost: lease.lost(), drive },
            lease,
            session: Default::default(),
            definition: Default::default(),
            usage: Default::default(),
        };
        let epoch = record.driver_epoch;
        Ok(Takeover::Driving { drive: self.inner.drives.spawn(self.clone().drive(ctx, None)), epoch })
    }

    /// Whether lease `name` was held by a replica the database knows is
    /// gone (its process died), and is free now: then the run need not wait
    /// out the dead driver's lease TTL.
    async fn broke_a_gone_holders_lease(&self, run: &RunKey, name: &str) -> bool {
        let cx = &self.inner.ctx;
        let Some(presence) = &cx.presence else { return false };
        let owner = match cx.leases.holder_of(name).await {
            Ok(Some(owner)) if owner != cx.replica_id => owner,
            Ok(_) => return false,
            Err(e) => {
                debug!(run_id = %run.run, error = %e, "could not read the run's lease holder");
                return false;
            }
        };
        if !presence.is_gone(&owner).await {
            return false;
        }
        match cx.leases.break_lease(name, &owner).await {
            Ok(broken) => {
                if broken {
                    info!(run_id = %run.run, tenant = %run.tenant, replica = %owner, "the run's driver replica is gone; its lease is broken");
                }
                broken
            }
            Err(e) => {
                debug!(run_id = %run.run, error = %e, "could not break the gone driver's lease");
                false
            }
        }
    }

    /// Keep `run` driven while its client is attached: try to drive it
    /// whenever nobody does, until it ended or `until` fires (the client
    /// left).
    ///
    /// A client that leaves after the terminal chunk (`log_ended`) while
    /// the run is not terminal yet saw a driver die between its terminal
    /// chunk and its terminal status: then the attempts go on without the
    /// client (for [`FINISH_ORPHANED_FOR`] at most) until a takeover can
    /// replay the log to its end and write the status.
    pub(super) fn keep_taking_over(
        &self,
        run: RunKey,
        until: CancellationToken,
        log_ended: CancellationToken,
    ) {
        let runs = self.clone();
        // Tracked with the drives: shutdown waits for it (it stops on the
        // shutdown token) before the stores close. In the attach's span, so
        // the drive a takeover starts is the call's child.
        let span = tracing::Span::current();
        self.inner.drives.spawn(
            async move {
            let mut give_up_at: Option<tokio::time::Instant> = None;
            loop {
                // Driven here (by this attempt or before it): keep watching
                // while the client stays. A drive that loses its lease with
                // nobody else taking it (its replica stalled past the TTL)
                // stops writing, and the run would have no driver while its
                // client waits; the next attempt takes it over again.
                let here = match runs.try_take_over(&run).await {
                    Ok(Takeover::HeldElsewhere) => false,
                    Ok(Takeover::Driving { .. }) => {
                        if !until.is_cancelled() {
                            // Its client is here: whoever marked it detached
                            // while it had no driver (the reaper) was wrong now.
                            let cx = &runs.inner.ctx;
                            if let Ok(record) = cx.stores.runs.get(&run).await {
                                runs.mark_attached(&record).await;
                            }
                        }
                        true
                    }
                    Ok(Takeover::AlreadyHere) => true,
                    Ok(Takeover::Ended) => return,
                    Err(e) => {
                        debug!(run_id = %run.run, error = %e, "takeover attempt failed");
                        false
                    }
                };
                // The client left at the run's end and the drive here
                // writes the status.
                if here && until.is_cancelled() {
                    return;
                }
                if give_up_at.is_some_and(|at| tokio::time::Instant::now() >= at) {
                    warn!(run_id = %run.run, "the run's log ended but its status was never written; left to the reaper");
                    return;
                }
                tokio::select! {
                    _ = until.cancelled(), if give_up_at.is_none() => {
                        if !log_ended.is_cancelled() || here {
                            return;
                        }
                        debug!(run_id = %run.run, "the client left at the run's end; finishing its record");
                        give_up_at = Some(tokio::time::Instant::now() + FINISH_ORPHANED_FOR);
                    }
                    _ = runs.inner.ctx.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(jittered(runs.inner.options.takeover_retry)) => {}
                }
            }
        }
            .instrument(span),
        );
    }
}

/// `base` give or take half: clients that attached together after a
/// replica died do not retry the takeover in step.
fn jittered(base: Duration) -> Duration {
    use rand::Rng;
    base.mul_f64(rand::thread_rng().gen_range(0.5..1.5))
}

fn chunk_event(stored: &store::StoredChunk) -> Result<api::RunEvent, Error> {
    let mut chunk = Box::default();
    decode_chunk_into(stored, &mut chunk)?;
    Ok(api::RunEvent {
        event: Some(api::run_event::Event::Chunk(api::RunChunk {
            offset: stored.offset.to_string(),
            chunk: Some(chunk),
        })),
    })
}

/// What [`Runs::try_take_over`] found.
#[derive(Debug)]
pub enum Takeover {
    /// This replica drives the run now, under `epoch` (a record left at
    /// another epoch was finished or is driven by someone else); the handle
    /// ends with the drive.
    Driving { drive: tokio::task::JoinHandle<()>, epoch: store::Epoch },
    /// This replica already drives it.
    AlreadyHere,
    /// Another replica holds the run's lease.
    HeldElsewhere,
    /// The run is terminal (or unknown): nothing to drive.
    Ended,
}

/// A client's stream; its end (or drop, when the client goes away) is
/// reported to [`Runs::client_left`].
struct ClientStream {
    inner: RunEvents,
    runs: Runs,
    run: RunKey,
    gone: CancellationToken,
}

impl Stream for ClientStream {
    type Item = Result<api::RunEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        self.gone.cancel();
        self.runs.client_left(&self.run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takeover_retries_are_spread_around_the_base() {
        let base = Duration::from_secs(1);
        let pauses: Vec<Duration> = (0..200).map(|_| jittered(base)).collect();
        assert!(pauses.iter().all(|p| (base / 2..base * 3 / 2).contains(p)), "{pauses:?}");
        let distinct: std::collections::BTreeSet<_> = pauses.iter().collect();
        assert!(distinct.len() > 100, "retries in step: {} distinct pauses of 200", distinct.len());
        assert!(pauses.iter().any(|p| *p < base) && pauses.iter().any(|p| *p > base));
    }
}
