//! Requests of runs: what a harness asks its client (a permission under an
//! `ask` rule, a call of a client tool), answered from any replica.
//!
//! The sandbox agent records each request and each answer in the run's
//! journal (sealed lines, `shared::requests`); the translation turns them
//! into chunks like any other line, so a replay after a takeover reproduces
//! them in place. Answering goes to the agent, which decides exactly once
//! (the first answer wins, on any replica); its record reaches the log
//! through whichever replica drives the run. The pending set is read from
//! the log's request index (written with the chunks), never kept in memory,
//! and never by reading the whole log: listing costs what it lists, an
//! answer a lookup by id. (A run whose log predates the index has it built
//! from the log once, on its first list or answer.)

use shared::chunk::{Chunk, ChunkType};
use shared::error::{Error as WireError, ErrorCode};
use shared::policy::Policy;
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use shared::requests::{Answer, AnsweredBy};
use tracing::info;

use super::{Error, Runs, run_id_field};
use crate::provision::InvalidField;
use crate::store::Tenant;
use crate::store::{IndexedRequest, RequestFilter, RunKey};

/// Longest declared tool description and input schema.
const MAX_TOOL_TEXT: usize = 64 << 10;
/// Most client tools per run.
const MAX_CLIENT_TOOLS: usize = 64;
/// Longest answer (message or tool result).
const MAX_ANSWER: usize = 1 << 20;

/// The policy of a definition (allow everything when it has none).
pub(crate) fn definition_policy(d: &api::SandboxDefinition) -> Result<Policy, Error> {
    Ok(match &d.policy {
        Some(p) => crate::sandbox::policy_from_api(p, "definition.policy")?,
        None => Policy::default(),
    })
}

/// The client tools of a start, checked, in the agent's form.
pub(crate) fn client_tools(tools: Vec<api::ClientTool>) -> Result<Vec<agent::ClientTool>, Error> {
    if tools.len() > MAX_CLIENT_TOOLS {
        return Err(InvalidField::new("client_tools", format!("at most {MAX_CLIENT_TOOLS}")).into());
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.into_iter().enumerate() {
        let at = format!("client_tools[{i}]");
        if !shared::requests::valid_request_id(&t.name) {
            return Err(InvalidField::new(format!("{at}.name"), "1-64 characters of [A-Za-z0-9_-]").into());
        }
        if t.name == "permission" {
            return Err(
                InvalidField::new(format!("{at}.name"), "\"permission\" is the policy's own tool").into()
            );
        }
        if !seen.insert(t.name.clone()) {
            return Err(
                InvalidField::new(format!("{at}.name"), format!("{:?} is declared twice", t.name)).into()
            );
        }
        if t.description.len() > MAX_TOOL_TEXT || t.input_schema_json.len() > MAX_TOOL_TEXT {
            return Err(InvalidField::new(
                at,
                format!("description and schema of at most {MAX_TOOL_TEXT} bytes"),
            )
            .into());
        }
        if !t.input_schema_json.is_empty() {
            match serde_json::from_str::<serde_json::Value>(&t.input_schema_json) {
                Ok(serde_json::Value::Object(_)) => {}
                _ => {
                    return Err(
                        InvalidField::new(format!("{at}.input_schema_json"), "a JSON Schema object").into()
                    );
                }
            }
        }
        out.push(agent::ClientTool {
            name: t.name,
            description: t.description,
            input_schema_json: t.input_schema_json,
        });
    }
    Ok(out)
}

/// The requests a run's chunks record, in the order asked, each with its
/// answer once one is recorded (the first, should a record repeat).
pub(crate) fn requests_of<'a>(chunks: impl IntoIterator<Item = (String, &'a Chunk)>) -> Vec<api::RunRequest> {
    let mut out: Vec<api::RunRequest> = Vec::new();
    for (offset, c) in chunks {
        let Some(r) = &c.request else { continue };
        let asked = match c.r#type() {
            ChunkType::PermissionRequested => true,
            ChunkType::ToolCallStart => r.awaiting_client,
            _ => false,
        };
        if asked {
            if out.iter().all(|q| q.request_id != r.request_id) {
                out.push(api::RunRequest {
                    request_id: r.request_id.clone(),
                    kind: r.kind.clone(),
                    tool: c.tool_name.clone(),
                    input_json: r.input_json.clone(),
                    rule: r.rule.clone(),
                    tool_call_id: c.tool_call_id.clone(),
                    deadline_ms: r.deadline_ms,
                    offset,
                    answer: None,
                });
            }
            continue;
        }
        let answered = matches!(c.r#type(), ChunkType::PermissionResolved | ChunkType::ToolCallResult);
        if answered
            && !r.answered_by.is_empty()
            && let Some(q) = out.iter_mut().find(|q| q.request_id == r.request_id && q.answer.is_none())
        {
            q.answer = Some(api::RequestAnswer {
                allowed: r.allowed,
                message: c.content.clone(),
                is_error: c.is_error,
                answered_by: r.answered_by.clone(),
                scope: r.scope.clone(),
            });
        }
    }
    out
}

