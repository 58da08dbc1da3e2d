//! The token of a server without API tokens: random, kept in
//! `<data dir>/local-token`, a file only its owner can read (as Jupyter
//! and the Docker socket do), so loopback is not a way in for every user of
//! the machine or for a page in their browser. The CLI finds it there by
//! itself; other clients send it as `authorization: Bearer <token>`.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use shared::secret::Secret;

/// The file's name inside the data dir.
pub const FILE_NAME: &str = "local-token";

/// Tokens shorter than this in the file are refused (ours are 64 hex).
const MIN_LEN: usize = 32;

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {why}; remove it and start the server again to make a new one", path.display())]
    Unsafe { why: &'static str, path: PathBuf },
}

/// Where the token of a server on `data_dir` is.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// The token of the server on `data_dir`, made on first use. The file is
/// kept across restarts (clients keep working); one left readable by
/// others is replaced, since anyone may have read it.
pub fn ensure(data_dir: &Path) -> Result<Secret, Error> {
    let path = path(data_dir);
    std::fs::create_dir_all(data_dir).map_err(|source| Error::Io {
        what: "creating the data directory",
        path: data_dir.into(),
        source,
    })?;
    // Twice at most: a concurrent server on the same data dir may win the
    // creation, then its file is read.
    for _ in 0..2 {
        match open(&path) {
            Ok((file, mode)) if mode & 0o077 != 0 => {
                drop(file);
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "the local token file was readable by others: replacing it");
                std::fs::remove_file(&path).map_err(|source| Error::Io {
                    what: "removing",
                    path: path.clone(),
                    source,
                })?;
            }
            Ok((file, _)) => return read_token(file, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { what: "opening", path, source }),
        }
        if create(&path)? {
            break;
        }
    }
    let (file, _) =
        open(&path).map_err(|source| Error::Io { what: "opening", path: path.clone(), source })?;
    read_token(file, &path)
}

/// The token in `data_dir` if this user can read it; `None` when there is
/// no file or it may not be read (another user's server).
pub fn read(data_dir: &Path) -> Option<Secret> {
    let path = path(data_dir);
    let (file, _) = open(&path).ok()?;
    read_token(file, &path).ok()
}

/// The file, opened without following a symlink, and its mode; a file
/// that is not ours or not a plain file is refused.
fn open(path: &Path) -> std::io::Result<(std::fs::File, u32)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "not a regular file owned by this user",
        ));
    }
    Ok((file, meta.mode() & 0o777))
}

fn read_token(mut file: std::fs::File, path: &Path) -> Result<Secret, Error> {
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(|source| Error::Io {
        what: "reading",
        path: path.into(),
        source,
    })?;
    let token = text.trim();
    if token.len() < MIN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Unsafe {
            why: "not a token (too short, or not printable ASCII)",
            path: path.into(),
        });
    }
    Ok(Secret::new(token))
}

/// Write a new token beside `path` (mode 600 from the first byte) and link
/// it into place, which fails if another process made one first: the file
/// is never seen half written. `false`: someone else's link won.
fn create(path: &Path) -> Result<bool, Error> {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    let temp = path.with_file_name(format!("{FILE_NAME}.{}.tmp", std::process::id()));
    let io = |what, source| Error::Io { what, path: temp.clone(), source };
    let _ = std::fs::remove_file(&temp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&temp)
        .map_err(|e| io("creating", e))?;
    let written =
        file.write_all(format!("{}\n", hex::encode(bytes)).as_bytes()).and_then(|()| file.sync_all());
    let linked = written.and_then(|()| std::fs::hard_link(&temp, path));
    let _ = std::fs::remove_file(&temp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::Io { what: "writing the local token to", path: path.into(), source: e }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_token_is_made_once_owner_only_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let token = ensure(&data).unwrap();
        assert_eq!(token.expose().len(), 64);
        let meta = std::fs::metadata(path(&data)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(ensure(&data).unwrap().expose(), token.expose(), "kept across restarts");
        assert_eq!(read(&data).unwrap().expose(), token.expose());
        assert!(read(dir.path()).is_none(), "no file, no token");
    }

    #[test]
    fn a_file_others_could_read_is_replaced_and_a_symlink_refused() {
        let dir = tempfile::tempdir().unwrap();
        let first = ensure(dir.path()).unwrap();
        std::fs::set_permissions(path(dir.path()), std::fs::Permissions::from_mode(0o644)).unwrap();
        let second = ensure(dir.path()).unwrap();
        assert_ne!(first.expose(), second.expose(), "a token others could read is burnt");
        let mode = std::fs::metadata(path(dir.path())).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("planted"), "x".repeat(64)).unwrap();
        std::os::unix::fs::symlink(other.path().join("planted"), path(other.path())).unwrap();
        assert!(ensure(other.path()).is_err(), "a symlink is never followed");
        assert!(read(other.path()).is_none());
    }
}
