//! The sandbox policy: what a harness may do without asking.
//!
//! A [`Policy`] is a default [`Effect`] plus rules over three kinds of action
//! (commands, file writes, network hosts), each a glob with an effect. Of the
//! rules that match an action the strongest wins (deny > ask > allow); when
//! none matches, the default applies. Read-only tools (reads, searches, todo
//! lists) are never governed. The same evaluation runs in the control plane
//! (to map a policy onto each CLI's own permission settings) and in the
//! sandbox agent (the permission tool and the ACP bridge decide by it), so a
//! rule a CLI cannot express natively is still enforced where the CLI asks.
//!
//! The JSON form (the agent's `policy.json`, `sandhold run --policy FILE`):
//! `{"default":"ask","rules":[{"action":"command","pattern":"git push*","effect":"deny"}],
//! "request_timeout_ms":600000}`.

use std::fmt;

use globset::{GlobBuilder, GlobMatcher};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How long a request waits for its answer unless the policy says otherwise.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// What happens to an action. Ordered by strength: `Deny` beats `Ask` beats
/// `Allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    #[default]
    Allow,
    Ask,
    Deny,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Allow => "allow",
            Effect::Ask => "ask",
            Effect::Deny => "deny",
        }
    }

    pub fn parse(s: &str) -> Result<Self, PolicyError> {
        match s {
            "allow" => Ok(Effect::Allow),
            "ask" => Ok(Effect::Ask),
            "deny" => Ok(Effect::Deny),
            other => Err(PolicyError(format!("unknown effect {other:?}: expected allow, ask or deny"))),
        }
    }
}

/// What a rule is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A shell command; the pattern is a glob over the whole command line
    /// (`*` crosses spaces and slashes).
    Command,
    /// Writing, editing or deleting a file; the pattern is a glob over the
    /// path relative to the working directory (`*` stays within one
    /// component, `**` crosses them).
    FileWrite,
    /// A connection to a host (a URL a tool fetches); the pattern is a glob
    /// over the host name.
    Network,
    /// An HTTP request leaving a sandbox through its egress proxy: the
    /// subject is `METHOD host:port/path` ([`request_subject`]), the
    /// pattern a glob over it ([`request_pattern`]); `*` stays within one
    /// path segment, `**` crosses them.
    Request,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Command => "command",
            Action::FileWrite => "file_write",
            Action::Network => "network",
            Action::Request => "request",
        }
    }

    pub fn parse(s: &str) -> Result<Self, PolicyError> {
        match s {
            "command" | "cmd" | "bash" => Ok(Action::Command),
            "file_write" | "write" | "file" => Ok(Action::FileWrite),
            "network" | "net" | "host" => Ok(Action::Network),
            other => {
                Err(PolicyError(format!("unknown action {other:?}: expected command, file_write or network")))
            }
        }
    }
}

/// One rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub action: Action,
    pub pattern: String,
    pub effect: Effect,
}

impl Rule {
    /// A rule from the CLI's `--allow/--ask/--deny PATTERN`: `PATTERN` is
    /// `[command:|write:|network:]GLOB`, a command without a prefix.
    pub fn from_flag(effect: Effect, flag: &str) -> Result<Self, PolicyError> {
        let (action, pattern) = match flag.split_once(':') {
            Some((prefix, rest)) if Action::parse(prefix).is_ok() => (Action::parse(prefix)?, rest),
            _ => (Action::Command, flag),
        };
        let rule = Rule { action, pattern: pattern.to_string(), effect };
        rule.matcher()?;
        Ok(rule)
    }

    fn matcher(&self) -> Result<GlobMatcher, PolicyError> {
        if self.pattern.is_empty() {
            return Err(PolicyError(format!("the {} rule has an empty pattern", self.action.as_str())));
        }
        if self.pattern.len() > MAX_PATTERN {
            return Err(PolicyError(format!("a pattern is longer than {MAX_PATTERN} bytes")));
        }
        GlobBuilder::new(&self.pattern)
            .literal_separator(matches!(self.action, Action::FileWrite | Action::Request))
            .case_insensitive(self.action == Action::Network)
            .backslash_escape(true)
            .build()
            .map(|g| g.compile_matcher())
            .map_err(|e| PolicyError(format!("bad pattern {:?}: {e}", self.pattern)))
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{}", self.effect.as_str(), self.action.as_str(), self.pattern)
    }
}

