//! The `docker` provider: one container per sandbox, of any image.
//!
//! The image needs nothing of ours. Before the container starts, the control
//! plane uploads the statically linked `sandhold-agent` into it (archive
//! upload to `/.sandhold/`) and makes it the entrypoint, as PID 1 in `init`
//! mode (reaps orphans, restarts the daemon). The agent listens on a Unix
//! socket in a per-sandbox host directory bind-mounted at `/run/sandhold`,
//! which also holds its token and the run journals:
//!
//! ```text
//! <state_dir>/<name>/           bind-mounted at /run/sandhold
//!   token                       the agent's bearer token (0600, owned by the container user)
//!   agent.sock                  created by the agent
//!   journal/                    run journals (kept out of committed snapshots)
//!   workspace/                  the workspace, only with a read-only root
//! ```
//!
//! Containers get no network (`network_mode: none`) unless the spec names a
//! Docker network. Nothing is ever pulled: there is no registry here, a
//! missing image is an error that says so.
//!
//! Native snapshots commit the container to an image tagged by the sandbox
//! key; restore and fork start new containers from such images. Volumes and
//! bind mounts are not part of a commit, so a read-only-root sandbox (whose
//! workspace is a bind mount) refuses to snapshot.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, ContainerStateStatusEnum, HostConfig, Mount, MountTypeEnum};
use bollard::query_parameters::{
    CommitContainerOptions, CreateContainerOptionsBuilder, DownloadFromContainerOptions,
    InspectContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions, RemoveImageOptions,
    StartContainerOptions, UploadToContainerOptions,
};
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use shared::error::{Error, ErrorCode};
use shared::secret::Secret;
use shared::transport::Address;

use super::{
    Capabilities, LABEL_MANAGED, LABEL_SANDBOX_KEY, ListedSandbox, Provider, ProviderKind, Result, Sandbox,
    SandboxSpec, Snapshot, check_socket_path, new_short_id, new_token, write_private_file,
};
use crate::agent::AgentClient;

/// Label holding the sandbox's host directory (to clean it up on destroy).
pub const LABEL_HOST_DIR: &str = "dev.sandhold.host-dir";
/// Label holding the image a forked sandbox was started from (removed with
/// it); empty for other sandboxes.
pub const LABEL_FORK_IMAGE: &str = "dev.sandhold.fork-image";

/// Where the agent binary goes inside a container.
const AGENT_DIR: &str = "/.sandhold";
const AGENT_PATH: &str = "/.sandhold/sandhold-agent";
/// Where the host directory is mounted inside a container.
const RUN_DIR: &str = "/run/sandhold";
const DEFAULT_WORKDIR: &str = "/workspace";
const SNAPSHOT_REPO: &str = "sandhold-snapshot";
const FORK_REPO: &str = "sandhold-fork";

/// Per-sandbox Docker options (part of a sandbox definition).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DockerOptions {
    /// Image to run; `None`: the provider's default image. Must exist in the
    /// local engine (nothing is pulled).
    pub image: Option<String>,
    /// `uid[:gid]` or `name[:group]` (names resolved in the image's
    /// `/etc/passwd` and `/etc/group`). `None`: the image's user.
    pub user: Option<String>,
    /// Workspace directory inside the container; `None`: `/workspace`.
    pub workdir: Option<String>,
    pub memory_bytes: Option<i64>,
    /// CPUs, fractional allowed (e.g. 1.5).
    pub cpus: Option<f64>,
    pub pids_limit: Option<i64>,
    /// Read-only root filesystem; the workspace then lives in the host
    /// directory (bind-mounted at the workdir) and `/tmp` is a tmpfs.
    pub read_only_root: bool,
    /// A Docker network to join; `None`: no network at all.
    pub network: Option<String>,
    pub mounts: Vec<MountSpec>,
}

/// An extra mount: an absolute `source` is a host path (bind), anything
/// else a named volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

