//! Any Agent Client Protocol agent: the sandbox agent's own ACP client
//! (`sandhold-agent acp [--session ID] [--mode M] --permissions allow|deny
//! -- CMD...`) runs under the journal and drives the agent `CMD` (the run's
//! `command`), the prompt on stdin; it journals one JSON line per ACP event
//! (see `sandbox-agent/src/acp.rs`), translated here.
//!
//! Lines translated: `session` (session id), `update`s — `agent_message_chunk`
//! (streamed text), `agent_thought_chunk` (streamed reasoning), `tool_call`
//! (a tool call: its name from the agent's `_meta` tool name, else its
//! kind; its arguments the raw input; an agent that announces a call twice,
//! the second time with its input, gives one call), `tool_call_update`
//! (the result, once completed or failed), `plan` (CUSTOM `acp.plan`) —,
//! `permission` (CUSTOM `acp.permission`: what was asked and answered),
//! `warning`, `stop` (RUN_FINISHED with the stop reason) and `error`
//! (RUN_ERROR). Other updates (available commands, modes, usage hints)
//! produce nothing.

mod adapter;

pub(super) use adapter::Acp;

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use shared::chunk;
use shared::journal::AGENT_PROGRAM;

use super::{
    CommandSpec, Emitter, HarnessError, HarnessOptions, Output, Translate, finish_reason, parse_event,
    policy, prompt_stdin, str_of,
};

/// Where the workspace's MCP servers are written for ACP agents (relative
/// to the sandbox root), in ACP's `McpServer` shape; the client passes them
/// to `session/new` and `session/load`.
pub const MCP_SERVERS_FILE: &str = ".sandhold/acp/mcp-servers.json";

pub(super) fn command(options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
    if options.command.is_empty() || options.command[0].is_empty() {
        return Err(HarnessError::InvalidOption {
            option: "command",
            reason: "the acp harness needs the ACP agent's command line".into(),
        });
    }
    let governed = !options.policy.allows_everything();
    let permissions = match (options.permission_mode.as_deref(), governed) {
        (None, true) => "policy",
        (Some(_), true) => {
            return Err(HarnessError::InvalidOption {
                option: "permission_mode",
                reason: "under a sandbox policy the policy answers ACP permission requests".into(),
            });
        }
        (m, false) => m.unwrap_or("allow"),
    };
    if !["allow", "deny", "policy"].contains(&permissions) || (permissions == "policy" && !governed) {
        return Err(HarnessError::InvalidOption {
            option: "permission_mode",
            reason: format!("ACP permission requests are answered allow or deny, not {permissions:?}"),
        });
    }
    let mut argv = vec![AGENT_PROGRAM.into(), "acp".into(), "--permissions".into(), permissions.into()];
    if policy::applies(options) {
        argv.push("--requests".into());
        argv.push(policy::REQUESTS_PLACEHOLDER.into());
    }
    argv.push("--mcp-servers".into());
    argv.push(MCP_SERVERS_FILE.into());
    if let Some(mode) = &options.sandbox_mode {
        argv.push("--mode".into());
        argv.push(mode.clone());
    }
    if let Some(session) = &options.resume_session_id {
        argv.push("--session".into());
        argv.push(session.clone());
    }
    argv.push("--".into());
    argv.extend(options.command.iter().cloned());
    argv.extend(options.extra_args.iter().cloned());
    let mut spec = CommandSpec::new(argv, options.env.clone(), prompt_stdin(options, prompt));
    spec.output = Output::Acp;
    if policy::applies(options) {
        spec.requests = Some(policy::request_setup(options));
    }
    Ok(spec)
}

/// A tool call announced and not yet out: agents may announce one before
/// they know its input.
#[derive(Debug, Clone)]
struct Pending {
    name: String,
    args: Value,
}

#[derive(Debug, Default)]
pub(super) struct AcpTranslator {
    session_seen: bool,
    text: Option<String>,
    thought: Option<String>,
    /// The agent's tool call ids in the order they were announced.
    pending_order: Vec<String>,
    pending: HashMap<String, Pending>,
    /// The agent's tool call id → the run's, for calls out.
    tools: HashMap<String, String>,
}

