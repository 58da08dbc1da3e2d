//! Which replicas are alive, as the database sees them (PostgreSQL only).
//!
//! A run's lease tells whose the run is, and only its TTL tells that the
//! holder died: 15 s by default, during which the run's clients wait. The
//! database knows sooner: every replica holds a session-level advisory lock
//! keyed by its id on a connection of its own for as long as it lives, and
//! PostgreSQL drops the lock the moment that connection dies (the process
//! was killed, it crashed). A replica that finds another's lock free knows
//! that replica is gone and may break its leases at once
//! ([`crate::lease::Leases::break_lease`]).
//!
//! Never the fence: a replica judged gone by mistake (its presence
//! connection broke while the process lived) loses its leases at the next
//! renewal, and the epoch fence keeps anything it still writes out. When a
//! whole host vanishes without closing its connections, the database notices
//! only when TCP gives up, and the lease TTL stays the bound; with SQLite
//! there is one process and nothing to detect.

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, PgExecutor};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Result, Stores, stores::Pool};

/// How often the presence connection is checked (and retaken when lost).
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Asks the database whether a replica is alive. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Presence {
    pool: PgPool,
}

impl Presence {
    /// On PostgreSQL: this replica's presence, taken before this returns,
    /// and the loop that keeps it (retaking it after a lost connection)
    /// until `stop` fires, to be run on the server's tracked tasks. `None`
    /// on SQLite.
    pub async fn join(
        stores: &Stores,
        database_url: &str,
        replica_id: &str,
        stop: CancellationToken,
    ) -> Result<Option<(Presence, impl Future<Output = ()> + Send + 'static)>> {
        let Pool::Postgres(pool) = &stores.pool else { return Ok(None) };
        let key = lock_key(replica_id);
        let held = take(database_url, key).await?;
        if held.is_none() {
            warn!(
                replica_id,
                "another process holds this replica id's presence: two replicas share an id; runs driven \
                 here are taken over only after their lease expires until it is free"
            );
        }
        let keep = keep(database_url.to_string(), replica_id.to_string(), key, held, stop);
        Ok(Some((Presence { pool: pool.clone() }, keep)))
    }

    /// Whether replica `replica_id` is gone: its lock is free. Taken and
    /// given back at once on one pooled connection. `false` whenever the
    /// database cannot tell (an error): then the lease TTL decides.
    pub async fn is_gone(&self, replica_id: &str) -> bool {
        let key = lock_key(replica_id);
        let mut conn = match self.pool.acquire().await {
            Ok(c) => c,
            Err(e) => {
                debug!(replica_id, error = %e, "presence check: no connection");
                return false;
            }
        };
        match try_lock(&mut *conn, key).await {
            Ok(false) => false,
            Ok(true) => {
                match sqlx::query("SELECT pg_advisory_unlock($1)").bind(key).execute(&mut *conn).await {
                    Ok(_) => true,
                    Err(e) => {
                        // A pooled session must not keep another replica's
                        // lock: close it rather than give it back.
                        debug!(replica_id, error = %e, "presence check: unlock failed");
                        drop(conn.detach());
                        true
                    }
                }
            }
            Err(e) => {
                debug!(replica_id, error = %e, "presence check failed");
                false
            }
        }
    }
}

/// The advisory lock key of a replica id: 64 bits of its SHA-256, so ids of
/// any length and alphabet map to one bigint without a table.
fn lock_key(replica_id: &str) -> i64 {
    let digest = Sha256::digest(format!("sandhold replica {replica_id}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 has 8 bytes"))
}

async fn try_lock(conn: impl PgExecutor<'_>, key: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(key).fetch_one(conn).await
}

/// A connection of its own holding the lock; `None` if another session
/// holds it.
async fn take(database_url: &str, key: i64) -> Result<Option<PgConnection>> {
    let mut conn = PgConnection::connect(database_url).await?;
    Ok(try_lock(&mut conn, key).await?.then_some(conn))
}

async fn keep(
    database_url: String,
    replica_id: String,
    key: i64,
    mut held: Option<PgConnection>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
        if let Some(conn) = held.as_mut() {
            if sqlx::query("SELECT 1").execute(&mut *conn).await.is_ok() {
                continue;
            }
            warn!(replica_id, "the replica's presence connection was lost; taking it again");
            held = None;
        }
        match take(&database_url, key).await {
            Ok(Some(conn)) => {
                info!(replica_id, "replica presence taken");
                held = Some(conn);
            }
            Ok(None) => debug!(replica_id, "replica presence still held by another session"),
            Err(e) => warn!(replica_id, error = %e, "cannot take the replica's presence; retrying"),
        }
    }
    if let Some(conn) = held {
        // Closing releases the lock; a replica that stops cleanly has
        // released its leases already.
        let _ = conn.close().await;
    }
}

#[cfg(test)]
mod tests {
    use sandhold_tests::database::ScratchDatabase;

    use super::*;

    #[test]
    fn lock_keys_differ_per_replica_and_are_stable() {
        assert_eq!(lock_key("r1"), lock_key("r1"));
        assert_ne!(lock_key("r1"), lock_key("r2"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_is_gone_the_moment_its_connection_is() {
        let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
        let scratch = ScratchDatabase::create(&admin_url).await.unwrap();
        let url = scratch.url().to_owned();
        let (a, b) = (Stores::open(&url).await.unwrap(), Stores::open(&url).await.unwrap());
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let (id_a, id_b) = (format!("a-{nonce}"), format!("b-{nonce}"));
        let stop_a = CancellationToken::new();
        let (_, keep_a) = Presence::join(&a, &url, &id_a, stop_a.clone()).await.unwrap().expect("postgres");
        let keep_a = tokio::spawn(keep_a);
        let (presence_b, keep_b) =
            Presence::join(&b, &url, &id_b, CancellationToken::new()).await.unwrap().unwrap();
        drop(keep_b);
        assert!(!presence_b.is_gone(&id_a).await, "a lives");
        assert!(!presence_b.is_gone(&id_a).await, "asking does not take its presence");
        assert!(presence_b.is_gone(&format!("never-{nonce}")).await, "an id nobody holds is gone");
        // A second process with a's id cannot take a's presence.
        assert!(take(&url, lock_key(&id_a)).await.unwrap().is_none());
        // a stops: its connection closes, and it is gone as soon as the
        // database has ended that session (its backend exits right after).
        stop_a.cancel();
        keep_a.await.unwrap();
        let gone = sandhold_tests::wait::eventually(std::time::Duration::from_secs(10), || {
            let presence_b = presence_b.clone();
            let id_a = id_a.clone();
            async move { presence_b.is_gone(&id_a).await }
        })
        .await;
        assert!(gone, "a is gone once its connection is");
        a.close().await;
        b.close().await;
        scratch.drop_database().await.unwrap();
    }
}
