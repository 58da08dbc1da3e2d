//! Which JavaScript package manager a workspace uses, from its lockfiles.

use super::remote::Remote;
use crate::provision::Error;

/// Lockfiles in order of precedence, and the manager each means.
const LOCKFILES: [(&str, &str); 6] = [
    ("pnpm-lock.yaml", "pnpm"),
    ("yarn.lock", "yarn"),
    ("bun.lock", "bun"),
    ("bun.lockb", "bun"),
    ("package-lock.json", "npm"),
    ("npm-shrinkwrap.json", "npm"),
];

/// The variable setup sees it in.
pub(crate) const VARIABLE: &str = "SANDHOLD_PACKAGE_MANAGER";

/// The definition's choice, else the first lockfile found at the root.
pub(crate) async fn detect(remote: &Remote<'_>, declared: &str) -> Result<Option<String>, Error> {
    if !declared.is_empty() {
        return Ok(Some(declared.to_string()));
    }
    for (file, manager) in LOCKFILES {
        if remote.exists(file).await? {
            return Ok(Some(manager.to_string()));
        }
    }
    Ok(None)
}