#[derive(Debug, Clone)]
pub struct DockerProviderOptions {
    /// The statically linked `sandhold-agent` copied into every container
    /// (`scripts/build-agent-static` prints its path).
    pub agent_binary: PathBuf,
    /// Parent of the per-sandbox host directories. Keep it short: the
    /// agent's socket lives in it and socket paths are limited to 107 bytes.
    pub state_dir: PathBuf,
    /// Image for specs that name none.
    pub default_image: Option<String>,
    /// How long a new or restarted container's agent may take to answer.
    pub ready_timeout: Duration,
}

impl DockerProviderOptions {
    pub fn new(agent_binary: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            agent_binary: agent_binary.into(),
            state_dir: state_dir.into(),
            default_image: None,
            ready_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone)]
pub struct DockerProvider {
    docker: Docker,
    /// Where the engine was looked for, for error messages.
    engine: String,
    agent: Bytes,
    state_dir: PathBuf,
    default_image: Option<String>,
    ready_timeout: Duration,
}

/// What a new container is made from.
struct Origin {
    image: String,
    /// Set for forks: the image made for this sandbox alone, removed with it.
    fork_image: Option<String>,
}

impl DockerProvider {
    /// Connect to the engine (`DOCKER_HOST`, else the local socket), agree
    /// on an API version and load the agent binary.
    pub async fn connect(options: DockerProviderOptions) -> Result<Self> {
        let engine =
            std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_string());
        let unreachable = |e: &dyn std::fmt::Display| {
            Error::new(
                ErrorCode::Unavailable,
                format!(
                    "the Docker engine is not reachable at {engine}: {e}; is dockerd running (scripts/services starts it)?"
                ),
            )
        };
        let docker = Docker::connect_with_defaults().map_err(|e| unreachable(&e))?;
        // The engine may be older than the API version bollard defaults to.
        let docker = docker.negotiate_version().await.map_err(|e| unreachable(&e))?;
        docker.ping().await.map_err(|e| unreachable(&e))?;

