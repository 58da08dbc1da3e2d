//! The `sandhold` CLI end to end: the real binary against a spawned
//! `sandhold serve`, and with its embedded server. Sandboxes, exec and
//! definitions; errors that say what to do next; tokens from the
//! environment only.

use std::time::Duration;

use sandhold_tests::cli::{
    Live, Served, json_line, json_lines, ok, output_violation, sandhold, stderr, stdout,
};
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
/// does first), returning its id. The server has no API tokens: the call
/// carries its local token.
fn ensure(server: &Served, definition: &str, thread: &str) -> String {
    let token = server.local_token().expect("a tokenless server writes its local token");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client =
            SandboxServiceClient::with_interceptor(channel, sandhold_tests::auth::bearer(&token));
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

    let sandbox = ensure(&server, "cli-test", "thread-a");
    let listed =
        json_lines(ok(&server.cli().args(["sandboxes", "ls", "--output", "json"]).output().unwrap()));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["sandbox_id"], sandbox.as_str());
    assert_eq!(listed[0]["thread_id"], "thread-a");
    let human = stdout(ok(&server.cli().args(["sandboxes", "ls"]).output().unwrap()));
    let row = human.lines().find(|l| l.starts_with(&sandbox[..16])).unwrap_or_else(|| panic!("{human}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[..3], [&sandbox[..16], "running", "local"], "{human}");

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

    // --output json: exec's events, and git's answers.
    let json = |args: &[&str]| {
        let out = server.cli().arg(args[0]).args(["--output", "json"]).args(&args[1..]).output().unwrap();
        json_lines(ok(&out))
    };
    let events = json(&["exec", &sandbox, "--", "sh", "-c", "echo out; echo err >&2"]);
    assert!(events[0]["started_pid"].is_u64(), "{events:?}");
    assert!(events.iter().any(|e| e["output"]["stream"] == "stderr"), "{events:?}");
    assert_eq!(events.last().unwrap()["exited"]["code"], 0, "{events:?}");
    let init = "echo a > notes.txt && git init -q -b main && git add -A \
                && git -c user.name=A -c user.email=a@example.com commit -qm init && echo b >> notes.txt";
    json(&["exec", &sandbox, "--", "sh", "-c", init]);
    let status = &json(&["git", &sandbox, "status"])[0];
    assert_eq!(
        (&status["branch"], &status["files"][0]["unstaged"]),
        (&"main".into(), &"modified".into()),
        "{status}"
    );
    let diff = &json(&["git", &sandbox, "diff"])[0];
    assert_eq!(diff["files"][0]["path"], "notes.txt", "{diff}");
    let commit = &json(&["git", &sandbox, "commit", "-m", "more", "--author", "A <a@example.com>"])[0];
    assert_eq!(commit["branch"], "main", "{commit}");
    assert_eq!(json(&["git", &sandbox, "diff"])[0], serde_json::json!({}), "nothing left to diff");
    let branch = &json(&["git", &sandbox, "branch", "topic"])[0];
    assert_eq!(branch["head"], commit["commit"], "{branch}");

    // A unique prefix of the id is enough; one that names nothing says
    // where the ids are.
    let out = server.cli().args(["exec", &sandbox[..8], "--", "cat", "marker.txt"]).output().unwrap();
    assert_eq!(stdout(ok(&out)), "set-up\n");
    // A local sandbox shares the host's loopback: port-forward says so at
    // once instead of promising a forward that fails every connection.
    let out = server.cli().args(["port-forward", &sandbox, "0:8080"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no loopback of its own"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("Forwarding from"), "{}", stderr(&out));
    let out = server.cli().args(["exec", "not-an-id", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("sandhold sandboxes ls"), "{}", stderr(&out));

    ok(&server.cli().args(["sandboxes", "rm", &sandbox[..12]]).output().unwrap());
    let listed =
        json_lines(ok(&server.cli().args(["sandboxes", "ls", "--output", "json"]).output().unwrap()));
    assert!(listed.is_empty(), "{listed:?}");
    let gone = server.cli().args(["exec", &sandbox, "--", "true"]).output().unwrap();
    assert_eq!(gone.status.code(), Some(2));
    assert!(stderr(&gone).contains("NOT_FOUND"), "{}", stderr(&gone));

    // rm --all removes every sandbox of the tenant.
    ensure(&server, "cli-test", "thread-b");
    ensure(&server, "cli-test", "thread-c");
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

    // Docker not reachable: the error names the socket it tried.
    let out = sandhold(&dir.path().join("data"))
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["run", "--image", "busybox", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("unix:///nonexistent/docker.sock"), "{}", stderr(&out));

    // Something that is not a Sandhold server, or spoken to the wrong way.
    let http1 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http1_addr = http1.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in http1.incoming().flatten() {
            use std::io::{Read, Write};
            let mut conn = conn;
            let _ = conn.read(&mut [0u8; 1024]);
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
            // Kept open, as a real server would for a moment: the client
            // reads the answer rather than a reset.
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(5));
                drop(conn);
            });
        }
    });
    for (server, says) in [
        // "does not", or "may not" when the connection broke before the
        // call went out (which of the two depends on timing).
        (http1_addr.clone(), "speak gRPC"),
        (format!("https://{http1_addr}"), "does not speak TLS"),
        ("ftp://example.invalid".to_string(), "ftp:// is not a way to reach a server"),
    ] {
        let out = sandhold(dir.path()).args(["runs", "--server", &server]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains(says), "{server}: {}", stderr(&out));
    }
    let out = sandhold(dir.path()).args(["runs", "--token", "tok-123"]).output().unwrap();
    assert!(stderr(&out).contains("SANDHOLD_TOKEN") && !stderr(&out).contains("tok-123"), "{}", stderr(&out));
    let out = sandhold(dir.path()).args(["run", "echo", "hi"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("-- echo"), "the missing separator: {}", stderr(&out));
    let out = sandhold(&dir.path().join("data")).args(["logs", "no-such-run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("sandhold runs"), "{}", stderr(&out));

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "id = \"x\"\nsecrets = [\"A\"]\n").unwrap();
    let out = sandhold(dir.path()).args(["definitions", "apply"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = stderr(&out);
    assert!(said.contains("bad.toml") && said.contains("line 2, column 1"), "where: {said}");
    assert!(said.contains("unknown field `secrets`; did you mean `secret_names`?"), "what: {said}");
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
    let dir = sandhold_tests::local::TestDir::new("sh-cli");
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

/// The schema every `--output json` line is held to refuses what the CLI
/// must not print, so holding the tests' lines to it is not vacuous: the
/// enum spelling of the API, a chunk without its type or with a type or a
/// system value that is not one, a field nobody documented.
#[test]
fn the_output_schema_refuses_lines_the_cli_must_not_print() {
    use serde_json::json;
    let chunk = |extra: serde_json::Value| {
        let mut c = json!({"type": "TEXT_MESSAGE_CONTENT", "delta": "hi", "offset": "3", "timestamp_ms": 1});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    for good in [
        chunk(json!({})),
        json!({"type": "CUSTOM", "name": "sandbox.network", "offset": "1", "timestamp_ms": 1,
               "value": {"host": "h", "port": 443, "purpose": "proxy", "allowed": false, "error": "not allowed"}}),
        json!({"type": "CUSTOM", "name": "my.event", "value": [1, 2], "offset": "1", "timestamp_ms": 1}),
        json!({"run_id": "r", "status": "completed", "started_at_ms": 1}),
        json!({"error": {"reason": "CLIENT", "message": "no server"}}),
        json!({"output": {"stream": "stderr", "data": "aGk="}}),
    ] {
        assert_eq!(output_violation(&good), None, "{good}");
    }
    for (bad, says) in [
        (json!({"run_id": "r", "status": "RUN_STATUS_COMPLETED"}), "RUN_STATUS_COMPLETED"),
        (json!({"delta": "hi", "offset": "3", "timestamp_ms": 1}), "type"),
        (chunk(json!({"type": "TEXT_MESSAGE"})), "TEXT_MESSAGE"),
        (chunk(json!({"undocumented": 1})), "undocumented"),
        (
            json!({"type": "CUSTOM", "name": "sandbox.network", "value": {"host": "h"}, "offset": "1", "timestamp_ms": 1}),
            "port",
        ),
        (json!({"error": {"reason": "ERROR_REASON_NOT_FOUND", "message": "x"}}), "ERROR_REASON_NOT_FOUND"),
        (json!({"output": {"stream": "OUTPUT_STREAM_STDOUT"}}), "OUTPUT_STREAM_STDOUT"),
    ] {
        let why = output_violation(&bad).unwrap_or_else(|| panic!("accepted: {bad}"));
        assert!(why.contains(says), "{bad}: {why}");
    }
}

/// `run --output json`: the run id first, then the chunks with offsets,
/// ending with the terminal one; the exit code is the run's.
fn run_json_and_exit_codes(cli: impl Fn() -> std::process::Command) {
    let out =
        cli().args(["run", "--output", "json", "--", "sh", "-c", "echo hello; echo world"]).output().unwrap();
    let lines = json_lines(ok(&out));
    let run_id = lines[0]["run_id"].as_str().expect("first line names the run").to_string();
    let chunks: Vec<_> = lines.iter().filter(|l| l.get("type").is_some()).collect();
    let text: String = chunks
        .iter()
        .filter(|c| c["type"] == "TEXT_MESSAGE_CONTENT")
        .map(|c| c["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "hello\nworld\n");
    assert_eq!(chunks.last().unwrap()["type"], "RUN_FINISHED", "{lines:?}");
    assert!(chunks.iter().all(|c| c["run_id"] == run_id.as_str() && c["offset"].is_string()));
    let offsets: Vec<u64> = chunks.iter().map(|c| c["offset"].as_str().unwrap().parse().unwrap()).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "offsets grow: {offsets:?}");

    let failed =
        cli().args(["run", "--output", "json", "--", "sh", "-c", "echo partial; exit 3"]).output().unwrap();
    assert_eq!(failed.status.code(), Some(1), "a failed run exits 1: {}", stderr(&failed));
    let last = json_lines(&failed).pop().unwrap();
    assert_eq!(last["type"], "RUN_ERROR", "{last}");

    // The human form: text on stdout, the rest on stderr.
    let human = cli().args(["run", "--", "sh", "-c", "echo plain-text"]).output().unwrap();
    assert_eq!(stdout(ok(&human)), "plain-text\n");

    // The run is listed and its stored log printed again.
    let runs = json_lines(ok(&cli().args(["runs", "--output", "json"]).output().unwrap()));
    let listed = runs.iter().find(|r| r["run_id"] == run_id.as_str()).expect("listed");
    assert_eq!(listed["status"], "completed");
    let logs = cli().args(["logs", &run_id]).output().unwrap();
    assert_eq!(stdout(ok(&logs)), "hello\nworld\n");
}

#[test]
fn run_against_a_served_server() {
    let server = Served::start(&[]);
    run_json_and_exit_codes(|| server.cli());
}

#[test]
fn run_on_the_embedded_server() {
    let dir = sandhold_tests::local::TestDir::new("sh-cli");
    let data = dir.path().join("data");
    run_json_and_exit_codes(|| sandhold(&data));
}

/// A thread keeps its sandbox: a run without definition flags uses the
/// thread's definition (as the server answers it), and flags that make
/// another definition say what they change. The flags' definition gets its
/// id from the server, the same for the same flags.
#[test]
fn a_thread_keeps_its_sandbox_and_new_flags_say_what_they_change() {
    let dir = sandhold_tests::local::TestDir::new("sh-thread");
    let data = dir.path().join("data");
    let run = |extra: &[&str], script: &str| {
        let mut cli = sandhold(&data);
        cli.args(["run", "--thread", "t-kept"]).args(extra).args(["--", "sh", "-c", script]);
        let out = cli.output().unwrap();
        ok(&out);
        (stdout(&out).to_string(), stderr(&out).to_string())
    };
    let (made, _) = run(&["--setup", "echo made > made.txt"], "cat made.txt");
    assert_eq!(made, "made\n");
    // No flags: the thread's sandbox, setup and all.
    let (kept, said) = run(&[], "cat made.txt; echo again >> made.txt");
    assert_eq!(kept, "made\n");
    assert!(!said.contains("change its definition"), "{said}");
    // The same flags again: the same definition, no notice.
    let (same, said) = run(&["--setup", "echo made > made.txt"], "cat made.txt");
    assert_eq!(same, "made\nagain\n", "the same sandbox");
    assert!(!said.contains("change its definition"), "{said}");
    // Other flags: a sandbox of their own, and the change named.
    let (other, said) = run(&["--setup", "echo other > made.txt"], "cat made.txt");
    assert_eq!(other, "other\n");
    assert!(said.contains("setup: `echo made > made.txt` → `echo other > made.txt`"), "{said}");
    // --thread names the thread's sandbox (its newest) where an id would.
    let out = sandhold(&data).args(["exec", "--thread", "t-kept", "--", "cat", "made.txt"]).output().unwrap();
    assert_eq!(stdout(ok(&out)), "other\n");
    let out = sandhold(&data).args(["exec", "--thread", "t-none", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("has no sandbox"), "{}", stderr(&out));
    let defs =
        json_lines(ok(&sandhold(&data).args(["definitions", "ls", "--output", "json"]).output().unwrap()));
    let ids: Vec<&str> = defs.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "one definition per set of flags: {ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("def-")), "{ids:?}");
}

/// The sandbox of a run without a thread goes when the run ends, however it
/// ended: failed, or detached and then finished by an `attach` in another
/// process (which never made the sandbox itself). A thread's sandbox is
/// kept, and the CLI says so with the command that removes it.
#[test]
fn a_runs_sandbox_follows_its_definition_however_the_run_ended() {
    let dir = sandhold_tests::local::TestDir::new("sh-left");
    let data = dir.path().join("data");
    let sandboxes = || {
        let out = sandhold(&data).args(["sandboxes", "ls", "--output", "json"]).output().unwrap();
        json_lines(ok(&out))
            .into_iter()
            .filter_map(|s| s["sandbox_id"].as_str().map(str::to_string))
            .collect::<Vec<_>>()
    };
    let failed = sandhold(&data).args(["run", "--", "sh", "-c", "echo partial; exit 3"]).output().unwrap();
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    assert!(!stderr(&failed).contains("sandbox kept"), "{}", stderr(&failed));
    assert_eq!(sandboxes(), Vec::<String>::new(), "the failed run's sandbox went");

    let detached =
        sandhold(&data).args(["run", "--detach", "--", "sh", "-c", "sleep 2; echo done"]).output().unwrap();
    let run_id = stdout(ok(&detached)).trim().to_string();
    let attached = sandhold(&data).args(["attach", &run_id]).output().unwrap();
    assert_eq!(stdout(ok(&attached)), "done\n");
    assert_eq!(sandboxes(), Vec::<String>::new(), "the attached run's sandbox went");

    let kept = sandhold(&data).args(["run", "--thread", "t-left", "--", "true"]).output().unwrap();
    let listed = sandboxes();
    assert_eq!(listed.len(), 1, "a thread keeps its sandbox");
    let short = &listed[0][..16];
    let said = stderr(ok(&kept));
    assert!(said.contains(&format!("sandbox kept: {short}")), "{said}");
    let remove = format!("sandhold sandboxes rm {short}");
    assert!(said.contains(&remove), "{said}");
    ok(&sandhold(&data).args(["sandboxes", "rm", short]).output().unwrap());
    assert_eq!(sandboxes(), Vec::<String>::new(), "removed as the CLI said");
}

/// A local sandbox isolates nothing, and the terminal says so (not only the
/// server's log): once when it is made, with what to use instead, and on
/// every agent run in it.
#[test]
fn a_local_sandbox_says_on_the_terminal_that_it_has_no_isolation() {
    let dir = sandhold_tests::local::TestDir::new("sh-iso");
    let data = dir.path().join("data");
    let first = sandhold(&data).args(["run", "--thread", "t-iso", "--", "true"]).output().unwrap();
    let said = stderr(ok(&first));
    assert!(said.contains("NO isolation") && said.contains("--image IMAGE"), "{said}");
    let again = sandhold(&data).args(["run", "--thread", "t-iso", "--", "true"]).output().unwrap();
    assert!(!stderr(ok(&again)).contains("NO isolation"), "said once, when the sandbox is made");

    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-acp/fake_acp_agent.py");
    let line = format!("python3 {} --log '{}'", agent.display(), dir.path().join("acp.jsonl").display());
    let out = sandhold(&data)
        .args(["run", "--thread", "t-iso", "--harness", "acp", "--acp-command", &line, "--", "hi"])
        .output()
        .unwrap();
    let said = stderr(ok(&out));
    assert!(said.contains("acp runs on the server's host with no isolation"), "{said}");
}

/// `--harness acp`: the agent's command line from `--acp-command` (split as
/// a shell would), its mode and permission answer; the agent (the fake ACP
/// agent, which logs every request) gets the prompt, and its text is the
/// run's.
#[test]
fn run_drives_an_acp_agent_given_on_the_command_line() {
    let dir = sandhold_tests::local::TestDir::new("sh-acp");
    let data = dir.path().join("data");
    let log = dir.path().join("agent log.jsonl");
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-acp/fake_acp_agent.py");
    let line = format!("python3 {} --log '{}'", agent.display(), log.display());
    let out = sandhold(&data)
        .args([
            "run",
            "--harness",
            "acp",
            "--acp-command",
            &line,
            "--acp-mode",
            "yolo",
            "--",
            "hello",
            "agent",
        ])
        .output()
        .unwrap();
    assert_eq!(stdout(ok(&out)).trim_end(), "0 MCP servers");
    let sent: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .expect("the agent ran, with its --log argument whole")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let methods: Vec<&str> = sent.iter().map(|m| m["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["initialize", "session/new", "session/set_mode", "session/prompt"]);
    assert_eq!(sent[2]["params"]["modeId"], "yolo");
    assert_eq!(sent[3]["params"]["prompt"][0]["text"], "hello agent");

    // The flags belong together, and a line that does not split is refused.
    for (args, says) in [
        (&["--harness", "acp"][..], "--acp-command"),
        (&["--harness", "codex", "--acp-command", "x"], "--acp-command is for --harness acp"),
        (&["--harness", "acp", "--acp-command", "agent 'open"], "not a command line"),
    ] {
        let out = sandhold(&data).arg("run").args(args).args(["--", "hi"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

const TICKING: &str = "i=0; while [ $i -lt 600 ]; do i=$((i+1)); echo tick $i; sleep 0.1; done";

/// SIGINT once detaches (the run goes on, attach picks it up again);
/// `cancel` stops it and the attached CLI exits 130.
#[test]
fn sigint_detaches_attach_follows_cancel_ends() {
    use nix::sys::signal::Signal;
    let server = Served::start(&[]);
    let mut cmd = server.cli();
    cmd.args(["run", "--output", "json", "--", "sh", "-c", TICKING]);
    let mut live = Live::spawn(cmd);
    let first = live.until("with the run id", |l| l.contains("\"run_id\""));
    let run_id = json_line(&first)["run_id"].as_str().unwrap().to_string();
    live.until("tick 3", |l| l.contains("tick 3\\n"));
    live.signal(Signal::SIGINT);
    let code = live.wait(Duration::from_secs(20));
    assert_eq!(code, Some(0), "one Ctrl-C detaches: {:?}", live.seen);
    assert!(live.seen.iter().any(|l| l.contains("\"detached\":true")), "{:?}", live.seen);

    // Still running: attach from the start sees ticks the detached CLI never did.
    let mut attach = server.cli();
    attach.args(["attach", "--output", "json", &run_id]);
    let mut attached = Live::spawn(attach);
    attached.until("a tick after the detach", |l| l.contains("tick 40\\n"));
    let cancel =
        json_lines(ok(&server.cli().args(["cancel", "--output", "json", &run_id]).output().unwrap()));
    assert_eq!(cancel[0]["cancel_requested"], true, "{cancel:?}");
    assert_eq!(attached.wait(Duration::from_secs(60)), Some(130), "cancelled: {:?}", attached.seen.last());
    let last = json_line(attached.seen.iter().rev().find(|l| l.starts_with('{')).expect("a JSON line"));
    assert_eq!(last["error_code"], "CANCELLED", "{last}");
    let runs = json_lines(ok(&server.cli().args(["runs", "--output", "json"]).output().unwrap()));
    assert_eq!(runs[0]["status"], "aborted");
}

/// SIGINT twice within 2 s cancels; the CLI exits 130.
#[test]
fn two_sigints_cancel_the_run() {
    use nix::sys::signal::Signal;
    let server = Served::start(&[]);
    let mut cmd = server.cli();
    cmd.args(["run", "--", "sh", "-c", TICKING]);
    let mut live = Live::spawn(cmd);
    live.until("tick 2", |l| l == "tick 2");
    live.signal(Signal::SIGINT);
    live.until("the detach notice", |l| l.contains("press Ctrl-C again"));
    live.signal(Signal::SIGINT);
    assert_eq!(live.wait(Duration::from_secs(60)), Some(130), "{:?}", live.seen);
    assert!(live.seen.iter().any(|l| l.contains("cancelled")), "{:?}", live.seen);
    let runs = json_lines(ok(&server.cli().args(["runs", "--output", "json"]).output().unwrap()));
    assert_eq!(runs[0]["status"], "aborted");
}

/// `--detach` prints the run id once the run is accepted; on the embedded
/// server, `attach` in a later process takes the run over and follows it.
#[test]
fn detach_then_attach_on_the_embedded_server() {
    let dir = sandhold_tests::local::TestDir::new("sh-cli");
    let data = dir.path().join("data");
    let out = sandhold(&data)
        .args(["run", "--detach", "--", "sh", "-c", "for i in 1 2 3; do echo step $i; sleep 1; done"])
        .output()
        .unwrap();
    let run_id = stdout(ok(&out)).trim().to_string();
    assert!(run_id.starts_with("run-"), "{run_id:?}");
    let attached = sandhold(&data).args(["attach", &run_id]).output().unwrap();
    assert_eq!(stdout(ok(&attached)), "step 1\nstep 2\nstep 3\n");
    let json = sandhold(&data).args(["run", "--detach", "--output", "json", "--", "true"]).output().unwrap();
    let last = json_lines(ok(&json)).pop().unwrap();
    assert!(last["run_id"].is_string() && last["detached"] == true, "{last}");
}

/// `runs rm` removes ended runs (named by a unique prefix, as every run
/// command takes them) with their logs, and refuses one still going with
/// the way to end it; the rest of a list is still removed.
#[test]
fn runs_rm_removes_ended_runs_and_refuses_a_live_one() {
    let dir = sandhold_tests::local::TestDir::new("sh-rm");
    let data = dir.path().join("data");
    let cli = || sandhold(&data);
    let out = cli().args(["run", "--output", "json", "--", "echo", "kept-log"]).output().unwrap();
    let ended = json_lines(ok(&out))[0]["run_id"].as_str().unwrap().to_string();
    let prefix = &ended[..10];
    assert_eq!(stdout(ok(&cli().args(["logs", prefix]).output().unwrap())), "kept-log\n");
    let live = stdout(ok(&cli().args(["run", "--detach", "--", "sleep", "600"]).output().unwrap()))
        .trim()
        .to_string();

    let refused = cli().args(["runs", "rm", &live, prefix]).output().unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(stderr(&refused).contains(&format!("sandhold cancel {live}")), "{}", stderr(&refused));
    assert_eq!(stdout(&refused), format!("removed run {ended}\n"), "the ended one went all the same");

    let listed = json_lines(ok(&cli().args(["runs", "--output", "json"]).output().unwrap()));
    let ids: Vec<&str> = listed.iter().filter_map(|r| r["run_id"].as_str()).collect();
    assert_eq!(ids, [live.as_str()], "{listed:?}");
    let gone = cli().args(["logs", &ended]).output().unwrap();
    assert!(!gone.status.success() && stderr(&gone).contains("no run id starts with"), "{}", stderr(&gone));
    ok(&cli().args(["cancel", &live]).output().unwrap());
}

/// `sandhold run --image` needs no agent setting after
/// `scripts/build-agent-static`: the static agent is found where that
/// script puts it next to `sandhold`'s build; without one the error says
/// what to run. Both in a build layout the test makes (links to the real
/// binaries).
#[test]
fn docker_runs_find_the_static_agent_where_the_build_script_puts_it() {
    if !sandhold_tests::services::docker() {
        return;
    }
    sandhold_tests::docker::ensure_test_image();
    let layout = sandhold_tests::local::TestDir::new("static-layout");
    let exe = layout.path().join("target/debug/sandhold");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    let link = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::hard_link(from, to).or_else(|_| std::fs::copy(from, to).map(|_| ())).unwrap()
    };
    link(&sandhold_tests::cli::sandhold_bin(), &exe);
    // Nothing of the test's environment: only the layout tells.
    let cli = |args: &[&str]| {
        std::process::Command::new(&exe)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", layout.path())
            .env("SANDHOLD_DATA_DIR", layout.path().join("data"))
            // Each command's own server looks for the agent afresh.
            .env("SANDHOLD_EMBEDDED", "1")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let run = || cli(&["run", "--image", sandhold_tests::docker::TEST_IMAGE, "--", "echo", "from-docker"]);
    /// Removes the sandboxes the runs made, however the test ends.
    struct RemoveAll<F: Fn(&[&str]) -> std::process::Output>(F);
    impl<F: Fn(&[&str]) -> std::process::Output> Drop for RemoveAll<F> {
        fn drop(&mut self) {
            (self.0)(&["sandboxes", "rm", "--all"]);
        }
    }
    let _cleanup = RemoveAll(cli);

    let missing = run();
    assert!(!missing.status.success(), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("scripts/build-agent-static"), "{}", stderr(&missing));

    let agent = layout.path().join("target/static/x86_64-unknown-linux-gnu/debug/sandhold-agent");
    std::fs::create_dir_all(agent.parent().unwrap()).unwrap();
    link(&sandhold_tests::agent::static_agent(), &agent);
    let found = run();
    assert!(found.status.success(), "{}", stderr(&found));
    assert!(stdout(&found).contains("from-docker"), "{}", stdout(&found));
}

/// `serve` with its database down says so at once (not after the pool's
/// 30 s acquire timeout), and keeps saying so while it retries, in plain
/// lines when its stderr is no terminal.
#[test]
fn serve_says_at_once_and_again_that_its_database_does_not_answer() {
    serve_says_at_once_and_again(
        "sh-nodb",
        "--database-url",
        "postgres://sandhold@127.0.0.1:{port}/sandhold",
        "stores",
    );
}

/// The same for Redis, where the leases live.
#[test]
fn serve_says_at_once_and_again_that_redis_does_not_answer() {
    serve_says_at_once_and_again("sh-noredis", "--redis-url", "redis://127.0.0.1:{port}", "leases");
}

/// `serve` with `flag` pointing at a port nothing listens on (`{port}` in
/// `url`): at least two "not reachable yet" lines naming `what` within
/// 20 s, without colour codes.
fn serve_says_at_once_and_again(name: &str, flag: &str, url: &str, what: &str) {
    let dir = sandhold_tests::local::TestDir::new(name);
    // A port nothing listens on: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = sandhold(&dir.path().join("data"))
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "pretty"])
        .arg(flag)
        .arg(url.replace("{port}", &port.to_string()))
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let started = std::time::Instant::now();
    let mut warnings = Vec::new();
    while warnings.len() < 2 && started.elapsed() < Duration::from_secs(20) {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200))
            && line.contains("not reachable yet")
        {
            warnings.push((started.elapsed(), line));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(warnings.len() >= 2, "said it twice: {warnings:?}");
    // Both came before a pool's own acquire timeout could have said
    // anything.
    assert!(warnings[0].1.contains(what), "{warnings:?}");
    // Pretty lines to a pipe or a file are plain: no colour codes.
    assert!(warnings.iter().all(|(_, line)| !line.contains('\x1b')), "{warnings:?}");
}

/// `sandhold run --warm 1` gives its definition a pool: once the pool holds
/// a sandbox, the next one-off run of the same flags takes it (`pools ls`
/// counts the claim) and the pool makes another.
#[test]
fn run_warm_keeps_a_pool_the_next_run_takes_from() {
    let server = Served::start(&[]);
    let run = || {
        let out = server
            .cli()
            .args(["run", "--warm", "1", "--setup", "echo warm > w.txt", "--", "cat", "w.txt"])
            .output()
            .unwrap();
        stdout(ok(&out))
    };
    let pools = || json_lines(ok(&server.cli().args(["pools", "ls", "--output", "json"]).output().unwrap()));
    let ready_and_claimed = |pools: &[serde_json::Value]| {
        let pool = pools.first().cloned().unwrap_or_default();
        let n = |field: &str| pool[field].as_u64().unwrap_or_default();
        (n("ready"), n("claimed"))
    };
    assert_eq!(run(), "warm\n");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ready_and_claimed(&pools()).0 < 1 {
        assert!(std::time::Instant::now() < deadline, "the pool never filled: {:?}", pools());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(run(), "warm\n", "the claimed sandbox was set up");
    let listed = pools();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["target"], 1, "{listed:?}");
    assert_eq!(ready_and_claimed(&listed).1, 1, "the second run did not take the pooled sandbox: {listed:?}");
    let human = stdout(ok(&server.cli().args(["pools", "ls"]).output().unwrap()));
    assert!(human.starts_with("DEFINITION"), "{human}");
    assert!(human.lines().nth(1).is_some_and(|l| l.starts_with("def-")), "{human}");
}
