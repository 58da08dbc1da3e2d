//! Writing under the drive's epoch (chunks, and the terminal status),
//! retrying store hiccups ([`super::store_calls`]).

use super::ctx::DriveCtx;
use super::ending::Ending;
use super::retry::{GaveUp, Interrupts};
use super::store_calls::{is_transient_at_the_end, retry_store};
use crate::runs::Runs;
use crate::store::{self, NewChunk, RunFinish, RunRecord};

impl Runs {
    /// Append chunks (as [`crate::runs::log::encode_chunk`] stores them)
    /// under this drive's epoch, retrying store hiccups.
    pub(super) async fn append(&self, ctx: &DriveCtx, chunks: &[NewChunk]) -> Result<(), Ending> {
        self.append_retrying(ctx, chunks, ctx.interrupts.clone(), store::Error::is_transient).await
    }

    /// Append the run's terminal chunk once its command is stopped or has
    /// exited: retried on a full disk too (see [`is_transient_at_the_end`]),
    /// and not cut short by the stop it may record.
    pub(super) async fn append_last(&self, ctx: &DriveCtx, chunks: &[NewChunk]) -> Result<(), Ending> {
        self.append_retrying(ctx, chunks, ctx.interrupts.past_the_stop(), is_transient_at_the_end).await
    }

    async fn append_retrying(
        &self,
        ctx: &DriveCtx,
        chunks: &[NewChunk],
        interrupts: Interrupts,
        retryable: fn(&store::Error) -> bool,
    ) -> Result<(), Ending> {
        let appended =
            retry_store(&ctx.key.run, interrupts, "append", retryable, || ctx.writer.append(chunks)).await;
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
        retry_store(
            &ctx.key.run,
            ctx.interrupts.past_the_stop(),
            "writing the terminal status",
            is_transient_at_the_end,
            || runs.finish(&ctx.key, ctx.writer.epoch(), finish.clone()),
        )
        .await
    }
}