/// Longest pattern accepted.
pub const MAX_PATTERN: usize = 1024;
/// Most rules in one policy.
pub const MAX_RULES: usize = 256;

/// A bad policy: the message says what and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

/// A sandbox policy. The empty policy allows everything (what every harness
/// did before policies).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    #[serde(default)]
    pub default: Effect,
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// How long a request waits before it is denied. Unset: 10 minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// Policies this one stays within (a run's policy within its
    /// definition's): each decision is the strictest of this policy's and
    /// theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bounds: Vec<Policy>,
}

/// The outcome of [`Policy::decide`]: the effect and what decided it
/// (`"default"` or a rule's text), for the request's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub effect: Effect,
    pub rule: String,
}

impl Policy {
    /// Parse and check the JSON form.
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        let policy: Policy =
            serde_json::from_str(text).map_err(|e| PolicyError(format!("bad policy: {e}")))?;
        policy.validate()?;
        Ok(policy)
    }

    /// Every pattern compiles and the bounds hold.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.rules.len() > MAX_RULES {
            return Err(PolicyError(format!("a policy has at most {MAX_RULES} rules")));
        }
        if self.request_timeout_ms == Some(0) {
            return Err(PolicyError("request_timeout_ms must be positive".into()));
        }
        for r in &self.rules {
            r.matcher()?;
        }
        self.bounds.iter().try_for_each(Policy::validate)
    }

    /// True when nothing can ask or be denied: the policy of a run without
    /// one.
    pub fn allows_everything(&self) -> bool {
        self.default == Effect::Allow
            && self.rules.iter().all(|r| r.effect == Effect::Allow)
            && self.bounds.iter().all(Policy::allows_everything)
    }

    /// True when some action may need an answer.
    pub fn can_ask(&self) -> bool {
        self.default == Effect::Ask
            || self.rules.iter().any(|r| r.effect == Effect::Ask)
            || self.bounds.iter().any(Policy::can_ask)
    }

    /// This policy (a run's) within `outer` (its definition's): for every
    /// action the stricter of the two decisions. Rules can loosen a default,
    /// so no flat rule list says the same in general: the outer policy is
    /// kept as a bound that [`decide`](Self::decide) also consults. The
    /// timeout is the shorter.
    pub fn within(&self, outer: &Policy) -> Policy {
        let mut merged = self.clone();
        merged.bounds.push(outer.clone());
        merged.request_timeout_ms = match (self.request_timeout_ms, outer.request_timeout_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        merged
    }

    /// Every rule of this policy and of its bounds, and the strictest
    /// default: what a CLI's native settings can be given. Exact without
    /// bounds; with them, [`decide`](Self::decide) is the authority.
    pub fn flattened(&self) -> (Effect, Vec<Rule>) {
        let mut default = self.default;
        let mut rules = self.rules.clone();
        for b in &self.bounds {
            let (d, r) = b.flattened();
            default = default.max(d);
            rules.extend(r);
        }
        (default, rules)
    }

    /// The directories whose every write is denied (`file_write` deny
    /// rules of the form `DIR/**` with a literal `DIR`, here and in the
    /// bounds), as written: relative to the working directory unless
    /// absolute. What the sandbox agent also has the kernel enforce.
    pub fn denied_dirs(&self) -> Vec<String> {
        let (_, rules) = self.flattened();
        let mut dirs: Vec<String> = rules
            .iter()
            .filter(|r| r.action == Action::FileWrite && r.effect == Effect::Deny)
            .filter_map(|r| r.pattern.trim().strip_suffix("/**"))
            .map(|dir| dir.trim_end_matches('/'))
            .filter(|dir| !dir.is_empty() && !dir.contains(['*', '?', '[', ']', '{', '}', '\\']))
            .map(str::to_string)
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }

    pub fn request_timeout_ms(&self) -> u64 {
        self.request_timeout_ms.unwrap_or(DEFAULT_REQUEST_TIMEOUT_MS)
    }

    /// The effect for `action` on `subject`: the strongest matching rule,
    /// else the default. A rule whose pattern does not compile (impossible
    /// after [`validate`](Self::validate)) matches everything, so a broken
    /// deny still denies.
    pub fn decide(&self, action: Action, subject: &str) -> Decision {
        let own = self.decide_own(action, subject);
        self.bounds
            .iter()
            .map(|b| b.decide(action, subject))
            .fold(own, |a, b| if b.effect > a.effect { b } else { a })
    }

    fn decide_own(&self, action: Action, subject: &str) -> Decision {
        let subject = subject.trim();
        let mut best: Option<&Rule> = None;
        for r in self.rules.iter().filter(|r| r.action == action) {
            let hit = match r.matcher() {
                Ok(m) => {
                    m.is_match(subject) || (action == Action::FileWrite && m.is_match(relative(subject)))
                }
                Err(_) => true,
            };
            if hit && best.is_none_or(|b| r.effect > b.effect) {
                best = Some(r);
            }
        }
        match best {
            Some(r) => Decision { effect: r.effect, rule: r.to_string() },
            None => Decision { effect: self.default, rule: "default".into() },
        }
    }

    /// The effect for a tool call a CLI wants to make: read-only tools are
    /// allowed, governed actions go by [`decide`](Self::decide), and any
    /// other tool gets the default.
    pub fn decide_tool(&self, tool: &str, input: &Value) -> Decision {
        match classify(tool, input) {
            Classified::ReadOnly => Decision { effect: Effect::Allow, rule: "read-only".into() },
            Classified::Action(action, subject) => self.decide(action, &subject),
            Classified::Other => Decision { effect: self.default, rule: "default".into() },
        }
    }
}

