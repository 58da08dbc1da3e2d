//! A hostile tenant against the operator policy and the Docker hardening,
//! on a real `sandhold serve` with API tokens: each test tries what a
//! stranger running code on the operator's machines would, and asserts
//! the attempt fails (and, where an opt-in exists, that it is the policy
//! that stopped it: with the opt-in the same attempt works).

use std::os::unix::fs::PermissionsExt;

use bollard::query_parameters::InspectContainerOptions;
use sandhold_tests::docker::{DockerCleanup, TEST_IMAGE, ensure_test_image};
use sandhold_tests::local::TestDir;
use sandhold_tests::nonce;
use sandhold_tests::runtime::Runtime;
use sandhold_tests::sandbox::{ensure, sh};
use sandhold_tests::server::{Sandboxes, ServerOptions, ServerProcess};
use sandhold_tests::under_each_runtime;
use shared::proto::v1 as api;

/// A server with two tenants, the policy as shipped plus `extra_args`.
pub(crate) fn options(dir: &TestDir, nonce: &str, extra_args: &[&str]) -> ServerOptions {
    ServerOptions {
        data_dir: dir.path().join("data"),
        tokens: vec![format!("evil{nonce}=tok-evil-{nonce}"), format!("victim{nonce}=tok-victim-{nonce}")],
        extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        operator_defaults: true,
        ..Default::default()
    }
}

fn definition(id: &str, provider: api::provider_spec::Provider) -> api::SandboxDefinition {
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec { provider: Some(provider) }),
        ..Default::default()
    }
}

fn local(id: &str) -> api::SandboxDefinition {
    definition(id, api::provider_spec::Provider::Local(api::LocalProvider {}))
}

pub(crate) fn docker(id: &str, d: api::DockerProvider) -> api::SandboxDefinition {
    definition(id, api::provider_spec::Provider::Docker(d))
}

pub(crate) fn busybox() -> api::DockerProvider {
    api::DockerProvider { image: TEST_IMAGE.into(), ..Default::default() }
}

/// The field violations of a refused call (INVALID_ARGUMENT).
pub(crate) fn violations(status: &tonic::Status) -> Vec<(String, String)> {
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    shared::error::Error::from_status(status).field_violations
}

pub(crate) async fn put(
    server: &ServerProcess,
    token: &str,
    d: api::SandboxDefinition,
) -> Result<api::SandboxDefinition, tonic::Status> {
    let mut client = server.sandboxes(token).await;
    client
        .put_definition(api::PutDefinitionRequest { definition: Some(d) })
        .await
        .map(|r| r.into_inner().definition.unwrap())
}

fn ensure_request(definition_id: &str, thread: &str) -> api::EnsureSandboxRequest {
    api::EnsureSandboxRequest {
        definition_id: definition_id.into(),
        thread_id: thread.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn with_tokens_the_local_provider_is_off_unless_the_operator_opts_in() {
    let dir = TestDir::new("sh-hostile");
    let n = nonce();
    let evil = format!("tok-evil-{n}");
    let victim_token = format!("tok-victim-{n}");

    // As shipped: a local definition is refused by name, at PutDefinition.
    let server = ServerProcess::start(&options(&dir, &n, &[])).await;
    let refused = put(&server, &evil, local("steal")).await.unwrap_err();
    let v = violations(&refused);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].0, "definition.provider");
    assert!(v[0].1.contains("allow_local_with_tokens"), "{v:?}");
    assert!(server.log_text().contains("local provider off"), "the start says so:\n{}", server.log_text());
    drop(server);

    // With the opt-in, the attack of the issue works: a local sandbox
    // reads the server's environment, every tenant's token in it.
    let mut opted = options(&dir, &n, &[]);
    opted.operator_defaults = false;
    let server = ServerProcess::start(&opted).await;
    assert!(server.log_text().contains("local provider enabled with API tokens"), "{}", server.log_text());
    put(&server, &evil, local("steal")).await.unwrap();
    let mut client = server.sandboxes(&evil).await;
    let (_, ready) = ensure(&mut client, ensure_request("steal", "t")).await;
    let sandbox = ready.unwrap().sandbox_id;
    let (code, environ) =
        sh(&mut client, &sandbox, &format!("tr '\\0' '\\n' < /proc/{}/environ", server.pid())).await;
    assert_eq!(code, 0);
    assert!(environ.contains(&victim_token), "the opt-in really exposes the host: {environ}");
    drop(server);

    // The stored local definition is refused at ensure once the opt-in
    // is gone, before any sandbox is resumed or made.
    let server = ServerProcess::start(&options(&dir, &n, &[])).await;
    let mut client = server.sandboxes(&evil).await;
    let (_, again) = ensure(&mut client, ensure_request("steal", "t")).await;
    let v = violations(&again.unwrap_err());
    assert!(
        v.iter().any(|(f, w)| f == "definition.provider" && w.contains("allow_local_with_tokens")),
        "{v:?}"
    );
    let exec = client
        .exec(api::ExecRequest {
            sandbox_id: sandbox.clone(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell("true".into())) }),
            ..Default::default()
        })
        .await;
    assert!(exec.is_err(), "the local sandbox is not reachable either: {exec:?}");
}

