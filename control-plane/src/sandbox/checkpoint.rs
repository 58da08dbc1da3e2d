//! Saving a named checkpoint of a thread's live sandbox: which sandbox,
//! whether its definition allows it, and the secret values to zero. The
//! capture itself is [`snapshot::save`]; this sits in the sandbox component
//! because it needs the live sandbox, and the lifecycle in turn restores
//! checkpoints into new sandboxes (so `snapshot` is below `sandbox`).

use shared::proto::v1 as api;

use super::{Error, Sandboxes, definition};
use crate::provision::InvalidField;
use crate::snapshot::{self, Maxima, SaveRequest, capture_policy};
use crate::store::{Checkpoint, Instance, Tenant};

impl Sandboxes {
    /// Capture the tenant's sandbox of a thread (`sandbox_id`, or the
    /// thread's only one) into a new checkpoint, the thread's new head.
    pub async fn save_checkpoint(
        &self,
        tenant: &Tenant,
        req: &api::SaveSnapshotRequest,
    ) -> Result<Checkpoint, Error> {
        let thread_id = InvalidField::required("thread_id", &req.thread_id)?;
        let instance = self.sandbox_of_thread(tenant, thread_id, &req.sandbox_id).await?;
        let stored = self.stores.definitions.get(tenant, &instance.definition_id).await?;
        let definition = definition::from_stored(&stored.body)?;
        let lifecycle = definition.lifecycle.clone().unwrap_or_default();
        if lifecycle.reuse == api::Reuse::None as i32 {
            return Err(Error::PerRunSandbox);
        }
        let live = self.live(tenant, &instance.sandbox_key).await?;
        // Without the secret values nothing could be zeroed. The agent holds
        // them for the sandbox's life (a replica that never saw them saves
        // safely) and refuses a capture without them (SECRETS_MISSING);
        // values this server holds are handed over first.
        let save = SaveRequest {
            tenant,
            thread_id,
            run_id: &req.run_id,
            label: &req.label,
            policy: capture_policy(lifecycle.portable_snapshots.as_ref()),
            secrets: &live.secrets,
            maxima: Maxima::new(self.lifecycle.snapshot_limits(), lifecycle.portable_snapshots.as_ref()),
        };
        Ok(snapshot::save(&self.stores, &live.agent, save).await?)
    }

    /// The tenant's sandbox of `thread_id` to save from: `sandbox_id` when
    /// given, else the thread's only sandbox.
    async fn sandbox_of_thread(
        &self,
        tenant: &Tenant,
        thread_id: &str,
        sandbox_id: &str,
    ) -> Result<Instance, Error> {
        let instances = self.stores.instances.list(Some(tenant)).await?;
        only_sandbox(instances, thread_id, sandbox_id)
    }
}

/// Of `instances`, the one of `thread_id` (and `sandbox_id`, when given).
fn only_sandbox(instances: Vec<Instance>, thread_id: &str, sandbox_id: &str) -> Result<Instance, Error> {
    let mut of_thread: Vec<Instance> = instances
        .into_iter()
        .filter(|i| i.thread_id == thread_id && (sandbox_id.is_empty() || i.sandbox_key == sandbox_id))
        .collect();
    match of_thread.len() {
        0 => Err(Error::NoSandboxToSave(thread_id.to_string())),
        1 => Ok(of_thread.remove(0)),
        n => {
            Err(InvalidField::new("sandbox_id", format!("thread {thread_id} has {n} sandboxes; name one"))
                .into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Timestamp;

    fn instance(key: &str, thread_id: &str) -> Instance {
        Instance {
            sandbox_key: key.into(),
            tenant: Tenant::new("t"),
            provider: "local".into(),
            provider_sandbox_id: format!("p-{key}"),
            native_snapshot: None,
            definition_id: "d".into(),
            thread_id: thread_id.into(),
            created_at: Timestamp::now(),
            updated_at: Timestamp::now(),
            env: Default::default(),
            node: String::new(),
            network: Default::default(),
        }
    }

    #[test]
    fn a_save_takes_the_threads_only_sandbox_or_the_one_named() {
        let all = || vec![instance("a", "t1"), instance("b", "t2"), instance("c", "t2")];
        assert_eq!(only_sandbox(all(), "t1", "").unwrap().sandbox_key, "a");
        assert_eq!(only_sandbox(all(), "t2", "c").unwrap().sandbox_key, "c");
        assert!(matches!(only_sandbox(all(), "t3", ""), Err(Error::NoSandboxToSave(t)) if t == "t3"));
        assert!(matches!(only_sandbox(all(), "t1", "b"), Err(Error::NoSandboxToSave(_))));
        match only_sandbox(all(), "t2", "") {
            Err(Error::InvalidField(e)) => {
                assert_eq!(e, InvalidField::new("sandbox_id", "thread t2 has 2 sandboxes; name one"))
            }
            other => panic!("{other:?}"),
        }
    }
}