fn relative(path: &str) -> &str {
    path.trim_start_matches("./")
}

/// What a tool call is, for the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classified {
    /// Reads, searches, plans: never governed.
    ReadOnly,
    /// A governed action on a subject (command line, path, host).
    Action(Action, String),
    /// Anything else: the default applies.
    Other,
}

/// Classify a CLI's tool call by its name and input. Knows Claude Code's
/// tools (`Bash`, `Write`, `Edit`, `WebFetch`, ...), OpenCode's (`bash`,
/// `edit`, `write`, `webfetch`), Codex's (`shell`, `apply_patch`) and ACP's
/// tool kinds (`execute`, `edit`, `delete`, `move`, `fetch`, `read`,
/// `search`, `think`).
pub fn classify(tool: &str, input: &Value) -> Classified {
    let name = tool.to_ascii_lowercase();
    let name = name.rsplit("__").next().unwrap_or(&name);
    let field = |keys: &[&str]| keys.iter().find_map(|k| text_of(input.get(*k)));
    match name {
        "read" | "glob" | "grep" | "ls" | "list" | "todowrite" | "todoread" | "task" | "exitplanmode"
        | "bashoutput" | "notebookread" | "search" | "think" | "websearch" | "view" | "codesearch" => {
            Classified::ReadOnly
        }
        "bash" | "shell" | "execute" | "exec" | "exec_command" | "local_shell" | "command"
        | "run_shell_command" => match field(&["command", "cmd", "commandLine"]) {
            Some(c) => Classified::Action(Action::Command, c),
            None => Classified::Action(Action::Command, String::new()),
        },
        "write" | "edit" | "multiedit" | "notebookedit" | "patch" | "apply_patch" | "delete" | "move"
        | "write_file" | "replace" => {
            match field(&["file_path", "filePath", "path", "notebook_path", "absolute_path"]) {
                Some(p) => Classified::Action(Action::FileWrite, p),
                None => Classified::Action(Action::FileWrite, String::new()),
            }
        }
        "webfetch" | "fetch" | "web_fetch" => match field(&["url", "uri"]) {
            Some(u) => Classified::Action(Action::Network, host_of(&u)),
            None => Classified::Action(Action::Network, String::new()),
        },
        _ => Classified::Other,
    }
}

/// A string field, or an argv array joined with spaces.
fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => {
            let parts: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            (!parts.is_empty()).then(|| shell_words(&parts))
        }
        _ => None,
    }
}

/// An argv as the command line a pattern sees: `sh -c SCRIPT` is `SCRIPT`
/// (how Codex and ACP agents report shell commands).
fn shell_words(parts: &[&str]) -> String {
    match parts {
        [sh, flag, script] if matches!(*flag, "-c" | "-lc") && sh.ends_with("sh") => script.to_string(),
        _ => parts.join(" "),
    }
}