impl AcpTranslator {
    fn end_text(&mut self, em: &mut Emitter) {
        if let Some(id) = self.text.take() {
            em.push(em.f.text_end(&id));
        }
        if let Some(id) = self.thought.take() {
            em.push(em.f.reasoning_end(&id));
        }
    }

    /// START, ARGS and END of the announced calls, in order.
    fn flush(&mut self, em: &mut Emitter) {
        for key in std::mem::take(&mut self.pending_order) {
            if let Some(p) = self.pending.remove(&key) {
                let id = em.tool_call(&p.name, &p.args);
                self.tools.insert(key, id);
            }
        }
    }

    /// The call `key` out (flushing every call announced before it).
    fn tool_id(&mut self, em: &mut Emitter, key: &str) -> Option<String> {
        if self.pending.contains_key(key) {
            self.flush(em);
        }
        self.tools.get(key).cloned()
    }

    fn chunk(&mut self, em: &mut Emitter, update: &Value, reasoning: bool) {
        let content = update.get("content").unwrap_or(&Value::Null);
        let text = str_of(content, "text");
        if text.is_empty() {
            return;
        }
        self.flush(em);
        let (open, other) = if reasoning {
            (self.thought.take(), &mut self.text)
        } else {
            (self.text.take(), &mut self.thought)
        };
        // A switch between text and reasoning ends the other one.
        if let Some(id) = other.take() {
            let c = if reasoning { em.f.text_end(&id) } else { em.f.reasoning_end(&id) };
            em.push(c);
        }
        let id = match open {
            Some(id) => id,
            None if reasoning => em.start_reasoning(),
            None => em.start_text(),
        };
        let c = if reasoning { em.f.reasoning_content(&id, text) } else { em.f.text_content(&id, text) };
        em.push(c);
        if reasoning { self.thought = Some(id) } else { self.text = Some(id) }
    }

    fn tool_call(&mut self, em: &mut Emitter, update: &Value) {
        self.end_text(em);
        let key = str_of(update, "toolCallId").to_owned();
        let meta_name =
            update.pointer("/_meta/claudeCode/toolName").and_then(Value::as_str).unwrap_or_default();
        let name =
            [meta_name, str_of(update, "kind"), "tool"].into_iter().find(|s| !s.is_empty()).unwrap_or("tool");
        let args = match update.get("rawInput") {
            Some(Value::Object(m)) if !m.is_empty() => Value::Object(m.clone()),
            _ => json!({ "title": str_of(update, "title") }),
        };
        if !self.tools.contains_key(&key) {
            if !self.pending.contains_key(&key) {
                self.pending_order.push(key.clone());
            }
            self.pending.insert(key.clone(), Pending { name: name.to_owned(), args });
        }
        self.tool_update(em, update);
    }

