//! The [`Translator`] a run drives: one harness's translation (its
//! adapter's [`Translate`]) plus the sealed request records every harness
//! shares.

use std::vec::Drain;

use shared::chunk::Chunk;
use shared::ids::RunId;

use super::acp::AcpTranslator;
use super::emit::{Emitter, Translate};
use super::requests::Requests;
use super::{Harness, Output};

impl Harness {
    /// A translator for one run of this harness, reading the CLI's own
    /// output ([`Output::Native`]). `clock` stamps `timestamp_ms` only.
    pub fn translator(
        self,
        run_id: &RunId,
        thread_id: &str,
        clock: impl Fn() -> i64 + Send + Sync + 'static,
    ) -> Translator {
        self.translator_for(Output::Native, run_id, thread_id, clock)
    }

    /// A translator for one run of this harness whose command prints
    /// `output` (a [`CommandSpec::output`](super::CommandSpec::output)).
    /// Chunk names stay the harness's (`codex.session-id` for Codex through
    /// the ACP bridge: the ACP session id is Codex's own thread id, as
    /// OpenCode's is its session id, so a later run resumes it either way).
    pub fn translator_for(
        self,
        output: Output,
        run_id: &RunId,
        thread_id: &str,
        clock: impl Fn() -> i64 + Send + Sync + 'static,
    ) -> Translator {
        let inner: Box<dyn Translate> = match output {
            Output::Acp => Box::<AcpTranslator>::default(),
            Output::Native => self.adapter().translator(),
        };
        Translator {
            em: Emitter::new(self.name(), run_id, thread_id, clock),
            inner,
            requests: Default::default(),
        }
    }
}

/// Translates one run's journal into chunks. Feed it every line of the
/// journal in order (without the newline, never the exit sentinel), then
/// call [`finish`](Self::finish) once the run's exit is known.
pub struct Translator {
    pub(super) em: Emitter,
    pub(super) inner: Box<dyn Translate>,
    pub(super) requests: Requests,
}

impl std::fmt::Debug for Translator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Translator")
            .field("harness", &self.em.harness)
            .field("terminal", &self.em.terminal)
            .finish()
    }
}

impl Translator {
    /// The chunks of one journal line. The first call yields RUN_STARTED
    /// first; after the terminal chunk every line yields nothing.
    ///
    /// Drained from the translator's own buffer, which the next line reuses
    /// (a run's lines are most of what it does, and a `Vec` taken per line
    /// was an allocation of several chunks each, freed after one).
    pub fn feed(&mut self, line: &[u8]) -> Drain<'_, Chunk> {
        self.em.ensure_started();
        if !self.em.terminal {
            self.inner.line(&mut self.em, line);
        }
        self.em.out.drain(..)
    }

    /// The chunks of a sealed record of the journal (a request or an
    /// answer, verified by the agent: `JournalLine.sealed`).
    pub fn feed_record(&mut self, record: &[u8]) -> Drain<'_, Chunk> {
        self.em.ensure_started();
        if !self.em.terminal {
            self.requests.record(&mut self.em, self.inner.as_ref(), record);
        }
        self.em.out.drain(..)
    }

    /// The run exited with `exit_code` (128 + signal for a signal); its
    /// stderr ended with `stderr_tail`. Yields the terminal chunk unless the
    /// CLI's own result event already did, and nothing on a second call.
    pub fn finish(&mut self, exit_code: i32, stderr_tail: &str) -> Vec<Chunk> {
        self.em.ensure_started();
        if !self.em.terminal {
            self.inner.finish(&mut self.em, exit_code, stderr_tail);
            if !self.em.terminal {
                // An adapter that forgot its terminal chunk must not leave
                // the run open.
                self.em.finish_from_exit(exit_code, stderr_tail, None, "stop", None);
            }
        }
        std::mem::take(&mut self.em.out)
    }

    /// True once RUN_FINISHED or RUN_ERROR was produced.
    pub fn is_terminal(&self) -> bool {
        self.em.terminal
    }
}
