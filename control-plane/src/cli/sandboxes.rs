//! `sandhold sandboxes ls|rm`, `sandhold exec`, `sandhold definitions
//! apply|ls|rm` and `sandhold pools ls`: the clients of
//! `sandhold.v1.SandboxService`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::json;
use shared::proto::v1 as api;
use tokio_stream::StreamExt;

use super::client::ClientArgs;
use super::definition_file;
use super::output::{OutputFormat, json_line, message_json, process_exit_code, status_error};
use super::run::{SecretRef, age, secret_values, with_connection};

#[derive(Debug, Clone, Subcommand)]
pub enum SandboxesCommand {
    /// List the sandboxes.
    #[command(
        after_help = "Examples:\n  sandhold sandboxes ls\n  sandhold sandboxes ls --thread demo --output json"
    )]
    Ls {
        /// Only the sandboxes of this thread.
        #[arg(long, value_name = "ID")]
        thread: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Destroy a sandbox (its processes, files and container), or all of them.
    #[command(after_help = "Examples:\n  sandhold sandboxes rm 3f2a9c\n  sandhold sandboxes rm --all")]
    Rm {
        /// The sandbox: its id from `sandhold sandboxes ls`, or a unique prefix of it.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        sandbox_id: Option<String>,
        /// Every sandbox of the tenant.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Change (or show) a running sandbox's network rules: hosts allowed
    /// or denied on top of its definition's, for every new connection at
    /// once. Without flags it shows them.
    #[command(after_help = "Examples:
  sandhold sandboxes network 3f2a9c --allow-host registry.npmjs.org
                              sandhold sandboxes network 3f2a9c --deny-host '*.example.com'
                              sandhold sandboxes network 3f2a9c --reset
  sandhold sandboxes network 3f2a9c")]
    Network {
        /// The sandbox: its id from `sandhold sandboxes ls`, or a unique prefix of it.
        sandbox_id: String,
        /// A host to allow (`host`, `host:port`, `*.domain`), within the
        /// operator's egress hosts and not denied by the definition. Repeatable.
        #[arg(long = "allow-host", value_name = "HOST")]
        allow_hosts: Vec<String>,
        /// A host to deny (wins over every allow). Repeatable.
        #[arg(long = "deny-host", value_name = "HOST")]
        deny_hosts: Vec<String>,
        /// Drop the live rules first: back to the definition's rules alone.
        #[arg(long)]
        reset: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Which sandbox a process runs in, where, and with which secrets: the
/// arguments `exec` and `shell` share.
#[derive(Debug, Clone, Args)]
pub struct ProcessArgs {
    #[command(flatten)]
    pub target: super::ids::SandboxTarget,
    /// Working directory, relative to the workspace root.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// A secret for the process, NAME=ENV_VAR (value read from ENV_VAR here). Repeatable.
    #[arg(long = "secret", value_name = "NAME=ENV_VAR")]
    pub secrets: Vec<SecretRef>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub process: ProcessArgs,
    /// The program and its arguments (no shell; use `sh -c '...'` for one).
    #[arg(last = true, required = true, value_name = "CMD", help_heading = None::<&str>)]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum DefinitionsCommand {
    /// Store a definition from a file (TOML or JSON), replacing one of the same id.
    #[command(after_help = "Example:\n  sandhold definitions apply node-app.toml")]
    Apply {
        /// The definition file: TOML or JSON, a sandhold.v1.SandboxDefinition.
        file: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the stored definitions.
    #[command(after_help = "Example:\n  sandhold definitions ls --output json")]
    Ls {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete a definition.
    #[command(after_help = "Example:\n  sandhold definitions rm node-app")]
    Rm {
        /// The definition's id.
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum PoolsCommand {
    /// List the warm pools: per definition, sandboxes ready, claimed in the
    /// last 24 hours, and being made.
    #[command(after_help = "Examples:\n  sandhold pools ls\n  sandhold pools ls --output json")]
    Ls {
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn pools(command: PoolsCommand) -> ExitCode {
    let PoolsCommand::Ls { client } = command;
    let format = client.output;
    with_connection(&client, async move |conn| {
        let pools = conn
            .sandboxes()
            .list_warm_pools(api::ListWarmPoolsRequest {})
            .await
            .map_err(status_error)?
            .into_inner()
            .pools;
        match format {
            OutputFormat::Json => pools.iter().for_each(|p| json_line(&message_json(p, "WarmPool"))),
            OutputFormat::Human if pools.is_empty() => {
                eprintln!("no warm pools (a definition asks for one with `lifecycle.warm`, or `sandhold run --warm N`)")
            }
            OutputFormat::Human => {
                println!(
                    "{:<24} {:<16} {:>6} {:>6} {:>8} {:>10}  LAST ERROR",
                    "DEFINITION", "TENANT", "TARGET", "READY", "CLAIMED", "REFILLING"
                );
                for p in &pools {
                    println!(
                        "{:<24} {:<16} {:>6} {:>6} {:>8} {:>10}  {}",
                        p.definition_id, p.tenant, p.target, p.ready, p.claimed, p.refilling, p.last_error
                    );
                }
            }
        }
        Ok(0)
    })
    .await
}

pub async fn sandboxes(command: SandboxesCommand) -> ExitCode {
    match command {
        SandboxesCommand::Ls { client, thread } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let list = conn
                    .sandboxes()
                    .list_sandboxes(api::ListSandboxesRequest {
                        thread_id: thread.unwrap_or_default(),
                        // What the providers say of each: running, stopped
                        // or missing (and what a running one uses).
                        with_state: true,
                    })
                    .await
                    .map_err(status_error)?
                    .into_inner()
                    .sandboxes;
                match format {
                    OutputFormat::Json => list.iter().for_each(|s| json_line(&message_json(s, "Sandbox"))),
                    OutputFormat::Human if list.is_empty() => eprintln!("no sandboxes"),
                    OutputFormat::Human => {
                        // Ids as the console shows them: 16 characters, a
                        // prefix every command takes (`--output json` has
                        // them whole).
                        // NODE: where it lives, `-` on the server's own providers.
                        println!(
                            "{:<16} {:<8} {:<8} {:<16} {:<24} {:<24} CREATED",
                            "SANDBOX", "STATE", "PROVIDER", "NODE", "DEFINITION", "THREAD"
                        );
                        for s in &list {
                            println!(
                                "{:<16} {:<8} {:<8} {:<16} {:<24} {:<24} {}",
                                &s.sandbox_id[..s.sandbox_id.len().min(16)],
                                state_word(s.state()),
                                s.provider,
                                if s.node.is_empty() { "-" } else { &s.node },
                                s.definition_id,
                                s.thread_id,
                                age(s.created_at_ms)
                            );
                        }
                    }
                }
                Ok(0)
            })
            .await
        }
        SandboxesCommand::Rm { client, sandbox_id, all } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let ids = match sandbox_id {
                    Some(id) if !all => vec![super::ids::sandbox_id(conn, &id).await?],
                    _ => conn
                        .sandboxes()
                        .list_sandboxes(api::ListSandboxesRequest::default())
                        .await
                        .map_err(status_error)?
                        .into_inner()
                        .sandboxes
                        .into_iter()
                        .map(|s| s.sandbox_id)
                        .collect(),
                };
                for id in ids {
                    conn.sandboxes()
                        .destroy_sandbox(api::DestroySandboxRequest { sandbox_id: id.clone() })
                        .await
                        .map_err(status_error)?;
                    match format {
                        OutputFormat::Json => json_line(&json!({"removed": id})),
                        OutputFormat::Human => println!("removed {id}"),
                    }
                }
                Ok(0)
            })
            .await
        }
        SandboxesCommand::Network { sandbox_id, allow_hosts, deny_hosts, reset, client } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let sandbox_id = super::ids::sandbox_id(conn, &sandbox_id).await?;
                let request = api::UpdateNetworkPolicyRequest { sandbox_id, allow_hosts, deny_hosts, reset };
                let policy = conn
                    .sandboxes()
                    .update_network_policy(request)
                    .await
                    .map_err(status_error)?
                    .into_inner()
                    .policy
                    .unwrap_or_default();
                match format {
                    OutputFormat::Json => json_line(&message_json(&policy, "LiveNetworkPolicy")),
                    OutputFormat::Human => print_network(&policy),
                }
                Ok(0)
            })
            .await
        }
    }
}

