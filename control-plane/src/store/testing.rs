//! Records for the stores' own unit tests (compiled only for them). The
//! throwaway databases they run on come from `sandhold_tests::database`.

use super::{NewRun, RunId, SentinelKey, Tenant, Timestamp};

/// A run record with nothing but its identity, started now: no sandbox, no
/// spec. For tests and benchmarks of the log and the run store.
pub fn bare_run(run_id: RunId, tenant: &str, thread_id: &str) -> NewRun {
    NewRun {
        run_id,
        thread_id: thread_id.into(),
        tenant: Tenant::new(tenant),
        sentinel_key: SentinelKey::new("k"),
        sandbox_key: None,
        started_at: Timestamp::now(),
        spec: None,
    }
}
