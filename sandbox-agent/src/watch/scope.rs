//! What a watch covers: the watched directory, recursion, and the paths
//! it ignores.

use std::path::{Path, PathBuf};

use globset::{Glob, GlobMatcher};
use shared::error::Error;

use crate::confine::Root;

/// Ignored unless the request says otherwise.
pub const DEFAULT_IGNORE: [&str; 2] = [".git", "node_modules"];

/// Which paths a watch skips.
#[derive(Debug, Clone)]
pub struct Ignore {
    /// Matched against each path component below the watched directory.
    components: Vec<GlobMatcher>,
    /// Matched against the root-relative path and each of its prefixes.
    paths: Vec<GlobMatcher>,
}

impl Ignore {
    pub fn new(patterns: &[String], defaults: bool) -> Result<Self, Error> {
        let mut components = Vec::new();
        let mut paths = Vec::new();
        let defaults = if defaults { DEFAULT_IGNORE.as_slice() } else { &[] };
        for p in defaults.iter().copied().chain(patterns.iter().map(String::as_str)) {
            let p = p.trim_end_matches('/');
            if p.is_empty() {
                continue;
            }
            let glob = Glob::new(p).map_err(|e| Error::invalid_field("ignore", format!("{p:?}: {e}")))?;
            if p.contains('/') {
                let glob = globset::GlobBuilder::new(p)
                    .literal_separator(true)
                    .build()
                    .map_err(|e| Error::invalid_field("ignore", format!("{p:?}: {e}")))?;
                paths.push(glob.compile_matcher());
            } else {
                components.push(glob.compile_matcher());
            }
        }
        Ok(Self { components, paths })
    }

    /// `rel` is root-relative; `below` the part below the watched directory.
    pub fn is_ignored(&self, rel: &Path, below: &Path) -> bool {
        if below.components().any(|c| self.components.iter().any(|g| g.is_match(c.as_os_str()))) {
            return true;
        }
        if !self.paths.is_empty() {
            let mut prefix = PathBuf::new();
            for c in rel.components() {
                prefix.push(c);
                if self.paths.iter().any(|g| g.is_match(&prefix)) {
                    return true;
                }
            }
        }
        false
    }
}

/// Everything a watch loop needs to turn absolute paths into events.
#[derive(Clone)]
pub(super) struct Scope {
    pub(super) root: Root,
    pub(super) dir: PathBuf,
    pub(super) recursive: bool,
    pub(super) ignore: Ignore,
}

impl Scope {
    /// Root-relative path of `abs` when it is in scope and not ignored.
    pub(super) fn relevant(&self, abs: &Path) -> Option<String> {
        let below = abs.strip_prefix(&self.dir).ok()?;
        if below.as_os_str().is_empty() {
            return None;
        }
        if !self.recursive && below.components().count() > 1 {
            return None;
        }
        let rel = self.root.relative(abs)?;
        if self.ignore.is_ignored(rel, below) {
            return None;
        }
        Some(rel.to_string_lossy().into_owned())
    }

    /// The relevant entries below `dir`, parents before children: a
    /// symlink is an entry and never followed out of the root, and an
    /// ignored directory is not entered. An unreadable directory is an
    /// error item that names it; the walk goes on past it.
    pub(super) fn walk<'a>(
        &'a self,
        dir: &Path,
    ) -> impl Iterator<Item = walkdir::Result<walkdir::DirEntry>> + 'a {
        let depth = if self.recursive { usize::MAX } else { 1 };
        walkdir::WalkDir::new(dir)
            .min_depth(1)
            .max_depth(depth)
            .into_iter()
            .filter_entry(move |e| e.depth() == 0 || self.relevant(e.path()).is_some())
    }

    pub(super) fn rel_dir(&self) -> String {
        self.root.relative(&self.dir).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignore_matches_components_and_paths() {
        let ig = Ignore::new(&["*.tmp".into(), "build/out".into()], true).unwrap();
        let yes = |p: &str| ig.is_ignored(Path::new(p), Path::new(p));
        assert!(yes(".git/HEAD"));
        assert!(yes("a/node_modules/x/y.js"));
        assert!(yes("a/b.tmp"));
        assert!(yes("build/out/x.o"));
        assert!(!yes("build/outer.o"));
        assert!(!yes("src/main.rs"));
        assert!(!yes("a/.gitignore"));
        let none = Ignore::new(&[], false).unwrap();
        assert!(!none.is_ignored(Path::new(".git/HEAD"), Path::new(".git/HEAD")));
        assert!(Ignore::new(&["a[".into()], true).is_err());
    }
}
