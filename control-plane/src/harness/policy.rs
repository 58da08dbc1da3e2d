//! How a run's sandbox policy (`shared::policy::Policy`) and client tools
//! reach each CLI.
//!
//! One evaluator decides: the sandbox agent's permission tool (`sandhold-agent
//! mcp`, Claude Code's `--permission-prompt-tool`) and its ACP bridge
//! (`sandhold-agent acp --permissions policy`) answer every question a CLI
//! asks by `Policy::decide_tool`: allow and deny at once, ask as a durable
//! request the client answers. The CLI's own settings only *route*: a kind
//! of action the policy decides the same way whatever the subject (no rules,
//! or every rule agreeing with the default, or a catch-all rule nothing
//! overrides) is allowed or denied natively; any other kind is set to *ask*,
//! so that every such action reaches the evaluator, which applies the rules
//! exactly. Pattern rules are never translated into the CLI's own rule
//! syntax: Claude Code and OpenCode match each part of a compound command
//! separately and Claude Code matches paths like `.gitignore` lines, so a
//! translated allow could let through what a policy glob over the whole
//! command line denies.
//!
//! | CLI | uniform kinds | rules, ask | cannot express |
//! |-----|---------------|------------|----------------|
//! | Claude Code | `--settings` `permissions.allow`/`deny` of `Bash`; `Edit`, `Write`, `MultiEdit`, `NotebookEdit`; `WebFetch` | `permissions.ask` of those tools, `--permission-mode default`, `--permission-prompt-tool mcp__sandhold__permission` | nothing (every governed tool reaches the permission tool) |
//! | Codex | `codex exec` when commands and file writes are all allowed | through the ACP bridge: `codex-acp -c approval_policy="untrusted" -c sandbox_mode="danger-full-access"` (Codex asks for every command but those it knows to be read-only, and for every patch) | commands Codex knows to be read-only (`ls`, `cat`, `grep`, `git status`, ...) run without asking, so ask and deny command rules miss them; no fetch tool, so network rules govern nothing |
//! | OpenCode | `OPENCODE_CONFIG_CONTENT` `permission.bash`/`edit`/`webfetch` = allow/deny, `opencode run` | `opencode run` rejects whatever asks, so any kind that asks or has rules runs `opencode acp` through the ACP bridge with that kind set to `ask` | nothing |
//! | Gemini CLI | `--approval-mode yolo` when everything is allowed; else `default` with `--allowed-tools` for the kinds allowed whole | none: headless Gemini CLI cannot ask | an action that asks or falls under rules is not run (a warning says so) |
//! | acp | the bridge asks the policy for every permission request (`--permissions policy`) | the same | what the agent does without asking (its own modes) |
//! | command | none | none | everything: a warning |
//!
//! Client tools are served by the agent's MCP server `sandhold` (`mcp__sandhold__<name>`):
//! Claude Code through `--mcp-config` (and allowed, so it does not ask for
//! them), Codex `exec` through `-c mcp_servers.sandhold.*`, OpenCode `run`
//! through the config's `mcp`; runs through the ACP bridge get it from the
//! bridge in `session/new` (`--requests` names the dir holding the tools).

use serde_json::{Value, json};
use shared::policy::{Action, Effect, Policy};
use shared::proto::agent::v1 as agent;

use super::HarnessOptions;

/// The agent's own executable in the sandbox, replaced by the agent.
pub const AGENT_PLACEHOLDER: &str = "{{sandhold-agent}}";
/// The run's request dir, replaced by the agent.
pub const REQUESTS_PLACEHOLDER: &str = "{{sandhold-requests}}";
/// The MCP server the agent serves the permission tool and client tools as.
pub const MCP_SERVER: &str = "sandhold";
/// Claude Code's name of the agent's permission tool.
pub const CLAUDE_PERMISSION_TOOL: &str = "mcp__sandhold__permission";
/// How much longer than the policy's request timeout a CLI waits for an MCP
/// tool (the permission tool, a client tool): the agent answers at the
/// deadline, the CLI should not give up first.
const TOOL_TIMEOUT_MARGIN_MS: u64 = 60_000;

