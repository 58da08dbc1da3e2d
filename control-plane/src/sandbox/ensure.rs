//! What an ensure is asked for, checked against the tenant's stored
//! definition: exactly the secrets it declares, under valid names.

use std::collections::HashMap;

use shared::error::Error;
use shared::secret::Secret;

use super::EnsureInput;
use super::definition;
use crate::provision::{Secrets, valid_env_name};
use crate::store::{self, Stores, Tenant};

/// Secret values by name from a request, checked to be valid names.
pub fn secrets_of(field: &str, raw: HashMap<String, String>) -> Result<Secrets, Error> {
    let mut out = Secrets::new();
    for (name, value) in raw {
        if !valid_env_name(&name) {
            return Err(Error::invalid_field(format!("{field}[{name}]"), "not a valid variable name"));
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
    let stored = stores.definitions.get(&tenant, required("definition_id", definition_id)?).await.map_err(
        |e| match e {
            store::Error::NotFound(_) => Error::not_found(format!("definition {definition_id} not found")),
            other => other.into(),
        },
    )?;
    let definition = definition::from_stored(&stored.body)?;
    let secrets = secrets_of("secrets", secrets)?;
    for name in secrets.keys() {
        if !definition.secret_names.contains(name) {
            return Err(Error::invalid_field(
                format!("secrets[{name}]"),
                "not a secret name the definition declares",
            ));
        }
    }
    if let Some(missing) = definition.secret_names.iter().find(|n| !secrets.contains_key(*n)) {
        return Err(Error::invalid_field(
            format!("secrets[{missing}]"),
            "declared by the definition, not given",
        ));
    }
    Ok(EnsureInput { tenant, definition, thread_id, run_id, secrets })
}

pub fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Error> {
    if value.is_empty() { Err(Error::invalid_field(field, "required")) } else { Ok(value) }
}
