//! The snapshot policy: which paths a capture keeps (include), leaves out
//! with everything below them (exclude; the defaults unless the policy
//! replaces them, the projection marker always) and zeroes whole (redact).

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use shared::error::Error;
use shared::proto::agent::v1::CapturePolicy;
use shared::snapshot::{always_excluded, default_excluded, is_session_state};

/// A compiled [`CapturePolicy`].
#[derive(Debug, Clone)]
pub struct Policy {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
    redact: Option<GlobSet>,
}

fn glob_set(field: &str, patterns: &[String]) -> Result<Option<GlobSet>, Error> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut set = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p.trim_start_matches('/'))
            .literal_separator(true)
            .build()
            .map_err(|e| Error::invalid_field(format!("policy.{field}"), format!("{p:?}: {e}")))?;
        set.add(glob);
    }
    set.build().map(Some).map_err(|e| Error::invalid_field(format!("policy.{field}"), e.to_string()))
}

/// `path` and each of its ancestors (`a/b/c`, `a/b`, `a`).
pub(super) fn self_and_ancestors(path: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(path), |p| p.rsplit_once('/').map(|(parent, _)| parent))
}

impl Policy {
    pub fn compile(policy: &CapturePolicy) -> Result<Self, Error> {
        Ok(Self {
            include: glob_set("include", &policy.include)?,
            exclude: glob_set("exclude", &policy.exclude)?,
            redact: glob_set("redact", &policy.redact)?,
        })
    }

    /// Left out, with everything below it. The carried harness sessions
    /// never are by a pattern of their own (only through an excluded
    /// ancestor): they are what lets a thread continue in a new sandbox.
    pub fn excluded(&self, path: &str) -> bool {
        if is_session_state(path) {
            return false;
        }
        always_excluded(path)
            || match &self.exclude {
                Some(set) => set.is_match(path),
                None => default_excluded(path),
            }
    }

    pub fn included(&self, path: &str) -> bool {
        if is_session_state(path) {
            return true;
        }
        match &self.include {
            None => true,
            Some(set) => self_and_ancestors(path).any(|p| set.is_match(p)),
        }
    }

    pub fn redacted(&self, path: &str) -> bool {
        self.redact.as_ref().is_some_and(|set| self_and_ancestors(path).any(|p| set.is_match(p)))
    }
}

/// Whether the policy leaves `path` out, itself or through an ancestor (a
/// capture skips an excluded directory with everything below it).
pub(super) fn excluded_at(policy: &Policy, path: &str) -> bool {
    self_and_ancestors(path).any(|p| policy.excluded(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_include_exclude_and_redact_by_glob() {
        let p = Policy::compile(&CapturePolicy {
            include: vec!["src/**".into(), "README.md".into()],
            exclude: vec!["src/gen".into()],
            redact: vec!["src/*.key".into()],
        })
        .unwrap();
        assert!(p.included("src/a/b.rs"));
        assert!(!p.included("other.txt"));
        assert!(p.excluded("src/gen"));
        assert!(!p.excluded(".git"), "exclude replaces the defaults");
        assert!(p.excluded(shared::snapshot::PROJECTION_MARKER), "except the projection marker");
        assert!(p.redacted("src/x.key"));
        assert!(!p.redacted("src/a/x.key"), "`*` stays within a segment");
        let session = ".sandhold/sessions/codex/2026/rollout-1.jsonl";
        assert!(p.included(session), "the carried sessions are kept whatever the include list");
        let no_jsonl =
            Policy::compile(&CapturePolicy { exclude: vec!["**/*.jsonl".into()], ..Default::default() })
                .unwrap();
        assert!(no_jsonl.excluded("a/b.jsonl") && !no_jsonl.excluded(session));
        let defaults = Policy::compile(&CapturePolicy::default()).unwrap();
        assert!(defaults.excluded("a/node_modules") && defaults.included("anything"));
    }
}
