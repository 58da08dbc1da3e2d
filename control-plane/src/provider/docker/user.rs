//! The container user: `uid[:gid]` or `name[:group]`, names looked up in
//! the image's own `/etc/passwd` and `/etc/group` (read from the created,
//! not yet started, container).

use bollard::query_parameters::DownloadFromContainerOptions;
use futures::StreamExt;
use shared::error::Error;

use super::DockerProvider;
use crate::provider::Result;

impl DockerProvider {
    /// The uid and gid `user` stands for in container `id`.
    pub(super) async fn resolve_user(&self, id: &str, user: &str) -> Result<(u32, u32)> {
        let passwd = self.read_container_file(id, "/etc/passwd").await.unwrap_or_default();
        let groups = match needs_group_file(user) {
            true => self.read_container_file(id, "/etc/group").await.unwrap_or_default(),
            false => String::new(),
        };
        user_ids(user, &passwd, &groups)
    }

    async fn read_container_file(&self, id: &str, path: &str) -> Option<String> {
        let mut stream = self
            .docker
            .download_from_container(id, Some(DownloadFromContainerOptions { path: path.to_string() }));
        let mut tar_bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            tar_bytes.extend_from_slice(&chunk.ok()?);
        }
        let mut archive = tar::Archive::new(tar_bytes.as_slice());
        let mut entry = archive.entries().ok()?.next()?.ok()?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut entry, &mut text).ok()?;
        Some(text)
    }
}

/// Only a group given by name needs `/etc/group`.
fn needs_group_file(user: &str) -> bool {
    user.split_once(':').is_some_and(|(_, g)| g.parse::<u32>().is_err())
}

/// `user` resolved against the texts of `/etc/passwd` and `/etc/group`.
fn user_ids(user: &str, passwd: &str, groups: &str) -> Result<(u32, u32)> {
    let (who, group) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && (f[0] == who || (who.parse::<u32>().is_ok() && f[2] == who)));
    let uid = match who.parse::<u32>() {
        Ok(uid) => uid,
        Err(_) => entry.as_ref().and_then(|f| f[2].parse().ok()).ok_or_else(|| {
            Error::invalid_field("docker.user", format!("user {who:?} is not in the image's /etc/passwd"))
        })?,
    };
    let gid = match group {
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => groups
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| {
                    Error::invalid_field(
                        "docker.user",
                        format!("group {g:?} is not in the image's /etc/group"),
                    )
                })?,
        },
        // Docker's rule: the user's primary group, else group 0.
        None => entry.as_ref().and_then(|f| f[3].parse().ok()).unwrap_or(0),
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nagent:x:1000:1001::/home/agent:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:\nagent:x:1001:\n";

    #[test]
    fn names_and_numbers_resolve_against_the_image() {
        assert_eq!(user_ids("agent", PASSWD, "").unwrap(), (1000, 1001), "primary group");
        assert_eq!(user_ids("1000", PASSWD, "").unwrap(), (1000, 1001), "a known uid keeps its group");
        assert_eq!(user_ids("4242", PASSWD, "").unwrap(), (4242, 0), "an unknown uid gets group 0");
        assert_eq!(user_ids("agent:50", PASSWD, "").unwrap(), (1000, 50));
        assert_eq!(user_ids("agent:staff", PASSWD, GROUP).unwrap(), (1000, 50));
        assert!(!needs_group_file("agent") && !needs_group_file("agent:50"));
        assert!(needs_group_file("agent:staff"));
    }

    #[test]
    fn unknown_names_are_invalid_arguments() {
        let err = user_ids("nobody-here", PASSWD, "").unwrap_err();
        assert!(err.message.contains("not in the image's /etc/passwd"), "{err:?}");
        let err = user_ids("agent:wheel", PASSWD, GROUP).unwrap_err();
        assert!(err.message.contains("not in the image's /etc/group"), "{err:?}");
    }
}