        let agent = tokio::fs::read(&options.agent_binary).await.map_err(|e| {
            Error::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "reading the static agent {}: {e}; build it with scripts/build-agent-static",
                    options.agent_binary.display()
                ),
            )
        })?;
        if !is_static_elf(&agent) {
            return Err(Error::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "{} is not a statically linked executable, so it would not run in an arbitrary image; build it \
                     with scripts/build-agent-static",
                    options.agent_binary.display()
                ),
            ));
        }
        std::fs::create_dir_all(&options.state_dir)
            .map_err(|e| io_error(&options.state_dir, "creating", e))?;
        let state_dir =
            options.state_dir.canonicalize().map_err(|e| io_error(&options.state_dir, "resolving", e))?;
        check_socket_path(&state_dir.join(new_short_id()).join("agent.sock"), "the Docker state dir")?;
        Ok(Self {
            docker,
            engine,
            agent: Bytes::from(agent),
            state_dir,
            default_image: options.default_image,
            ready_timeout: options.ready_timeout,
        })
    }

    /// The bollard client, for callers that need the engine directly
    /// (benchmarks, tests).
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    fn engine_error(&self, doing: &str, e: bollard::errors::Error) -> Error {
        use bollard::errors::Error as E;
        match e {
            E::DockerResponseServerError { status_code: 404, message } => {
                Error::not_found(format!("{doing}: {message}"))
            }
            E::DockerResponseServerError { status_code: 400, message } => {
                Error::new(ErrorCode::InvalidArgument, format!("{doing}: Docker refused: {message}"))
            }
            E::DockerResponseServerError { status_code: 409, message } => {
                Error::new(ErrorCode::FailedPrecondition, format!("{doing}: {message}"))
            }
            E::DockerResponseServerError { status_code, message } => {
                Error::internal(format!("{doing}: Docker answered {status_code}: {message}"))
            }
            E::RequestTimeoutError => Error::new(
                ErrorCode::Unavailable,
                format!("{doing}: the Docker engine at {} timed out", self.engine),
            ),
            other => Error::new(
                ErrorCode::Unavailable,
                format!("{doing}: the Docker engine at {} is not reachable: {other}", self.engine),
            ),
        }
    }

    async fn check_image(&self, image: &str) -> Result<()> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Err(Error::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "image {image} is not in the local Docker engine and Sandhold never pulls (there is no registry \
                     here): build it locally (e.g. scripts/build-test-images) or docker load it"
                ),
            )
            .with_meta("image", image)),
            Err(e) => Err(self.engine_error(&format!("inspecting image {image}"), e)),
        }
    }

    fn host_dir_of(&self, labels: &HashMap<String, String>) -> Option<PathBuf> {
        let dir = PathBuf::from(labels.get(LABEL_HOST_DIR)?);
        // A label is only a string anyone could set: never remove a
        // directory outside our state dir because a container said so.
        (dir.parent() == Some(self.state_dir.as_path())).then_some(dir)
    }

    async fn create_from(&self, spec: &SandboxSpec, origin: Origin) -> Result<Sandbox> {
        self.check_image(&origin.image).await?;
        let name = new_short_id();
        let host_dir = self.state_dir.join(&name);
        std::fs::create_dir(&host_dir).map_err(|e| io_error(&host_dir, "creating", e))?;
        let mut container_id = None;
        let result = self.create_in(spec, &origin, &name, &host_dir, &mut container_id).await;
        if result.is_err() {
            if let Some(id) = &container_id
                && let Err(e) = self.remove_container(id).await
            {
                tracing::error!(container = %id, error = %e, "removing the container of a failed create");
            }
            if let Err(e) = std::fs::remove_dir_all(&host_dir) {
                tracing::error!(dir = %host_dir.display(), error = %e, "removing the host dir of a failed create");
            }
            if let Some(image) = &origin.fork_image {
                self.remove_image(image).await;
            }
        }
        result
    }

    async fn create_in(
        &self,
        spec: &SandboxSpec,
        origin: &Origin,
        name: &str,
        host_dir: &Path,
        container_id: &mut Option<String>,
    ) -> Result<Sandbox> {
        let opts = &spec.docker;
        let workdir = opts.workdir.clone().unwrap_or_else(|| DEFAULT_WORKDIR.to_string());
        if !workdir.starts_with('/') || workdir.split('/').any(|c| c == "..") {
            return Err(Error::invalid_field(
                "docker.workdir",
                format!("{workdir:?} must be an absolute path"),
            ));
        }
        let token = new_token();
        write_private_file(&host_dir.join("token"), token.expose().as_bytes())
            .map_err(|e| io_error(&host_dir.join("token"), "writing", e))?;
        for sub in ["journal", "workspace"] {
            std::fs::create_dir(host_dir.join(sub))
                .map_err(|e| io_error(&host_dir.join(sub), "creating", e))?;
        }

        let mut labels: HashMap<String, String> = spec.labels().into_iter().collect();
        labels.insert(LABEL_HOST_DIR.into(), host_dir.display().to_string());
        labels.insert(LABEL_FORK_IMAGE.into(), origin.fork_image.clone().unwrap_or_default());

        let mut mounts = vec![bind(&host_dir.display().to_string(), RUN_DIR, false)];
        let mut tmpfs = HashMap::new();
        if opts.read_only_root {
            // Uploads into a read-only rootfs are refused even before start,
            // so the agent goes to a volume of its own; the workspace is the
            // host directory's, which we can make the container user's.
            mounts.push(Mount {
                target: Some(AGENT_DIR.into()),
                typ: Some(MountTypeEnum::VOLUME),
                ..Default::default()
            });
            mounts.push(bind(&host_dir.join("workspace").display().to_string(), &workdir, false));
            tmpfs.insert("/tmp".to_string(), "mode=1777".to_string());
        }
        for m in &opts.mounts {
            if !m.target.starts_with('/') {
                return Err(Error::invalid_field(
                    "docker.mounts.target",
                    format!("{:?} must be absolute", m.target),
                ));
            }
            if m.source.starts_with('/') {
                mounts.push(bind(&m.source, &m.target, m.read_only));
            } else {
                mounts.push(Mount {
                    source: Some(m.source.clone()),
                    target: Some(m.target.clone()),
                    typ: Some(MountTypeEnum::VOLUME),
                    read_only: Some(m.read_only),
                    ..Default::default()
                });
            }
        }
        let host_config = HostConfig {
            mounts: Some(mounts),
            network_mode: Some(opts.network.clone().unwrap_or_else(|| "none".to_string())),
            memory: opts.memory_bytes,
            nano_cpus: opts.cpus.map(|c| (c * 1e9) as i64),
            pids_limit: opts.pids_limit,
            readonly_rootfs: Some(opts.read_only_root),
            tmpfs: (!tmpfs.is_empty()).then_some(tmpfs),
            ..Default::default()
        };
        let entrypoint: Vec<String> = [
            AGENT_PATH,
            "init",
            "--",
            "serve",
            "--listen",
            &format!("unix:{RUN_DIR}/agent.sock"),
            "--root",
            &workdir,
            "--token-file",
            &format!("{RUN_DIR}/token"),
            "--journal-dir",
            &format!("{RUN_DIR}/journal"),
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let body = ContainerCreateBody {
            image: Some(origin.image.clone()),
            entrypoint: Some(entrypoint),
            // An explicit entrypoint drops the image's CMD; say so anyway.
            cmd: Some(Vec::new()),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            user: opts.user.clone(),
            working_dir: Some(workdir.clone()),
            labels: Some(labels),
            stop_signal: Some("SIGTERM".into()),
            host_config: Some(host_config),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptionsBuilder::new().name(&format!("sandhold-{name}")).build()),
                body,
            )
            .await
            .map_err(|e| self.engine_error(&format!("creating a container of {}", origin.image), e))?;
        *container_id = Some(created.id.clone());
        let id = created.id;

        let owner = match &opts.user {
            Some(user) => Some(self.resolve_user(&id, user).await?),
            None => None,
        };
        if let Some((uid, gid)) = owner {
            for path in [
                host_dir.to_path_buf(),
                host_dir.join("token"),
                host_dir.join("journal"),
                host_dir.join("workspace"),
            ] {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .map_err(|e| io_error(&path, "chowning", e))?;
            }
        }
        let (upload_path, archive) = if opts.read_only_root {
            (AGENT_DIR.to_string(), agent_archive(&self.agent, "", None)?)
        } else {
            let workspace = owner.map(|o| (workdir.trim_start_matches('/').to_string(), o));
            ("/".to_string(), agent_archive(&self.agent, ".sandhold/", workspace)?)
        };
        self.docker
            .upload_to_container(
                &id,
                Some(UploadToContainerOptions { path: upload_path, ..Default::default() }),
                bollard::body_full(archive),
            )
            .await
            .map_err(|e| self.engine_error("copying the agent into the container", e))?;
        self.docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
            .map_err(|e| self.engine_error("starting the container", e))?;

        let sandbox = Sandbox {
            provider_id: id.clone(),
            address: Address::Unix(host_dir.join("agent.sock")),
            token,
            workspace: PathBuf::from(workdir),
        };
        self.wait_ready(&sandbox).await?;
        tracing::info!(container = %id, tenant = %spec.tenant, image = %origin.image, "docker sandbox created");
        Ok(sandbox)
    }

    /// Wait for the agent to answer, failing early (with the container's
    /// last log lines) when the container stops.
    async fn wait_ready(&self, sandbox: &Sandbox) -> Result<AgentClient> {
        let until = Instant::now() + self.ready_timeout;
        loop {
            let last = match AgentClient::connect(&sandbox.address, &sandbox.token).await {
                Ok(client) => return Ok(client),
                Err(e) if e.code == ErrorCode::ProtocolMismatch || e.code == ErrorCode::Unauthenticated => {
                    return Err(e);
                }
                Err(e) => e,
            };
            let inspect = self
                .docker
                .inspect_container(&sandbox.provider_id, None::<InspectContainerOptions>)
                .await
                .map_err(|e| self.engine_error("inspecting the container", e))?;
            let state = inspect.state.unwrap_or_default();
            if !state.running.unwrap_or(false) {
                let logs = self.log_tail(&sandbox.provider_id).await;
                return Err(Error::new(
                    ErrorCode::Unavailable,
                    format!(
                        "the sandbox container stopped before its agent answered (exit code {}{}); container output:\n{logs}",
                        state.exit_code.unwrap_or_default(),
                        state.error.filter(|e| !e.is_empty()).map(|e| format!(", {e}")).unwrap_or_default(),
                    ),
                ));
            }
            if Instant::now() >= until {
                let logs = self.log_tail(&sandbox.provider_id).await;
                return Err(Error::new(
                    ErrorCode::Unavailable,
                    format!(
                        "the sandbox agent did not answer within {:?}: {}; container output:\n{logs}",
                        self.ready_timeout, last.message
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn log_tail(&self, id: &str) -> String {
        let options = LogsOptions { stdout: true, stderr: true, tail: "20".into(), ..Default::default() };
        let mut stream = self.docker.logs(id, Some(options));
        let mut out = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
        out
    }

    /// `uid[:gid]` or `name[:group]`, names looked up in the (created, not
    /// yet started) container's own `/etc/passwd` and `/etc/group`.
    async fn resolve_user(&self, id: &str, user: &str) -> Result<(u32, u32)> {
        let (who, group) = match user.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (user, None),
        };
        let passwd = self.read_container_file(id, "/etc/passwd").await.unwrap_or_default();
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
                Err(_) => {
                    let groups = self.read_container_file(id, "/etc/group").await.unwrap_or_default();
                    groups
                        .lines()
                        .map(|l| l.split(':').collect::<Vec<_>>())
                        .find(|f| f.len() >= 3 && f[0] == g)
                        .and_then(|f| f[2].parse().ok())
                        .ok_or_else(|| {
                            Error::invalid_field(
                                "docker.user",
                                format!("group {g:?} is not in the image's /etc/group"),
                            )
                        })?
                }
            },
            // Docker's rule: the user's primary group, else group 0.
            None => entry.as_ref().and_then(|f| f[3].parse().ok()).unwrap_or(0),
        };
        Ok((uid, gid))
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

    async fn remove_container(&self, id: &str) -> Result<()> {
        let options = RemoveContainerOptions { force: true, v: true, ..Default::default() };
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                Ok(())
            }
            Err(e) => Err(self.engine_error(&format!("removing container {id}"), e)),
        }
    }

    async fn remove_image(&self, image: &str) {
        let options = RemoveImageOptions { force: false, noprune: false };
        match self.docker.remove_image(image, Some(options), None).await {
            Ok(_) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => tracing::warn!(image, error = %e, "removing a sandbox image"),
        }
    }

    /// Inspect a container Sandhold manages; `None` when it is gone (or was
    /// never ours).
    async fn inspect_managed(&self, id: &str) -> Result<Option<bollard::models::ContainerInspectResponse>> {
        match self.docker.inspect_container(id, None::<InspectContainerOptions>).await {
            Ok(inspect) => {
                let managed = inspect
                    .config
                    .as_ref()
                    .and_then(|c| c.labels.as_ref())
                    .is_some_and(|l| l.get(LABEL_MANAGED).map(String::as_str) == Some("true"));
                Ok(managed.then_some(inspect))
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(e) => Err(self.engine_error(&format!("inspecting container {id}"), e)),
        }
    }

    async fn commit(&self, id: &str, repo: &str, tag: &str) -> Result<String> {
        let options = CommitContainerOptions {
            container: Some(id.to_string()),
            repo: Some(repo.to_string()),
            tag: Some(tag.to_string()),
            comment: Some("sandhold sandbox snapshot".into()),
            pause: true,
            ..Default::default()
        };
        self.docker
            .commit_container(options, bollard::models::ContainerConfig::default())
            .await
            .map_err(|e| self.engine_error(&format!("committing container {id}"), e))?;
        Ok(format!("{repo}:{tag}"))
    }

    /// The labels and read-only flag of a managed container, or NOT_FOUND.
    async fn managed_or_not_found(&self, id: &str) -> Result<(HashMap<String, String>, bool)> {
        let inspect = self
            .inspect_managed(id)
            .await?
            .ok_or_else(|| Error::not_found(format!("sandbox container {id} does not exist")))?;
        let labels = inspect.config.and_then(|c| c.labels).unwrap_or_default();
        let read_only = inspect.host_config.and_then(|h| h.readonly_rootfs).unwrap_or(false);
        Ok((labels, read_only))
    }
}

#[async_trait]
impl Provider for DockerProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Docker
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
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox> {
        let image = spec.docker.image.clone().or_else(|| self.default_image.clone()).ok_or_else(|| {
            Error::invalid_field(
                "docker.image",
                "no image given and the Docker provider has no default image",
            )
        })?;
        self.create_from(spec, Origin { image, fork_image: None }).await
    }

    async fn resume(&self, provider_id: &str) -> Result<Option<Sandbox>> {
        let Some(inspect) = self.inspect_managed(provider_id).await? else { return Ok(None) };
        let config = inspect.config.unwrap_or_default();
        let labels = config.labels.unwrap_or_default();
        let host_dir = self.host_dir_of(&labels).ok_or_else(|| {
            Error::new(
                ErrorCode::FailedPrecondition,
                format!("container {provider_id} has no valid {LABEL_HOST_DIR} label"),
            )
        })?;
        let token = match std::fs::read_to_string(host_dir.join("token")) {
            Ok(t) => Secret::new(t.trim().to_string()),
            Err(e) => {
                return Err(Error::new(
                    ErrorCode::FailedPrecondition,
                    format!(
                        "the host dir {} of container {provider_id} lost its token ({e}); destroy the sandbox",
                        host_dir.display()
                    ),
                ));
            }
        };
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
                Err(e) => return Err(io_error(&dir, "removing", e)),
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
            return Err(Error::new(
                ErrorCode::FailedPrecondition,
                "a read-only-root sandbox keeps its workspace in a bind mount, which an image commit would not \
                 capture; it cannot be snapshotted natively",
            ));
        }
        let key = labels.get(LABEL_SANDBOX_KEY).map(String::as_str).unwrap_or_default();
        let id = self.commit(provider_id, SNAPSHOT_REPO, &image_tag(key)).await?;
        tracing::info!(container = %provider_id, image = %id, "docker sandbox snapshotted");
        Ok(Snapshot { id })
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
            return Err(Error::new(
                ErrorCode::FailedPrecondition,
                "a read-only-root sandbox keeps its workspace in a bind mount, which an image commit would not \
                 capture; it cannot be forked natively",
            ));
        }
        let image = self.commit(provider_id, FORK_REPO, &new_short_id()).await?;
        self.create_from(spec, Origin { image: image.clone(), fork_image: Some(image) }).await
    }
}

