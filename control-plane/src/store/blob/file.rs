//! The files of the directory store: written unnamed (or under a temp
//! name), made durable, then linked in by name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Result, io};

/// Removes the files of `tmp` not modified for `age`; how many it removed.
/// Best effort: a file it cannot read or remove stays for the next start.
pub(super) fn remove_abandoned_uploads(tmp: &Path, age: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(tmp) else { return 0 };
    let now = std::time::SystemTime::now();
    entries
        .flatten()
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() >= age)
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Whether `O_TMPFILE` files can be made in `dir` and linked in by name
/// (through `/proc/self/fd`).
pub(super) fn unnamed_files_work(dir: &Path) -> bool {
    let probe = dir.join(format!("probe-{}", uuid::Uuid::new_v4().simple()));
    let linked = TempBlob::unnamed(dir).and_then(|mut temp| temp.link(&probe)).is_ok();
    let _ = std::fs::remove_file(&probe);
    linked
}

/// A blob file being written: unnamed (`O_TMPFILE`) in the directory the
/// blob will live in, so nothing is left of it if the process dies; or,
/// where the file system has no unnamed files, named under `<dir>/tmp`
/// and removed unless persisted. Unnamed files in the blob's own shard
/// spread the creations over 256 directories: all in `tmp`, concurrent
/// uploads queued on that one directory's lock.
pub(super) struct TempBlob {
    file: std::fs::File,
    /// The temp file's name, when it has one.
    name: Option<PathBuf>,
}

impl TempBlob {
    pub(super) fn unnamed(dir: &Path) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
            .map_err(|e| io(dir, e))?;
        Ok(Self { file, name: None })
    }

    pub(super) fn named(tmp: &Path) -> Result<Self> {
        let path = tmp.join(uuid::Uuid::new_v4().simple().to_string());
        let file = std::fs::File::create(&path).map_err(|e| io(&path, e))?;
        Ok(Self { file, name: Some(path) })
    }

    /// The file being written (positional writes go through it).
    pub(super) fn file(&self) -> &std::fs::File {
        &self.file
    }

    pub(super) fn write(&mut self, data: &[u8]) -> Result<()> {
        use std::io::Write;
        self.file.write_all(data).map_err(|e| io(self.name.as_deref().unwrap_or(Path::new("(unnamed)")), e))
    }

    /// Give the file the name `target`: false (and nothing named) when
    /// `target` exists already.
    pub(super) fn link(&mut self, target: &Path) -> Result<bool> {
        use std::os::fd::AsRawFd;
        let Some(name) = &self.name else {
            let fd = format!("/proc/self/fd/{}", self.file.as_raw_fd());
            let at = nix::fcntl::AT_FDCWD;
            return match nix::unistd::linkat(
                at,
                fd.as_str(),
                at,
                target,
                nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
            ) {
                Ok(()) => Ok(true),
                Err(nix::errno::Errno::EEXIST) => Ok(false),
                Err(e) => Err(io(target, e.into())),
            };
        };
        if target.try_exists().map_err(|e| io(target, e))? {
            return Ok(false);
        }
        std::fs::rename(name, target).map_err(|e| io(target, e))?;
        self.name = None;
        Ok(true)
    }

    /// Make the bytes durable, name them `target`, then make the name
    /// durable: once this returns, a crash leaves the whole blob at
    /// `target`. False (and nothing named) when `target` exists already
    /// (another save of the tenant stored it meanwhile).
    pub(super) fn persist(mut self, target: &Path) -> Result<bool> {
        self.file.sync_all().map_err(|e| io(target, e))?;
        if !self.link(target)? {
            return Ok(false);
        }
        let parent = target.parent().expect("blob paths have a parent");
        if let Ok(dir) = std::fs::File::open(parent) {
            let _ = dir.sync_all();
        }
        Ok(true)
    }
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            let _ = std::fs::remove_file(name);
        }
    }
}
