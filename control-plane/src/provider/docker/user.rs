//! The run user of a Docker sandbox: the definition's `user` (`uid[:gid]` or
//! `name[:group]`, names looked up in the image's own `/etc/passwd` and
//! `/etc/group`, read from the created, not yet started, container), else
//! [`DEFAULT_RUN_USER`]. The agent runs as root and starts every command as
//! this user; it resolves the same string inside the container
//! (`shared::user`), so a user that does not resolve is refused here, with a
//! field violation, before the container starts.

use bollard::query_parameters::DownloadFromContainerOptions;
use futures::StreamExt;

use super::DockerProvider;
use crate::provider::Result;
use crate::provision::InvalidField;

/// The run user of a definition that names none: a fixed unprivileged uid
/// (the agent gives it a passwd entry, `sandhold`, and a HOME when the image
/// has none).
pub const DEFAULT_RUN_USER: &str = "10001:10001";

/// The run user string of `user` (the definition's option).
pub(super) fn run_user(user: Option<&str>) -> &str {
    user.filter(|u| !u.is_empty()).unwrap_or(DEFAULT_RUN_USER)
}

impl DockerProvider {
    /// Check that `user` resolves in container `id` to a uid other than 0:
    /// root would be no run user at all (it could read the agent's token and
    /// trace the agent).
    /// The image's files are read only when the string needs them (a copy
    /// out of a created container is tens of milliseconds of the engine's);
    /// the default `uid:gid` needs neither.
    pub(super) async fn check_run_user(&self, id: &str, user: &str) -> Result<(u32, u32)> {
        let passwd = match shared::user::needs_passwd_file(user) {
            true => self.read_container_file(id, "/etc/passwd").await.unwrap_or_default(),
            false => String::new(),
        };
        let groups = match shared::user::needs_group_file(user) {
            true => self.read_container_file(id, "/etc/group").await.unwrap_or_default(),
            false => String::new(),
        };
        check(user, &passwd, &groups)
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

fn check(user: &str, passwd: &str, groups: &str) -> Result<(u32, u32)> {
    let resolved = shared::user::resolve(user, passwd, groups)
        .map_err(|e| InvalidField::new("docker.user", e.to_string()))?;
    if resolved.uid == 0 {
        return Err(InvalidField::new(
            "docker.user",
            format!("{user:?} is root; commands must run as an unprivileged user"),
        )
        .into());
    }
    Ok((resolved.uid, resolved.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nagent:x:1000:1001::/home/agent:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:\nagent:x:1001:\n";

    #[test]
    fn the_default_run_user_is_unprivileged() {
        assert_eq!(run_user(None), DEFAULT_RUN_USER);
        assert_eq!(run_user(Some("")), DEFAULT_RUN_USER);
        assert_eq!(run_user(Some("agent")), "agent");
        assert_eq!(check(DEFAULT_RUN_USER, "", "").unwrap(), (10001, 10001));
        assert_eq!(check("agent:staff", PASSWD, GROUP).unwrap(), (1000, 50));
    }

    #[test]
    fn unknown_names_and_root_are_invalid_arguments() {
        let err = check("nobody-here", PASSWD, "").unwrap_err().to_string();
        assert!(err.contains("not in the image's /etc/passwd"), "{err:?}");
        let err = check("agent:wheel", PASSWD, GROUP).unwrap_err().to_string();
        assert!(err.contains("not in the image's /etc/group"), "{err:?}");
        for root in ["root", "0", "0:0"] {
            let err = check(root, PASSWD, "").unwrap_err().to_string();
            assert!(err.starts_with("docker.user:") && err.contains("is root"), "{err:?}");
        }
    }
}
