//! `sandhold-agent acp -- CMD...`: a small Agent Client Protocol client,
//! run as a journaled command. It starts the ACP agent `CMD` with its stdio
//! piped, speaks JSON-RPC 2.0 (one JSON object a line) to it — `initialize`,
//! `session/new` or `session/load`, one `session/prompt` with the prompt read
//! from stdin — and writes one JSON line to stdout (the run journal) per
//! thing that happened:
//!
//! - `{"type":"session","sessionId":…,"loaded":bool,"modes":…}` once the
//!   session is there (then `--mode`, if given, is set);
//! - `{"type":"update","update":{…}}` per `session/update` of the prompt
//!   turn, as the agent sent it (message and thought chunks, tool calls and
//!   their updates, plans, ...); the replay of a loaded session's history is
//!   not repeated;
//! - `{"type":"permission","toolCall":{…},"optionId":…,"allowed":bool}` per
//!   `session/request_permission`, answered by `--permissions` (allow: the
//!   first allow option; deny: the first reject option; policy: the run's
//!   policy in `--requests DIR` decides, and where it asks, the client
//!   answers a durable request; the line then has the deciding `rule`);
//! - `{"type":"warning","message":…}` (a session the agent cannot or could
//!   not load: a new session is started instead; a stray non-protocol line);
//! - `{"type":"stop","stopReason":…}` at the end of the turn, or
//!   `{"type":"error","message":…,"code":…}` when a call failed (exit 1).
//!
//! The MCP servers of the run (`--mcp-servers FILE`: a JSON array in ACP's
//! `McpServer` shape, which Sandhold writes at the sandbox root from the
//! workspace's MCP skills) go to `session/new` and `session/load`; a
//! relative FILE is looked for in the working directory, then in each
//! folder above it (a run's working directory may be below the root), and
//! none found means no servers. Servers over a transport the agent does not
//! advertise (`mcpCapabilities.http` / `.sse`) are left out, with a warning.
//!
//! It advertises the file system capability and serves
//! `fs/read_text_file` and `fs/write_text_file` itself (it runs as the run
//! user, in the run's working directory); terminals are not offered.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shared::policy::{Effect, Policy};
use shared::requests::{Request, RequestKind};

use crate::request_dir::{self, RequestDir};

/// The ACP version spoken.
const PROTOCOL_VERSION: u64 = 1;
/// How long the agent may take to exit once its stdin is closed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Permissions {
    /// Every permission request gets its first allow option.
    Allow,
    /// Every permission request gets its first reject option.
    Deny,
    /// The run's policy (`--requests`) decides; an `ask` is a durable
    /// request the client answers.
    Policy,
}

#[derive(Debug, clap::Args)]
pub struct AcpArgs {
    /// Load this session (`session/load`) instead of starting a new one.
    #[arg(long)]
    pub session: Option<String>,
    /// Switch the session to this mode (`session/set_mode`, one of the
    /// modes the agent lists with the session), e.g. an agent's own
    /// unsandboxed mode: the sandbox is the isolation.
    #[arg(long)]
    pub mode: Option<String>,
    /// How permission requests are answered.
    #[arg(long, value_enum, default_value_t = Permissions::Allow)]
    pub permissions: Permissions,
    /// The run's request dir (`{{sandhold-requests}}`), for
    /// `--permissions policy`.
    #[arg(long)]
    pub requests: Option<std::path::PathBuf>,
    /// The session's MCP servers: a JSON array of ACP `McpServer`s. A
    /// relative path is looked for from the working directory upward.
    #[arg(long)]
    pub mcp_servers: Option<std::path::PathBuf>,
    /// The ACP agent's command line.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// A JSON-RPC failure: the agent's error object, or why there is none.
#[derive(Debug)]
struct Failure {
    message: String,
    code: String,
}

impl Failure {
    fn io(what: &str, e: impl std::fmt::Display) -> Self {
        Self { message: format!("{what}: {e}"), code: "acp_io".into() }
    }
}

/// The connection to the agent and the journal lines written so far.
struct Client<W: Write> {
    to_agent: ChildStdin,
    from_agent: BufReader<ChildStdout>,
    out: W,
    next_id: u64,
    permissions: Permissions,
    /// The run's request dir and policy (`--permissions policy`).
    requests: Option<(RequestDir, Policy)>,
    /// Tools the client allowed for the rest of the run.
    always: std::collections::HashSet<String>,
    /// While true, `session/update`s are the history of a loaded session.
    replaying: bool,
}

impl<W: Write> Client<W> {
    fn emit(&mut self, line: &Value) -> Result<(), Failure> {
        let mut bytes = serde_json::to_vec(line).expect("a JSON value serializes");
        bytes.push(b'\n');
        self.out.write_all(&bytes).and_then(|()| self.out.flush()).map_err(|e| Failure::io("stdout", e))
    }

