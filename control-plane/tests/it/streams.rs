//! What a run, a setup step and `exec` write to stderr reaches the CLI's
//! stderr as it is written (and under `--output json` as lines of their own),
//! through the real `sandhold` binary and its embedded server: once each
//! across a takeover, secret values masked.

use std::time::Duration;

use sandhold_tests::cli::{Live, json_lines, ok, sandhold, stderr, stdout};
use sandhold_tests::local::TestDir;

/// The `run.stderr` lines of a run's `--output json`, in order.
fn stderr_lines(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["stream"] == "stderr")
        .map(|l| {
            assert_eq!(l["name"], "run.stderr", "{l}");
            l["value"]["line"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn a_runs_stderr_reaches_the_cli_while_it_runs_and_stdout_keeps_only_stdout() {
    let dir = TestDir::new("streams-run");
    let data = dir.path().join("data");
    let mut cmd = sandhold(&data);
    cmd.args(["run", "--", "sh", "-c", "echo out; echo warn >&2; sleep 2; echo warn2 >&2"]);
    let mut live = Live::spawn(cmd);
    live.until("the first stderr line", |l| l == "stderr: warn");
    assert!(
        live.child.try_wait().unwrap().is_none(),
        "warn arrived only after the run ended: {:?}",
        live.seen
    );
    assert!(!live.seen.iter().any(|l| l.contains("warn2")), "{:?}", live.seen);
    assert_eq!(live.wait(Duration::from_secs(60)), Some(0), "{:?}", live.seen);
    assert!(live.seen.iter().any(|l| l == "stderr: warn2"), "{:?}", live.seen);
    let on_stdout: Vec<&String> = live.seen.iter().filter(|l| !l.starts_with("stderr: ")).collect();
    assert_eq!(on_stdout, ["out"], "stdout holds the command's stdout only");

    // JSON: each stderr line is a line of its own, marked, in the schema
    // (json_lines holds every line to it); the failure still says the tail.
    let out = sandhold(&data)
        .args(["run", "--output", "json", "--", "sh", "-c", "echo out; echo warn >&2; echo more >&2; exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let lines = json_lines(&out);
    assert_eq!(stderr_lines(&lines), ["warn", "more"], "{lines:?}");
    let offsets: Vec<u64> = lines
        .iter()
        .filter(|l| l["stream"] == "stderr")
        .map(|l| l["value"]["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [5, 10], "offsets in the run's stderr");
    assert_eq!(lines.last().unwrap()["type"], "RUN_ERROR");
    assert!(!stdout(&out).contains("\"delta\":\"warn"), "stderr is not stdout text");
}

#[test]
fn a_secret_written_to_stderr_is_masked_on_the_terminal_and_in_the_log() {
    const VALUE: &str = "stderr-secret-value-8841";
    let dir = TestDir::new("streams-secret");
    let data = dir.path().join("data");
    let out = sandhold(&data)
        .env("MY_TOKEN", VALUE)
        .args(["run", "--secret", "TOK=MY_TOKEN", "--output", "json", "--"])
        .args(["sh", "-c", "echo \"token $TOK here\" >&2; printf '%s\\n' \"$TOK\" | rev >&2"])
        .output()
        .unwrap();
    let lines = json_lines(ok(&out));
    assert_eq!(stderr_lines(&lines)[0], "token [secret:TOK] here", "{lines:?}");
    let run_id = lines[0]["run_id"].as_str().unwrap().to_string();
    let human = sandhold(&data)
        .env("MY_TOKEN", VALUE)
        .args(["run", "--secret", "TOK=MY_TOKEN", "--", "sh", "-c", "echo \"token $TOK here\" >&2"])
        .output()
        .unwrap();
    assert!(stderr(ok(&human)).contains("token [secret:TOK] here"), "{}", stderr(&human));
    let logs = sandhold(&data).args(["logs", "--output", "json", &run_id]).output().unwrap();
    for text in [stdout(&out), stderr(&out), stdout(&logs), stderr(&human), stdout(&human)] {
        assert!(!text.contains(VALUE), "the value escaped: {text}");
    }
    assert_eq!(stderr_lines(&json_lines(ok(&logs)))[0], "token [secret:TOK] here");
}

/// A run detached mid-way (the embedded server ends with its CLI) is taken
/// over by `attach`'s server: the stderr line the first driver stored and
/// those written after are each in the log once.
#[test]
fn a_takeover_delivers_each_stderr_line_exactly_once() {
    use nix::sys::signal::Signal;
    let dir = TestDir::new("streams-takeover");
    let data = dir.path().join("data");
    let mut cmd = sandhold(&data);
    cmd.args(["run", "--output", "json", "--"]).args([
        "sh",
        "-c",
        "echo e1 >&2; echo o1; sleep 5; echo e2 >&2; echo o2; sleep 0.5; echo e3 >&2",
    ]);
    let mut live = Live::spawn(cmd);
    let first = live.until("the run id", |l| l.contains("\"run_id\""));
    let run_id =
        serde_json::from_str::<serde_json::Value>(&first).unwrap()["run_id"].as_str().unwrap().to_string();
    live.until("e1 stored and shown", |l| l.contains("\"line\":\"e1\""));
    live.signal(Signal::SIGINT);
    assert_eq!(live.wait(Duration::from_secs(30)), Some(0), "one Ctrl-C detaches: {:?}", live.seen);
    assert!(!live.seen.iter().any(|l| l.contains("\"line\":\"e2\"")), "detached before e2: {:?}", live.seen);

    let attached = sandhold(&data).args(["attach", "--output", "json", &run_id]).output().unwrap();
    let lines = json_lines(ok(&attached));
    assert_eq!(stderr_lines(&lines), ["e1", "e2", "e3"], "{lines:?}");
    let texts: Vec<&str> = lines.iter().filter_map(|l| l["delta"].as_str()).collect();
    assert_eq!(texts.concat(), "o1\no2\n", "{lines:?}");
    let logs = sandhold(&data).args(["logs", "--output", "json", &run_id]).output().unwrap();
    assert_eq!(stderr_lines(&json_lines(ok(&logs))), ["e1", "e2", "e3"]);
    // Human attach from the start: stderr lines on stderr, once.
    let human = sandhold(&data).args(["attach", &run_id]).output().unwrap();
    assert_eq!(stdout(ok(&human)), "o1\no2\n");
    let err = stderr(&human);
    for e in ["e1", "e2", "e3"] {
        assert_eq!(err.lines().filter(|l| *l == e).count(), 1, "{e} once: {err}");
    }
}

/// A setup step's stderr reaches the CLI while the step still runs, and
/// `--output json` says which stream each output line came from.
#[test]
fn setup_stderr_is_streamed_and_marked() {
    let dir = TestDir::new("streams-setup");
    let data = dir.path().join("data");
    let mut cmd = sandhold(&data);
    cmd.args(["run", "--output", "json", "--setup", "echo s-out; echo s-err >&2; sleep 2; echo s-err2 >&2"])
        .args(["--", "true"]);
    let mut live = Live::spawn(cmd);
    let line = live.until("the step's stderr line", |l| l.contains("\"output_line\":\"s-err\""));
    assert!(live.child.try_wait().unwrap().is_none(), "s-err came only after the step: {:?}", live.seen);
    let progress = serde_json::from_str::<serde_json::Value>(&line).unwrap()["progress"].clone();
    assert_eq!(progress["output_stream"], "stderr", "{progress}");
    assert_eq!(live.wait(Duration::from_secs(60)), Some(0), "{:?}", live.seen);
    let outputs: Vec<(String, String)> = live
        .seen
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["progress"]["output_line"].is_string())
        .map(|v| {
            let p = &v["progress"];
            (p["output_line"].as_str().unwrap().to_string(), p["output_stream"].as_str().unwrap().to_string())
        })
        .collect();
    // Two pipes: s-out and s-err may come in either order; s-err2 is last.
    let mut outputs = outputs;
    let last = outputs.pop();
    outputs.sort();
    let pair = |l: &str, s: &str| (l.to_string(), s.to_string());
    assert_eq!(outputs, [pair("s-err", "stderr"), pair("s-out", "stdout")]);
    assert_eq!(last, Some(pair("s-err2", "stderr")));

    // Without --output json (not a terminal): each line on stderr as it comes.
    let out = sandhold(&data).args(["run", "--setup", "echo human-err >&2", "--", "true"]).output().unwrap();
    assert!(stderr(ok(&out)).contains("  | human-err"), "{}", stderr(&out));
}

/// `exec`'s stderr reaches the CLI's stderr while the command still runs.
#[test]
fn exec_stderr_is_streamed_while_the_command_runs() {
    let dir = TestDir::new("streams-exec");
    let data = dir.path().join("data");
    ok(&sandhold(&data).args(["run", "--thread", "t-exec", "--", "true"]).output().unwrap());
    let mut cmd = sandhold(&data);
    cmd.args([
        "exec",
        "--thread",
        "t-exec",
        "--",
        "sh",
        "-c",
        "echo x-out; echo x-err >&2; sleep 2; echo x-err2 >&2",
    ]);
    let mut live = Live::spawn(cmd);
    live.until("exec's stderr line", |l| l == "stderr: x-err");
    assert!(live.child.try_wait().unwrap().is_none(), "x-err came only at the end: {:?}", live.seen);
    assert_eq!(live.wait(Duration::from_secs(60)), Some(0), "{:?}", live.seen);
    assert!(live.seen.iter().any(|l| l == "x-out"), "{:?}", live.seen);
    assert!(live.seen.iter().any(|l| l == "stderr: x-err2"), "{:?}", live.seen);
    let _ = sandhold(&data).args(["sandboxes", "rm", "--all"]).output();
}
