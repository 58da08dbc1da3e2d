//! `sandhold.v1.RunService`: request fields in, [`Runs`] operations, their
//! results and [`runs::Error`] out as messages and statuses. Every call is
//! scoped to the caller's tenant; another tenant's run is NOT_FOUND.

use futures::StreamExt;
use shared::proto::v1 as api;
use shared::proto::v1::run_service_server::RunService;
use tonic::{Request, Response, Status};

use crate::auth::tenant_of;
use crate::harness::HarnessOptions;
use crate::provision::InvalidField;
use crate::runs::{
    self, AttemptRun, AttemptView, Evaluation, RunEvents, RunSpec, Runs, StartAttempts, StartRun,
};
use crate::store::{RunFilter, RunId, RunRecord, RunStatus, Timestamp};

impl From<runs::Error> for Status {
    fn from(e: runs::Error) -> Self {
        shared::error::Error::from(e).into()
    }
}

type EventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<api::RunEvent, Status>> + Send + 'static>>;

fn to_status_stream(events: RunEvents) -> EventStream {
    Box::pin(events.map(|event| event.map_err(Status::from)))
}

#[derive(Clone)]
pub struct RunApi {
    runs: Runs,
}

impl RunApi {
    pub fn new(runs: Runs) -> Self {
        Self { runs }
    }
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
        policy: Default::default(),
        client_tools: Vec::new(),
        prompt_file: None,
    }
}

/// A `StartRunRequest` as [`Runs::start`] takes it.
fn start_of(tenant: crate::store::Tenant, req: api::StartRunRequest) -> Result<StartRun, Status> {
    Ok(StartRun {
        tenant,
        thread_id: req.thread_id,
        run_id: req.run_id,
        harness: req.harness,
        options: options_from_api(req.options.unwrap_or_default()),
        prompt: req.prompt,
        definition_id: req.definition_id,
        secrets: req.secrets,
        durable: req.durable,
        detach_on_disconnect: req.detach_on_disconnect,
        cwd: req.cwd,
        new_session: req.new_session,
        policy: req
            .policy
            .as_ref()
            .map(|p| crate::sandbox::policy_from_api(p, "policy"))
            .transpose()
            .map_err(runs::Error::from)?,
        client_tools: req.client_tools,
        budget: req.budget,
    })
}

/// The API view of a set of attempts.
fn attempt_set_to_api(view: &AttemptView) -> api::AttemptSet {
    let set = &view.set;
    api::AttemptSet {
        attempt_set_id: set.set_id.clone(),
        thread_id: set.thread_id.clone(),
        definition_id: set.definition_id.clone(),
        base_checkpoint_id: set.base_checkpoint_id.clone(),
        promoted_run_id: set.promoted_run_id.clone().unwrap_or_default(),
        created_at_ms: set.created_at.as_millis(),
        attempts: view
            .attempts
            .iter()
            .map(|(a, run)| {
                let e: Evaluation = a
                    .evaluation
                    .as_ref()
                    .and_then(|v| serde_json::from_value(v.clone()).ok())
                    .unwrap_or_default();
                api::Attempt {
                    attempt: a.attempt,
                    run_id: a.run_id.clone(),
                    thread_id: a.thread_id.clone(),
                    harness: a.harness.clone(),
                    model: a.model.clone(),
                    status: run.as_ref().map_or(api::RunStatus::Unspecified, |r| status_to_api(r.status))
                        as i32,
                    evaluated: a.evaluation.is_some(),
                    files_changed: e.files_changed,
                    lines_added: e.lines_added,
                    lines_removed: e.lines_removed,
                    files: e
                        .files
                        .into_iter()
                        .map(|f| api::ChangedFile {
                            path: f.path,
                            change: f.change,
                            lines_added: f.lines_added,
                            lines_removed: f.lines_removed,
                            binary: f.binary,
                        })
                        .collect(),
                    test_exit_code: e.test_exit_code,
                    test_output_tail: e.test_output_tail,
                    test_error: e.test_error,
                    usage: run
                        .as_ref()
                        .and_then(|r| r.usage.as_ref())
                        .and_then(shared::chunk::usage_from_json),
                    duration_ms: e.duration_ms,
                    checkpoint_id: e.checkpoint_id,
                    error: run
                        .as_ref()
                        .and_then(|r| r.error.as_ref())
                        .map(|e| e.message.clone())
                        .unwrap_or_default(),
                }
            })
            .collect(),
    }
}

