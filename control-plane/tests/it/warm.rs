//! Warm pools end to end on a real server: a definition with
//! `lifecycle.warm` keeps sandboxes set up and idle; a new thread claims
//! one (outcome CLAIMED) with its own secrets, the pool refills, a changed
//! definition replaces its pooled sandboxes and a deleted one empties its
//! pool; pooled sandboxes count against the tenant's quota; two replicas
//! never hand out one sandbox twice.

use std::time::Duration;

use sandhold_tests::local::agent_daemons;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::{definition, put_definition};
use sandhold_tests::sandbox::{ensure, of_thread, sh};
use sandhold_tests::server::*;
use sandhold_tests::wait::{PATIENCE, eventually};
use shared::proto::v1 as api;

/// A local definition `id` with a pool of `warm` whose setup records what
/// it saw: `setup.txt` (`tag`) and whether the secret TOKEN was set.
fn pooled(id: &str, warm: u32, tag: &str) -> api::SandboxDefinition {
    let mut def = definition(id, Kind::Local);
    def.secret_names = vec!["TOKEN".into()];
    def.workspace = Some(api::WorkspaceDefinition {
        setup: vec![api::SetupStep {
            step: Some(api::setup_step::Step::Serial(format!(
                "echo {tag} > setup.txt; echo \"${{TOKEN:-unset}}\" > token-at-setup.txt"
            ))),
        }],
        ..Default::default()
    });
    def.lifecycle = Some(api::Lifecycle { warm, ..Default::default() });
    def
}

async fn pool_of(client: &mut Sandboxes, id: &str) -> Option<api::WarmPool> {
    let pools = client.list_warm_pools(api::ListWarmPoolsRequest {}).await.unwrap().into_inner().pools;
    pools.into_iter().find(|p| p.definition_id == id)
}

/// Wait until the pool `id` holds `ready` sandboxes ready and none being made.
async fn wait_ready(s: &TenantServer, client: &mut Sandboxes, id: &str, ready: u32) -> api::WarmPool {
    let filled = eventually(PATIENCE, || {
        let mut client = client.clone();
        async move { pool_of(&mut client, id).await.is_some_and(|p| p.ready == ready && p.refilling == 0) }
    })
    .await;
    let pool = pool_of(client, id).await;
    assert!(filled, "pool {id} never held {ready} ready: {pool:?}\n{}", s.server.log_text());
    pool.unwrap()
}

