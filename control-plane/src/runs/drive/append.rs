//! Writing under the drive's epoch (chunks, and the terminal status),
//! retrying store hiccups.

use std::time::Duration;

use backon::ExponentialBuilder;
use shared::proto::v1::Chunk;
use tracing::warn;

use super::ctx::DriveCtx;
use super::ending::Ending;
use super::retry::{GaveUp, Interrupts, retry};
use crate::runs::Runs;
use crate::runs::log::encode_chunk;
use crate::store::{self, NewChunk, RunFinish, RunRecord};

/// Store writes that fail are retried this many times before the run fails.
const STORE_ATTEMPTS: usize = 5;

impl Runs {
    /// Append chunks under this drive's epoch, retrying store hiccups.
    pub(super) async fn append(&self, ctx: &DriveCtx, chunks: &[Chunk]) -> Result<(), Ending> {
        self.append_retrying(ctx, chunks, ctx.interrupts.clone(), is_transient).await
    }

    /// Append the run's terminal chunk once its command is stopped or has
    /// exited: retried on a full disk too (see [`is_transient_at_the_end`]),
    /// and not cut short by the stop it may record.
    pub(super) async fn append_last(&self, ctx: &DriveCtx, chunks: &[Chunk]) -> Result<(), Ending> {
        self.append_retrying(ctx, chunks, ctx.interrupts.past_the_stop(), is_transient_at_the_end).await
    }

    async fn append_retrying(
        &self,
        ctx: &DriveCtx,
        chunks: &[Chunk],
        interrupts: Interrupts,
        retryable: fn(&store::Error) -> bool,
    ) -> Result<(), Ending> {
        let encoded: Vec<NewChunk> = chunks.iter().map(encode_chunk).collect();
        let mut attempt = 0;
        let appended = retry(
            interrupts,
            backoff(),
            || ctx.writer.append(&encoded),
            retryable,
            |e, _| {
                attempt += 1;
                warn!(run_id = %ctx.key.run, attempt, error = %e, "append failed; retrying");
            },
        )
        .await;
        match appended {
            Ok(_) => Ok(()),
            Err(GaveUp::Failed(e @ (store::Error::Fenced { .. } | store::Error::LogClosed(_)))) => {
                Err(Ending::Superseded(e.to_string()))
            }
            Err(GaveUp::Failed(e)) => Err(Ending::Failed(e.into())),
            Err(GaveUp::Interrupted(ending)) => Err(ending),
        }
    }

    /// Write the run's terminal status under this drive's epoch, retried as
    /// [`Self::append_last`] is.
    pub(super) async fn write_finish(
        &self,
        ctx: &DriveCtx,
        finish: RunFinish,
    ) -> Result<RunRecord, GaveUp<store::Error>> {
        let runs = &self.inner.ctx.stores.runs;
        let mut attempt = 0;
        retry(
            ctx.interrupts.past_the_stop(),
            backoff(),
            || runs.finish(&ctx.key, ctx.writer.epoch(), finish.clone()),
            is_transient_at_the_end,
            |e, _| {
                attempt += 1;
                warn!(run_id = %ctx.key.run, attempt, error = %e, "writing the terminal status failed; retrying");
            },
        )
        .await
    }
}

fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(400))
        .with_max_delay(Duration::from_secs(10))
        .with_max_times(STORE_ATTEMPTS - 1)
}

/// A failure of the database that a later attempt may not meet.
fn is_transient(e: &store::Error) -> bool {
    matches!(e, store::Error::Unavailable(_) | store::Error::Database(_))
}

/// [`is_transient`], or a full disk: once the run's command is stopped or
/// has exited nothing of the run fills the disk any more, and what its
/// stopped sandbox held there is being freed. (While the command runs a
/// full disk ends the run instead: it would only fill again.)
fn is_transient_at_the_end(e: &store::Error) -> bool {
    is_transient(e) || matches!(e, store::Error::StorageFull(_))
}
