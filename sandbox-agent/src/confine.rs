//! Confinement of request paths to the sandbox root.
//!
//! A request path is relative to the root. It is refused when it contains a
//! NUL byte, a component longer than 255 bytes, is absolute and outside the
//! root, climbs out with `..`, or passes through a symlink (anywhere in the
//! path, chains included) whose target leads outside. Resolution is done by
//! hand, component by component, so that nothing outside the root is ever
//! opened, created, or even `stat`ed on behalf of a request.
//!
//! Limit: a process inside the sandbox can race a check (swap a directory
//! for a symlink between resolution and use). The agent runs with the
//! sandbox's own privileges, so such a race gains nothing the process could
//! not do itself; the confinement protects the control plane's requests, not
//! against the sandbox's own code.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use shared::error::{Error, ErrorCode};

/// Longest accepted path component (the usual NAME_MAX).
const MAX_COMPONENT: usize = 255;
/// Longest accepted request path.
const MAX_PATH: usize = 4096;
/// Symlinks followed while resolving one path (as the kernel's MAXSYMLINKS).
const MAX_SYMLINKS: usize = 40;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfineError {
    #[error("path contains a NUL byte")]
    Nul,
    #[error("path is too long")]
    TooLong,
    #[error("path component longer than {MAX_COMPONENT} bytes")]
    ComponentTooLong,
    #[error("path {0:?} leaves the sandbox root")]
    Escapes(String),
    #[error("too many levels of symbolic links in {0:?}")]
    SymlinkLoop(String),
}

impl From<ConfineError> for Error {
    fn from(e: ConfineError) -> Self {
        let code = match e {
            ConfineError::Escapes(_) | ConfineError::SymlinkLoop(_) => ErrorCode::PermissionDenied,
            _ => ErrorCode::InvalidArgument,
        };
        Error::new(code, e.to_string()).with_violation("path", e.to_string())
    }
}

impl From<ConfineError> for tonic::Status {
    fn from(e: ConfineError) -> Self {
        Error::from(e).into()
    }
}

/// The sandbox root (canonical, absolute).
#[derive(Debug, Clone)]
pub struct Root {
    root: PathBuf,
}

