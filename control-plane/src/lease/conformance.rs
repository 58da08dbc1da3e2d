//! The one conformance suite of [`LockStore`], instantiated for every
//! backend: in-process always, Redis when `SANDHOLD_TEST_REDIS_URL` is set
//! (required under `scripts/test`). Each test uses its own key namespace so
//! the suite runs in parallel against one shared Redis.
//!
//! The Redis-only tests at the end start their own `redis-server` on a
//! loopback port, because they kill and restart it.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;

/// Generous bound for anything that should happen "soon" on a loaded box.
const PATIENCE: Duration = Duration::from_secs(30);

/// A backend under test: how to get (another connection to) the store, and
/// how to delete a key behind the holder's back.
struct Harness {
    namespace: String,
    new_store: Box<dyn Fn() -> BoxFuture<'static, Arc<dyn LockStore>> + Send + Sync>,
    delete_key: Box<dyn Fn(String) -> BoxFuture<'static, ()> + Send + Sync>,
}

impl Harness {
    fn in_process() -> Self {
        let store = Arc::new(InProcessLockStore::new());
        let (for_new, for_delete) = (store.clone(), store);
        Self {
            namespace: unique_namespace(),
            new_store: Box::new(move || {
                let s: Arc<dyn LockStore> = for_new.clone();
                futures::future::ready(s).boxed()
            }),
            delete_key: Box::new(move |key| {
                for_delete.delete_key(&key);
                futures::future::ready(()).boxed()
            }),
        }
    }

    fn redis() -> Option<Self> {
        let url = sandhold_tests::services::redis_url()?;
        let (for_new, for_delete) = (url.clone(), url);
        Some(Self {
            namespace: unique_namespace(),
            new_store: Box::new(move || {
                let url = for_new.clone();
                async move {
                    let s: Arc<dyn LockStore> = Arc::new(
                        RedisLockStore::connect(&url, Duration::from_secs(2)).await.expect("connect redis"),
                    );
                    s
                }
                .boxed()
            }),
            delete_key: Box::new(move |key| {
                let url = for_delete.clone();
                async move {
                    let client = ::redis::Client::open(url.as_str()).unwrap();
                    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                    let n: i64 = ::redis::cmd("DEL").arg(&key).query_async(&mut conn).await.unwrap();
                    assert_eq!(n, 1, "the key {key} should have existed");
                }
                .boxed()
            }),
        })
    }

    /// A holder with its own connection, as another replica would have.
    async fn holder(&self, ttl_ms: u64, renew_ms: u64) -> Leases {
        let options = LeaseOptions {
            ttl: Duration::from_millis(ttl_ms),
            renew_every: Duration::from_millis(renew_ms),
            namespace: self.namespace.clone(),
        };
        Leases::new((self.new_store)().await, options).unwrap()
    }

    /// A holder whose tokens name `owner`, as a replica's do.
    async fn owned(&self, owner: &str) -> Leases {
        let options = LeaseOptions {
            ttl: Duration::from_millis(5_000),
            renew_every: Duration::from_millis(500),
            namespace: self.namespace.clone(),
        };
        Leases::owned_by((self.new_store)().await, options, owner).unwrap()
    }
}

fn unique_namespace() -> String {
    format!("sandhold-test:{}:lease:", uuid::Uuid::new_v4().simple())
}

async fn fires_within(token: &CancellationToken, within: Duration) -> bool {
    tokio::time::timeout(within, token.cancelled()).await.is_ok()
}

async fn exclusive_acquire(h: Harness) {
    let (a, b) = (h.holder(5_000, 1_000).await, h.holder(5_000, 1_000).await);
    let lease = a.try_acquire("run-1").await.unwrap().expect("a free lease is acquired");
    assert!(b.try_acquire("run-1").await.unwrap().is_none(), "a held lease is refused to another holder");
    assert!(
        a.try_acquire("run-1").await.unwrap().is_none(),
        "a held lease is refused even to the same handle"
    );
    let other = b.try_acquire("run-2").await.unwrap().expect("another name is independent");
    assert!(!lease.is_lost() && !other.is_lost());
    assert_eq!(a.held_count(), 1);
}

async fn release_lets_another_acquire(h: Harness) {
    let (a, b) = (h.holder(5_000, 1_000).await, h.holder(5_000, 1_000).await);
    let lease = a.try_acquire("run").await.unwrap().unwrap();
    let lost = lease.lost();
    assert!(b.try_acquire("run").await.unwrap().is_none());
    assert!(lease.release().await.unwrap(), "release reports the lease was still ours");
    assert!(lost.is_cancelled(), "a released lease is no longer held");
    assert_eq!(a.held_count(), 0);
    let taken = b.try_acquire("run").await.unwrap().expect("released lease is free at once");
    assert!(!taken.is_lost());
}

