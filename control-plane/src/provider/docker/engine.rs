//! The engine side of the provider: connecting, creating a container from
//! its configuration, waiting for its agent, and the small calls the
//! [`Provider`](crate::provider::Provider) impl is made of.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{
    CommitContainerOptions, CreateContainerOptionsBuilder, InspectContainerOptions, LogsOptions,
    RemoveContainerOptions, RemoveImageOptions, StartContainerOptions,
};
use futures::StreamExt;
use shared::transport::Address;

use super::agent_file;
use super::container::{Origin, container_config, workdir};
use super::user::run_user;
use super::{DockerProviderOptions, LABEL_HOST_DIR};
use crate::agent::{self, AgentClient};
use crate::config::Runtime;
use crate::provider::{
    Error, LABEL_MANAGED, Result, Sandbox, SandboxSpec, check_socket_path, is_agent_socket, new_short_id,
    new_token, write_private_file,
};
use crate::provision::InvalidField;
use shared::error::ErrorCode;

#[derive(Debug, Clone)]
pub struct DockerProvider {
    pub(super) docker: Docker,
    /// Where the engine was looked for, for error messages.
    engine: String,
    /// The agent binary, bound read-only into every container
    /// ([`agent_file`]).
    agent: PathBuf,
    state_dir: PathBuf,
    pub(super) default_image: Option<String>,
    ready_timeout: Duration,
    /// Mounted read-only at [`crate::toolchain::MOUNT`] (made if missing,
    /// so CLIs installed later appear in running sandboxes).
    toolchain_dir: Option<PathBuf>,
}

