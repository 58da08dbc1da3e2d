//! The `local` provider: a directory per sandbox on this host, the agent a
//! child process in its own session.
//!
//! NO ISOLATION. Commands in a local sandbox run as the control plane's user
//! with full access to this machine and its network; the sandbox root only
//! confines the agent's file API, not the processes it starts. Use it for
//! development and tests, never for code you do not trust.
//!
//! Layout of one sandbox, `<data_dir>/sandboxes/<id>/`:
//!
//! ```text
//! workspace/    the sandbox root the agent serves
//! journal/      run journals
//! agent.sock    the agent's socket
//! token         the agent's bearer token (0600)
//! labels.json   tenant, key, definition (for list and orphan finding)
//! env.json      the spec's non-secret environment (to restart the agent)
//! agent.log     the agent's stdout and stderr
//! agent.pid     pid of the agent's init (supervisor) process
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shared::error::Error as WireError;
use shared::proto::v1::provider_spec;
use shared::secret::Secret;
use shared::transport::Address;

use super::Error;
use super::{
    Capabilities, ListedSandbox, Provider, ProviderKind, ResourceUse, Result, Sandbox, SandboxSpec,
    check_socket_path, new_short_id, new_token, own_uid, read_private_file, write_private_file,
};
use crate::agent::AgentClient;
use crate::provision::InvalidField;

/// Variables of the control plane's environment a local agent inherits. The
/// rest is dropped: the control plane's environment holds database URLs,
/// Redis passwords and API tokens that sandboxed commands must never see.
const INHERITED_ENV: &[&str] =
    &["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM"];

/// `PATH` when the control plane has none.
const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[derive(Debug, Clone)]
pub struct LocalProviderOptions {
    /// Sandboxes go to `<data_dir>/sandboxes/<id>`.
    pub data_dir: PathBuf,
    /// The `sandhold-agent` binary. `None`: next to the current executable,
    /// else on `PATH` (see [`super::default_agent_binary`]).
    pub agent_binary: Option<PathBuf>,
    /// How long a starting agent may take to answer.
    pub ready_timeout: Duration,
}

impl LocalProviderOptions {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self { data_dir: data_dir.into(), agent_binary: None, ready_timeout: Duration::from_secs(30) }
    }
}

#[derive(Debug, Clone)]
pub struct LocalProvider {
    sandboxes_dir: PathBuf,
    agent_binary: PathBuf,
    ready_timeout: Duration,
}

impl LocalProvider {
    /// Kill the sandbox's init and everything below it (see
    /// [`kill_sandbox_processes`]); shared by stop and destroy.
    async fn kill_processes(dir: &Path) -> Result<()> {
        let dir = dir.to_path_buf();
        let init = Self::live_init(&dir);
        tokio::task::spawn_blocking(move || kill_sandbox_processes(init, &dir))
            .await
            .map_err(|e| Error::Internal(format!("killing the sandbox's processes: {e}")))
    }

    pub fn new(options: LocalProviderOptions) -> Result<Self> {
        let agent_binary = match options.agent_binary {
            Some(path) => path,
            None => super::default_agent_binary().ok_or_else(|| {
                Error::Refused(
                    "sandhold-agent not found next to this executable nor on PATH; build it (cargo build -p \
                     sandbox-agent) or configure the agent binary path"
                        .into(),
                )
            })?,
        };
        if !agent_binary.is_file() {
            return Err(Error::Refused(format!(
                "the sandhold-agent binary {} does not exist",
                agent_binary.display()
            )));
        }
        let sandboxes_dir = options.data_dir.join("sandboxes");
        std::fs::create_dir_all(&sandboxes_dir).map_err(Error::io(&sandboxes_dir, "creating"))?;
        let sandboxes_dir = sandboxes_dir.canonicalize().map_err(Error::io(&sandboxes_dir, "resolving"))?;
        // The longest path under a sandbox dir is its socket.
        check_socket_path(&sandboxes_dir.join(new_short_id()).join("agent.sock"), "the local data dir")?;
        Ok(Self { sandboxes_dir, agent_binary, ready_timeout: options.ready_timeout })
    }