impl Runs {
    /// The run's requests from its log: the waiting ones, or all.
    pub async fn list_requests(
        &self,
        tenant: &Tenant,
        run_id: &str,
        include_answered: bool,
    ) -> Result<Vec<api::RunRequest>, Error> {
        let key = RunKey::new(tenant.clone(), run_id_field("run_id", run_id)?);
        self.record(&key).await?;
        super::log::backfill_requests(self.inner.ctx.stores.events.as_ref(), &key).await?;
        let filter = if include_answered { RequestFilter::All } else { RequestFilter::Pending };
        let indexed = self.inner.ctx.stores.events.requests(&key, filter).await?;
        indexed.iter().map(run_request).collect()
    }

    /// One request of the run, by id, from the index.
    async fn logged_request(&self, key: &RunKey, request_id: &str) -> Result<Option<api::RunRequest>, Error> {
        match self.inner.ctx.stores.events.request(key, request_id).await? {
            Some(indexed) => run_request(&indexed).map(Some),
            None => Ok(None),
        }
    }

    /// Answer one of the run's requests. The agent in the run's sandbox
    /// decides whether this answer is the first; the log records it once
    /// the run's driver reads it.
    pub async fn respond(
        &self,
        tenant: &Tenant,
        run_id: &str,
        request_id: &str,
        answer: api::respond_to_request_request::Answer,
    ) -> Result<api::RunRequest, Error> {
        let key = RunKey::new(tenant.clone(), run_id_field("run_id", run_id)?);
        if !shared::requests::valid_request_id(request_id) {
            return Err(InvalidField::new("request_id", "1-64 characters of [A-Za-z0-9_-]").into());
        }
        let record = self.record(&key).await?;
        super::log::backfill_requests(self.inner.ctx.stores.events.as_ref(), &key).await?;
        let logged = self.logged_request(&key, request_id).await?;
        let answered = |done: &api::RequestAnswer| {
            Error::RequestClosed(format!(
                "request {request_id} was answered already (by {})",
                done.answered_by
            ))
        };
        if record.status.is_terminal() {
            // An answer given before the run ended is still the answer.
            if let Some(done) = logged.as_ref().and_then(|r| r.answer.as_ref()) {
                return Err(answered(done));
            }
            return Err(Error::RequestClosed(format!(
                "run {run_id} has ended ({}): its requests were denied with it",
                record.status.as_str()
            )));
        }
        let answer = match (answer, logged.as_ref().map(|r| r.kind.as_str())) {
            (api::respond_to_request_request::Answer::Permission(p), Some("network")) => {
                if !matches!(p.scope.as_str(), "" | "once" | "run" | "thread") {
                    return Err(InvalidField::new("permission.scope", "once, run or thread").into());
                }
                Answer {
                    request_id: request_id.into(),
                    allowed: p.allow,
                    message: p.message,
                    is_error: false,
                    always: false,
                    scope: if p.allow && !p.scope.is_empty() { p.scope } else { String::new() },
                    by: AnsweredBy::Client,
                }
            }
            (api::respond_to_request_request::Answer::Permission(p), None | Some("permission")) => {
                if !p.scope.is_empty() {
                    return Err(InvalidField::new("permission.scope", "only for a network request").into());
                }
                Answer {
                    request_id: request_id.into(),
                    allowed: p.allow,
                    message: p.message,
                    is_error: false,
                    always: p.always,
                    scope: String::new(),
                    by: AnsweredBy::Client,
                }
            }
            (api::respond_to_request_request::Answer::ToolResult(t), None | Some("client_tool")) => Answer {
                request_id: request_id.into(),
                allowed: !t.is_error,
                message: t.content,
                is_error: t.is_error,
                always: false,
                scope: String::new(),
                by: AnsweredBy::Client,
            },
            (_, Some(kind)) => {
                return Err(InvalidField::new(
                    "answer",
                    format!(
                        "request {request_id} is a {kind} request: answer it with {}",
                        answer_field(kind)
                    ),
                )
                .into());
            }
        };
        if answer.message.len() > MAX_ANSWER {
            return Err(InvalidField::new("answer", format!("at most {MAX_ANSWER} bytes")).into());
        }
        if let Some(done) = logged.as_ref().and_then(|r| r.answer.as_ref()) {
            return Err(answered(done));
        }
        let Some(sandbox) = record.sandbox_key.clone() else {
            return Err(Error::RequestNotFound { run: key.run.clone(), request: request_id.into() });
        };
        let cx = &self.inner.ctx;
        let live = cx.lifecycle.agent(&cx.stores, tenant, &sandbox).await.map_err(Error::Unreachable)?;
        let request = agent::AnswerRequest {
            run_id: key.run.to_string(),
            sentinel_key: record.sentinel_key.expose().as_bytes().to_vec(),
            answer_json: serde_json::to_string(&answer).expect("answers serialize"),
        };
        match live.agent.requests().answer(request).await {
            Ok(_) => {}
            Err(status) => {
                let wire = WireError::from_status(&status);
                return Err(match wire.code {
                    ErrorCode::NotFound => {
                        Error::RequestNotFound { run: key.run.clone(), request: request_id.into() }
                    }
                    ErrorCode::FailedPrecondition => Error::RequestClosed(wire.message),
                    _ => Error::AnswerRefused(status),
                });
            }
        }
        info!(run_id = %key.run, request_id, allowed = answer.allowed, "request answered");
        let mut answered =
            logged.unwrap_or_else(|| api::RunRequest { request_id: request_id.into(), ..Default::default() });
        answered.answer = Some(api::RequestAnswer {
            allowed: answer.allowed,
            message: answer.message,
            is_error: answer.is_error,
            answered_by: AnsweredBy::Client.as_str().into(),
            scope: answer.scope,
        });
        Ok(answered)
    }
}

