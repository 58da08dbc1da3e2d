//! The small values every store shares: tenants, timestamps, epochs, offsets' starting point.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A driver epoch. Bumped by every successful claim; never decreases.
pub type Epoch = u64;

/// The epoch of a freshly created run, owned by whoever created it
/// ([`CreatedRun::created`](super::CreatedRun::created) is true). A resumer must [`RunStore::claim`](super::RunStore::claim).
pub const FIRST_EPOCH: Epoch = 1;

/// Read position before the first chunk of every log: `read(run,
/// FIRST_OFFSET)` yields the whole log. Clients may send it verbatim.
pub const FIRST_OFFSET: &str = "0";

/// How often a tailing [`EventLog::read`](super::EventLog::read) re-checks the table when no
/// wake-up arrives (a wake-up lost to a reconnect, or an append by another
/// process on SQLite). Never faster than this.
pub const TAIL_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The tenant an object belongs to. Every record carries one; asking for
/// another tenant's object yields [`Error::NotFound`](super::Error::NotFound).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Tenant(String);

impl Tenant {
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tenant({})", self.0)
    }
}

/// Wall-clock time with millisecond precision, as stored (round-trips
/// exactly through both backends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(i64);

impl Timestamp {
    pub fn now() -> Self {
        SystemTime::now().into()
    }

    pub const fn from_millis(millis_since_unix_epoch: i64) -> Self {
        Self(millis_since_unix_epoch)
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    pub fn to_system_time(self) -> SystemTime {
        if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_millis(self.0 as u64)
        } else {
            UNIX_EPOCH - Duration::from_millis(self.0.unsigned_abs())
        }
    }

    pub fn saturating_sub(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => Self(-i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX)),
        }
    }
}
