//! The workspace directory of a new container, made before it starts: a
//! tar of one directory entry owned by the run user (the agent hands the
//! rest of an existing workspace over at start). The agent itself is not
//! uploaded: it is bound read-only ([`super::agent_file`]).

use bytes::Bytes;

use crate::provider::{Error, Result};

/// A tar holding the directory `path` (relative to `/`) owned by `owner`,
/// mode 0755.
pub(super) fn workspace_archive(path: &str, (uid, gid): (u32, u32)) -> Result<Bytes> {
    let mtime =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut builder = tar::Builder::new(Vec::with_capacity(4096));
    let fail = |e: std::io::Error| Error::Internal(format!("building the workspace archive: {e}"));
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_uid(uid.into());
    header.set_gid(gid.into());
    header.set_size(0);
    header.set_mtime(mtime);
    builder
        .append_data(&mut header, format!("{}/", path.trim_matches('/')), std::io::empty())
        .map_err(fail)?;
    builder.into_inner().map(Bytes::from).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_holds_the_users_workspace_and_nothing_else() {
        let tar = workspace_archive("workspace", (1000, 1001)).unwrap();
        let mut archive = tar::Archive::new(tar.as_ref());
        let entries: Vec<(String, u32, u64, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().display().to_string(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                )
            })
            .collect();
        assert_eq!(entries, vec![("workspace/".into(), 0o755, 1000, 1001)]);
    }
}
