//! Starting a run: validate what is asked, take the run's lease, create the
//! record (and, for a durable run, its first chunk), and spawn its drive.
//! The caller gets the ensure progress followed by the run's log.

use std::collections::HashMap;

use futures::StreamExt;
use shared::chunk::{self, ChunkFactory, RUN_ACCEPTED};
use shared::proto::v1 as api;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::drive::{DriveCtx, FreshStart, Interrupts, Unresumed};
use super::log::encode_chunk;
use super::usage::RunBudget;
use super::{Error, RunEvents, RunSpec, Runs};
use crate::harness::{Harness, HarnessOptions};
use crate::provision::{InvalidField, Progress};
use crate::store::{self, Admitted, FIRST_EPOCH, LogWriter, NewRun, Offset, SentinelKey, Tenant, Timestamp};

/// What a client asks of [`Runs::start`].
#[derive(Debug)]
pub struct StartRun {
    pub tenant: Tenant,
    pub thread_id: String,
    /// Empty: a generated id (refused for a durable run).
    pub run_id: String,
    /// A harness name (`Harness::parse`).
    pub harness: String,
    pub options: HarnessOptions,
    pub prompt: String,
    pub definition_id: String,
    /// Values of the definition's secrets, for this run only. Never stored.
    pub secrets: HashMap<String, String>,
    pub durable: bool,
    /// `None`: as `durable`.
    pub detach_on_disconnect: Option<bool>,
    pub cwd: String,
    /// Start a new harness session instead of continuing the thread's.
    pub new_session: bool,
    /// Tightens the definition's policy (checked already).
    pub policy: Option<shared::policy::Policy>,
    /// Tools the client runs itself (checked by [`Runs::start`]).
    pub client_tools: Vec<shared::proto::v1::ClientTool>,
    /// The run's token budget (each limit set takes the definition's place).
    pub budget: Option<shared::proto::v1::Budget>,
}

impl Runs {
    /// The session the thread's newest ended run of `harness` worked in:
    /// the one the thread's next run of that harness continues. Its files
    /// live in the sandbox that run used: a run of another definition gets
    /// another sandbox, so it starts a new session and says so (as does a
    /// run whose ensure does not resume that sandbox: see the driver).
    async fn thread_session(
        &self,
        tenant: &Tenant,
        thread_id: &str,
        definition_id: &str,
        harness: Harness,
    ) -> Result<Session, Error> {
        let stores = &self.inner.ctx.stores;
        let mut runs = stores.runs.list_by_thread(tenant, thread_id).await?;
        runs.sort_by_key(|r| std::cmp::Reverse(r.started_at.as_millis()));
        let found = runs.into_iter().find_map(|r| {
            let spec = RunSpec::of(&r).ok().filter(|s| s.harness == harness.name())?;
            Some((r.session_id?, spec.definition_id))
        });
        let Some((session, definition)) = found else { return Ok(Session::None) };
        if definition != definition_id {
            return Ok(Session::Lost(lost_session(
                harness,
                &session,
                &format!("lived in a sandbox of definition {definition}"),
            )));
        }
        Ok(Session::Continue(session))
    }