#[tokio::test]
async fn docker_definitions_outside_the_policy_are_refused_naming_the_rule() {
    let dir = TestDir::new("sh-hostile");
    let n = nonce();
    let evil = format!("tok-evil-{n}");
    let allowed = dir.path().join("shared-ro");
    std::fs::create_dir_all(&allowed).unwrap();
    let server = ServerProcess::start(&options(
        &dir,
        &n,
        &[
            "--docker-image",
            "sandhold-test-*",
            "--docker-volume",
            "vol-ok",
            "--docker-bind-prefix",
            allowed.to_str().unwrap(),
            "--docker-network",
            "sandnet",
        ],
    ))
    .await;
    let mount =
        |source: &str, read_only: bool| api::Mount { source: source.into(), target: "/m".into(), read_only };
    let cases: Vec<(&str, api::DockerProvider, &str, &str)> = vec![
        (
            "host-root",
            api::DockerProvider { mounts: vec![mount("/", true)], ..busybox() },
            "mounts[0]",
            "docker_bind_prefixes",
        ),
        (
            "rw-bind",
            api::DockerProvider { mounts: vec![mount(allowed.to_str().unwrap(), false)], ..busybox() },
            "mounts[0]",
            "docker_writable_bind_prefixes",
        ),
        ("host-net", api::DockerProvider { network: "host".into(), ..busybox() }, "network", "never allowed"),
        (
            "container-net",
            api::DockerProvider { network: "container:sandhold-postgres".into(), ..busybox() },
            "network",
            "never allowed",
        ),
        (
            "bridge",
            api::DockerProvider { network: "bridge".into(), ..busybox() },
            "network",
            "docker_networks",
        ),
        (
            "volume",
            api::DockerProvider { mounts: vec![mount("other-deployments-data", false)], ..busybox() },
            "mounts[0]",
            "docker_volumes",
        ),
        (
            "image",
            api::DockerProvider { image: "debian:bookworm".into(), ..Default::default() },
            "image",
            "docker_images",
        ),
        (
            "snapshot-image",
            api::DockerProvider { image: "sandhold-snapshot:abc".into(), ..Default::default() },
            "image",
            "another sandbox",
        ),
        (
            "memory",
            api::DockerProvider { memory_bytes: 64 << 30, ..busybox() },
            "memory_bytes",
            "docker_max_memory_bytes",
        ),
        (
            "pids",
            api::DockerProvider { pids_limit: 100_000, ..busybox() },
            "pids_limit",
            "docker_max_pids_limit",
        ),
        (
            "agent-dir",
            api::DockerProvider {
                mounts: vec![api::Mount {
                    source: "vol-ok".into(),
                    target: "/run/sandhold".into(),
                    read_only: false,
                }],
                ..busybox()
            },
            "mounts[0]",
            "reserved",
        ),
    ];
    for (id, d, field, rule) in cases {
        let refused = put(&server, &evil, docker(id, d)).await.unwrap_err();
        let v = violations(&refused);
        let field = format!("definition.provider.docker.{field}");
        assert!(
            v.iter().any(|(f, w)| *f == field && w.contains(rule)),
            "{id}: want {field} ({rule}), got {v:?}"
        );
    }
    // Inside the policy, the same shapes are accepted: the refusals above
    // are the rules', not a blanket one.
    let fine = api::DockerProvider {
        mounts: vec![mount(allowed.to_str().unwrap(), true), mount("vol-ok", false)],
        network: "sandnet".into(),
        memory_bytes: 1 << 30,
        pids_limit: 256,
        ..busybox()
    };
    put(&server, &evil, docker("fine", fine)).await.unwrap();
}

