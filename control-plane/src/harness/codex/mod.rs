//! Codex: `codex exec --json`, the prompt on stdin (`-`).
//!
//! Events translated: `thread.started` (session id), `turn.completed` (usage;
//! RUN_FINISHED), `turn.failed` (RUN_ERROR), top-level `error` (a warning,
//! kept for a later RUN_ERROR), and `item.started/updated/completed` of
//! agent messages and reasoning (text deltas by prefix), command executions
//! (tool call `command_execution` with its output and exit code), file
//! changes (`file_change`), MCP tool calls (`mcp__<server>__<tool>`), web
//! searches, todo lists (CUSTOM `codex.todo_list`) and error items
//! (warnings).

mod adapter;
mod session;

pub(super) use adapter::Codex;

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use shared::chunk::{self, Usage};
use shared::policy::{Action, Effect};

use super::model_api::toml_string;
use super::{
    CommandSpec, Emitter, HarnessError, HarnessOptions, Output, Translate, add_usage, parse_event, policy,
    program, prompt_stdin, result_text, str_of, u64_of,
};

/// The warning of a Codex run whose command rules ask or deny: Codex's
/// approval policy exempts what it knows to be read-only.
pub const READ_ONLY_WARNING: &str = "Codex runs commands it knows to be read-only (ls, cat, grep, git status, ...) \
     without asking, so the policy's command rules that ask or deny do not apply to them";
/// The warning of a Codex run with network rules.
pub const NETWORK_WARNING: &str = "Codex has no fetch tool: network rules apply to none of its actions \
     (commands that reach the network are governed as commands)";

pub(super) fn command(options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
    for (key, _) in &options.config_overrides {
        if key.is_empty() || key.contains('=') {
            return Err(HarnessError::InvalidOption {
                option: "config_overrides",
                reason: format!("bad key {key:?}"),
            });
        }
    }
    let policy = &options.policy;
    let mut warnings = Vec::new();
    if policy.rules.iter().any(|r| r.action == Action::Network && r.effect != Effect::Allow) {
        warnings.push(NETWORK_WARNING.to_owned());
    }
    // `codex exec` cannot ask, and denies nothing by itself (its own
    // sandbox does not work in most containers): unless commands and file
    // writes are all allowed, Codex runs as an ACP agent (`codex-acp`)
    // under the agent's bridge, which answers its approval requests by the
    // policy.
    let bridged = [Action::Command, Action::FileWrite]
        .into_iter()
        .any(|a| policy::uniform(policy, a) != Some(Effect::Allow));
    let mut spec = if bridged {
        if policy::uniform(policy, Action::Command) != Some(Effect::Allow) {
            warnings.push(READ_ONLY_WARNING.to_owned());
        }
        acp_command(options, prompt)
    } else {
        exec_command(options, prompt)
    };
    if policy::applies(options) {
        spec.requests = Some(policy::request_setup(options));
    }
    spec.warnings = warnings;
    Ok(spec)
}

/// `codex exec --json ... -`.
fn exec_command(options: &HarnessOptions, prompt: &str) -> CommandSpec {
    let mut argv =
        vec![program(options, "codex"), "exec".into(), "--json".into(), "--skip-git-repo-check".into()];
    match &options.sandbox_mode {
        Some(mode) => {
            argv.push("--sandbox".into());
            argv.push(mode.clone());
        }
        // The sandbox is the isolation, and Codex's own (landlock/seatbelt)
        // rarely works inside a container.
        None => argv.push("--dangerously-bypass-approvals-and-sandbox".into()),
    }
    if let Some(m) = &options.model {
        argv.push("--model".into());
        argv.push(m.clone());
    }
    for (key, value) in &options.config_overrides {
        argv.push("-c".into());
        argv.push(format!("{key}={value}"));
    }
    argv.extend(client_tool_overrides(options));
    argv.extend(options.extra_args.iter().cloned());
    if let Some(session) = &options.resume_session_id {
        argv.push("resume".into());
        argv.push(session.clone());
    }
    // `-`: the prompt is read from stdin, so it never lands in argv (size
    // limits, process listings).
    argv.push("-".into());
    CommandSpec::new(argv, options.env.clone(), prompt_stdin(options, prompt))
}

