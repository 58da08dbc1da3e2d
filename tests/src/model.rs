//! The real agent CLIs (`scripts/install-agent-clis`) and the fake model
//! API they talk to on 127.0.0.1 (`tests/fake-model/fake_model.py`): the
//! only double in the suite, standing in for the paid model services.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The installed agent CLI `name` (`claude`, `codex`, `opencode`, `gemini`,
/// `codex-acp`, `claude-code-acp`). Skips
/// when it is missing, unless `SANDHOLD_REQUIRE_SERVICES=1`.
pub fn cli(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("SANDHOLD_CLI_DIR")
        .map_or_else(|| PathBuf::from("/opt/sandhold-clis"), PathBuf::from);
    let bin = dir.join("node_modules/.bin").join(name);
    if bin.is_file() {
        return Some(bin);
    }
    if crate::services::required() {
        panic!("{} is required (SANDHOLD_REQUIRE_SERVICES=1); run scripts/install-agent-clis", bin.display());
    }
    eprintln!("skipping: {} not installed (scripts/install-agent-clis)", bin.display());
    None
}

/// The fake model API on a random loopback port, stopped on drop.
pub struct FakeModel {
    child: Child,
    pub port: u16,
    /// Every request it received, one JSON line each (`{"path", "auth",
    /// "body"}`).
    pub log: Option<PathBuf>,
    /// While this file exists, answers wait ([`FakeModel::stalling`]).
    pub stall_file: Option<PathBuf>,
}

impl FakeModel {
    pub fn start(scenario: &str) -> Self {
        Self::spawn(scenario, None, None)
    }

    /// As [`FakeModel::start`], appending every request to `log`.
    pub fn logging(scenario: &str, log: PathBuf) -> Self {
        Self::spawn(scenario, Some(log), None)
    }

    /// As [`FakeModel::logging`]; its answers wait while `stall_file`
    /// exists (create it to stall, remove it to go on).
    pub fn stalling(scenario: &str, log: PathBuf, stall_file: PathBuf) -> Self {
        Self::spawn(scenario, Some(log), Some(stall_file))
    }

    fn spawn(scenario: &str, log: Option<PathBuf>, stall_file: Option<PathBuf>) -> Self {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fake-model/fake_model.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).args(["--scenario", scenario, "--port", "0"]);
        if let Some(log) = &log {
            cmd.arg("--log").arg(log);
        }
        if let Some(stall) = &stall_file {
            cmd.arg("--stall-file").arg(stall);
        }
        let mut child =
            cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("python3 runs the fake model");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let port = first.trim().strip_prefix("PORT=").and_then(|p| p.parse().ok()).expect("PORT=<n> first");
        Self { child, port, log, stall_file }
    }

    /// The bodies of the requests received so far, as text.
    pub fn requests(&self) -> Vec<String> {
        let Some(log) = &self.log else { return Vec::new() };
        std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_string).collect()
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
