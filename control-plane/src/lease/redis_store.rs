//! Leases in Redis, for several replicas.
//!
//! Acquire is `SET key token NX PX ttl`. Renew and release are Lua scripts
//! that compare the stored token first, so they act atomically and only for
//! the holder that set it: a holder whose key expired and was taken over by
//! another cannot extend or delete the new holder's lease.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};

use super::{LeaseError, LockStore, REDIS_BACKEND};

const RENEW_SCRIPT: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

const RELEASE_SCRIPT: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

pub struct RedisLockStore {
    conn: ConnectionManager,
    renew: Script,
    release: Script,
}

impl std::fmt::Debug for RedisLockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLockStore").finish_non_exhaustive()
    }
}

fn unavailable(err: redis::RedisError) -> LeaseError {
    LeaseError::Unavailable(format!("redis: {err}"))
}

impl RedisLockStore {
    /// Connect to `url` (`redis://[:password@]host:port[/db]`). `ttl` bounds
    /// how long one command may take: a renewal that answers after the lease
    /// ran out is worthless, so the client must not wait longer than that.
    pub async fn connect(url: &str, ttl: Duration) -> Result<Self, LeaseError> {
        let client = Client::open(url).map_err(|e| LeaseError::Invalid(format!("redis url: {e}")))?;
        let timeout = (ttl / 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(2)
            .set_max_delay(1000);
        let conn = ConnectionManager::new_with_config(client, config).await.map_err(unavailable)?;
        Ok(Self { conn, renew: Script::new(RENEW_SCRIPT), release: Script::new(RELEASE_SCRIPT) })
    }

    /// `PING`, for readiness checks.
    pub async fn ping(&self) -> Result<(), LeaseError> {
        let mut conn = self.conn.clone();
        redis::cmd("PING").query_async::<String>(&mut conn).await.map(drop).map_err(unavailable)
    }
}

fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[async_trait::async_trait]
impl LockStore for RedisLockStore {
    fn backend_name(&self) -> &'static str {
        REDIS_BACKEND
    }

    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        let mut conn = self.conn.clone();
        let reply: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(reply.is_some())
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .renew
            .key(key)
            .arg(token)
            .arg(millis(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(n == 1)
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<bool, LeaseError> {
        let mut conn = self.conn.clone();
        let n: i64 = self.release.key(key).arg(token).invoke_async(&mut conn).await.map_err(unavailable)?;
        Ok(n == 1)
    }

    async fn holder(&self, key: &str) -> Result<Option<String>, LeaseError> {
        let mut conn = self.conn.clone();
        redis::cmd("GET").arg(key).query_async(&mut conn).await.map_err(unavailable)
    }
}
