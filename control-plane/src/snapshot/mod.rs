//! Portable snapshots: a thread's workspace files kept in Sandhold's own
//! storage, so they move between providers and outlive the sandbox.
//!
//! - **Save** ([`save`]): claim the thread's writer fence, have the agent
//!   capture the manifest (secret values zeroed before hashing), pin every
//!   blob of it, upload only the blobs the tenant has not stored (each
//!   hashed on receipt and streamed to the blob store in pieces, held to
//!   the size the manifest declared; blobs are per tenant, so a hash
//!   another tenant stored is uploaded like any other), and commit checkpoint, blob
//!   references and the new head in one transaction
//!   (`store::CheckpointStore::commit`).
//! - **Maxima** ([`Maxima`]): a file or a snapshot over the operator's
//!   maximum (or the definition's lower one) fails the save with
//!   `SNAPSHOT_TOO_LARGE` before a byte is read, as the manifest declares
//!   it, and again as the bytes arrive; nothing is recorded.
//! - **Restore** ([`restore`]): stream the manifest, the policy and every
//!   blob (in the blob store's pieces, never a whole blob) to the agent of a *new* sandbox, which verifies all of it before
//!   changing anything, then removes what the checkpoint lacks (outside
//!   the policy's exclusions) and writes the rest.
//!   The lifecycle calls [`restore_latest`] when it had to make a new
//!   sandbox for a thread with portable snapshots enabled.
//! - **After a run** ([`checkpoint_after_run`]): the run pump's hook.
//! - **Garbage collection** ([`collect_garbage`], [`run_gc_sweeper`]):
//!   blobs no checkpoint references and no save in progress pinned.
//! - **The public API's operations** ([`Snapshots`]): list, fork, read an
//!   artifact, delete. Every operation fails with [`Error`].
//!
//! Secrets: the values of the sandbox's secrets go to the agent with the
//! capture request only (over its authenticated socket), so that every
//! occurrence in a captured file is zeroed before hashing; no value reaches
//! a store, a log line or an error.

mod blob;
mod checkpoints;
mod error;
mod gc;
mod policy;
mod restore;
mod save;

pub use blob::read_blob;
pub use checkpoints::{ArtifactStream, Listed, Snapshots};
pub use error::Error;
pub use gc::{GC_EVERY, PIN_TTL, collect_garbage, run_gc_sweeper};
pub use policy::{capture_policy, enabled};
pub use restore::{restore, restore_latest};
pub use save::{Maxima, SaveRequest, checkpoint_after_run, save};
