//! Leases: named, expiring, self-renewing exclusive locks.
//!
//! A run is driven by at most one replica at a time; the replica proves it
//! by holding the run's lease. A [`LockStore`] is the minimal backend
//! contract (take a key for a token with a TTL, extend it only while the key
//! still holds that token, delete it only while it does); [`Leases`] builds
//! the holder's side on top of any store, once: acquisition, the renewal
//! task, and the
//! [`CancellationToken`](tokio_util::sync::CancellationToken) that fires when the lease is lost.
//!
//! Two stores exist: [`InProcessLockStore`] (one process; the embedded
//! default) and [`RedisLockStore`] (any number of replicas). Both pass the
//! same conformance suite (`conformance.rs`).
//!
//! A lease is a liveness tool, not the fence: the database epoch fences the
//! writes (see `store`). The lease decides who *should* drive; the epoch
//! makes sure a holder that lost it without noticing cannot corrupt anything.

mod cancel;
mod error;
mod holder;
mod in_process;
mod lock_store;
mod redis_store;

#[cfg(test)]
mod conformance;

pub use cancel::CancelBus;
pub use error::LeaseError;
pub use holder::{Lease, Leases, open};
pub use in_process::InProcessLockStore;
pub use lock_store::LockStore;
pub use redis_store::RedisLockStore;

pub use crate::config::{DEFAULT_NAMESPACE, LeaseOptions};

/// Backend name of [`InProcessLockStore`], as reported by `GetServerInfo`.
pub const IN_PROCESS_BACKEND: &str = "in-process";
/// Backend name of [`RedisLockStore`].
pub const REDIS_BACKEND: &str = "redis";