fn request(id: &str, thread: &str, token: &str) -> api::EnsureSandboxRequest {
    api::EnsureSandboxRequest {
        definition_id: id.into(),
        thread_id: thread.into(),
        secrets: [("TOKEN".to_string(), token.to_string())].into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_thread_claims_a_set_up_sandbox_with_its_own_secrets_and_the_pool_refills() {
    let s = TenantServer::start("warm", &["other"]).await;
    let mut client = s.server.sandboxes(&s.token).await;
    put_definition(&mut client, pooled("def", 2, "first")).await;
    let pool = wait_ready(&s, &mut client, "def", 2).await;
    assert_eq!((pool.target, pool.claimed), (2, 0), "{pool:?}");
    let data = s.server.data_dir().to_path_buf();
    assert_eq!(agent_daemons(&data).len(), 2, "two pooled sandboxes run");

    let (_, ready) = ensure(&mut client, request("def", "thread-1", "value-one")).await;
    let ready = ready.unwrap();
    assert_eq!(ready.outcome(), api::EnsureOutcome::Claimed, "{ready:?}");
    let one = ready.sandbox_id.clone();
    // Set up before the claim, without the secret; the claimer's value
    // reaches its processes.
    assert_eq!(sh(&mut client, &one, "cat setup.txt").await, (0, "first\n".into()));
    assert_eq!(sh(&mut client, &one, "cat token-at-setup.txt").await, (0, "unset\n".into()));
    assert_eq!(sh(&mut client, &one, "printf %s \"$TOKEN\"").await, (0, "value-one".into()));

    // The pool makes another; a second thread gets another sandbox.
    let pool = wait_ready(&s, &mut client, "def", 2).await;
    assert_eq!(pool.claimed, 1, "{pool:?}");
    let (_, two) = ensure(&mut client, request("def", "thread-2", "value-two")).await;
    let two = two.unwrap();
    assert_eq!(two.outcome(), api::EnsureOutcome::Claimed);
    let first = of_thread(&mut client, "thread-1").await;
    let second = of_thread(&mut client, "thread-2").await;
    assert_ne!(first.provider_sandbox_id, second.provider_sandbox_id, "one sandbox claimed twice");
    assert_eq!(sh(&mut client, &two.sandbox_id, "printf %s \"$TOKEN\"").await.1, "value-two");
    // The first thread's next ensure resumes its own sandbox.
    let (_, again) = ensure(&mut client, request("def", "thread-1", "value-one")).await;
    let again = again.unwrap();
    assert_eq!((again.outcome(), again.sandbox_id.as_str()), (api::EnsureOutcome::Resumed, one.as_str()));

    // Another tenant's definition of the same id and content has a pool of
    // its own: it never gets this tenant's sandboxes.
    let mut other = s.server.sandboxes(&s.token_of("other")).await;
    put_definition(&mut other, pooled("def", 0, "first")).await;
    let (_, theirs) = ensure(&mut other, request("def", "thread-1", "theirs-value")).await;
    let theirs = theirs.unwrap();
    assert_eq!(theirs.outcome(), api::EnsureOutcome::Created, "another tenant claimed from this pool");
    assert!(pool_of(&mut other, "def").await.is_none(), "a tenant sees another's pool");

    // A changed definition: its pooled sandboxes are replaced, and a claim
    // gets the new setup.
    put_definition(&mut client, pooled("def", 1, "second")).await;
    wait_ready(&s, &mut client, "def", 1).await;
    let (_, three) = ensure(&mut client, request("def", "thread-3", "value-three")).await;
    let three = three.unwrap();
    assert_eq!(three.outcome(), api::EnsureOutcome::Claimed);
    assert_eq!(sh(&mut client, &three.sandbox_id, "cat setup.txt").await.1, "second\n");

    // A deleted definition takes its pool with it; claimed sandboxes stay
    // their threads'.
    wait_ready(&s, &mut client, "def", 1).await;
    client.delete_definition(api::DeleteDefinitionRequest { id: "def".into() }).await.unwrap();
    let emptied = eventually(PATIENCE, || {
        let data = data.clone();
        // thread-1, thread-2, thread-3 and the other tenant's: 4 left.
        async move { agent_daemons(&data).len() == 4 }
    })
    .await;
    assert!(emptied, "the deleted definition's pool kept running:\n{}", s.server.log_text());
    assert!(pool_of(&mut client, "def").await.is_none());
    assert_eq!(
        sh(&mut client, &one, "cat setup.txt").await.1,
        "first\n",
        "a claimed sandbox went with the pool"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pooled_sandboxes_count_against_the_tenants_quota() {
    let s = TenantServer::start_with_args("warm-quota", &[], &["--max-sandboxes-per-tenant", "2"]).await;
    let mut client = s.server.sandboxes(&s.token).await;
    // A pool of 4 under a quota of 2: two are made, and the pool says why
    // the rest are not.
    put_definition(&mut client, pooled("def", 4, "q")).await;
    let stopped =
        eventually(PATIENCE, || {
            let mut client = client.clone();
            async move {
                pool_of(&mut client, "def").await.is_some_and(|p| p.ready == 2 && !p.last_error.is_empty())
            }
        })
        .await;
    let pool = pool_of(&mut client, "def").await.unwrap();
    assert!(stopped, "{pool:?}\n{}", s.server.log_text());
    assert!(pool.last_error.contains("sandboxes"), "{pool:?}");
    let data = s.server.data_dir().to_path_buf();
    assert_eq!(agent_daemons(&data).len(), 2, "the pool made more than the quota");

    for thread in ["thread-1", "thread-2"] {
        let (_, ready) = ensure(&mut client, request("def", thread, "value-quota")).await;
        assert_eq!(ready.unwrap().outcome(), api::EnsureOutcome::Claimed);
    }
    let (_, third) = ensure(&mut client, request("def", "thread-3", "value-quota")).await;
    let refused = third.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(agent_daemons(&data).len(), 2, "a sandbox past the quota is running");
}

/// A pooled sandbox being made counts once, not twice (its row and its
/// admission): under a quota of 2, while the pool's one sandbox is still in
/// its setup, a thread gets a sandbox of its own; a third is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooled_sandbox_being_made_counts_once_against_the_quota() {
    let s = TenantServer::start_with_args("warm-once", &[], &["--max-sandboxes-per-tenant", "2"]).await;
    let mut client = s.server.sandboxes(&s.token).await;
    let hold = s.server.data_dir().with_file_name("hold");
    std::fs::write(&hold, b"").unwrap();
    let mut slow = pooled("slow", 1, "s");
    slow.workspace.as_mut().unwrap().setup.push(api::SetupStep {
        step: Some(api::setup_step::Step::Serial(format!(
            "while [ -e {} ]; do sleep 0.1; done",
            hold.display()
        ))),
    });
    put_definition(&mut client, slow).await;
    put_definition(&mut client, pooled("plain", 0, "p")).await;
    let making = eventually(PATIENCE, || {
        let mut client = client.clone();
        async move { pool_of(&mut client, "slow").await.is_some_and(|p| p.refilling == 1) }
    })
    .await;
    assert!(making, "{:?}\n{}", pool_of(&mut client, "slow").await, s.server.log_text());

    let (_, mine) = ensure(&mut client, request("plain", "thread-1", "value-once")).await;
    let mine = mine.unwrap_or_else(|e| panic!("one pooled in the making and none else is 1 of 2: {e}"));
    assert_eq!(mine.outcome(), api::EnsureOutcome::Created);
    let (_, third) = ensure(&mut client, request("plain", "thread-2", "value-once")).await;
    assert_eq!(third.unwrap_err().code(), tonic::Code::ResourceExhausted);
    std::fs::remove_file(&hold).unwrap();
    wait_ready(&s, &mut client, "slow", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_definition_asking_for_more_than_the_operator_allows_or_a_secret_clone_is_refused() {
    let s = TenantServer::start_with_args("warm-refused", &[], &["--max-warm-per-definition", "3"]).await;
    let mut client = s.server.sandboxes(&s.token).await;
    let refused = client
        .put_definition(api::PutDefinitionRequest { definition: Some(pooled("def", 4, "x")) })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("at most 3"), "{}", refused.message());

    let mut cloned = pooled("git", 1, "x");
    cloned.secret_names.push("GIT_TOKEN".into());
    cloned.workspace.as_mut().unwrap().source = Some(api::Source {
        source: Some(api::source::Source::Git(api::GitSource {
            url: "https://git.invalid/acme/app.git".into(),
            auth_secret: "GIT_TOKEN".into(),
            ..Default::default()
        })),
    });
    let refused =
        client.put_definition(api::PutDefinitionRequest { definition: Some(cloned) }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("GIT_TOKEN"), "{}", refused.message());
}

/// The reaper, with no grace for orphans, sweeps while a pool holds a ready
/// sandbox and a thread holds one it claimed: it destroys neither (their
/// labels carry the pool's key, which no thread's record has), and it does
/// destroy a sandbox a dead keeper left unrecorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reaper_keeps_ready_and_claimed_pooled_sandboxes() {
    let s = TenantServer::start_with_args(
        "warm-reaper",
        &[],
        &["--sweep-interval-ms", "0", "--orphan-sandbox-grace-ms", "0", "--operator-tenant", "ops"],
    )
    .await;
    let mut client = s.server.sandboxes(&s.token).await;
    put_definition(&mut client, pooled("def", 1, "r")).await;
    wait_ready(&s, &mut client, "def", 1).await;
    let (_, claimed) = ensure(&mut client, request("def", "thread-1", "value-reaper")).await;
    let claimed = claimed.unwrap();
    assert_eq!(claimed.outcome(), api::EnsureOutcome::Claimed);
    wait_ready(&s, &mut client, "def", 1).await;
    let data = s.server.data_dir().to_path_buf();
    assert_eq!(agent_daemons(&data).len(), 2);

    let mut admin = s.server.admin(&s.token).await;
    let swept = admin.sweep(api::SweepRequest {}).await.unwrap().into_inner();
    assert_eq!(swept.sandboxes_reclaimed, 0, "{swept:?}");
    assert_eq!(agent_daemons(&data).len(), 2, "the reaper took a pooled sandbox");
    assert_eq!(sh(&mut client, &claimed.sandbox_id, "cat setup.txt").await.1, "r\n");
    let pool = pool_of(&mut client, "def").await.unwrap();
    assert_eq!((pool.ready, pool.claimed), (1, 1), "{pool:?}");
}

/// Two replicas on PostgreSQL, each ensuring new threads at once from a
/// pool of 3: every thread gets its own sandbox (no claim twice), each
/// claim is one of the pool's, and the pool refills once, not per replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_never_hand_out_one_pooled_sandbox_twice() {
    // `None`: the services are missing and not required (a skip).
    let Some(cluster) = sandhold_tests::cluster::Cluster::create("warm-replicas").await else { return };
    let (tenant, token) = (format!("t{}", cluster.nonce), format!("tok-{}", cluster.nonce));
    let tokens = vec![format!("{tenant}={token}")];
    let a = cluster.replica("a", tokens.clone(), (5000, 1000), Vec::new()).await;
    let b = cluster.replica("b", tokens, (5000, 1000), Vec::new()).await;
    let mut client_a = a.sandboxes(&token).await;
    let client_b = b.sandboxes(&token).await;
    put_definition(&mut client_a, pooled("def", 3, "rep")).await;
    let filled = eventually(PATIENCE, || {
        let mut client = client_a.clone();
        async move { pool_of(&mut client, "def").await.is_some_and(|p| p.ready == 3 && p.refilling == 0) }
    })
    .await;
    assert!(filled, "{:?}\n{}", pool_of(&mut client_a, "def").await, a.log_text());
    // Both replicas keep the pool; one at a time makes its sandboxes.
    assert_eq!(agent_daemons(&cluster.data_dir()).len(), 3, "the pool was filled by each replica");

    let ensures = (0..6).map(|i| {
        let mut client = if i % 2 == 0 { client_a.clone() } else { client_b.clone() };
        async move {
            ensure(&mut client, request("def", &format!("thread-{i}"), "value-replica")).await.1.unwrap()
        }
    });
    let ready = futures::future::join_all(ensures).await;
    let claimed = ready.iter().filter(|r| r.outcome() == api::EnsureOutcome::Claimed).count();
    assert!(claimed >= 3, "the pool's three ready sandboxes were not all claimed: {claimed}");
    let mut provider_ids = Vec::new();
    for i in 0..6 {
        provider_ids.push(of_thread(&mut client_a, &format!("thread-{i}")).await.provider_sandbox_id);
    }
    let distinct: std::collections::BTreeSet<_> = provider_ids.iter().collect();
    assert_eq!(distinct.len(), 6, "a pooled sandbox went to two threads: {provider_ids:?}");
    drop((a, b));
    cluster.tear_down().await;
}