impl Root {
    /// `path` must exist; it is canonicalized so that symlink targets can be
    /// compared against it.
    pub fn new(path: &Path) -> std::io::Result<Self> {
        Ok(Self { root: path.canonicalize()? })
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Resolve `request` to an absolute path inside the root, following
    /// symlinks in every component (the final one too).
    pub fn resolve(&self, request: &str) -> Result<PathBuf, ConfineError> {
        self.resolve_inner(request, true)
    }

    /// As [`Root::resolve`], but a symlink in the final component is not
    /// followed (for lstat, remove, rename, and creating the entry itself).
    pub fn resolve_no_follow(&self, request: &str) -> Result<PathBuf, ConfineError> {
        self.resolve_inner(request, false)
    }

    /// The path of `abs` relative to the root (`""` for the root itself), for
    /// reporting paths back to clients. `None` when outside.
    pub fn relative<'a>(&self, abs: &'a Path) -> Option<&'a Path> {
        abs.strip_prefix(&self.root).ok()
    }

    fn resolve_inner(&self, request: &str, follow_final: bool) -> Result<PathBuf, ConfineError> {
        if request.as_bytes().contains(&0) {
            return Err(ConfineError::Nul);
        }
        if request.len() > MAX_PATH {
            return Err(ConfineError::TooLong);
        }
        let request_path = Path::new(request);
        // An absolute path is accepted only when it names something under
        // the root; it is then treated as the equivalent relative path.
        let relative: &Path = if request_path.is_absolute() {
            request_path.strip_prefix(&self.root).map_err(|_| ConfineError::Escapes(request.to_owned()))?
        } else {
            request_path
        };

        // Work list of components still to walk, front first.
        let mut pending: Vec<PathBuf> = Vec::new();
        for c in relative.components().rev() {
            match c {
                Component::Normal(name) => {
                    if name.as_bytes().len() > MAX_COMPONENT {
                        return Err(ConfineError::ComponentTooLong);
                    }
                    pending.push(PathBuf::from(name));
                }
                Component::ParentDir => pending.push(PathBuf::from("..")),
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }

        let mut resolved: Vec<std::ffi::OsString> = Vec::new();
        let mut links_followed = 0usize;
        // Once a component does not exist, nothing below it can be a symlink.
        let mut exists = true;
        while let Some(part) = pending.pop() {
            if part.as_os_str() == OsStr::new("..") {
                if resolved.pop().is_none() {
                    return Err(ConfineError::Escapes(request.to_owned()));
                }
                continue;
            }
            let is_final = pending.is_empty();
            let candidate = self.join(&resolved).join(&part);
            if exists && (follow_final || !is_final) {
                match std::fs::symlink_metadata(&candidate) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        links_followed += 1;
                        if links_followed > MAX_SYMLINKS {
                            return Err(ConfineError::SymlinkLoop(request.to_owned()));
                        }
                        let target = std::fs::read_link(&candidate)
                            .map_err(|_| ConfineError::Escapes(request.to_owned()))?;
                        if target.is_absolute() {
                            let inside = target
                                .strip_prefix(&self.root)
                                .map_err(|_| ConfineError::Escapes(request.to_owned()))?;
                            resolved.clear();
                            push_components(&mut pending, inside)?;
                        } else {
                            push_components(&mut pending, &target)?;
                        }
                        continue;
                    }
                    Ok(_) => {}
                    Err(_) => exists = false,
                }
            }
            resolved.push(part.into_os_string());
        }
        Ok(self.join(&resolved))
    }

    fn join(&self, parts: &[std::ffi::OsString]) -> PathBuf {
        let mut p = self.root.clone();
        p.extend(parts);
        p
    }
}

/// Push `target`'s components onto the front of the work list.
fn push_components(pending: &mut Vec<PathBuf>, target: &Path) -> Result<(), ConfineError> {
    for c in target.components().rev() {
        match c {
            Component::Normal(name) => {
                if name.as_bytes().len() > MAX_COMPONENT {
                    return Err(ConfineError::ComponentTooLong);
                }
                pending.push(PathBuf::from(name));
            }
            Component::ParentDir => pending.push(PathBuf::from("..")),
            _ => {}
        }
    }
    Ok(())
}

/// Map an io error on `path` (the request's path, never the absolute one)
/// to the closed set of codes.
pub fn io_error(e: std::io::Error, path: &str) -> Error {
    use std::io::ErrorKind as K;
    let code = match e.kind() {
        K::NotFound => ErrorCode::NotFound,
        K::AlreadyExists => ErrorCode::AlreadyExists,
        K::PermissionDenied => ErrorCode::PermissionDenied,
        K::NotADirectory
        | K::IsADirectory
        | K::DirectoryNotEmpty
        | K::ReadOnlyFilesystem
        | K::StorageFull => ErrorCode::FailedPrecondition,
        K::InvalidInput | K::InvalidFilename => ErrorCode::InvalidArgument,
        _ => match e.raw_os_error() {
            Some(libc::ELOOP) => ErrorCode::PermissionDenied,
            Some(libc::EXDEV) | Some(libc::EBUSY) => ErrorCode::FailedPrecondition,
            _ => ErrorCode::Internal,
        },
    };
    Error::new(code, format!("{path:?}: {e}"))
}

