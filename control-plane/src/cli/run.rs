//! `sandhold run`, `attach`, `cancel`, `runs` and `logs`: the clients of
//! `sandhold.v1.RunService`.
//!
//! Runs started here are durable: closing the command (or Ctrl-C once)
//! detaches and the run goes on; `sandhold attach RUN_ID` comes back to it.
//! Ctrl-C twice within 2 s cancels it (`CancelRun`). Exit codes: 0 the run
//! completed, 1 it failed, 130 it was cancelled, 2 the command could not do
//! what was asked (bad flags, no server, ...). Detaching exits 0.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde_json::json;
use shared::chunk::{ChunkType, JsonChunk};
use shared::proto::v1 as api;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;
use tokio_stream::StreamExt;

use super::client::{ClientArgs, Connection};
use super::definition_file::{self, FromFlags};
use super::output::{self, OutputFormat, json_line, message_json, status_error};
use super::progress::EnsureDisplay;
use super::render::{Outcome, Renderer};
use super::{requests, terminal, thread};
use crate::harness::Harness;

/// A second Ctrl-C within this window cancels instead of detaching.
const CANCEL_WINDOW: Duration = Duration::from_secs(2);
/// Events `follow` handles in a row without waiting, before it listens for
/// Ctrl-C and the prompt again.
const READY_BURST: usize = 256;

/// Exit code when the command itself failed (not the run).
pub const EXIT_USAGE: u8 = 2;

// The library's harnesses as `--harness` values, in the registry's order.
impl ValueEnum for Harness {
    fn value_variants<'a>() -> &'a [Self] {
        Harness::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let value = clap::builder::PossibleValue::new(self.name());
        Some(if *self == Harness::Command {
            value.help("Any program: the argv after `--`")
        } else if *self == Harness::Acp {
            value.help("An Agent Client Protocol agent: its command line in --acp-command")
        } else {
            value
        })
    }
}

/// `NAME=ENV_VAR`: the secret NAME takes the value of the variable ENV_VAR
/// (`NAME` alone: the variable of the same name). Values never come from
/// the command line.
#[derive(Debug, Clone)]
pub struct SecretRef {
    pub name: String,
    pub var: String,
}

impl std::str::FromStr for SecretRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, var) = s.split_once('=').unwrap_or((s, s));
        let ok = |v: &str| !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok(name) || !ok(var) {
            return Err(format!(
                "{s:?}: expected NAME=ENV_VAR (e.g. ANTHROPIC_API_KEY=MY_KEY_VAR), letters, digits and _ only; \
                 the value is read from the environment variable, never from the command line"
            ));
        }
        Ok(Self { name: name.into(), var: var.into() })
    }
}

