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
//!   first allow option; deny: the first reject option);
//! - `{"type":"warning","message":…}` (a session the agent cannot or could
//!   not load: a new session is started instead; a stray non-protocol line);
//! - `{"type":"stop","stopReason":…}` at the end of the turn, or
//!   `{"type":"error","message":…,"code":…}` when a call failed (exit 1).
//!
//! It advertises the file system capability and serves
//! `fs/read_text_file` and `fs/write_text_file` itself (it runs as the run
//! user, in the run's working directory); terminals are not offered.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

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
                let wanted: &[&str] = match self.permissions {
                    Permissions::Allow => &["allow_once", "allow_always"],
                    Permissions::Deny => &["reject_once", "reject_always"],
                };
                let chosen = wanted.iter().find_map(|kind| {
                    options.iter().find(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
                });
                let tool_call = params.get("toolCall").cloned().unwrap_or(Value::Null);
                let Some(option_id) = chosen.and_then(|o| o.get("optionId")).cloned() else {
                    let _ =
                        self.emit(&json!({ "type": "permission", "toolCall": tool_call, "allowed": false }));
                    return Ok(json!({ "outcome": { "outcome": "cancelled" } }));
                };
                let allowed = self.permissions == Permissions::Allow;
                let line = json!({ "type": "permission", "toolCall": tool_call, "optionId": option_id, "allowed": allowed });
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

    /// The whole exchange of one run.
    fn run(&mut self, session: Option<&str>, mode: Option<&str>, prompt: &str) -> Result<(), Failure> {
        let cwd = std::env::current_dir().map_err(|e| Failure::io("the working directory", e))?;
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
        let mut loaded = None;
        if let Some(id) = session {
            if can_load {
                self.replaying = true;
                let result =
                    self.call("session/load", json!({ "sessionId": id, "cwd": cwd, "mcpServers": [] }));
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
                let created = self.call("session/new", json!({ "cwd": cwd, "mcpServers": [] }))?;
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
    let spawned = Command::new(&args.command[0])
        .args(&args.command[1..])
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
        out: std::io::stdout().lock(),
        next_id: 0,
        permissions: args.permissions,
        replaying: false,
    };
    let result = client.run(args.session.as_deref(), args.mode.as_deref(), &prompt);
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
