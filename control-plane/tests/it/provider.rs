//! One lifecycle suite for every provider: `local` always, `docker` on the
//! real engine when it is there (required under `SANDHOLD_REQUIRE_SERVICES=1`).
//! Provider-specific behaviour (Docker's network, labels, limits, snapshots,
//! forks, failed creates; the local provider's process cleanup) follows.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use control_plane::provider::{
    DockerProvider, DockerProviderOptions, LABEL_DEFINITION, LABEL_MANAGED, LABEL_SANDBOX_KEY, LABEL_TENANT,
    LocalProvider, LocalProviderOptions, MountSpec, Provider, ProviderKind, Sandbox, SandboxSpec,
};
use sandhold_tests::agent::static_agent;
use sandhold_tests::docker::{self, DockerCleanup, TEST_IMAGE, ensure_test_image};
use sandhold_tests::provider::*;
use sandhold_tests::runtime::Runtime;
use sandhold_tests::under_each_runtime;
use sandhold_tests::wait::eventually;
use shared::error::{Error, ErrorCode};

/// A provider under test with what it needs kept alive and cleaned up.
struct Harness {
    provider: Arc<dyn Provider>,
    /// Where the provider keeps per-sandbox directories (local: the
    /// sandboxes dir; Docker: the state dir).
    dirs: PathBuf,
    /// Docker's runtime for every spec (unused by the local provider).
    runtime: Runtime,
    /// Kills what the local provider's sandboxes left running, then goes.
    _tmp: sandhold_tests::local::TestDir,
}

impl Harness {
    fn kind(&self) -> ProviderKind {
        self.provider.kind()
    }

    /// The per-sandbox directories of the state dir (Docker's `agent/`, the
    /// binary every container binds, is the provider's own, not one).
    fn dir_entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.dirs)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| !(self.kind().as_str() == "docker" && name == "agent"))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A spec of this harness (Docker: the busybox test image, under the
    /// harness's runtime).
    fn spec(&self, test: &str) -> SandboxSpec {
        let mut spec = unique_spec(test);
        if self.kind().as_str() == "docker" {
            spec.docker.image = Some(TEST_IMAGE.to_string());
            spec.docker.runtime = Some(self.runtime.config());
        }
        spec
    }
}

fn local() -> Harness {
    // Short path: agent sockets live under it (107-byte limit).
    let tmp = sandhold_tests::local::TestDir::new("sh-l");
    let mut options = LocalProviderOptions::new(tmp.path());
    options.agent_binary = Some(static_agent());
    let provider = LocalProvider::new(options).expect("local provider");
    let dirs = tmp.path().canonicalize().unwrap().join("sandboxes");
    Harness { provider: Arc::new(provider), dirs, runtime: Runtime::Runc, _tmp: tmp }
}

async fn docker_with(ready_timeout: Duration, runtime: Runtime) -> Option<Harness> {
    if !runtime.available() {
        return None;
    }
    ensure_test_image();
    let tmp = sandhold_tests::local::TestDir::new("sh-d");
    let mut options = DockerProviderOptions::new(static_agent(), tmp.path());
    options.ready_timeout = ready_timeout;
    let provider = DockerProvider::connect(options).await.expect("docker provider");
    let dirs = tmp.path().canonicalize().unwrap();
    Some(Harness { provider: Arc::new(provider), dirs, runtime, _tmp: tmp })
}

async fn docker() -> Option<Harness> {
    docker_with(Duration::from_secs(120), Runtime::Runc).await
}

// ---------------------------------------------------------------- the suite