/// Read the secret values from the environment.
pub fn secret_values(refs: &[SecretRef]) -> anyhow::Result<std::collections::HashMap<String, String>> {
    refs.iter()
        .map(|r| match std::env::var(&r.var) {
            Ok(v) if !v.is_empty() => Ok((r.name.clone(), v)),
            _ => bail!("--secret {}={}: the environment variable {} is not set", r.name, r.var, r.var),
        })
        .collect()
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// A sandbox definition file (TOML or JSON: a sandhold.v1.SandboxDefinition,
    /// see docs/cli.md, "Definition files"). Replaces
    /// --image/--local/--repo/--setup.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["image", "local", "repo", "setup", "network", "runtime"])]
    pub definition: Option<PathBuf>,

    /// Run in a Docker container of this image (the server needs a static agent).
    #[arg(long, value_name = "IMAGE", conflicts_with = "local")]
    pub image: Option<String>,

    /// Run in a directory on the server's host. NO isolation (the default
    /// without --image or --definition).
    #[arg(long)]
    pub local: bool,

    /// Check out this git repository (a URL, or a directory on this machine)
    /// as the workspace.
    #[arg(long, value_name = "URL_OR_PATH")]
    pub repo: Option<String>,

    /// A setup command run once when the sandbox is created; repeatable, in order.
    #[arg(long = "setup", value_name = "CMD")]
    pub setup: Vec<String>,

    /// Docker network of the container [default: none, no network].
    #[arg(long, value_name = "NAME")]
    pub network: Option<String>,

    /// Container runtime: `runc`, or `gvisor` (a user-space kernel between
    /// the run and the host's) [default: runc, or what the operator requires].
    #[arg(long, value_name = "RUNTIME", requires = "image", value_parser = ["runc", "gvisor"])]
    pub runtime: Option<String>,

    /// Runs of one thread share a sandbox: on an existing thread, a run
    /// without definition flags uses the thread's definition. Unset: a new
    /// thread, whose sandbox is removed once the run completes.
    #[arg(long, value_name = "ID")]
    pub thread: Option<String>,

    /// What runs: `command` (the argv after `--`) or an agent CLI given
    /// the prompt after `--`.
    #[arg(long, value_enum, default_value_t = Harness::Command)]
    pub harness: Harness,

    /// The model, for the agent harnesses.
    #[arg(long)]
    pub model: Option<String>,

    /// The ACP agent's command line, split as a shell would (no expansion),
    /// e.g. 'npx codex-acp'. Required with --harness acp.
    #[arg(long, value_name = "CMD", required_if_eq("harness", "acp"))]
    pub acp_command: Option<String>,

    /// A mode the ACP agent lists, set on its session (`session/set_mode`),
    /// e.g. codex-acp's `full-access`.
    #[arg(long, value_name = "MODE", requires = "acp_command")]
    pub acp_mode: Option<String>,

    /// How the ACP agent's permission requests are answered [default: allow].
    #[arg(long, value_name = "ANSWER", value_parser = ["allow", "deny"], requires = "acp_command")]
    pub acp_permissions: Option<String>,

    /// A secret the sandbox gets as an environment variable, NAME=ENV_VAR:
    /// its value is read from ENV_VAR here. Repeatable; adds to
    /// --definition's `secret_names`.
    #[arg(long = "secret", value_name = "NAME=ENV_VAR")]
    pub secrets: Vec<SecretRef>,

    /// The model API the harness's requests go to, through the sandbox's
    /// broker (which adds the key: the sandbox never holds it): the URL
    /// the CLI would take as its own base URL [default: the harness's
    /// public API]. The key is the `--secret` named as the CLI expects it
    /// (ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY). Applies on top
    /// of --definition too.
    #[arg(long, env = "SANDHOLD_MODEL_UPSTREAM", value_name = "URL")]
    pub model_upstream: Option<String>,

    /// A host the sandbox may reach through its egress proxy (HTTPS_PROXY
    /// is set for setup and the run): `host` (ports 80 and 443),
    /// `host:port` or `*.domain`. Repeatable; adds to --definition's.
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    pub allow_hosts: Vec<String>,

    /// Keep N sandboxes of this definition created, set up and idle, so a
    /// new thread's run takes one at once (`lifecycle.warm`; `sandhold
    /// pools ls` shows the pools). Overrides --definition's.
    #[arg(long, value_name = "N")]
    pub warm: Option<u32>,

    /// A label the node holding the sandbox must carry, KEY=VALUE (e.g.
    /// runtime=gvisor; a server with nodes only). Repeatable; adds to
    /// --definition's `[placement] require`.
    #[arg(long = "require", value_name = "K=V")]
    pub require: Vec<String>,

    /// The run's token budget: input and output tokens together (cache
    /// reads and writes count as input), as the model broker reads them
    /// from the model's answers. Once reached, the broker refuses further
    /// model requests and the run ends with BUDGET_EXCEEDED. Takes the
    /// place of the definition's `[budget] max_tokens`. Needs brokered model
    /// access (--secret with the harness's key).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokens: Option<u64>,

    /// As --max-tokens, for input tokens only (cache reads and writes
    /// included).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_input_tokens: Option<u64>,

    /// As --max-tokens, for output tokens only.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_output_tokens: Option<u64>,

    /// What the harness may do without asking when no rule matches
    /// (the policy: see docs/requests.md). With `ask`, a terminal shows each
    /// request as a prompt; `sandhold respond` answers from anywhere.
    #[arg(long, value_name = "EFFECT", value_parser = ["allow", "ask", "deny"])]
    pub policy_default: Option<String>,

    /// Allow without asking: `[command:|write:|network:]GLOB` (a command
    /// line glob without a prefix). Repeatable.
    #[arg(long = "allow", value_name = "PATTERN")]
    pub allow: Vec<String>,

    /// Ask the client first (a request the run waits on). Repeatable.
    #[arg(long = "ask", value_name = "PATTERN")]
    pub ask: Vec<String>,

    /// Never, and without asking. Repeatable.
    #[arg(long = "deny", value_name = "PATTERN")]
    pub deny: Vec<String>,

    /// A policy file (JSON: {"default":"ask","rules":[{"action":"command",
    /// "pattern":"git push*","effect":"deny"}],"request_timeout_ms":600000});
    /// --policy-default and the rule flags add to it. The run's policy
    /// tightens the definition's, never loosens it.
    #[arg(long = "policy", value_name = "FILE")]
    pub policy_file: Option<PathBuf>,

    /// Start a new harness session instead of continuing the one the
    /// thread's last run of this harness ended with.
    #[arg(long)]
    pub new_session: bool,

    /// Return as soon as the run is accepted, printing its id.
    #[arg(long)]
    pub detach: bool,

    /// Run the task N times, each attempt in a fork of the thread's latest
    /// checkpoint, followed side by side; then `sandhold attempts show` and
    /// `attempts promote` (the definition needs portable snapshots: the
    /// flags' definition gets them).
    #[arg(long, value_name = "N")]
    pub attempts: Option<u32>,

    /// One attempt of this harness (and model), for a mix; repeatable (N is
    /// their number).
    #[arg(long = "attempt", value_name = "HARNESS[:MODEL]")]
    pub attempt: Vec<String>,

    /// The run's id [default: generated].
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,

    /// The command (harness `command`) or the prompt (the agent harnesses).
    #[arg(last = true, required = true, value_name = "COMMAND_OR_PROMPT")]
    pub command: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, Args)]
