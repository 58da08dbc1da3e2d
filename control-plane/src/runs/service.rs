//! `sandhold.v1.RunService`. Every call is scoped to the caller's tenant;
//! another tenant's run is NOT_FOUND.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use shared::chunk::{self, ChunkFactory, RUN_ACCEPTED};
use shared::error::{Error, ErrorCode};
use shared::proto::v1 as api;
use shared::proto::v1::run_service_server::RunService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use super::driver::{DriveCtx, FreshStart, decode_chunk, encode_chunk};
use super::{RunSpec, Runs, StopReason, run_to_api};
use crate::auth::tenant_of;
use crate::harness::{Harness, HarnessOptions};
use crate::sandbox::progress::Progress;
use crate::sandbox::service::ensure_input;
use crate::store::{self, FIRST_EPOCH, LogWriter, NewRun, Offset, RunId, SentinelKey, Tenant, Timestamp};

type EventStream = Pin<Box<dyn Stream<Item = Result<api::RunEvent, Status>> + Send + 'static>>;

/// Unset `ListRunsRequest.limit`.
const DEFAULT_LIST_LIMIT: u32 = 100;
const MAX_LIST_LIMIT: u32 = 1000;
/// How long an attach whose client left at the run's end keeps trying to
/// take the run over to write its status: well past any lease TTL.
const FINISH_ORPHANED_FOR: Duration = Duration::from_secs(120);

#[derive(Clone)]
pub struct RunApi {
    runs: Runs,
}

impl RunApi {
    pub fn new(runs: Runs) -> Self {
        Self { runs }
    }
}

fn run_id_field(field: &str, raw: &str) -> Result<RunId, Error> {
    if raw.is_empty() {
        return Err(Error::invalid_field(field, "required"));
    }
    RunId::parse(raw).map_err(|e| Error::invalid_field(field, e.to_string()))
}

pub(crate) fn options_from_api(o: api::HarnessOptions) -> HarnessOptions {
    let some = |s: String| (!s.is_empty()).then_some(s);
    HarnessOptions {
        program: some(o.program),
        command: o.command,
        model: some(o.model),
        resume_session_id: some(o.resume_session_id),
        permission_mode: some(o.permission_mode),
        max_turns: (o.max_turns > 0).then_some(o.max_turns),
        allowed_tools: o.allowed_tools,
        disallowed_tools: o.disallowed_tools,
        system_prompt: some(o.system_prompt),
        mcp_config_path: some(o.mcp_config_path),
        include_partial_messages: o.include_partial_messages,
        sandbox_mode: some(o.sandbox_mode),
        config_overrides: o.config_overrides.into_iter().map(|c| (c.key, c.value)).collect(),
        extra_args: o.extra_args,
        env: o.env.into_iter().collect(),
        prompt_file: None,
    }
}

