//! The holder's side, built once on top of any [`LockStore`]: acquiring,
//! renewing in the background, noticing a loss, releasing at shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{InProcessLockStore, LeaseError, LeaseOptions, LockStore, RedisLockStore};

impl LeaseOptions {
    /// Renewal must sit well inside the TTL: with `renew_every > ttl / 2` a
    /// single slow round trip loses the lease.
    pub fn validate(&self) -> Result<(), LeaseError> {
        self.check().map_err(LeaseError::Invalid)
    }
}

/// The holder's side of a lock store: a cheap clonable handle that acquires
/// leases and keeps track of the ones held, so shutdown can release them.
#[derive(Clone)]
pub struct Leases {
    inner: Arc<LeasesInner>,
}

struct LeasesInner {
    store: Arc<dyn LockStore>,
    options: LeaseOptions,
    /// Who holds the leases taken through this handle (the replica's id),
    /// written into each token; empty: nobody in particular.
    owner: String,
    held: Mutex<HashMap<u64, Held>>,
    next_id: AtomicU64,
    /// Waiters in [`Leases::acquire`] by store key: a release through this
    /// handle wakes one at once instead of leaving it to its next poll
    /// (runs of one thread starting together queue on its sandbox's lease).
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
}

impl LeasesInner {
    /// The wake-up of `key`'s waiters; [`LeasesInner::unwait`] when done.
    fn wait_on(&self, key: &str) -> Arc<Notify> {
        let mut map = self.waiters.lock().expect("lease waiters poisoned");
        map.entry(key.to_string()).or_default().clone()
    }

    fn unwait(&self, key: &str, notify: Arc<Notify>) {
        let mut map = self.waiters.lock().expect("lease waiters poisoned");
        drop(notify);
        // Clones are only made under this lock: one left is the map's own.
        if map.get(key).is_some_and(|n| Arc::strong_count(n) == 1) {
            map.remove(key);
        }
    }

    /// `key` was released here: the next waiter for it tries now.
    fn released(&self, key: &str) {
        if let Some(n) = self.waiters.lock().expect("lease waiters poisoned").get(key) {
            n.notify_one();
        }
    }
}