    fn send(&mut self, message: &Value) -> Result<(), Failure> {
        let mut bytes = serde_json::to_vec(message).expect("a JSON value serializes");
        bytes.push(b'\n');
        self.to_agent
            .write_all(&bytes)
            .and_then(|()| self.to_agent.flush())
            .map_err(|e| Failure::io("writing to the agent", e))
    }

    /// Call `method` and serve the agent until its response arrives.
    fn call(&mut self, method: &str, params: Value) -> Result<Value, Failure> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))?;
        loop {
            let mut line = String::new();
            let n = self.from_agent.read_line(&mut line).map_err(|e| Failure::io("reading the agent", e))?;
            if n == 0 {
                return Err(Failure {
                    message: format!("the agent closed its output before answering {method}"),
                    code: "acp_closed".into(),
                });
            }
            let Ok(Value::Object(message)) = serde_json::from_str::<Value>(line.trim()) else {
                // Not protocol: an agent's stray print. Said, not fatal.
                let text: String = line.trim().chars().take(512).collect();
                if !text.is_empty() {
                    self.emit(
                        &json!({ "type": "warning", "message": "not a JSON-RPC message", "line": text }),
                    )?;
                }
                continue;
            };
            let message = Value::Object(message);
            match (message.get("method").and_then(Value::as_str), message.get("id")) {
                (Some(m), Some(req_id)) => {
                    let req_id = req_id.clone();
                    let params = message.get("params").cloned().unwrap_or(Value::Null);
                    let reply = match self.serve(m, &params) {
                        Ok(result) => json!({ "jsonrpc": "2.0", "id": req_id, "result": result }),
                        Err((code, text)) => {
                            json!({ "jsonrpc": "2.0", "id": req_id, "error": { "code": code, "message": text } })
                        }
                    };
                    self.send(&reply)?;
                }
                (Some(m), None) => self.notified(m, message.get("params").unwrap_or(&Value::Null))?,
                (None, Some(r)) if r.as_u64() == Some(id) => {
                    if let Some(e) = message.get("error") {
                        let text = e.get("message").and_then(Value::as_str).unwrap_or("error").to_owned();
                        let code = e.get("code").map_or_else(|| "unknown".into(), Value::to_string);
                        return Err(Failure {
                            message: format!("{method}: {text}"),
                            code: format!("acp_{code}"),
                        });
                    }
                    return Ok(message.get("result").cloned().unwrap_or(Value::Null));
                }
                // A response to nothing asked: ignored.
                _ => {}
            }
        }
    }

    fn notified(&mut self, method: &str, params: &Value) -> Result<(), Failure> {
        if method == "session/update" && !self.replaying {
            let update = params.get("update").cloned().unwrap_or(Value::Null);
            self.emit(&json!({ "type": "update", "update": update }))?;
        }
        Ok(())
    }

    /// A request of the agent: its result, or a JSON-RPC error.
    fn serve(&mut self, method: &str, params: &Value) -> Result<Value, (i64, String)> {
        match method {
            "session/request_permission" => {
                let options = params.get("options").and_then(Value::as_array).cloned().unwrap_or_default();
                let tool_call = params.get("toolCall").cloned().unwrap_or(Value::Null);
                let (allowed, rule) = match self.permissions {
                    Permissions::Allow => (true, None),
                    Permissions::Deny => (false, None),
                    Permissions::Policy => {
                        let (allowed, rule) = self.decide(&tool_call);
                        (allowed, Some(rule))
                    }
                };
                let wanted: &[&str] =
                    if allowed { &["allow_once", "allow_always"] } else { &["reject_once", "reject_always"] };
                let chosen = wanted.iter().find_map(|kind| {
                    options.iter().find(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
                });
                let Some(option_id) = chosen.and_then(|o| o.get("optionId")).cloned() else {
                    let _ =
                        self.emit(&json!({ "type": "permission", "toolCall": tool_call, "allowed": false }));
                    return Ok(json!({ "outcome": { "outcome": "cancelled" } }));
                };
                let mut line = json!({ "type": "permission", "toolCall": tool_call, "optionId": option_id, "allowed": allowed });
                if let Some(rule) = rule {
                    line["rule"] = json!(rule);
                }
                self.emit(&line).map_err(|f| (-32603, f.message))?;
                Ok(json!({ "outcome": { "outcome": "selected", "optionId": option_id } }))
            }
            "fs/read_text_file" => {
                let path = params.get("path").and_then(Value::as_str).ok_or((-32602, "path".to_owned()))?;
                let text = std::fs::read_to_string(path).map_err(|e| (-32603, format!("{path}: {e}")))?;
                let line = params.get("line").and_then(Value::as_u64).unwrap_or(1).max(1);
                let limit = params.get("limit").and_then(Value::as_u64);
                let content = match (line, limit) {
                    (1, None) => text,
                    _ => {
                        let skip = usize::try_from(line - 1).unwrap_or(usize::MAX);
                        let take = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
                        text.split_inclusive('\n').skip(skip).take(take).collect()
                    }
                };
                Ok(json!({ "content": content }))
            }
            "fs/write_text_file" => {
                let path = params.get("path").and_then(Value::as_str).ok_or((-32602, "path".to_owned()))?;
                let content = params.get("content").and_then(Value::as_str).unwrap_or_default();
                if let Some(parent) = std::path::Path::new(path).parent() {
                    std::fs::create_dir_all(parent).map_err(|e| (-32603, format!("{path}: {e}")))?;
                }
                std::fs::write(path, content).map_err(|e| (-32603, format!("{path}: {e}")))?;
                Ok(Value::Null)
            }
            other => Err((-32601, format!("method not found: {other}"))),
        }
    }

    /// A permission by the run's policy: allowed or not, and what decided
    /// (a rule, or the client's answer to the request it asked).
    fn decide(&mut self, tool_call: &Value) -> (bool, String) {
        let Some((dir, policy)) = &self.requests else { return (false, "no policy".into()) };
        let (tool, input) = policy_subject(tool_call);
        let decision = policy.decide_tool(&tool, &input);
        match decision.effect {
            Effect::Allow => (true, decision.rule),
            Effect::Deny => (false, decision.rule),
            Effect::Ask if self.always.contains(&tool) => (true, "allowed always by the client".into()),
            Effect::Ask => {
                let request = Request {
                    request_id: String::new(),
                    kind: RequestKind::Permission,
                    tool: tool.clone(),
                    input: tool_call.get("rawInput").cloned().unwrap_or(input),
                    tool_call_id: tool_call
                        .get("toolCallId")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    rule: decision.rule.clone(),
                    deadline_ms: 0,
                };
                let answer = request_dir::ask(dir, request).unwrap_or_else(|e| {
                    request_dir::denial(
                        "",
                        shared::requests::AnsweredBy::Deadline,
                        &format!("cannot ask: {e}"),
                    )
                });
                if answer.allowed && answer.always {
                    self.always.insert(tool);
                }
                (answer.allowed, decision.rule)
            }
        }
    }

    /// The whole exchange of one run.
    fn run(&mut self, args: &AcpArgs, prompt: &str, cwd: &std::path::Path) -> Result<(), Failure> {
        let (session, mode) = (args.session.as_deref(), args.mode.as_deref());
        let servers = match &args.mcp_servers {
            Some(path) => mcp_servers(cwd, path)?,
            None => Vec::new(),
        };
        let cwd = cwd.display().to_string();
        let init = self.call(
            "initialize",
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": { "fs": { "readTextFile": true, "writeTextFile": true }, "terminal": false },
                "clientInfo": { "name": "sandhold", "version": env!("CARGO_PKG_VERSION") },
            }),
        )?;
        let can_load =
            init.pointer("/agentCapabilities/loadSession").and_then(Value::as_bool).unwrap_or(false);
        let servers = self.servers_for(&init, servers)?;
        let mut loaded = None;
        if let Some(id) = session {
            if can_load {
                self.replaying = true;
                let result =
                    self.call("session/load", json!({ "sessionId": id, "cwd": cwd, "mcpServers": servers }));
                self.replaying = false;
                match result {
                    Ok(r) => loaded = Some((id.to_owned(), r)),
                    Err(f) => {
                        let message =
                            format!("the agent could not load session {id} ({}): a new session", f.message);
                        self.emit(&json!({ "type": "warning", "message": message }))?;
                    }
                }
            } else {
                let message = format!("the agent cannot load sessions: session {id} is not continued");
                self.emit(&json!({ "type": "warning", "message": message }))?;
            }
        }
        let session_id = match loaded {
            Some((id, result)) => {
                let modes = result.get("modes").cloned().unwrap_or(Value::Null);
                self.emit(&json!({ "type": "session", "sessionId": id, "loaded": true, "modes": modes }))?;
                id
            }
            None => {
                let created = self.call("session/new", json!({ "cwd": cwd, "mcpServers": servers }))?;
                let id = created.get("sessionId").and_then(Value::as_str).unwrap_or_default().to_owned();
                let modes = created.get("modes").cloned().unwrap_or(Value::Null);
                self.emit(&json!({ "type": "session", "sessionId": id, "loaded": false, "modes": modes }))?;
                id
            }
        };
        if let Some(mode) = mode {
            self.call("session/set_mode", json!({ "sessionId": session_id, "modeId": mode }))?;
        }
        let prompt = json!({ "sessionId": session_id, "prompt": [{ "type": "text", "text": prompt }] });
        let done = self.call("session/prompt", prompt)?;
        let reason = done.get("stopReason").and_then(Value::as_str).unwrap_or("end_turn");
        self.emit(&json!({ "type": "stop", "stopReason": reason }))
    }

    /// The servers the agent takes: stdio always; HTTP and SSE only when
    /// its `initialize` result advertises them (the others are said).
    fn servers_for(&mut self, init: &Value, servers: Vec<Value>) -> Result<Vec<Value>, Failure> {
        let mut kept = Vec::with_capacity(servers.len());
        for server in servers {
            let transport = server.get("type").and_then(Value::as_str).unwrap_or("stdio").to_owned();
            let advertised = transport == "stdio"
                || init
                    .pointer(&format!("/agentCapabilities/mcpCapabilities/{transport}"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
            if advertised {
                kept.push(server);
            } else {
                let name = server.get("name").and_then(Value::as_str).unwrap_or_default();
                let message =
                    format!("MCP server {name:?} left out: the agent takes no {transport} MCP servers");
                self.emit(&json!({ "type": "warning", "message": message }))?;
            }
        }
        Ok(kept)
    }
}

/// The MCP servers in `path` (relative: the first found from `cwd` up);
/// none when there is no such file.
fn mcp_servers(cwd: &std::path::Path, path: &std::path::Path) -> Result<Vec<Value>, Failure> {
    let found = if path.is_absolute() {
        Some(path.to_path_buf()).filter(|p| p.is_file())
    } else {
        cwd.ancestors().map(|dir| dir.join(path)).find(|p| p.is_file())
    };
    let Some(file) = found else { return Ok(Vec::new()) };
    let bytes = std::fs::read(&file).map_err(|e| Failure::io(&file.display().to_string(), e))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Array(servers)) => Ok(servers),
        _ => Err(Failure {
            message: format!("{}: not a JSON array of MCP servers", file.display()),
            code: "acp_mcp_servers".into(),
        }),
    }
}