    fn tool_update(&mut self, em: &mut Emitter, update: &Value) {
        let status = str_of(update, "status");
        if status != "completed" && status != "failed" {
            return;
        }
        let key = str_of(update, "toolCallId");
        let Some(id) = self.tool_id(em, key) else { return };
        self.tools.remove(key);
        let mut texts = Vec::new();
        for block in update.get("content").and_then(Value::as_array).into_iter().flatten() {
            match str_of(block, "type") {
                "content" => texts.push(block.get("content").map_or("", |c| str_of(c, "text")).to_owned()),
                "diff" => texts.push(format!("diff {}", str_of(block, "path"))),
                _ => {}
            }
        }
        let raw = update.get("rawOutput").unwrap_or(&Value::Null);
        if texts.iter().all(String::is_empty) {
            texts = vec![match raw {
                Value::String(s) => s.clone(),
                Value::Object(_) => ["formatted_output", "aggregated_output", "output"]
                    .into_iter()
                    .map(|k| str_of(raw, k))
                    .find(|s| !s.is_empty())
                    .unwrap_or_default()
                    .to_owned(),
                _ => String::new(),
            }];
        }
        let exit = raw.get("exit_code").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok());
        let failed = status == "failed" || exit.is_some_and(|c| c != 0);
        em.push(em.f.tool_call_result(&id, texts.join("\n").trim_end(), failed, exit));
    }

    fn update(&mut self, em: &mut Emitter, update: &Value) {
        match str_of(update, "sessionUpdate") {
            "agent_message_chunk" => self.chunk(em, update, false),
            "agent_thought_chunk" => self.chunk(em, update, true),
            "tool_call" => self.tool_call(em, update),
            "tool_call_update" => {
                // An update may bring the input of a call still pending.
                let key = str_of(update, "toolCallId");
                if let (Some(p), Some(Value::Object(input))) =
                    (self.pending.get_mut(key), update.get("rawInput"))
                    && !input.is_empty()
                {
                    p.args = Value::Object(input.clone());
                }
                self.tool_update(em, update);
            }
            "plan" => {
                self.end_text(em);
                self.flush(em);
                let entries = update.get("entries").cloned().unwrap_or(Value::Array(Vec::new()));
                em.push(em.f.custom(chunk::ACP_PLAN, &json!({ "entries": entries })));
            }
            _ => {}
        }
    }
}

impl Translate for AcpTranslator {
    fn line(&mut self, em: &mut Emitter, line: &[u8]) {
        let Some(event) = parse_event(em, line) else { return };
        match str_of(&event, "type") {
            "session" => {
                em.first_session_id(&mut self.session_seen, str_of(&event, "sessionId"));
            }
            "update" => self.update(em, event.get("update").unwrap_or(&Value::Null)),
            "permission" => {
                self.end_text(em);
                // The call asked about comes first.
                self.flush(em);
                let mut value = Map::new();
                for key in ["toolCall", "optionId", "allowed"] {
                    if let Some(v) = event.get(key) {
                        value.insert(key.into(), v.clone());
                    }
                }
                em.push(em.f.custom(chunk::ACP_PERMISSION, &Value::Object(value)));
            }
            "warning" => em.warning(str_of(&event, "message"), None),
            "stop" => {
                self.end_text(em);
                self.flush(em);
                em.push(em.f.run_finished(&finish_reason(str_of(&event, "stopReason")), None));
            }
            "error" => {
                let code = match str_of(&event, "code") {
                    "" => "acp_error",
                    c => c,
                };
                em.push(em.f.run_error(str_of(&event, "message"), code));
            }
            _ => {}
        }
    }

