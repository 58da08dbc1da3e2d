//! Evaluating attempts whose runs have ended and been concluded (their
//! driver let go of the run's lease): their checkpoint (the one the run's
//! end saved, else one taken now from the attempt's sandbox), the
//! diff against the set's base, the workspace's `scripts.test` in the
//! sandbox, and the run's duration. A keeper on every replica does it
//! under a lease per attempt, so a replica that dies mid-evaluation leaves
//! it to the next pass of any other.

use std::collections::HashMap;
use std::time::Duration;

use shared::proto::agent::v1 as agent;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::diff::{At, changed_files};
use super::{Evaluation, Runs};
use crate::store::{AttemptRecord, AttemptSetRecord, Checkpoint, RunKey, RunRecord, Tenant};

/// How often the keeper looks for attempts to evaluate.
const KEEP_EVERY: Duration = Duration::from_secs(2);

/// Attempts one pass takes at most.
const PER_PASS: u32 = 64;

/// How long `scripts.test` may run.
const TEST_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// Bytes of the test's output kept (its end).
const TEST_TAIL: usize = 4096;

/// Evaluate ended attempts until `shutdown`.
pub async fn run_attempt_keeper(runs: Runs, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(KEEP_EVERY) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = runs.evaluate_ended() => {}
        }
    }
}

impl Runs {
    /// One pass: every attempt not evaluated whose run has ended.
    pub(crate) async fn evaluate_ended(&self) {
        let cx = &self.inner.ctx;
        let pending = match cx.stores.attempts.unevaluated(PER_PASS).await {
            Ok(pending) => pending,
            Err(e) => {
                warn!(error = %e, "reading the attempts to evaluate failed");
                return;
            }
        };
        let mut sets: HashMap<String, AttemptSetRecord> = HashMap::new();
        for (tenant, attempt) in pending {
            let Ok(run_id) = super::super::run_id_field("run_id", &attempt.run_id) else { continue };
            let key = RunKey::new(tenant.clone(), run_id);
            let run = match cx.stores.runs.get(&key).await {
                Ok(run) if run.status.is_terminal() => run,
                Ok(_) => continue,
                Err(e) => {
                    debug!(run_id = %attempt.run_id, error = %e, "an attempt's run is unreadable");
                    continue;
                }
            };
            // A run is terminal before its driver's conclusion is done: the
            // session's export and the checkpoint after the run come after
            // the terminal write, under the run's lease. Evaluated before
            // them, the attempt would get a checkpoint of its own, without
            // the session (a promoted winner whose conversation does not
            // continue). A driver that died meanwhile lets its lease lapse.
            match cx.leases.try_acquire(&super::super::lease_name(&key)).await {
                Ok(Some(driver)) => {
                    let _ = driver.release().await;
                }
                Ok(None) => {
                    debug!(run_id = %attempt.run_id, "an attempt's run is still concluding");
                    continue;
                }
                Err(e) => {
                    debug!(run_id = %attempt.run_id, error = %e, "an attempt's run lease is unreadable");
                    continue;
                }
            }
            let name = format!("attempt:{}:{}", attempt.set_id, attempt.attempt);
            let Ok(Some(lease)) = cx.leases.try_acquire(&name).await else { continue };
            // A set's attempts end together: its record is read once a pass.
            let known = sets.get(&attempt.set_id).cloned();
            let read = match known {
                Some(set) => Ok(set),
                None => cx.stores.attempts.get(&tenant, &attempt.set_id).await.map(|(set, _)| set),
            };
            let set = match read {
                Ok(set) => {
                    sets.insert(set.set_id.clone(), set.clone());
                    set
                }
                Err(e) => {
                    debug!(attempt_set = %attempt.set_id, error = %e, "an attempt's set is unreadable");
                    let _ = lease.release().await;
                    continue;
                }
            };
            let evaluation = self.evaluate(&tenant, &set, &attempt, &run).await;
            let value = serde_json::to_value(&evaluation).expect("an evaluation serializes");
            match cx.stores.attempts.evaluated(&set.set_id, attempt.attempt, &value).await {
                Ok(()) => {
                    info!(attempt_set = %set.set_id, attempt = attempt.attempt, files = evaluation.files_changed,
                    test = ?evaluation.test_exit_code, "attempt evaluated")
                }
                Err(e) => {
                    warn!(attempt_set = %set.set_id, error = %e, "recording an attempt's evaluation failed")
                }
            }
            let _ = lease.release().await;
        }
    }