/// The live rules, then the definition's, one rule a line.
fn print_network(policy: &api::LiveNetworkPolicy) {
    let lines = [
        ("live", "allow", &policy.allow_hosts),
        ("live", "deny", &policy.deny_hosts),
        ("definition", "allow", &policy.definition_allow),
        ("definition", "ask", &policy.definition_ask),
        ("definition", "deny", &policy.definition_deny),
    ];
    println!("{:<10} {:<5} HOST", "FROM", "RULE");
    for (from, rule, hosts) in lines {
        for host in hosts {
            println!("{from:<10} {rule:<5} {host}");
        }
    }
    if policy.version > 0 {
        println!(
            "changed {} times, last by {} {}",
            policy.version,
            policy.changed_by,
            age(policy.changed_at_ms)
        );
    }
}

/// Runs the command with its output streamed; exits with its exit code
/// (128 + N for a signal).
pub async fn exec(args: ExecArgs) -> ExitCode {
    let (args, command) = (args.process, args.command);
    let client = args.client.clone();
    let format = client.output;
    with_connection(&client, async move |conn| {
        let secrets = secret_values(&args.secrets)?;
        let start = api::ExecStreamStart {
            sandbox_id: args.target.resolve(conn).await?,
            command: Some(api::Command {
                kind: Some(api::command::Kind::Argv(api::Argv { args: command.clone() })),
            }),
            cwd: args.cwd.clone().unwrap_or_default(),
            env: Default::default(),
            secrets,
        };
        let requests = tokio_stream::iter([
            api::ExecStreamRequest { request: Some(api::exec_stream_request::Request::Start(start)) },
            api::ExecStreamRequest {
                request: Some(api::exec_stream_request::Request::CloseStdin(api::CloseStdin {})),
            },
        ])
        // Keep the request stream open: closing it would end the call.
        .chain(tokio_stream::pending());
        let mut responses = conn.sandboxes().exec_stream(requests).await.map_err(status_error)?.into_inner();
        while let Some(response) = responses.next().await {
            let response = response.map_err(status_error)?;
            if format == OutputFormat::Json {
                json_line(&message_json(&response, "ExecStreamResponse"));
            }
            match response.event {
                Some(api::exec_stream_response::Event::Output(o)) if format == OutputFormat::Human => {
                    use std::io::Write;
                    if o.stream() == api::OutputStream::Stderr {
                        let _ = std::io::stderr().write_all(&o.data);
                    } else {
                        let mut out = std::io::stdout().lock();
                        let _ = out.write_all(&o.data);
                        let _ = out.flush();
                    }
                }
                Some(api::exec_stream_response::Event::Exited(status)) => {
                    return Ok(process_exit_code(status.status));
                }
                _ => {}
            }
        }
        bail!("the server ended the stream before the command exited")
    })
    .await
}

