//! Durable runs: the driver that turns a run's journal into its event log,
//! and the `RunService` in front of it.
//!
//! One replica drives a run at a time, holding the run's lease
//! (`run:<tenant>:<run_id>`: run ids are per tenant) and the record's epoch: it follows the journal inside the
//! sandbox from byte 0, translates each line with the run's harness adapter
//! (run-scoped ids, so a replay gives the same chunks), aligns the result
//! with what the log already holds ([`align`]), and appends the rest through
//! a fenced [`LogWriter`](crate::store::LogWriter). Clients never talk to the
//! driver: they read the log, from any replica.
//!
//! A drive ends in exactly one way (`drive::Ending`): the run exited and
//! its terminal chunk and status are written; it was cancelled or (when it
//! does not detach) its client left, and the sandbox is destroyed and the
//! record `aborted`; an error failed it; or the driver stopped driving
//! without writing a terminal state: the server is shutting down (the run is
//! marked detached for another replica), the lease was lost, or a successor
//! fenced it off.

pub mod align;
pub mod coalesce;
pub mod quiet;

mod attach;
mod attempts;
mod daily;
mod drive;
mod egress;
mod error;
mod log;
mod records;
mod replica;
mod request_index;
mod requests;
mod session;
mod spec;
mod start;
mod thread;
mod usage;

use records::run_id_field;
use replica::StopReason;

pub use attach::{RunEvents, Takeover};
pub use attempts::{AttemptRun, AttemptView, Evaluation, StartAttempts, run_attempt_keeper};
pub use error::Error;
pub use records::lease_name;
pub use replica::Runs;
pub use spec::{RunOptions, RunSpec};
pub use start::StartRun;
pub use thread::definition_of as thread_definition;
