//! OpenCode: `opencode run --format json <prompt>`. It takes the prompt as
//! an argument only (it does not read stdin), so the prompt is in argv.
//!
//! Events translated: the first event's `sessionID` (session id), `text`
//! and `reasoning` parts (whole messages), `tool_use` parts (a tool call and
//! its result, with the command's exit code when the tool reports one),
//! `step_finish` (usage and cost summed over steps, the last step's finish
//! reason; RUN_FINISHED comes at exit, since a run is many steps) and
//! `error` (RUN_ERROR).

mod adapter;
mod session;

pub(super) use adapter::OpenCode;

use serde_json::{Map, Value, json};
use shared::chunk::Usage;
use shared::policy::{Action, Effect};

use super::{
    CommandSpec, Emitter, HarnessError, HarnessOptions, Output, StdinSpec, Translate, add_usage,
    finish_reason, parse_event, policy, program, prompt_stdin, result_text, str_of, u64_of,
};

/// OpenCode's permission for each kind of action the policy governs
/// (`edit` covers its edit, write and patch tools).
fn permission_of(action: Action) -> &'static str {
    match action {
        Action::Command => "bash",
        Action::FileWrite => "edit",
        Action::Network | Action::Request => "webfetch",
    }
}

/// The variable OpenCode reads inline config from.
const CONFIG_VAR: &str = "OPENCODE_CONFIG_CONTENT";

pub(super) fn command(options: &HarnessOptions, prompt: &str) -> Result<CommandSpec, HarnessError> {
    let governed = !options.policy.allows_everything();
    // Each kind allowed or denied whole natively, else `ask`: `opencode
    // run` rejects whatever asks, so then OpenCode runs as an ACP agent
    // (`opencode acp`) under the agent's bridge, which answers each
    // question by the policy's rules.
    let mut permission = Map::new();
    let mut bridged = false;
    for action in policy::ACTIONS.into_iter().filter(|_| governed) {
        let effect = policy::native(&options.policy, action);
        bridged |= effect == Effect::Ask;
        permission.insert(permission_of(action).into(), effect.as_str().into());
    }
    let mut overlay = Map::new();
    if governed {
        overlay.insert("permission".into(), Value::Object(permission));
    }
    if !options.client_tools.is_empty() && !bridged {
        let (command, args) = policy::mcp_command();
        let command: Vec<String> = std::iter::once(command).chain(args).collect();
        overlay.insert(
            "mcp".into(),
            json!({ (policy::MCP_SERVER): {"type": "local", "command": command, "enabled": true} }),
        );
    }
    if bridged && let Some(m) = &options.model {
        // `opencode acp` takes no `--model`.
        overlay.insert("model".into(), m.clone().into());
    }

    let mut env = options.env.clone();
    env.entry("OPENCODE_DISABLE_AUTOUPDATE".into()).or_insert_with(|| "1".into());
    if !overlay.is_empty() {
        let mut config = match env.get(CONFIG_VAR) {
            None => Value::Object(Map::new()),
            Some(text) => match serde_json::from_str::<Value>(text) {
                Ok(v @ Value::Object(_)) => v,
                _ => {
                    return Err(HarnessError::InvalidOption {
                        option: "env",
                        reason: format!("{CONFIG_VAR} is not a JSON object"),
                    });
                }
            },
        };
        // The policy's settings win over the run's own.
        policy::merge_json(&mut config, Value::Object(overlay));
        env.insert(CONFIG_VAR.into(), config.to_string());
    }

    let mut spec = if bridged {
        let mut argv = policy::acp_bridge(options.resume_session_id.as_deref());
        argv.push(program(options, "opencode"));
        argv.push("acp".into());
        argv.extend(options.extra_args.iter().cloned());
        let mut spec = CommandSpec::new(argv, env, prompt_stdin(options, prompt));
        spec.output = Output::Acp;
        spec
    } else {
        let mut argv = vec![program(options, "opencode"), "run".into(), "--format".into(), "json".into()];
        if let Some(m) = &options.model {
            argv.push("--model".into());
            argv.push(m.clone());
        }
        if let Some(s) = &options.resume_session_id {
            argv.push("--session".into());
            argv.push(s.clone());
        }
        argv.extend(options.extra_args.iter().cloned());
        // `--` keeps a prompt that starts with a dash a message, not a flag.
        argv.push("--".into());
        argv.push(prompt.to_owned());
        CommandSpec::new(argv, env, StdinSpec::Null)
    };
    if policy::applies(options) {
        spec.requests = Some(policy::request_setup(options));
    }
    Ok(spec)
}

