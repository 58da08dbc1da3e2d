//! The drive's calls to the store, retried through its hiccups: appends
//! and the terminal status, and also the one-shot reads a launch makes (a
//! takeover's record and last chunk, the stored log a replay aligns with,
//! the sandbox key a start records). A database that is briefly
//! unavailable (a pool timeout under load, a restart, a failover) delays
//! the drive; it does not fail the run. Only transient failures are
//! retried, and each retry is safe: a read, or a write that lands once
//! whichever attempt it was (appends are fenced and answered only once
//! committed).

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::ExponentialBuilder;
use tracing::warn;

use super::ctx::DriveCtx;
use super::ending::Ending;
use super::retry::{GaveUp, Interrupts, retry};
use crate::runs::Error;
use crate::store::{self, ChunkStream, EventLog, Offset, PAGE_CHUNKS, RunId};

/// Store calls that fail are retried this many times before the run fails.
const STORE_ATTEMPTS: usize = 5;

/// The store failure inside an error, when there is one.
pub(super) trait StoreFailure: Display {
    fn store_error(&self) -> Option<&store::Error>;
}

impl StoreFailure for store::Error {
    fn store_error(&self) -> Option<&store::Error> {
        Some(self)
    }
}

impl StoreFailure for Error {
    fn store_error(&self) -> Option<&store::Error> {
        match self {
            Error::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl StoreFailure for crate::sandbox::Error {
    fn store_error(&self) -> Option<&store::Error> {
        match self {
            crate::sandbox::Error::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// Call `call` until it succeeds, retrying while it fails with a store
/// error `transient` accepts (each retry is a warning naming `what` and
/// run `run`), pausing as appends do; `interrupts` end a pause.
pub(super) async fn retry_store<T, E, F, Fut>(
    run: &RunId,
    interrupts: Interrupts,
    what: &str,
    transient: fn(&store::Error) -> bool,
    call: F,
) -> Result<T, GaveUp<E>>
where
    E: StoreFailure,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 0;
    retry(
        interrupts,
        backoff(),
        call,
        |e: &E| e.store_error().is_some_and(transient),
        |e, _| {
            attempt += 1;
            warn!(run_id = %run, attempt, error = %e, "{what} failed; retrying");
        },
    )
    .await
}

/// [`retry_store`] of a read (or a write that may be repeated) while the
/// drive runs: transient failures, paused until the drive must end.
pub(super) async fn persistently<T, E, F, Fut>(ctx: &DriveCtx, what: &str, call: F) -> Result<T, Ending>
where
    E: StoreFailure + Into<Error>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    retry_store(&ctx.key.run, ctx.interrupts.clone(), what, store::Error::is_transient, call)
        .await
        .map_err(gave_up)
}

/// How a drive whose store call gave up ends.
pub(super) fn gave_up<E: Into<Error>>(g: GaveUp<E>) -> Ending {
    match g {
        GaveUp::Failed(e) => Ending::Failed(e.into()),
        GaveUp::Interrupted(ending) => ending,
    }
}

/// The run's log as stored now, from its start, each page's read retried
/// as [`persistently`] does (but not cut short by the drive's stop: the
/// replay goes on to the run's last chunk). A pause a shutdown or a lost
/// lease ends ends the stream with `Unavailable`, which
/// [`Interrupts::failed`] turns into the drive's real ending.
pub(super) fn stored_log(ctx: &DriveCtx, events: Arc<dyn EventLog>) -> ChunkStream {
    let (interrupts, run) = (ctx.interrupts.past_the_stop(), ctx.key.clone());
    store::paged(Offset::start(), move |cursor| {
        let (events, run, interrupts) = (events.clone(), run.clone(), interrupts.clone());
        async move {
            let page = retry_store(
                &run.run,
                interrupts,
                "reading the stored log",
                store::Error::is_transient,
                || events.page(&run, &cursor, PAGE_CHUNKS),
            )
            .await;
            page.map_err(|g| match g {
                GaveUp::Failed(e) => e,
                GaveUp::Interrupted(_) => {
                    store::Error::Unavailable("the drive ended while the store was unavailable".into())
                }
            })
        }
    })
}

impl Interrupts {
    /// How a drive ends whose store call failed: a shutdown or a lost lease
    /// that came meanwhile (and may have ended the call's pause) decides,
    /// so a store outage during a shutdown hands the run over instead of
    /// failing it; otherwise the run fails.
    pub fn failed(&self, e: Error) -> Ending {
        if matches!(e, Error::Store(_)) {
            if self.shutdown.is_cancelled() {
                return Ending::Detach;
            }
            if self.lease_lost.is_cancelled() {
                return Ending::Superseded("the run's lease was lost".into());
            }
        }
        Ending::Failed(e)
    }
}

fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(400))
        .with_max_delay(Duration::from_secs(10))
        .with_max_times(STORE_ATTEMPTS - 1)
}

/// [`store::Error::is_transient`], or a full disk: once the run's command is stopped or
/// has exited nothing of the run fills the disk any more, and what its
/// stopped sandbox held there is being freed. (While the command runs a
/// full disk ends the run instead: it would only fill again.)
pub(super) fn is_transient_at_the_end(e: &store::Error) -> bool {
    e.is_transient() || matches!(e, store::Error::StorageFull(_))
}
