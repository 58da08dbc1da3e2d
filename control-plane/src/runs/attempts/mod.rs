//! Attempts: one task fanned out to N durable runs from one checkpoint,
//! compared, and the winner promoted into the thread.
//!
//! [`Runs::start_attempts`] takes the thread's latest checkpoint (saving
//! one from a fresh sandbox of the definition, set up once, when the
//! thread has none), forks it into N new threads (each with the thread's
//! conversation: `CheckpointStore::fork`), records the set, and starts the
//! prompt in each as an ordinary durable, detached run with
//! `SANDHOLD_ATTEMPT` set. The runs are driven, taken over and reaped like
//! any others. Once an attempt's run has ended, a keeper on any replica
//! ([`evaluate`]) records what it did: its diff against the starting
//! checkpoint, the workspace's `scripts.test` in its sandbox, tokens and
//! duration. [`promote`] makes one attempt the thread's.

mod diff;
mod evaluate;
mod promote;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

pub use evaluate::run_attempt_keeper;

use super::{Error, Runs, StartRun};
use crate::config::OverLimit;
use crate::provision::{InvalidField, Progress};
use crate::store::{
    AttemptRecord, AttemptSetRecord, Checkpoint, RunFilter, RunRecord, RunStatus, Tenant, Timestamp,
};

/// The variable each attempt's processes see: its number, 0 to N-1.
pub const ATTEMPT_VAR: &str = "SANDHOLD_ATTEMPT";

/// What a client asks of [`Runs::start_attempts`]: one run per attempt,
/// each already made from the request (its thread and run id are set
/// here).
pub struct StartAttempts {
    pub tenant: Tenant,
    pub thread_id: String,
    /// Empty: the thread's.
    pub definition_id: String,
    /// The secret values, for the sandbox that sets the base up when the
    /// thread has no checkpoint.
    pub secrets: HashMap<String, String>,
    pub attempts: Vec<AttemptRun>,
}

/// One attempt's run, and what it is labelled with.
pub struct AttemptRun {
    pub harness: String,
    pub model: String,
    pub start: StartRun,
}

/// A set as `GetAttemptSet` shows it: the record, and each attempt with its
/// run as it is now (`None` when its record is gone).
pub struct AttemptView {
    pub set: AttemptSetRecord,
    pub attempts: Vec<(AttemptRecord, Option<RunRecord>)>,
}

/// What an attempt's evaluation found, stored as JSON with the attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub files_changed: u32,
    pub lines_added: u32,
    pub lines_removed: u32,
    pub files: Vec<ChangedFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub test_output_tail: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub test_error: String,
    pub duration_ms: i64,
    /// The attempt's checkpoint (of its thread), when one could be had.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub checkpoint_id: String,
    /// Why the diff could not be made, when it could not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub diff_error: String,
}

/// One file of an attempt's diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangedFile {
    pub path: String,
    /// `added`, `removed` or `modified`.
    pub change: String,
    pub lines_added: u32,
    pub lines_removed: u32,
    pub binary: bool,
}