pub struct AttachArgs {
    /// The run: an id from `sandhold runs`, or a unique prefix of it.
    pub run_id: String,
    /// Resume after this offset (an `offset` of a chunk already seen).
    #[arg(long, value_name = "OFFSET")]
    pub from: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RunIdArgs {
    /// The run: an id from `sandhold runs`, or a unique prefix of it.
    pub run_id: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub action: Option<RunsAction>,
    /// Only the runs of this thread.
    #[arg(long, value_name = "ID")]
    pub thread: Option<String>,
    /// At most this many, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum RunsAction {
    /// Remove ended runs with their logs and requests (their sandboxes are
    /// not touched). A run still going is refused: cancel it first.
    #[command(
        after_help = "Examples:\n  sandhold runs rm run-3f2a9c1d0b7e\n  sandhold runs rm run-3f2a run-77c1"
    )]
    Rm {
        /// The runs: ids from `sandhold runs`, or unique prefixes of them.
        #[arg(required = true, value_name = "RUN_ID")]
        run_ids: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

impl RunArgs {
    /// Whether the run names its definition (a file or a definition flag),
    /// rather than leaving it to the thread.
    fn names_a_definition(&self) -> bool {
        self.definition.is_some()
            || self.image.is_some()
            || self.local
            || self.repo.is_some()
            || !self.setup.is_empty()
            || self.network.is_some()
            || self.runtime.is_some()
            || self.model_upstream.is_some()
            || !self.allow_hosts.is_empty()
            || self.warm.is_some()
            || !self.require.is_empty()
    }

    /// `--attempts` or `--attempt`: the task fans out to a set of attempts.
    pub fn fans_out(&self) -> bool {
        self.attempts.is_some() || !self.attempt.is_empty()
    }
}

/// Run `body` on a connection, print its error if any, close the connection.
pub async fn with_connection(
    client: &ClientArgs,
    body: impl AsyncFnOnce(&Connection) -> anyhow::Result<u8>,
) -> ExitCode {
    let conn = match Connection::open(client).await {
        Ok(c) => c,
        Err(e) => {
            output::print_error(client.output, &e);
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = body(&conn).await;
    conn.close().await;
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            output::print_error(client.output, &e);
            ExitCode::from(EXIT_USAGE)
        }
    }
}

pub async fn run(args: RunArgs) -> ExitCode {
    let prepared = match prepare(&args) {
        Ok(p) => p,
        Err(e) => {
            output::print_error(args.client.output, &e);
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let client = args.client.clone();
    with_connection(&client, async move |conn| start(conn, &args, prepared).await).await
}

pub(super) struct Prepared {
    definition: api::SandboxDefinition,
    request: api::StartRunRequest,
}

pub(super) fn prepare(args: &RunArgs) -> anyhow::Result<Prepared> {
    let secrets = secret_values(&args.secrets)?;
    let secret_names: Vec<String> = args.secrets.iter().map(|s| s.name.clone()).collect();
    let definition = match &args.definition {
        Some(path) => {
            let mut definition = definition_file::load(path)?;
            broker_on_top(&mut definition, args, &secret_names);
            definition
        }
        None => FromFlags {
            image: args.image.clone(),
            repo: args.repo.clone(),
            setup: args.setup.clone(),
            model_access: model_access(args, &[]).into_iter().collect(),
            allow_hosts: args.allow_hosts.clone(),
            require: args.require.clone(),
            secret_names,
            network: args.network.clone(),
            runtime: args.runtime.clone(),
            // Attempts are compared in their sandboxes after their runs.
            destroy_on_complete: args.thread.is_none() && !args.fans_out(),
            portable_snapshots: args.fans_out(),
            warm: args.warm.unwrap_or_default(),
        }
        .build()?,
    };
    let short = || uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let run_id = args.run_id.clone().unwrap_or_else(|| format!("run-{}", short()));
    shared::ids::RunId::parse(&run_id).map_err(|e| anyhow::anyhow!("--run-id: {e}"))?;
    let thread_id = args.thread.clone().unwrap_or_else(|| format!("thread-{}", short()));
    let mut options =
        api::HarnessOptions { model: args.model.clone().unwrap_or_default(), ..Default::default() };
    if let Some(line) = &args.acp_command {
        if args.harness != Harness::Acp {
            anyhow::bail!("--acp-command is for --harness acp");
        }
        options.command = match shlex::split(line) {
            Some(words) if !words.is_empty() => words,
            _ => anyhow::bail!("--acp-command: not a command line: {line:?}"),
        };
        options.sandbox_mode = args.acp_mode.clone().unwrap_or_default();
        options.permission_mode = args.acp_permissions.clone().unwrap_or_default();
    }
    let prompt = if args.harness == Harness::Command {
        options.command = args.command.clone();
        String::new()
    } else {
        args.command.join(" ")
    };
    let request = api::StartRunRequest {
        thread_id,
        run_id,
        definition_id: definition.id.clone(),
        secrets,
        harness: args.harness.name().to_string(),
        options: Some(options),
        prompt,
        durable: true,
        detach_on_disconnect: None,
        cwd: String::new(),
        new_session: args.new_session,
        policy: run_policy(args)?.map(|p| crate::sandbox::policy_to_api(&p)),
        client_tools: Vec::new(),
        budget: run_budget(args),
    };
    Ok(Prepared { definition, request })
}

/// The run's budget from `--max-tokens` and its one-sided forms; `None`
/// when none is given.
fn run_budget(args: &RunArgs) -> Option<api::Budget> {
    let budget = api::Budget {
        max_tokens: args.max_tokens.unwrap_or(0),
        max_input_tokens: args.max_input_tokens.unwrap_or(0),
        max_output_tokens: args.max_output_tokens.unwrap_or(0),
    };
    (budget != api::Budget::default()).then_some(budget)
}

/// The run's policy from `--policy FILE`, `--policy-default` and the rule
/// flags; `None` when none is given.
fn run_policy(args: &RunArgs) -> anyhow::Result<Option<shared::policy::Policy>> {
    use shared::policy::{Effect, Policy, Rule};
    let flags = args.policy_default.is_some()
        || !(args.allow.is_empty() && args.ask.is_empty() && args.deny.is_empty());
    let mut policy = match &args.policy_file {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("--policy {}", path.display()))?;
            Policy::from_json(&text).map_err(|e| anyhow::anyhow!("--policy {}: {e}", path.display()))?
        }
        None if !flags => return Ok(None),
        None => Policy::default(),
    };
    if let Some(d) = &args.policy_default {
        policy.default = Effect::parse(d).map_err(|e| anyhow::anyhow!("--policy-default: {e}"))?;
    }
    for (effect, patterns, flag) in [
        (Effect::Allow, &args.allow, "--allow"),
        (Effect::Ask, &args.ask, "--ask"),
        (Effect::Deny, &args.deny, "--deny"),
    ] {
        for p in patterns {
            policy.rules.push(Rule::from_flag(effect, p).map_err(|e| anyhow::anyhow!("{flag} {p:?}: {e}"))?);
        }
    }
    policy.validate().map_err(|e| anyhow::anyhow!("the run's policy: {e}"))?;
    Ok(Some(policy))
}

/// The harness's brokered model access from the flags: the harness and
/// `--model-upstream` (or the upstream `existing` names). Which secret is
/// the key is the server's to settle (`ModelAccess.key_secret`): with no
/// key among the secrets there is nothing to broker and the run uses
/// whatever the image gives the CLI. `None` for a harness with no model API.
fn model_access(args: &RunArgs, existing: &[api::ModelAccess]) -> Option<api::ModelAccess> {
    let harness = args.harness;
    harness.model_api()?;
    let mine = existing.iter().find(|m| m.harness == harness.name());
    let upstream =
        args.model_upstream.clone().or_else(|| mine.map(|m| m.upstream.clone())).unwrap_or_default();
    let key_secret = mine.map(|m| m.key_secret.clone()).unwrap_or_default();
    Some(api::ModelAccess { harness: harness.name().to_string(), upstream, key_secret })
}

/// The `--secret` names, `--model-upstream`, `--allow-host` and `--warm` on
/// top of a definition file's own settings.
fn broker_on_top(definition: &mut api::SandboxDefinition, args: &RunArgs, secret_names: &[String]) {
    for name in secret_names {
        if !definition.secret_names.contains(name) {
            definition.secret_names.push(name.clone());
        }
    }
    if let Some(access) = model_access(args, &definition.model_access) {
        definition.model_access.retain(|m| m.harness != access.harness);
        definition.model_access.push(access);
    }
    if let Some(warm) = args.warm {
        definition.lifecycle.get_or_insert_with(Default::default).warm = warm;
    }
    if !args.require.is_empty() {
        let placement = definition.placement.get_or_insert_with(Default::default);
        for r in &args.require {
            if !placement.require.contains(r) {
                placement.require.push(r.clone());
            }
        }
    }
    if !args.allow_hosts.is_empty() {
        let network = definition.network.get_or_insert_with(Default::default);
        for host in &args.allow_hosts {
            if !network.allow_hosts.contains(host) {
                network.allow_hosts.push(host.clone());
            }
        }
    }
}

async fn start(conn: &Connection, args: &RunArgs, prepared: Prepared) -> anyhow::Result<u8> {
    let format = args.client.output;
    let (request, notice) = resolve(conn, args, prepared).await?;
    let run_id = request.run_id.clone();
    match format {
        OutputFormat::Json => json_line(&json!({"run_id": run_id, "thread_id": request.thread_id})),
        OutputFormat::Human => eprintln!("run {run_id} (thread {})", request.thread_id),
    }
    if let Some(line) = notice {
        match format {
            OutputFormat::Json => json_line(&json!({"notice": line, "run_id": run_id})),
            OutputFormat::Human => eprintln!("{line}"),
        }
    }
    let stream = conn.runs().start_run(request).await.map_err(status_error)?.into_inner();
    let mut session = Session::new(conn, &run_id, format);
    if args.detach {
        return session.until_accepted(stream).await;
    }
    session.follow(stream).await
}

/// The run's request with its definition settled: the thread's when no
/// flag names one, else the flags' or the file's, stored (and a notice when
/// that changes the thread's).
pub(super) async fn resolve(
    conn: &Connection,
    args: &RunArgs,
    prepared: Prepared,
) -> anyhow::Result<(api::StartRunRequest, Option<String>)> {
    let Prepared { definition, mut request } = prepared;
    let existing = match &args.thread {
        Some(t) => thread::definition_of(conn, t).await?,
        None => None,
    };
    let mut notice = None;
    match existing {
        // A thread keeps its sandbox: no definition flags, the server takes
        // the thread's definition.
        Some(_) if !args.names_a_definition() => request.definition_id = String::new(),
        existing => {
            let stored = thread::put_definition(conn, definition).await?;
            if let Some(old) = existing.filter(|old| old.id != stored.id) {
                notice = Some(format!(
                    "thread {}: these flags change its definition ({}), so this run gets a sandbox of its own; \
                     without definition flags a run uses the thread's sandbox",
                    request.thread_id,
                    thread::changes(&old, &stored).join("; ")
                ));
            }
            request.definition_id = stored.id;
        }
    }
    Ok((request, notice))
}

pub async fn attach(args: AttachArgs) -> ExitCode {
    let client = args.client.clone();
    with_connection(&client, async move |conn| {
        let run_id = super::ids::run_id(conn, &args.run_id).await?;
        let request = api::AttachRunRequest {
            run_id: run_id.clone(),
            after_offset: args.from.clone().unwrap_or_default(),
            thread_id: String::new(),
            stored_only: false,
        };
        let stream = conn.runs().attach_run(request).await.map_err(status_error)?.into_inner();
        Session::new(conn, &run_id, args.client.output).follow(stream).await
    })
    .await
}

pub async fn cancel(args: RunIdArgs) -> ExitCode {
    let client = args.client.clone();
    with_connection(&client, async move |conn| {
        let run_id = super::ids::run_id(conn, &args.run_id).await?;
        let response = conn
            .runs()
            .cancel_run(api::CancelRunRequest { run_id })
            .await
            .map_err(status_error)?
            .into_inner();
        let run = response.run.unwrap_or_default();
        match args.client.output {
            OutputFormat::Json => json_line(&message_json(&run, "Run")),
            OutputFormat::Human => {
                println!("cancel requested: run {} is {}", run.run_id, status_name(run.status()))
            }
        }
        Ok(0)
    })
    .await
}

pub async fn runs(args: RunsArgs) -> ExitCode {
    if let Some(RunsAction::Rm { run_ids, client }) = args.action {
        return remove_runs(run_ids, client).await;
    }
    let client = args.client.clone();
    with_connection(&client, async move |conn| {
        let response = conn
            .runs()
            .list_runs(api::ListRunsRequest {
                thread_id: args.thread.clone().unwrap_or_default(),
                limit: args.limit,
                ..Default::default()
            })
            .await
            .map_err(status_error)?
            .into_inner();
        match args.client.output {
            OutputFormat::Json => response.runs.iter().for_each(|r| json_line(&message_json(r, "Run"))),
            OutputFormat::Human => print_runs(&response.runs),
        }
        Ok(0)
    })
    .await
}

/// `runs rm`: each run removed in turn; one that cannot be (still going,
/// unknown) is reported and the rest are still removed. Fails if any did.
async fn remove_runs(given: Vec<String>, client: ClientArgs) -> ExitCode {
    let format = client.output;
    with_connection(&client, async move |conn| {
        let mut failed = 0;
        for given in &given {
            let removed = async {
                let run_id = super::ids::run_id(conn, given).await?;
                conn.runs()
                    .delete_run(api::DeleteRunRequest { run_id: run_id.clone() })
                    .await
                    .map_err(|status| match status.code() {
                        tonic::Code::FailedPrecondition => anyhow::anyhow!(
                            "run {run_id} has not ended: cancel it first (`sandhold cancel {run_id}`), or wait \
                             for it"
                        ),
                        _ => status_error(status),
                    })?;
                anyhow::Ok(run_id)
            }
            .await;
            match (removed, format) {
                (Ok(run_id), OutputFormat::Json) => json_line(&serde_json::json!({"removed": run_id})),
                (Ok(run_id), OutputFormat::Human) => println!("removed run {run_id}"),
                (Err(e), _) => {
                    failed += 1;
                    super::output::print_error(format, &e);
                }
            }
        }
        Ok(u8::from(failed > 0))
    })
    .await
}

/// The stored log, printed and not followed: a read-only look that never
/// takes the run over, also while it is going.
pub async fn logs(args: RunIdArgs) -> ExitCode {
    let client = args.client.clone();
    with_connection(&client, async move |conn| {
        let request = api::AttachRunRequest {
            run_id: super::ids::run_id(conn, &args.run_id).await?,
            after_offset: String::new(),
            thread_id: String::new(),
            stored_only: true,
        };
        let mut stream = conn.runs().attach_run(request).await.map_err(status_error)?.into_inner();
        let mut renderer = Renderer::new();
        while let Some(event) = stream.next().await {
            let event = event.map_err(status_error)?;
            if let Some(api::run_event::Event::Chunk(rc)) = event.event {
                let chunk = rc.chunk.unwrap_or_default();
                match args.client.output {
                    OutputFormat::Json => json_line(&JsonChunk::line(&rc.offset, &chunk)),
                    OutputFormat::Human => renderer.chunk(&chunk),
                }
                if Outcome::of(&chunk).is_some() {
                    break;
                }
            }
        }
        Ok(0)
    })
    .await
}

fn print_runs(runs: &[api::Run]) {
    if runs.is_empty() {
        eprintln!("no runs");
        return;
    }
    use std::io::Write;
    // Written, not println!: a reader that stops early (`sandhold runs |
    // head`) closes the pipe, and the rest is not wanted.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{:<24} {:<11} {:<12} {:<24} STARTED", "RUN", "STATUS", "HARNESS", "THREAD");
    for r in runs {
        let line = writeln!(
            out,
            "{:<24} {:<11} {:<12} {:<24} {}",
            r.run_id,
            status_name(r.status()),
            r.harness,
            r.thread_id,
            age(r.started_at_ms)
        );
        if line.is_err() {
            return;
        }
    }
}

/// A run status as people read it: the word `--output json` prints too
/// ([`super::output::enum_word`]), `unknown` for none.
pub fn status_name(s: api::RunStatus) -> String {
    if s == api::RunStatus::Unspecified {
        return "unknown".into();
    }
    let descriptor =
        super::output::POOL.get_enum_by_name("sandhold.v1.RunStatus").expect("RunStatus is in the pool");
    super::output::enum_word(&descriptor, s.as_str_name())
}

/// `5m ago` from a Unix time in milliseconds.
pub fn age(ms: i64) -> String {
    let secs = (shared::chunk::now_ms() - ms).max(0) / 1000;
    match secs {
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86_400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

/// The next line typed, or never when nothing reads stdin.
async fn typed(lines: &mut Option<tokio::sync::mpsc::UnboundedReceiver<String>>) -> Option<String> {
    match lines {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Lines of stdin, read on a thread of their own (a blocking read cannot
/// be cancelled; the thread ends with the process).
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
            if tx.send(std::mem::take(&mut line)).is_err() {
                break;
            }
        }
    });
    rx
}

/// Following one run's stream on behalf of the user: rendering, what
/// Ctrl-C means, and prompts for the run's permission requests.
struct Session<'a> {
    conn: &'a Connection,
    run_id: String,
    format: OutputFormat,
    renderer: Renderer,
    display: Option<EnsureDisplay>,
    interrupt: Option<Signal>,
    prompt: Prompt,
}

/// Permission requests shown as prompts, one at a time, on a terminal.
#[derive(Default)]
struct Prompt {
    /// Human output with a terminal on stdin and stderr.
    enabled: bool,
    /// Waiting to be shown: (request id, tool, what to show).
    queue: std::collections::VecDeque<(String, String, String)>,
    /// Shown, waiting for a typed answer.
    current: Option<(String, String)>,
    /// Tools the user allowed for the rest of the run: answered at once.
    always: std::collections::HashSet<String>,
    /// Requests to allow without asking (a tool allowed always).
    auto: Vec<String>,
    /// Lines typed, from a thread reading stdin (started at the first prompt).
    lines: Option<tokio::sync::mpsc::UnboundedReceiver<String>>,
}

enum Step {
    Event(Option<Result<api::RunEvent, tonic::Status>>),
    Interrupt,
    DetachNow,
    Typed(Option<String>),
}

impl<'a> Session<'a> {
    fn new(conn: &'a Connection, run_id: &str, format: OutputFormat) -> Self {
        Self {
            conn,
            run_id: run_id.to_string(),
            format,
            renderer: Renderer::new(),
            display: None,
            // Without a handler (no signal support) Ctrl-C simply ends the
            // process, which detaches too.
            interrupt: signal(SignalKind::interrupt()).ok(),
            prompt: Prompt {
                enabled: format == OutputFormat::Human
                    && std::io::IsTerminal::is_terminal(&std::io::stdin())
                    && std::io::IsTerminal::is_terminal(&std::io::stderr()),
                ..Default::default()
            },
        }
    }

    /// Progress until the first chunk (the run is accepted), then detach.
    async fn until_accepted(&mut self, mut stream: tonic::Streaming<api::RunEvent>) -> anyhow::Result<u8> {
        // An embedded server stops when this command returns, and a run whose
        // command has not started by then fails. So there, wait for the
        // first translated chunk, or else for the sandbox to be recorded on
        // the run and a moment for the journal to start (the stream has no
        // event for "the command runs" before it prints something).
        let embedded = self.conn.is_embedded();
        let mut accepted = false;
        let conn = self.conn;
        let run_id = self.run_id.clone();
        let started = sandbox_recorded(conn, &run_id);
        tokio::pin!(started);
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                _ = &mut started, if embedded && accepted => break,
            };
            match event {
                Some(Ok(api::RunEvent { event: Some(api::run_event::Event::Progress(p)) })) => {
                    self.progress(&p)
                }
                Some(Ok(api::RunEvent { event: Some(api::run_event::Event::Chunk(rc)) })) => {
                    let chunk = rc.chunk.unwrap_or_default();
                    if let Some(outcome) = Outcome::of(&chunk) {
                        // Over before we could detach (a failed setup, ...).
                        self.end_display(None);
                        if self.format == OutputFormat::Json {
                            json_line(&JsonChunk::line(&rc.offset, &chunk));
                        } else {
                            self.renderer.chunk(&chunk);
                        }
                        return Ok(self.finish(outcome).await);
                    }
                    accepted = true;
                    let accepted_only = chunk.r#type() == ChunkType::Custom && chunk.name == "run.accepted";
                    if !(accepted_only && embedded) {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(status)) => {
                    self.end_display(None);
                    return Err(status_error(status));
                }
                None => bail!("the server ended the stream before accepting run {}", self.run_id),
            }
        }
        self.end_display(Some("sandbox ready"));
        match self.format {
            OutputFormat::Json => json_line(&json!({"run_id": self.run_id, "detached": true})),
            OutputFormat::Human => {
                println!("{}", self.run_id);
                eprintln!("detached; follow it with `{}`", self.attach_hint());
            }
        }
        Ok(0)
    }

    /// Until the run ends, or the user detaches.
    async fn follow(&mut self, mut stream: tonic::Streaming<api::RunEvent>) -> anyhow::Result<u8> {
        let mut first_interrupt: Option<Instant> = None;
        let mut cancelling = false;
        // JSON chunks are written deferred: an event already received is
        // handled without waiting (up to READY_BURST in a row, so Ctrl-C and
        // the prompt are still heard), and the buffer is flushed before
        // waiting for more, and on every way out.
        let _flush = output::FlushJsonOnDrop;
        let mut burst = 0;
        loop {
            let ready = match burst < READY_BURST {
                true => futures::FutureExt::now_or_never(stream.next()),
                false => None,
            };
            let step = match ready {
                Some(event) => {
                    burst += 1;
                    Step::Event(event)
                }
                None => {
                    burst = 0;
                    output::json_flush();
                    let detach_at = first_interrupt.filter(|_| !cancelling).map(|t| t + CANCEL_WINDOW);
                    tokio::select! {
                        event = stream.next() => Step::Event(event),
                        _ = recv(&mut self.interrupt) => Step::Interrupt,
                        _ = sleep_until(detach_at) => Step::DetachNow,
                        line = typed(&mut self.prompt.lines) => Step::Typed(line),
                    }
                }
            };
            match step {
                Step::Event(Some(Ok(event))) => {
                    if let Some(outcome) = self.event(event) {
                        self.end_display(None);
                        return Ok(self.finish(outcome).await);
                    }
                    for id in std::mem::take(&mut self.prompt.auto) {
                        self.answer(&id, requests::Decision::Allow, false).await;
                    }
                    self.show_prompt();
                }
                Step::Typed(None) => self.prompt.lines = None,
                Step::Typed(Some(line)) => {
                    let Some((id, tool)) = self.prompt.current.clone() else { continue };
                    match requests::parse_prompt(&line) {
                        None => eprint!("allow {tool}? [y]es once / [n]o / al[w]ays for this run: "),
                        Some(p) => {
                            self.prompt.current = None;
                            if p == requests::Prompted::Always {
                                self.prompt.always.insert(tool);
                            }
                            let decision = if p == requests::Prompted::Deny {
                                requests::Decision::Deny
                            } else {
                                requests::Decision::Allow
                            };
                            self.answer(&id, decision, p == requests::Prompted::Always).await;
                            self.show_prompt();
                        }
                    }
                }
                Step::Event(Some(Err(status))) => {
                    self.end_display(None);
                    return Err(status_error(status)).with_context(|| {
                        format!("following run {}; `{}` follows it again", self.run_id, self.attach_hint())
                    });
                }
                Step::Event(None) => {
                    self.end_display(None);
                    bail!(
                        "the stream of run {} ended before the run did; `{}` follows it again",
                        self.run_id,
                        self.attach_hint()
                    );
                }
                Step::Interrupt => match first_interrupt {
                    Some(t) if t.elapsed() <= CANCEL_WINDOW && !cancelling => {
                        cancelling = true;
                        self.note(&format!("cancelling run {}", self.run_id));
                        self.conn
                            .runs()
                            .cancel_run(api::CancelRunRequest { run_id: self.run_id.clone() })
                            .await
                            .map_err(status_error)?;
                    }
                    Some(_) if cancelling => {
                        self.note("still cancelling; waiting for the run to stop");
                    }
                    _ => {
                        first_interrupt = Some(Instant::now());
                        self.note("detaching in 2 s (the run keeps going); press Ctrl-C again to cancel it");
                    }
                },
                Step::DetachNow => {
                    self.end_display(None);
                    match self.format {
                        OutputFormat::Json => json_line(&json!({"run_id": self.run_id, "detached": true})),
                        OutputFormat::Human => {
                            eprintln!(
                                "detached from run {}; come back with `{}`",
                                self.run_id,
                                self.attach_hint()
                            )
                        }
                    }
                    return Ok(0);
                }
            }
        }
    }

    /// Answer a request from this terminal; a failure (answered elsewhere
    /// first) is a note, not the end of the session.
    async fn answer(&mut self, id: &str, decision: requests::Decision, always: bool) {
        if let Err(e) = requests::answer(self.conn, &self.run_id, id, decision, None, (always, None)).await {
            self.note(&format!("request {id}: {e:#}"));
        }
    }

    /// Show the next waiting request, if none is shown.
    fn show_prompt(&mut self) {
        if self.prompt.current.is_some() {
            return;
        }
        let Some((id, tool, line)) = self.prompt.queue.pop_front() else { return };
        self.end_display(None);
        if self.prompt.lines.is_none() {
            self.prompt.lines = Some(stdin_lines());
        }
        eprintln!("? {line}");
        eprint!("allow {}? [y]es once / [n]o / al[w]ays for this run: ", terminal::visible_line(&tool));
        self.prompt.current = Some((id, tool));
    }

    /// Keep the prompt's queue in step with the log's requests.
    fn track_request(&mut self, chunk: &shared::chunk::Chunk) {
        let Some(r) = &chunk.request else { return };
        match chunk.r#type() {
            ChunkType::PermissionRequested => {
                // What `always` remembers: the tool, or a network request's
                // destination (its allow covers that host and port only).
                let tool = match r.kind.as_str() {
                    "network" => {
                        let input: serde_json::Value =
                            serde_json::from_str(&r.input_json).unwrap_or_default();
                        format!("network {}:{}", input["host"].as_str().unwrap_or_default(), input["port"])
                    }
                    _ => chunk.tool_name.clone(),
                };
                if self.prompt.always.contains(&tool) {
                    self.prompt.auto.push(r.request_id.clone());
                    return;
                }
                let request = api::RunRequest {
                    request_id: r.request_id.clone(),
                    kind: r.kind.clone(),
                    tool: chunk.tool_name.clone(),
                    input_json: r.input_json.clone(),
                    rule: r.rule.clone(),
                    ..Default::default()
                };
                let line = requests::request_line(&self.run_id, &request);
                self.prompt.queue.push_back((r.request_id.clone(), tool, line));
            }
            ChunkType::PermissionResolved => {
                self.prompt.queue.retain(|(id, _, _)| *id != r.request_id);
                if self.prompt.current.as_ref().is_some_and(|(id, _)| *id == r.request_id) {
                    self.prompt.current = None;
                    eprintln!();
                    let verb = if r.allowed { "allowed" } else { "denied" };
                    eprintln!(
                        "request {} {verb} by {} elsewhere",
                        terminal::visible_line(&r.request_id),
                        terminal::visible_line(&r.answered_by)
                    );
                }
            }
            _ => {}
        }
    }

    /// Handle one event; `Some` once the run has ended.
    fn event(&mut self, event: api::RunEvent) -> Option<Outcome> {
        match event.event? {
            api::run_event::Event::Progress(p) => {
                self.progress(&p);
                None
            }
            api::run_event::Event::Chunk(rc) => {
                let chunk = rc.chunk.unwrap_or_default();
                // `run.accepted` may come before the sandbox is ready.
                let accepted = chunk.r#type() == ChunkType::Custom && chunk.name == "run.accepted";
                if Outcome::of(&chunk).is_some() {
                    self.end_display(None);
                } else if !accepted {
                    self.end_display(Some("sandbox ready"));
                }
                match self.format {
                    OutputFormat::Json => output::json_line_deferred(&JsonChunk::line(&rc.offset, &chunk)),
                    OutputFormat::Human => self.renderer.chunk(&chunk),
                }
                if self.prompt.enabled {
                    self.track_request(&chunk);
                }
                Outcome::of(&chunk)
            }
        }
    }

    fn progress(&mut self, p: &api::EnsureProgress) {
        match self.format {
            OutputFormat::Json => json_line(&json!({"progress": message_json(p, "EnsureProgress")})),
            OutputFormat::Human => self.display.get_or_insert_with(EnsureDisplay::new).update(p),
        }
    }

    fn end_display(&mut self, message: Option<&str>) {
        if let Some(mut d) = self.display.take() {
            match message {
                Some(m) => d.finish(m),
                None => d.abandon(),
            }
        }
    }

    fn note(&mut self, line: &str) {
        if let Some(d) = &mut self.display {
            d.abandon();
            self.display = None;
        }
        match self.format {
            OutputFormat::Json => json_line(&json!({"notice": line, "run_id": self.run_id})),
            OutputFormat::Human => eprintln!("{}", terminal::visible(line)),
        }
    }

    async fn finish(&mut self, outcome: Outcome) -> u8 {
        match self.format {
            OutputFormat::Json => {}
            OutputFormat::Human => match &outcome {
                Outcome::Completed => {}
                Outcome::Cancelled => eprintln!("run {} cancelled", self.run_id),
                Outcome::Failed { .. } => eprintln!("run {} failed", self.run_id),
            },
        }
        // A cancel destroys the sandbox; otherwise its definition decides.
        if outcome != Outcome::Cancelled {
            self.say_if_kept().await;
        }
        outcome.exit_code()
    }

    /// Where the run's sandbox stays, and how to remove it, when its
    /// definition keeps it after the run (no `destroy_on_complete`).
    async fn say_if_kept(&mut self) {
        let request = api::GetRunRequest { run_id: self.run_id.clone() };
        let Some(run) = self.conn.runs().get_run(request).await.ok().and_then(|r| r.into_inner().run) else {
            return;
        };
        if run.sandbox_id.is_empty() || run.definition_id.is_empty() {
            return;
        }
        let request = api::GetDefinitionRequest { id: run.definition_id.clone(), thread_id: String::new() };
        let Ok(definition) = self.conn.sandboxes().get_definition(request).await else { return };
        let lifecycle = definition.into_inner().definition.and_then(|d| d.lifecycle);
        if lifecycle.is_some_and(|l| l.destroy_on_complete) {
            return;
        }
        let short = &run.sandbox_id[..run.sandbox_id.len().min(16)];
        self.note(&format!(
            "sandbox kept: {short} (thread {}); remove it with `sandhold sandboxes rm {short}`",
            run.thread_id
        ));
    }

    fn attach_hint(&self) -> String {
        attach_command(self.conn, &self.run_id)
    }
}