    /// The directory of a sandbox. Ids are validated first: they become a
    /// path.
    pub fn sandbox_dir(&self, provider_id: &str) -> Result<PathBuf> {
        if provider_id.len() != 16
            || !provider_id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return Err(InvalidField::new(
                "provider_id",
                format!("{provider_id:?} is not a local sandbox id"),
            )
            .into());
        }
        Ok(self.sandboxes_dir.join(provider_id))
    }

    fn sandbox(&self, id: &str, dir: &Path, token: Secret) -> Sandbox {
        Sandbox {
            provider_id: id.to_string(),
            address: Address::Unix(dir.join("agent.sock")),
            token,
            workspace: dir.join("workspace"),
            runtime: String::new(),
        }
    }

    /// Start `sandhold-agent init -- serve ...` for the sandbox in `dir`, in
    /// its own session, with a scrubbed environment.
    fn start_agent(&self, dir: &Path, env: &BTreeMap<String, String>) -> Result<u32> {
        let log_path = dir.join("agent.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(Error::io(&log_path, "opening"))?;
        let log_err = log.try_clone().map_err(Error::io(&log_path, "opening"))?;
        let mut cmd = std::process::Command::new(&self.agent_binary);
        cmd.arg("init")
            .arg("--")
            .arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", dir.join("agent.sock").display()))
            .arg("--root")
            .arg(dir.join("workspace"))
            .arg("--token-file")
            .arg(dir.join("token"))
            .arg("--journal-dir")
            .arg(dir.join("journal"))
            .current_dir(dir.join("workspace"))
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .env_clear();
        for key in INHERITED_ENV {
            if let Some(value) = std::env::var_os(key) {
                cmd.env(key, value);
            }
        }
        if std::env::var_os("PATH").is_none() {
            cmd.env("PATH", FALLBACK_PATH);
        }
        cmd.envs(env);
        // SAFETY: setsid is async-signal-safe and touches no memory of ours.
        // A session of its own keeps the agent out of the control plane's
        // process group and terminal: a Ctrl-C of the control plane must
        // not kill sandboxes that are meant to outlive it.
        unsafe {
            cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
        }
        let mut child = cmd.spawn().map_err(|e| {
            Error::Unavailable(format!("starting the sandbox agent {}: {e}", self.agent_binary.display()))
        })?;
        let pid = child.id();
        let pid_path = dir.join("agent.pid");
        std::fs::write(&pid_path, format!("{pid}\n")).map_err(Error::io(&pid_path, "writing"))?;
        // Reap it whenever it exits, so no zombie is left; a thread rather
        // than a task so that it does not depend on the caller's runtime
        // living on.
        std::thread::Builder::new()
            .name(format!("reap-agent-{pid}"))
            .spawn(move || {
                let status = child.wait();
                tracing::debug!(pid, ?status, "local sandbox agent exited");
            })
            .map_err(|e| Error::Internal(format!("spawning the agent reaper thread: {e}")))?;
        Ok(pid)
    }

    /// The init pid recorded for `dir`, if that process still runs and is
    /// this sandbox's agent (pids are reused).
    fn live_init(dir: &Path) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(dir.join("agent.pid")).ok()?.trim().parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let needle = dir.join("agent.sock");
        let needle = needle.as_os_str().as_encoded_bytes();
        (cmdline.windows(needle.len()).any(|w| w == needle) && !is_zombie(pid)).then_some(pid)
    }

    async fn wait_ready(&self, sandbox: &Sandbox) -> Result<AgentClient, WireError> {
        AgentClient::connect_with_deadline(&sandbox.address, &sandbox.token, self.ready_timeout).await
    }

    fn read_token(dir: &Path) -> Result<Secret> {
        let path = dir.join("token");
        let token = read_private_file(&path, &[own_uid()]).map_err(Error::io(&path, "reading"))?;
        Ok(Secret::new(token.trim().to_string()))
    }

    async fn create_in(&self, id: &str, dir: &Path, spec: &SandboxSpec) -> Result<Sandbox> {
        for sub in ["workspace", "journal"] {
            let path = dir.join(sub);
            std::fs::create_dir(&path).map_err(Error::io(&path, "creating"))?;
        }
        let token = new_token();
        write_private_file(&dir.join("token"), token.expose().as_bytes())
            .map_err(Error::io(&dir.join("token"), "writing"))?;
        write_json(&dir.join("labels.json"), &spec.labels())?;
        write_json(&dir.join("env.json"), &spec.env)?;
        self.start_agent(dir, &spec.env)?;
        let sandbox = self.sandbox(id, dir, token);
        self.wait_ready(&sandbox).await.map_err(|e| Error::Agent(with_log_tail(e, dir)))?;
        Ok(sandbox)
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::new(&KIND)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            snapshots: false,
            fork: false,
            background_processes: true,
            killable_processes: true,
            writable_stdin: true,
            durable_filesystem: true,
            network_policy: false,
            ports: false,
            terminal: true,
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Sandbox> {
        let id = new_short_id();
        let dir = self.sandboxes_dir.join(&id);
        std::fs::create_dir(&dir).map_err(Error::io(&dir, "creating"))?;
        tracing::warn!(
            sandbox_id = %id,
            tenant = %spec.tenant,
            dir = %dir.display(),
            "LOCAL SANDBOX HAS NO ISOLATION: its commands run as this user with full access to this host and its \
             network; use the docker provider for anything untrusted"
        );
        match self.create_in(&id, &dir, spec).await {
            Ok(sandbox) => Ok(sandbox),
            Err(e) => {
                if let Err(cleanup) = self.destroy(&id).await {
                    tracing::error!(sandbox_id = %id, error = %cleanup, "cleaning up a failed local sandbox");
                }
                Err(e)
            }
        }
    }

    async fn resume(&self, provider_id: &str) -> Result<Option<Sandbox>> {
        let dir = self.sandbox_dir(provider_id)?;
        if !dir.join("token").is_file() {
            return Ok(None);
        }
        let token = Self::read_token(&dir)?;
        let sandbox = self.sandbox(provider_id, &dir, token);
        if AgentClient::connect(&sandbox.address, &sandbox.token).await.is_ok() {
            return Ok(Some(sandbox));
        }
        // The supervisor restarts a daemon that died; only when the
        // supervisor itself is gone does the agent have to be started again.
        if Self::live_init(&dir).is_none() {
            let env: BTreeMap<String, String> = read_json(&dir.join("env.json"))?.unwrap_or_default();
            tracing::info!(sandbox_id = %provider_id, "local sandbox agent is not running, restarting it");
            self.start_agent(&dir, &env)?;
        }
        self.wait_ready(&sandbox).await.map_err(|e| Error::Agent(with_log_tail(e, &dir)))?;
        Ok(Some(sandbox))
    }

    async fn destroy(&self, provider_id: &str) -> Result<()> {
        let dir = self.sandbox_dir(provider_id)?;
        if !dir.exists() {
            return Ok(());
        }
        Self::kill_processes(&dir).await?;
        tokio::fs::remove_dir_all(&dir).await.or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(Error::io(&dir, "removing")(e)),
        })?;
        tracing::info!(sandbox_id = %provider_id, "local sandbox destroyed");
        Ok(())
    }

    /// Stops every process of the sandbox and keeps its directory;
    /// [`Provider::resume`] starts a new agent on it.
    async fn stop(&self, provider_id: &str) -> Result<()> {
        let dir = self.sandbox_dir(provider_id)?;
        if !dir.exists() {
            return Ok(());
        }
        Self::kill_processes(&dir).await?;
        tracing::info!(sandbox_id = %provider_id, "local sandbox stopped");
        Ok(())
    }

    /// From `/proc`: the init and its descendants (the processes a stop
    /// kills), summed.
    async fn usage(&self, provider_id: &str) -> Result<Option<ResourceUse>> {
        let dir = self.sandbox_dir(provider_id)?;
        let Some(init) = Self::live_init(&dir) else { return Ok(None) };
        tokio::task::spawn_blocking(move || Some(tree_usage(init)))
            .await
            .map_err(|e| Error::Internal(format!("reading the sandbox's processes: {e}")))
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ListedSandbox>> {
        let mut found = Vec::new();
        let entries =
            std::fs::read_dir(&self.sandboxes_dir).map_err(Error::io(&self.sandboxes_dir, "reading"))?;
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            let Ok(dir) = self.sandbox_dir(&id) else { continue };
            // A sandbox being created or destroyed right now may lack it.
            let Ok(Some(own)) = read_json::<BTreeMap<String, String>>(&dir.join("labels.json")) else {
                continue;
            };
            if labels.iter().all(|(k, v)| own.get(k) == Some(v)) {
                found.push(ListedSandbox {
                    provider_id: id,
                    labels: own,
                    running: Self::live_init(&dir).is_some(),
                    own: true,
                    created_at: std::fs::metadata(dir.join("labels.json"))
                        .and_then(|m| m.modified())
                        .ok()
                        .map(crate::store::Timestamp::from),
                });
            }
        }
        found.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        Ok(found)
    }
}

