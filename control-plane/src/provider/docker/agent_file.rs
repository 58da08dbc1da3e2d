//! The agent binary every container runs: kept once on the host and bound
//! read-only into each container at [`AGENT_PATH`](super::AGENT_PATH),
//! instead of an archive of it uploaded into each one (tens of MB built
//! and written into every container's layer, and held in the server's
//! memory).
//!
//! ```text
//! <state_dir>/agent/sandhold-agent-<sha256, 16 hex>   0555, named by content
//! <state_dir>/agent/source                            the last source installed: its
//!                                                     fingerprint, then the file's name
//! ```
//!
//! Named by content, so servers sharing a state dir, and two versions side
//! by side, never write over a file a container binds: a new binary is a
//! new file, put in place by rename. A container binds the file by path
//! and a stopped one binds it again when it starts, so a file stays while
//! any container of ours names it ([`stale`]).
//!
//! Hashing the source (tens of MB) took a cold `sandhold run` about 20 ms
//! of every start, so the file a source became is remembered by the
//! source's fingerprint: path, device, inode, size, mtime and ctime (which
//! no user can set; as git's index does). A source changed less than
//! [`SETTLE`] before it was installed is not remembered: a change within
//! the same timestamp tick would not show in its fingerprint.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::Digest;

use crate::provider::{Error, Result, new_short_id};

const DIR: &str = "agent";
const PREFIX: &str = "sandhold-agent-";
const SOURCE: &str = "source";
/// How long ago a source must have last changed for its fingerprint to be
/// remembered.
const SETTLE: Duration = Duration::from_secs(2);

/// Where the static agent at `source` lives under `state_dir`, putting it
/// there if it is not: the path a container binds. Refused when `source`
/// cannot be read or is not a static executable.
pub(super) fn install(state_dir: &Path, source: &Path) -> Result<PathBuf> {
    install_settled(state_dir, source, SETTLE)
}

fn install_settled(state_dir: &Path, source: &Path, settle: Duration) -> Result<PathBuf> {
    let unreadable = |e: std::io::Error| {
        Error::Refused(format!(
            "reading the static agent {}: {e}; build it with scripts/build-agent-static",
            source.display()
        ))
    };
    let dir = state_dir.join(DIR);
    std::fs::create_dir_all(&dir).map_err(Error::io(&dir, "creating"))?;
    let meta = std::fs::metadata(source).map_err(unreadable)?;
    let fingerprint = fingerprint(source, &meta);
    if let Some(path) = remembered(&dir, &fingerprint, meta.len()) {
        return Ok(path);
    }
    let agent = std::fs::read(source).map_err(unreadable)?;
    if !crate::provider::host::is_static_elf(&agent) {
        return Err(Error::Refused(format!(
            "{} is not a statically linked executable, so it would not run in an arbitrary image; build it with \
             scripts/build-agent-static",
            source.display()
        )));
    }
    let path = put(&dir, &agent)?;
    let changed =
        SystemTime::UNIX_EPOCH + Duration::new(meta.ctime().max(0) as u64, meta.ctime_nsec() as u32);
    if SystemTime::now().duration_since(changed).is_ok_and(|ago| ago >= settle)
        && std::fs::metadata(source).is_ok_and(|now| fingerprint == self::fingerprint(source, &now))
    {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if let Err(e) = remember(&dir, &format!("{fingerprint}\n{name}\n")) {
            tracing::warn!(dir = %dir.display(), error = %e, "remembering the agent binary's source");
        }
    }
    Ok(path)
}

/// `agent` under `dir`, named by its content.
fn put(dir: &Path, agent: &[u8]) -> Result<PathBuf> {
    let hash = hex::encode(sha2::Sha256::digest(agent));
    let path = dir.join(format!("{PREFIX}{}", &hash[..16]));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == agent.len() as u64) {
        return Ok(path);
    }
    let temp = dir.join(format!(".{}", new_short_id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o700).open(&temp)?;
        file.write_all(agent)?;
        file.sync_all()?;
        std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o555))?;
        std::fs::rename(&temp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(Error::io(&path, "writing the agent binary")(e));
    }
    Ok(path)
}

