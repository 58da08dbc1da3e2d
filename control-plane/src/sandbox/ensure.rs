//! What an ensure is asked for, checked against the tenant's stored
//! definition: exactly the secrets it declares, under valid names.

use std::collections::HashMap;

use shared::secret::Secret;

use super::definition;
use super::{EnsureInput, Error};
use crate::provision::{InvalidField, Secrets, valid_env_name};
use crate::store::{self, Stores, Tenant};

/// Secret values by name from a request, checked to be valid names and
/// values long enough to be masked (`shared::mask::MIN_SECRET_LEN`).
pub fn secrets_of(field: &str, raw: HashMap<String, String>) -> Result<Secrets, Error> {
    let mut out = Secrets::new();
    for (name, value) in raw {
        if !valid_env_name(&name) {
            return Err(InvalidField::new(format!("{field}[{name}]"), "not a valid variable name").into());
        }
        if let Some(why) = shared::mask::refusal(&value) {
            return Err(InvalidField::new(format!("{field}[{name}]"), why).into());
        }
        out.insert(name, Secret::new(value));
    }
    Ok(out)
}

/// Validate what an ensure is asked for: the tenant's stored definition and
/// exactly the secrets it declares.
pub async fn ensure_input(
    stores: &Stores,
    tenant: Tenant,
    definition_id: &str,
    thread_id: String,
    run_id: String,
    secrets: HashMap<String, String>,
) -> Result<EnsureInput, Error> {
    let stored = stores
        .definitions
        .get(&tenant, InvalidField::required("definition_id", definition_id)?)
        .await
        .map_err(|e| match e {
            store::Error::NotFound(_) => Error::DefinitionNotFound(definition_id.to_string()),
            other => other.into(),
        })?;
    let definition = definition::from_stored(&stored.body)?;
    let secrets = secrets_of("secrets", secrets)?;
    check_declared(&definition.secret_names, &secrets)?;
    Ok(EnsureInput { tenant, definition, thread_id, run_id, secrets })
}

/// Exactly the secrets the definition declares (`declared`): none other,
/// none missing.
fn check_declared(declared: &[String], secrets: &Secrets) -> Result<(), Error> {
    if let Some(name) = secrets.keys().find(|name| !declared.contains(name)) {
        return Err(InvalidField::new(
            format!("secrets[{name}]"),
            "not a secret name the definition declares",
        )
        .into());
    }
    if let Some(missing) = declared.iter().find(|n| !secrets.contains_key(*n)) {
        return Err(InvalidField::new(
            format!("secrets[{missing}]"),
            "declared by the definition, not given",
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: Error) -> String {
        match e {
            Error::InvalidField(e) => e.field,
            other => panic!("not a field error: {other:?}"),
        }
    }

    fn raw(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn secret_names_must_be_variable_names() {
        let secrets = secrets_of("secrets", raw(&[("TOKEN", "value-one"), ("_ok2", "value-two")])).unwrap();
        assert_eq!(secrets.keys().collect::<Vec<_>>(), ["TOKEN", "_ok2"]);
        assert_eq!(secrets["TOKEN"].expose(), "value-one");
        let bad = secrets_of("secrets", raw(&[("2FA", "value-one")])).unwrap_err();
        assert_eq!(field_of(bad), "secrets[2FA]");
    }

    #[test]
    fn a_value_too_short_to_mask_is_refused_with_the_reason() {
        let err = secrets_of("secrets", raw(&[("PIN", "1234567")])).unwrap_err();
        let Error::InvalidField(e) = err else { panic!("not a field error") };
        assert_eq!(e.field, "secrets[PIN]");
        assert!(e.reason.contains("at least 8 bytes"), "{}", e.reason);
        assert!(!e.reason.contains("1234567"), "the value is never echoed");
        secrets_of("secrets", raw(&[("PIN", "12345678")])).unwrap();
    }

    #[test]
    fn an_ensure_brings_exactly_the_declared_secrets() {
        let declared = ["A".to_string(), "B".to_string()];
        let both = secrets_of("secrets", raw(&[("A", "value-a-1"), ("B", "value-b-2")])).unwrap();
        check_declared(&declared, &both).unwrap();
        let extra = secrets_of("secrets", raw(&[("A", "value-a-1"), ("B", "value-b-2"), ("C", "value-c-3")]))
            .unwrap();
        assert_eq!(field_of(check_declared(&declared, &extra).unwrap_err()), "secrets[C]");
        let short = secrets_of("secrets", raw(&[("A", "value-a-1")])).unwrap();
        assert_eq!(field_of(check_declared(&declared, &short).unwrap_err()), "secrets[B]");
    }
}
