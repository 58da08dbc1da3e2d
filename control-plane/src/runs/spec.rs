//! What a run is and how its drivers are timed: the spec kept on the
//! record, and the driver's options.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Error, quiet};
use crate::config::{Limit, Quotas};
use crate::store::RunRecord;

/// What started a run, kept on its record (never a secret) so that any
/// replica can drive it on and describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    pub harness: String,
    pub definition_id: String,
    pub durable: bool,
    pub detach_on_disconnect: bool,
    #[serde(default)]
    pub cwd: String,
    /// The run's own location variables (`harness::session::LOCATION_VARS`:
    /// HOME, CODEX_HOME, ...), for carrying its session where it is kept.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub session_env: BTreeMap<String, String>,
    /// The CLI the run started (its argv[0]), for a harness whose sessions
    /// are carried: OpenCode's are, with the CLI's own export and import.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub program: String,
    /// What the run's command prints (the CLI's own lines, or the ACP
    /// bridge's for a CLI run under it), so a successor translates the
    /// journal the same way.
    #[serde(default, skip_serializing_if = "is_native")]
    pub output: crate::harness::Output,
    /// What the run was asked: the argv a `command` (or `acp`) run was
    /// given, and its prompt, capped at [`PROMPT_KEPT`] bytes. For people
    /// (the console, `Run`), never read by a driver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prompt: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prompt_truncated: bool,
    /// The run's token budget, the run's and its definition's limits
    /// merged at the start (a successor goes by this, not by a definition
    /// changed since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::usage::RunBudget>,
}

/// Bytes of a prompt a run's record keeps: enough to recognize the run,
/// bounded because every read of the record carries it.
pub const PROMPT_KEPT: usize = 16 * 1024;

/// The prompt as a record keeps it, and whether it was cut.
pub fn kept_prompt(prompt: &str) -> (String, bool) {
    if prompt.len() <= PROMPT_KEPT {
        return (prompt.to_owned(), false);
    }
    let mut end = PROMPT_KEPT;
    while !prompt.is_char_boundary(end) {
        end -= 1;
    }
    (prompt[..end].to_owned(), true)
}

fn is_native(o: &crate::harness::Output) -> bool {
    *o == crate::harness::Output::Native
}

impl RunSpec {
    pub fn of(record: &RunRecord) -> Result<Self, Error> {
        let value = record.spec.clone().ok_or_else(|| Error::NoSpec(record.run_id.clone()))?;
        serde_json::from_value(value)
            .map_err(|e| Error::Corrupt(format!("run {}: unreadable spec on its record: {e}", record.run_id)))
    }
}

/// Timings of the driver.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// A journal silent this long is probed (`ProbeExit`): a supervisor
    /// gone without its sentinel fails the run.
    pub liveness_probe: Duration,
    /// How long an unreachable agent is retried before the run fails.
    pub reconnect_budget: Duration,
    /// How often an attach whose run another replica holds tries to take
    /// the drive over (± half, at random). Each try is a lease read, plus a
    /// presence check in the database while the lease is held: cheap, and
    /// what bounds a takeover after a driver's process died.
    pub takeover_retry: Duration,
    /// How long a takeover waits for the stored log to stop growing before
    /// it reads it (default: no wait; the fence makes it unnecessary).
    pub quiet: quiet::QuietGate,
    /// Runs not yet terminal one tenant may have; a start over it is
    /// refused with RESOURCE_EXHAUSTED.
    pub running_runs: Limit,
    /// Model tokens the runs one tenant starts on one UTC day may use
    /// (0: no limit).
    pub tenant_daily_tokens: u64,
    /// Sandboxes one tenant may hold: what a set of attempts must fit in
    /// before any of it starts.
    pub sandboxes: Limit,
    /// Attempts one StartAttempts may fan a task out to.
    pub max_attempts: u32,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            liveness_probe: Duration::from_secs(5),
            reconnect_budget: Duration::from_secs(60),
            takeover_retry: Duration::from_millis(500),
            quiet: quiet::QuietGate::default(),
            running_runs: Quotas::default().running_runs(),
            tenant_daily_tokens: 0,
            sandboxes: Quotas::default().sandboxes(),
            max_attempts: Quotas::default().max_attempts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_prompt_is_cut_on_a_character_boundary() {
        assert_eq!(kept_prompt("fix the tests"), ("fix the tests".to_owned(), false));
        // 'é' is two bytes: the cut would fall inside one.
        let long = format!("a{}", "é".repeat(PROMPT_KEPT));
        let (kept, cut) = kept_prompt(&long);
        assert!(cut);
        assert_eq!(kept.len(), PROMPT_KEPT - 1);
        assert!(long.starts_with(&kept));
    }
}