/// A server as shipped and tenant `evil`'s ensured sandbox of the busybox
/// image with nothing else set but the runtime.
async fn plain_docker_sandbox(
    dir: &TestDir,
    n: &str,
    runtime: Runtime,
) -> (ServerProcess, Sandboxes, api::EnsureReady) {
    let server = ServerProcess::start(&options(dir, n, &[])).await;
    let evil = format!("tok-evil-{n}");
    let mut plain = docker("plain", busybox());
    runtime.apply(&mut plain);
    put(&server, &evil, plain).await.unwrap();
    let mut client = server.sandboxes(&evil).await;
    let (_, ready) = ensure(&mut client, ensure_request("plain", "t")).await;
    (server, client, ready.unwrap())
}

under_each_runtime! {
async fn a_docker_sandbox_without_limits_gets_the_defaults_and_the_hardening(runtime) {
    ensure_test_image();
    let dir = TestDir::new("sh-hostile");
    let n = nonce();
    let _cleanup = DockerCleanup { tenant: format!("evil{n}") };
    let (_server, mut client, ready) = plain_docker_sandbox(&dir, &n, runtime).await;
    let container = ready.sandbox.unwrap().provider_sandbox_id;

    let engine = bollard::Docker::connect_with_defaults().unwrap().negotiate_version().await.unwrap();
    let host = engine
        .inspect_container(&container, None::<InspectContainerOptions>)
        .await
        .unwrap()
        .host_config
        .unwrap();
    assert_eq!(host.memory, Some(2 << 30), "the default memory limit");
    assert_eq!(host.pids_limit, Some(1024), "the default pids limit");
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    let mut added = host.cap_add.unwrap_or_default();
    added.sort();
    assert_eq!(added, ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]);
    assert!(
        host.security_opt.unwrap_or_default().iter().any(|o| o.starts_with("no-new-privileges")),
        "no-new-privileges"
    );
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.runtime.as_deref(), Some(runtime.engine_name()));

    // From inside: the kernel agrees. The agent (PID 1, root) holds only
    // the kept capabilities, a command (the run user) none, and ordinary
    // work still works.
    let (code, status) = sh(
        &mut client,
        &ready.sandbox_id,
        "grep -E '^(CapEff|CapBnd)' /proc/1/status; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status",
    )
    .await;
    assert_eq!(code, 0);
    // CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, KILL 5, SETGID 6, SETUID 7.
    // gVisor's `/proc/<pid>/status` has no `NoNewPrivs` line (the flag is
    // the engine's `no-new-privileges`, inspected above).
    let no_new_privs = match runtime {
        Runtime::Runc => "NoNewPrivs:\t1\n",
        Runtime::Gvisor => "",
    };
    assert_eq!(
        status,
        format!(
            "CapEff:\t00000000000000eb\nCapBnd:\t00000000000000eb\n\
             CapEff:\t0000000000000000\nCapBnd:\t00000000000000eb\n{no_new_privs}"
        )
    );
    let (code, out) = sh(
        &mut client,
        &ready.sandbox_id,
        "mkdir -p d && echo hi > d/f && chmod 600 d/f && cat d/f && (sleep 30 & kill $!) && \
         for dev in 'mem c 1 1' 'sda b 8 0'; do set -- $dev; \
           if mknod /tmp/$1 $2 $3 $4 2>/dev/null; then \
             head -c 16 /tmp/$1 >/dev/null 2>&1 && echo read-$1 || echo no-device-$1; \
           else echo no-mknod-$1; fi; done",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    // Under runc a dropped capability stays dropped: no device node. gVisor
    // lets the run user make one on its own tmpfs (it does not check
    // CAP_MKNOD there), but a node reaches only gVisor's emulated devices:
    // the host's memory and disks are not there to open.
    let expected = match runtime {
        Runtime::Runc => "hi\nno-mknod-mem\nno-mknod-sda\n",
        Runtime::Gvisor => "hi\nno-device-mem\nno-device-sda\n",
    };
    assert_eq!(out, expected, "work runs; no device is reached");
}

