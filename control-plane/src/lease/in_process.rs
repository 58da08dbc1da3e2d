//! Leases inside one process: a map behind a mutex, with expiry.
//!
//! Correct for a single server (the embedded default); it cannot exclude a
//! second process, which is why `lease::open` warns when it is paired with a
//! shared database.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::{IN_PROCESS_BACKEND, LeaseError, LockStore};

#[derive(Debug, Default)]
pub struct InProcessLockStore {
    /// key -> (token, expires at). Expired entries are treated as absent and
    /// replaced lazily.
    keys: Mutex<HashMap<String, (String, Instant)>>,
}

impl InProcessLockStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_keys<T>(&self, f: impl FnOnce(&mut HashMap<String, (String, Instant)>, Instant) -> T) -> T {
        let mut keys = self.keys.lock().expect("in-process lock store poisoned");
        f(&mut keys, Instant::now())
    }

    /// Drop a key as if an operator deleted it (the conformance suite's
    /// equivalent of `DEL` in Redis).
    #[cfg(test)]
    pub(crate) fn delete_key(&self, key: &str) {
        self.with_keys(|keys, _| keys.remove(key));
    }
}

#[async_trait::async_trait]
impl LockStore for InProcessLockStore {
    fn backend_name(&self) -> &'static str {
        IN_PROCESS_BACKEND
    }

    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        let taken = self.with_keys(|keys, now| match keys.get(key) {
            Some((_, expires)) if *expires > now => false,
            _ => {
                keys.insert(key.to_string(), (token.to_string(), now + ttl));
                true
            }
        });
        Ok(taken)
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        let renewed = self.with_keys(|keys, now| match keys.get_mut(key) {
            Some((held, expires)) if held == token && *expires > now => {
                *expires = now + ttl;
                true
            }
            _ => false,
        });
        Ok(renewed)
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<bool, LeaseError> {
        let removed = self.with_keys(|keys, now| match keys.get(key) {
            Some((held, expires)) if held == token => {
                let live = *expires > now;
                keys.remove(key);
                live
            }
            _ => false,
        });
        Ok(removed)
    }

    async fn holder(&self, key: &str) -> Result<Option<String>, LeaseError> {
        Ok(self.with_keys(|keys, now| match keys.get(key) {
            Some((held, expires)) if *expires > now => Some(held.clone()),
            _ => None,
        }))
    }
}
