//! The harnesses Sandhold knows: a new harness is its folder plus one line
//! in [`Harness::ALL`].

use super::{Harness, HarnessError, acp, claude_code, codex, command, gemini, opencode};

// Named like the enum variants they replaced, so callers read the same.
#[allow(non_upper_case_globals)]
impl Harness {
    pub const Command: Harness = Harness(&command::Command);
    pub const ClaudeCode: Harness = Harness(&claude_code::ClaudeCode);
    pub const Codex: Harness = Harness(&codex::Codex);
    pub const OpenCode: Harness = Harness(&opencode::OpenCode);
    pub const Gemini: Harness = Harness(&gemini::Gemini);
    pub const Acp: Harness = Harness(&acp::Acp);
}

impl Harness {
    /// Every harness, in the order listings show them.
    pub const ALL: &'static [Harness] = &[
        Harness::Command,
        Harness::ClaudeCode,
        Harness::Codex,
        Harness::OpenCode,
        Harness::Gemini,
        Harness::Acp,
    ];

    pub fn parse(name: &str) -> Result<Self, HarnessError> {
        Self::ALL.iter().copied().find(|h| h.name() == name).ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|h| h.name()).collect();
            HarnessError::Unknown(name.to_owned(), known.join(", "))
        })
    }
}
