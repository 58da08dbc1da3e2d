//! A definition's (or a run's) policy in the API's form and in the form
//! the harness adapters and the sandbox agent decide by
//! (`shared::policy`).

use shared::policy::{Action, Effect, Policy, Rule};
use shared::proto::v1 as api;

use crate::provision::InvalidField;

/// The shared policy of an API policy; `field` names it in errors.
pub fn policy_from_api(p: &api::SandboxPolicy, field: &str) -> Result<Policy, InvalidField> {
    let effect = |e: i32, what: &str| match api::PolicyEffect::try_from(e) {
        Ok(api::PolicyEffect::Unspecified | api::PolicyEffect::Allow) => Ok(Effect::Allow),
        Ok(api::PolicyEffect::Ask) => Ok(Effect::Ask),
        Ok(api::PolicyEffect::Deny) => Ok(Effect::Deny),
        Err(_) => Err(InvalidField::new(what.to_string(), format!("unknown effect {e}"))),
    };
    let mut rules = Vec::with_capacity(p.rules.len());
    for (i, r) in p.rules.iter().enumerate() {
        let at = format!("{field}.rules[{i}]");
        let action = match api::PolicyAction::try_from(r.action) {
            Ok(api::PolicyAction::Command) => Action::Command,
            Ok(api::PolicyAction::FileWrite) => Action::FileWrite,
            Ok(api::PolicyAction::Network) => Action::Network,
            _ => return Err(InvalidField::new(format!("{at}.action"), "command, file_write or network")),
        };
        let effect = match r.effect {
            0 => return Err(InvalidField::new(format!("{at}.effect"), "allow, ask or deny")),
            e => effect(e, &format!("{at}.effect"))?,
        };
        rules.push(Rule { action, pattern: r.pattern.clone(), effect });
    }
    let policy = Policy {
        default: effect(p.default, &format!("{field}.default"))?,
        rules,
        request_timeout_ms: (p.request_timeout_ms > 0).then_some(p.request_timeout_ms),
        bounds: Vec::new(),
    };
    policy.validate().map_err(|e| InvalidField::new(field.to_string(), e.0))?;
    Ok(policy)
}

/// The API form of a shared policy (without bounds), for the CLI.
pub fn policy_to_api(p: &Policy) -> api::SandboxPolicy {
    let effect = |e: Effect| match e {
        Effect::Allow => api::PolicyEffect::Allow,
        Effect::Ask => api::PolicyEffect::Ask,
        Effect::Deny => api::PolicyEffect::Deny,
    } as i32;
    api::SandboxPolicy {
        default: effect(p.default),
        rules: p
            .rules
            .iter()
            .map(|r| api::PolicyRule {
                action: match r.action {
                    Action::Command => api::PolicyAction::Command,
                    Action::FileWrite => api::PolicyAction::FileWrite,
                    Action::Network | Action::Request => api::PolicyAction::Network,
                } as i32,
                pattern: r.pattern.clone(),
                effect: effect(r.effect),
            })
            .collect(),
        request_timeout_ms: p.request_timeout_ms.unwrap_or(0),
    }
}