    /// Start a run and stream it: the sandbox's ensure progress, then the
    /// run's log until its terminal chunk.
    pub async fn start(&self, req: StartRun) -> Result<RunEvents, Error> {
        if req.thread_id.is_empty() {
            return Err(InvalidField::new("thread_id", "required").into());
        }
        let harness =
            Harness::parse(&req.harness).map_err(|e| InvalidField::new("harness", e.to_string()))?;
        let run = if req.run_id.is_empty() {
            if req.durable {
                return Err(InvalidField::new(
                    "run_id",
                    "required for a durable run: its journal and event ids derive from it",
                )
                .into());
            }
            store::generated_run_id()
        } else {
            super::run_id_field("run_id", &req.run_id)?
        };
        let cx = &self.inner.ctx;
        let tenant = req.tenant;
        // No definition named: the thread's (it keeps its sandbox).
        let definition_id = match req.definition_id {
            id if !id.is_empty() => id,
            _ => {
                super::thread::definition_of(&cx.stores, &tenant, &req.thread_id).await?.ok_or_else(|| {
                    InvalidField::new(
                        "definition_id",
                        format!(
                            "required: thread {} has no run or sandbox whose definition it would keep",
                            req.thread_id
                        ),
                    )
                })?
            }
        };
        let input = crate::sandbox::ensure_input(
            &cx.stores,
            tenant.clone(),
            &definition_id,
            req.thread_id.clone(),
            run.to_string(),
            req.secrets,
        )
        .await?;
        let mut options = req.options;
        // The run's policy within its definition's.
        let outer = super::requests::definition_policy(&input.definition)?;
        options.policy = match req.policy {
            Some(own) => own.within(&outer),
            None => outer,
        };
        options.client_tools = super::requests::client_tools(req.client_tools)?;
        let budget = RunBudget::of(req.budget.as_ref(), input.definition.budget.as_ref());
        // The broker counts the tokens: without it a budget would be
        // accepted and never enforced.
        if budget.is_some() && !matches!(crate::egress::upstream_for(&input.definition, harness), Ok(Some(_)))
        {
            let field = if req.budget.is_some_and(|b| b != Default::default()) {
                "budget"
            } else {
                "definition.budget"
            };
            return Err(InvalidField::new(
                field,
                format!(
                    "a token budget is counted by the model broker: definition {definition_id} gives the {} harness \
                     no model_access",
                    harness.name()
                ),
            )
            .into());
        }
        // Past the tenant's daily budget a brokered run would end at its
        // first answer: refused now.
        let daily_max = self.inner.options.tenant_daily_tokens;
        if daily_max > 0 && matches!(crate::egress::upstream_for(&input.definition, harness), Ok(Some(_))) {
            let used = super::daily::tokens_today(cx.stores.runs.as_ref(), &tenant).await?;
            if used >= daily_max {
                return Err(Error::BudgetExceeded {
                    limit: "tenant_daily_tokens".into(),
                    max: daily_max,
                    used,
                });
            }
        }
        let mut notes = Vec::new();
        let mut unless_resumed = None;
        // Network asks are requests of the run: it needs a request dir
        // even when its policy asks nothing.
        let network_asks = input.definition.network.as_ref().is_some_and(|n| !n.ask.is_empty());
        let build = |options: &HarnessOptions| {
            let mut command =
                harness.command(options, &req.prompt).map_err(|e| Error::InvalidCommand(e.to_string()))?;
            if network_asks && command.requests.is_none() {
                command.requests = Some(crate::harness::policy::request_setup(options));
            }
            Ok::<_, Error>(command)
        };
        if options.resume_session_id.is_none() && !req.new_session && harness.has_sessions() {
            match self.thread_session(&tenant, &req.thread_id, &definition_id, harness).await? {
                Session::Continue(id) => {
                    // Should the ensure not resume the sandbox, its files are
                    // gone, unless a restored checkpoint carried them.
                    let why = if harness.carries_sessions() {
                        "lived in a sandbox that is gone, and no checkpoint of the thread carried it"
                    } else {
                        "lived in a sandbox that is gone (its sessions do not travel in checkpoints)"
                    };
                    let note = lost_session(harness, &id, why);
                    unless_resumed = Some(Unresumed { fresh: build(&options)?, note, session: id.clone() });
                    options.resume_session_id = Some(id);
                }
                Session::Lost(note) => notes.push(note),
                Session::None => {}
            }
        }
        let command = build(&options)?;
        // The record keeps what the run was asked for people to read; a
        // secret value typed into it is kept as its marker, like everywhere.
        let masks = crate::provision::redactor(&input.secrets)?;
        let (prompt, prompt_truncated) = super::spec::kept_prompt(&masks.mask(&req.prompt));
        let spec = RunSpec {
            harness: harness.name().to_owned(),
            definition_id,
            durable: req.durable,
            detach_on_disconnect: req.detach_on_disconnect.unwrap_or(req.durable),
            cwd: req.cwd,
            session_env: crate::harness::session::LOCATION_VARS
                .iter()
                .filter_map(|k| options.env.get(*k).map(|v| ((*k).to_owned(), v.clone())))
                .collect(),
            program: Some(command.cli_program())
                .filter(|_| harness.carries_sessions())
                .unwrap_or_default()
                .to_owned(),
            output: command.output,
            command: options.command.iter().map(|arg| masks.mask(arg)).collect(),
            prompt,
            prompt_truncated,
            budget,
        };
        // The lease first: from the record's creation on, an attach on
        // another replica must see the run as driven.
        let key = store::RunKey::new(tenant.clone(), run.clone());
        let Some(lease) = cx.leases.try_acquire(&super::lease_name(&key)).await? else {
            return Err(Error::AlreadyExists(run));
        };
        let sentinel_key = SentinelKey::random();
        // Counted and created in one step in the store, so two starts on
        // any replicas cannot both take the tenant's last slot.
        let limit = self.inner.options.running_runs;
        let admitted = cx
            .stores
            .runs
            .create_within(
                NewRun {
                    run_id: run.clone(),
                    thread_id: req.thread_id.clone(),
                    tenant: tenant.clone(),
                    sentinel_key: sentinel_key.clone(),
                    sandbox_key: None,
                    started_at: Timestamp::now(),
                    spec: Some(serde_json::to_value(&spec).expect("a spec serializes")),
                    definition_id: Some(spec.definition_id.clone()),
                },
                limit.max,
            )
            .await;
        let created = match admitted {
            Ok(Admitted::Run(c)) if c.created => c,
            Ok(Admitted::Full { unfinished }) => {
                let _ = lease.release().await;
                let refusal = limit.exceeded(tenant.as_str(), unfinished, "running runs");
                info!(run_id = %run, tenant = %tenant, unfinished, "run refused: {refusal}");
                return Err(refusal.into());
            }
            Ok(_) => {
                let _ = lease.release().await;
                return Err(Error::AlreadyExists(run));
            }
            Err(e) => {
                let _ = lease.release().await;
                return Err(e.into());
            }
        };
        let writer = LogWriter::new(cx.stores.events.clone(), key.clone(), FIRST_EPOCH);
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
                    session_id: None,
                };
                let _ = cx.stores.runs.finish(&key, FIRST_EPOCH, finish).await;
                let _ = cx.stores.events.close(&key).await;
                let _ = lease.release().await;
                return Err(e.into());
            }
        }
        let drive = self.register(&key, spec.detach_on_disconnect).expect("a new run is not driven yet");
        let (progress, _, progress_rx) = Progress::channel();
        let ctx = DriveCtx {
            key: key.clone(),
            thread_id: req.thread_id,
            harness,
            sentinel_key: created.record.sentinel_key.expose().as_bytes().to_vec(),
            writer,
            interrupts: Interrupts { shutdown: cx.shutdown.clone(), lease_lost: lease.lost(), drive },
            lease,
            spec,
            session: Default::default(),
            definition: Default::default(),
            usage: Default::default(),
        };
        info!(run_id = %run, harness = harness.name(), durable = ctx.spec.durable, "run accepted");
        crate::metrics::runs().started();
        let fresh = FreshStart { input, command, progress, notes, unless_resumed };
        let log_ended = CancellationToken::new();
        let log = self.log_stream(key.clone(), Offset::start(), log_ended.clone());
        self.inner.drives.spawn(self.clone().drive(ctx, Some(fresh)));
        let progress = ReceiverStream::new(progress_rx).filter_map(|item| async move {
            match item {
                Ok(api::EnsureSandboxResponse {
                    event: Some(api::ensure_sandbox_response::Event::Progress(p)),
                }) => Some(Ok(api::RunEvent { event: Some(api::run_event::Event::Progress(p)) })),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            }
        });
        let (stream, gone) = self.client_stream(key.clone(), Box::pin(progress.chain(log)));
        // As for an attach: should this drive lose its lease with nobody
        // else taking the run, its client is not left waiting.
        self.keep_taking_over(key, gone, log_ended);
        Ok(stream)
    }
}

fn lost_session(harness: Harness, session: &str, why: &str) -> String {
    format!("the thread's {} session {session} {why}; this run starts a new session", harness.name())
}

/// What a thread's next run does about its harness session.
enum Session {
    /// Continue this session: its files are in the sandbox the run gets.
    Continue(String),
    /// There was one, but its files are gone: a new session, and this note.
    Lost(String),
    /// None to continue.
    None,
}