/// Kill the sandbox's init and everything below it, and anything else still
/// working in its directory.
///
/// Journal supervisors put themselves in their own sessions, so a process
/// group kill would miss them; they are reparented to the init (a child
/// subreaper), so they are found as its descendants. Processes left by an
/// earlier init that died are found by their working directory or command
/// line pointing into the sandbox directory. Everything is stopped first so
/// that nothing forks new children while the set is being collected.
fn kill_sandbox_processes(init: Option<u32>, dir: &Path) {
    let own = std::process::id();
    let mut stopped: HashSet<u32> = HashSet::new();
    for _ in 0..10 {
        let table = process_table();
        let mut targets: HashSet<u32> = HashSet::new();
        if let Some(init) = init {
            targets.insert(init);
            targets.extend(descendants(init, &table));
        }
        targets.extend(table.keys().copied().filter(|&pid| pid != own && mentions_dir(pid, dir)));
        targets.remove(&own);
        let new: Vec<u32> = targets.difference(&stopped).copied().collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
            stopped.insert(pid);
        }
    }
    for &pid in &stopped {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    // Give the kernel a moment to tear the processes down, so the directory
    // is not held open (a socket, a cwd) while it is being removed.
    for _ in 0..100 {
        if stopped.iter().all(|&pid| !alive(pid)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times: `USER_HZ`, fixed
/// at 100 by the Linux ABI whatever the kernel's own tick rate.
const USER_HZ: u64 = 100;

/// What the process tree under `root` uses: CPU time (each process's own,
/// plus that of the children it has waited for, so work of processes that
/// already ended counts), and memory as the sum of each process's
/// proportional set size (shared pages split between their users, so the
/// sum does not count a library once per process); a process whose
/// `smaps_rollup` cannot be read gives its resident size instead.
fn tree_usage(root: u32) -> ResourceUse {
    let mut pids = descendants(root, &process_table());
    pids.insert(root);
    let (mut ticks, mut memory) = (0u64, 0u64);
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        ticks += cpu_ticks(&stat).unwrap_or(0);
        memory += memory_of(pid).unwrap_or(0);
    }
    ResourceUse {
        cpu_time: Some(Duration::from_millis(ticks * 1000 / USER_HZ)),
        memory_bytes: Some(memory),
        memory_limit_bytes: None,
    }
}

/// utime + stime + cutime + cstime of a `/proc/<pid>/stat` line (fields 14
/// to 17, counted past the `(comm)` field, which may hold spaces).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields.get(11..15)?.iter().map(|f| f.parse::<u64>().ok()).sum()
}

/// Bytes of memory a process uses: `Pss` of its `smaps_rollup`, else
/// `VmRSS` of its `status`.
fn memory_of(pid: u32) -> Option<u64> {
    let kib = |text: &str, key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|k| k * 1024)
    };
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|t| kib(&t, "Pss:"))
        .or_else(|| kib(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, "VmRSS:"))
}