/// What `release_all` needs of a held lease.
struct Held {
    key: String,
    token: String,
    lost: CancellationToken,
    stop_renewing: CancellationToken,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("backend", &self.inner.store.backend_name())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl Leases {
    pub fn new(store: Arc<dyn LockStore>, options: LeaseOptions) -> Result<Self, LeaseError> {
        Self::owned_by(store, options, "")
    }

    /// Leases whose tokens name `owner` (a replica id), so another replica
    /// can tell whose a held lease is ([`Leases::holder_of`]).
    pub fn owned_by(
        store: Arc<dyn LockStore>,
        options: LeaseOptions,
        owner: &str,
    ) -> Result<Self, LeaseError> {
        options.validate()?;
        Ok(Self {
            inner: Arc::new(LeasesInner {
                store,
                options,
                owner: owner.to_string(),
                held: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                waiters: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn backend_name(&self) -> &'static str {
        self.inner.store.backend_name()
    }

    pub fn options(&self) -> &LeaseOptions {
        &self.inner.options
    }

    /// The store key of lease `name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{}", self.inner.options.namespace, name)
    }

    /// Number of leases this handle currently holds.
    pub fn held_count(&self) -> usize {
        self.inner.held.lock().expect("lease registry poisoned").len()
    }

    /// Take lease `name` if nobody holds it. The returned lease renews
    /// itself until released, dropped, or lost.
    pub async fn try_acquire(&self, name: &str) -> Result<Option<Lease>, LeaseError> {
        validate_name(name)?;
        let key = self.key(name);
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let token = if self.inner.owner.is_empty() {
            nonce
        } else {
            format!("{}{OWNER_END}{nonce}", self.inner.owner)
        };
        let ttl = self.inner.options.ttl;
        // The lease is valid for `ttl` from *before* the request left: the
        // store starts its clock later, so the holder's view expires first.
        let sent = Instant::now();
        if !self.inner.store.try_lock(&key, &token, ttl).await? {
            return Ok(None);
        }
        let valid_until = sent + ttl;
        if Instant::now() >= valid_until {
            // Acquired, but the answer came so late the lease is already
            // spent from our side; give it back rather than hold it blind.
            let _ = self.inner.store.unlock(&key, &token).await;
            return Err(LeaseError::Unavailable(format!("acquiring {key:?} took longer than the ttl")));
        }
        Ok(Some(self.start_holding(name, key, token, valid_until)))
    }

    /// Wait for lease `name`, retrying until it is free. `Ok(None)` when
    /// `cancel` fires first. Store errors are retried too: a waiter outlives
    /// a store restart.
    pub async fn acquire(&self, name: &str, cancel: &CancellationToken) -> Result<Option<Lease>, LeaseError> {
        validate_name(name)?;
        // Polling at the renewal interval bounds the wait after a holder
        // dies to its TTL plus one interval. A release through this handle
        // wakes a waiter at once; the poll is for other holders.
        let interval = self.inner.options.renew_every.min(Duration::from_secs(1));
        let key = self.key(name);
        let notify = self.inner.wait_on(&key);
        let result = loop {
            // Registered before the attempt, so a release in between wakes it.
            let released = notify.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.try_acquire(name).await {
                Ok(Some(lease)) => break Ok(Some(lease)),
                Ok(None) => {}
                Err(err) => debug!(lease = name, error = %err, "lease acquire attempt failed, retrying"),
            }
            tokio::select! {
                _ = cancel.cancelled() => break Ok(None),
                _ = tokio::time::sleep(interval) => {}
                _ = &mut released => {}
            }
        };
        self.inner.unwait(&key, notify);
        result
    }

    /// The owner named in the token lease `name` holds now: `None` when it
    /// is free or its holder named no owner.
    pub async fn holder_of(&self, name: &str) -> Result<Option<String>, LeaseError> {
        validate_name(name)?;
        let token = self.inner.store.holder(&self.key(name)).await?;
        Ok(token.as_deref().and_then(owner_of).map(str::to_string))
    }

    /// Free lease `name` if `owner` holds it, whatever its expiry: for a
    /// holder known to be gone (its process died) whose lease would
    /// otherwise block everyone for the rest of its TTL. Only the exact
    /// token read is deleted, so a lease someone else took meanwhile stays.
    /// The holder, were it alive after all, loses the lease at its next
    /// renewal; the database's epoch fence keeps its writes out.
    pub async fn break_lease(&self, name: &str, owner: &str) -> Result<bool, LeaseError> {
        validate_name(name)?;
        let key = self.key(name);
        let Some(token) = self.inner.store.holder(&key).await? else { return Ok(false) };
        if owner.is_empty() || owner_of(&token) != Some(owner) {
            return Ok(false);
        }
        self.inner.store.unlock(&key, &token).await
    }

    /// Release every lease held through this handle and fire their tokens,
    /// so their holders stop work. Used at shutdown; time-boxed per lease.
    pub async fn release_all(&self) {
        let held: Vec<Held> = {
            let mut map = self.inner.held.lock().expect("lease registry poisoned");
            map.drain().map(|(_, h)| h).collect()
        };
        for h in held {
            h.stop_renewing.cancel();
            h.lost.cancel();
            match tokio::time::timeout(Duration::from_secs(2), self.inner.store.unlock(&h.key, &h.token))
                .await
            {
                Ok(Ok(_)) => info!(lease_key = %h.key, "lease released at shutdown"),
                Ok(Err(err)) => {
                    warn!(lease_key = %h.key, error = %err, "could not release lease; it will expire")
                }
                Err(_) => warn!(lease_key = %h.key, "releasing lease timed out; it will expire"),
            }
        }
    }

    fn start_holding(&self, name: &str, key: String, token: String, valid_until: Instant) -> Lease {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let lost = CancellationToken::new();
        let stop_renewing = CancellationToken::new();
        self.inner.held.lock().expect("lease registry poisoned").insert(
            id,
            Held {
                key: key.clone(),
                token: token.clone(),
                lost: lost.clone(),
                stop_renewing: stop_renewing.clone(),
            },
        );
        let renewer = tokio::spawn(renew_loop(
            self.inner.clone(),
            id,
            key.clone(),
            token.clone(),
            valid_until,
            lost.clone(),
            stop_renewing.clone(),
        ));
        debug!(lease = name, lease_key = %key, "lease acquired");
        Lease {
            id,
            name: name.to_string(),
            key,
            token,
            lost,
            stop_renewing,
            renewer: Some(renewer),
            leases: self.inner.clone(),
            released: false,
        }
    }
}

/// Ends the owner part of a token (replica ids may contain anything else;
/// the random part after it never contains it).
const OWNER_END: char = '/';

fn owner_of(token: &str) -> Option<&str> {
    token.rsplit_once(OWNER_END).map(|(owner, _)| owner).filter(|o| !o.is_empty())
}

fn validate_name(name: &str) -> Result<(), LeaseError> {
    if name.is_empty() || name.len() > 256 || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(LeaseError::Invalid(format!("lease name {name:?} must be 1..=256 visible characters")));
    }
    Ok(())
}

/// Renew until stopped or lost. Invariant: `lost` fires no later than `ttl`
/// after the send time of the last successful renewal, whatever the store
/// does (errors are retried only until then, and a hung call is cut off).
async fn renew_loop(
    leases: Arc<LeasesInner>,
    id: u64,
    key: String,
    token: String,
    mut valid_until: Instant,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let LeaseOptions { ttl, renew_every, .. } = leases.options.clone();
    // After a failed renewal retry sooner than the interval, so one blip
    // does not eat most of the remaining TTL.
    let retry_every = (renew_every / 4).max(Duration::from_millis(20));
    let mut next = Instant::now() + renew_every;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(next.min(valid_until)) => {}
        }
        let sent = Instant::now();
        if sent >= valid_until {
            warn!(lease_key = %key, "lease expired without a successful renewal");
            break;
        }
        let attempt = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout_at(valid_until, leases.store.renew(&key, &token, ttl)) => r,
        };
        match attempt {
            Ok(Ok(true)) => {
                valid_until = sent + ttl;
                next = sent + renew_every;
            }
            Ok(Ok(false)) => {
                warn!(lease_key = %key, "lease lost: the key expired or another holder took it");
                break;
            }
            Ok(Err(err)) => {
                warn!(lease_key = %key, error = %err, "lease renewal failed, retrying until the ttl runs out");
                next = Instant::now() + retry_every;
            }
            Err(_) => {
                warn!(lease_key = %key, "lease renewal did not answer before the ttl ran out");
                break;
            }
        }
    }
    leases.held.lock().expect("lease registry poisoned").remove(&id);
    lost.cancel();
}

