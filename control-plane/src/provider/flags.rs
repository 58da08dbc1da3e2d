//! The provider section `sandhold run` makes from its flags, here so the
//! command line names no provider: an image means a container, no image a
//! directory on the server's host.

use std::path::Path;

use shared::proto::v1::{self as api, provider_spec};

/// Where a repository on the client's machine appears in a container.
pub const CONTAINER_REPO_MOUNT: &str = "/mnt/sandhold-repo";

/// What the flags say about where the sandbox lives.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flags<'a> {
    /// `--image`: a container of this image; `None`: the local provider.
    pub image: Option<&'a str>,
    /// `--network`, for containers.
    pub network: Option<&'a str>,
    /// `--runtime` (`runc`, `gvisor`), for containers.
    pub runtime: Option<&'a str>,
    /// `--repo` when it names a directory on this machine.
    pub local_repo: Option<&'a Path>,
}

/// The provider section the flags make, and the URL the sandbox clones
/// the local repository from (the host path, or where a container sees it
/// mounted read-only).
pub fn section(flags: Flags<'_>) -> (api::ProviderSpec, Option<String>) {
    let (provider, repo_url) = match flags.image {
        Some(image) => {
            let mut docker = api::DockerProvider {
                image: image.to_string(),
                network: flags.network.unwrap_or_default().to_string(),
                runtime: flags.runtime.unwrap_or_default().to_string(),
                ..Default::default()
            };
            // The host path is not visible in a container: mount it.
            let url = flags.local_repo.map(|path| {
                docker.mounts.push(api::Mount {
                    source: path.display().to_string(),
                    target: CONTAINER_REPO_MOUNT.into(),
                    read_only: true,
                });
                CONTAINER_REPO_MOUNT.to_string()
            });
            (provider_spec::Provider::Docker(docker), url)
        }
        None => (
            provider_spec::Provider::Local(api::LocalProvider {}),
            flags.local_repo.map(|p| p.display().to_string()),
        ),
    };
    (api::ProviderSpec { provider: Some(provider) }, repo_url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_image_is_a_local_directory_and_a_repo_is_read_in_place() {
        let (spec, url) = section(Flags { local_repo: Some(Path::new("/src/app")), ..Default::default() });
        assert!(matches!(spec.provider, Some(provider_spec::Provider::Local(_))));
        assert_eq!(url.as_deref(), Some("/src/app"));
    }

    #[test]
    fn a_local_repo_is_mounted_read_only_into_a_container() {
        let flags = Flags {
            image: Some("alpine"),
            network: Some("bridge"),
            runtime: Some("gvisor"),
            local_repo: Some(Path::new("/src/app")),
        };
        let (spec, url) = section(flags);
        let Some(provider_spec::Provider::Docker(docker)) = spec.provider else { panic!("a container") };
        assert_eq!((docker.image.as_str(), docker.network.as_str()), ("alpine", "bridge"));
        assert_eq!(docker.runtime, "gvisor");
        assert_eq!(docker.mounts[0].target, CONTAINER_REPO_MOUNT);
        assert_eq!(docker.mounts[0].source, "/src/app");
        assert!(docker.mounts[0].read_only);
        assert_eq!(url.as_deref(), Some(CONTAINER_REPO_MOUNT));
    }
}
