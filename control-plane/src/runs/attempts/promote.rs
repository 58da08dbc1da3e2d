//! Promoting an attempt: its checkpoint becomes the set's thread's head and
//! its run joins that thread (`CheckpointStore::adopt`, one transaction),
//! so the thread's next run restores the winner's files and continues its
//! session; the thread's old sandbox goes (the next ensure makes one from
//! the new head), as do the other attempts' sandboxes. The winner's own
//! sandbox stays with its attempt thread (for a push, or a look).

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::diff::{At, PATCH_MAX, patch};
use super::{AttemptView, Evaluation, Runs};
use crate::runs::Error;
use crate::store::{AttemptRecord, Promotion, Tenant};

impl Runs {
    /// Make attempt `run_id` of set `set_id` the thread's. Again for the
    /// promoted attempt changes nothing; another attempt of a promoted set
    /// is refused. Returns the set and the thread's new head.
    pub async fn promote_attempt(
        &self,
        tenant: &Tenant,
        set_id: &str,
        run_id: &str,
    ) -> Result<(AttemptView, String), Error> {
        let cx = &self.inner.ctx;
        let view = self.attempt_set(tenant, set_id).await?;
        let (attempt, evaluation) = evaluated(&view, run_id)?;
        let thread = view.set.thread_id.clone();
        if let Some(active) = cx.stores.runs.active_run(tenant, &thread).await? {
            return Err(Error::Attempts(format!(
                "thread {thread} has a run going ({}): promote once it has ended",
                active.run_id
            )));
        }
        // One promote of a set at a time, on any replica.
        let cancel = CancellationToken::new();
        let Some(lease) = cx.leases.acquire(&format!("promote:{set_id}"), &cancel).await? else {
            return Err(Error::Attempts("the promote was cancelled".into()));
        };
        let promoted = async {
            match cx.stores.attempts.promote(tenant, set_id, run_id).await? {
                Promotion::Now => {}
                Promotion::Again => {
                    // Done already, unless the promote that marked it died
                    // before copying.
                    let head = cx.stores.checkpoints.head(tenant, &thread).await?;
                    if let Some(head) = head.filter(|h| h.forked_from.as_deref() == Some(&evaluation.checkpoint_id)) {
                        return Ok(head.checkpoint_id);
                    }
                }
                Promotion::Other(other) => {
                    return Err(Error::Attempts(format!(
                        "attempt {other} of set {set_id} was promoted: a set promotes one attempt"
                    )));
                }
            }
            let adopted = cx
                .stores
                .checkpoints
                .adopt(tenant, &attempt.thread_id, &evaluation.checkpoint_id, &attempt.run_id, &thread)
                .await?;
            self.clear_sandboxes(tenant, &view, &attempt).await;
            info!(attempt_set = %set_id, run_id, thread_id = %thread, checkpoint = %adopted.checkpoint.checkpoint_id,
                "attempt promoted");
            Ok::<_, Error>(adopted.checkpoint.checkpoint_id)
        }
        .await;
        let _ = lease.release().await;
        let head = promoted?;
        Ok((self.attempt_set(tenant, set_id).await?, head))
    }

    /// The unified diff of attempt `run_id` against the set's base.
    pub async fn attempt_patch(
        &self,
        tenant: &Tenant,
        set_id: &str,
        run_id: &str,
    ) -> Result<(String, bool), Error> {
        let view = self.attempt_set(tenant, set_id).await?;
        let (attempt, evaluation) = evaluated(&view, run_id)?;
        let base = At { thread_id: &view.set.thread_id, checkpoint_id: &view.set.base_checkpoint_id };
        let head = At { thread_id: &attempt.thread_id, checkpoint_id: &evaluation.checkpoint_id };
        let (text, truncated) =
            patch(&self.inner.ctx.stores, tenant, base, head).await.map_err(Error::Attempts)?;
        debug_assert!(text.len() <= PATCH_MAX);
        Ok((text, truncated))
    }

    /// The thread's sandboxes (its next run restores the new head into a
    /// new one) and the losing attempts'.
    async fn clear_sandboxes(&self, tenant: &Tenant, view: &AttemptView, winner: &AttemptRecord) {
        let stores = &self.inner.ctx.stores;
        let mut keys = Vec::new();
        match stores.instances.list(Some(tenant)).await {
            Ok(instances) => keys.extend(
                instances.into_iter().filter(|i| i.thread_id == view.set.thread_id).map(|i| i.sandbox_key),
            ),
            Err(e) => warn!(error = %e, "listing the thread's sandboxes for a promote failed"),
        }
        keys.extend(
            view.attempts
                .iter()
                .filter(|(a, _)| a.run_id != winner.run_id)
                .filter_map(|(_, run)| run.as_ref()?.sandbox_key.clone()),
        );
        for key in keys {
            if let Err(e) = self.inner.sandbox.destroy(tenant, &key).await
                && !e.is_not_found()
            {
                warn!(sandbox_key = %key, error = %e, "destroying a sandbox after a promote failed");
            }
        }
    }
}

/// Attempt `run_id` of the set and its evaluation, refused unless it has
/// one with a checkpoint.
fn evaluated(view: &AttemptView, run_id: &str) -> Result<(AttemptRecord, Evaluation), Error> {
    let Some((attempt, _)) = view.attempts.iter().find(|(a, _)| a.run_id == run_id) else {
        return Err(crate::provision::InvalidField::new(
            "run_id",
            format!("not an attempt of set {}", view.set.set_id),
        )
        .into());
    };
    let Some(value) = &attempt.evaluation else {
        return Err(Error::Attempts(format!(
            "attempt {run_id} has not been evaluated yet: its run has not ended, or ended a moment ago"
        )));
    };
    let evaluation: Evaluation = serde_json::from_value(value.clone())
        .map_err(|e| Error::Corrupt(format!("attempt {run_id}: unreadable evaluation: {e}")))?;
    if evaluation.checkpoint_id.is_empty() {
        return Err(Error::Attempts(format!(
            "attempt {run_id} has no checkpoint to promote: {}",
            evaluation.diff_error
        )));
    }
    Ok((attempt.clone(), evaluation))
}
