//! Appending chunks under the drive's epoch, retrying store hiccups.

use std::time::Duration;

use backon::ExponentialBuilder;
use shared::proto::v1::Chunk;
use tracing::warn;

use super::ctx::DriveCtx;
use super::ending::Ending;
use super::retry::{GaveUp, retry};
use crate::runs::Runs;
use crate::runs::log::encode_chunk;
use crate::store::{self, NewChunk};

/// Store writes that fail are retried this many times before the run fails.
const STORE_ATTEMPTS: usize = 5;

impl Runs {
    /// Append chunks under this drive's epoch, retrying store hiccups.
    pub(super) async fn append(&self, ctx: &DriveCtx, chunks: &[Chunk]) -> Result<(), Ending> {
        let encoded: Vec<NewChunk> = chunks.iter().map(encode_chunk).collect();
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(400))
            .with_max_delay(Duration::from_secs(10))
            .with_max_times(STORE_ATTEMPTS - 1);
        let mut attempt = 0;
        let appended = retry(
            ctx.interrupts.clone(),
            backoff,
            || ctx.writer.append(&encoded),
            is_transient,
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
}

fn is_transient(e: &store::Error) -> bool {
    matches!(e, store::Error::Unavailable(_) | store::Error::Database(_))
}