/// A held lease. Renews itself in the background; [`Lease::lost`] fires when
/// it stops being held for any reason (lost, released, released at
/// shutdown, dropped). Dropping it without [`Lease::release`] releases it in
/// the background on a best-effort basis.
pub struct Lease {
    id: u64,
    name: String,
    key: String,
    token: String,
    lost: CancellationToken,
    stop_renewing: CancellationToken,
    renewer: Option<JoinHandle<()>>,
    leases: Arc<LeasesInner>,
    released: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("name", &self.name).field("key", &self.key).finish_non_exhaustive()
    }
}

impl Lease {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespaced store key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Fires when this lease is no longer held. Work done under the lease
    /// must stop when it fires.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Stop renewing and delete the key if it is still ours. `Ok(true)` when
    /// it was still ours.
    pub async fn release(mut self) -> Result<bool, LeaseError> {
        self.released = true;
        self.stop_renewing.cancel();
        if let Some(renewer) = self.renewer.take() {
            // The renewer stops at its next await point; waiting keeps a
            // renewal from landing after the delete.
            let _ = renewer.await;
        }
        self.leases.held.lock().expect("lease registry poisoned").remove(&self.id);
        let result = self.leases.store.unlock(&self.key, &self.token).await;
        self.leases.released(&self.key);
        self.lost.cancel();
        debug!(lease = %self.name, "lease released");
        result
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop_renewing.cancel();
        self.lost.cancel();
        let was_held = self.leases.held.lock().map(|mut m| m.remove(&self.id).is_some()).unwrap_or(false);
        if !was_held {
            return;
        }
        // Without a runtime (process teardown) the key simply expires.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let leases = self.leases.clone();
            let (key, token) = (std::mem::take(&mut self.key), std::mem::take(&mut self.token));
            handle.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), leases.store.unlock(&key, &token)).await;
                leases.released(&key);
            });
        }
    }
}

