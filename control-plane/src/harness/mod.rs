//! Harness adapters: for each agent CLI (and for any command), build the
//! command line of a run and translate the CLI's stdout, as journaled, line by
//! line into [`Chunk`]s.
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

pub mod acp;
pub mod claude_code;
pub mod codex;
pub mod command;
pub mod gemini;
pub mod model_api;
pub mod opencode;
pub mod policy;
mod requests;
pub mod session;

mod spec;
#[cfg(test)]
pub(crate) mod testing;
mod translator;

pub use spec::*;
pub use translator::*;