/// Once the run's record names its sandbox, plus time for the journal to
/// start (the driver records the sandbox, then starts the command).
async fn sandbox_recorded(conn: &Connection, run_id: &str) {
    loop {
        let run = conn.runs().get_run(api::GetRunRequest { run_id: run_id.to_string() }).await;
        if run.is_ok_and(|r| r.into_inner().run.is_some_and(|r| !r.sandbox_id.is_empty())) {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The command that comes back to a run.
pub fn attach_command(conn: &Connection, run_id: &str) -> String {
    if conn.remote {
        format!("sandhold attach --server {} {run_id}", conn.target)
    } else {
        format!("sandhold attach {run_id}")
    }
}

async fn recv(signal: &mut Option<Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_refs_name_variables_not_values() {
        let r: SecretRef = "ANTHROPIC_API_KEY=MY_VAR".parse().unwrap();
        assert_eq!((r.name.as_str(), r.var.as_str()), ("ANTHROPIC_API_KEY", "MY_VAR"));
        let same: SecretRef = "TOKEN".parse().unwrap();
        assert_eq!(same.var, "TOKEN");
        assert!("A=sk-ant-123-value with spaces".parse::<SecretRef>().is_err());
        let missing = secret_values(&["X=SANDHOLD_TEST_SURELY_UNSET_VAR".parse().unwrap()]).unwrap_err();
        assert!(missing.to_string().contains("SANDHOLD_TEST_SURELY_UNSET_VAR is not set"), "{missing}");
    }
}