/// Build the lease machinery the configuration asks for: Redis when a URL is
/// given, otherwise in-process. `store_backend` is the run store's backend
/// name; an in-process lock store next to a shared database cannot fence
/// several replicas, which is worth a warning at start.
pub async fn open(
    redis_url: Option<&str>,
    options: LeaseOptions,
    store_backend: &str,
    owner: &str,
) -> Result<Leases, LeaseError> {
    options.validate()?;
    let store: Arc<dyn LockStore> = match redis_url {
        Some(url) => Arc::new(RedisLockStore::connect(url, options.ttl).await?),
        None => {
            if store_backend == "postgres" {
                warn!(
                    store_backend,
                    "in-process leases with a shared database: several replicas of this server cannot be fenced \
                     from each other and would drive the same durable runs; set --redis-url"
                );
            }
            Arc::new(InProcessLockStore::new())
        }
    };
    Leases::owned_by(store, options, owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::IN_PROCESS_BACKEND;

    #[test]
    fn options_validation_rejects_renewal_outside_the_ttl() {
        let ok = LeaseOptions {
            ttl: Duration::from_secs(3),
            renew_every: Duration::from_secs(1),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        let too_slow = LeaseOptions { renew_every: Duration::from_secs(2), ..ok.clone() };
        assert!(matches!(too_slow.validate(), Err(LeaseError::Invalid(_))));
        let zero = LeaseOptions { renew_every: Duration::ZERO, ..ok.clone() };
        assert!(zero.validate().is_err());
        assert!(LeaseOptions::default().validate().is_ok());
    }

    #[test]
    fn names_are_validated() {
        assert!(validate_name("run:abc").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a b").is_err());
        assert!(validate_name(&"x".repeat(257)).is_err());
    }

    /// Log lines written while `f` runs on this thread.
    async fn captured_logs<F: std::future::Future<Output = ()>>(f: F) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber =
            tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let guard = tracing::subscriber::set_default(subscriber);
        f.await;
        drop(guard);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn in_process_leases_warn_next_to_a_shared_database() {
        let shared = captured_logs(async {
            let leases = open(None, LeaseOptions::default(), "postgres", "").await.unwrap();
            assert_eq!(leases.backend_name(), IN_PROCESS_BACKEND);
        })
        .await;
        assert!(shared.contains("WARN") && shared.contains("cannot be fenced"), "{shared}");
        let embedded = captured_logs(async {
            open(None, LeaseOptions::default(), "sqlite", "").await.unwrap();
        })
        .await;
        assert!(!embedded.contains("cannot be fenced"), "{embedded}");
    }

    /// Waiters for a lease released through the same handle go on at once,
    /// one at a time, not at their next poll (1 s with default options).
    #[tokio::test]
    async fn a_release_wakes_a_waiter_at_once() {
        let leases = open(None, LeaseOptions::default(), "sqlite", "").await.unwrap();
        let first = leases.try_acquire("sandbox:k").await.unwrap().expect("free");
        let started = Instant::now();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let leases = leases.clone();
                tokio::spawn(async move {
                    let lease =
                        leases.acquire("sandbox:k", &CancellationToken::new()).await.unwrap().unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    lease.release().await.unwrap();
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        first.release().await.unwrap();
        for w in waiters {
            w.await.unwrap();
        }
        // Polling, the three would take three poll intervals at least.
        let poll = leases.options().renew_every.min(Duration::from_secs(1));
        assert!(started.elapsed() < poll, "waited {:?}, a poll is {poll:?}", started.elapsed());
        assert!(leases.inner.waiters.lock().unwrap().is_empty(), "no waiter entry left behind");
    }

    #[tokio::test]
    async fn keys_are_namespaced() {
        let opts = LeaseOptions { namespace: "ns:".into(), ..Default::default() };
        let leases = Leases::new(Arc::new(InProcessLockStore::new()), opts).unwrap();
        assert_eq!(leases.key("run:1"), "ns:run:1");
        let lease = leases.try_acquire("run:1").await.unwrap().unwrap();
        assert_eq!(lease.key(), "ns:run:1");
    }
}