/// Whether a run needs the agent's request machinery: a policy that is not
/// allow-everything, or client tools.
pub fn applies(options: &HarnessOptions) -> bool {
    !options.policy.allows_everything() || !options.client_tools.is_empty()
}

/// The `RequestSetup` of a run it [`applies`] to.
pub fn request_setup(options: &HarnessOptions) -> agent::RequestSetup {
    agent::RequestSetup {
        policy_json: serde_json::to_string(&options.policy).expect("a policy serializes"),
        tools: options.client_tools.clone(),
    }
}

/// How long a CLI should wait on one MCP tool call, in milliseconds.
pub fn tool_timeout_ms(policy: &Policy) -> u64 {
    policy.request_timeout_ms().saturating_add(TOOL_TIMEOUT_MARGIN_MS)
}

/// The effect `policy` gives every action of kind `action`, when it does
/// not depend on the subject: no rule of that kind differs from the
/// default, or a catch-all rule (`*`; `**` for file writes) is at least as
/// strong as every other rule of the kind. `None`: it depends on the rules.
/// A policy within bounds (a run's within its definition's) is uniform
/// only where every layer is: then the strictest of them.
pub fn uniform(policy: &Policy, action: Action) -> Option<Effect> {
    let own = uniform_own(policy, action)?;
    policy.bounds.iter().try_fold(own, |acc, b| Some(acc.max(uniform(b, action)?)))
}

fn uniform_own(policy: &Policy, action: Action) -> Option<Effect> {
    let rules: Vec<_> = policy.rules.iter().filter(|r| r.action == action).collect();
    let catch_all = |p: &str| p == "**" || (p == "*" && action != Action::FileWrite);
    let floor = rules.iter().filter(|r| catch_all(r.pattern.trim())).map(|r| r.effect).max();
    match floor {
        Some(f) => rules.iter().all(|r| r.effect <= f).then_some(f),
        None => rules.iter().all(|r| r.effect == policy.default).then_some(policy.default),
    }
}

/// The three kinds of action, in a fixed order.
pub const ACTIONS: [Action; 3] = [Action::Command, Action::FileWrite, Action::Network];

/// What a CLI should do natively with a kind of action: its uniform effect,
/// or ask (the evaluator decides each action).
pub fn native(policy: &Policy, action: Action) -> Effect {
    uniform(policy, action).unwrap_or(Effect::Ask)
}

/// The agent's MCP server as a stdio command line.
pub fn mcp_command() -> (String, Vec<String>) {
    (AGENT_PLACEHOLDER.into(), vec!["mcp".into(), "--requests".into(), REQUESTS_PLACEHOLDER.into()])
}

/// Claude Code's `--mcp-config` value for the agent's MCP server.
pub fn claude_mcp_config() -> String {
    let (command, args) = mcp_command();
    json!({"mcpServers": {MCP_SERVER: {"command": command, "args": args}}}).to_string()
}

/// The argv of the sandbox agent's ACP bridge deciding by the policy, up to
/// and including `--`: the agent's command line follows.
pub fn acp_bridge(session: Option<&str>) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        shared::journal::AGENT_PROGRAM.into(),
        "acp".into(),
        "--permissions".into(),
        "policy".into(),
        "--requests".into(),
        REQUESTS_PLACEHOLDER.into(),
    ];
    if let Some(s) = session {
        argv.push("--session".into());
        argv.push(s.into());
    }
    argv.push("--".into());
    argv
}

/// A warning for a policy a harness cannot apply at all.
pub fn unsupported(harness: &str) -> String {
    format!("the {harness} harness cannot apply a sandbox policy: the command runs with no permission checks")
}

