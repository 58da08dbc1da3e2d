//! `sandhold-agent mcp --requests DIR`: the run's `sandhold` MCP server over
//! stdio (JSON-RPC 2.0, one message a line), started by the harness from the
//! MCP config of the run. It serves:
//!
//! - `permission` (when the run has a policy): Claude Code's permission
//!   prompt tool (`--permission-prompt-tool mcp__sandhold__permission`).
//!   The policy decides; an `ask` becomes a durable request and the answer
//!   decides. The result is the JSON text Claude Code expects,
//!   `{"behavior":"allow","updatedInput":…}` or
//!   `{"behavior":"deny","message":…}`.
//! - one tool per client tool of the run: each call is a durable request;
//!   the result is the client's text (an error when it says so, when it
//!   denies, or at the deadline).
//!
//! Calls are served on threads of their own (a harness may call tools in
//! parallel); at end of input the server waits for the calls in flight.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use shared::policy::{Effect, Policy};
use shared::requests::{Answer, Request, RequestKind};

use crate::request_dir::{self, RequestDir, ToolSpec};

/// The MCP protocol versions spoken (newest first).
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The server's name: Claude Code calls its tools `mcp__sandhold__<tool>`.
pub const SERVER_NAME: &str = "sandhold";
/// The permission prompt tool.
pub const PERMISSION_TOOL: &str = "permission";

#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// The run's request dir (`{{sandhold-requests}}` in a run's argv).
    #[arg(long)]
    pub requests: PathBuf,
}

/// What one server knows: the request dir, the policy, the tools, and the
/// tools answered "always" during this run.
pub struct Server {
    dir: RequestDir,
    policy: Option<Policy>,
    tools: Vec<ToolSpec>,
    always: Mutex<HashSet<String>>,
}

type RpcResult = Result<Value, (i64, String)>;

impl Server {
    pub fn new(dir: RequestDir) -> Self {
        let (policy, tools) = (dir.policy(), dir.tools());
        Self { dir, policy, tools, always: Mutex::new(HashSet::new()) }
    }

    /// The answer to one request (`None` for a notification).
    pub fn handle(&self, method: &str, params: &Value) -> RpcResult {
        match method {
            "initialize" => {
                let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
                let version =
                    PROTOCOL_VERSIONS.iter().find(|v| **v == asked).unwrap_or(&PROTOCOL_VERSIONS[0]);
                Ok(json!({
                    "protocolVersion": version,
                    "capabilities": { "tools": { "listChanged": false } },
                    "serverInfo": { "name": SERVER_NAME, "version": env!("CARGO_PKG_VERSION") },
                }))
            }
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({ "tools": self.list() })),
            "tools/call" => {
                let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
                let args = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
                if name == PERMISSION_TOOL && self.policy.is_some() {
                    Ok(self.permission(&args))
                } else if self.tools.iter().any(|t| t.name == name) {
                    Ok(self.client_tool(name, args))
                } else {
                    Err((-32602, format!("unknown tool: {name}")))
                }
            }
            other => Err((-32601, format!("method not found: {other}"))),
        }
    }

    fn list(&self) -> Vec<Value> {
        let mut tools = Vec::new();
        if self.policy.is_some() {
            tools.push(json!({
                "name": PERMISSION_TOOL,
                "description": "Decides whether a tool call may run, by the sandbox policy and, where it asks, the client.",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "tool_name": { "type": "string" },
                        "input": { "type": "object" },
                        "tool_use_id": { "type": "string" },
                    },
                    "required": ["tool_name", "input"],
                },
            }));
        }
        for t in &self.tools {
            tools
                .push(json!({ "name": t.name, "description": t.description, "inputSchema": t.input_schema }));
        }
        tools
    }

    fn ask(&self, kind: RequestKind, tool: &str, input: Value, tool_call_id: &str, rule: &str) -> Answer {
        let request = Request {
            request_id: String::new(),
            kind,
            tool: tool.to_string(),
            input,
            tool_call_id: tool_call_id.to_string(),
            rule: rule.to_string(),
            deadline_ms: 0,
        };
        request_dir::ask(&self.dir, request).unwrap_or_else(|e| {
            request_dir::denial("", shared::requests::AnsweredBy::Deadline, &format!("cannot ask: {e}"))
        })
    }

    /// Claude Code's permission prompt tool.
    fn permission(&self, args: &Value) -> Value {
        let tool = args.get("tool_name").and_then(Value::as_str).unwrap_or_default();
        let input = args.get("input").cloned().unwrap_or_else(|| json!({}));
        let tool_use_id = args.get("tool_use_id").and_then(Value::as_str).unwrap_or_default();
        let policy = self.policy.as_ref().expect("a permission tool has a policy");
        let decision = policy.decide_tool(tool, &input);
        let always = self.always.lock().expect("not poisoned").contains(tool);
        let verdict = match decision.effect {
            Effect::Allow => Ok(()),
            Effect::Ask if always => Ok(()),
            Effect::Deny => Err(format!("denied by the sandbox policy ({})", decision.rule)),
            Effect::Ask => {
                let answer =
                    self.ask(RequestKind::Permission, tool, input.clone(), tool_use_id, &decision.rule);
                if answer.allowed {
                    if answer.always {
                        self.always.lock().expect("not poisoned").insert(tool.to_string());
                    }
                    Ok(())
                } else if answer.message.is_empty() {
                    Err(format!("denied by {}", answer.by.as_str()))
                } else {
                    Err(answer.message)
                }
            }
        };
        let body = match verdict {
            Ok(()) => json!({ "behavior": "allow", "updatedInput": input }),
            Err(message) => json!({ "behavior": "deny", "message": message }),
        };
        json!({ "content": [{ "type": "text", "text": body.to_string() }] })
    }

    fn client_tool(&self, name: &str, args: Value) -> Value {
        let answer = self.ask(RequestKind::ClientTool, name, args, "", "");
        json!({
            "content": [{ "type": "text", "text": answer.message }],
            "isError": answer.is_error || !answer.allowed,
        })
    }
}