#[derive(Debug, Default)]
pub(super) struct OpenCodeTranslator {
    session_seen: bool,
    usage: Option<Usage>,
    last_reason: String,
}

impl OpenCodeTranslator {
    fn tool_use(em: &mut Emitter, part: &Value) {
        let state = part.get("state").cloned().unwrap_or(Value::Null);
        let input = state.get("input").cloned().unwrap_or_else(|| Value::Object(Map::new()));
        let id = em.tool_call(str_of(part, "tool"), &input);
        let status = str_of(&state, "status");
        let is_error = status == "error";
        if status == "completed" || is_error {
            let content = if is_error {
                result_text(state.get("error").unwrap_or(&Value::Null))
            } else {
                result_text(state.get("output").unwrap_or(&Value::Null))
            };
            let exit = state
                .get("metadata")
                .and_then(|m| m.get("exit"))
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok());
            em.push(em.f.tool_call_result(&id, &content, is_error, exit));
        }
    }

    fn step_finish(&mut self, part: &Value) {
        self.last_reason = str_of(part, "reason").to_owned();
        let tokens = part.get("tokens").cloned().unwrap_or(Value::Null);
        let cache = tokens.get("cache").cloned().unwrap_or(Value::Null);
        let step = Usage {
            input_tokens: u64_of(&tokens, "input"),
            output_tokens: u64_of(&tokens, "output"),
            cache_read_tokens: u64_of(&cache, "read"),
            cache_write_tokens: u64_of(&cache, "write"),
            reasoning_tokens: u64_of(&tokens, "reasoning"),
            cost_usd: part.get("cost").and_then(Value::as_f64),
        };
        add_usage(&mut self.usage, &step);
    }
}

impl Translate for OpenCodeTranslator {
    fn line(&mut self, em: &mut Emitter, line: &[u8]) {
        let Some(event) = parse_event(em, line) else { return };
        let session = str_of(&event, "sessionID");
        if !self.session_seen && !session.is_empty() {
            self.session_seen = true;
            em.session_id(session);
        }
        let part = event.get("part").cloned().unwrap_or(Value::Null);
        match str_of(&event, "type") {
            "text" => em.text_message(str_of(&part, "text")),
            "reasoning" => em.reasoning_message(str_of(&part, "text")),
            "tool_use" => Self::tool_use(em, &part),
            "step_finish" => self.step_finish(&part),
            "error" => {
                let error = event.get("error").cloned().unwrap_or(Value::Null);
                let name = str_of(&error, "name");
                let message =
                    [error.get("data").map_or("", |d| str_of(d, "message")), str_of(&error, "message"), name]
                        .into_iter()
                        .find(|s| !s.is_empty())
                        .unwrap_or("opencode reported an error");
                let code = if name.is_empty() { "error" } else { name };
                em.push(em.f.run_error(message, code));
            }
            _ => {}
        }
    }

    fn finish(&mut self, em: &mut Emitter, exit_code: i32, stderr_tail: &str) {
        let reason = finish_reason(&self.last_reason);
        em.finish_from_exit(exit_code, stderr_tail, None, &reason, self.usage);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;

    fn config_of(spec: &CommandSpec) -> serde_json::Value {
        serde_json::from_str(&spec.env["OPENCODE_CONFIG_CONTENT"]).unwrap()
    }

    #[test]
    fn allow_and_deny_of_whole_kinds_stay_native() {
        let mut options = HarnessOptions {
            policy: policy(Effect::Allow, vec![rule(Action::Command, "*", Effect::Deny)]),
            client_tools: vec![client_tool("lookup")],
            ..Default::default()
        };
        options.env.insert("OPENCODE_CONFIG_CONTENT".into(), r#"{"permission":{"read":"allow"}}"#.into());
        let spec = Harness::OpenCode.command(&options, "hi").unwrap();
        assert_eq!(spec.argv, ["opencode", "run", "--format", "json", "--", "hi"]);
        assert_eq!(spec.output, Output::Native);
        assert_eq!(
            config_of(&spec),
            serde_json::json!({
                "permission": {"read": "allow", "bash": "deny", "edit": "allow", "webfetch": "allow"},
                "mcp": {"sandhold": {"type": "local", "enabled": true,
                    "command": ["{{sandhold-agent}}", "mcp", "--requests", "{{sandhold-requests}}"]}}
            })
        );
        assert!(spec.requests.is_some() && spec.warnings.is_empty());

        // The broker's provider merges in; the policy stays.
        let mut spec = spec;
        Harness::OpenCode.point_at(&mut spec, "http://127.0.0.1:5/v1", "ph");
        let config = config_of(&spec);
        assert_eq!(config["permission"]["bash"], "deny");
        assert_eq!(config["provider"]["anthropic"]["options"]["baseURL"], "http://127.0.0.1:5/v1");

        options.env.insert("OPENCODE_CONFIG_CONTENT".into(), "[1]".into());
        assert!(matches!(Harness::OpenCode.command(&options, "x"), Err(HarnessError::InvalidOption { .. })));
    }

    #[test]
    fn a_policy_that_asks_runs_opencode_acp_under_the_bridge() {
        let options = HarnessOptions {
            model: Some("anthropic/m-1".into()),
            resume_session_id: Some("ses_1".into()),
            policy: policy(Effect::Ask, vec![rule(Action::Command, "git status*", Effect::Allow)]),
            client_tools: vec![client_tool("lookup")],
            ..Default::default()
        };
        let mut spec = Harness::OpenCode.command(&options, "hi").unwrap();
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
                "ses_1",
                "--",
                "opencode",
                "acp"
            ]
        );
        assert_eq!((spec.output, spec.cli_program()), (Output::Acp, "opencode"));
        assert_eq!(spec.stdin, StdinSpec::Bytes(b"hi".to_vec()));
        // Client tools come from the bridge (session/new), not the config.
        assert_eq!(
            config_of(&spec),
            serde_json::json!({
                "permission": {"bash": "ask", "edit": "ask", "webfetch": "ask"},
                "model": "anthropic/m-1"
            })
        );
        Harness::OpenCode.point_at(&mut spec, "http://b/v1", "ph");
        assert!(config_of(&spec)["provider"]["anthropic"]["models"]["m-1"].is_object());
    }

