//! The `command` harness as an [`Adapter`]: any program, so no sessions,
//! model API, skills or package of its own.

use super::{CommandTranslator, command};
use crate::harness::adapter::Adapter;
use crate::harness::{CommandSpec, HarnessError, HarnessOptions};

pub(crate) struct Command;

impl Adapter for Command {
    fn name(&self) -> &'static str {
        "command"
    }

    fn command(&self, options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
        command(options, prompt)
    }

    fn translator(&self) -> Box<dyn crate::harness::emit::Translate> {
        Box::<CommandTranslator>::default()
    }

    fn has_sessions(&self) -> bool {
        false
    }
}