/// Merge `overlay` into `base` (objects key by key, anything else replaced).
pub fn merge_json(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge_json(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::policy::Rule;

    fn rule(action: Action, pattern: &str, effect: Effect) -> Rule {
        Rule { action, pattern: pattern.into(), effect }
    }

    #[test]
    fn uniform_kinds() {
        let mut p = Policy { default: Effect::Allow, ..Default::default() };
        assert_eq!(uniform(&p, Action::Command), Some(Effect::Allow));
        p.rules.push(rule(Action::Command, "git push*", Effect::Deny));
        p.rules.push(rule(Action::FileWrite, "src/**", Effect::Allow));
        assert_eq!(uniform(&p, Action::Command), None);
        assert_eq!(native(&p, Action::Command), Effect::Ask);
        assert_eq!(uniform(&p, Action::FileWrite), Some(Effect::Allow));
        assert_eq!(uniform(&p, Action::Network), Some(Effect::Allow));
        // A catch-all nothing overrides decides the kind.
        p.rules.push(rule(Action::Network, "*", Effect::Deny));
        assert_eq!(uniform(&p, Action::Network), Some(Effect::Deny));
        p.rules.push(rule(Action::Command, "*", Effect::Ask));
        assert_eq!(uniform(&p, Action::Command), None, "the deny rule is stronger");
        // `*` is one path component: not a catch-all for file writes.
        p.rules.push(rule(Action::FileWrite, "*", Effect::Deny));
        assert_eq!(uniform(&p, Action::FileWrite), None);
        p.rules.push(rule(Action::FileWrite, "**", Effect::Deny));
        assert_eq!(uniform(&p, Action::FileWrite), Some(Effect::Deny));
    }

    #[test]
    fn merging_keeps_what_the_overlay_does_not_set() {
        let mut base = json!({"provider": {"a": 1}, "permission": {"bash": "allow", "read": "allow"}});
        merge_json(&mut base, json!({"permission": {"bash": "ask"}, "mcp": {}}));
        assert_eq!(
            base,
            json!({"provider": {"a": 1}, "permission": {"bash": "ask", "read": "allow"}, "mcp": {}})
        );
    }

    #[test]
    fn request_setup_carries_the_policy_and_tools() {
        let options = HarnessOptions {
            policy: Policy { default: Effect::Ask, ..Default::default() },
            client_tools: vec![agent::ClientTool { name: "lookup".into(), ..Default::default() }],
            ..Default::default()
        };
        assert!(applies(&options));
        let setup = request_setup(&options);
        assert_eq!(Policy::from_json(&setup.policy_json).unwrap(), options.policy);
        assert_eq!(setup.tools[0].name, "lookup");
        assert!(!applies(&HarnessOptions::default()));
        assert_eq!(
            claude_mcp_config(),
            r#"{"mcpServers":{"sandhold":{"args":["mcp","--requests","{{sandhold-requests}}"],"command":"{{sandhold-agent}}"}}}"#
        );
    }

    #[test]
    fn a_run_policy_that_allows_everything_within_one_that_denies_commands_denies_them() {
        let definition = Policy {
            rules: vec![Rule { action: Action::Command, pattern: "*".into(), effect: Effect::Deny }],
            ..Default::default()
        };
        let run = Policy::default().within(&definition);
        assert_eq!(uniform(&run, Action::Command), Some(Effect::Deny));
        assert_eq!(uniform(&run, Action::FileWrite), Some(Effect::Allow));
        let asks = Policy {
            rules: vec![Rule { action: Action::Command, pattern: "git *".into(), effect: Effect::Ask }],
            ..Default::default()
        };
        // One layer depends on the command: each command must reach the evaluator.
        assert_eq!(uniform(&asks.within(&Policy::default()), Action::Command), None);
        assert_eq!(native(&Policy::default().within(&asks), Action::Command), Effect::Ask);
    }
}