    #[test]
    fn command_line_puts_the_prompt_last() {
        let options = HarnessOptions {
            model: Some("fake/fake-model".into()),
            resume_session_id: Some("ses_1".into()),
            ..Default::default()
        };
        let spec = Harness::OpenCode.command(&options, "-v is a flag").unwrap();
        assert_eq!(
            spec.argv,
            [
                "opencode",
                "run",
                "--format",
                "json",
                "--model",
                "fake/fake-model",
                "--session",
                "ses_1",
                "--",
                "-v is a flag"
            ]
        );
        assert_eq!(spec.stdin, StdinSpec::Null);
    }

    #[test]
    fn errors_reasoning_and_failed_tools() {
        let journal = r#"{"type":"step_start","sessionID":"ses_x","part":{}}
{"type":"reasoning","sessionID":"ses_x","part":{"text":"let me see"}}
{"type":"tool_use","sessionID":"ses_x","part":{"tool":"bash","callID":"c","state":{"status":"error","input":{"command":"nope"},"error":"command not found"}}}
{"type":"step_finish","sessionID":"ses_x","part":{"reason":"tool-calls","tokens":{"input":1,"output":2,"reasoning":3,"cache":{"read":4,"write":5}},"cost":0.25}}
{"type":"error","sessionID":"ses_x","error":{"name":"ProviderAuthError","data":{"message":"bad key"}}}"#;
        let chunks = translate(Harness::OpenCode, journal, 1, "");
        assert_eq!(
            types(&chunks),
            [
                "RUN_STARTED",
                "CUSTOM",
                "REASONING_START",
                "REASONING_CONTENT",
                "REASONING_END",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "TOOL_CALL_RESULT",
                "RUN_ERROR"
            ]
        );
        assert_eq!(chunks[1].name, "opencode.session-id");
        assert_eq!(
            (chunks[8].content.as_str(), chunks[8].is_error, chunks[8].exit_code),
            ("command not found", true, None)
        );
        assert_eq!(
            (chunks[9].error_message.as_str(), chunks[9].error_code.as_str()),
            ("bad key", "ProviderAuthError")
        );
    }

    #[test]
    fn usage_sums_over_steps_and_the_last_reason_wins() {
        let step = r#"{"type":"step_finish","part":{"reason":"tool-calls","tokens":{"input":1,"output":2,"reasoning":0,"cache":{"read":0,"write":0}},"cost":0.5}}"#;
        let last = r#"{"type":"step_finish","part":{"reason":"length","tokens":{"input":10,"output":20,"reasoning":0,"cache":{"read":1,"write":0}},"cost":0.25}}"#;
        let chunks = translate(Harness::OpenCode, &format!("{step}\n{last}"), 0, "");
        assert_eq!(types(&chunks), ["RUN_STARTED", "RUN_FINISHED"]);
        assert_eq!(chunks[1].finish_reason, "length");
        let u = chunks[1].usage.unwrap();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cost_usd),
            (11, 22, 1, Some(0.75))
        );
    }
}
