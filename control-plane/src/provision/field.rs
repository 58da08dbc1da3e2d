//! A request field that cannot be acted on, and a definition refused for
//! its [`Violations`]: the refusals every component's error carries, mapped
//! to INVALID_ARGUMENT with the fields as violations.

use shared::error::{Error, ErrorCode};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: String,
    pub reason: String,
}

impl InvalidField {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }

    /// `value`, or the refusal of `field` when it is empty.
    pub fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Self> {
        if value.is_empty() { Err(Self::new(field, "required")) } else { Ok(value) }
    }
}

impl From<InvalidField> for Error {
    fn from(e: InvalidField) -> Self {
        Error::invalid_field(e.field, e.reason)
    }
}

/// Every `(field, why)` that makes a `what` (a sandbox definition, a
/// workspace) invalid, refused together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {}", summary(.violations))]
pub struct Violations {
    pub what: &'static str,
    pub violations: Vec<(String, String)>,
}

fn summary(violations: &[(String, String)]) -> String {
    violations.iter().map(|(f, w)| format!("{f}: {w}")).collect::<Vec<_>>().join("; ")
}

/// `Ok` without violations; else all of them, refused together.
pub fn refuse(what: &'static str, violations: Vec<(String, String)>) -> Result<(), Violations> {
    if violations.is_empty() { Ok(()) } else { Err(Violations { what, violations }) }
}

impl From<Violations> for Error {
    fn from(e: Violations) -> Self {
        let mut err = Error::new(ErrorCode::InvalidArgument, e.to_string());
        for (f, w) in e.violations {
            err = err.with_violation(f, w);
        }
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_required_field_is_refused_by_name() {
        assert_eq!(InvalidField::required("id", "x"), Ok("x"));
        let refused = Error::from(InvalidField::required("thread_id", "").unwrap_err());
        assert_eq!(refused.code, shared::error::ErrorCode::InvalidArgument);
        assert_eq!(refused.message, "thread_id: required");
        assert_eq!(refused.field_violations, [("thread_id".to_string(), "required".to_string())]);
    }

    #[test]
    fn violations_are_refused_together_each_as_a_field_violation() {
        assert_eq!(refuse("workspace", Vec::new()), Ok(()));
        let list = vec![("a".to_string(), "bad".to_string()), ("b".to_string(), "worse".to_string())];
        let refused = Error::from(refuse("workspace", list.clone()).unwrap_err());
        assert_eq!(refused.code, shared::error::ErrorCode::InvalidArgument);
        assert_eq!(refused.message, "invalid workspace: a: bad; b: worse");
        assert_eq!(refused.field_violations, list);
    }
}
