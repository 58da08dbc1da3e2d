//! The agent's way into a container: a tar of the static binary (and the
//! workspace directory of a non-root user), and the check that the binary
//! is static at all.

use bytes::Bytes;

use crate::provider::{Error, Result};

/// A tar holding the agent at `<prefix>sandhold-agent` (root-owned, 0755),
/// plus, with a writable root, its workspace directory owned by the run
/// user (the agent hands the rest of an existing workspace over at start).
pub(super) fn agent_archive(
    agent: &Bytes,
    prefix: &str,
    workspace: Option<(String, (u32, u32))>,
) -> Result<Bytes> {
    let mtime =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut builder = tar::Builder::new(Vec::with_capacity(agent.len() + 4096));
    let fail = |e: std::io::Error| Error::Internal(format!("building the agent archive: {e}"));
    let dir_header = |uid: u32, gid: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_uid(uid.into());
        h.set_gid(gid.into());
        h.set_size(0);
        h.set_mtime(mtime);
        h
    };
    if !prefix.is_empty() {
        builder.append_data(&mut dir_header(0, 0), prefix, std::io::empty()).map_err(fail)?;
    }
    let mut file = tar::Header::new_gnu();
    file.set_entry_type(tar::EntryType::Regular);
    file.set_mode(0o755);
    file.set_uid(0);
    file.set_gid(0);
    file.set_size(agent.len() as u64);
    file.set_mtime(mtime);
    builder.append_data(&mut file, format!("{prefix}sandhold-agent"), agent.as_ref()).map_err(fail)?;
    if let Some((path, (uid, gid))) = workspace
        && !path.is_empty()
    {
        builder.append_data(&mut dir_header(uid, gid), format!("{path}/"), std::io::empty()).map_err(fail)?;
    }
    builder.into_inner().map(Bytes::from).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_holds_the_agent_and_the_users_workspace() {
        let agent = Bytes::from_static(b"\x7fELF-agent-bytes");
        let tar = agent_archive(&agent, ".sandhold/", Some(("workspace".into(), (1000, 1001)))).unwrap();
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
                    h.size().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            entries,
            vec![
                (".sandhold/".into(), 0o755, 0, 0),
                (".sandhold/sandhold-agent".into(), 0o755, 0, agent.len() as u64),
                ("workspace/".into(), 0o755, 1000, 0),
            ]
        );
    }
}
