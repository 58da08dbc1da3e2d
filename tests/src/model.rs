//! The real agent CLIs (`scripts/install-agent-clis`) and the fake model
//! API they talk to on 127.0.0.1 (`tests/fake-model/fake_model.py`): the
//! only double in the suite, standing in for the paid model services. With
//! what a brokered run of each CLI in a Docker sandbox needs (the model
//! reached only through the sandbox agent's broker, the key never in the
//! sandbox), for the broker's tests and the isolation bench.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use shared::proto::v1 as api;

use crate::docker::DEBIAN_IMAGE;
use crate::server::TenantServer;

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

/// How a [`FakeModel`] is started besides its scenario.
#[derive(Debug, Clone, Default)]
pub struct FakeOptions {
    /// Every request is appended here.
    pub log: Option<PathBuf>,
    /// While this file exists, answers wait.
    pub stall_file: Option<PathBuf>,
    /// While this file exists, answers to a tool's result wait.
    pub hold: Option<PathBuf>,
    /// The shell command the `tool` scenario has the CLI run.
    pub tool_command: Option<String>,
    /// Listen on the loopback of this network namespace (where a fleet
    /// node's sandboxes live), not this host's.
    pub netns: Option<String>,
    /// Listen on this address instead of 127.0.0.1 (a fleet's veth
    /// address, which every node's namespace reaches).
    pub host: Option<std::net::IpAddr>,
}

/// What each of the fake model's answers reports (Anthropic's shape:
/// uncached input, output, cache reads, cache writes).
pub const ANSWER_USAGE: (u64, u64, u64, u64) = (12, 7, 5, 3);

impl FakeModel {
    pub fn start(scenario: &str) -> Self {
        Self::with(scenario, FakeOptions::default())
    }

    /// As [`FakeModel::start`], appending every request to `log`.
    pub fn logging(scenario: &str, log: PathBuf) -> Self {
        Self::with(scenario, FakeOptions { log: Some(log), ..Default::default() })
    }

    /// As [`FakeModel::logging`]; its answers wait while `stall_file`
    /// exists (create it to stall, remove it to go on).
    pub fn stalling(scenario: &str, log: PathBuf, stall_file: PathBuf) -> Self {
        Self::with(
            scenario,
            FakeOptions { log: Some(log), stall_file: Some(stall_file), ..Default::default() },
        )
    }

    /// As [`FakeModel::logging`]; only its answers to a tool's result (the
    /// second turn) wait, while `hold` exists.
    pub fn holding_tool_results(scenario: &str, log: PathBuf, hold: PathBuf) -> Self {
        Self::with(scenario, FakeOptions { log: Some(log), hold: Some(hold), ..Default::default() })
    }

    /// The fake model of `scenario` with `options`.
    pub fn with(scenario: &str, options: FakeOptions) -> Self {
        let FakeOptions { log, stall_file, hold, tool_command, netns, host } = options;
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fake-model/fake_model.py");
        // `ip netns exec` execs python3 in the namespace: the child is it.
        let mut cmd = match &netns {
            Some(ns) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", ns, "python3"]);
                cmd
            }
            None => Command::new("python3"),
        };
        cmd.arg(script).args(["--scenario", scenario, "--port", "0"]);
        if let Some(log) = &log {
            cmd.arg("--log").arg(log);
        }
        if let Some(stall) = &stall_file {
            cmd.arg("--stall-file").arg(stall);
        }
        if let Some(hold) = &hold {
            cmd.arg("--hold-tool-results").arg(hold);
        }
        if let Some(command) = &tool_command {
            cmd.arg("--tool-command").arg(command);
        }
        if let Some(host) = host {
            cmd.arg("--host").arg(host.to_string());
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

/// What one CLI needs for a brokered run against the fake model.
pub struct BrokeredCli {
    pub harness: &'static str,
    pub key_name: &'static str,
    /// The upstream for the fake model on `port`.
    pub upstream: fn(u16) -> String,
    pub model: &'static str,
    /// The header the fake model must have received the key in.
    pub auth_header: &'static str,
    pub auth_prefix: &'static str,
}

pub const CLAUDE: BrokeredCli = BrokeredCli {
    harness: "claude-code",
    key_name: "ANTHROPIC_API_KEY",
    upstream: |port| format!("http://127.0.0.1:{port}"),
    model: "",
    auth_header: "x-api-key",
    auth_prefix: "",
};

pub const CODEX: BrokeredCli = BrokeredCli {
    harness: "codex",
    key_name: "OPENAI_API_KEY",
    upstream: |port| format!("http://127.0.0.1:{port}/v1"),
    model: "fake-model",
    auth_header: "authorization",
    auth_prefix: "Bearer ",
};

pub const OPENCODE: BrokeredCli = BrokeredCli {
    harness: "opencode",
    key_name: "ANTHROPIC_API_KEY",
    upstream: |port| format!("http://127.0.0.1:{port}/v1"),
    model: "anthropic/fake-model",
    auth_header: "x-api-key",
    auth_prefix: "",
};

impl BrokeredCli {
    /// A Docker definition of the Debian image whose model access is this
    /// CLI's, to `upstream`; its workspace a git work tree, so the run's
    /// changes come as `file.changed`.
    pub fn definition(&self, id: &str, upstream: String) -> api::SandboxDefinition {
        let docker = api::DockerProvider { image: DEBIAN_IMAGE.into(), ..Default::default() };
        api::SandboxDefinition {
            id: id.into(),
            provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
            secret_names: vec![self.key_name.into()],
            model_access: vec![api::ModelAccess {
                harness: self.harness.into(),
                upstream,
                key_secret: self.key_name.into(),
            }],
            workspace: Some(api::WorkspaceDefinition {
                setup: vec![api::SetupStep {
                    step: Some(api::setup_step::Step::Serial(
                        "git init -q . && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m init"
                            .into(),
                    )),
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A durable run of this CLI asked to write hello.txt (what the fake
    /// model's `tool` scenario has it do), `key` its model key.
    pub fn start_request(
        &self,
        run_id: &str,
        thread: &str,
        definition: &str,
        key: &str,
    ) -> api::StartRunRequest {
        api::StartRunRequest {
            thread_id: thread.into(),
            run_id: run_id.into(),
            definition_id: definition.into(),
            secrets: [(self.key_name.to_string(), key.to_string())].into(),
            harness: self.harness.into(),
            options: Some(api::HarnessOptions { model: self.model.into(), ..Default::default() }),
            prompt: "write hello.txt".into(),
            durable: true,
            ..Default::default()
        }
    }
}

/// Flags of a server whose sandboxes run the CLIs against the fake model:
/// the toolchain dir the tests share, and egress to this machine's
/// loopback (where the fake model listens).
pub fn broker_server_args() -> Vec<String> {
    vec![
        "--toolchain-dir".into(),
        crate::cli::toolchains().display().to_string(),
        "--egress-private-addresses".into(),
    ]
}

/// A [`TenantServer`] with [`broker_server_args`].
pub async fn broker_server(prefix: &str) -> TenantServer {
    let args = broker_server_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    TenantServer::start_with_args(prefix, &[], &args).await
}
