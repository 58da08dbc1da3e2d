//! `sandhold nodes ls|drain|rm`: the operator's view of the fleet
//! (AdminService's node calls).

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;
use shared::proto::v1 as api;

use super::client::ClientArgs;
use super::output::{OutputFormat, json_line, message_json, status_error};
use super::run::with_connection;

#[derive(Debug, Clone, Subcommand)]
pub enum NodesCommand {
    /// List the fleet's nodes: state, sandboxes, free memory, labels.
    #[command(after_help = "Examples:\n  sandhold nodes ls\n  sandhold nodes ls --output json")]
    Ls {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Give a node no new sandbox; its sandboxes and runs go on.
    #[command(after_help = "Example:\n  sandhold nodes drain node-2")]
    Drain {
        /// The node's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Forget a node: its runs end SANDBOX_LOST and it may not register again.
    #[command(after_help = "Example:\n  sandhold nodes rm node-2")]
    Rm {
        /// The node's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn nodes(command: NodesCommand) -> ExitCode {
    match command {
        NodesCommand::Ls { client } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let nodes = conn
                    .admin()
                    .list_nodes(api::ListNodesRequest {})
                    .await
                    .map_err(status_error)?
                    .into_inner()
                    .nodes;
                match format {
                    OutputFormat::Json => nodes.iter().for_each(|n| json_line(&message_json(n, "Node"))),
                    OutputFormat::Human if nodes.is_empty() => eprintln!("no nodes"),
                    OutputFormat::Human => {
                        println!(
                            "{:<20} {:<12} {:<10} {:<12} LABELS",
                            "NAME", "STATE", "SANDBOXES", "FREE MEMORY"
                        );
                        for n in &nodes {
                            let slots = n.capacity.as_ref().map(|c| c.sandbox_slots).unwrap_or_default();
                            let mut labels: Vec<String> =
                                n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                            labels.sort();
                            println!(
                                "{:<20} {:<12} {:<10} {:<12} {}",
                                n.name,
                                n.state,
                                format!("{}/{slots}", n.sandboxes),
                                gib(n.free_memory_bytes),
                                labels.join(",")
                            );
                        }
                    }
                }
                Ok(0)
            })
            .await
        }
        NodesCommand::Drain { name, client } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let node = conn
                    .admin()
                    .drain_node(api::DrainNodeRequest { name: name.clone() })
                    .await
                    .map_err(status_error)?
                    .into_inner()
                    .node
                    .unwrap_or_default();
                match format {
                    OutputFormat::Json => json_line(&message_json(&node, "Node")),
                    OutputFormat::Human => println!("{name} draining: no new sandbox goes to it"),
                }
                Ok(0)
            })
            .await
        }
        NodesCommand::Rm { name, client } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                conn.admin()
                    .remove_node(api::RemoveNodeRequest { name: name.clone() })
                    .await
                    .map_err(status_error)?;
                match format {
                    OutputFormat::Json => json_line(&json!({"removed": name})),
                    OutputFormat::Human => println!("removed {name}"),
                }
                Ok(0)
            })
            .await
        }
    }
}

/// Bytes as GiB with one decimal.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}
