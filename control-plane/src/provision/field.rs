//! A request field that cannot be acted on: the one such refusal every
//! component's error carries, mapped to INVALID_ARGUMENT with the field as
//! a violation.

use shared::error::Error;

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
}
