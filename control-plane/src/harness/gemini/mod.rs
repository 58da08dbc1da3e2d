//! Gemini CLI: `gemini -p "" --output-format stream-json`, the prompt on
//! stdin (headless mode appends `-p`'s text to what stdin holds, so the
//! prompt never lands in argv).
//!
//! Events translated: `init` (session id), assistant `message`s (streamed
//! text: `delta: true` pieces extend one message until a tool call or the
//! end; a whole message otherwise), `tool_use` and `tool_result` (a tool
//! call and its result), `error` (a warning; kept for a later RUN_ERROR)
//! and `result` (usage; RUN_FINISHED, or RUN_ERROR with the error's type as
//! code). The user's own `message` is not repeated.

mod adapter;
mod session;

pub(super) use adapter::Gemini;

use std::collections::HashMap;

use serde_json::{Map, Value};
use shared::chunk::Usage;
use shared::policy::{Action, Effect};

use super::{
    CommandSpec, Emitter, HarnessError, HarnessOptions, Translate, parse_event, policy, program,
    prompt_stdin, str_of, u64_of,
};

/// `--approval-mode` unless the run names one: the sandbox is the isolation.
const DEFAULT_APPROVAL_MODE: &str = "yolo";

/// What Gemini CLI's tools of each kind are called, for warnings.
fn tools_of(action: Action) -> &'static str {
    match action {
        Action::Command => "commands (run_shell_command)",
        Action::FileWrite => "file writes (write_file, replace)",
        Action::Network | Action::Request => "fetches (web_fetch)",
    }
}

/// The approval mode for a policy, and what it cannot express. Headless
/// Gemini CLI cannot ask (a tool that needs a confirmation is not offered),
/// and without a policy file its approval modes run either every tool
/// (`yolo`), edits only (`auto_edit`) or none of the governed ones
/// (`default`): a kind runs only when the policy allows all of it, and the
/// strictest mode that runs those is chosen, so nothing denied runs.
fn policy_mode(options: &HarnessOptions) -> (&'static str, Vec<String>) {
    let allowed = |a| policy::uniform(&options.policy, a) == Some(Effect::Allow);
    let mode = if policy::ACTIONS.into_iter().all(allowed) {
        "yolo"
    } else if allowed(Action::FileWrite) {
        "auto_edit"
    } else {
        "default"
    };
    let runs = |a| match mode {
        "yolo" => true,
        "auto_edit" => a == Action::FileWrite,
        _ => false,
    };
    let warnings = policy::ACTIONS
        .into_iter()
        .filter(|&a| !runs(a) && policy::uniform(&options.policy, a) != Some(Effect::Deny))
        .map(|a| {
            format!(
                "Gemini CLI cannot ask or apply rules in headless mode: the policy's {} are not run at all",
                tools_of(a)
            )
        })
        .collect();
    (mode, warnings)
}

/// The warning of a Gemini run with client tools.
pub const CLIENT_TOOLS_WARNING: &str =
    "Gemini CLI reads MCP servers from its settings file only: the client's tools are not offered";

pub(super) fn command(options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
    let governed = !options.policy.allows_everything();
    let (policy_mode, mut warnings) =
        if governed { policy_mode(options) } else { (DEFAULT_APPROVAL_MODE, Vec::new()) };
    let approval = options.permission_mode.as_deref().unwrap_or(policy_mode);
    if !["default", "auto_edit", "yolo", "plan"].contains(&approval) {
        return Err(HarnessError::InvalidOption {
            option: "permission_mode",
            reason: format!(
                "Gemini CLI approval modes are default, auto_edit, yolo and plan, not {approval:?}"
            ),
        });
    }
    if governed && !["default", "plan", policy_mode].contains(&approval) {
        return Err(HarnessError::InvalidOption {
            option: "permission_mode",
            reason: format!("{approval:?} runs what the sandbox policy does not allow (use {policy_mode:?})"),
        });
    }
    if !options.client_tools.is_empty() {
        warnings.push(CLIENT_TOOLS_WARNING.to_owned());
    }
    let mut argv = vec![
        program(options, "gemini"),
        "--prompt".into(),
        String::new(),
        "--output-format".into(),
        "stream-json".into(),
        "--approval-mode".into(),
        approval.to_owned(),
        // The workspace is the sandbox's own: trusting it is what lets the
        // approval mode above apply (an untrusted folder forces `default`).
        "--skip-trust".into(),
    ];
    if let Some(m) = &options.model {
        argv.push("--model".into());
        argv.push(m.clone());
    }
    if let Some(s) = &options.resume_session_id {
        argv.push("--resume".into());
        argv.push(s.clone());
    }
    argv.extend(options.extra_args.iter().cloned());
    let mut spec = CommandSpec::new(argv, options.env.clone(), prompt_stdin(options, prompt));
    if policy::applies(options) {
        spec.requests = Some(policy::request_setup(options));
    }
    spec.warnings = warnings;
    Ok(spec)
}