    async fn evaluate(
        &self,
        tenant: &Tenant,
        set: &AttemptSetRecord,
        attempt: &AttemptRecord,
        run: &RunRecord,
    ) -> Evaluation {
        let mut evaluation = Evaluation {
            duration_ms: run.finished_at.map_or(0, |f| f.as_millis() - run.started_at.as_millis()),
            ..Default::default()
        };
        let definition = match self.inner.sandbox.definition(tenant, &set.definition_id).await {
            Ok(definition) => Some(definition),
            Err(e) => {
                evaluation.test_error = format!("the set's definition is unreadable: {e}");
                None
            }
        };
        let sandbox = run.sandbox_key.as_deref();
        match self.attempt_checkpoint(tenant, attempt, sandbox, definition.as_ref()).await {
            Ok(checkpoint) => {
                evaluation.checkpoint_id = checkpoint.checkpoint_id.clone();
                let stores = &self.inner.ctx.stores;
                let base = At { thread_id: &set.thread_id, checkpoint_id: &set.base_checkpoint_id };
                let head = At { thread_id: &attempt.thread_id, checkpoint_id: &checkpoint.checkpoint_id };
                match changed_files(stores, tenant, base, head).await {
                    Ok(files) => {
                        evaluation.files_changed = files.len() as u32;
                        evaluation.lines_added = files.iter().map(|f| f.lines_added).sum();
                        evaluation.lines_removed = files.iter().map(|f| f.lines_removed).sum();
                        evaluation.files = files;
                    }
                    Err(e) => evaluation.diff_error = e,
                }
            }
            Err(e) => evaluation.diff_error = e,
        }
        let script = definition
            .as_ref()
            .and_then(|d| d.workspace.as_ref())
            .and_then(|w| w.scripts.get("test"))
            .filter(|s| !s.trim().is_empty());
        if let Some(script) = script {
            match self.run_test(tenant, sandbox, script).await {
                Ok((code, tail)) => {
                    evaluation.test_exit_code = Some(code);
                    evaluation.test_output_tail = tail;
                }
                Err(e) => evaluation.test_error = e,
            }
        }
        evaluation
    }

    /// The attempt's own checkpoint: the one its run's end saved (its
    /// thread's head, not the fork's copy of the base), else one taken now
    /// from its sandbox (a failed run saves none).
    async fn attempt_checkpoint(
        &self,
        tenant: &Tenant,
        attempt: &AttemptRecord,
        sandbox: Option<&str>,
        definition: Option<&shared::proto::v1::SandboxDefinition>,
    ) -> Result<Checkpoint, String> {
        let stores = &self.inner.ctx.stores;
        let head = stores.checkpoints.head(tenant, &attempt.thread_id).await.map_err(|e| e.to_string())?;
        if let Some(head) = head.filter(|h| h.forked_from.is_none()) {
            return Ok(head);
        }
        let gone =
            "the attempt saved no checkpoint and its sandbox is gone (cancelled, or destroyed after its run)";
        let (Some(key), Some(definition)) = (sandbox, definition) else { return Err(gone.into()) };
        let live = self.inner.sandbox.agent(tenant, key).await.map_err(|_| gone.to_string())?;
        let snapshots = definition.lifecycle.as_ref().and_then(|l| l.portable_snapshots.as_ref());
        let save = crate::snapshot::SaveRequest {
            tenant,
            thread_id: &attempt.thread_id,
            run_id: &attempt.run_id,
            label: "attempt",
            policy: crate::snapshot::capture_policy(snapshots),
            secrets: &live.secrets,
            maxima: crate::snapshot::Maxima::new(self.inner.sandbox.snapshot_limits(), snapshots),
        };
        crate::snapshot::save(stores, &live.agent, save)
            .await
            .map_err(|e| format!("saving the attempt's checkpoint: {e}"))
    }

    /// `script` in the attempt's sandbox: its exit code and the end of its
    /// output (stdout, then stderr; secret values masked).
    async fn run_test(
        &self,
        tenant: &Tenant,
        sandbox: Option<&str>,
        script: &str,
    ) -> Result<(i32, String), String> {
        let gone = "the attempt's sandbox is gone (cancelled, or destroyed after its run)";
        let key = sandbox.ok_or(gone)?;
        let live = self.inner.sandbox.agent(tenant, key).await.map_err(|_| gone.to_string())?;
        let mut env: std::collections::HashMap<String, String> =
            live.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (name, value) in live.process_secrets() {
            env.entry(name.clone()).or_insert_with(|| value.expose().to_string());
        }
        let request = agent::ExecRequest {
            command: Some(agent::Command { kind: Some(agent::command::Kind::Shell(script.to_string())) }),
            cwd: String::new(),
            env,
            stdin: Vec::new(),
            timeout_ms: Some(TEST_TIMEOUT_MS),
            output_limit_bytes: Some(64 * 1024),
            mask_secrets: true,
        };
        let out = live
            .agent
            .process()
            .exec(request)
            .await
            .map_err(|s| format!("running scripts.test: {}", s.message()))?;
        let out = out.into_inner();
        if out.timed_out {
            return Err(format!(
                "scripts.test ran past {} minutes and was stopped",
                TEST_TIMEOUT_MS / 60_000
            ));
        }
        let code = match out.status.and_then(|s| s.status) {
            Some(agent::exit_status::Status::Code(code)) => code,
            Some(agent::exit_status::Status::Signal(signal)) => 128 + signal,
            None => return Err("scripts.test ended without an exit status".into()),
        };
        let mut output = out.stdout;
        output.extend_from_slice(&out.stderr);
        let start = output.len().saturating_sub(TEST_TAIL);
        Ok((code, String::from_utf8_lossy(&output[start..]).into_owned()))
    }
}