/// pid -> parent pid of every process.
fn process_table() -> HashMap<u32, u32> {
    let mut table = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return table };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if let Some(ppid) = parent_of(pid) {
            table.insert(pid, ppid);
        }
    }
    table
}

/// The parent pid from `/proc/<pid>/stat` (after the `(comm)` field, which
/// may itself contain spaces and parentheses).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn descendants(root: u32, table: &HashMap<u32, u32>) -> HashSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, &ppid) in table {
        children.entry(ppid).or_default().push(pid);
    }
    let mut found = HashSet::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if found.insert(child) {
                queue.push(child);
            }
        }
    }
    found
}

fn mentions_dir(pid: u32, dir: &Path) -> bool {
    if std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir)) {
        return true;
    }
    let needle = dir.as_os_str().as_encoded_bytes();
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].trim_start().starts_with('Z')))
        .unwrap_or(true)
}

fn alive(pid: u32) -> bool {
    !is_zombie(pid)
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Internal(format!("encoding {}: {e}", path.display())))?;
    std::fs::write(path, bytes).map_err(Error::io(path, "writing"))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Internal(format!("{} is not valid: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, "reading")(e)),
    }
}

/// Append the end of the agent's log to an error, where the real cause of
/// an agent that would not start usually is.
fn with_log_tail(mut err: WireError, dir: &Path) -> WireError {
    if let Ok(log) = std::fs::read_to_string(dir.join("agent.log")) {
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        if !tail.is_empty() {
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            err.message = format!("{}; agent log ends with:\n{}", err.message, tail.join("\n"));
        }
    }
    err
}