async fn a_token_symlinked_to_a_host_file_is_never_read(runtime) {
    ensure_test_image();
    let dir = TestDir::new("sh-hostile");
    let n = nonce();
    let _cleanup = DockerCleanup { tenant: format!("evil{n}") };
    let evil = format!("tok-evil-{n}");
    // A host file the control plane could read: ours, 0600, like a token.
    let secret_value = format!("HOST-SECRET-{n}");
    let secret = dir.path().join("host-secret");
    std::fs::write(&secret, &secret_value).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    let (server, mut client, ready) = plain_docker_sandbox(&dir, &n, runtime).await;
    let sandbox = ready.sandbox_id;
    // The run user cannot touch the host dir at all (root's, 0700) ...
    let swap =
        format!("rm /run/sandhold/token && ln -s {} /run/sandhold/token && echo swapped", secret.display());
    let (code, out) = sh(&mut client, &sandbox, &swap).await;
    assert_ne!((code, out.as_str()), (0, "swapped\n"), "the run user swapped the token");
    // ... but root in the container can (as a tenant who broke out of the
    // run user would): the agent read its token at start; from now on the
    // file is theirs to replace, and the target path is resolved on the host.
    let container = ready.sandbox.unwrap().provider_sandbox_id;
    let out =
        std::process::Command::new("docker").args(["exec", &container, "sh", "-c", &swap]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "swapped\n", "{out:?}");
    drop(server);

    // A new server has no live agent: it must resume from the host dir.
    let server = ServerProcess::start(&options(&dir, &n, &[])).await;
    let mut client = server.sandboxes(&evil).await;
    let err = client
        .exec(api::ExecRequest {
            sandbox_id: sandbox.clone(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell("true".into())) }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("symlink"), "refused for the link, not after sending it: {err:?}");
    assert!(!err.message().contains(&secret_value));
    assert!(!server.log_text().contains(&secret_value), "the host file's content is in no log");
    let (_, again) = ensure(&mut client, ensure_request("plain", "t")).await;
    let again = again.unwrap_err();
    assert!(again.message().contains("symlink"), "{again:?}");
}
}