/// An indexed request as the API shows it: its two chunks read like a log.
fn run_request(indexed: &IndexedRequest) -> Result<api::RunRequest, Error> {
    let mut chunks = vec![(indexed.asked.offset.to_string(), super::log::decode_chunk(&indexed.asked)?)];
    if let Some(answered) = &indexed.answered {
        chunks.push((answered.offset.to_string(), super::log::decode_chunk(answered)?));
    }
    requests_of(chunks.iter().map(|(o, c)| (o.clone(), c))).into_iter().next().ok_or_else(|| {
        Error::Corrupt(format!("request {} is indexed at a chunk that asks nothing", indexed.request_id))
    })
}

fn answer_field(kind: &str) -> &'static str {
    if kind == "client_tool" { "tool_result" } else { "permission" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{policy_from_api, policy_to_api};
    use shared::chunk::ChunkRequest;
    use shared::policy::{Action, Effect};

    fn chunk(ty: ChunkType, request: ChunkRequest) -> Chunk {
        Chunk { r#type: ty as i32, tool_name: "Bash".into(), request: Some(request), ..Default::default() }
    }

    #[test]
    fn the_log_tells_which_requests_wait_and_the_first_answer_counts() {
        let asked = |id: &str| {
            chunk(
                ChunkType::PermissionRequested,
                ChunkRequest { request_id: id.into(), kind: "permission".into(), ..Default::default() },
            )
        };
        let answered = |id: &str, allowed: bool, by: &str| {
            chunk(
                ChunkType::PermissionResolved,
                ChunkRequest { request_id: id.into(), allowed, answered_by: by.into(), ..Default::default() },
            )
        };
        let tool = Chunk {
            r#type: ChunkType::ToolCallStart as i32,
            tool_name: "lookup".into(),
            request: Some(ChunkRequest {
                request_id: "t1".into(),
                kind: "client_tool".into(),
                awaiting_client: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let plain_tool = Chunk { r#type: ChunkType::ToolCallStart as i32, ..Default::default() };
        let log = [
            asked("r1"),
            plain_tool,
            asked("r2"),
            answered("r1", true, "client"),
            asked("r1"), // a record repeated after an agent crash
            answered("r1", false, "deadline"),
            tool,
        ];
        let requests = requests_of(log.iter().enumerate().map(|(i, c)| (i.to_string(), c)));
        let ids: Vec<_> = requests.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2", "t1"]);
        let first = requests[0].answer.as_ref().unwrap();
        assert_eq!((first.allowed, first.answered_by.as_str()), (true, "client"));
        assert_eq!(requests[0].offset, "0");
        assert!(requests[1].answer.is_none());
        assert_eq!(requests[2].kind, "client_tool");
    }

    #[test]
    fn api_policies_are_checked_and_named() {
        let rule = |action: api::PolicyAction, pattern: &str, effect: api::PolicyEffect| api::PolicyRule {
            action: action as i32,
            pattern: pattern.into(),
            effect: effect as i32,
        };
        let ok = api::SandboxPolicy {
            default: api::PolicyEffect::Ask as i32,
            rules: vec![rule(api::PolicyAction::Command, "git push*", api::PolicyEffect::Deny)],
            request_timeout_ms: 0,
        };
        let p = policy_from_api(&ok, "policy").unwrap();
        assert_eq!(p.default, Effect::Ask);
        assert_eq!(p.decide(Action::Command, "git push").effect, Effect::Deny);
        assert_eq!(policy_from_api(&policy_to_api(&p), "policy").unwrap(), p);
        let bad = api::SandboxPolicy {
            rules: vec![rule(api::PolicyAction::Unspecified, "x", api::PolicyEffect::Deny)],
            ..Default::default()
        };
        assert!(policy_from_api(&bad, "policy").unwrap_err().to_string().contains("policy.rules[0].action"));
        let glob = api::SandboxPolicy {
            rules: vec![rule(api::PolicyAction::FileWrite, "[", api::PolicyEffect::Deny)],
            ..Default::default()
        };
        assert!(policy_from_api(&glob, "policy").is_err());
    }

    #[test]
    fn client_tools_are_checked() {
        let tool = |name: &str, schema: &str| api::ClientTool {
            name: name.into(),
            description: "d".into(),
            input_schema_json: schema.into(),
        };
        assert_eq!(client_tools(vec![tool("lookup", r#"{"type":"object"}"#)]).unwrap().len(), 1);
        for bad in [
            vec![tool("bad name", "")],
            vec![tool("permission", "")],
            vec![tool("a", ""), tool("a", "")],
            vec![tool("a", "[1]")],
        ] {
            assert!(client_tools(bad).is_err());
        }
    }
}
