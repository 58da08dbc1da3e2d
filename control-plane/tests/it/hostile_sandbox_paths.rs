//! A hostile tenant choosing the paths of its Docker sandbox. A workspace
//! over or under the agent's own directories, or over the system's, would
//! be handed to the run user whole (the agent's binary, token and
//! journals with it); a bind of the server's own data or of a socket would
//! hand it the other sandboxes or the engine. Each is refused at
//! `PutDefinition`, naming the field and the rule, by a real `sandhold
//! serve` with API tokens.

use sandhold_tests::local::TestDir;
use sandhold_tests::nonce;
use shared::proto::v1 as api;

use super::hostile_policy::{busybox, docker, options, put, violations};
use sandhold_tests::server::ServerProcess;

#[tokio::test]
async fn a_workdir_over_or_under_the_agents_paths_is_refused_naming_the_rule() {
    let dir = TestDir::new("sh-workdir");
    let n = nonce();
    let evil = format!("tok-evil-{n}");
    let server = ServerProcess::start(&options(&dir, &n, &["--docker-image", "sandhold-test-*"])).await;
    let cases = [
        ("/", "whole container"),
        ("/run/sandhold", "agent's /run/sandhold"),
        ("/run", "agent's /run/sandhold"),
        ("/run/sandhold/journal", "agent's /run/sandhold"),
        ("/.sandhold", "agent's /.sandhold"),
        ("/opt/sandhold/toolchains", "agent's /opt/sandhold/toolchains"),
        ("/proc/self", "system directory /proc"),
        ("/etc", "system directory /etc"),
        ("/usr/local", "system directory /usr"),
        ("/work/../run/sandhold", "normalized"),
        ("work", "absolute"),
    ];
    for (i, (workdir, rule)) in cases.into_iter().enumerate() {
        let d = api::DockerProvider { workdir: workdir.into(), ..busybox() };
        let refused = put(&server, &evil, docker(&format!("wd-{i}"), d)).await.unwrap_err();
        let v = violations(&refused);
        assert!(
            v.iter().any(|(f, why)| f == "definition.provider.docker.workdir" && why.contains(rule)),
            "{workdir}: want docker.workdir ({rule}), got {v:?}"
        );
    }
    // A workspace of its own is fine: the refusals are the rule's (the
    // image must be there to be accepted).
    if sandhold_tests::services::docker() {
        sandhold_tests::docker::ensure_test_image();
        let d = api::DockerProvider { workdir: "/home/dev/project".into(), ..busybox() };
        put(&server, &evil, docker("wd-fine", d)).await.unwrap();
    }
}

/// Binds under a prefix the operator allows, of what no prefix may give: the
/// server's own data dir (the sandboxes' host dirs and tokens), a directory
/// holding it, a socket, and a directory holding a socket (a read-only bind
/// of `docker.sock` still connects).
#[tokio::test]
async fn a_bind_of_the_servers_data_or_of_a_socket_is_refused_naming_the_rule() {
    let dir = TestDir::new("sh-binds");
    let n = nonce();
    let evil = format!("tok-evil-{n}");
    let prefix = dir.path().to_str().unwrap().to_string();
    let server = ServerProcess::start(&options(
        &dir,
        &n,
        &["--docker-image", "sandhold-test-*", "--docker-bind-prefix", &prefix],
    ))
    .await;
    let sockets = dir.path().join("sockets");
    std::fs::create_dir_all(&sockets).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(sockets.join("engine.sock")).unwrap();
    let plain = dir.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let data = dir.path().join("data");
    let cases = [
        (data.display().to_string(), "server's own"),
        (data.join("docker").display().to_string(), "server's own"),
        (prefix.clone(), "server's own"),
        (sockets.join("engine.sock").display().to_string(), "is a socket"),
        (sockets.display().to_string(), "holds a socket"),
    ];
    for (i, (source, rule)) in cases.iter().enumerate() {
        let mounts = vec![api::Mount { source: source.clone(), target: "/m".into(), read_only: true }];
        let d = api::DockerProvider { mounts, ..busybox() };
        let refused = put(&server, &evil, docker(&format!("bind-{i}"), d)).await.unwrap_err();
        let v = violations(&refused);
        assert!(
            v.iter().any(|(f, why)| f == "definition.provider.docker.mounts[0]" && why.contains(rule)),
            "{source}: want mounts[0] ({rule}), got {v:?}"
        );
    }
    if sandhold_tests::services::docker() {
        sandhold_tests::docker::ensure_test_image();
        let mounts =
            vec![api::Mount { source: plain.display().to_string(), target: "/m".into(), read_only: true }];
        put(&server, &evil, docker("bind-fine", api::DockerProvider { mounts, ..busybox() })).await.unwrap();
    }
}