/// The agent's MCP server in Codex's config, for client tools.
fn client_tool_overrides(options: &HarnessOptions) -> Vec<String> {
    if options.client_tools.is_empty() {
        return Vec::new();
    }
    let (command, args) = policy::mcp_command();
    let args: Vec<String> = args.iter().map(|a| toml_string(a)).collect();
    let server = format!("mcp_servers.{}", policy::MCP_SERVER);
    let timeout_sec = policy::tool_timeout_ms(&options.policy).div_ceil(1000);
    [
        format!("{server}.command={}", toml_string(&command)),
        format!("{server}.args=[{}]", args.join(", ")),
        format!("{server}.tool_timeout_sec={timeout_sec}"),
    ]
    .into_iter()
    .flat_map(|o| ["-c".to_owned(), o])
    .collect()
}

/// The ACP agent next to the run's Codex (`/x/codex` → `/x/codex-acp`), else
/// `codex-acp` on the PATH.
fn acp_program(options: &HarnessOptions) -> String {
    match options.program.as_deref().map(std::path::Path::new).and_then(std::path::Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(ACP_PROGRAM).display().to_string(),
        _ => ACP_PROGRAM.to_owned(),
    }
}

/// Codex's ACP agent.
pub const ACP_PROGRAM: &str = "codex-acp";

/// `sandhold-agent acp --permissions policy ... -- codex-acp -c ...`: Codex
/// asks for every command it does not know to be read-only and for every
/// patch (`approval_policy="untrusted"`), with its own sandbox off (it does
/// not work in containers; the sandbox is the isolation).
fn acp_command(options: &HarnessOptions, prompt: &str) -> CommandSpec {
    let mut argv = policy::acp_bridge(options.resume_session_id.as_deref());
    argv.push(acp_program(options));
    let sandbox = options.sandbox_mode.as_deref().unwrap_or("danger-full-access");
    let mut config: Vec<String> = options.model.iter().map(|m| format!("model={}", toml_string(m))).collect();
    config.extend(options.config_overrides.iter().map(|(k, v)| format!("{k}={v}")));
    // Last, so that the run's own overrides cannot turn the asking off.
    config.push("approval_policy=\"untrusted\"".to_owned());
    config.push(format!("sandbox_mode={}", toml_string(sandbox)));
    for c in config {
        argv.push("-c".into());
        argv.push(c);
    }
    argv.extend(options.extra_args.iter().cloned());
    let mut spec = CommandSpec::new(argv, options.env.clone(), prompt_stdin(options, prompt));
    spec.output = Output::Acp;
    spec
}

#[derive(Debug)]
enum Item {
    /// A text or reasoning message and the text delivered so far.
    Message { id: String, reasoning: bool, sent: String },
    /// A tool call whose START/ARGS/END went out.
    Tool { id: String },
}

#[derive(Debug, Default)]
pub(super) struct CodexTranslator {
    /// Codex item id → what it became.
    items: HashMap<String, Item>,
    usage: Option<Usage>,
    last_error: Option<String>,
}

impl CodexTranslator {
    fn message(&mut self, em: &mut Emitter, item: &Value, reasoning: bool, completed: bool) {
        let key = str_of(item, "id").to_owned();
        let text = str_of(item, "text");
        if !self.items.contains_key(&key) {
            if completed && text.is_empty() {
                return;
            }
            let id = if reasoning { em.start_reasoning() } else { em.start_text() };
            self.items.insert(key.clone(), Item::Message { id, reasoning, sent: String::new() });
        }
        let Some(Item::Message { id, reasoning, sent }) = self.items.get_mut(&key) else { return };
        // Codex re-sends the whole text on every update; deliver what is new.
        // A text that no longer extends what was sent cannot be taken back.
        if let Some(new) = text.strip_prefix(sent.as_str())
            && !new.is_empty()
        {
            let c = if *reasoning { em.f.reasoning_content(id, new) } else { em.f.text_content(id, new) };
            em.push(c);
            *sent = text.to_owned();
        }
        if completed {
            let c = if *reasoning { em.f.reasoning_end(id) } else { em.f.text_end(id) };
            em.push(c);
            self.items.remove(&key);
        }
    }