/// The `local` provider as the server knows it: `provider.local` of a
/// definition holds nothing, so there is nothing to check or key.
pub struct Local;

/// The `local` provider's registration.
pub static KIND: Local = Local;

impl super::Kind for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn reads(&self, section: &provider_spec::Provider) -> bool {
        matches!(section, provider_spec::Provider::Local(_))
    }

    fn isolated(&self) -> bool {
        false
    }

    fn build(&self, config: &crate::config::ServeConfig) -> super::Built {
        let mut options = LocalProviderOptions::new(&config.data_dir);
        options.agent_binary = config.agent_binary.clone();
        let single_user = config.single_user();
        Box::pin(async move {
            match LocalProvider::new(options) {
                Ok(p) if !single_user => {
                    tracing::warn!(
                        "local provider enabled with API tokens (allow_local_with_tokens): every tenant can run code \
                         on this host as this server's user, read its environment and files"
                    );
                    Ok(std::sync::Arc::new(p) as std::sync::Arc<dyn Provider>)
                }
                Ok(p) => {
                    tracing::warn!(
                        "local provider enabled: its sandboxes are NOT isolated from this host (development only)"
                    );
                    Ok(std::sync::Arc::new(p) as std::sync::Arc<dyn Provider>)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "local provider unavailable");
                    Err(e.to_string())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_of_reads_stat_past_a_tricky_comm() {
        let me = std::process::id();
        let parent = parent_of(me).unwrap();
        assert_eq!(parent, std::os::unix::process::parent_id());
    }

    #[test]
    fn cpu_ticks_add_own_and_waited_for_children() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime ...
        let stat = "42 (a (tricky) name) S 1 42 42 0 -1 4194560 10 0 0 0 7 3 20 5 20 0 1 0 100 0 0";
        assert_eq!(cpu_ticks(stat), Some(35));
        assert_eq!(cpu_ticks("42 (short) S 1"), None);
    }

    #[test]
    fn this_process_tree_uses_cpu_and_memory() {
        let used = tree_usage(std::process::id());
        assert!(used.memory_bytes.unwrap() > 1024 * 1024, "{used:?}");
        assert!(used.cpu_time.is_some());
        assert_eq!(used.memory_limit_bytes, None);
    }

    #[test]
    fn descendants_follow_the_tree_only() {
        let table = HashMap::from([(2, 1), (3, 2), (4, 3), (5, 1), (6, 9)]);
        let d = descendants(2, &table);
        assert_eq!(d, HashSet::from([3, 4]));
    }

    #[test]
    fn ids_that_are_not_ours_are_refused_before_touching_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let provider = LocalProvider {
            sandboxes_dir: dir.path().to_path_buf(),
            agent_binary: PathBuf::from("/bin/true"),
            ready_timeout: Duration::from_secs(1),
        };
        for bad in ["../etc", "0123456789abcde/", "0123456789ABCDEF", "", "0123456789abcdef0"] {
            let err = WireError::from(provider.sandbox_dir(bad).unwrap_err());
            assert_eq!(err.code, shared::error::ErrorCode::InvalidArgument, "{bad}");
        }
        assert!(provider.sandbox_dir("0123456789abcdef").is_ok());
    }
}
