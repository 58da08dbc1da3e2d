//! The `sandhold` CLI end to end: the real binary against a spawned
//! `sandhold serve`, and with its embedded server. Sandboxes, exec and
//! definitions; errors that say what to do next; tokens from the
//! environment only.

mod cli_support;
mod provider_support;

use std::time::Duration;

use cli_support::{Served, json_lines, ok, sandhold, stderr, stdout};
use shared::proto::v1 as api;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;
use tokio_stream::StreamExt;

const DEFINITION: &str = r#"
id = "cli-test"
secret_names = ["GREETING"]

[provider.local]

[workspace]
setup = [{ serial = "echo set-up > marker.txt" }]
"#;

/// Ensure a sandbox for `definition` through the API (what `sandhold run`
/// does first), returning its id.
fn ensure(addr: &str, definition: &str, thread: &str) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = SandboxServiceClient::connect(format!("http://{addr}")).await.unwrap();
        let mut stream = client
            .ensure_sandbox(api::EnsureSandboxRequest {
                definition_id: definition.into(),
                thread_id: thread.into(),
                secrets: [("GREETING".to_string(), "hello-secret-value".to_string())].into(),
                run_id: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        while let Some(event) = stream.next().await {
            if let Some(api::ensure_sandbox_response::Event::Ready(r)) = event.unwrap().event {
                return r.sandbox_id;
            }
        }
        panic!("ensure ended without ready")
    })
}

#[test]
fn definitions_sandboxes_and_exec_against_a_served_server() {
    let server = Served::start(&[]);
    let file = server.dir.path().join("def.toml");
    std::fs::write(&file, DEFINITION).unwrap();

    let applied =
        ok(&server.cli().args(["definitions", "apply", "--output", "json"]).arg(&file).output().unwrap())
            .clone();
    let applied = &json_lines(&applied)[0];
    assert_eq!(applied["id"], "cli-test");
    assert_eq!(applied["secret_names"][0], "GREETING");

    let listed =
        json_lines(ok(&server.cli().args(["definitions", "ls", "--output", "json"]).output().unwrap()));
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["workspace"]["setup"][0]["serial"], "echo set-up > marker.txt");

    let sandbox = ensure(&server.addr, "cli-test", "thread-a");
    let listed =
        json_lines(ok(&server.cli().args(["sandboxes", "ls", "--output", "json"]).output().unwrap()));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["sandbox_id"], sandbox.as_str());
    assert_eq!(listed[0]["thread_id"], "thread-a");
    let human = stdout(ok(&server.cli().args(["sandboxes", "ls"]).output().unwrap()));
    assert!(human.contains(&sandbox) && human.contains("local"), "{human}");

    // Output streams through; the exit code is the command's.
    let out = server
        .cli()
        .args(["exec", &sandbox, "--", "sh", "-c", "cat marker.txt; echo to-stderr >&2; exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(stdout(&out), "set-up\n");
    assert_eq!(stderr(&out), "to-stderr\n");

    // A secret's value comes from the variable named on the command line.
    let out = server
        .cli()
        .env("MY_TOKEN_VAR", "tok-from-env-123")
        .args(["exec", &sandbox, "--secret", "API_TOKEN=MY_TOKEN_VAR", "--", "sh", "-c", "echo $API_TOKEN"])
        .output()
        .unwrap();
    assert_eq!(stdout(ok(&out)), "tok-from-env-123\n");
    let out = server
        .cli()
        .args(["exec", &sandbox, "--secret", "API_TOKEN=UNSET_VAR_X", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("UNSET_VAR_X is not set"), "{}", stderr(&out));

    ok(&server.cli().args(["sandboxes", "rm", &sandbox]).output().unwrap());
    let listed =
        json_lines(ok(&server.cli().args(["sandboxes", "ls", "--output", "json"]).output().unwrap()));
    assert!(listed.is_empty(), "{listed:?}");
    let gone = server.cli().args(["exec", &sandbox, "--", "true"]).output().unwrap();
    assert_eq!(gone.status.code(), Some(2));
    assert!(stderr(&gone).contains("NOT_FOUND"), "{}", stderr(&gone));

    // rm --all removes every sandbox of the tenant.
    ensure(&server.addr, "cli-test", "thread-b");
    ensure(&server.addr, "cli-test", "thread-c");
    let removed = json_lines(ok(&server
        .cli()
        .args(["sandboxes", "rm", "--all", "--output", "json"])
        .output()
        .unwrap()));
    assert_eq!(removed.len(), 2, "{removed:?}");
    ok(&server.cli().args(["definitions", "rm", "cli-test"]).output().unwrap());
    let listed =
        json_lines(ok(&server.cli().args(["definitions", "ls", "--output", "json"]).output().unwrap()));
    assert!(listed.is_empty());
}

#[test]
fn errors_say_what_to_do_next() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("127.0.0.1:{port}");
    let out = sandhold(dir.path()).args(["runs", "--server", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains(&url) && err.contains("sandhold serve"), "{err}");

    let json = sandhold(dir.path()).args(["runs", "--server", &url, "--output", "json"]).output().unwrap();
    let line = &json_lines(&json)[0];
    assert!(line["error"]["message"].as_str().unwrap().contains(&url), "{line}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "id = \"x\"\nsecrets = [\"A\"]\n").unwrap();
    let out = sandhold(dir.path()).args(["definitions", "apply"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("secrets"), "names the unknown field: {}", stderr(&out));
}

#[test]
fn tokens_come_from_the_environment() {
    let server = Served::start(&["acme=acme-token-123"]);
    let out = server.cli().args(["definitions", "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("SANDHOLD_TOKEN"), "hint names the variable: {}", stderr(&out));
    let out =
        server.cli().env("SANDHOLD_TOKEN", "acme-token-123").args(["definitions", "ls"]).output().unwrap();
    ok(&out);
}

#[test]
fn the_embedded_server_keeps_its_state_in_the_data_dir() {
    let dir = tempfile::Builder::new().prefix("sh-cli").tempdir_in("/tmp").unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("def.json");
    std::fs::write(&file, r#"{"id": "embedded-def", "provider": {"local": {}}}"#).unwrap();
    let started = std::time::Instant::now();
    ok(&sandhold(&data).args(["definitions", "apply"]).arg(&file).output().unwrap());
    assert!(started.elapsed() < Duration::from_secs(30), "an embedded command is quick");
    // A second process finds what the first stored.
    let listed =
        json_lines(ok(&sandhold(&data).args(["definitions", "ls", "--output", "json"]).output().unwrap()));
    assert_eq!(listed[0]["id"], "embedded-def");
    assert!(data.join("sandhold.db").is_file(), "SQLite under the data dir");
    assert!(data.join("embedded.log").is_file(), "the server's log goes to a file, not the terminal");
}