    /// START/ARGS/END once per item, then RESULT when it completes.
    fn tool(
        &mut self,
        em: &mut Emitter,
        item: &Value,
        name: &str,
        args: Value,
        completed: bool,
    ) -> Option<String> {
        let key = str_of(item, "id").to_owned();
        let id = match self.items.get(&key) {
            Some(Item::Tool { id }) => id.clone(),
            _ => {
                let id = em.tool_call(name, &args);
                self.items.insert(key.clone(), Item::Tool { id: id.clone() });
                id
            }
        };
        if completed {
            self.items.remove(&key);
            Some(id)
        } else {
            None
        }
    }

    fn item(&mut self, em: &mut Emitter, item: &Value, completed: bool) {
        let failed = str_of(item, "status") == "failed";
        match str_of(item, "type") {
            "agent_message" => self.message(em, item, false, completed),
            "reasoning" => self.message(em, item, true, completed),
            "command_execution" => {
                let args = json!({ "command": str_of(item, "command") });
                if let Some(id) = self.tool(em, item, "command_execution", args, completed) {
                    let exit =
                        item.get("exit_code").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok());
                    let is_error = failed || exit.is_some_and(|c| c != 0);
                    em.push(em.f.tool_call_result(&id, str_of(item, "aggregated_output"), is_error, exit));
                }
            }
            "file_change" => {
                let args =
                    json!({ "changes": item.get("changes").cloned().unwrap_or(Value::Array(Vec::new())) });
                if let Some(id) = self.tool(em, item, "file_change", args, completed) {
                    em.push(em.f.tool_call_result(&id, str_of(item, "status"), failed, None));
                }
            }
            "mcp_tool_call" => {
                let name = format!("mcp__{}__{}", str_of(item, "server"), str_of(item, "tool"));
                let args = item.get("arguments").cloned().unwrap_or_else(|| Value::Object(Map::new()));
                if let Some(id) = self.tool(em, item, &name, args, completed) {
                    let error = item.get("error").filter(|e| !e.is_null());
                    let content = match error {
                        Some(e) => e
                            .get("message")
                            .and_then(Value::as_str)
                            .map_or_else(|| e.to_string(), str::to_owned),
                        None => {
                            let result = item.get("result").unwrap_or(&Value::Null);
                            result.get("content").map_or_else(|| result_text(result), result_text)
                        }
                    };
                    em.push(em.f.tool_call_result(&id, &content, failed || error.is_some(), None));
                }
            }
            "web_search" => {
                let args = json!({ "query": str_of(item, "query") });
                if let Some(id) = self.tool(em, item, "web_search", args, completed) {
                    em.push(em.f.tool_call_result(&id, "", failed, None));
                }
            }
            "todo_list" if completed => {
                let items = item.get("items").cloned().unwrap_or(Value::Null);
                em.push(em.f.custom(chunk::CODEX_TODO_LIST, &json!({ "items": items })));
            }
            "error" if completed => em.warning(str_of(item, "message"), None),
            _ => {}
        }
    }
}