/// create → exec → files → resume (live) → resume after the agent daemon is
/// SIGKILLed → list by label → destroy (idempotent) → resume is None and
/// nothing is left.
async fn lifecycle(h: &Harness) {
    let spec = h.spec("lifecycle");
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let sandbox = h.provider.create(&spec).await.expect("create");
    let agent = connect(&sandbox).await;
    assert_eq!(agent.handshake().protocol_version, shared::AGENT_PROTOCOL_VERSION);
    assert_eq!(PathBuf::from(&agent.handshake().root), sandbox.workspace, "the agent serves the workspace");

    assert_eq!(sh_ok(&agent, "echo hello from the sandbox").await, "hello from the sandbox\n");
    // The spec's (non-secret) environment reaches commands.
    assert_eq!(sh_ok(&agent, "echo $SANDHOLD_TEST_SPEC_VAR").await, "from-spec\n");
    sh_ok(&agent, "printf 'kept across restarts' > notes.txt").await;
    assert_eq!(sh_ok(&agent, "cat notes.txt").await, "kept across restarts");

    // A live sandbox resumes as itself: same id, same agent process.
    let resumed = h.provider.resume(&sandbox.provider_id).await.expect("resume").expect("still there");
    assert_eq!(resumed.provider_id, sandbox.provider_id);
    let again = connect(&resumed).await;
    assert_eq!(again.handshake().pid, agent.handshake().pid, "resume of a live sandbox reuses its agent");

    // Kill the agent daemon outright; resume must bring an agent back on
    // the same files.
    let daemon_pid = agent.handshake().pid;
    // From outside on Docker: the run user cannot signal the root agent.
    match h.kind().as_str() {
        "docker" => docker::cli(&["exec", &sandbox.provider_id, "kill", "-9", &daemon_pid.to_string()]),
        _ => drop(sh(&agent, &format!("kill -9 {daemon_pid}")).await),
    }
    let revived =
        h.provider.resume(&sandbox.provider_id).await.expect("resume after kill").expect("still there");
    let revived_agent = connect(&revived).await;
    assert_ne!(revived_agent.handshake().pid, daemon_pid, "a new agent daemon answers");
    assert_eq!(sh_ok(&revived_agent, "cat notes.txt").await, "kept across restarts");

    // Found by its labels, and only by matching ones.
    let listed = h.provider.list(&tenant_labels(&spec)).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].provider_id, sandbox.provider_id);
    assert_eq!(listed[0].labels.get(LABEL_SANDBOX_KEY), Some(&spec.key));
    assert_eq!(listed[0].labels.get(LABEL_DEFINITION), Some(&spec.definition_id));
    assert_eq!(listed[0].labels.get(LABEL_MANAGED).map(String::as_str), Some("true"));
    assert!(listed[0].running);
    let other = BTreeMap::from([(LABEL_TENANT.to_string(), "someone-else".to_string())]);
    assert!(h.provider.list(&other).await.unwrap().iter().all(|s| s.provider_id != sandbox.provider_id));

    // What it uses, measured: memory now, and CPU time that grows with work.
    let used =
        h.provider.usage(&sandbox.provider_id).await.expect("usage").expect("a running sandbox is measured");
    assert!(used.memory_bytes.is_some_and(|m| m > 0), "{used:?}");
    sh_ok(&revived_agent, "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done").await;
    let later = h.provider.usage(&sandbox.provider_id).await.unwrap().unwrap();
    assert!(
        later.cpu_time.unwrap() >= used.cpu_time.unwrap() + Duration::from_millis(100),
        "a busy loop's CPU time counts: {used:?} then {later:?}"
    );

    h.provider.destroy(&sandbox.provider_id).await.expect("destroy");
    assert_eq!(h.provider.usage(&sandbox.provider_id).await.expect("usage after destroy"), None);
    assert!(h.provider.resume(&sandbox.provider_id).await.expect("resume after destroy").is_none());
    assert!(h.provider.list(&tenant_labels(&spec)).await.unwrap().is_empty());
    assert!(h.dir_entries().is_empty(), "per-sandbox dirs left: {:?}", h.dir_entries());
    if h.kind().as_str() == "docker" {
        assert!(docker::containers(&format!("{LABEL_TENANT}={}", spec.tenant)).is_empty(), "containers left");
    }
    // Destroy is idempotent.
    h.provider.destroy(&sandbox.provider_id).await.expect("second destroy");
}

