//! The agent binary every container runs: kept once on the host and bound
//! read-only into each container at [`AGENT_PATH`](super::AGENT_PATH),
//! instead of an archive of it uploaded into each one (tens of MB built
//! and written into every container's layer, and held in the server's
//! memory).
//!
//! ```text
//! <state_dir>/agent/sandhold-agent-<sha256, 16 hex>   0555, named by content
//! ```
//!
//! Named by content, so servers sharing a state dir, and two versions side
//! by side, never write over a file a container binds: a new binary is a
//! new file, put in place by rename. A container binds the file by path
//! and a stopped one binds it again when it starts, so a file stays while
//! any container of ours names it ([`stale`]).

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::provider::{Error, Result, new_short_id};

const DIR: &str = "agent";
const PREFIX: &str = "sandhold-agent-";

/// Where `agent` lives under `state_dir`, putting it there if it is not:
/// the path a container binds.
pub(super) fn install(state_dir: &Path, agent: &[u8]) -> Result<PathBuf> {
    let dir = state_dir.join(DIR);
    std::fs::create_dir_all(&dir).map_err(Error::io(&dir, "creating"))?;
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
        let first = install(state.path(), b"\x7fELF one").unwrap();
        assert_eq!(install(state.path(), b"\x7fELF one").unwrap(), first, "the same bytes, the same file");
        assert_eq!(std::fs::read(&first).unwrap(), b"\x7fELF one");
        let mode = std::fs::metadata(&first).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o555, "nobody writes over a file containers bind");

        let second = install(state.path(), b"\x7fELF two").unwrap();
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
}
