//! Harness adapters: for each agent CLI (and for any command), build the
//! command line of a run and translate the CLI's stdout, as journaled, line by
//! line into [`Chunk`](shared::chunk::Chunk)s.
//!
//! One folder per CLI (`claude_code/`, `codex/`, `opencode/`, `gemini/`,
//! `acp/`, `command/`) holds everything Sandhold knows about it behind one
//! interface (`adapter.rs`): its command line and translation (`mod.rs`),
//! its model API wiring, session carry scripts (`session.rs`), policy
//! mapping, skills and MCP files, and toolchain package (`adapter.rs`).
//! The rest of the crate holds a [`Harness`]; `registry.rs` lists them.
//! The files at this level are the layer the folders share: options and
//! command specs (`spec.rs`), the translation machinery (`emit.rs`,
//! `translator.rs`, `requests.rs`), and the shared parts of policy, model
//! API, session and skills handling.
//!
//! Translation is deterministic: ids come only from the run's
//! [`RunScopedIds`] counter, and nothing but the journal bytes (and the exit
//! code and stderr tail given to [`Translator::finish`]) decides a chunk. The
//! clock only stamps `timestamp_ms`, which fingerprints ignore. So a takeover
//! that re-translates a journal from byte 0 reproduces what is stored.
//!
//! Every sequence a [`Translator`] produces starts with RUN_STARTED and, once
//! finished, ends with exactly one RUN_FINISHED or RUN_ERROR; text, reasoning
//! and tool calls still open at that point are ended first. A line that is
//! not what the CLI should print becomes a `harness.warning` CUSTOM chunk; an
//! event type an adapter does not know produces nothing.

mod adapter;
mod emit;
mod registry;
mod requests;
mod spec;
#[cfg(test)]
pub(crate) mod testing;
mod translator;

pub mod model_api;
pub mod policy;
pub mod session;
pub mod skills;
pub mod toolchain;

pub mod acp;
pub mod claude_code;
pub mod codex;
pub mod command;
pub mod gemini;
pub mod opencode;

pub use adapter::Harness;
pub use emit::*;
pub use spec::*;
pub use translator::*;
