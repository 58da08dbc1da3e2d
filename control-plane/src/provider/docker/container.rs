//! The container of a sandbox, as a pure function of its spec: what
//! [`container_config`] returns is all the engine is told at create time.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountTypeEnum};

use super::{
    AGENT_DIR, AGENT_PATH, DEFAULT_WORKDIR, DockerOptions, LABEL_FORK_IMAGE, LABEL_HOST_DIR, RUN_DIR,
};
use crate::config::Runtime;
use crate::provider::{Result, SandboxSpec};
use crate::provision::InvalidField;

/// What a new container is made from.
pub(super) struct Origin {
    pub image: String,
    /// Set for forks: the image made for this sandbox alone, removed with it.
    pub fork_image: Option<String>,
}

/// The capabilities a sandbox keeps; every other one is dropped. The agent
/// runs as root and starts runs, setup steps
/// and execs as an unprivileged run user, and the workspace and journal
/// belong to different users:
/// - `SETUID`, `SETGID`: switching to the run user (and apt's `_apt`);
/// - `CHOWN`: handing the workspace and restored files to the run user;
/// - `DAC_OVERRIDE`: the agent reading and writing files of other users
///   (the workspace, the host directory owned by the control plane's uid);
/// - `FOWNER`: setting modes and times on files it does not own (snapshot
///   restore, uploads);
/// - `KILL`: signalling (timeouts, cancel) processes of the run user.
///
/// Gone, among others: `NET_RAW`, `MKNOD`, `SYS_CHROOT`, `SETFCAP`,
/// `AUDIT_WRITE`, `NET_BIND_SERVICE`, `FSETID`, `SETPCAP`.
pub(super) const AGENT_CAPABILITIES: [&str; 6] =
    ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"];

/// The workspace directory inside the container: the spec's, checked, else
/// `/workspace`.
pub(super) fn workdir(opts: &DockerOptions) -> Result<String> {
    let workdir = opts.workdir.clone().unwrap_or_else(|| DEFAULT_WORKDIR.to_string());
    if let Some(why) = workdir_violation(&workdir) {
        return Err(InvalidField::new("docker.workdir", why).into());
    }
    Ok(workdir)
}

/// Directories of the image a workspace may not be, contain, or sit in.
const SYSTEM_DIRS: [&str; 12] =
    ["/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr"];

/// Why `workdir` cannot be a sandbox's workspace, or `None`. The agent hands
/// the workspace's whole tree to the run user (a uid the tenant picks), so
/// it must be a directory of its own: absolute and normalized, not `/`, and
/// neither holding nor inside the agent's paths (its binary, its token and
/// journals, the toolchains) or a system directory.
pub(crate) fn workdir_violation(workdir: &str) -> Option<String> {
    if !workdir.starts_with('/') {
        return Some(format!("{workdir:?} must be an absolute path"));
    }
    let parts: Vec<&str> = workdir[1..].split('/').collect();
    if workdir == "/" {
        return Some("\"/\" would hand the whole container to the run user".into());
    }
    if parts.iter().any(|c| c.is_empty() || *c == "." || *c == "..") {
        return Some(format!("{workdir:?} must be a normalized path (no empty, . or .. component)"));
    }
    // Component-wise, so `/runner` is not inside `/run`.
    let within = |inner: &str, outer: &str| {
        inner == outer || inner.strip_prefix(outer).is_some_and(|rest| rest.starts_with('/'))
    };
    for agent in [AGENT_DIR, RUN_DIR, crate::toolchain::MOUNT] {
        if within(workdir, agent) || within(agent, workdir) {
            return Some(format!(
                "{workdir:?} overlaps the agent's {agent}, which the run user must not own"
            ));
        }
    }
    for system in SYSTEM_DIRS {
        if within(workdir, system) {
            return Some(format!("{workdir:?} is inside the system directory {system}"));
        }
    }
    None
}

