//! [`Provider`] for [`DockerProvider`]: each operation on top of the
//! engine calls in `engine.rs`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use async_trait::async_trait;
use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::{ListContainersOptions, StartContainerOptions};
use shared::secret::Secret;
use shared::transport::Address;

use super::container::{Origin, image_tag};
use super::{DEFAULT_WORKDIR, DockerProvider, FORK_REPO, LABEL_FORK_IMAGE, LABEL_HOST_DIR, SNAPSHOT_REPO};
use crate::config::Runtime;
use crate::provider::{
    Capabilities, Error, LABEL_MANAGED, LABEL_SANDBOX_KEY, ListedSandbox, Provider, ProviderKind,
    ResourceUse, Result, Sandbox, SandboxSpec, Snapshot, new_short_id, own_uid, read_private_file,
};
use crate::provision::InvalidField;

#[async_trait]
impl Provider for DockerProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::new(&super::KIND)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            snapshots: true,
            fork: true,
            background_processes: true,
            killable_processes: true,
            writable_stdin: true,
            durable_filesystem: true,
            network_policy: true,
            ports: true,
            terminal: true,
        }
    }

    async fn supports(&self, spec: &SandboxSpec) -> Result<()> {
        self.check_runtime(spec.docker.runtime.unwrap_or(Runtime::Runc)).await
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox> {
        let image = spec.docker.image.clone().or_else(|| self.default_image.clone()).ok_or_else(|| {
            Error::from(InvalidField::new(
                "docker.image",
                "no image given and the Docker provider has no default image",
            ))
        })?;
        self.create_from(spec, Origin { image, fork_image: None }).await
    }

    async fn resume(&self, provider_id: &str) -> Result<Option<Sandbox>> {
        let Some(inspect) = self.inspect_managed(provider_id).await? else { return Ok(None) };
        let config = inspect.config.unwrap_or_default();
        let labels = config.labels.unwrap_or_default();
        let host_dir = self.host_dir_of(&labels).ok_or_else(|| {
            Error::Refused(format!("container {provider_id} has no valid {LABEL_HOST_DIR} label"))
        })?;
        // The sandbox can write its host dir: the token is read only if it
        // is still the file we wrote (never through a symlink it left), or
        // one the container's agent (numeric `user`, root) rewrote.
        let mut owners = vec![own_uid()];
        let agent_uid = config.user.as_deref().and_then(|u| u.split(':').next()?.parse::<u32>().ok());
        owners.extend(agent_uid);
        let token = match read_private_file(&host_dir.join("token"), &owners) {
            Ok(t) => Secret::new(t.trim().to_string()),
            Err(e) => {
                return Err(Error::Refused(format!(
                    "the host dir {} of container {provider_id} lost its token ({e}); destroy the sandbox",
                    host_dir.display()
                )));
            }
        };
        // What the engine says it runs under, in Sandhold's names.
        let runtime = inspect
            .host_config
            .and_then(|h| h.runtime)
            .map(|r| Runtime::of_engine_name(&r).map_or(r, |r| r.as_str().to_string()))
            .unwrap_or_else(|| Runtime::Runc.as_str().to_string());
        let state = inspect.state.unwrap_or_default();
        match state.status {
            Some(ContainerStateStatusEnum::RUNNING) => {}
            Some(ContainerStateStatusEnum::PAUSED) => self
                .docker
                .unpause_container(provider_id)
                .await
                .map_err(|e| self.engine_error("unpausing the container", e))?,
            Some(ContainerStateStatusEnum::REMOVING) | Some(ContainerStateStatusEnum::DEAD) => {
                return Ok(None);
            }
            _ => {
                tracing::info!(container = %provider_id, status = ?state.status, "starting a stopped sandbox container");
                self.docker
                    .start_container(provider_id, None::<StartContainerOptions>)
                    .await
                    .map_err(|e| self.engine_error("starting the container", e))?;
            }
        }
        let workdir =
            config.working_dir.filter(|w| !w.is_empty()).unwrap_or_else(|| DEFAULT_WORKDIR.to_string());
        let sandbox = Sandbox {
            provider_id: inspect.id.unwrap_or_else(|| provider_id.to_string()),
            address: Address::Unix(host_dir.join("agent.sock")),
            token,
            workspace: PathBuf::from(workdir),
            runtime,
        };
        self.wait_ready(&sandbox).await?;
        Ok(Some(sandbox))
    }

    async fn destroy(&self, provider_id: &str) -> Result<()> {
        let Some(inspect) = self.inspect_managed(provider_id).await? else { return Ok(()) };
        let labels = inspect.config.and_then(|c| c.labels).unwrap_or_default();
        self.remove_container(provider_id).await?;
        if let Some(dir) = self.host_dir_of(&labels) {
            match tokio::fs::remove_dir_all(&dir).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&dir, "removing")(e)),
            }
        }
        if let Some(image) = labels.get(LABEL_FORK_IMAGE).filter(|i| !i.is_empty()) {
            self.remove_image(image).await;
        }
        tracing::info!(container = %provider_id, "docker sandbox destroyed");
        Ok(())
    }

    async fn stop(&self, provider_id: &str) -> Result<()> {
        if self.inspect_managed(provider_id).await?.is_none() {
            return Ok(());
        }
        self.docker
            .stop_container(provider_id, None::<bollard::query_parameters::StopContainerOptions>)
            .await
            .map_err(|e| self.engine_error("stopping the container", e))
    }

    async fn usage(&self, provider_id: &str) -> Result<Option<ResourceUse>> {
        let Some(inspect) = self.inspect_managed(provider_id).await? else { return Ok(None) };
        if inspect.state.and_then(|s| s.running) != Some(true) {
            return Ok(None);
        }
        self.stats_once(provider_id).await
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ListedSandbox>> {
        let mut wanted = vec![format!("{LABEL_MANAGED}=true")];
        wanted.extend(labels.iter().map(|(k, v)| format!("{k}={v}")));
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_string(), wanted)])),
            ..Default::default()
        };
        let containers = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| self.engine_error("listing containers", e))?;
        let mut found: Vec<ListedSandbox> = containers
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                Some(ListedSandbox {
                    provider_id: c.id?,
                    own: self.host_dir_of(&labels).is_some(),
                    labels: labels.into_iter().collect(),
                    running: c.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING),
                    created_at: c.created.map(|secs| crate::store::Timestamp::from_millis(secs * 1000)),
                })
            })
            .collect();
        found.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        Ok(found)
    }

    async fn snapshot(&self, provider_id: &str) -> Result<Snapshot> {
        let (labels, read_only) = self.managed_or_not_found(provider_id).await?;
        if read_only {
            return Err(Error::Refused(
                "a read-only-root sandbox keeps its workspace in a bind mount, which an image commit would not \
                 capture; it cannot be snapshotted natively"
                    .into(),
            ));
        }
        let key = labels.get(LABEL_SANDBOX_KEY).map(String::as_str).unwrap_or_default();
        let id = self.commit(provider_id, SNAPSHOT_REPO, &image_tag(key)).await?;
        tracing::info!(container = %provider_id, image = %id, "docker sandbox snapshotted");
        Ok(Snapshot { id })
    }

    async fn changed_paths(&self, provider_id: &str) -> Result<Option<Vec<String>>> {
        self.managed_or_not_found(provider_id).await?;
        Ok(Some(self.changes(provider_id).await?))
    }

    async fn restore(&self, snapshot: &Snapshot, spec: &SandboxSpec) -> Result<Sandbox> {
        self.create_from(spec, Origin { image: snapshot.id.clone(), fork_image: None }).await
    }

    async fn delete_snapshot(&self, snapshot: &Snapshot) -> Result<()> {
        self.remove_image(&snapshot.id).await;
        Ok(())
    }

    async fn fork(&self, provider_id: &str, spec: &SandboxSpec) -> Result<Sandbox> {
        let (_, read_only) = self.managed_or_not_found(provider_id).await?;
        if read_only {
            return Err(Error::Refused(
                "a read-only-root sandbox keeps its workspace in a bind mount, which an image commit would not \
                 capture; it cannot be forked natively"
                    .into(),
            ));
        }
        let image = self.commit(provider_id, FORK_REPO, &new_short_id()).await?;
        self.create_from(spec, Origin { image: image.clone(), fork_image: Some(image) }).await
    }
}
