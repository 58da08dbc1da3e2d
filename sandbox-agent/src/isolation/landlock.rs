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

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
    let mut rules: Vec<(OwnedFd, BitFlags<AccessFs>)> = Vec::new();
    for root in writable {
        let Some(fd) = open_path(root) else { continue };
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
        if let Some(fd) = open_path(file)
            && fstat(&fd)
                .is_ok_and(|s| SFlag::from_bits_truncate(s.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG)
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

/// An `O_PATH` descriptor of `path` (its last component not followed);
/// `None` when it does not exist or is a symlink.
fn open_path(path: &Path) -> Option<OwnedFd> {
    let fd =
        nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    let kind = SFlag::from_bits_truncate(fstat(&fd).ok()?.st_mode) & SFlag::S_IFMT;
    (kind != SFlag::S_IFLNK).then_some(fd)
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
