//! The Landlock ruleset: where the run user may write.
//!
//! Only write rights are handled (reads and execution stay as the file
//! permissions say). A writable root grants every write right beneath it.
//! A denied directory inside a writable root cannot be carved out of it
//! (Landlock only grants, and a right on a directory holds for all beneath
//! it), so the root is granted piece by piece instead: every entry of it
//! except the way to the denied directory, and so on down to the denied
//! directory's siblings. The directories on that way keep their entries
//! writable but get no right of their own: nothing new can be created or
//! removed directly in them (docs/security.md says so).
//!
//! The agent's own ruleset (no run's files, no denied directories: what
//! every `Exec`, `Spawn` and shell session gets) is built once and shared
//! ([`shared_ruleset`]) for as long as each of its paths is still the
//! file it was built from: a path replaced, created or removed since makes
//! the next start build it again, so a start never gets other rules than
//! a ruleset built for it would have.

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use landlock::{
    ABI, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr,
};
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat};

/// The rights handled: writes as Landlock ABI 4 knows them (Truncate and
/// Refer included). Later rights (device ioctls, Unix socket paths) are
/// left to the file permissions.
const ABI_HANDLED: ABI = ABI::V4;

/// Entries granted one by one around denied directories, at most.
const MAX_PIECES: usize = 16_384;

fn handled() -> BitFlags<AccessFs> {
    AccessFs::from_write(ABI_HANDLED)
}

fn file_rights() -> BitFlags<AccessFs> {
    handled() & AccessFs::from_file(ABI_HANDLED)
}

/// The Landlock ABI of the running kernel; `None` without Landlock.
pub fn abi_version() -> Option<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_ulong = 1;
    // SAFETY: with a null attribute and the VERSION flag the call only
    // returns the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as i32)
}

/// An error building the ruleset.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("more than {MAX_PIECES} entries around the denied directories")]
    TooManyPieces,
}

/// A ruleset ready for `landlock_restrict_self`: write rights on
/// `writable` dirs and `files`, except beneath `denied` dirs. `None` when
/// the kernel enforces none of it.
pub fn ruleset(
    writable: &[PathBuf],
    files: &[PathBuf],
    denied: &[PathBuf],
) -> Result<Option<OwnedFd>, Error> {
    build(writable, files, denied, &mut Vec::new())
}

/// [`ruleset`] with write rights on `writable` only, shared by every start
/// in this process ([`SharedRuleset`]).
pub fn shared_ruleset(writable: &[PathBuf]) -> Result<Option<Arc<OwnedFd>>, Error> {
    static SHARED: SharedRuleset = SharedRuleset::new();
    SHARED.get(writable)
}

/// A ruleset of write rights on some paths, handed to every start that
/// asks for those paths (a close-on-exec descriptor: no child keeps it
/// past its `execve`), and built again when one of the paths no longer is
/// the file it was built from ([`Identity`]).
pub struct SharedRuleset {
    built: Mutex<Option<Built>>,
}

/// What [`SharedRuleset`] hands out, with what it was built from.
struct Built {
    writable: Vec<PathBuf>,
    /// What each of `writable` was when the ruleset was built.
    seen: Vec<Option<Identity>>,
    ruleset: Option<Arc<OwnedFd>>,
}

impl SharedRuleset {
    pub const fn new() -> Self {
        Self { built: Mutex::new(None) }
    }

