//! `SnapshotService`: capture and restore of the workspace for portable
//! snapshots.
//!
//! Capture walks the root without following anything, applies the policy
//! (default exclusions unless the policy replaces them; the projection
//! marker always), and hashes every kept file's bytes *after* zeroing every
//! occurrence of a secret value, so neither the hash nor any stored byte
//! depends on a secret. Only regular files without an executable bit and
//! directories are supported; anything else that is not excluded fails the
//! capture with `SNAPSHOT_UNSUPPORTED_ENTRY` naming the path.
//!
//! Restore stages every blob outside the root (beside the journal dir),
//! checks the manifest (`shared::snapshot::check_manifest`), every blob's
//! size and SHA-256 and that every referenced blob arrived, then plans the
//! change against the workspace as it is (see `restore::plan`): what to remove so
//! that the workspace ends up equal to the checkpoint outside the policy's
//! exclusions, which are never touched. Only when all of that passed does
//! it remove the first entry or write the first byte under the root.

mod capture;
mod policy;
mod redaction;
mod restore;
mod service;

pub use capture::capture;
pub use policy::Policy;
pub use redaction::{Redactor, Zeroing};
pub use service::Snapshots;