impl Runs {
    /// Fork the thread's latest checkpoint into one thread per attempt and
    /// start each attempt's run there. Refused whole, before anything is
    /// made, past the operator's maximum or the tenant's quotas; a start
    /// that fails midway cancels the ones started and forgets the set.
    pub async fn start_attempts(&self, req: StartAttempts) -> Result<AttemptView, Error> {
        let cx = &self.inner.ctx;
        let n = req.attempts.len();
        let max = self.inner.options.max_attempts as usize;
        if n == 0 {
            return Err(InvalidField::new("count", "at least one attempt").into());
        }
        if n > max {
            return Err(InvalidField::new(
                "count",
                format!("at most {max} attempts (the operator's max_attempts)"),
            )
            .into());
        }
        if req.thread_id.is_empty() {
            return Err(InvalidField::new("run.thread_id", "required").into());
        }
        let tenant = req.tenant.clone();
        let definition_id = match req.definition_id.as_str() {
            "" => {
                super::thread::definition_of(&cx.stores, &tenant, &req.thread_id).await?.ok_or_else(|| {
                    InvalidField::new(
                        "run.definition_id",
                        format!("required: thread {} has no definition yet", req.thread_id),
                    )
                })?
            }
            id => id.to_string(),
        };
        let definition = self.inner.sandbox.definition(&tenant, &definition_id).await?;
        if !crate::snapshot::enabled(&definition) {
            return Err(Error::Attempts(format!(
                "attempts start from a checkpoint and are compared by theirs: definition {definition_id} needs \
                 portable snapshots (lifecycle.portable_snapshots.enabled)"
            )));
        }
        let head = cx.stores.checkpoints.head(&tenant, &req.thread_id).await?;
        // Each attempt is a run and a sandbox; a thread with no checkpoint
        // needs one more sandbox for its base.
        self.room_for(&tenant, n, n + usize::from(head.is_none())).await?;
        let base = match head {
            Some(head) => head,
            None => self.save_base(&tenant, &req.thread_id, &definition_id, req.secrets).await?,
        };
        let set_id = format!("att-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let mut attempts = Vec::with_capacity(n);
        for (i, a) in req.attempts.iter().enumerate() {
            let thread_id = format!("{set_id}-{i}");
            cx.stores.checkpoints.fork(&tenant, &req.thread_id, &base.checkpoint_id, &thread_id).await?;
            attempts.push(AttemptRecord {
                set_id: set_id.clone(),
                attempt: i as u32,
                run_id: thread_id.clone(),
                thread_id,
                harness: a.harness.clone(),
                model: a.model.clone(),
                evaluation: None,
            });
        }
        let set = AttemptSetRecord {
            set_id: set_id.clone(),
            tenant: tenant.clone(),
            thread_id: req.thread_id.clone(),
            definition_id: definition_id.clone(),
            base_checkpoint_id: base.checkpoint_id.clone(),
            promoted_run_id: None,
            created_at: Timestamp::now(),
        };
        cx.stores.attempts.create(&set, &attempts).await?;
        let mut started = Vec::new();
        for (record, run) in attempts.iter().zip(req.attempts) {
            let mut start = run.start;
            start.tenant = tenant.clone();
            start.thread_id = record.thread_id.clone();
            start.run_id = record.run_id.clone();
            start.definition_id = definition_id.clone();
            start.durable = true;
            start.detach_on_disconnect = Some(true);
            start.options.env.insert(ATTEMPT_VAR.into(), record.attempt.to_string());
            // The run goes on detached: nobody reads this stream.
            match self.start(start).await {
                Ok(_events) => started.push(record.run_id.clone()),
                Err(e) => {
                    warn!(attempt_set = %set_id, attempt = record.attempt, error = %e, "an attempt did not start; cancelling the set");
                    for run in &started {
                        let _ = self.cancel(&tenant, run).await;
                    }
                    let _ = cx.stores.attempts.delete(&tenant, &set_id).await;
                    return Err(e);
                }
            }
        }
        info!(attempt_set = %set_id, thread_id = %req.thread_id, attempts = n, base = %base.checkpoint_id, "attempts started");
        self.attempt_set(&tenant, &set_id).await
    }

    /// The tenant's set `set_id`, with each attempt's run as it is now.
    pub async fn attempt_set(&self, tenant: &Tenant, set_id: &str) -> Result<AttemptView, Error> {
        let stores = &self.inner.ctx.stores;
        let set_id = InvalidField::required("attempt_set_id", set_id)?;
        let (set, records) = stores.attempts.get(tenant, set_id).await?;
        let mut attempts = Vec::with_capacity(records.len());
        for record in records {
            let key =
                crate::store::RunKey::new(tenant.clone(), super::run_id_field("run_id", &record.run_id)?);
            let run = match stores.runs.get(&key).await {
                Ok(run) => Some(run),
                Err(crate::store::Error::NotFound(_)) => None,
                Err(e) => return Err(e.into()),
            };
            attempts.push((record, run));
        }
        Ok(AttemptView { set, attempts })
    }

    /// Refused unless the tenant has room for `runs` more running runs and
    /// `sandboxes` more sandboxes, saying how many attempts fit.
    async fn room_for(&self, tenant: &Tenant, runs: usize, sandboxes: usize) -> Result<(), Error> {
        let stores = &self.inner.ctx.stores;
        let options = &self.inner.options;
        if let Some(max) = options.running_runs.max {
            let mut unfinished = 0;
            for status in [RunStatus::Running, RunStatus::Interrupted] {
                let filter = RunFilter { status: Some(status), ..Default::default() };
                unfinished += stores.runs.list_page(tenant, &filter, max + 1).await?.len();
            }
            refuse_past(tenant, options.running_runs.setting, max, unfinished, runs, "running runs")?;
        }
        if let Some(max) = options.sandboxes.max {
            let held = stores.instances.count(tenant).await? + stores.warm.count_unclaimed(tenant).await?;
            refuse_past(tenant, options.sandboxes.setting, max, held as usize, sandboxes, "sandboxes")?;
        }
        Ok(())
    }

    /// A checkpoint of a thread that has none: its sandbox, ensured (set
    /// up once) and captured.
    async fn save_base(
        &self,
        tenant: &Tenant,
        thread_id: &str,
        definition_id: &str,
        secrets: HashMap<String, String>,
    ) -> Result<Checkpoint, Error> {
        let cx = &self.inner.ctx;
        let sandbox = &self.inner.sandbox;
        let input = crate::sandbox::ensure_input(
            &cx.stores,
            tenant.clone(),
            definition_id,
            thread_id.to_string(),
            String::new(),
            secrets,
        )
        .await?;
        let definition = input.definition.clone();
        let ready = sandbox.ensure(input, &Progress::discard()).await?;
        let live = sandbox.agent(tenant, &ready.sandbox_id).await?;
        let snapshots = definition.lifecycle.as_ref().and_then(|l| l.portable_snapshots.as_ref());
        let save = crate::snapshot::SaveRequest {
            tenant,
            thread_id,
            run_id: "",
            label: "attempts base",
            policy: crate::snapshot::capture_policy(snapshots),
            secrets: &live.secrets,
            maxima: crate::snapshot::Maxima::new(sandbox.snapshot_limits(), snapshots),
        };
        Ok(crate::snapshot::save(&cx.stores, &live.agent, save).await?)
    }
}

/// The refusal of `wanted` more `what` for a tenant holding `held` of `max`.
fn refuse_past(
    tenant: &Tenant,
    setting: &'static str,
    max: u32,
    held: usize,
    wanted: usize,
    what: &str,
) -> Result<(), Error> {
    let room = (max as usize).saturating_sub(held);
    if wanted <= room {
        return Ok(());
    }
    Err(OverLimit {
        message: format!(
            "tenant {tenant} has {held} {what}, the limit ({setting}) is {max}: room for {room}, and the attempts \
             need {wanted}; nothing was started"
        ),
        setting,
        max,
    }
    .into())
}