#[derive(Debug, Default)]
pub(super) struct GeminiTranslator {
    session_seen: bool,
    /// The streamed assistant message still open.
    text: Option<String>,
    /// Gemini's tool id → the run's tool call id.
    tools: HashMap<String, String>,
    last_error: Option<String>,
}

impl GeminiTranslator {
    fn end_text(&mut self, em: &mut Emitter) {
        if let Some(id) = self.text.take() {
            em.push(em.f.text_end(&id));
        }
    }

    fn message(&mut self, em: &mut Emitter, event: &Value) {
        if str_of(event, "role") != "assistant" {
            return;
        }
        let content = str_of(event, "content");
        if event.get("delta").and_then(Value::as_bool) != Some(true) {
            self.end_text(em);
            return em.text_message(content);
        }
        if content.is_empty() {
            return;
        }
        let id = em.open_text(&mut self.text);
        em.push(em.f.text_content(&id, content));
    }

    fn result(&mut self, em: &mut Emitter, event: &Value) {
        self.end_text(em);
        let stats = event.get("stats").cloned().unwrap_or(Value::Null);
        let usage = stats.is_object().then(|| Usage {
            input_tokens: u64_of(&stats, "input_tokens"),
            output_tokens: u64_of(&stats, "output_tokens"),
            cache_read_tokens: u64_of(&stats, "cached"),
            cache_write_tokens: 0,
            reasoning_tokens: 0,
            cost_usd: None,
        });
        if str_of(event, "status") == "success" {
            return em.push(em.f.run_finished("stop", usage));
        }
        let error = event.get("error").cloned().unwrap_or(Value::Null);
        let message = [str_of(&error, "message"), self.last_error.as_deref().unwrap_or_default()]
            .into_iter()
            .find(|m| !m.is_empty())
            .unwrap_or("gemini reported an error")
            .to_owned();
        let code = match str_of(&error, "type") {
            "" => "error",
            t => t,
        };
        em.push(em.f.run_error(&message, code));
    }
}

impl Translate for GeminiTranslator {
    fn line(&mut self, em: &mut Emitter, line: &[u8]) {
        let Some(event) = parse_event(em, line) else { return };
        match str_of(&event, "type") {
            "init" => {
                em.first_session_id(&mut self.session_seen, str_of(&event, "session_id"));
            }
            "message" => self.message(em, &event),
            "tool_use" => {
                self.end_text(em);
                let args = event.get("parameters").cloned().unwrap_or_else(|| Value::Object(Map::new()));
                let id = em.tool_call(str_of(&event, "tool_name"), &args);
                self.tools.insert(str_of(&event, "tool_id").to_owned(), id);
            }
            "tool_result" => {
                // A result of a call never announced has nothing to attach to.
                let Some(id) = self.tools.remove(str_of(&event, "tool_id")) else { return };
                let is_error = str_of(&event, "status") == "error";
                let error = event.get("error").map_or("", |e| str_of(e, "message"));
                let output = str_of(&event, "output");
                let content = if is_error && output.is_empty() { error } else { output };
                em.push(em.f.tool_call_result(&id, content, is_error, None));
            }
            "error" => {
                let message = str_of(&event, "message").to_owned();
                em.warning(&message, None);
                if str_of(&event, "severity") == "error" {
                    self.last_error = Some(message);
                }
            }
            "result" => self.result(em, &event),
            _ => {}
        }
    }

