//! `WatchService`: create/change/delete/rename events under the sandbox root.
//!
//! Two sources: inotify (through `notify`, one non-recursive watch per
//! directory so ignored trees such as `node_modules` cost no watches) or a
//! polling walk that diffs snapshots. Both feed a [`Coalescer`] that keeps one
//! event per (file, kind) per short window, so a burst of writes is one
//! `change`; for inotify it is a leading-edge throttle, so the first event
//! after a quiet spell is not held for the window. Nothing is dropped silently: a kernel queue overflow rearms the
//! watches and sends a `rescan` event; a poll that cannot read a directory
//! keeps its previous state for it instead of reporting deletes.

mod events;
mod inotify;
mod poll;
mod scope;
mod service;

pub use events::{Coalescer, DEFAULT_COALESCE};
pub use scope::{DEFAULT_IGNORE, Ignore};
pub use service::{DEFAULT_POLL_INTERVAL, Watch};