    fn finish(&mut self, em: &mut Emitter, exit_code: i32, stderr_tail: &str) {
        self.end_text(em);
        self.flush(em);
        em.finish_from_exit(exit_code, stderr_tail, None, "stop", None);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::MCP_SERVERS_FILE;

    #[test]
    fn a_policy_answers_permission_requests() {
        let mut options = HarnessOptions {
            command: vec!["codex-acp".into()],
            policy: policy(Effect::Ask, vec![]),
            ..Default::default()
        };
        let spec = Harness::Acp.command(&options, "hi").unwrap();
        assert_eq!(
            spec.argv,
            [
                "sandhold-agent",
                "acp",
                "--permissions",
                "policy",
                "--requests",
                "{{sandhold-requests}}",
                "--mcp-servers",
                MCP_SERVERS_FILE,
                "--",
                "codex-acp"
            ]
        );
        assert_eq!((spec.output, spec.requests.is_some()), (Output::Acp, true));
        options.permission_mode = Some("allow".into());
        assert!(matches!(Harness::Acp.command(&options, "x"), Err(HarnessError::InvalidOption { .. })));

        // Client tools alone: the request dir for the bridge's MCP server.
        let tools = HarnessOptions {
            command: vec!["a".into()],
            client_tools: vec![client_tool("t")],
            ..Default::default()
        };
        let spec = Harness::Acp.command(&tools, "x").unwrap();
        assert_eq!(spec.argv[2..6], ["--permissions", "allow", "--requests", "{{sandhold-requests}}"]);
        let policy_mode = HarnessOptions {
            command: vec!["a".into()],
            permission_mode: Some("policy".into()),
            ..Default::default()
        };
        assert!(Harness::Acp.command(&policy_mode, "x").is_err(), "no policy to answer by");
    }

    #[test]
    fn command_line_runs_the_agents_own_acp_client() {
        let options = HarnessOptions {
            command: vec!["codex-acp".into()],
            sandbox_mode: Some("full-access".into()),
            resume_session_id: Some("s1".into()),
            ..Default::default()
        };
        let spec = Harness::Acp.command(&options, "hi").unwrap();
        assert_eq!(
            spec.argv,
            [
                "sandhold-agent",
                "acp",
                "--permissions",
                "allow",
                "--mcp-servers",
                MCP_SERVERS_FILE,
                "--mode",
                "full-access",
                "--session",
                "s1",
                "--",
                "codex-acp"
            ]
        );
        assert_eq!(spec.stdin, StdinSpec::Bytes(b"hi".to_vec()));
        assert!(
            Harness::Acp.command(&HarnessOptions::default(), "hi").is_err(),
            "the agent's command is required"
        );
        let bad = HarnessOptions {
            command: vec!["a".into()],
            permission_mode: Some("ask".into()),
            ..Default::default()
        };
        assert!(matches!(Harness::Acp.command(&bad, "x"), Err(HarnessError::InvalidOption { .. })));
    }

    #[test]
    fn a_call_announced_twice_is_one_call_and_thoughts_stream() {
        let journal = r#"{"type":"session","sessionId":"s","loaded":false}
{"type":"update","update":{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"hmm"}}}
{"type":"update","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Let me"}}}
{"type":"update","update":{"sessionUpdate":"tool_call","toolCallId":"t","kind":"execute","title":"Terminal","rawInput":{},"status":"pending"}}
{"type":"update","update":{"sessionUpdate":"tool_call","toolCallId":"t","kind":"execute","title":"ls","rawInput":{"command":"ls"},"status":"pending"}}
{"type":"permission","toolCall":{"toolCallId":"t"},"optionId":"reject","allowed":false}
{"type":"update","update":{"sessionUpdate":"tool_call_update","toolCallId":"t","status":"failed","content":[{"type":"content","content":{"type":"text","text":"denied"}}]}}
{"type":"update","update":{"sessionUpdate":"plan","entries":[{"content":"x","status":"pending"}]}}
{"type":"stop","stopReason":"max_tokens"}"#;
        let chunks = translate(Harness::Acp, journal, 0, "");
        assert_eq!(
            types(&chunks),
            [
                "RUN_STARTED",
                "CUSTOM",
                "REASONING_START",
                "REASONING_CONTENT",
                "REASONING_END",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "CUSTOM",
                "TOOL_CALL_RESULT",
                "CUSTOM",
                "RUN_FINISHED"
            ]
        );
        assert_eq!(chunks[1].name, "acp.session-id");
        assert_eq!(
            (chunks[8].tool_name.as_str(), chunks[9].delta.as_str()),
            ("execute", r#"{"command":"ls"}"#)
        );
        assert_eq!(chunks[11].name, "acp.permission");
        assert_eq!((chunks[12].content.as_str(), chunks[12].is_error), ("denied", true));
        assert_eq!(chunks[13].name, "acp.plan");
        assert_eq!(chunks[14].finish_reason, "length");
    }

    #[test]
    fn a_failed_call_is_a_run_error() {
        let journal = r#"{"type":"session","sessionId":"s","loaded":false}
{"type":"error","message":"session/prompt: rate limited","code":"acp_-32000"}"#;
        let chunks = translate(Harness::Acp, journal, 1, "");
        assert_eq!(types(&chunks), ["RUN_STARTED", "CUSTOM", "RUN_ERROR"]);
        assert_eq!(
            (chunks[2].error_message.as_str(), chunks[2].error_code.as_str()),
            ("session/prompt: rate limited", "acp_-32000")
        );
    }
}