/// Several sandboxes created at once are distinct and all work.
async fn concurrent_creates(h: &Harness) {
    let spec = h.spec("concurrent");
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let creates = (0..3).map(|i| {
        let provider = h.provider.clone();
        let mut spec = spec.clone();
        spec.key = format!("{}-{i}", spec.key);
        tokio::spawn(async move { provider.create(&spec).await })
    });
    let sandboxes: Vec<Sandbox> =
        futures::future::join_all(creates).await.into_iter().map(|r| r.unwrap().expect("create")).collect();
    let mut ids: Vec<&str> = sandboxes.iter().map(|s| s.provider_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "distinct sandboxes");
    for (i, sandbox) in sandboxes.iter().enumerate() {
        let agent = connect(sandbox).await;
        sh_ok(&agent, &format!("echo {i} > which")).await;
    }
    // Each has its own files.
    for (i, sandbox) in sandboxes.iter().enumerate() {
        assert_eq!(sh_ok(&connect(sandbox).await, "cat which").await, format!("{i}\n"));
    }
    assert_eq!(h.provider.list(&tenant_labels(&spec)).await.unwrap().len(), 3);
    for sandbox in &sandboxes {
        h.provider.destroy(&sandbox.provider_id).await.expect("destroy");
    }
    assert!(h.provider.list(&tenant_labels(&spec)).await.unwrap().is_empty());
}

/// Ids that never existed resume as None and destroy as a no-op.
async fn unknown_ids(h: &Harness) {
    let id = match h.kind().as_str() {
        "local" => "0123456789abcdef".to_string(),
        _ => "sandhold-does-not-exist".to_string(),
    };
    assert!(h.provider.resume(&id).await.expect("resume unknown").is_none());
    h.provider.destroy(&id).await.expect("destroy unknown");
}

#[tokio::test]
async fn local_lifecycle() {
    lifecycle(&local()).await;
}

#[tokio::test]
async fn local_concurrent_creates() {
    concurrent_creates(&local()).await;
}

#[tokio::test]
async fn local_unknown_ids() {
    unknown_ids(&local()).await;
}

// Under each runtime: the agent answers on its socket, survives as the
// sandbox's files when its daemon is killed, and is measured and destroyed
// the same way.
under_each_runtime! {
async fn docker_lifecycle(runtime) {
    let Some(h) = docker_with(Duration::from_secs(120), runtime).await else { return };
    lifecycle(&h).await;
}

async fn docker_concurrent_creates(runtime) {
    let Some(h) = docker_with(Duration::from_secs(120), runtime).await else { return };
    concurrent_creates(&h).await;
}
}

#[tokio::test]
async fn docker_unknown_ids() {
    let Some(h) = docker().await else { return };
    unknown_ids(&h).await;
}

// ---------------------------------------------------------------- local only

#[tokio::test]
async fn local_has_no_snapshots_or_fork_and_says_which_capability() {
    let h = local();
    let caps = h.provider.capabilities();
    assert!(!caps.snapshots && !caps.fork);
    let err = Error::from(h.provider.snapshot("0123456789abcdef").await.unwrap_err());
    assert_eq!(err.code, ErrorCode::Unsupported);
    assert!(err.message.contains("snapshots"), "{}", err.message);
    let err = Error::from(h.provider.fork("0123456789abcdef", &h.spec("fork")).await.unwrap_err());
    assert_eq!(err.code, ErrorCode::Unsupported);
    assert!(err.message.contains("fork"), "{}", err.message);
}