fn fingerprint(source: &Path, meta: &std::fs::Metadata) -> String {
    let path = std::path::absolute(source).unwrap_or_else(|_| source.to_path_buf());
    format!(
        "{} {} {} {} {}.{} {}.{}",
        hex::encode(path.as_os_str().as_encoded_bytes()),
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

/// The installed file the source of `fingerprint` became, if it is still
/// there at the source's size.
fn remembered(dir: &Path, fingerprint: &str, len: u64) -> Option<PathBuf> {
    let text = std::fs::read_to_string(dir.join(SOURCE)).ok()?;
    let (seen, name) = text.split_once('\n')?;
    let name = name.trim_end();
    if seen != fingerprint || !name.starts_with(PREFIX) || name.contains('/') {
        return None;
    }
    let path = dir.join(name);
    std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() == len).then_some(path)
}

fn remember(dir: &Path, text: &str) -> std::io::Result<()> {
    let temp = dir.join(format!(".{}", new_short_id()));
    let written = std::fs::write(&temp, text).and_then(|()| std::fs::rename(&temp, dir.join(SOURCE)));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// The agent files under `state_dir` that neither `current` is nor any of
/// `bound` (the mount sources of our containers, stopped ones included)
/// names: safe to remove. Temporary files of an install that died go too.
pub(super) fn stale(state_dir: &Path, current: &Path, bound: &HashSet<PathBuf>) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(state_dir.join(DIR)) else { return Vec::new() };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            (name.starts_with(PREFIX) || name.starts_with('.')) && p != current && !bound.contains(p)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_per_content_read_only_and_old_ones_kept_while_bound() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join(DIR);
        std::fs::create_dir_all(&dir).unwrap();
        let first = put(&dir, b"\x7fELF one").unwrap();
        assert_eq!(put(&dir, b"\x7fELF one").unwrap(), first, "the same bytes, the same file");
        assert_eq!(std::fs::read(&first).unwrap(), b"\x7fELF one");
        let mode = std::fs::metadata(&first).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o555, "nobody writes over a file containers bind");

        let second = put(&dir, b"\x7fELF two").unwrap();
        assert_ne!(second, first, "a new binary is a new file");
        assert_eq!(std::fs::read(&first).unwrap(), b"\x7fELF one", "the old one is untouched");
        let leftover = state.path().join(DIR).join(".deadbeef");
        std::fs::write(&leftover, b"half").unwrap();

        let bound = HashSet::from([first.clone()]);
        assert_eq!(stale(state.path(), &second, &bound), vec![leftover.clone()]);
        let mut unbound = stale(state.path(), &second, &HashSet::new());
        unbound.sort();
        let mut expected = vec![first, leftover];
        expected.sort();
        assert_eq!(unbound, expected);
    }

    /// A copy of busybox-static (which `scripts/build-test-images`
    /// installs): a static executable, `extra` bytes appended.
    fn static_source(dir: &Path, name: &str, extra: &[u8]) -> PathBuf {
        let mut bytes = std::fs::read("/bin/busybox").expect("busybox-static");
        bytes.extend_from_slice(extra);
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_source_is_remembered_only_once_settled_and_a_replaced_one_is_installed_anew() {
        let (state, sources) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let dir = state.path().join(DIR);
        let source = static_source(sources.path(), "agent", b"");
        let fingerprint = |p: &Path| fingerprint(p, &std::fs::metadata(p).unwrap());
        let len = std::fs::metadata(&source).unwrap().len();

        let first = install_settled(state.path(), &source, Duration::from_secs(3600)).unwrap();
        assert_eq!(std::fs::read(&first).unwrap(), std::fs::read(&source).unwrap());
        assert_eq!(remembered(&dir, &fingerprint(&source), len), None, "changed just now: not remembered");

        assert_eq!(install_settled(state.path(), &source, Duration::ZERO).unwrap(), first);
        assert_eq!(remembered(&dir, &fingerprint(&source), len), Some(first.clone()));
        assert_eq!(install_settled(state.path(), &source, Duration::ZERO).unwrap(), first, "from memory");

        // A new build put in place: another file, whatever was remembered.
        let next = static_source(sources.path(), "next", b"v2");
        std::fs::rename(&next, &source).unwrap();
        let second = install_settled(state.path(), &source, Duration::ZERO).unwrap();
        assert_ne!(second, first);
        assert_eq!(std::fs::read(&second).unwrap(), std::fs::read(&source).unwrap());

        // A remembered file that went is put back.
        std::fs::remove_file(&second).unwrap();
        assert_eq!(install_settled(state.path(), &source, Duration::ZERO).unwrap(), second);
        assert_eq!(std::fs::read(&second).unwrap(), std::fs::read(&source).unwrap());
        assert!(stale(state.path(), &second, &HashSet::new()).iter().all(|p| !p.ends_with(SOURCE)));
    }

    #[test]
    fn a_missing_or_dynamic_source_is_refused_naming_the_build_script() {
        let (state, sources) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let missing = install(state.path(), &sources.path().join("none")).unwrap_err().to_string();
        assert!(
            missing.contains("reading the static agent") && missing.contains("build-agent-static"),
            "{missing}"
        );
        let script = sources.path().join("script");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let dynamic = install(state.path(), &script).unwrap_err().to_string();
        assert!(dynamic.contains("not a statically linked executable"), "{dynamic}");
    }
}
