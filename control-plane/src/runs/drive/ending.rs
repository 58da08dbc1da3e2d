//! How a drive ended: exactly one way, which the drive's conclusion acts
//! on.

use crate::runs::error::Error;
use crate::runs::replica::StopReason;
use shared::proto::v1::Chunk;

/// How a drive ended.
#[derive(Debug)]
pub(crate) enum Ending {
    /// The journal's sentinel was read.
    Exited { terminal: Chunk },
    /// Cancelled, or the client of a run that does not detach left.
    Stopped(StopReason),
    /// A failure: the run fails with it.
    Failed(Error),
    /// The server is shutting down: another replica takes over.
    Detach,
    /// Lease lost or fenced by a successor: write nothing more.
    Superseded(String),
}

pub(super) fn ending_name(e: &Ending) -> &'static str {
    match e {
        Ending::Exited { .. } => "exited",
        Ending::Stopped(StopReason::Cancel) => "cancelled",
        Ending::Stopped(StopReason::Disconnected) => "disconnected",
        Ending::Failed(_) => "failed",
        Ending::Detach => "detached",
        Ending::Superseded(_) => "superseded",
    }
}
