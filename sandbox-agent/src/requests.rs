//! `RequestService`: answers to the durable requests of journaled runs (see
//! [`crate::request_dir`] for where they live and how they are recorded).

use std::path::PathBuf;

use shared::error::Error;
use shared::ids::RunId;
use shared::journal::JournalPaths;
use shared::proto::agent::v1::request_service_server::RequestService;
use shared::proto::agent::v1::{AnswerRequest, AnswerResponse, DenyPendingRequest, DenyPendingResponse};
use shared::requests::{Answer, AnsweredBy};
use tonic::{Request, Response, Status};

use crate::context::AgentContext;
use crate::request_dir::{RequestDir, now_ms};

pub struct Requests {
    journal_dir: PathBuf,
}

impl Requests {
    pub fn new(ctx: &AgentContext) -> Self {
        Self { journal_dir: ctx.journal_dir.clone() }
    }

    /// The run's dir and journal, `NOT_FOUND` when it has no requests.
    fn locate(&self, run_id: &str, key: &[u8]) -> Result<(RequestDir, RunId, PathBuf), Error> {
        let run_id = RunId::parse(run_id).map_err(|e| Error::invalid_field("run_id", e.to_string()))?;
        if key.is_empty() {
            return Err(Error::invalid_field("sentinel_key", "required"));
        }
        let Some(dir) = RequestDir::find(&self.journal_dir, &run_id) else {
            return Err(Error::not_found(format!("run {run_id} has no requests")));
        };
        let journal = JournalPaths::new(&self.journal_dir, &run_id).ndjson;
        Ok((dir, run_id, journal))
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Status> {
    Ok(tokio::task::spawn_blocking(f).await.map_err(|e| Error::internal(e.to_string()))??)
}

#[tonic::async_trait]
impl RequestService for Requests {
    async fn answer(&self, req: Request<AnswerRequest>) -> Result<Response<AnswerResponse>, Status> {
        let req = req.into_inner();
        let answer: Answer = serde_json::from_str(&req.answer_json)
            .map_err(|e| Error::invalid_field("answer_json", format!("not an answer: {e}")))?;
        if !shared::requests::valid_request_id(&answer.request_id) {
            return Err(Error::invalid_field("answer_json", "request_id is not [A-Za-z0-9_-]{1,64}").into());
        }
        let (dir, run_id, journal) = self.locate(&req.run_id, &req.sentinel_key)?;
        let key = req.sentinel_key;
        let recorded = blocking(move || {
            let locked = dir.lock(&key, &run_id, &journal)?;
            locked.sync(now_ms())?;
            locked.answer(answer)
        })
        .await?;
        let answer_json = serde_json::to_string(&recorded).expect("serializes");
        Ok(Response::new(AnswerResponse { answer_json }))
    }

    async fn deny_pending(
        &self,
        req: Request<DenyPendingRequest>,
    ) -> Result<Response<DenyPendingResponse>, Status> {
        let req = req.into_inner();
        let by = match req.by.as_str() {
            "cancel" | "" => AnsweredBy::Cancel,
            "deadline" => AnsweredBy::Deadline,
            "client" => AnsweredBy::Client,
            other => {
                return Err(Error::invalid_field(
                    "by",
                    format!("{other:?}: expected cancel, deadline or client"),
                )
                .into());
            }
        };
        let (dir, run_id, journal) = self.locate(&req.run_id, &req.sentinel_key)?;
        let (key, message) = (req.sentinel_key, req.message);
        let request_ids = blocking(move || {
            let locked = dir.lock(&key, &run_id, &journal)?;
            locked.sync(now_ms())?;
            locked.deny_pending(by, &message)
        })
        .await?;
        Ok(Response::new(DenyPendingResponse { request_ids }))
    }
}
