//! Claude Code: `claude -p --output-format stream-json --verbose`, the prompt
//! on stdin.
//!
//! Events translated: `system`/`init` (session id), `assistant` content
//! blocks (text, thinking, tool_use), `user` tool results, `stream_event`
//! partial deltas (with `--include-partial-messages`; the complete
//! `assistant` event of a streamed message is then skipped, since its blocks
//! were already delivered as deltas) and `result` (usage, cost; `success` →
//! RUN_FINISHED, `error_max_turns` → RUN_FINISHED with reason `length`, other
//! error subtypes → RUN_ERROR with the subtype as code).

mod adapter;
mod session;

pub(super) use adapter::ClaudeCode;

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value, json};
use shared::chunk::Usage;
use shared::policy::{Action, Effect};

use super::{
    CommandSpec, Emitter, HarnessError, HarnessOptions, Translate, finish_reason, parse_object, policy,
    program, prompt_stdin, result_text, str_of, u64_of,
};

/// Claude Code's tools for each kind of action the policy governs.
fn tools_of(action: Action) -> &'static [&'static str] {
    match action {
        Action::Command => &["Bash"],
        Action::FileWrite => &["Edit", "Write", "MultiEdit", "NotebookEdit"],
        Action::Network | Action::Request => &["WebFetch"],
    }
}

/// Permission modes that leave the permission checks on (the others
/// approve by themselves what the policy may ask about or deny).
const CHECKED_MODES: [&str; 2] = ["default", "plan"];

/// The `--settings` of a run under a policy: each governed tool allowed or
/// denied when the policy decides its kind the same way for every subject,
/// else `ask`, so that Claude Code calls the permission tool, which decides
/// by the rules (Claude Code's own rule syntax is never used for patterns:
/// it matches each part of a compound command separately and auto-approves
/// read-only commands such as `ls` unless the tool is asked for). Client
/// tools are allowed; the permission tool itself may not be called by the
/// model.
fn policy_settings(options: &HarnessOptions) -> Value {
    let (mut allow, mut ask, mut deny) = (Vec::new(), Vec::new(), Vec::new());
    // Client tools only: everything stays bypassed.
    let governed = !options.policy.allows_everything();
    for action in policy::ACTIONS.into_iter().filter(|_| governed) {
        let list = match policy::native(&options.policy, action) {
            Effect::Allow => &mut allow,
            Effect::Ask => &mut ask,
            Effect::Deny => &mut deny,
        };
        list.extend(tools_of(action).iter().map(|t| Value::from(*t)));
    }
    allow.extend(client_tool_names(options).map(Value::from));
    deny.push(policy::CLAUDE_PERMISSION_TOOL.into());
    let mut permissions = Map::new();
    for (key, list) in [("allow", allow), ("ask", ask), ("deny", deny)] {
        if !list.is_empty() {
            permissions.insert(key.into(), Value::Array(list));
        }
    }
    json!({ "permissions": permissions })
}

fn client_tool_names(options: &HarnessOptions) -> impl Iterator<Item = String> + '_ {
    options.client_tools.iter().map(|t| format!("mcp__{}__{}", policy::MCP_SERVER, t.name))
}

