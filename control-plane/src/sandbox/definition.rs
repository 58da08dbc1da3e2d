//! Sandbox definitions: validation and their stored form.
//!
//! Stored as JSON `{"encoding": "protobuf-hex", "definition": "<hex>"}`: the
//! protobuf bytes of the `SandboxDefinition` (lossless, and newer fields
//! survive an older server). A definition holds secret NAMES only; no
//! request's secret values ever reach this module.

use super::Error;
use crate::provision::{Violations, refuse, valid_env_name};
use shared::proto::v1::{SandboxDefinition, setup_step};

use crate::provider::ProviderKind;

const ENCODING: &str = "protobuf-hex";

pub fn to_stored(definition: &SandboxDefinition) -> serde_json::Value {
    use prost::Message;
    serde_json::json!({ "encoding": ENCODING, "definition": hex::encode(definition.encode_to_vec()) })
}

pub fn from_stored(body: &serde_json::Value) -> Result<SandboxDefinition, Error> {
    use prost::Message;
    let corrupt = Error::CorruptDefinition;
    if body.get("encoding").and_then(|e| e.as_str()) != Some(ENCODING) {
        return Err(corrupt("unknown encoding"));
    }
    let hex_str = body.get("definition").and_then(|d| d.as_str()).ok_or_else(|| corrupt("no definition"))?;
    let bytes = hex::decode(hex_str).map_err(|_| corrupt("not hex"))?;
    SandboxDefinition::decode(bytes.as_slice()).map_err(|_| corrupt("not a SandboxDefinition"))
}

/// What the server settles in a definition before storing it, so every
/// client gets the same: which secret is each harness's model key
/// ([`crate::egress::settle_model_keys`]), and, for a definition sent with
/// no id, an id derived from its content (`def-` and 16 hex digits): the
/// same content is the same definition, and so the same sandbox for a
/// thread.
pub fn settle(d: &mut SandboxDefinition) -> Result<(), Violations> {
    let violations = crate::egress::settle_model_keys(d);
    refuse("sandbox definition", violations)?;
    if d.id.is_empty() {
        use prost::Message;
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(d.encode_to_vec());
        d.id = format!("{}{}", crate::store::DERIVED_PREFIX, &hex::encode(digest)[..16]);
    }
    Ok(())
}

fn valid_id(id: &str) -> bool {
    (1..=100).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Every problem of `d` as field violations, in one INVALID_ARGUMENT.
pub fn validate(d: &SandboxDefinition) -> Result<(), Violations> {
    let mut violations: Vec<(String, String)> = Vec::new();
    let mut bad = |field: &str, why: &str| violations.push((field.to_string(), why.to_string()));
    if !valid_id(&d.id) {
        bad("definition.id", "must be 1-100 characters of [A-Za-z0-9._-]");
    }
    match d.provider.as_ref().and_then(|p| p.provider.as_ref()) {
        None => bad("definition.provider", &format!("required: {}", ProviderKind::choices())),
        Some(section) => match ProviderKind::reading(section) {
            Some(kind) => {
                let mut own = Vec::new();
                kind.kind().validate(section, &mut own);
                own.iter().for_each(|(field, why)| bad(field, why));
            }
            None => bad("definition.provider", &format!("unknown: {}", ProviderKind::choices())),
        },
    }
    let mut placement = Vec::new();
    super::placement::violations(d, &mut placement);
    placement.iter().for_each(|(field, why)| bad(field, why));
    if d.max_journal_bytes == Some(0) {
        bad("definition.max_journal_bytes", "must be positive (unset: the operator's default, 1 GiB)");
    }
    if let Some(p) = &d.policy
        && let Err(e) = super::policy_from_api(p, "definition.policy")
    {
        bad(&e.field, &e.reason);
    }
    for name in d.env.keys() {
        if !valid_env_name(name) {
            bad(&format!("definition.env[{name}]"), "not a valid variable name");
        }
    }
    for (i, name) in d.secret_names.iter().enumerate() {
        if !valid_env_name(name) {
            bad(&format!("definition.secret_names[{i}]"), "not a valid variable name");
        }
        if d.env.contains_key(name) {
            // A secret's value must come with a request, never sit in the
            // stored definition.
            bad(
                &format!("definition.env[{name}]"),
                "is a declared secret name; pass its value with EnsureSandbox",
            );
        }
    }
    if let Some(w) = &d.workspace {
        for (i, step) in w.setup.iter().enumerate() {
            let ok = match &step.step {
                Some(setup_step::Step::Serial(cmd)) => !cmd.trim().is_empty(),
                Some(setup_step::Step::Parallel(g)) => {
                    !g.commands.is_empty() && g.commands.iter().all(|c| !c.trim().is_empty())
                }
                None => false,
            };
            if !ok {
                bad(&format!("definition.workspace.setup[{i}]"), "empty setup step");
            }
        }
    }
    if let Some(w) = &d.workspace {
        violations.extend(crate::workspace::violations(w, Some(&d.secret_names), "definition.workspace"));
    }
    refuse("sandbox definition", violations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::error::ErrorCode;
    use shared::proto::v1::{DockerProvider, ProviderSpec, provider_spec};

    fn docker(image: &str) -> SandboxDefinition {
        SandboxDefinition {
            id: "d-1".into(),
            provider: Some(ProviderSpec {
                provider: Some(provider_spec::Provider::Docker(DockerProvider {
                    image: image.into(),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn stored_form_round_trips() {
        let d = docker("busybox");
        assert_eq!(from_stored(&to_stored(&d)).unwrap(), d);
    }

    #[test]
    fn every_problem_is_a_field_violation() {
        let mut d = docker("");
        d.id = "bad id".into();
        d.secret_names = vec!["TOKEN".into()];
        d.env.insert("TOKEN".into(), "oops".into());
        let err = shared::error::Error::from(validate(&d).unwrap_err());
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        let fields: Vec<&str> = err.field_violations.iter().map(|(f, _)| f.as_str()).collect();
        assert!(fields.contains(&"definition.id"), "{fields:?}");
        assert!(fields.contains(&"definition.provider.docker.image"), "{fields:?}");
        assert!(fields.contains(&"definition.env[TOKEN]"), "{fields:?}");
        assert!(validate(&docker("busybox")).is_ok());
    }
}