impl DockerProvider {
    /// Connect to the engine (`DOCKER_HOST`, else the local socket), agree
    /// on an API version and load the agent binary.
    pub async fn connect(options: DockerProviderOptions) -> Result<Self> {
        let engine =
            std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_string());
        let unreachable = |e: &dyn std::fmt::Display| {
            Error::Unavailable(format!(
                "the Docker engine is not reachable at {engine}: {e}; is dockerd running (scripts/services starts it)?"
            ))
        };
        let docker = Docker::connect_with_defaults().map_err(|e| unreachable(&e))?;
        std::fs::create_dir_all(&options.state_dir).map_err(Error::io(&options.state_dir, "creating"))?;
        let state_dir =
            options.state_dir.canonicalize().map_err(Error::io(&options.state_dir, "resolving"))?;
        check_socket_path(&state_dir.join(new_short_id()).join("agent.sock"), "the Docker state dir")?;
        // The engine's handshake and the agent's install overlap: both are
        // on the path of a server's start (a cold `sandhold run` waits).
        let handshake = async {
            // The engine may be older than the API version bollard defaults to.
            let docker = docker.negotiate_version().await.map_err(|e| unreachable(&e))?;
            docker.ping().await.map_err(|e| unreachable(&e))?;
            Ok::<_, Error>(docker)
        };
        let install = {
            let (state_dir, source) = (state_dir.clone(), options.agent_binary.clone());
            async move {
                tokio::task::spawn_blocking(move || agent_file::install(&state_dir, &source))
                    .await
                    .map_err(|e| Error::Internal(format!("installing the agent binary: {e}")))?
            }
        };
        let (docker, agent) = tokio::try_join!(handshake, install)?;
        let toolchain_dir = match options.toolchain_dir {
            Some(dir) => {
                std::fs::create_dir_all(&dir).map_err(Error::io(&dir, "creating"))?;
                Some(dir.canonicalize().map_err(Error::io(&dir, "resolving"))?)
            }
            None => None,
        };
        let provider = Self {
            docker,
            engine,
            agent,
            state_dir,
            default_image: options.default_image,
            ready_timeout: options.ready_timeout,
            toolchain_dir,
        };
        provider.remove_stale_agents().await;
        Ok(provider)
    }

    /// Remove the agent binaries of earlier versions that no container of
    /// ours binds any more (best effort: a failure leaves a file behind).
    async fn remove_stale_agents(&self) {
        let options = bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_string(), vec![format!("{LABEL_MANAGED}=true")])])),
            ..Default::default()
        };
        let containers = match self.docker.list_containers(Some(options)).await {
            Ok(containers) => containers,
            Err(e) => {
                tracing::warn!(error = %e, "listing containers to find unused agent binaries");
                return;
            }
        };
        let bound = containers
            .into_iter()
            .flat_map(|c| c.mounts.unwrap_or_default())
            .filter_map(|m| m.source.map(PathBuf::from))
            .collect();
        for path in agent_file::stale(&self.state_dir, &self.agent, &bound) {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed an agent binary no container uses"),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "removing an unused agent binary")
                }
            }
        }
    }

    /// The bollard client, for callers that need the engine directly
    /// (benchmarks, tests).
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    pub(super) fn engine_error(&self, doing: &str, e: bollard::errors::Error) -> Error {
        use bollard::errors::Error as E;
        match e {
            E::DockerResponseServerError { status_code: 404, message } => {
                Error::NotFound(format!("{doing}: {message}"))
            }
            E::DockerResponseServerError { status_code: 400, message } => {
                Error::EngineRefused(format!("{doing}: Docker refused: {message}"))
            }
            E::DockerResponseServerError { status_code: 409, message } => {
                Error::Refused(format!("{doing}: {message}"))
            }
            E::DockerResponseServerError { status_code, message } => {
                Error::EngineFailed(format!("{doing}: Docker answered {status_code}: {message}"))
            }
            E::RequestTimeoutError => {
                Error::Unavailable(format!("{doing}: the Docker engine at {} timed out", self.engine))
            }
            other => Error::Unavailable(format!(
                "{doing}: the Docker engine at {} is not reachable: {other}",
                self.engine
            )),
        }
    }

    pub(super) async fn check_image(&self, image: &str) -> Result<()> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                Err(Error::ImageMissing(image.to_string()))
            }
            Err(e) => Err(self.engine_error(&format!("inspecting image {image}"), e)),
        }
    }

    /// The runtimes the engine has (`docker info`), by the engine's names.
    pub async fn engine_runtimes(&self) -> Result<Vec<String>> {
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| self.engine_error("asking the engine for its runtimes", e))?;
        Ok(info.runtimes.unwrap_or_default().into_keys().collect())
    }

    /// Refused, naming the fix, when the engine lacks `runtime`. runc is
    /// every engine's own and is not asked for (a `docker info` costs
    /// milliseconds, and this runs on every ensure and create); another
    /// runtime is asked for each time, so an operator who registers runsc
    /// later needs no restart of the server.
    pub async fn check_runtime(&self, runtime: Runtime) -> Result<()> {
        if runtime == Runtime::Runc {
            return Ok(());
        }
        let have = self.engine_runtimes().await?;
        if have.iter().any(|r| r == runtime.engine_name()) {
            return Ok(());
        }
        Err(Error::Refused(format!(
            "the Docker engine at {} has no {} runtime (`{}`; it has: {}): install gVisor and register it with \
             the engine (`scripts/services` does both: the Debian package runsc, and runtimes.runsc in \
             /etc/docker/daemon.json, then SIGHUP dockerd)",
            self.engine,
            runtime.as_str(),
            runtime.engine_name(),
            have.join(", ")
        )))
    }

    pub(super) fn host_dir_of(&self, labels: &HashMap<String, String>) -> Option<PathBuf> {
        let dir = PathBuf::from(labels.get(LABEL_HOST_DIR)?);
        // A label is only a string anyone could set: never remove a
        // directory outside our state dir because a container said so.
        (dir.parent() == Some(self.state_dir.as_path())).then_some(dir)
    }

    pub(super) async fn create_from(&self, spec: &SandboxSpec, origin: Origin) -> Result<Sandbox> {
        self.check_image(&origin.image).await?;
        self.check_runtime(spec.docker.runtime.unwrap_or(Runtime::Runc)).await?;
        let name = new_short_id();
        let host_dir = self.state_dir.join(&name);
        std::fs::create_dir(&host_dir).map_err(Error::io(&host_dir, "creating"))?;
        // The token, the socket and the journals: nothing for the run user.
        std::fs::set_permissions(&host_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(Error::io(&host_dir, "restricting"))?;
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
        let workdir = workdir(opts)?;
        let body = container_config(spec, origin, host_dir, &self.agent, self.toolchain_dir.as_deref())?;
        let token = new_token();
        write_private_file(&host_dir.join("token"), token.expose().as_bytes())
            .map_err(Error::io(&host_dir.join("token"), "writing"))?;
        for sub in ["journal", "workspace"] {
            std::fs::create_dir(host_dir.join(sub)).map_err(Error::io(&host_dir.join(sub), "creating"))?;
        }
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

        // The agent runs as root; every command as the run user, who must
        // not own the host dir (it holds the token and the journals).
        let owner = self.check_run_user(&id, run_user(opts.user.as_deref())).await?;
        let host_owner = std::fs::metadata(host_dir).map_err(Error::io(host_dir, "reading"))?.uid();
        if owner.0 == host_owner {
            return Err(InvalidField::new(
                "docker.user",
                format!("uid {} owns the sandbox's host dir on the host; choose another run user", owner.0),
            )
            .into());
        }
        // The workspace is the agent's to make and hand to the run user at
        // start (`--root`, `--run-user`): a copy into the created container
        // would be tens of milliseconds of the engine's on every create.
        self.docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
            .map_err(|e| self.engine_error("starting the container", e))?;

        let sandbox = Sandbox {
            provider_id: id.clone(),
            address: Address::Unix(host_dir.join("agent.sock")),
            token,
            workspace: PathBuf::from(workdir),
            runtime: opts.runtime.unwrap_or(Runtime::Runc).as_str().to_string(),
        };
        self.wait_ready(&sandbox).await?;
        tracing::info!(container = %id, tenant = %spec.tenant, image = %origin.image, "docker sandbox created");
        Ok(sandbox)
    }

    /// Wait for the agent to answer, failing early (with the container's
    /// last log lines) when the container stops. Looked for after 2 ms,
    /// then twice as long each time up to 50 ms (an agent is usually up
    /// within milliseconds of the container's start, and a fixed 50 ms
    /// cost a cold create up to that much); whether the container still
    /// runs is asked of the engine every 50 ms.
    pub(super) async fn wait_ready(&self, sandbox: &Sandbox) -> Result<AgentClient> {
        let until = Instant::now() + self.ready_timeout;
        let mut pauses = agent::ready_pauses();
        // Started (or resumed) just now: asked first after the longest pause.
        let mut inspected = Instant::now();
        loop {
            // The socket lives in a directory the sandbox can write: never
            // connect through a link it put there to a socket of this host.
            let socket_there = match &sandbox.address {
                Address::Unix(path) => is_agent_socket(path)
                    .map_err(|e| Error::Refused(format!("refusing the sandbox's agent socket: {e}")))?,
                Address::Tcp(_) | Address::Node { .. } => true,
            };
            // Why the agent did not answer this time, said when time is up.
            let last = match socket_there {
                false => "the agent socket is not there yet".to_string(),
                true => match AgentClient::connect(&sandbox.address, &sandbox.token).await {
                    Ok(client) => return Ok(client),
                    Err(e)
                        if e.code == ErrorCode::ProtocolMismatch || e.code == ErrorCode::Unauthenticated =>
                    {
                        return Err(Error::Agent(e));
                    }
                    Err(e) => e.message,
                },
            };
            if inspected.elapsed() >= agent::LONGEST_READY_PAUSE {
                let inspect = self
                    .docker
                    .inspect_container(&sandbox.provider_id, None::<InspectContainerOptions>)
                    .await
                    .map_err(|e| self.engine_error("inspecting the container", e))?;
                inspected = Instant::now();
                let state = inspect.state.unwrap_or_default();
                if !state.running.unwrap_or(false) {
                    let logs = self.log_tail(&sandbox.provider_id).await;
                    return Err(Error::Unavailable(format!(
                        "the sandbox container stopped before its agent answered (exit code {}{}); container output:\n{logs}",
                        state.exit_code.unwrap_or_default(),
                        state.error.filter(|e| !e.is_empty()).map(|e| format!(", {e}")).unwrap_or_default(),
                    )));
                }
            }
            if Instant::now() >= until {
                let logs = self.log_tail(&sandbox.provider_id).await;
                return Err(Error::Unavailable(format!(
                    "the sandbox agent did not answer within {:?}: {last}; container output:\n{logs}",
                    self.ready_timeout
                )));
            }
            tokio::time::sleep(pauses.next().expect("the ready pauses never end")).await;
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

    pub(super) async fn remove_container(&self, id: &str) -> Result<()> {
        let options = RemoveContainerOptions { force: true, v: true, ..Default::default() };
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                Ok(())
            }
            Err(e) => Err(self.engine_error(&format!("removing container {id}"), e)),
        }
    }

    pub(super) async fn remove_image(&self, image: &str) {
        let options = RemoveImageOptions { force: false, noprune: false };
        match self.docker.remove_image(image, Some(options), None).await {
            Ok(_) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => tracing::warn!(image, error = %e, "removing a sandbox image"),
        }
    }

    /// Inspect a container Sandhold manages; `None` when it is gone (or was
    /// never ours).
    pub(super) async fn inspect_managed(
        &self,
        id: &str,
    ) -> Result<Option<bollard::models::ContainerInspectResponse>> {
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

    /// Paths the container added or modified over its image (what a commit
    /// holds); deleted ones are left out.
    pub(super) async fn changes(&self, id: &str) -> Result<Vec<String>> {
        let changes = self
            .docker
            .container_changes(id)
            .await
            .map_err(|e| self.engine_error(&format!("listing the changes of container {id}"), e))?;
        Ok(changes
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.kind != bollard::models::ChangeType::_2)
            .map(|c| c.path)
            .collect())
    }

    pub(super) async fn commit(&self, id: &str, repo: &str, tag: &str) -> Result<String> {
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
    pub(super) async fn managed_or_not_found(&self, id: &str) -> Result<(HashMap<String, String>, bool)> {
        let inspect = self
            .inspect_managed(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("sandbox container {id} does not exist")))?;
        let labels = inspect.config.and_then(|c| c.labels).unwrap_or_default();
        let read_only = inspect.host_config.and_then(|h| h.readonly_rootfs).unwrap_or(false);
        Ok((labels, read_only))
    }
}