pub async fn definitions(command: DefinitionsCommand) -> ExitCode {
    match command {
        DefinitionsCommand::Apply { client, file } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let definition = definition_file::load(&file)?;
                let stored = super::thread::put_definition(conn, definition).await?;
                match format {
                    OutputFormat::Json => json_line(&message_json(&stored, "SandboxDefinition")),
                    OutputFormat::Human => println!("applied definition {}", stored.id),
                }
                Ok(0)
            })
            .await
        }
        DefinitionsCommand::Ls { client } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let list = conn
                    .sandboxes()
                    .list_definitions(api::ListDefinitionsRequest {})
                    .await
                    .map_err(status_error)?
                    .into_inner()
                    .definitions;
                match format {
                    OutputFormat::Json => {
                        list.iter().for_each(|d| json_line(&message_json(d, "SandboxDefinition")))
                    }
                    OutputFormat::Human if list.is_empty() => eprintln!("no definitions"),
                    OutputFormat::Human => {
                        println!("{:<24} {:<8} DETAIL", "DEFINITION", "PROVIDER");
                        for d in &list {
                            let (provider, detail) = match crate::provider::ProviderKind::of(d) {
                                Some((kind, section)) => (kind.as_str(), kind.kind().detail(section)),
                                None => ("", String::new()),
                            };
                            println!("{:<24} {:<8} {}", d.id, provider, detail);
                        }
                    }
                }
                Ok(0)
            })
            .await
        }
        DefinitionsCommand::Rm { client, id } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                conn.sandboxes()
                    .delete_definition(api::DeleteDefinitionRequest { id: id.clone() })
                    .await
                    .map_err(status_error)?;
                match format {
                    OutputFormat::Json => json_line(&json!({"removed": id})),
                    OutputFormat::Human => println!("removed definition {id}"),
                }
                Ok(0)
            })
            .await
        }
    }
}

/// A sandbox's state as the list says it (the words of `--output json`).
fn state_word(state: api::SandboxState) -> &'static str {
    match state {
        api::SandboxState::Running => "running",
        api::SandboxState::Stopped => "stopped",
        api::SandboxState::Missing => "missing",
        api::SandboxState::Unspecified => "unknown",
    }
}