    fn finish(&mut self, em: &mut Emitter, exit_code: i32, stderr_tail: &str) {
        self.end_text(em);
        em.finish_from_exit(exit_code, stderr_tail, self.last_error.as_deref(), "stop", None);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::CLIENT_TOOLS_WARNING;

    fn approval_of(spec: &CommandSpec) -> &str {
        let at = spec.argv.iter().position(|a| a == "--approval-mode").unwrap();
        &spec.argv[at + 1]
    }

    #[test]
    fn a_policy_picks_the_strictest_mode_that_runs_what_it_allows() {
        let with = |p: Policy| HarnessOptions { policy: p, ..Default::default() };
        let spec = Harness::Gemini.command(&HarnessOptions::default(), "p").unwrap();
        assert_eq!((approval_of(&spec), spec.warnings.len(), spec.requests.is_none()), ("yolo", 0, true));

        // Commands governed by rules: edits still run, commands do not.
        let rules = with(policy(Effect::Allow, vec![rule(Action::Command, "rm *", Effect::Deny)]));
        let spec = Harness::Gemini.command(&rules, "p").unwrap();
        assert_eq!(approval_of(&spec), "auto_edit");
        assert_eq!(
            spec.warnings,
            [
                "Gemini CLI cannot ask or apply rules in headless mode: the policy's commands (run_shell_command) are not run at all",
                "Gemini CLI cannot ask or apply rules in headless mode: the policy's fetches (web_fetch) are not run at all",
            ]
        );
        assert!(spec.requests.is_some());

        // Everything denied: nothing to warn about.
        let spec = Harness::Gemini.command(&with(policy(Effect::Deny, vec![])), "p").unwrap();
        assert_eq!((approval_of(&spec), spec.warnings.len()), ("default", 0));

        let mut yolo = with(policy(Effect::Ask, vec![]));
        yolo.permission_mode = Some("yolo".into());
        assert!(matches!(Harness::Gemini.command(&yolo, "p"), Err(HarnessError::InvalidOption { .. })));
        yolo.permission_mode = Some("plan".into());
        assert_eq!(approval_of(&Harness::Gemini.command(&yolo, "p").unwrap()), "plan");

        let tools = HarnessOptions { client_tools: vec![client_tool("t")], ..Default::default() };
        assert_eq!(Harness::Gemini.command(&tools, "p").unwrap().warnings, [CLIENT_TOOLS_WARNING]);
    }

    #[test]
    fn command_line_reads_the_prompt_from_stdin() {
        let options = HarnessOptions {
            model: Some("gemini-2.5-pro".into()),
            resume_session_id: Some("43cd80b7".into()),
            permission_mode: Some("auto_edit".into()),
            ..Default::default()
        };
        let spec = Harness::Gemini.command(&options, "-v is a message").unwrap();
        assert_eq!(
            spec.argv,
            [
                "gemini",
                "--prompt",
                "",
                "--output-format",
                "stream-json",
                "--approval-mode",
                "auto_edit",
                "--skip-trust",
                "--model",
                "gemini-2.5-pro",
                "--resume",
                "43cd80b7"
            ]
        );
        assert_eq!(spec.stdin, StdinSpec::Bytes(b"-v is a message".to_vec()));
        let default = Harness::Gemini.command(&HarnessOptions::default(), "x").unwrap();
        assert_eq!(default.argv[5..7], ["--approval-mode", "yolo"]);
        let bad = HarnessOptions { permission_mode: Some("bypassPermissions".into()), ..Default::default() };
        assert!(matches!(Harness::Gemini.command(&bad, "x"), Err(HarnessError::InvalidOption { .. })));
    }

    #[test]
    fn streamed_text_ends_at_a_tool_call_and_errors_fail_the_run() {
        let journal = r#"{"type":"init","session_id":"s1","model":"m"}
{"type":"message","role":"user","content":"do it"}
{"type":"message","role":"assistant","content":"Let me ","delta":true}
{"type":"message","role":"assistant","content":"look.","delta":true}
{"type":"tool_use","tool_name":"read_file","tool_id":"t1","parameters":{"path":"a"}}
{"type":"tool_result","tool_id":"t1","status":"error","output":"","error":{"type":"FILE_NOT_FOUND","message":"no a"}}
{"type":"tool_result","tool_id":"unknown","status":"success","output":"x"}
{"type":"error","severity":"warning","message":"slow"}
{"type":"error","severity":"error","message":"quota exceeded"}
{"type":"result","status":"error","error":{"type":"FatalTurnLimitedError","message":"too many turns"},"stats":{"input_tokens":5,"output_tokens":2,"cached":1}}"#;
        let chunks = translate(Harness::Gemini, journal, 53, "");
        assert_eq!(
            types(&chunks),
            [
                "RUN_STARTED",
                "CUSTOM",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "TOOL_CALL_RESULT",
                "CUSTOM",
                "CUSTOM",
                "RUN_ERROR"
            ]
        );
        assert_eq!(chunks[1].name, "gemini.session-id");
        assert_eq!((chunks[3].delta.as_str(), chunks[4].delta.as_str()), ("Let me ", "look."));
        assert_eq!(chunks[6].parent_message_id, chunks[2].message_id);
        assert_eq!((chunks[9].content.as_str(), chunks[9].is_error), ("no a", true));
        assert_eq!(
            (chunks[12].error_message.as_str(), chunks[12].error_code.as_str()),
            ("too many turns", "FatalTurnLimitedError")
        );
    }

    #[test]
    fn a_crash_before_the_result_carries_the_last_error() {
        let journal = "{\"type\":\"init\",\"session_id\":\"s\"}\n{\"type\":\"message\",\"role\":\"assistant\",\"content\":\"Hal\",\"delta\":true}\n{\"type\":\"error\",\"severity\":\"error\",\"message\":\"stream broke\"}";
        let chunks = translate(Harness::Gemini, journal, 1, "stack trace");
        assert_eq!(
            types(&chunks),
            [
                "RUN_STARTED",
                "CUSTOM",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "CUSTOM",
                "TEXT_MESSAGE_END",
                "RUN_ERROR"
            ]
        );
        assert_eq!(chunks[6].error_message, "gemini exited with code 1: stream broke");
    }
}
