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

/// An ELF executable without a program interpreter (the dynamic loader).
pub(super) fn is_static_elf(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return false; // only 64-bit little-endian is built here
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[32..40].try_into().unwrap_or_default()) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    (0..phnum).all(|i| {
        let at = phoff + i * phentsize;
        bytes
            .get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap_or_default()) != PT_INTERP)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_executables_are_not_static() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // Test binaries are dynamically linked (they need the loader).
        assert!(!is_static_elf(&me));
        assert!(!is_static_elf(b"#!/bin/sh\necho hi\n"));
    }

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
