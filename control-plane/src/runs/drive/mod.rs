//! One run's drive, by phase: [`launch`] (a fresh run's sandbox and
//! command, or a takeover's reconnect), [`pump`] (follow the journal, with
//! [`feed`] translating and aligning what it reads into the [`outbox`],
//! which appends one batch at a time while the next is made), [`files`]
//! (the workspace's changes) and [`conclude`] (stop, terminal write,
//! checkpoint, session export). A drive ends in exactly one way
//! ([`Ending`]); what ends its pauses early is [`retry::Interrupts`]; its
//! calls to the store are retried through the store's hiccups
//! ([`store_calls`]).

mod append;
mod conclude;
mod ctx;
mod ending;
mod feed;
mod files;
mod launch;
mod outbox;
mod pump;
mod retry;
mod store_calls;

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures::FutureExt;
use tracing::{Instrument as _, info};

pub(crate) use ctx::DriveCtx;
pub(crate) use ending::Ending;
use ending::ending_name;
pub(crate) use launch::{FreshStart, Unresumed};
pub(super) use retry::Interrupts;
use store_calls::stored_log;

use crate::runs::align::{Aligner, checkpoints};
use crate::runs::{Error, Runs};

impl Runs {
    /// Drive `ctx`'s run to one ending and act on it. Never panics out, never
    /// leaves the run `running` unless another driver (or a shutdown
    /// detach) is meant to take it on. The drive is the `run` span, a child
    /// of what spawns it (the `StartRun` or `AttachRun` call, the reaper).
    pub(crate) fn drive(
        self,
        ctx: DriveCtx,
        fresh: Option<FreshStart>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let span = tracing::info_span!(
            "run",
            run_id = %ctx.key.run,
            epoch = ctx.writer.epoch(),
            takeover = fresh.is_none(),
            ending = tracing::field::Empty,
        );
        self.drive_spanned(ctx, fresh).instrument(span)
    }

    async fn drive_spanned(self, ctx: DriveCtx, fresh: Option<FreshStart>) {
        let started = Instant::now();
        let _active = crate::metrics::drives().start();
        let ending = match AssertUnwindSafe(self.drive_to_end(&ctx, fresh)).catch_unwind().await {
            Ok(ending) => ending,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Ending::Failed(Error::Panicked(what))
            }
        };
        tracing::Span::current().record("ending", ending_name(&ending));
        info!(run_id = %ctx.key.run, epoch = ctx.writer.epoch(), ending = ?ending_name(&ending),
            elapsed_ms = started.elapsed().as_millis() as u64, "drive ended");
        self.conclude(&ctx, ending).await;
        self.unregister(&ctx.key);
        let DriveCtx { lease, .. } = ctx;
        let _ = lease.release().await;
    }
    async fn drive_to_end(&self, ctx: &DriveCtx, fresh: Option<FreshStart>) -> Ending {
        let cx = &self.inner.ctx;
        let launched = match fresh {
            Some(start) => self.start_fresh(ctx, start).await,
            None => self.take_up(ctx).await,
        };
        let (key, agent, secrets) = match launched {
            Ok(launched) => launched,
            Err(ending) => return ending,
        };
        // The stored log is read after the start (a fresh run's accepted
        // and warning chunks are in it), page by page as the replay goes.
        let aligner = match Aligner::of_stored(stored_log(ctx, cx.stores.events.clone())).await {
            Ok(aligner) => aligner,
            Err(e) => return ctx.interrupts.failed(e),
        };
        let (stderr_from, usage, policy) = match checkpoints(stored_log(ctx, cx.stores.events.clone())).await
        {
            Ok(checkpoints) => checkpoints,
            Err(e) => return ctx.interrupts.failed(e),
        };
        *ctx.usage.lock().unwrap_or_else(|e| e.into_inner()) = Some(usage);
        self.pump(ctx, &key, agent, &secrets, aligner, (stderr_from, usage, policy)).await
    }
}