async fn renewal_keeps_it_past_the_ttl(h: Harness) {
    let (a, b) = (h.holder(1_500, 150).await, h.holder(1_500, 150).await);
    let lease = a.try_acquire("run").await.unwrap().unwrap();
    let lost = lease.lost();
    // Three TTLs pass; without renewal the key would have expired twice.
    let until = Instant::now() + Duration::from_millis(4_500);
    while Instant::now() < until {
        assert!(b.try_acquire("run").await.unwrap().is_none(), "renewed lease was taken over");
        tokio::select! {
            _ = lost.cancelled() => panic!("renewed lease reported lost"),
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
    assert!(lease.release().await.unwrap(), "still ours after three TTLs");
}

async fn expiry_lets_another_take_it(h: Harness) {
    let store = (h.new_store)().await;
    let b = h.holder(5_000, 1_000).await;
    let key = b.key("run");
    // A holder that dies right after acquiring: nobody renews.
    let ttl = Duration::from_millis(1_000);
    let before = Instant::now();
    assert!(store.try_lock(&key, "dead-holder", ttl).await.unwrap());
    assert!(b.try_acquire("run").await.unwrap().is_none(), "refused while the dead holder's ttl runs");
    let lease = tokio::time::timeout(PATIENCE, b.acquire("run", &CancellationToken::new()))
        .await
        .expect("expired lease acquired in time")
        .unwrap()
        .expect("acquire without cancellation returns a lease");
    assert!(before.elapsed() >= ttl, "taken over before the dead holder's ttl ran out");
    assert!(!lease.is_lost());
    assert!(!store.renew(&key, "dead-holder", ttl).await.unwrap(), "the dead holder cannot come back");
}

async fn lost_when_the_key_is_deleted(h: Harness) {
    let (a, b) = (h.holder(3_000, 200).await, h.holder(3_000, 200).await);
    let lease = a.try_acquire("run").await.unwrap().unwrap();
    (h.delete_key)(lease.key().to_string()).await;
    assert!(fires_within(&lease.lost(), PATIENCE).await, "deleting the key fires the lost token");
    assert_eq!(a.held_count(), 0, "a lost lease leaves the registry");
    assert!(b.try_acquire("run").await.unwrap().is_some());
}

async fn lost_when_another_holder_overwrites(h: Harness) {
    let a = h.holder(3_000, 200).await;
    let store = (h.new_store)().await;
    let lease = a.try_acquire("run").await.unwrap().unwrap();
    // Delete, then re-take with another token between two renewals: the
    // key exists again, but not with our token.
    (h.delete_key)(lease.key().to_string()).await;
    assert!(store.try_lock(lease.key(), "intruder", Duration::from_secs(30)).await.unwrap());
    assert!(fires_within(&lease.lost(), PATIENCE).await, "a key holding another token is a lost lease");
    assert!(!store.try_lock(lease.key(), "third", Duration::from_secs(1)).await.unwrap());
    // Releasing the lost lease must not delete the intruder's key.
    assert!(!lease.release().await.unwrap());
    assert!(store.unlock(&a.key("run"), "intruder").await.unwrap(), "the intruder's key survived");
}

async fn another_token_cannot_renew_or_release(h: Harness) {
    let store = (h.new_store)().await;
    let key = format!("{}run", h.namespace);
    let ttl = Duration::from_secs(30);
    assert!(store.try_lock(&key, "token-a", ttl).await.unwrap());
    assert!(!store.try_lock(&key, "token-b", ttl).await.unwrap());
    assert!(!store.renew(&key, "token-b", ttl).await.unwrap(), "a foreign token renewed");
    assert!(!store.unlock(&key, "token-b").await.unwrap(), "a foreign token released");
    assert!(!store.try_lock(&key, "token-c", ttl).await.unwrap(), "foreign release deleted the key");
    assert!(store.renew(&key, "token-a", ttl).await.unwrap());
    assert!(store.unlock(&key, "token-a").await.unwrap());
    assert!(!store.unlock(&key, "token-a").await.unwrap(), "a second release finds nothing");
    assert!(!store.renew(&key, "token-a", ttl).await.unwrap(), "a released key cannot be renewed");
    assert!(store.try_lock(&key, "token-c", ttl).await.unwrap());
}

async fn release_all_frees_everything_and_fires(h: Harness) {
    let (a, b) = (h.holder(5_000, 1_000).await, h.holder(5_000, 1_000).await);
    let one = a.try_acquire("one").await.unwrap().unwrap();
    let two = a.try_acquire("two").await.unwrap().unwrap();
    a.release_all().await;
    assert!(one.is_lost() && two.is_lost(), "shutdown fires every holder's token");
    assert_eq!(a.held_count(), 0);
    assert!(b.try_acquire("one").await.unwrap().is_some());
    assert!(b.try_acquire("two").await.unwrap().is_some());
}

async fn dropping_a_lease_releases_it(h: Harness) {
    let (a, b) = (h.holder(30_000, 1_000).await, h.holder(30_000, 1_000).await);
    drop(a.try_acquire("run").await.unwrap().unwrap());
    // The release runs in the background; it must happen well before the
    // 30 s ttl would free the key.
    let taken = tokio::time::timeout(Duration::from_secs(20), b.acquire("run", &CancellationToken::new()))
        .await
        .expect("a dropped lease is released, not left to expire");
    assert!(taken.unwrap().is_some());
}

async fn only_the_named_holders_exact_lease_can_be_broken(h: Harness) {
    // An owner may contain the token's separator.
    let (a, b) = (h.owned("replica/a").await, h.owned("replica-b").await);
    assert_eq!(b.holder_of("run").await.unwrap(), None, "a free lease has no holder");
    let lease = a.try_acquire("run").await.unwrap().unwrap();
    assert_eq!(b.holder_of("run").await.unwrap().as_deref(), Some("replica/a"));
    assert!(!b.break_lease("run", "replica-c").await.unwrap(), "another owner's name breaks nothing");
    assert!(!b.break_lease("run", "").await.unwrap(), "nor does no name");
    assert!(b.try_acquire("run").await.unwrap().is_none(), "still held");
    assert!(b.break_lease("run", "replica/a").await.unwrap());
    let taken =
        b.try_acquire("run").await.unwrap().expect("a broken lease is free at once, well before its ttl");
    assert!(
        fires_within(&lease.lost(), Duration::from_secs(4)).await,
        "its holder learns at its next renewal"
    );
    assert_eq!(a.holder_of("run").await.unwrap().as_deref(), Some("replica-b"));
    assert!(
        !a.break_lease("run", "replica/a").await.unwrap(),
        "the old owner's name cannot break the new lease"
    );
    assert!(!taken.is_lost());
    // A holder that names no owner is never named, so never broken.
    let anonymous = h.holder(5_000, 1_000).await;
    let held = anonymous.try_acquire("other").await.unwrap().unwrap();
    assert_eq!(b.holder_of("other").await.unwrap(), None);
    assert!(!b.break_lease("other", "").await.unwrap());
    assert!(!held.is_lost());
}

macro_rules! lock_store_suite {
    ($backend:ident, $harness:expr) => {
        mod $backend {
            use super::*;

            lock_store_suite!(@tests $harness;
                exclusive_acquire,
                release_lets_another_acquire,
                renewal_keeps_it_past_the_ttl,
                expiry_lets_another_take_it,
                lost_when_the_key_is_deleted,
                lost_when_another_holder_overwrites,
                another_token_cannot_renew_or_release,
                release_all_frees_everything_and_fires,
                dropping_a_lease_releases_it,
                only_the_named_holders_exact_lease_can_be_broken
            );
        }
    };
    (@tests $harness:expr; $($test:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let harness: Option<Harness> = $harness;
                if let Some(h) = harness {
                    super::$test(h).await;
                }
            }
        )*
    };
}

lock_store_suite!(in_process, Some(Harness::in_process()));
lock_store_suite!(redis, Harness::redis());

/// A `redis-server` of the test's own, on a random loopback port, without
/// persistence, so killing it loses every key.
struct OwnRedis {
    child: std::process::Child,
    port: u16,
}

impl OwnRedis {
    fn program() -> Option<std::path::PathBuf> {
        sandhold_tests::services::program("redis-server")
    }

    fn start(program: &std::path::Path, port: u16) -> Self {
        let child = std::process::Command::new(program)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start redis-server");
        Self { child, port }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + PATIENCE;
        let client = ::redis::Client::open(self.url()).unwrap();
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && ::redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok()
            {
                return;
            }
            assert!(Instant::now() < deadline, "own redis-server did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn own_redis_holder(server: &OwnRedis) -> Leases {
    let options = LeaseOptions {
        ttl: Duration::from_millis(2_000),
        renew_every: Duration::from_millis(200),
        namespace: unique_namespace(),
    };
    let store = RedisLockStore::connect(&server.url(), options.ttl).await.unwrap();
    Leases::new(Arc::new(store), options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_when_the_server_restarts() {
    let Some(program) = OwnRedis::program() else { return };
    let mut server = OwnRedis::start(&program, free_port());
    server.wait_ready().await;
    let leases = own_redis_holder(&server).await;
    let lease = leases.try_acquire("run").await.unwrap().unwrap();

    server.kill();
    let server = OwnRedis::start(&program, server.port);
    server.wait_ready().await;

    // Whether the next renewal meets the fresh server (key gone) or the dead
    // one (errors until the ttl runs out), the token must fire.
    assert!(fires_within(&lease.lost(), PATIENCE).await, "restart of redis fires the lost token");
    // The same connection manager reconnects, and the lease is free again.
    let again = tokio::time::timeout(PATIENCE, leases.acquire("run", &CancellationToken::new()))
        .await
        .expect("re-acquired after the restart");
    assert!(again.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_when_the_server_stays_down() {
    let Some(program) = OwnRedis::program() else { return };
    let mut server = OwnRedis::start(&program, free_port());
    server.wait_ready().await;
    let leases = own_redis_holder(&server).await;
    let lease = leases.try_acquire("run").await.unwrap().unwrap();
    server.kill();
    // Renewals fail from now on; the holder must give up by itself once the
    // ttl after its last good renewal has passed.
    assert!(fires_within(&lease.lost(), PATIENCE).await, "an unreachable redis fires the lost token");
    assert_eq!(leases.held_count(), 0);
    assert!(leases.try_acquire("other").await.is_err(), "the store reports itself unavailable");
}
