//! Identifiers that end up in file paths or are derived deterministically.

use std::fmt;

/// Longest accepted run id.
pub const MAX_RUN_ID_LEN: usize = 200;

/// A validated run id: 1-200 characters of `[A-Za-z0-9._-]`, and neither `.`
/// nor `..`. Validated before it touches a path: the journal file of a run is
/// `<journal dir>/<run id>.ndjson`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunIdError {
    #[error("run id is empty")]
    Empty,
    #[error("run id is longer than {MAX_RUN_ID_LEN} characters")]
    TooLong,
    #[error("run id may only contain A-Z a-z 0-9 . _ - (found {0:?})")]
    BadChar(char),
    #[error("run id may not be '.' or '..'")]
    Dots,
}

impl RunId {
    pub fn parse(s: &str) -> Result<Self, RunIdError> {
        if s.is_empty() {
            return Err(RunIdError::Empty);
        }
        if s.len() > MAX_RUN_ID_LEN {
            return Err(RunIdError::TooLong);
        }
        if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
            return Err(RunIdError::BadChar(c));
        }
        if s == "." || s == ".." {
            return Err(RunIdError::Dots);
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id of the `n`-th message/tool-call/... minted on this run:
    /// `<run_id>-<n>`. Deterministic, so translating the same journal twice
    /// yields the same ids.
    pub fn scoped(&self, n: u64) -> String {
        format!("{}-{n}", self.0)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({})", self.0)
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_alphabet() {
        for ok in ["a", "run-1", "A.b_c-9", "..a", &"x".repeat(200)] {
            assert!(RunId::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_everything_else() {
        assert_eq!(RunId::parse(""), Err(RunIdError::Empty));
        assert_eq!(RunId::parse("."), Err(RunIdError::Dots));
        assert_eq!(RunId::parse(".."), Err(RunIdError::Dots));
        assert_eq!(RunId::parse(&"x".repeat(201)), Err(RunIdError::TooLong));
        for bad in ["a/b", "../x", "a b", "a\0b", "é", "a:b", "a\nb"] {
            assert!(matches!(RunId::parse(bad), Err(RunIdError::BadChar(_))), "{bad:?}");
        }
    }

    #[test]
    fn scoped_ids_are_deterministic() {
        let id = RunId::parse("r1").unwrap();
        assert_eq!(id.scoped(0), "r1-0");
        assert_eq!(id.scoped(41), "r1-41");
    }
}