/// Give the agent (its stdin closed) [`EXIT_GRACE`] to exit, then kill
/// it; and end what it left behind. Under the journal this client leads
/// a process group of its own (which a cancel kills whole), and the agent
/// and its children are in it: they get SIGTERM (this process ignores it).
/// Run elsewhere, only the agent itself is killed.
fn stop(child: &mut Child) {
    let deadline = Instant::now() + EXIT_GRACE;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !matches!(child.try_wait(), Ok(Some(_))) {
        let _ = child.kill();
        let _ = child.wait();
    }
    // SAFETY: getpgrp, getpid, signal and killpg take and return plain integers.
    unsafe {
        if libc::getpgrp() == libc::getpid() {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            libc::killpg(0, libc::SIGTERM);
        }
    }
}

pub fn main(args: AcpArgs) -> ExitCode {
    let mut prompt = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut prompt) {
        eprintln!("sandhold-agent acp: reading the prompt: {e}");
        return ExitCode::FAILURE;
    }
    let cwd = match std::env::current_dir() {
        Ok(cwd) => cwd,
        Err(e) => {
            eprintln!("sandhold-agent acp: the working directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    drive(&args, &prompt, &cwd, std::io::stdout().lock())
}

/// What the policy judges of an ACP tool call: its kind (or, for `other`,
/// its title) as the tool, and its raw input with the first location's path
/// and, for a command, the title standing in for what the input lacks.
fn policy_subject(tool_call: &Value) -> (String, Value) {
    let kind = tool_call.get("kind").and_then(Value::as_str).unwrap_or_default();
    let title = tool_call.get("title").and_then(Value::as_str).unwrap_or_default();
    let tool = if kind.is_empty() || kind == "other" { title } else { kind };
    let mut input = match tool_call.get("rawInput") {
        Some(Value::Object(m)) => Value::Object(m.clone()),
        _ => json!({}),
    };
    let path = tool_call.pointer("/locations/0/path").and_then(Value::as_str);
    let has = |input: &Value, keys: &[&str]| keys.iter().any(|k| input.get(*k).is_some());
    if let Some(path) = path
        && !has(&input, &["path", "file_path", "filePath"])
    {
        input["path"] = json!(path);
    }
    if kind == "execute" && !has(&input, &["command", "cmd"]) && !title.is_empty() {
        input["command"] = json!(title.trim_matches('`'));
    }
    (tool.to_string(), input)
}

/// Run the agent of `args` in `cwd` for one prompt, writing the journal
/// lines to `out`.
fn drive(args: &AcpArgs, prompt: &str, cwd: &std::path::Path, out: impl Write) -> ExitCode {
    let requests = match (args.permissions, &args.requests) {
        (Permissions::Policy, None) => {
            eprintln!("sandhold-agent acp: --permissions policy needs --requests DIR");
            return ExitCode::from(2);
        }
        (Permissions::Policy, Some(path)) => {
            let dir = RequestDir::new(path);
            // No policy file: every governed action asks.
            let policy = dir.policy().unwrap_or(Policy { default: Effect::Ask, ..Policy::default() });
            Some((dir, policy))
        }
        _ => None,
    };
    let spawned = Command::new(&args.command[0])
        .args(&args.command[1..])
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandhold-agent acp: starting {}: {e}", args.command[0]);
            return ExitCode::from(127);
        }
    };
    let (Some(to_agent), Some(from_agent)) = (child.stdin.take(), child.stdout.take()) else {
        unreachable!("both were piped")
    };
    let mut client = Client {
        to_agent,
        from_agent: BufReader::new(from_agent),
        out,
        next_id: 0,
        permissions: args.permissions,
        requests,
        always: Default::default(),
        replaying: false,
    };
    let result = client.run(args, prompt, cwd);
    let failed = match result {
        Ok(()) => false,
        Err(f) => {
            let _ = client.emit(&json!({ "type": "error", "message": f.message, "code": f.code }));
            true
        }
    };
    drop(client);
    stop(&mut child);
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn fake_agent(log: &Path, mcp: &str) -> Vec<String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-acp/fake_acp_agent.py");
        ["python3", script.to_str().unwrap(), "--log", log.to_str().unwrap(), "--mcp", mcp]
            .map(str::to_owned)
            .to_vec()
    }

    /// The lines the agent was sent with `method`, and what the client
    /// journaled, for a run in `cwd`.
    fn exchange(args: &AcpArgs, cwd: &Path, log: &Path, method: &str) -> (Vec<Value>, Vec<Value>) {
        let mut out = Vec::new();
        let code = drive(args, "hi", cwd, &mut out);
        assert_eq!(code, ExitCode::SUCCESS, "{}", String::from_utf8_lossy(&out));
        let sent = std::fs::read_to_string(log).unwrap();
        let sent = sent.lines().map(|l| serde_json::from_str::<Value>(l).unwrap());
        let journal = String::from_utf8(out).unwrap();
        (
            sent.filter(|m| m["method"] == method).collect(),
            journal.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        )
    }

    #[test]
    fn the_runs_mcp_servers_reach_session_new_as_far_as_the_agent_takes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let servers = json!([
            { "type": "http", "name": "docs", "url": "https://mcp.example/docs",
              "headers": [{ "name": "Authorization", "value": "Bearer t" }] },
            { "type": "sse", "name": "events", "url": "https://mcp.example/sse", "headers": [] },
            { "name": "local", "command": "/bin/mcp", "args": ["--stdio"], "env": [] },
        ]);
        std::fs::create_dir_all(root.join(".sandhold/acp")).unwrap();
        std::fs::create_dir_all(root.join("sub/dir")).unwrap();
        std::fs::write(root.join(".sandhold/acp/mcp-servers.json"), servers.to_string()).unwrap();
        let log = root.join("agent.log");
        let args = |mcp: &str, file: PathBuf| AcpArgs {
            session: None,
            mode: None,
            permissions: Permissions::Allow,
            requests: None,
            mcp_servers: Some(file),
            command: fake_agent(&log, mcp),
        };
        // The run's working directory is below the root: the file is found
        // above it.
        let cwd = root.join("sub/dir");
        let relative = PathBuf::from(".sandhold/acp/mcp-servers.json");
        let (new, journal) = exchange(&args("http,sse", relative.clone()), &cwd, &log, "session/new");
        assert_eq!(new.len(), 1);
        assert_eq!(new[0]["params"]["cwd"], cwd.display().to_string());
        assert_eq!(new[0]["params"]["mcpServers"], servers, "every server, as written");
        let text = journal.iter().find(|l| l["type"] == "update").unwrap();
        assert_eq!(text["update"]["content"]["text"], "3 MCP servers: docs,events,local");

        // An agent that takes stdio only: the others are left out, and said.
        std::fs::remove_file(&log).unwrap();
        let (new, journal) = exchange(&args("", relative), &cwd, &log, "session/new");
        assert_eq!(new[0]["params"]["mcpServers"], json!([servers[2]]));
        let warned: Vec<_> = journal
            .iter()
            .filter(|l| l["type"] == "warning")
            .map(|l| l["message"].as_str().unwrap())
            .collect();
        assert_eq!(
            warned,
            [
                "MCP server \"docs\" left out: the agent takes no http MCP servers",
                "MCP server \"events\" left out: the agent takes no sse MCP servers"
            ]
        );

        // No file: no servers.
        std::fs::remove_file(&log).unwrap();
        let (new, _) = exchange(&args("http", root.join("none.json")), &cwd, &log, "session/new");
        assert_eq!(new[0]["params"]["mcpServers"], json!([]));
    }

    /// An ACP agent that asks permission for each of `calls` in its turn.
    const ASKING_AGENT: &str = r#"