fn bind(source: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        source: Some(source.to_string()),
        target: Some(target.to_string()),
        typ: Some(MountTypeEnum::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// A Docker tag from a sandbox key: `[A-Za-z0-9_.-]`, at most 128
/// characters, not starting with `.` or `-`.
pub fn image_tag(key: &str) -> String {
    let mut tag: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' { c } else { '_' })
        .take(128)
        .collect();
    if tag.is_empty() || tag.starts_with(['.', '-']) {
        tag.insert(0, 'k');
        tag.truncate(128);
    }
    tag
}

/// A tar holding the agent at `<prefix>sandhold-agent` (root-owned, 0755),
/// plus, when the sandbox runs as another user, its workspace directory
/// owned by that user so the agent can write there.
fn agent_archive(agent: &Bytes, prefix: &str, workspace: Option<(String, (u32, u32))>) -> Result<Bytes> {
    let mtime =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut builder = tar::Builder::new(Vec::with_capacity(agent.len() + 4096));
    let fail = |e: std::io::Error| Error::internal(format!("building the agent archive: {e}"));
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
fn is_static_elf(bytes: &[u8]) -> bool {
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

fn io_error(path: &Path, doing: &str, e: std::io::Error) -> Error {
    Error::internal(format!("{doing} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags_are_valid() {
        assert_eq!(image_tag("abc123"), "abc123");
        assert_eq!(image_tag("t/x:y"), "t_x_y");
        assert_eq!(image_tag(""), "k");
        assert_eq!(image_tag("-x"), "k-x");
        assert_eq!(image_tag(&"a".repeat(300)).len(), 128);
    }

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