#[tokio::test]
async fn local_destroy_kills_processes_that_left_the_agents_session() {
    let h = local();
    let sandbox = h.provider.create(&h.spec("escape")).await.unwrap();
    let agent = connect(&sandbox).await;
    // A background process in a session of its own, outliving the command
    // that started it: what journal supervisors do.
    let pid: i32 = sh_ok(&agent, "setsid sleep 600 >/dev/null 2>&1 < /dev/null & echo $!")
        .await
        .trim()
        .parse()
        .expect("a pid");
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    assert!(proc_dir.exists(), "the background process runs");
    let init_pid: i32 = std::fs::read_to_string(h.dirs.join(&sandbox.provider_id).join("agent.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    h.provider.destroy(&sandbox.provider_id).await.unwrap();
    // Gone, or a zombie waiting for whoever reaps it.
    let gone = |pid: i32| !sandhold_tests::local::alive(pid);
    assert!(
        eventually(Duration::from_secs(30), || std::future::ready(gone(pid))).await,
        "the escaped process {pid} survived destroy"
    );
    assert!(
        eventually(Duration::from_secs(30), || std::future::ready(gone(init_pid))).await,
        "the agent init {init_pid} survived destroy"
    );
    // Our reaper thread waits for the init: no zombie of ours stays.
    assert!(
        eventually(Duration::from_secs(30), || std::future::ready(
            !PathBuf::from(format!("/proc/{init_pid}")).exists()
        ))
        .await,
        "the agent init {init_pid} was left a zombie"
    );
    assert!(!h.dirs.join(&sandbox.provider_id).exists());
}

#[tokio::test]
async fn local_resume_restarts_an_agent_whose_supervisor_died() {
    let h = local();
    let sandbox = h.provider.create(&h.spec("restart")).await.unwrap();
    let agent = connect(&sandbox).await;
    sh_ok(&agent, "echo still here > f").await;
    // Kill the whole agent (init and daemon), as a host reboot or an OOM
    // kill of the group would.
    let init_pid: i32 = std::fs::read_to_string(h.dirs.join(&sandbox.provider_id).join("agent.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(init_pid), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || std::future::ready(
            !PathBuf::from(format!("/proc/{init_pid}")).exists()
        ))
        .await
    );
    let listed = h.provider.list(&BTreeMap::new()).await.unwrap();
    assert!(!listed[0].running, "a dead agent is listed as not running");

    let revived = h.provider.resume(&sandbox.provider_id).await.unwrap().expect("the dir is still there");
    assert_eq!(sh_ok(&connect(&revived).await, "cat f").await, "still here\n");
    h.provider.destroy(&sandbox.provider_id).await.unwrap();
}

#[tokio::test]
async fn local_stop_ends_every_process_and_resume_brings_the_sandbox_back() {
    let h = local();
    let sandbox = h.provider.create(&h.spec("stop")).await.unwrap();
    let agent = connect(&sandbox).await;
    sh_ok(&agent, "echo kept > f").await;
    let init_pid: i32 = std::fs::read_to_string(h.dirs.join(&sandbox.provider_id).join("agent.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    h.provider.stop(&sandbox.provider_id).await.unwrap();
    assert!(
        eventually(Duration::from_secs(30), || std::future::ready(
            !PathBuf::from(format!("/proc/{init_pid}")).exists()
        ))
        .await
    );
    assert!(
        control_plane::agent::AgentClient::connect(&sandbox.address, &sandbox.token).await.is_err(),
        "the agent still answers after stop"
    );
    let listed = h.provider.list(&BTreeMap::new()).await.unwrap();
    assert!(!listed[0].running, "a stopped sandbox is listed as not running");
    assert!(h.dirs.join(&sandbox.provider_id).is_dir(), "stop keeps the sandbox's directory");

    let revived = h.provider.resume(&sandbox.provider_id).await.unwrap().expect("stopped, not gone");
    assert_eq!(sh_ok(&connect(&revived).await, "cat f").await, "kept\n");
    h.provider.destroy(&sandbox.provider_id).await.unwrap();
}

#[tokio::test]
async fn local_failed_create_leaves_no_directory() {
    let tmp = sandhold_tests::local::TestDir::new("sh-f");
    let mut options = LocalProviderOptions::new(tmp.path());
    // An "agent" that exits at once.
    options.agent_binary = Some(PathBuf::from("/bin/false"));
    options.ready_timeout = Duration::from_secs(2);
    let provider = LocalProvider::new(options).unwrap();
    let err = Error::from(provider.create(&unique_spec("fail")).await.unwrap_err());
    assert_eq!(err.code, ErrorCode::Unavailable, "{err}");
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("sandboxes")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

// ---------------------------------------------------------------- docker only

#[tokio::test]
async fn docker_sandbox_has_no_network_and_carries_its_labels() {
    let Some(h) = docker().await else { return };
    let spec = h.spec("net");
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let sandbox = h.provider.create(&spec).await.unwrap();
    let agent = connect(&sandbox).await;
    let dev = sh_ok(&agent, "cat /proc/net/dev").await;
    let interfaces: Vec<&str> =
        dev.lines().skip(2).filter_map(|l| l.split(':').next()).map(str::trim).collect();
    assert_eq!(interfaces, vec!["lo"], "{dev}");
    assert_eq!(docker::inspect(&sandbox.provider_id, "{{.HostConfig.NetworkMode}}"), "none");
    for (label, value) in [
        (LABEL_MANAGED, "true"),
        (LABEL_TENANT, spec.tenant.as_str()),
        (LABEL_SANDBOX_KEY, spec.key.as_str()),
        (LABEL_DEFINITION, spec.definition_id.as_str()),
    ] {
        assert_eq!(
            docker::inspect(&sandbox.provider_id, &format!("{{{{index .Config.Labels \"{label}\"}}}}")),
            value
        );
    }
    // The image knows nothing of Sandhold: the agent was copied in.
    assert_eq!(
        docker::inspect(&sandbox.provider_id, "{{index .Config.Entrypoint 0}}"),
        "/.sandhold/sandhold-agent"
    );
    h.provider.destroy(&sandbox.provider_id).await.unwrap();
}

#[tokio::test]
async fn docker_limits_are_applied() {
    let Some(h) = docker().await else { return };
    let mut spec = h.spec("limits");
    spec.docker.memory_bytes = Some(256 * 1024 * 1024);
    spec.docker.cpus = Some(0.5);
    spec.docker.pids_limit = Some(100);
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let sandbox = h.provider.create(&spec).await.unwrap();
    let id = &sandbox.provider_id;
    assert_eq!(docker::inspect(id, "{{.HostConfig.Memory}}"), (256 * 1024 * 1024).to_string());
    assert_eq!(docker::inspect(id, "{{.HostConfig.NanoCpus}}"), "500000000");
    assert_eq!(docker::inspect(id, "{{.HostConfig.PidsLimit}}"), "100");
    // The kernel enforces them: the container's own cgroup says so (v2 or v1).
    let agent = connect(&sandbox).await;
    let read = |v2: &str, v1: &str| format!("cat /sys/fs/cgroup/{v2} 2>/dev/null || cat /sys/fs/cgroup/{v1}");
    assert_eq!(sh_ok(&agent, &read("pids.max", "pids/pids.max")).await.trim(), "100");
    assert_eq!(
        sh_ok(&agent, &read("memory.max", "memory/memory.limit_in_bytes")).await.trim(),
        (256 * 1024 * 1024).to_string()
    );
    let cpu = sh_ok(&agent, &read("cpu.max", "cpu/cpu.cfs_quota_us")).await;
    assert!(cpu.trim() == "50000 100000" || cpu.trim() == "50000", "cpu quota: {cpu}");
    h.provider.destroy(id).await.unwrap();
}

#[tokio::test]
async fn docker_read_only_root_with_a_user_keeps_a_writable_workspace() {
    let Some(h) = docker().await else { return };
    let mut spec = h.spec("readonly");
    spec.docker.read_only_root = true;
    spec.docker.user = Some("nobody".into());
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let sandbox = h.provider.create(&spec).await.expect("create read-only");
    let agent = connect(&sandbox).await;
    assert_eq!(sh_ok(&agent, "id -u").await, "65534\n");
    sh_ok(&agent, "echo ok > in-workspace && cat in-workspace").await;
    let (code, _) = sh(&agent, "touch /etc/x 2>/dev/null").await.unwrap();
    assert_ne!(code, 0, "the root filesystem is read-only");
    assert_eq!(docker::inspect(&sandbox.provider_id, "{{.HostConfig.ReadonlyRootfs}}"), "true");
    // A commit would miss the workspace (a bind mount), so it is refused.
    assert_eq!(
        Error::from(h.provider.snapshot(&sandbox.provider_id).await.unwrap_err()).code,
        ErrorCode::FailedPrecondition
    );
    h.provider.destroy(&sandbox.provider_id).await.unwrap();
    assert!(h.dir_entries().is_empty());
}

#[tokio::test]
async fn docker_snapshot_restore_keeps_files_written_before_the_snapshot() {
    let Some(h) = docker().await else { return };
    let spec = h.spec("snap");
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let sandbox = h.provider.create(&spec).await.unwrap();
    let agent = connect(&sandbox).await;
    sh_ok(&agent, "echo before > before.txt").await;
    let snapshot = h.provider.snapshot(&sandbox.provider_id).await.expect("snapshot");
    assert!(snapshot.id.starts_with("sandhold-snapshot:"), "{}", snapshot.id);
    sh_ok(&agent, "echo after > after.txt").await;

    let mut restored_spec = spec.clone();
    restored_spec.key = format!("{}-restored", spec.key);
    let restored = h.provider.restore(&snapshot, &restored_spec).await.expect("restore");
    assert_ne!(restored.provider_id, sandbox.provider_id);
    let r = connect(&restored).await;
    assert_eq!(sh_ok(&r, "cat before.txt").await, "before\n");
    assert_eq!(sh_ok(&r, "test -e after.txt && echo yes || echo no").await, "no\n");
    assert_eq!(
        docker::inspect(
            &restored.provider_id,
            &format!("{{{{index .Config.Labels \"{LABEL_SANDBOX_KEY}\"}}}}")
        ),
        restored_spec.key,
        "the restored sandbox carries its own key, not the snapshot's"
    );
    h.provider.destroy(&restored.provider_id).await.unwrap();
    h.provider.destroy(&sandbox.provider_id).await.unwrap();
    h.provider.delete_snapshot(&snapshot).await.unwrap();
    let gone =
        std::process::Command::new("docker").args(["image", "inspect", &snapshot.id]).output().unwrap();
    assert!(!gone.status.success(), "the snapshot image was deleted");
}

#[tokio::test]
async fn docker_fork_is_an_independent_copy() {
    let Some(h) = docker().await else { return };
    let spec = h.spec("fork");
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let original = h.provider.create(&spec).await.unwrap();
    let o = connect(&original).await;
    sh_ok(&o, "echo shared > shared.txt").await;
    let mut fork_spec = spec.clone();
    fork_spec.key = format!("{}-fork", spec.key);
    let fork = h.provider.fork(&original.provider_id, &fork_spec).await.expect("fork");
    let f = connect(&fork).await;
    assert_eq!(sh_ok(&f, "cat shared.txt").await, "shared\n");
    sh_ok(&f, "echo fork > fork-only.txt").await;
    sh_ok(&o, "echo original > original-only.txt").await;
    assert_eq!(sh_ok(&o, "test -e fork-only.txt && echo yes || echo no").await, "no\n");
    assert_eq!(sh_ok(&f, "test -e original-only.txt && echo yes || echo no").await, "no\n");
    let fork_image =
        docker::inspect(&fork.provider_id, "{{index .Config.Labels \"dev.sandhold.fork-image\"}}");
    assert!(fork_image.starts_with("sandhold-fork:"), "{fork_image}");
    h.provider.destroy(&fork.provider_id).await.unwrap();
    let gone = std::process::Command::new("docker").args(["image", "inspect", &fork_image]).output().unwrap();
    assert!(!gone.status.success(), "the fork's image goes with the fork");
    // The original is untouched by the fork's destroy.
    assert_eq!(sh_ok(&o, "cat shared.txt").await, "shared\n");
    h.provider.destroy(&original.provider_id).await.unwrap();
}

#[tokio::test]
async fn docker_missing_image_is_a_clear_error_and_leaves_nothing() {
    let Some(h) = docker().await else { return };
    let mut spec = h.spec("noimage");
    spec.docker.image = Some("sandhold-no-such-image:never".into());
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let err = Error::from(h.provider.create(&spec).await.unwrap_err());
    assert_eq!(err.code, ErrorCode::FailedPrecondition, "{err}");
    assert!(
        err.message.contains("sandhold-no-such-image:never") && err.message.contains("registry"),
        "{err}"
    );
    assert!(docker::containers(&format!("{LABEL_TENANT}={}", spec.tenant)).is_empty());
    assert!(h.dir_entries().is_empty(), "{:?}", h.dir_entries());
}

#[tokio::test]
async fn docker_container_that_cannot_start_leaves_nothing() {
    let Some(h) = docker().await else { return };
    let mut spec = h.spec("nostart");
    // Docker refuses to start a container whose bind source is missing.
    spec.docker.mounts = vec![MountSpec {
        source: "/nonexistent/sandhold-test".into(),
        target: "/data".into(),
        read_only: true,
    }];
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let err = Error::from(h.provider.create(&spec).await.unwrap_err());
    assert!(err.message.contains("starting the container") || err.message.contains("creating"), "{err}");
    assert!(
        docker::containers(&format!("{LABEL_TENANT}={}", spec.tenant)).is_empty(),
        "a container was left"
    );
    assert!(h.dir_entries().is_empty(), "{:?}", h.dir_entries());
}

#[tokio::test]
async fn docker_entrypoint_that_dies_leaves_nothing() {
    let Some(h) = docker().await else { return };
    let mut spec = h.spec("dies");
    // With room for one process only, the agent's init cannot start its
    // daemon and exits: the container stops before anything answers.
    spec.docker.pids_limit = Some(1);
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let err = Error::from(h.provider.create(&spec).await.unwrap_err());
    assert_eq!(err.code, ErrorCode::Unavailable, "{err}");
    assert!(err.message.contains("stopped before its agent answered"), "{err}");
    assert!(
        docker::containers(&format!("{LABEL_TENANT}={}", spec.tenant)).is_empty(),
        "a container was left"
    );
    assert!(h.dir_entries().is_empty(), "{:?}", h.dir_entries());
}

#[tokio::test]
async fn docker_resume_starts_a_stopped_container() {
    let Some(h) = docker().await else { return };
    let spec = h.spec("stopped");
    let _guard = DockerCleanup { tenant: spec.tenant.clone() };
    let sandbox = h.provider.create(&spec).await.unwrap();
    sh_ok(&connect(&sandbox).await, "echo durable > d.txt").await;
    let out = std::process::Command::new("docker")
        .args(["stop", "-t", "5", &sandbox.provider_id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!h.provider.list(&tenant_labels(&spec)).await.unwrap()[0].running);
    let resumed = h.provider.resume(&sandbox.provider_id).await.unwrap().expect("stopped is not gone");
    assert_eq!(sh_ok(&connect(&resumed).await, "cat d.txt").await, "durable\n");
    h.provider.destroy(&sandbox.provider_id).await.unwrap();
}