impl Translate for CodexTranslator {
    fn line(&mut self, em: &mut Emitter, line: &[u8]) {
        let Some(event) = parse_event(em, line) else { return };
        match str_of(&event, "type") {
            "thread.started" => {
                let id = str_of(&event, "thread_id");
                if !id.is_empty() {
                    em.session_id(id);
                }
            }
            "turn.completed" => {
                if let Some(u) = event.get("usage") {
                    let turn = Usage {
                        input_tokens: u64_of(u, "input_tokens"),
                        output_tokens: u64_of(u, "output_tokens"),
                        cache_read_tokens: u64_of(u, "cached_input_tokens"),
                        cache_write_tokens: u64_of(u, "cache_write_input_tokens"),
                        reasoning_tokens: u64_of(u, "reasoning_output_tokens"),
                        cost_usd: None,
                    };
                    add_usage(&mut self.usage, &turn);
                }
                // `codex exec` runs one turn: its end is the run's result.
                em.push(em.f.run_finished("stop", self.usage));
            }
            "turn.failed" => {
                let message = event.get("error").map_or("", |e| str_of(e, "message"));
                let message = if message.is_empty() {
                    self.last_error.as_deref().unwrap_or("turn failed")
                } else {
                    message
                };
                em.push(em.f.run_error(message, "turn_failed"));
            }
            "error" => {
                let message = str_of(&event, "message").to_owned();
                em.warning(&message, None);
                self.last_error = Some(message);
            }
            kind @ ("item.started" | "item.updated" | "item.completed") => {
                if let Some(item) = event.get("item") {
                    self.item(em, item, kind == "item.completed");
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self, em: &mut Emitter, exit_code: i32, stderr_tail: &str) {
        em.finish_from_exit(exit_code, stderr_tail, self.last_error.as_deref(), "stop", self.usage);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::{NETWORK_WARNING, READ_ONLY_WARNING};

    #[test]
    fn a_policy_that_asks_or_denies_runs_codex_acp_under_the_bridge() {
        let options = HarnessOptions {
            program: Some("/opt/clis/bin/codex".into()),
            model: Some("gpt-5".into()),
            resume_session_id: Some("th".into()),
            config_overrides: vec![("approval_policy".into(), "\"never\"".into())],
            policy: policy(Effect::Allow, vec![rule(Action::Command, "git push*", Effect::Deny)]),
            ..Default::default()
        };
        let spec = Harness::Codex.command(&options, "hi").unwrap();
        assert_eq!(
            spec.argv,
            [
                "sandhold-agent",
                "acp",
                "--permissions",
                "policy",
                "--requests",
                "{{sandhold-requests}}",
                "--session",
                "th",
                "--",
                "/opt/clis/bin/codex-acp",
                "-c",
                "model=\"gpt-5\"",
                "-c",
                "approval_policy=\"never\"",
                "-c",
                "approval_policy=\"untrusted\"",
                "-c",
                "sandbox_mode=\"danger-full-access\"",
            ]
        );
        assert_eq!(spec.output, Output::Acp);
        assert_eq!(spec.stdin, StdinSpec::Bytes(b"hi".to_vec()));
        assert_eq!(spec.warnings, [READ_ONLY_WARNING]);
        assert_eq!(spec.cli_program(), "/opt/clis/bin/codex-acp");
        assert!(spec.requests.is_some());

        // Only file writes governed: commands are all allowed, so no warning.
        let writes = HarnessOptions {
            policy: policy(Effect::Allow, vec![rule(Action::FileWrite, "**/.env", Effect::Ask)]),
            ..Default::default()
        };
        let spec = Harness::Codex.command(&writes, "hi").unwrap();
        assert_eq!(spec.argv[6..8], ["--", "codex-acp"]);
        assert!(spec.warnings.is_empty(), "{:?}", spec.warnings);

        // The broker's provider goes right after codex-acp.
        let mut spec = Harness::Codex.command(&options, "hi").unwrap();
        Harness::Codex.point_at(&mut spec, "http://127.0.0.1:5/v1", "ph");
        assert_eq!(spec.argv[9..12], ["/opt/clis/bin/codex-acp", "-c", "model_provider=\"sandhold\""]);
    }

    #[test]
    fn codex_exec_stays_while_commands_and_writes_are_allowed() {
        let options = HarnessOptions {
            policy: policy(Effect::Allow, vec![rule(Action::Network, "evil.example", Effect::Deny)]),
            client_tools: vec![client_tool("lookup")],
            ..Default::default()
        };
        let spec = Harness::Codex.command(&options, "hi").unwrap();
        assert_eq!(
            spec.argv,
            [
                "codex",
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "-c",
                "mcp_servers.sandhold.command=\"{{sandhold-agent}}\"",
                "-c",
                "mcp_servers.sandhold.args=[\"mcp\", \"--requests\", \"{{sandhold-requests}}\"]",
                "-c",
                "mcp_servers.sandhold.tool_timeout_sec=660",
                "-",
            ]
        );
        assert_eq!(spec.output, Output::Native);
        assert_eq!(spec.warnings, [NETWORK_WARNING]);
        assert_eq!(spec.requests.unwrap().tools.len(), 1);
        let bare = Harness::Codex.command(&HarnessOptions::default(), "hi").unwrap();
        assert_eq!((bare.requests, bare.warnings.len()), (None, 0));
    }

    #[test]
    fn command_line() {
        let options = HarnessOptions {
            model: Some("gpt-5".into()),
            config_overrides: vec![("model_provider".into(), "\"fake\"".into())],
            ..Default::default()
        };
        let spec = Harness::Codex.command(&options, "hi").unwrap();
        assert_eq!(
            spec.argv,
            [
                "codex",
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--model",
                "gpt-5",
                "-c",
                "model_provider=\"fake\"",
                "-"
            ]
        );
        assert_eq!(spec.stdin, StdinSpec::Bytes(b"hi".to_vec()));
        let sandboxed = HarnessOptions {
            sandbox_mode: Some("workspace-write".into()),
            resume_session_id: Some("th".into()),
            ..Default::default()
        };
        let spec = Harness::Codex.command(&sandboxed, "hi").unwrap();
        assert_eq!(spec.argv[4..], ["--sandbox", "workspace-write", "resume", "th", "-"]);
        let bad = HarnessOptions { config_overrides: vec![("a=b".into(), "1".into())], ..Default::default() };
        assert!(matches!(Harness::Codex.command(&bad, "x"), Err(HarnessError::InvalidOption { .. })));
    }

    #[test]
    fn streamed_items_mcp_file_changes_and_failures() {
        let journal = r#"{"type":"thread.started","thread_id":"th"}
{"type":"turn.started"}
{"type":"item.started","item":{"id":"i0","type":"reasoning","text":""}}
{"type":"item.updated","item":{"id":"i0","type":"reasoning","text":"Think"}}
{"type":"item.completed","item":{"id":"i0","type":"reasoning","text":"Thinking"}}
{"type":"item.started","item":{"id":"i1","type":"mcp_tool_call","server":"docs","tool":"search","arguments":{"q":"x"},"status":"in_progress"}}
{"type":"item.completed","item":{"id":"i1","type":"mcp_tool_call","server":"docs","tool":"search","arguments":{"q":"x"},"result":{"content":[{"type":"text","text":"found"}]},"status":"completed"}}
{"type":"item.completed","item":{"id":"i2","type":"file_change","changes":[{"path":"a.txt","kind":"add"}],"status":"completed"}}
{"type":"item.completed","item":{"id":"i3","type":"command_execution","command":"false","aggregated_output":"","exit_code":1,"status":"failed"}}
{"type":"error","message":"stream disconnected"}
{"type":"turn.failed","error":{"message":"model unavailable"}}"#;
        let chunks = translate(Harness::Codex, journal, 1, "");
        assert_eq!(
            types(&chunks),
            [
                "RUN_STARTED",
                "CUSTOM",
                "REASONING_START",
                "REASONING_CONTENT",
                "REASONING_CONTENT",
                "REASONING_END",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "TOOL_CALL_RESULT",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "TOOL_CALL_RESULT",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "TOOL_CALL_RESULT",
                "CUSTOM",
                "RUN_ERROR"
            ]
        );
        assert_eq!(chunks[1].name, "codex.session-id");
        assert_eq!((chunks[3].delta.as_str(), chunks[4].delta.as_str()), ("Think", "ing"));
        assert_eq!(
            (chunks[6].tool_name.as_str(), chunks[7].delta.as_str()),
            ("mcp__docs__search", r#"{"q":"x"}"#)
        );
        assert_eq!((chunks[9].content.as_str(), chunks[9].is_error), ("found", false));
        assert_eq!(chunks[10].tool_name, "file_change");
        assert_eq!(chunks[15].delta, r#"{"command":"false"}"#);
        assert_eq!((chunks[17].exit_code, chunks[17].is_error), (Some(1), true));
        assert_eq!(chunks[18].name, "harness.warning");
        assert_eq!(
            (chunks[19].error_message.as_str(), chunks[19].error_code.as_str()),
            ("model unavailable", "turn_failed")
        );
    }

    #[test]
    fn crash_without_turn_end_carries_the_last_error() {
        let journal = "{\"type\":\"turn.started\"}\n{\"type\":\"item.started\",\"item\":{\"id\":\"i\",\"type\":\"agent_message\",\"text\":\"Hal\"}}\n{\"type\":\"error\",\"message\":\"quota exceeded\"}";
        let chunks = translate(Harness::Codex, journal, 1, "panic at main.rs");
        assert_eq!(
            types(&chunks),
            [
                "RUN_STARTED",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "CUSTOM",
                "TEXT_MESSAGE_END",
                "RUN_ERROR"
            ]
        );
        assert_eq!(chunks[5].error_message, "codex exited with code 1: quota exceeded");
    }
}