impl Runs {
    /// The run's log after `after`, then what is appended, until it closes
    /// or the server shuts down. `ended` fires when the stream reaches the
    /// run's terminal chunk.
    fn log_stream(&self, run: RunId, after: Offset, ended: CancellationToken) -> Result<EventStream, Error> {
        let events = self.inner.state.ready()?.stores.events.clone();
        let shutdown = self.inner.shutdown.clone();
        let stream = async_stream::stream! {
            let mut chunks = match events.read(&run, &after).await {
                Ok(chunks) => chunks,
                Err(e) => {
                    yield Err(Status::from(Error::from(e)));
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
                        yield Err(Status::unavailable(
                            "the server is shutting down: attach again (any replica) after the last offset received",
                        ));
                        break;
                    }
                    item = chunks.next() => match item {
                        None => break,
                        Some(Err(e)) => {
                            yield Err(Status::from(Error::from(e)));
                            break;
                        }
                        Some(Ok(stored)) => {
                            let event = chunk_event(&stored).map_err(Status::from);
                            // Nothing follows a terminal chunk: end here even
                            // if the log was never closed (its driver died
                            // between the terminal chunk and the close).
                            let terminal = matches!(
                                &event,
                                Ok(api::RunEvent { event: Some(api::run_event::Event::Chunk(c)) })
                                    if c.chunk.as_ref().is_some_and(shared::chunk::is_terminal)
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
        Ok(Box::pin(stream))
    }

    /// Count `inner` as a client of `run` until it ends or is dropped.
    fn client_stream(&self, run: RunId, inner: EventStream) -> (EventStream, CancellationToken) {
        self.client_arrived(&run);
        let gone = CancellationToken::new();
        let stream = ClientStream { inner, runs: self.clone(), run, gone: gone.clone() };
        (Box::pin(stream), gone)
    }

    /// Try to become the driver of a running run: take its lease, claim it
    /// (bump the epoch) and drive it on from its journal.
    pub async fn try_take_over(&self, run: &RunId) -> Result<Takeover, Error> {
        if self.registry().drives.contains_key(run.as_str()) {
            return Ok(Takeover::AlreadyHere);
        }
        let ready = self.inner.state.ready()?;
        let Some(lease) = ready.leases.try_acquire(&format!("run:{run}")).await? else {
            return Ok(Takeover::HeldElsewhere);
        };
        let record = match ready.stores.runs.claim(run).await {
            Ok(r) => r,
            Err(store::Error::RunTerminal { .. } | store::Error::NotFound(_)) => {
                let _ = lease.release().await;
                return Ok(Takeover::Ended);
            }
            Err(e) => {
                // The API error keeps store internals out; the log has them.
                warn!(run_id = %run, error = %e, "could not claim the run");
                let _ = lease.release().await;
                return Err(e.into());
            }
        };
        let spec = RunSpec::of(&record)?;
        let harness = Harness::parse(&spec.harness).map_err(|e| Error::internal(e.to_string()))?;
        let Some(drive) = self.register(run, spec.detach_on_disconnect) else {
            let _ = lease.release().await;
            return Ok(Takeover::AlreadyHere);
        };
        info!(run_id = %run, epoch = record.driver_epoch, "taking the run over");
        crate::metrics::takeovers().inc();
        let ctx = DriveCtx {
            run: run.clone(),
            tenant: record.tenant.clone(),
            thread_id: record.thread_id.clone(),
            spec,
            harness,
            sentinel_key: record.sentinel_key.expose().as_bytes().to_vec(),
            writer: LogWriter::new(ready.stores.events.clone(), run.clone(), record.driver_epoch),
            lease_lost: lease.lost(),
            lease,
            drive,
        };
        let epoch = record.driver_epoch;
        Ok(Takeover::Driving { drive: self.inner.drives.spawn(self.clone().drive(ctx, None)), epoch })
    }

    /// Keep trying to drive `run` until it is driven here, it ended, or
    /// `until` fires (the attached client left).
    ///
    /// A client that leaves after the terminal chunk (`log_ended`) while
    /// the run is not terminal yet saw a driver die between its terminal
    /// chunk and its terminal status: then the attempts go on without the
    /// client (for [`FINISH_ORPHANED_FOR`] at most) until a takeover can
    /// replay the log to its end and write the status.
    fn keep_taking_over(&self, run: RunId, until: CancellationToken, log_ended: CancellationToken) {
        let runs = self.clone();
        tokio::spawn(async move {
            let mut give_up_at: Option<tokio::time::Instant> = None;
            loop {
                match runs.try_take_over(&run).await {
                    Ok(Takeover::HeldElsewhere) => {}
                    Ok(Takeover::Driving { .. }) if !until.is_cancelled() => {
                        // Its client is here: whoever marked it detached
                        // while it had no driver (the reaper) was wrong now.
                        if let Ok(ready) = runs.inner.state.ready()
                            && let Ok(record) = ready.stores.runs.get_unscoped(&run).await
                        {
                            runs.mark_attached(&record).await;
                        }
                        return;
                    }
                    Ok(_) => return,
                    Err(e) => debug!(run_id = %run, error = %e.message, "takeover attempt failed"),
                }
                if give_up_at.is_some_and(|at| tokio::time::Instant::now() >= at) {
                    warn!(run_id = %run, "the run's log ended but its status was never written; left to the reaper");
                    return;
                }
                tokio::select! {
                    _ = until.cancelled(), if give_up_at.is_none() => {
                        if !log_ended.is_cancelled() {
                            return;
                        }
                        debug!(run_id = %run, "the client left at the run's end; finishing its record");
                        give_up_at = Some(tokio::time::Instant::now() + FINISH_ORPHANED_FOR);
                    }
                    _ = runs.inner.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(runs.inner.options.takeover_retry) => {}
                }
            }
        });
    }
}

fn chunk_event(stored: &store::StoredChunk) -> Result<api::RunEvent, Error> {
    Ok(api::RunEvent {
        event: Some(api::run_event::Event::Chunk(api::RunChunk {
            offset: stored.offset.to_string(),
            chunk: Some(decode_chunk(stored)?),
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
    inner: EventStream,
    runs: Runs,
    run: RunId,
    gone: CancellationToken,
}

impl Stream for ClientStream {
    type Item = Result<api::RunEvent, Status>;

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

#[tonic::async_trait]
impl RunService for RunApi {
    type StartRunStream = EventStream;

    async fn start_run(
        &self,
        request: Request<api::StartRunRequest>,
    ) -> Result<Response<Self::StartRunStream>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let runs = &self.runs;
        if req.thread_id.is_empty() {
            return Err(Error::invalid_field("thread_id", "required").into());
        }
        let harness =
            Harness::parse(&req.harness).map_err(|e| Error::invalid_field("harness", e.to_string()))?;
        let options = options_from_api(req.options.unwrap_or_default());
        let command = harness
            .command(&options, &req.prompt)
            .map_err(|e| Error::new(ErrorCode::InvalidArgument, e.to_string()))?;
        let run = if req.run_id.is_empty() {
            if req.durable {
                return Err(Error::invalid_field(
                    "run_id",
                    "required for a durable run: its journal and event ids derive from it",
                )
                .into());
            }
            store::generated_run_id()
        } else {
            run_id_field("run_id", &req.run_id)?
        };
        let ready = runs.inner.state.ready()?;
        let input = ensure_input(
            ready,
            tenant.clone(),
            &req.definition_id,
            req.thread_id.clone(),
            run.to_string(),
            req.secrets,
        )
        .await?;
        let spec = RunSpec {
            harness: harness.name().to_owned(),
            definition_id: req.definition_id.clone(),
            durable: req.durable,
            detach_on_disconnect: req.detach_on_disconnect.unwrap_or(req.durable),
            cwd: req.cwd,
        };
        // The lease first: from the record's creation on, an attach on
        // another replica must see the run as driven.
        let already = || Error::new(ErrorCode::AlreadyExists, format!("run {run} already exists"));
        let Some(lease) = ready.leases.try_acquire(&format!("run:{run}")).await.map_err(Error::from)? else {
            return Err(already().into());
        };
        let sentinel_key = SentinelKey::random();
        let created = ready
            .stores
            .runs
            .create_or_resume(NewRun {
                run_id: run.clone(),
                thread_id: req.thread_id.clone(),
                tenant: tenant.clone(),
                sentinel_key: sentinel_key.clone(),
                sandbox_key: None,
                started_at: Timestamp::now(),
                spec: Some(serde_json::to_value(&spec).expect("a spec serializes")),
            })
            .await;
        let created = match created {
            Ok(c) if c.created => c,
            Ok(_) | Err(store::Error::AlreadyExists(_)) => {
                let _ = lease.release().await;
                return Err(already().into());
            }
            Err(e) => {
                let _ = lease.release().await;
                return Err(Error::from(e).into());
            }
        };
        let writer = LogWriter::new(ready.stores.events.clone(), run.clone(), FIRST_EPOCH);
        if spec.durable {
            let accepted = ChunkFactory::new(&run, &req.thread_id, chunk::now_ms)
                .custom(RUN_ACCEPTED, &serde_json::json!({}));
            if let Err(e) = writer.append(&[encode_chunk(&accepted)]).await {
                // Nothing was started: fail the record so it is not left running.
                let finish = store::RunFinish {
                    status: store::RunStatus::Failed,
                    error: Some(store::RunError { code: "UNAVAILABLE".into(), message: e.to_string() }),
                    usage: None,
                    finished_at: Timestamp::now(),
                };
                let _ = ready.stores.runs.finish(&run, FIRST_EPOCH, finish).await;
                let _ = ready.stores.events.close(&run).await;
                let _ = lease.release().await;
                return Err(Error::from(e).into());
            }
        }
        let drive = runs.register(&run, spec.detach_on_disconnect).expect("a new run is not driven yet");
        let (progress_tx, progress_rx) = mpsc::unbounded_channel();
        let ctx = DriveCtx {
            run: run.clone(),
            tenant,
            thread_id: req.thread_id,
            harness,
            sentinel_key: created.record.sentinel_key.expose().as_bytes().to_vec(),
            writer,
            lease_lost: lease.lost(),
            lease,
            drive,
            spec,
        };
        info!(run_id = %run, harness = harness.name(), durable = ctx.spec.durable, "run accepted");
        crate::metrics::runs().started();
        let fresh = FreshStart { input, command, progress: Progress::new(progress_tx) };
        let log = runs.log_stream(run.clone(), Offset::start(), CancellationToken::new())?;
        runs.inner.drives.spawn(runs.clone().drive(ctx, Some(fresh)));
        let progress = UnboundedReceiverStream::new(progress_rx).filter_map(|item| async move {
            match item {
                Ok(api::EnsureSandboxResponse {
                    event: Some(api::ensure_sandbox_response::Event::Progress(p)),
                }) => Some(Ok(api::RunEvent { event: Some(api::run_event::Event::Progress(p)) })),
                Ok(_) => None,
                Err(status) => Some(Err(status)),
            }
        });
        let (stream, _gone) = runs.client_stream(run, Box::pin(progress.chain(log)));
        Ok(Response::new(stream))
    }

    type AttachRunStream = EventStream;

    async fn attach_run(
        &self,
        request: Request<api::AttachRunRequest>,
    ) -> Result<Response<Self::AttachRunStream>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let run = run_id_field("run_id", &req.run_id)?;
        let after = if req.after_offset.is_empty() {
            Offset::start()
        } else {
            Offset::parse(&req.after_offset)
                .map_err(|e| Error::invalid_field("after_offset", e.to_string()))?
        };
        let record = self.runs.record(&tenant, &run).await?;
        if !req.thread_id.is_empty() && req.thread_id != record.thread_id {
            return Err(
                Error::invalid_field("thread_id", format!("run {run} is not a run of this thread")).into()
            );
        }
        if req.stored_only {
            let stored =
                self.runs.inner.state.ready()?.stores.events.snapshot(&run).await.map_err(Error::from)?;
            let events: Vec<Result<api::RunEvent, Status>> = stored
                .chunks
                .iter()
                .filter(|c| c.offset > after)
                .map(|c| chunk_event(c).map_err(Status::from))
                .collect();
            return Ok(Response::new(Box::pin(tokio_stream::iter(events))));
        }
        let log_ended = CancellationToken::new();
        let log = self.runs.log_stream(run.clone(), after, log_ended.clone())?;
        let (stream, gone) = self.runs.client_stream(run.clone(), log);
        if !record.status.is_terminal() {
            self.runs.mark_attached(&record).await;
            self.runs.keep_taking_over(run, gone, log_ended);
        }
        Ok(Response::new(stream))
    }

    async fn cancel_run(
        &self,
        request: Request<api::CancelRunRequest>,
    ) -> Result<Response<api::CancelRunResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let run = run_id_field("run_id", &request.into_inner().run_id)?;
        let ready = self.runs.inner.state.ready()?;
        let record =
            ready.stores.runs.request_cancel(&tenant, &run).await.map_err(|e| not_found_as(e, &run))?;
        if !record.status.is_terminal() {
            info!(run_id = %run, "cancel requested");
            if !self.runs.stop_local(&run, StopReason::Cancel) {
                // Driven elsewhere: tell that driver now (it would also see
                // the record within its poll). Driven nowhere: drive it
                // here to stop it.
                self.runs.inner.cancels.publish(&run).await;
                if let Err(e) = self.runs.try_take_over(&run).await {
                    debug!(run_id = %run, error = %e.message, "could not take the cancelled run over");
                }
            }
        }
        Ok(Response::new(api::CancelRunResponse { run: Some(run_to_api(&record)) }))
    }

    async fn get_run(
        &self,
        request: Request<api::GetRunRequest>,
    ) -> Result<Response<api::GetRunResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let run = run_id_field("run_id", &request.into_inner().run_id)?;
        let record = self.runs.record(&tenant, &run).await?;
        Ok(Response::new(api::GetRunResponse { run: Some(run_to_api(&record)) }))
    }

    async fn list_runs(
        &self,
        request: Request<api::ListRunsRequest>,
    ) -> Result<Response<api::ListRunsResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let limit = if req.limit == 0 { DEFAULT_LIST_LIMIT } else { req.limit.min(MAX_LIST_LIMIT) };
        let stores = &self.runs.inner.state.ready()?.stores;
        let records = if req.thread_id.is_empty() {
            stores.runs.list_recent(&tenant, limit).await.map_err(Error::from)?
        } else {
            let mut all = stores.runs.list_by_thread(&tenant, &req.thread_id).await.map_err(Error::from)?;
            all.reverse();
            all.truncate(limit as usize);
            all
        };
        Ok(Response::new(api::ListRunsResponse { runs: records.iter().map(run_to_api).collect() }))
    }

    async fn get_active_run(
        &self,
        request: Request<api::GetActiveRunRequest>,
    ) -> Result<Response<api::GetActiveRunResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        if req.thread_id.is_empty() {
            return Err(Error::invalid_field("thread_id", "required").into());
        }
        let stores = &self.runs.inner.state.ready()?.stores;
        let active = stores.runs.active_run(&tenant, &req.thread_id).await.map_err(Error::from)?;
        Ok(Response::new(api::GetActiveRunResponse { run: active.as_ref().map(run_to_api) }))
    }
}

fn not_found_as(e: store::Error, run: &RunId) -> Error {
    match e {
        store::Error::NotFound(_) => Error::not_found(format!("run {run} not found")),
        other => other.into(),
    }
}

impl Runs {
    /// The tenant's run, or NOT_FOUND (also for another tenant's).
    async fn record(&self, tenant: &Tenant, run: &RunId) -> Result<store::RunRecord, Error> {
        let stores = &self.inner.state.ready()?.stores;
        stores.runs.get(tenant, run).await.map_err(|e| not_found_as(e, run))
    }
}