    /// The ruleset for `writable`: the one built before while each path
    /// still names what it named then, else a new one.
    pub fn get(&self, writable: &[PathBuf]) -> Result<Option<Arc<OwnedFd>>, Error> {
        let cached = self
            .lock()
            .as_ref()
            .filter(|built| built.writable == writable)
            .map(|built| (built.seen.clone(), built.ruleset.clone()));
        if let Some((seen, ruleset)) = cached
            && writable.iter().map(|path| identity(path)).eq(seen)
        {
            return Ok(ruleset);
        }
        let mut seen = Vec::with_capacity(writable.len());
        let ruleset = build(writable, &[], &[], &mut seen)?.map(Arc::new);
        *self.lock() = Some(Built { writable: writable.to_vec(), seen, ruleset: ruleset.clone() });
        Ok(ruleset)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Built>> {
        // Replaced whole, never left half-written: poisoning is ignored.
        self.built.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for SharedRuleset {
    fn default() -> Self {
        Self::new()
    }
}

/// The file a path named when a rule was made for it: a rule holds on to
/// its inode (so the number is not reused meanwhile), and its rights
/// depend on the file's type. `None` for no rule: nothing there, or a
/// symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    kind: SFlag,
}

impl Identity {
    fn of(stat: &nix::sys::stat::FileStat) -> Option<Self> {
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        (kind != SFlag::S_IFLNK).then_some(Self { dev: stat.st_dev, ino: stat.st_ino, kind })
    }
}

/// What `path` names now, as [`open_path`] would find it (its last
/// component not followed).
fn identity(path: &Path) -> Option<Identity> {
    Identity::of(&nix::sys::stat::lstat(path).ok()?)
}

/// [`ruleset`], recording in `seen` what each of `writable` was.
fn build(
    writable: &[PathBuf],
    files: &[PathBuf],
    denied: &[PathBuf],
    seen: &mut Vec<Option<Identity>>,
) -> Result<Option<OwnedFd>, Error> {
    let mut rules: Vec<(OwnedFd, BitFlags<AccessFs>)> = Vec::new();
    for root in writable {
        let opened = open_path(root);
        seen.push(opened.as_ref().map(|(_, identity)| *identity));
        let Some((fd, _)) = opened else { continue };
        let inside: Vec<&Path> =
            denied.iter().map(PathBuf::as_path).filter(|d| d.starts_with(root)).collect();
        if inside.contains(&root.as_path()) {
            continue;
        }
        // A writable root inside a denied directory is denied with it.
        if denied.iter().any(|d| root.starts_with(d)) {
            continue;
        }
        if inside.is_empty() {
            rules.push((fd, handled()));
        } else {
            pieces(&fd, root, &inside, &mut rules)?;
        }
    }
    for file in files {
        if let Some((fd, identity)) = open_path(file)
            && identity.kind == SFlag::S_IFREG
        {
            rules.push((fd, file_rights()));
        }
    }
    let mut created =
        Ruleset::default().set_compatibility(CompatLevel::BestEffort).handle_access(handled())?.create()?;
    for (fd, access) in rules {
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    Ok(created.into())
}

/// An `O_PATH` descriptor of `path` (its last component not followed) and
/// what it is; `None` when it does not exist or is a symlink.
fn open_path(path: &Path) -> Option<(OwnedFd, Identity)> {
    let fd =
        nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    let identity = Identity::of(&fstat(&fd).ok()?)?;
    Some((fd, identity))
}

/// Grant every entry of `dir` (at `path`) except the denied ones, going
/// down into the entries that lead to one. Entries are opened relative to
/// their parent's descriptor and never through a symlink, so a process
/// that swaps a directory for a link meanwhile gains nothing.
fn pieces(
    dir: &OwnedFd,
    path: &Path,
    denied: &[&Path],
    rules: &mut Vec<(OwnedFd, BitFlags<AccessFs>)>,
) -> Result<(), Error> {
    let listing = openat(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .and_then(nix::dir::Dir::from_fd)
        .map_err(|e| Error::Io(path.to_path_buf(), e.into()))?;
    let mut names = Vec::new();
    for entry in listing.into_iter().flatten() {
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(std::ffi::OsStr::from_bytes(name).to_os_string());
        }
    }
    for name in names {
        let child = path.join(&name);
        if denied.contains(&child.as_path()) {
            continue;
        }
        let Ok(fd) = openat(
            dir,
            name.as_os_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Ok(stat) = fstat(&fd) else { continue };
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if rules.len() >= MAX_PIECES {
            return Err(Error::TooManyPieces);
        }
        match kind {
            SFlag::S_IFLNK => {}
            SFlag::S_IFDIR if denied.iter().any(|d| d.starts_with(&child)) => {
                pieces(&fd, &child, denied, rules)?;
            }
            SFlag::S_IFDIR => rules.push((fd, handled())),
            _ => rules.push((fd, file_rights())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    use super::*;

    /// Whether a `sh` restricted by `ruleset` can create a file in `dir`.
    fn can_write(ruleset: &OwnedFd, dir: &Path) -> bool {
        let fd = ruleset.as_raw_fd();
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg("echo x > \"$1\"/probe").arg("sh").arg(dir);
        // SAFETY: plain system calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0
                    || libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.stderr(std::process::Stdio::null()).status().unwrap().success()
    }

    /// The shared ruleset is reused while its paths are what they were, and
    /// built again once one was replaced or created: the replaced directory's
    /// new inode is writable, the old one (moved away) no longer.
    #[test]
    fn a_shared_ruleset_is_reused_until_one_of_its_paths_changes() {
        if abi_version().is_none() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (work, later) = (dir.path().join("work"), dir.path().join("later"));
        std::fs::create_dir(&work).unwrap();
        let writable = vec![work.clone(), later.clone()];
        let shared = SharedRuleset::new();
        let first = shared.get(&writable).unwrap().unwrap();
        assert!(Arc::ptr_eq(&first, &shared.get(&writable).unwrap().unwrap()));
        assert!(can_write(&first, &work));

        std::fs::create_dir(&later).unwrap();
        let created = shared.get(&writable).unwrap().unwrap();
        assert!(!Arc::ptr_eq(&first, &created), "a path that appeared is not in the old ruleset");
        assert!(can_write(&created, &later));

        let moved = dir.path().join("moved");
        std::fs::rename(&work, &moved).unwrap();
        std::fs::create_dir(&work).unwrap();
        let replaced = shared.get(&writable).unwrap().unwrap();
        assert!(!Arc::ptr_eq(&created, &replaced), "a replaced path is built again");
        assert!(can_write(&replaced, &work));
        assert!(!can_write(&replaced, &moved));
        assert!(Arc::ptr_eq(&replaced, &shared.get(&writable).unwrap().unwrap()));
    }
}