/// The host of a URL (or the text itself when it is not one).
pub fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or(v6)
    } else {
        authority.split(':').next().unwrap_or(authority)
    };
    host.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(default: Effect, rules: &[(Action, &str, Effect)]) -> Policy {
        Policy {
            default,
            rules: rules
                .iter()
                .map(|(a, p, e)| Rule { action: *a, pattern: p.to_string(), effect: *e })
                .collect(),
            request_timeout_ms: None,
            bounds: Vec::new(),
        }
    }

    #[test]
    fn deny_beats_ask_beats_allow_whatever_the_order() {
        let p = policy(
            Effect::Allow,
            &[
                (Action::Command, "git *", Effect::Allow),
                (Action::Command, "git push*", Effect::Deny),
                (Action::Command, "git p*", Effect::Ask),
            ],
        );
        assert_eq!(p.decide(Action::Command, "git push origin main").effect, Effect::Deny);
        assert_eq!(p.decide(Action::Command, "git push origin main").rule, "deny command:git push*");
        assert_eq!(p.decide(Action::Command, "git pull").effect, Effect::Ask);
        assert_eq!(p.decide(Action::Command, "git status").effect, Effect::Allow);
    }

    #[test]
    fn the_default_applies_when_no_rule_matches() {
        let p = policy(Effect::Ask, &[(Action::Command, "ls*", Effect::Allow)]);
        let d = p.decide(Action::Command, "rm -rf /");
        assert_eq!((d.effect, d.rule.as_str()), (Effect::Ask, "default"));
        // Rules of another action do not apply.
        let p = policy(Effect::Allow, &[(Action::FileWrite, "*", Effect::Deny)]);
        assert_eq!(p.decide(Action::Command, "echo").effect, Effect::Allow);
    }

    #[test]
    fn command_globs_cross_spaces_and_slashes_path_globs_do_not() {
        let p = policy(
            Effect::Allow,
            &[(Action::Command, "*rm *", Effect::Deny), (Action::FileWrite, "src/*.rs", Effect::Ask)],
        );
        assert_eq!(p.decide(Action::Command, "cd /tmp && rm -rf /x").effect, Effect::Deny);
        assert_eq!(p.decide(Action::FileWrite, "src/main.rs").effect, Effect::Ask);
        assert_eq!(p.decide(Action::FileWrite, "./src/main.rs").effect, Effect::Ask);
        assert_eq!(p.decide(Action::FileWrite, "src/deep/main.rs").effect, Effect::Allow);
        let p = policy(Effect::Allow, &[(Action::FileWrite, "src/**", Effect::Deny)]);
        assert_eq!(p.decide(Action::FileWrite, "src/deep/main.rs").effect, Effect::Deny);
        assert_eq!(p.denied_dirs(), vec!["src".to_string()]);
        let loose = policy(
            Effect::Allow,
            &[
                (Action::FileWrite, "docs/**", Effect::Ask),
                (Action::FileWrite, "**/.env", Effect::Deny),
                (Action::FileWrite, "src/*/gen/**", Effect::Deny),
                (Action::Command, "git/**", Effect::Deny),
                (Action::FileWrite, "/etc/**", Effect::Deny),
            ],
        );
        let bounded = p.within(&loose);
        assert_eq!(bounded.denied_dirs(), vec!["/etc".to_string(), "src".to_string()]);
    }

    #[test]
    fn network_rules_match_hosts_case_insensitively() {
        let p = policy(Effect::Deny, &[(Action::Network, "*.example.com", Effect::Allow)]);
        let d = p.decide_tool("WebFetch", &json!({"url": "https://API.Example.com:8443/x?y"}));
        assert_eq!(d.effect, Effect::Allow);
        assert_eq!(p.decide_tool("WebFetch", &json!({"url": "https://evil.test/"})).effect, Effect::Deny);
    }

    #[test]
    fn tool_calls_of_each_cli_are_classified() {
        let p = policy(
            Effect::Ask,
            &[(Action::Command, "echo *", Effect::Deny), (Action::FileWrite, "*.md", Effect::Allow)],
        );
        // Claude Code
        assert_eq!(p.decide_tool("Bash", &json!({"command": "echo hi > f"})).effect, Effect::Deny);
        assert_eq!(p.decide_tool("Write", &json!({"file_path": "README.md"})).effect, Effect::Allow);
        assert_eq!(p.decide_tool("Read", &json!({"file_path": "x"})).effect, Effect::Allow);
        // Codex / ACP: argv arrays, `sh -c` unwrapped
        assert_eq!(
            p.decide_tool("shell", &json!({"command": ["bash", "-lc", "echo hi"]})).effect,
            Effect::Deny
        );
        assert_eq!(p.decide_tool("execute", &json!({"command": ["ls", "-la"]})).effect, Effect::Ask);
        // OpenCode
        assert_eq!(p.decide_tool("edit", &json!({"filePath": "notes.md"})).effect, Effect::Allow);
        // Another tool gets the default; MCP prefixes are ignored for the name.
        assert_eq!(p.decide_tool("mcp__srv__frobnicate", &json!({})).effect, Effect::Ask);
    }

    #[test]
    fn a_run_policy_within_its_definition_is_the_stricter_of_the_two_everywhere() {
        // Every pair of small policies over two overlapping patterns, on
        // subjects hitting neither, one or both.
        let effects = [Effect::Allow, Effect::Ask, Effect::Deny];
        let patterns = ["git *", "git push*"];
        let mut policies = Vec::new();
        for default in effects {
            policies.push(policy(default, &[]));
            for (i, p) in patterns.iter().enumerate() {
                for e in effects {
                    policies.push(policy(default, &[(Action::Command, p, e)]));
                    // Two rules: the narrower pattern second, either way.
                    for e2 in effects.into_iter().filter(|_| i == 0) {
                        let other = patterns[1 - i];
                        policies
                            .push(policy(default, &[(Action::Command, p, e), (Action::Command, other, e2)]));
                    }
                }
            }
        }
        for run in &policies {
            for def in &policies {
                let merged = run.within(def);
                for subject in ["ls", "git status", "git push origin"] {
                    let want = run
                        .decide(Action::Command, subject)
                        .effect
                        .max(def.decide(Action::Command, subject).effect);
                    let got = merged.decide(Action::Command, subject).effect;
                    assert_eq!(got, want, "run {run:?} within {def:?} on {subject:?}");
                }
            }
        }
    }

    #[test]
    fn flags_parse_with_and_without_a_prefix() {
        assert_eq!(
            Rule::from_flag(Effect::Deny, "rm *").unwrap(),
            Rule { action: Action::Command, pattern: "rm *".into(), effect: Effect::Deny }
        );
        assert_eq!(Rule::from_flag(Effect::Ask, "write:src/**").unwrap().action, Action::FileWrite);
        assert_eq!(Rule::from_flag(Effect::Allow, "network:*.github.com").unwrap().action, Action::Network);
        // A colon in a command is part of the command.
        assert_eq!(Rule::from_flag(Effect::Ask, "echo a:b").unwrap().pattern, "echo a:b");
        assert!(Rule::from_flag(Effect::Ask, "command:").is_err());
        assert!(Rule::from_flag(Effect::Ask, "write:[").is_err());
    }

    #[test]
    fn the_json_form_round_trips_and_bad_input_is_named() {
        let text = r#"{"default":"ask","rules":[{"action":"command","pattern":"git push*","effect":"deny"}],"request_timeout_ms":5000}"#;
        let p = Policy::from_json(text).unwrap();
        assert_eq!(p.request_timeout_ms(), 5000);
        assert!(p.can_ask());
        assert_eq!(Policy::from_json(&serde_json::to_string(&p).unwrap()).unwrap(), p);
        let e = Policy::from_json(r#"{"default":"maybe"}"#).unwrap_err();
        assert!(e.0.contains("maybe"), "{e}");
        assert!(
            Policy::from_json(r#"{"rules":[{"action":"command","pattern":"[","effect":"deny"}]}"#).is_err()
        );
        assert!(Policy::default().allows_everything());
        assert_eq!(Policy::default().request_timeout_ms(), DEFAULT_REQUEST_TIMEOUT_MS);
    }
}
