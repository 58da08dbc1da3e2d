//! Harness CLIs brought into images that lack them (issue #18): `sandhold
//! harness install` fetches the pinned native builds from the npm registry
//! into a toolchain dir, `harness ls` shows them, and runs find them on
//! their PATH: in a Debian container that has none of them (under runc and
//! under gVisor), in an image with no C library (only Codex's static build
//! runs; a Claude Code run says why it cannot), and in a local sandbox.

use sandhold_tests::cli::toolchains;
use sandhold_tests::docker::{
    DEBIAN_IMAGE, DockerCleanup, TEST_IMAGE, ensure_debian_image, ensure_test_image,
};
use sandhold_tests::local::TestDir;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::{Seen, command_run, definition, put_definition, read_until};
use sandhold_tests::server::TenantServer;
use sandhold_tests::under_each_runtime;
use shared::proto::v1 as api;

async fn server(prefix: &str) -> TenantServer {
    let dir = toolchains().display().to_string();
    TenantServer::start_with_args(prefix, &[], &["--toolchain-dir", &dir]).await
}

/// A command run's text and the chunks it made.
async fn run(s: &TenantServer, definition_id: &str, run_id: &str, script: &str) -> Seen {
    let mut runs = s.server.runs(&s.token).await;
    let req = command_run(&format!("{run_id}-{}", s.nonce), run_id, definition_id, script);
    let mut stream = runs.start_run(req).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", s.server.log_text()));
    seen
}

fn docker_definition(id: &str, image: &str) -> api::SandboxDefinition {
    let docker = api::DockerProvider { image: image.into(), ..Default::default() };
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
        ..Default::default()
    }
}

const VERSIONS: &str = "claude --version; codex --version; opencode --version; echo path=$PATH";

#[test]
fn harness_ls_lists_what_install_put_there() {
    let dir = toolchains();
    let data = TestDir::new("toolchain-ls");
    let out = sandhold_tests::cli::sandhold(data.path())
        .args(["harness", "ls", "--output", "json", "--toolchain-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines = sandhold_tests::cli::json_lines(&out);
    let find = |h: &str| {
        lines.iter().find(|l| l["harness"] == h).unwrap_or_else(|| panic!("{h} in {lines:?}")).clone()
    };
    assert_eq!(find("claude-code")["version"], "2.1.197");
    assert_eq!(find("claude-code")["libc"], serde_json::json!(["glibc", "musl"]));
    assert_eq!(find("opencode")["libc"], serde_json::json!(["glibc"]));
    // An unknown name is refused before anything is fetched.
    let bad = sandhold_tests::cli::sandhold(data.path())
        .args(["harness", "install", "cursor", "--toolchain-dir"])
        .arg(data.path().join("empty"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("claude-code, codex, opencode"));
    // Under --output json as every command's failure: an error line.
    let bad = sandhold_tests::cli::sandhold(data.path())
        .args(["harness", "install", "cursor", "--output", "json", "--toolchain-dir"])
        .arg(data.path().join("empty"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let error = &sandhold_tests::cli::json_lines(&bad)[0]["error"];
    assert!(error["message"].as_str().unwrap().contains("claude-code, codex, opencode"), "{error}");
    assert!(!data.path().join("empty").exists());
}

under_each_runtime! {
async fn a_debian_container_without_the_clis_runs_them_from_the_toolchain(runtime) {
    ensure_debian_image();
    let s = server("toolchain-docker").await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let mut def = docker_definition("deb", DEBIAN_IMAGE);
    runtime.apply(&mut def);
    put_definition(&mut sandboxes, def).await;
    // The image itself has none of them: without the toolchain's part of
    // PATH nothing is found.
    let bare = "PATH=$(echo \"$PATH\" | sed 's#:/opt/sandhold/toolchains/[^:]*##'); \
                command -v claude || command -v codex || command -v opencode || echo none-in-image";
    let seen = run(&s, "deb", "bare", bare).await;
    assert!(seen.has_text("none-in-image"), "{:?}", seen.chunks);
    let seen = run(&s, "deb", "versions", VERSIONS).await;
    assert!(seen.has_text("2.1.197"), "claude --version: {:?}", seen.chunks);
    assert!(seen.has_text("0.171.0"), "codex --version: {:?}", seen.chunks);
    assert!(seen.has_text("1.18.33"), "opencode --version: {:?}", seen.chunks);
    assert!(seen.has_text("/opt/sandhold/toolchains/glibc/bin"), "{:?}", seen.chunks);
    // Read-only for the sandbox: nothing a tenant does there reaches the
    // host's copy other sandboxes run.
    let seen =
        run(&s, "deb", "write", "touch /opt/sandhold/toolchains/glibc/bin/x 2>&1 || echo refused").await;
    assert!(seen.has_text("refused"), "{:?}", seen.chunks);
    assert!(!toolchains().join("glibc/bin/x").exists());
}
}

#[tokio::test]
async fn an_image_without_a_c_library_gets_only_the_static_build_and_is_told_why() {
    if !sandhold_tests::services::docker() {
        return;
    }
    ensure_test_image();
    let s = server("toolchain-static").await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, docker_definition("busybox", TEST_IMAGE)).await;
    let seen = run(&s, "busybox", "codex", "codex --version").await;
    assert!(seen.has_text("0.171.0"), "{:?}", seen.chunks);

    let mut runs = s.server.runs(&s.token).await;
    let req = api::StartRunRequest {
        thread_id: "claude".into(),
        run_id: format!("claude-{}", s.nonce),
        definition_id: "busybox".into(),
        harness: "claude-code".into(),
        prompt: "hello".into(),
        durable: true,
        ..Default::default()
    };
    let mut stream = runs.start_run(req).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap();
    let warning = seen
        .chunks
        .iter()
        .find(|(_, c)| c.name == "harness.warning")
        .map(|(_, c)| c.value_json.clone())
        .unwrap_or_else(|| panic!("no harness.warning: {:?}", seen.chunks));
    assert!(warning.contains("no C library"), "{warning}");
    assert_eq!(seen.terminal().map(|c| c.r#type()), Some(api::ChunkType::RunError), "{:?}", seen.chunks);
}

#[tokio::test]
async fn a_local_sandbox_finds_the_same_toolchain() {
    let s = server("toolchain-local").await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, definition("local", Kind::Local)).await;
    let seen = run(&s, "local", "versions", VERSIONS).await;
    assert!(
        seen.has_text("2.1.197") && seen.has_text("0.171.0") && seen.has_text("1.18.33"),
        "{:?}",
        seen.chunks
    );
    assert!(seen.has_text(&format!("{}/glibc/bin", toolchains().display())), "{:?}", seen.chunks);
}