import json, sys
calls = json.loads(sys.argv[1])
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    method = m.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"sessionId": "s1"}})
    elif method == "session/prompt":
        for i, tc in enumerate(calls):
            options = [{"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                       {"optionId": "no", "name": "Reject", "kind": "reject_once"}]
            send({"jsonrpc": "2.0", "id": 100 + i, "method": "session/request_permission",
                  "params": {"sessionId": "s1", "toolCall": tc, "options": options}})
            sys.stdin.readline()
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"stopReason": "end_turn"}})
        break
"#;

    #[test]
    fn the_policy_decides_permissions_and_asks_the_client_where_it_says_so() {
        use crate::request_dir::Setup;
        use shared::ids::RunId;
        use shared::requests::{Answer, AnsweredBy};

        let tmp = tempfile::tempdir().unwrap();
        let run = RunId::parse("run-acp").unwrap();
        let journal = tmp.path().join("run-acp.ndjson");
        std::fs::write(&journal, b"").unwrap();
        let dir = RequestDir::choose(tmp.path(), None, &run);
        let policy = Policy::from_json(
            r#"{"default":"ask","rules":[{"action":"command","pattern":"rm *","effect":"deny"},
               {"action":"command","pattern":"ls*","effect":"allow"}]}"#,
        )
        .unwrap();
        dir.create(&Setup { policy: Some(policy), tools: vec![] }, None, b"k", &run).unwrap();
        let calls = json!([
            {"toolCallId": "c1", "title": "rm -rf build", "kind": "execute", "rawInput": {"command": ["bash", "-lc", "rm -rf build"]}},
            {"toolCallId": "c2", "title": "`ls -la`", "kind": "execute"},
            {"toolCallId": "c3", "title": "Edit notes.md", "kind": "edit", "locations": [{"path": "/w/notes.md"}], "rawInput": {"diff": "x"}},
        ]);
        // The client: allows whatever is asked, once it is recorded.
        let answering = {
            let (dir, run, journal) = (dir.clone(), run.clone(), journal.clone());
            std::thread::spawn(move || {
                for _ in 0..300 {
                    let locked = dir.lock(b"k", &run, &journal).unwrap();
                    locked.sync(request_dir::now_ms()).unwrap();
                    if let Some(r) = locked.pending().pop() {
                        let yes = Answer {
                            allowed: true,
                            ..request_dir::denial(&r.request_id, AnsweredBy::Client, "")
                        };
                        locked.answer(yes).unwrap();
                        return Some(r);
                    }
                    drop(locked);
                    std::thread::sleep(Duration::from_millis(20));
                }
                None
            })
        };
        let args = AcpArgs {
            session: None,
            mode: None,
            permissions: Permissions::Policy,
            requests: Some(dir.path().to_path_buf()),
            mcp_servers: None,
            command: ["python3", "-c", ASKING_AGENT, &calls.to_string()].map(str::to_owned).to_vec(),
        };
        let mut out = Vec::new();
        assert_eq!(
            drive(&args, "hi", tmp.path(), &mut out),
            ExitCode::SUCCESS,
            "{}",
            String::from_utf8_lossy(&out)
        );
        let asked = answering.join().unwrap().expect("one request");
        assert_eq!(
            (asked.tool.as_str(), asked.tool_call_id.as_str(), asked.rule.as_str()),
            ("edit", "c3", "default")
        );
        let lines: Vec<Value> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let permissions: Vec<(&str, bool, &str)> = lines
            .iter()
            .filter(|l| l["type"] == "permission")
            .map(|l| {
                (
                    l["optionId"].as_str().unwrap(),
                    l["allowed"].as_bool().unwrap(),
                    l["rule"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            permissions,
            [
                ("no", false, "deny command:rm *"),
                ("yes", true, "allow command:ls*"),
                ("yes", true, "default")
            ]
        );
    }
}