/// The container of `spec` started from `origin`, its host directory at
/// `host_dir`: the agent as entrypoint (PID 1, `init` mode) listening in
/// the host directory, no network unless one is named, the spec's limits
/// and mounts, and the harness CLIs of `toolchains` read-only. Refuses a
/// relative workdir or mount target.
pub(super) fn container_config(
    spec: &SandboxSpec,
    origin: &Origin,
    host_dir: &Path,
    agent: &Path,
    toolchains: Option<&Path>,
) -> Result<ContainerCreateBody> {
    let opts = &spec.docker;
    let workdir = workdir(opts)?;
    let mut labels: HashMap<String, String> = spec.labels().into_iter().collect();
    labels.insert(LABEL_HOST_DIR.into(), host_dir.display().to_string());
    labels.insert(LABEL_FORK_IMAGE.into(), origin.fork_image.clone().unwrap_or_default());

    let mut mounts = vec![
        bind(&host_dir.display().to_string(), RUN_DIR, false),
        bind(&agent.display().to_string(), AGENT_PATH, true),
    ];
    if let Some(dir) = toolchains {
        mounts.push(bind(&dir.display().to_string(), crate::toolchain::MOUNT, true));
    }
    let mut tmpfs = HashMap::new();
    if opts.read_only_root {
        // Uploads into a read-only rootfs are refused even before start:
        // the workspace is the host directory's, which the agent hands to
        // the run user.
        mounts.push(bind(&host_dir.join("workspace").display().to_string(), &workdir, false));
        tmpfs.insert("/tmp".to_string(), "mode=1777".to_string());
    }
    for m in &opts.mounts {
        if !m.target.starts_with('/') {
            return Err(InvalidField::new(
                "docker.mounts.target",
                format!("{:?} must be absolute", m.target),
            )
            .into());
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
        cap_drop: Some(vec!["ALL".to_string()]),
        cap_add: Some(AGENT_CAPABILITIES.iter().map(|c| c.to_string()).collect()),
        // Nothing in the sandbox gains privileges through execve (setuid
        // binaries, file capabilities).
        security_opt: Some(vec!["no-new-privileges:true".to_string()]),
        // Named even for runc: an engine whose default runtime is another
        // must not put a sandbox that asked for runc under it.
        runtime: Some(opts.runtime.unwrap_or(Runtime::Runc).engine_name().to_string()),
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
        "--run-user",
        super::user::run_user(opts.user.as_deref()),
    ]
    .into_iter()
    .map(String::from)
    .collect();
    Ok(ContainerCreateBody {
        image: Some(origin.image.clone()),
        entrypoint: Some(entrypoint),
        // An explicit entrypoint drops the image's CMD; say so anyway.
        cmd: Some(Vec::new()),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        // The agent is root in the container; `opts.user` is the run user
        // it starts every command as (`--run-user`).
        user: Some("0:0".into()),
        working_dir: Some(workdir),
        labels: Some(labels),
        stop_signal: Some("SIGTERM".into()),
        host_config: Some(host_config),
        ..Default::default()
    })
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::provider::{LABEL_MANAGED, LABEL_SANDBOX_KEY, MountSpec};

    fn spec(docker: DockerOptions) -> SandboxSpec {
        SandboxSpec {
            key: "k1".into(),
            tenant: "acme".into(),
            definition_id: "def".into(),
            env: BTreeMap::from([("A".to_string(), "1".to_string())]),
            docker,
        }
    }

    fn origin() -> Origin {
        Origin { image: "debian:bookworm".into(), fork_image: None }
    }

    fn entrypoint_has(body: &ContainerCreateBody, pair: [&str; 2]) -> bool {
        body.entrypoint.as_ref().unwrap().windows(2).any(|w| w == pair)
    }

    const AGENT: &str = "/s/agent/sandhold-agent-0123456789abcdef";

    fn mount(m: &Mount) -> (Option<&str>, &str, Option<MountTypeEnum>, bool) {
        (m.source.as_deref(), m.target.as_deref().unwrap(), m.typ, m.read_only.unwrap_or(false))
    }

    #[test]
    fn a_default_container_runs_the_agent_without_network() {
        let body = container_config(
            &spec(DockerOptions::default()),
            &origin(),
            Path::new("/s/abc"),
            Path::new(AGENT),
            None,
        )
        .unwrap();
        assert_eq!(body.image.as_deref(), Some("debian:bookworm"));
        assert_eq!(body.working_dir.as_deref(), Some("/workspace"));
        assert_eq!(body.env, Some(vec!["A=1".to_string()]));
        assert_eq!(body.user.as_deref(), Some("0:0"), "the agent is root");
        assert!(entrypoint_has(&body, ["--run-user", "10001:10001"]), "the default run user");
        assert_eq!(body.cmd, Some(vec![]));
        let entrypoint = body.entrypoint.unwrap();
        assert_eq!(entrypoint[..4], ["/.sandhold/sandhold-agent", "init", "--", "serve"]);
        assert!(entrypoint.windows(2).any(|w| w == ["--listen", "unix:/run/sandhold/agent.sock"]));
        assert!(entrypoint.windows(2).any(|w| w == ["--root", "/workspace"]));
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_MANAGED], "true");
        assert_eq!(labels[LABEL_SANDBOX_KEY], "k1");
        assert_eq!(labels[LABEL_HOST_DIR], "/s/abc");
        assert_eq!(labels[LABEL_FORK_IMAGE], "");
        let host = body.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(
            host.cap_add,
            Some(["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"].map(String::from).to_vec())
        );
        assert_eq!(host.security_opt, Some(vec!["no-new-privileges:true".to_string()]));
        assert_eq!(host.privileged, None);
        assert_eq!(host.runtime.as_deref(), Some("runc"), "named, whatever the engine's default");
        assert_eq!(host.readonly_rootfs, Some(false));
        assert_eq!(host.tmpfs, None);
        let mounts = host.mounts.unwrap();
        assert_eq!(
            mounts.iter().map(mount).collect::<Vec<_>>(),
            vec![
                (Some("/s/abc"), "/run/sandhold", Some(MountTypeEnum::BIND), false),
                (Some(AGENT), "/.sandhold/sandhold-agent", Some(MountTypeEnum::BIND), true),
            ]
        );
    }

    #[test]
    fn gvisor_is_the_engines_runsc() {
        let docker = DockerOptions { runtime: Some(Runtime::Gvisor), ..Default::default() };
        let body =
            container_config(&spec(docker), &origin(), Path::new("/s/abc"), Path::new(AGENT), None).unwrap();
        assert_eq!(body.host_config.unwrap().runtime.as_deref(), Some("runsc"));
    }

    #[test]
    fn options_become_limits_mounts_and_a_network() {
        let docker = DockerOptions {
            user: Some("1000:1000".into()),
            workdir: Some("/w".into()),
            memory_bytes: Some(1 << 30),
            cpus: Some(1.5),
            pids_limit: Some(64),
            read_only_root: true,
            network: Some("sandnet".into()),
            mounts: vec![
                MountSpec { source: "/host/data".into(), target: "/data".into(), read_only: true },
                MountSpec { source: "cache".into(), target: "/cache".into(), read_only: false },
            ],
            ..Default::default()
        };
        let fork = Origin { image: "sandhold-fork:x".into(), fork_image: Some("sandhold-fork:x".into()) };
        let body =
            container_config(&spec(docker), &fork, Path::new("/s/abc"), Path::new(AGENT), None).unwrap();
        assert_eq!(body.user.as_deref(), Some("0:0"), "the agent is root");
        assert!(
            entrypoint_has(&body, ["--run-user", "1000:1000"]),
            "the definition's user runs the commands"
        );
        assert_eq!(body.working_dir.as_deref(), Some("/w"));
        assert_eq!(body.labels.unwrap()[LABEL_FORK_IMAGE], "sandhold-fork:x");
        let host = body.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("sandnet"));
        assert_eq!(
            (host.memory, host.nano_cpus, host.pids_limit),
            (Some(1 << 30), Some(1_500_000_000), Some(64))
        );
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.tmpfs, Some(HashMap::from([("/tmp".to_string(), "mode=1777".to_string())])));
        assert_eq!(
            host.mounts.unwrap().iter().map(mount).collect::<Vec<_>>(),
            vec![
                (Some("/s/abc"), "/run/sandhold", Some(MountTypeEnum::BIND), false),
                (Some(AGENT), "/.sandhold/sandhold-agent", Some(MountTypeEnum::BIND), true),
                (Some("/s/abc/workspace"), "/w", Some(MountTypeEnum::BIND), false),
                (Some("/host/data"), "/data", Some(MountTypeEnum::BIND), true),
                (Some("cache"), "/cache", Some(MountTypeEnum::VOLUME), false),
            ]
        );
    }

    #[test]
    fn a_workdir_over_or_under_the_agent_or_the_system_is_refused() {
        for bad in [
            "/",
            "/run/sandhold",
            "/run/sandhold/journal",
            "/run",
            "/.sandhold",
            "/.sandhold/x",
            "/opt",
            "/opt/sandhold/toolchains/node",
            "/proc/1",
            "/etc",
            "/usr/local/src",
            "/w//x",
            "/w/./x",
            "/w/",
        ] {
            assert!(workdir_violation(bad).is_some(), "{bad} should be refused");
        }
        for good in ["/workspace", "/w", "/home/dev/project", "/srv/app", "/runner", "/optional"] {
            assert_eq!(workdir_violation(good), None, "{good}");
        }
    }

    #[test]
    fn relative_paths_are_refused() {
        for workdir in ["relative", "/a/../b"] {
            let docker = DockerOptions { workdir: Some(workdir.into()), ..Default::default() };
            let err = container_config(&spec(docker), &origin(), Path::new("/s"), Path::new(AGENT), None)
                .unwrap_err();
            let err = shared::error::Error::from(err);
            assert_eq!(err.code, shared::error::ErrorCode::InvalidArgument);
            assert!(err.message.starts_with("docker.workdir:"), "{err:?}");
        }
        let docker = DockerOptions {
            mounts: vec![MountSpec { source: "v".into(), target: "data".into(), read_only: false }],
            ..Default::default()
        };
        let err =
            container_config(&spec(docker), &origin(), Path::new("/s"), Path::new(AGENT), None).unwrap_err();
        let err = shared::error::Error::from(err);
        assert!(err.message.starts_with("docker.mounts.target:"), "{err:?}");
    }

    #[test]
    fn image_tags_are_valid() {
        assert_eq!(image_tag("abc123"), "abc123");
        assert_eq!(image_tag("t/x:y"), "t_x_y");
        assert_eq!(image_tag(""), "k");
        assert_eq!(image_tag("-x"), "k-x");
        assert_eq!(image_tag(&"a".repeat(300)).len(), 128);
    }
}