/// The API view of a record.
pub fn run_to_api(record: &RunRecord) -> api::Run {
    let spec = RunSpec::of(record).ok();
    api::Run {
        run_id: record.run_id.to_string(),
        thread_id: record.thread_id.clone(),
        status: status_to_api(record.status) as i32,
        harness: spec.as_ref().map(|s| s.harness.clone()).unwrap_or_default(),
        definition_id: spec.as_ref().map(|s| s.definition_id.clone()).unwrap_or_default(),
        durable: spec.as_ref().is_some_and(|s| s.durable),
        started_at_ms: record.started_at.as_millis(),
        finished_at_ms: record.finished_at.map(Timestamp::as_millis),
        error: record
            .error
            .as_ref()
            .map(|e| api::RunFailure { code: e.code.clone(), message: e.message.clone() }),
        usage: record.usage.as_ref().and_then(shared::chunk::usage_from_json),
        sandbox_id: record.sandbox_key.clone().unwrap_or_default(),
        detached_since_ms: record.detached_since.map(Timestamp::as_millis),
        cancel_requested: record.cancel_requested,
        forked_from_run: record.forked_from_run.as_ref().map(RunId::to_string).unwrap_or_default(),
        session_id: record.session_id.clone().unwrap_or_default(),
        command: spec.as_ref().map(|s| s.command.clone()).unwrap_or_default(),
        prompt: spec.as_ref().map(|s| s.prompt.clone()).unwrap_or_default(),
        prompt_truncated: spec.as_ref().is_some_and(|s| s.prompt_truncated),
    }
}

fn status_to_api(status: RunStatus) -> api::RunStatus {
    match status {
        RunStatus::Running => api::RunStatus::Running,
        RunStatus::Interrupted => api::RunStatus::Interrupted,
        RunStatus::Completed => api::RunStatus::Completed,
        RunStatus::Failed => api::RunStatus::Failed,
        RunStatus::Aborted => api::RunStatus::Aborted,
    }
}

/// `None` for UNSPECIFIED (any status, in a filter).
fn status_from_api(status: api::RunStatus) -> Option<RunStatus> {
    Some(match status {
        api::RunStatus::Unspecified => return None,
        api::RunStatus::Running => RunStatus::Running,
        api::RunStatus::Interrupted => RunStatus::Interrupted,
        api::RunStatus::Completed => RunStatus::Completed,
        api::RunStatus::Failed => RunStatus::Failed,
        api::RunStatus::Aborted => RunStatus::Aborted,
    })
}

#[tonic::async_trait]
impl RunService for RunApi {
    type StartRunStream = EventStream;

    async fn start_run(
        &self,
        request: Request<api::StartRunRequest>,
    ) -> Result<Response<Self::StartRunStream>, Status> {
        let tenant = tenant_of(&request)?;
        let start = start_of(tenant, request.into_inner())?;
        Ok(Response::new(to_status_stream(self.runs.start(start).await?)))
    }

