//! The reaper: closes out detached durable runs, prunes journals of
//! terminal runs, destroys orphaned sandboxes, forgets the sandboxes of
//! fleet nodes that are gone, and removes ended runs past the operator's
//! retention.
//!
//! One sweep at a time ([`schedule`]) over the [`detached`] runs, the
//! [`journals`] in running sandboxes, the [`orphans`], the sandboxes of
//! [`gone`] nodes and the [`retention`].

mod detached;
mod error;
mod gone;
mod handle;
mod journals;
mod orphans;
mod report;
mod retention;
mod schedule;

pub use crate::config::ReaperOptions;
pub use error::Error;
pub use handle::Reaper;
pub use report::{RunReport, Scope, Tally};
pub use schedule::{SWEEP_LEASE, tenant_sweep_lease};