pub(super) fn command(options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
    let requests = policy::applies(options);
    let governed = !options.policy.allows_everything();
    let mode = match (&options.permission_mode, governed) {
        (Some(m), true) if !CHECKED_MODES.contains(&m.as_str()) => {
            return Err(HarnessError::InvalidOption {
                option: "permission_mode",
                reason: format!(
                    "{m:?} approves actions by itself; under a sandbox policy the mode is default or plan"
                ),
            });
        }
        (Some(m), _) => m.clone(),
        (None, true) => "default".into(),
        (None, false) => "bypassPermissions".into(),
    };
    let mut argv = vec![
        program(options, "claude"),
        "-p".into(),
        "--output-format".into(),
        "stream-json".into(),
        "--verbose".into(),
        "--permission-mode".into(),
        mode,
    ];
    let mut flag = |name: &str, value: &str| {
        argv.push(name.into());
        argv.push(value.into());
    };
    if let Some(m) = &options.model {
        flag("--model", m);
    }
    if let Some(s) = &options.resume_session_id {
        flag("--resume", s);
    }
    if let Some(n) = options.max_turns {
        flag("--max-turns", &n.to_string());
    }
    if !options.allowed_tools.is_empty() {
        flag("--allowedTools", &options.allowed_tools.join(","));
    }
    if !options.disallowed_tools.is_empty() {
        flag("--disallowedTools", &options.disallowed_tools.join(","));
    }
    if let Some(s) = &options.system_prompt {
        flag("--append-system-prompt", s);
    }
    if let Some(p) = &options.mcp_config_path {
        flag("--mcp-config", p);
    }
    if requests {
        // A second `--mcp-config`: Claude Code loads them all.
        flag("--mcp-config", &policy::claude_mcp_config());
        flag("--settings", &policy_settings(options).to_string());
    }
    if governed {
        flag("--permission-prompt-tool", policy::CLAUDE_PERMISSION_TOOL);
    }
    if options.include_partial_messages {
        argv.push("--include-partial-messages".into());
    }
    argv.extend(options.extra_args.iter().cloned());

    let mut env = options.env.clone();
    if requests {
        // The permission tool and client tools wait for the client's answer,
        // up to the policy's deadline.
        env.entry("MCP_TOOL_TIMEOUT".into())
            .or_insert_with(|| policy::tool_timeout_ms(&options.policy).to_string());
    }
    // Claude Code refuses bypassPermissions as root unless told it is in a
    // sandbox, which it is.
    env.entry("IS_SANDBOX".into()).or_insert_with(|| "1".into());
    env.entry("DISABLE_TELEMETRY".into()).or_insert_with(|| "1".into());
    env.entry("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into()).or_insert_with(|| "1".into());
    let mut spec = CommandSpec::new(argv, env, prompt_stdin(options, prompt));
    if requests {
        spec.requests = Some(policy::request_setup(options));
    }
    Ok(spec)
}

/// What a streamed content block (by index) became.
#[derive(Debug)]
enum Block {
    Text(String),
    Reasoning(String),
    Tool(String),
}

#[derive(Debug, Default)]
pub(super) struct ClaudeCodeTranslator {
    /// Claude's `tool_use` id → our tool call id.
    tool_ids: HashMap<String, String>,
    /// API message ids delivered through `stream_event`s.
    streamed: HashSet<String>,
    blocks: HashMap<u64, Block>,
}

impl ClaudeCodeTranslator {
    fn assistant(&mut self, em: &mut Emitter, event: &Map<String, Value>) {
        let Some(message) = event.get("message") else { return };
        if self.streamed.contains(str_of(message, "id")) {
            return;
        }
        let Some(content) = message.get("content").and_then(Value::as_array) else { return };
        for block in content {
            match str_of(block, "type") {
                "text" => em.text_message(str_of(block, "text")),
                "thinking" => em.reasoning_message(str_of(block, "thinking")),
                "tool_use" => {
                    let input = block.get("input").cloned().unwrap_or_else(|| Value::Object(Map::new()));
                    let id = em.tool_call(str_of(block, "name"), &input);
                    self.tool_ids.insert(str_of(block, "id").to_owned(), id);
                }
                _ => {}
            }
        }
    }

    fn user(&mut self, em: &mut Emitter, event: &Map<String, Value>) {
        let Some(content) = event.get("message").and_then(|m| m.get("content")).and_then(Value::as_array)
        else {
            return;
        };
        for block in content.iter().filter(|b| str_of(b, "type") == "tool_result") {
            let id = match self.tool_ids.get(str_of(block, "tool_use_id")) {
                Some(id) => id.clone(),
                // A result of a call we never saw (a truncated or resumed
                // journal): still deliver it, under an id of its own.
                None => em.new_id(),
            };
            let content = result_text(block.get("content").unwrap_or(&Value::Null));
            let is_error = block.get("is_error").and_then(Value::as_bool).unwrap_or(false);
            em.push(em.f.tool_call_result(&id, &content, is_error, None));
        }
    }

    fn stream_event(&mut self, em: &mut Emitter, event: &Value) {
        let index = u64_of(event, "index");
        match str_of(event, "type") {
            "message_start" => {
                let id = event.get("message").map_or("", |m| str_of(m, "id"));
                self.streamed.insert(id.to_owned());
            }
            "content_block_start" => {
                let Some(block) = event.get("content_block") else { return };
                let started = match str_of(block, "type") {
                    "text" => {
                        let id = em.start_text();
                        let text = str_of(block, "text");
                        if !text.is_empty() {
                            em.push(em.f.text_content(&id, text));
                        }
                        Block::Text(id)
                    }
                    "thinking" => Block::Reasoning(em.start_reasoning()),
                    "tool_use" => {
                        let id = em.start_tool(str_of(block, "name"));
                        self.tool_ids.insert(str_of(block, "id").to_owned(), id.clone());
                        Block::Tool(id)
                    }
                    _ => return,
                };
                self.blocks.insert(index, started);
            }
            "content_block_delta" => {
                let Some(delta) = event.get("delta") else { return };
                let c = match (self.blocks.get(&index), str_of(delta, "type")) {
                    (Some(Block::Text(id)), "text_delta") => em.f.text_content(id, str_of(delta, "text")),
                    (Some(Block::Reasoning(id)), "thinking_delta") => {
                        em.f.reasoning_content(id, str_of(delta, "thinking"))
                    }
                    (Some(Block::Tool(id)), "input_json_delta") => {
                        em.f.tool_call_args(id, str_of(delta, "partial_json"))
                    }
                    _ => return,
                };
                if !c.delta.is_empty() {
                    em.push(c);
                }
            }
            "content_block_stop" => {
                let c = match self.blocks.remove(&index) {
                    Some(Block::Text(id)) => em.f.text_end(&id),
                    Some(Block::Reasoning(id)) => em.f.reasoning_end(&id),
                    Some(Block::Tool(id)) => em.f.tool_call_end(&id),
                    None => return,
                };
                em.push(c);
            }
            _ => {}
        }
    }

    fn result(&mut self, em: &mut Emitter, event: &Map<String, Value>) {
        let event = Value::Object(event.clone());
        let usage = event.get("usage").map(|u| Usage {
            input_tokens: u64_of(u, "input_tokens"),
            output_tokens: u64_of(u, "output_tokens"),
            cache_read_tokens: u64_of(u, "cache_read_input_tokens"),
            cache_write_tokens: u64_of(u, "cache_creation_input_tokens"),
            reasoning_tokens: 0,
            cost_usd: event.get("total_cost_usd").and_then(Value::as_f64),
        });
        let subtype = str_of(&event, "subtype");
        let is_error = event.get("is_error").and_then(Value::as_bool).unwrap_or(false);
        match subtype {
            "success" if !is_error => {
                em.push(em.f.run_finished(&finish_reason(str_of(&event, "stop_reason")), usage));
            }
            "error_max_turns" => em.push(em.f.run_finished("length", usage)),
            _ => {
                let errors: Vec<&str> = event
                    .get("errors")
                    .and_then(Value::as_array)
                    .map_or_else(Vec::new, |a| a.iter().filter_map(Value::as_str).collect());
                let message = if !errors.is_empty() {
                    errors.join("; ")
                } else if !str_of(&event, "result").is_empty() {
                    str_of(&event, "result").to_owned()
                } else {
                    format!("claude-code result {subtype}")
                };
                let code = if subtype.is_empty() || subtype == "success" { "error" } else { subtype };
                let mut c = em.f.run_error(&message, code);
                c.usage = usage;
                em.push(c);
            }
        }
    }
}

impl Translate for ClaudeCodeTranslator {
    fn tool_call_id(&self, cli_id: &str) -> Option<String> {
        self.tool_ids.get(cli_id).cloned()
    }

    fn line(&mut self, em: &mut Emitter, line: &[u8]) {
        let event = match parse_object(line) {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(why) => return em.warning(why, Some(line)),
        };
        match event.get("type").and_then(Value::as_str).unwrap_or_default() {
            "system" => {
                let session = event.get("session_id").and_then(Value::as_str).unwrap_or_default();
                if event.get("subtype").and_then(Value::as_str) == Some("init") && !session.is_empty() {
                    em.session_id(session);
                }
            }
            "assistant" => self.assistant(em, &event),
            "user" => self.user(em, &event),
            "stream_event" => {
                if let Some(e) = event.get("event") {
                    self.stream_event(em, e);
                }
            }
            "result" => self.result(em, &event),
            _ => {}
        }
    }

    fn finish(&mut self, em: &mut Emitter, exit_code: i32, stderr_tail: &str) {
        em.finish_from_exit(exit_code, stderr_tail, None, "stop", None);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shared::policy::{Action, Effect};

    use super::super::testing::*;
    use super::super::*;

    #[test]
    fn command_line_has_every_option() {
        let options = HarnessOptions {
            model: Some("sonnet".into()),
            resume_session_id: Some("s1".into()),
            permission_mode: Some("acceptEdits".into()),
            max_turns: Some(3),
            allowed_tools: vec!["Bash".into(), "Read".into()],
            disallowed_tools: vec!["WebFetch".into()],
            system_prompt: Some("be brief".into()),
            mcp_config_path: Some(".mcp.json".into()),
            include_partial_messages: true,
            ..Default::default()
        };
        let spec = Harness::ClaudeCode.command(&options, "do it").unwrap();
        assert_eq!(
            spec.argv,
            [
                "claude",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--permission-mode",
                "acceptEdits",
                "--model",
                "sonnet",
                "--resume",
                "s1",
                "--max-turns",
                "3",
                "--allowedTools",
                "Bash,Read",
                "--disallowedTools",
                "WebFetch",
                "--append-system-prompt",
                "be brief",
                "--mcp-config",
                ".mcp.json",
                "--include-partial-messages"
            ]
        );
        assert_eq!(spec.stdin, StdinSpec::Bytes(b"do it".to_vec()));
        assert_eq!(spec.env.get("IS_SANDBOX").map(String::as_str), Some("1"));
        let bare = Harness::ClaudeCode.command(&HarnessOptions::default(), "x").unwrap();
        assert_eq!(bare.argv[5..], ["--permission-mode", "bypassPermissions"]);
    }

    fn rule(action: Action, pattern: &str, effect: Effect) -> shared::policy::Rule {
        shared::policy::Rule { action, pattern: pattern.into(), effect }
    }

    fn settings_of(spec: &CommandSpec) -> serde_json::Value {
        let at = spec.argv.iter().position(|a| a == "--settings").expect("--settings");
        serde_json::from_str(&spec.argv[at + 1]).unwrap()
    }

    #[test]
    fn a_policy_routes_what_it_governs_through_the_permission_tool() {
        let mut options = HarnessOptions {
            mcp_config_path: Some(".mcp.json".into()),
            policy: shared::policy::Policy {
                default: Effect::Allow,
                rules: vec![
                    rule(Action::Command, "git push*", Effect::Deny),
                    rule(Action::FileWrite, "secrets/**", Effect::Ask),
                ],
                request_timeout_ms: Some(1000),
                bounds: Vec::new(),
            },
            client_tools: vec![shared::proto::agent::v1::ClientTool {
                name: "lookup".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let spec = Harness::ClaudeCode.command(&options, "p").unwrap();
        assert_eq!(
            spec.argv,
            [
                "claude",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--permission-mode",
                "default",
                "--mcp-config",
                ".mcp.json",
                "--mcp-config",
                r#"{"mcpServers":{"sandhold":{"args":["mcp","--requests","{{sandhold-requests}}"],"command":"{{sandhold-agent}}"}}}"#,
                "--settings",
                r#"{"permissions":{"allow":["WebFetch","mcp__sandhold__lookup"],"ask":["Bash","Edit","Write","MultiEdit","NotebookEdit"],"deny":["mcp__sandhold__permission"]}}"#,
                "--permission-prompt-tool",
                "mcp__sandhold__permission",
            ]
        );
        assert_eq!(spec.env["IS_SANDBOX"], "1");
        assert_eq!(spec.env["MCP_TOOL_TIMEOUT"], "61000");
        assert!(spec.warnings.is_empty(), "{:?}", spec.warnings);
        let setup = spec.requests.expect("requests");
        assert_eq!(shared::policy::Policy::from_json(&setup.policy_json).unwrap(), options.policy);
        assert_eq!(setup.tools.len(), 1);
        assert_eq!(spec.output, Output::Native);

        // Kinds the policy decides whole are allowed or denied natively.
        options.policy = shared::policy::Policy { default: Effect::Deny, ..Default::default() };
        options.policy.rules.push(rule(Action::Network, "*.example.com", Effect::Allow));
        options.client_tools.clear();
        assert_eq!(
            settings_of(&Harness::ClaudeCode.command(&options, "p").unwrap()),
            json!({"permissions": {
                "ask": ["WebFetch"],
                "deny": ["Bash", "Edit", "Write", "MultiEdit", "NotebookEdit", "mcp__sandhold__permission"]
            }})
        );

        // A mode that approves by itself would bypass the policy.
        options.permission_mode = Some("acceptEdits".into());
        assert!(matches!(
            Harness::ClaudeCode.command(&options, "p"),
            Err(HarnessError::InvalidOption { option: "permission_mode", .. })
        ));
        options.permission_mode = Some("plan".into());
        let spec = Harness::ClaudeCode.command(&options, "p").unwrap();
        assert_eq!(spec.argv[5..7], ["--permission-mode", "plan"]);
    }

    #[test]
    fn client_tools_alone_keep_permissions_bypassed() {
        let options = HarnessOptions {
            client_tools: vec![shared::proto::agent::v1::ClientTool {
                name: "lookup".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let spec = Harness::ClaudeCode.command(&options, "p").unwrap();
        assert_eq!(spec.argv[5..7], ["--permission-mode", "bypassPermissions"]);
        assert_eq!(spec.argv[7], "--mcp-config");
        assert_eq!(
            settings_of(&spec),
            json!({"permissions": {"allow": ["mcp__sandhold__lookup"], "deny": ["mcp__sandhold__permission"]}})
        );
        assert!(!spec.argv.contains(&"--permission-prompt-tool".to_string()));
        assert!(spec.requests.is_some());
        let bare = Harness::ClaudeCode.command(&HarnessOptions::default(), "p").unwrap();
        assert_eq!((bare.requests, bare.argv.len()), (None, 7));
    }

    #[test]
    fn partial_messages_stream_deltas_and_skip_the_complete_message() {
        let journal = r#"{"type":"system","subtype":"init","session_id":"s"}
{"type":"stream_event","event":{"type":"message_start","message":{"id":"m1"}}}
{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}}
{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}}
{"type":"stream_event","event":{"type":"content_block_stop","index":0}}
{"type":"stream_event","event":{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}}
{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hel"}}}
{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"lo"}}}
{"type":"stream_event","event":{"type":"content_block_stop","index":1}}
{"type":"stream_event","event":{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"tu","name":"Bash","input":{}}}}
{"type":"stream_event","event":{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"command\":"}}}
{"type":"stream_event","event":{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"ls\"}"}}}
{"type":"stream_event","event":{"type":"content_block_stop","index":2}}
{"type":"assistant","message":{"id":"m1","content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Hello"},{"type":"tool_use","id":"tu","name":"Bash","input":{"command":"ls"}}]}}
{"type":"stream_event","event":{"type":"message_stop"}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"tu","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"is_error":true}]}}
{"type":"result","subtype":"success","is_error":false,"stop_reason":"end_turn","total_cost_usd":0.5,"usage":{"input_tokens":1,"output_tokens":2,"cache_read_input_tokens":3,"cache_creation_input_tokens":4}}"#;
        let chunks = translate(Harness::ClaudeCode, journal, 0, "");
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
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "TOOL_CALL_RESULT",
                "RUN_FINISHED"
            ]
        );
        assert_eq!(chunks[1].name, "claude-code.session-id");
        assert_eq!((chunks[2].message_id.as_str(), chunks[5].message_id.as_str()), ("r-0", "r-1"));
        assert_eq!(
            (
                chunks[9].tool_call_id.as_str(),
                chunks[9].tool_name.as_str(),
                chunks[9].parent_message_id.as_str()
            ),
            ("r-2", "Bash", "r-1")
        );
        let args: String = chunks[10..12].iter().map(|c| c.delta.as_str()).collect();
        assert_eq!(args, r#"{"command":"ls"}"#);
        assert_eq!(
            (chunks[13].tool_call_id.as_str(), chunks[13].content.as_str(), chunks[13].is_error),
            ("r-2", "a\nb", true)
        );
        let u = chunks[14].usage.unwrap();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens, u.cost_usd),
            (1, 2, 3, 4, Some(0.5))
        );
    }

    #[test]
    fn max_turns_finishes_with_length() {
        let journal = r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,"total_cost_usd":0.1,"usage":{"input_tokens":5,"output_tokens":6}}"#;
        let chunks = translate(Harness::ClaudeCode, journal, 1, "");
        assert_eq!(types(&chunks), ["RUN_STARTED", "RUN_FINISHED"]);
        assert_eq!(chunks[1].finish_reason, "length");
        assert_eq!(chunks[1].usage.as_ref().map(|u| u.output_tokens), Some(6));
    }

    #[test]
    fn execution_errors_are_run_errors() {
        let journal = r#"{"type":"assistant","message":{"id":"m","content":[{"type":"text","text":"partial"}]}}
{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["tool crashed","then more"]}
{"type":"assistant","message":{"id":"m2","content":[{"type":"text","text":"after the end"}]}}"#;
        let chunks = translate(Harness::ClaudeCode, journal, 1, "stderr noise");
        assert_eq!(
            types(&chunks),
            ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_ERROR"]
        );
        assert_eq!(
            (chunks[4].error_message.as_str(), chunks[4].error_code.as_str()),
            ("tool crashed; then more", "error_during_execution")
        );

        let api = r#"{"type":"result","subtype":"success","is_error":true,"result":"API Error: 500"}"#;
        let chunks = translate(Harness::ClaudeCode, api, 1, "");
        assert_eq!(
            (chunks[1].error_message.as_str(), chunks[1].error_code.as_str()),
            ("API Error: 500", "error")
        );
    }

    #[test]
    fn malformed_and_unknown_lines() {
        let journal = "not json\n[1,2]\n\n{\"type\":\"brand_new\",\"x\":1}\n{\"type\":\"system\",\"subtype\":\"compact\"}\n{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}}";
        let chunks = translate(Harness::ClaudeCode, journal, 0, "");
        assert_eq!(
            types(&chunks),
            [
                "RUN_STARTED",
                "CUSTOM",
                "CUSTOM",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "RUN_FINISHED"
            ]
        );
        let w: serde_json::Value = serde_json::from_str(&chunks[1].value_json).unwrap();
        assert_eq!(w, serde_json::json!({"message": "journal line is not JSON", "line": "not json"}));
        assert_eq!(chunks[2].name, "harness.warning");
    }
}