fn write_line(out: &Mutex<std::io::Stdout>, message: &Value) {
    let mut bytes = serde_json::to_vec(message).expect("a JSON value serializes");
    bytes.push(b'\n');
    let out = out.lock().expect("not poisoned");
    let mut out = out.lock();
    let _ = out.write_all(&bytes).and_then(|()| out.flush());
}

fn reply(id: Value, result: RpcResult) -> Value {
    match result {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err((code, message)) => {
            json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
        }
    }
}

pub fn main(args: McpArgs) -> ExitCode {
    let server = Arc::new(Server::new(RequestDir::new(args.requests)));
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let mut calls = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let message: Value = match serde_json::from_str(&line) {
            Ok(m) => m,
            Err(e) => {
                write_line(&out, &reply(Value::Null, Err((-32700, format!("parse error: {e}")))));
                continue;
            }
        };
        let Some(method) = message.get("method").and_then(Value::as_str).map(str::to_string) else {
            continue; // a response: this server sends no requests
        };
        let Some(id) = message.get("id").cloned() else {
            continue; // a notification (notifications/initialized, cancelled, ...)
        };
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        if method == "tools/call" {
            let (server, out) = (server.clone(), out.clone());
            calls.push(std::thread::spawn(move || {
                write_line(&out, &reply(id, server.handle(&method, &params)))
            }));
        } else {
            write_line(&out, &reply(id, server.handle(&method, &params)));
        }
    }
    for call in calls {
        let _ = call.join();
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request_dir::Setup;
    use shared::ids::RunId;

    fn server(policy: &str) -> (tempfile::TempDir, Server) {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunId::parse("run-1").unwrap();
        let dir = RequestDir::choose(tmp.path(), None, &run);
        let tools = vec![ToolSpec {
            name: "lookup".into(),
            description: "d".into(),
            input_schema: json!({"type":"object"}),
        }];
        let setup = Setup { policy: Some(Policy::from_json(policy).unwrap()), tools };
        dir.create(&setup, None, b"k", &run).unwrap();
        (tmp, Server::new(dir))
    }

    fn text(v: &Value) -> Value {
        serde_json::from_str(v["content"][0]["text"].as_str().unwrap()).unwrap()
    }

    #[test]
    fn versions_tools_and_policy_decisions_without_asking() {
        let (_tmp, s) =
            server(r#"{"default":"ask","rules":[{"action":"command","pattern":"rm *","effect":"deny"}]}"#);
        let init = s.handle("initialize", &json!({"protocolVersion": "2025-03-26"})).unwrap();
        assert_eq!(init["protocolVersion"], "2025-03-26");
        let init = s.handle("initialize", &json!({"protocolVersion": "1999-01-01"})).unwrap();
        assert_eq!(init["protocolVersion"], PROTOCOL_VERSIONS[0]);
        let tools = s.handle("tools/list", &json!({})).unwrap();
        let names: Vec<&str> =
            tools["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["permission", "lookup"]);
        let read = s
            .handle(
                "tools/call",
                &json!({"name":"permission","arguments":{"tool_name":"Read","input":{"file_path":"x"}}}),
            )
            .unwrap();
        assert_eq!(text(&read), json!({"behavior":"allow","updatedInput":{"file_path":"x"}}));
        let rm = s
            .handle(
                "tools/call",
                &json!({"name":"permission","arguments":{"tool_name":"Bash","input":{"command":"rm -rf /"}}}),
            )
            .unwrap();
        assert_eq!(
            text(&rm),
            json!({"behavior":"deny","message":"denied by the sandbox policy (deny command:rm *)"})
        );
        assert_eq!(s.handle("nope", &json!({})).unwrap_err().0, -32601);
        assert_eq!(s.handle("tools/call", &json!({"name":"other"})).unwrap_err().0, -32602);
        assert!(std::fs::read_dir(s.dir.path().join("ask")).unwrap().next().is_none(), "nothing was asked");
    }
}