    async fn start_attempts(
        &self,
        request: Request<api::StartAttemptsRequest>,
    ) -> Result<Response<api::StartAttemptsResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let template = req.run.ok_or_else(|| runs::Error::from(InvalidField::new("run", "required")))?;
        let specs = match (req.attempts.len(), req.count as usize) {
            (0, count) => vec![api::AttemptSpec::default(); count],
            (mix, count) if count == 0 || count == mix => req.attempts,
            (mix, count) => {
                let why =
                    format!("{count} attempts asked, and {mix} given in `attempts`: give one or the same");
                return Err(runs::Error::from(InvalidField::new("count", why)).into());
            }
        };
        let mut attempts = Vec::with_capacity(specs.len());
        for spec in specs {
            let mut run = template.clone();
            if !spec.harness.is_empty() {
                run.harness = spec.harness;
            }
            if !spec.model.is_empty() {
                run.options.get_or_insert_with(Default::default).model = spec.model;
            }
            let (harness, model) = (run.harness.clone(), run.options.as_ref().map(|o| o.model.clone()));
            attempts.push(AttemptRun {
                harness,
                model: model.unwrap_or_default(),
                start: start_of(tenant.clone(), run)?,
            });
        }
        let view = self
            .runs
            .start_attempts(StartAttempts {
                tenant,
                thread_id: template.thread_id,
                definition_id: template.definition_id,
                secrets: template.secrets,
                attempts,
            })
            .await?;
        Ok(Response::new(api::StartAttemptsResponse { set: Some(attempt_set_to_api(&view)) }))
    }

    async fn get_attempt_set(
        &self,
        request: Request<api::GetAttemptSetRequest>,
    ) -> Result<Response<api::GetAttemptSetResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let view = self.runs.attempt_set(&tenant, &request.into_inner().attempt_set_id).await?;
        Ok(Response::new(api::GetAttemptSetResponse { set: Some(attempt_set_to_api(&view)) }))
    }

    async fn get_attempt_patch(
        &self,
        request: Request<api::GetAttemptPatchRequest>,
    ) -> Result<Response<api::GetAttemptPatchResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let (patch, truncated) = self.runs.attempt_patch(&tenant, &req.attempt_set_id, &req.run_id).await?;
        Ok(Response::new(api::GetAttemptPatchResponse { patch, truncated }))
    }

    async fn promote_attempt(
        &self,
        request: Request<api::PromoteAttemptRequest>,
    ) -> Result<Response<api::PromoteAttemptResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let (view, checkpoint_id) =
            self.runs.promote_attempt(&tenant, &req.attempt_set_id, &req.run_id).await?;
        Ok(Response::new(api::PromoteAttemptResponse { set: Some(attempt_set_to_api(&view)), checkpoint_id }))
    }

    type AttachRunStream = EventStream;

    async fn attach_run(
        &self,
        request: Request<api::AttachRunRequest>,
    ) -> Result<Response<Self::AttachRunStream>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let events = self
            .runs
            .attach(&tenant, &req.run_id, &req.thread_id, &req.after_offset, req.stored_only)
            .await?;
        Ok(Response::new(to_status_stream(events)))
    }

    async fn cancel_run(
        &self,
        request: Request<api::CancelRunRequest>,
    ) -> Result<Response<api::CancelRunResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let record = self.runs.cancel(&tenant, &request.into_inner().run_id).await?;
        Ok(Response::new(api::CancelRunResponse { run: Some(run_to_api(&record)) }))
    }

    async fn delete_run(
        &self,
        request: Request<api::DeleteRunRequest>,
    ) -> Result<Response<api::DeleteRunResponse>, Status> {
        let tenant = tenant_of(&request)?;
        self.runs.remove(&tenant, &request.into_inner().run_id).await?;
        Ok(Response::new(api::DeleteRunResponse {}))
    }

    async fn get_run(
        &self,
        request: Request<api::GetRunRequest>,
    ) -> Result<Response<api::GetRunResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let record = self.runs.get(&tenant, &request.into_inner().run_id).await?;
        Ok(Response::new(api::GetRunResponse { run: Some(run_to_api(&record)) }))
    }

    async fn list_runs(
        &self,
        request: Request<api::ListRunsRequest>,
    ) -> Result<Response<api::ListRunsResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let status = match api::RunStatus::try_from(req.status) {
            Ok(s) => status_from_api(s),
            Err(_) => {
                return Err(runs::Error::from(crate::provision::InvalidField::new(
                    "status",
                    format!("{} is no RunStatus", req.status),
                ))
                .into());
            }
        };
        let some = |s: String| (!s.is_empty()).then_some(s);
        let filter = RunFilter { thread_id: some(req.thread_id), status, text: some(req.query), after: None };
        let (records, next_page_token) = self.runs.list(&tenant, filter, &req.page_token, req.limit).await?;
        Ok(Response::new(api::ListRunsResponse {
            runs: records.iter().map(run_to_api).collect(),
            next_page_token,
        }))
    }

    async fn get_active_run(
        &self,
        request: Request<api::GetActiveRunRequest>,
    ) -> Result<Response<api::GetActiveRunResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let active = self.runs.active(&tenant, &request.into_inner().thread_id).await?;
        Ok(Response::new(api::GetActiveRunResponse { run: active.as_ref().map(run_to_api) }))
    }

    async fn respond_to_request(
        &self,
        request: Request<api::RespondToRequestRequest>,
    ) -> Result<Response<api::RespondToRequestResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let answer = req.answer.ok_or_else(|| {
            runs::Error::from(crate::provision::InvalidField::new("answer", "permission or tool_result"))
        })?;
        let answered = self.runs.respond(&tenant, &req.run_id, &req.request_id, answer).await?;
        Ok(Response::new(api::RespondToRequestResponse { request: Some(answered) }))
    }

    async fn list_requests(
        &self,
        request: Request<api::ListRequestsRequest>,
    ) -> Result<Response<api::ListRequestsResponse>, Status> {
        let tenant = tenant_of(&request)?;
        let req = request.into_inner();
        let requests = self.runs.list_requests(&tenant, &req.run_id, req.include_answered).await?;
        Ok(Response::new(api::ListRequestsResponse { requests }))
    }
}