/// A tenant the operator requires to run under gVisor (`[tenants.NAME]` of
/// the config file) gets gVisor when its definition names no runtime, and
/// is refused runc, naming the rule; another tenant still gets runc.
#[tokio::test]
async fn a_tenant_required_to_use_gvisor_cannot_get_runc() {
    if !Runtime::Gvisor.available() {
        return;
    }
    ensure_test_image();
    let dir = TestDir::new("sh-runtime");
    let n = nonce();
    let _cleanup =
        (DockerCleanup { tenant: format!("evil{n}") }, DockerCleanup { tenant: format!("victim{n}") });
    let config = dir.path().join("sandhold.toml");
    std::fs::write(&config, format!("[tenants.evil{n}]\nrequire_runtime = \"gvisor\"\n")).unwrap();
    let server = ServerProcess::start(&options(&dir, &n, &["--config", config.to_str().unwrap()])).await;
    let (evil, victim) = (format!("tok-evil-{n}"), format!("tok-victim-{n}"));

    let runc = docker("runc", api::DockerProvider { runtime: "runc".into(), ..busybox() });
    let refused = put(&server, &evil, runc.clone()).await.unwrap_err();
    let v = violations(&refused);
    assert!(
        v.iter().any(|(f, why)| f == "definition.provider.docker.runtime" && why.contains("require_runtime")),
        "{v:?}"
    );
    put(&server, &victim, runc).await.expect("another tenant may name runc");

    for (token, want) in [(&evil, Runtime::Gvisor), (&victim, Runtime::Runc)] {
        put(&server, token, docker("plain", busybox())).await.unwrap();
        let mut client = server.sandboxes(token).await;
        let (_, ready) = ensure(&mut client, ensure_request("plain", "t")).await;
        let sandbox = ready.unwrap_or_else(|e| panic!("{e}\n{}", server.log_text())).sandbox.unwrap();
        assert_eq!(sandbox.capabilities.unwrap().runtime, want.name());
        let engine = sandhold_tests::docker::inspect(&sandbox.provider_sandbox_id, "{{.HostConfig.Runtime}}");
        assert_eq!(engine, want.engine_name(), "what the engine runs it under");
    }
}

/// An engine without runsc (a second dockerd of the test's own, which
/// reads no daemon.json): a server required to run gVisor refuses to
/// start, and without the requirement a gVisor definition is refused at
/// `PutDefinition`, each naming the engine and the fix; runc is still
/// accepted on that engine.
#[tokio::test]
async fn gvisor_on_an_engine_without_runsc_is_refused_naming_the_fix() {
    let Some(engine) = sandhold_tests::dockerd::Dockerd::start() else { return };
    assert!(!engine.runtimes().contains("runsc"), "the test's engine has runsc: {}", engine.runtimes());
    let names_the_fix = |message: &str| {
        for needle in [
            "no gvisor runtime",
            "`runsc`",
            engine.host.as_str(),
            "/etc/docker/daemon.json",
            "scripts/services",
        ] {
            assert!(message.contains(needle), "{needle:?} not in:\n{message}");
        }
    };
    let dir = TestDir::new("sh-norunsc");
    let n = nonce();
    let on_engine = |extra_args: &[&str]| ServerOptions {
        env: vec![("DOCKER_HOST".into(), engine.host.clone())],
        ..options(&dir, &n, extra_args)
    };

    let log = ServerProcess::refused(&on_engine(&[
        "--docker-runtimes",
        "runc,gvisor",
        "--require-runtime",
        "gvisor",
    ]))
    .await;
    assert!(log.contains("the operator policy requires the gvisor runtime (require_runtime)"), "{log}");
    names_the_fix(&log);

    let server = ServerProcess::start(&on_engine(&["--docker-runtimes", "runc,gvisor"])).await;
    let evil = format!("tok-evil-{n}");
    let gvisor = docker("gvisor", api::DockerProvider { runtime: "gvisor".into(), ..busybox() });
    let refused = put(&server, &evil, gvisor).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    names_the_fix(refused.message());
    let mut client = server.sandboxes(&evil).await;
    let stored =
        client.get_definition(api::GetDefinitionRequest { id: "gvisor".into(), ..Default::default() }).await;
    assert_eq!(
        stored.map_err(|s| s.code()).err(),
        Some(tonic::Code::NotFound),
        "a refused definition is not kept"
    );
    let runc = docker("runc", api::DockerProvider { runtime: "runc".into(), ..busybox() });
    put(&server, &evil, runc)
        .await
        .unwrap_or_else(|e| panic!("runc on the same engine: {e:?}\n{}", server.log_text()));
}