/// Resolve a request's working directory inside the root; it must be an
/// existing directory.
pub fn resolve_cwd(root: &Root, cwd: &str) -> Result<PathBuf, Error> {
    let path = root.resolve(cwd)?;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err(Error::new(ErrorCode::FailedPrecondition, format!("cwd {cwd:?} is not a directory"))
            .with_violation("cwd", "not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::not_found(format!("cwd {cwd:?} does not exist"))
                .with_violation("cwd", "does not exist"))
        }
        Err(e) => Err(Error::internal(format!("cwd {cwd:?}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn setup() -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        let root_path = dir.path().join("root");
        std::fs::create_dir_all(root_path.join("a/b")).unwrap();
        std::fs::write(root_path.join("a/b/f.txt"), b"x").unwrap();
        std::fs::write(dir.path().join("outside.txt"), b"secret").unwrap();
        let root = Root::new(&root_path).unwrap();
        (dir, root)
    }

    #[test]
    fn plain_paths_resolve_inside() {
        let (_d, root) = setup();
        assert_eq!(root.resolve("a/b/f.txt").unwrap(), root.path().join("a/b/f.txt"));
        assert_eq!(root.resolve("a/./b/../b/f.txt").unwrap(), root.path().join("a/b/f.txt"));
        assert_eq!(root.resolve("").unwrap(), root.path());
        assert_eq!(root.resolve("new/file").unwrap(), root.path().join("new/file"));
        let abs = root.path().join("a/b");
        assert_eq!(root.resolve(abs.to_str().unwrap()).unwrap(), abs);
    }

    #[test]
    fn hostile_paths_are_refused() {
        let (dir, root) = setup();
        symlink("/", root.path().join("to-root")).unwrap();
        symlink("../../outside.txt", root.path().join("a/up")).unwrap();
        symlink("hop2", root.path().join("hop1")).unwrap();
        symlink("a/up", root.path().join("hop2")).unwrap();
        symlink("loop", root.path().join("loop")).unwrap();
        symlink(dir.path(), root.path().join("parent-abs")).unwrap();
        let cases = [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "to-root/etc/passwd",
            "a/up",
            "hop1",
            "loop",
            "parent-abs/outside.txt",
            "a\0b",
        ];
        for c in cases {
            assert!(root.resolve(c).is_err(), "{c:?} resolved");
        }
        assert!(root.resolve(&"x".repeat(5000)).is_err());
    }

    #[test]
    fn inside_symlinks_are_followed_and_no_follow_keeps_the_link() {
        let (_d, root) = setup();
        symlink("a/b", root.path().join("ab")).unwrap();
        symlink(root.path().join("a"), root.path().join("abs-inside")).unwrap();
        assert_eq!(root.resolve("ab/f.txt").unwrap(), root.path().join("a/b/f.txt"));
        assert_eq!(root.resolve("abs-inside/b").unwrap(), root.path().join("a/b"));
        assert_eq!(root.resolve_no_follow("ab").unwrap(), root.path().join("ab"));
        // A dangling link that would leave the root is fine to lstat/remove
        // as an entry, but not to follow.
        symlink("/nonexistent/x", root.path().join("dangling")).unwrap();
        assert!(root.resolve("dangling").is_err());
        assert_eq!(root.resolve_no_follow("dangling").unwrap(), root.path().join("dangling"));
    }

    #[test]
    fn io_errors_map_to_codes() {
        use std::io::{Error as E, ErrorKind as K};
        assert_eq!(io_error(E::from(K::NotFound), "x").code, ErrorCode::NotFound);
        assert_eq!(io_error(E::from(K::AlreadyExists), "x").code, ErrorCode::AlreadyExists);
        assert_eq!(io_error(E::from_raw_os_error(libc::ENOTDIR), "x").code, ErrorCode::FailedPrecondition);
        assert_eq!(io_error(E::from_raw_os_error(libc::ENOTEMPTY), "x").code, ErrorCode::FailedPrecondition);
        assert_eq!(io_error(E::from_raw_os_error(libc::EISDIR), "x").code, ErrorCode::FailedPrecondition);
        assert_eq!(io_error(E::from_raw_os_error(libc::EACCES), "x").code, ErrorCode::PermissionDenied);
        assert_eq!(io_error(E::from_raw_os_error(libc::EINVAL), "x").code, ErrorCode::InvalidArgument);
        assert_eq!(io_error(E::from_raw_os_error(libc::EIO), "x").code, ErrorCode::Internal);
    }
}
