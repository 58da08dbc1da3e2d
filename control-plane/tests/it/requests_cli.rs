//! `sandhold requests`, `sandhold respond` and the prompt `sandhold run`
//! shows on a terminal, with the real binary against a spawned `sandhold
//! serve` and the fake ACP agent (tests/fake-acp), which asks to run a shell
//! command under a policy that asks for commands and runs it only if
//! allowed.

use std::path::Path;
use std::time::{Duration, Instant};

use sandhold_tests::cli::{Served, json_lines, ok, stderr, stdout};
use sandhold_tests::tmux::Tmux;
use sandhold_tests::wait::PATIENCE;

fn acp_line(log: &Path, ask: &str) -> String {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-acp/fake_acp_agent.py");
    format!("python3 {} --log '{}' --ask '{ask}'", agent.display(), log.display())
}

/// The requests `requests RUN --output json` lists, once there are `n`.
fn wait_requests(server: &Served, run: &str, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let out = server.cli().args(["requests", run, "--output", "json"]).output().unwrap();
        let listed = json_lines(ok(&out));
        if listed.len() >= n || Instant::now() > deadline {
            return listed;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn requests_lists_what_a_run_waits_on_and_respond_answers_it_once() {
    let server = Served::start(&[]);
    let log = server.dir.path().join("acp.log");
    let line = acp_line(&log, "echo hi > cli.txt");
    let out = server
        .cli()
        .args([
            "run",
            "--detach",
            "--harness",
            "acp",
            "--acp-command",
            &line,
            "--ask",
            "command:*",
            "--",
            "go",
        ])
        .output()
        .unwrap();
    let run = stdout(ok(&out)).lines().last().unwrap_or_default().trim().to_string();
    assert!(run.starts_with("run-"), "the run id is the last line of stdout: {}", stdout(&out));

    let listed = wait_requests(&server, &run, 1);
    assert_eq!(listed.len(), 1, "{listed:?}\n{}", server.log());
    let r = &listed[0];
    assert_eq!(r["kind"], "permission");
    assert_eq!(r["rule"], "ask command:*");
    assert_eq!(r["input"]["command"], "echo hi > cli.txt", "{r}");
    assert!(!r["tool"].as_str().unwrap_or_default().is_empty(), "{r}");
    let id = r["request_id"].as_str().unwrap().to_string();

    ok(&server.cli().args(["respond", &run, &id, "allow"]).output().unwrap());

    let out = server.cli().args(["attach", &run, "--output", "json"]).output().unwrap();
    let chunks = json_lines(ok(&out));
    let of = |ty: &str| chunks.iter().filter(|c| c["type"] == ty).collect::<Vec<_>>();
    assert_eq!(of("PERMISSION_REQUESTED").len(), 1, "{chunks:?}");
    let resolved = of("PERMISSION_RESOLVED");
    assert_eq!(resolved.len(), 1, "{chunks:?}");
    assert_eq!(resolved[0]["request"]["allowed"], true);
    assert_eq!(resolved[0]["request"]["answered_by"], "client");
    assert!(chunks.iter().any(|c| c["delta"].as_str().is_some_and(|d| d.contains("ran: echo hi > cli.txt"))));
    assert_eq!(chunks.last().unwrap()["type"], "RUN_FINISHED");
    let out = server.cli().args(["requests", &run, "--all", "--output", "json"]).output().unwrap();
    let all = json_lines(ok(&out));
    assert_eq!(all[0]["answer"]["allowed"], true, "{all:?}");
    let out = server.cli().args(["requests", &run, "--output", "json"]).output().unwrap();
    assert!(json_lines(ok(&out)).is_empty(), "nothing waits any more");
    // A second answer, once the run has ended too, is refused as a second
    // answer (the request was allowed, not denied with the run).
    let again = server.cli().args(["respond", &run, &id, "deny", "--message", "too late"]).output().unwrap();
    assert_ne!(again.status.code(), Some(0));
    assert!(stderr(&again).contains("answered already (by client)"), "{}", stderr(&again));
}

/// The pane of `session` once it shows `text` (or the time is up).
fn wait_pane(tmux: &Tmux, session: &str, text: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let pane = tmux.run(&["capture-pane", "-p", "-J", "-t", session]);
        if pane.contains(text) || Instant::now() > deadline {
            return pane;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `sandhold run` of the fake ACP agent asking to run `ask`, on a terminal
/// (a tmux session named `session`), against `server`; the pane once the
/// prompt shows.
fn prompting_run(server: &Served, tmux: &Tmux, session: &str, ask: &str) -> String {
    let log = server.dir.path().join(format!("acp-{session}.log"));
    let line = acp_line(&log, ask);
    let bin = sandhold_tests::cli::sandhold_bin();
    let script = format!(
        "SANDHOLD_SERVER={addr} SANDHOLD_TOKEN={token} SANDHOLD_DATA_DIR={data} {bin} run --harness acp \
         --acp-command \"$LINE\" --ask 'command:*' -- go; echo cli-exit=$?; sleep 600",
        addr = server.addr,
        token = server.local_token().expect("a server without tokens"),
        data = server.dir.path().join("tmux-client").display(),
        bin = bin.display(),
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        session,
        "-x",
        "300",
        "-y",
        "40",
        "-e",
        &format!("LINE={line}"),
        "-e",
        "LANG=C.UTF-8",
        "sh",
        "-c",
        &script,
    ]);
    let pane = wait_pane(tmux, session, "[y]es once");
    assert!(pane.contains("[y]es once"), "no prompt:\n{pane}\n{}", server.log());
    pane
}

/// On a terminal, `sandhold run` shows the request as a prompt and the
/// answer typed there decides: `n` denies (the command never runs), and
/// the run finishes.
#[test]
fn run_on_a_terminal_prompts_and_the_typed_answer_decides() {
    let server = Served::start(&[]);
    let tmux = Tmux::new();
    for (key, ran) in [("n", false), ("y", true)] {
        let marker = server.dir.path().join(format!("prompted-{key}.txt"));
        let session = format!("s{key}");
        let pane = prompting_run(&server, &tmux, &session, &format!("echo hi > {}", marker.display()));
        assert!(pane.contains("echo hi >"), "the prompt names the command:\n{pane}");
        tmux.run(&["send-keys", "-t", &session, key, "Enter"]);
        let pane = wait_pane(&tmux, &session, "cli-exit=");
        assert!(pane.contains("cli-exit=0"), "the run did not finish:\n{pane}");
        let said = if ran { "ran: echo hi" } else { "refused: echo hi" };
        assert!(pane.contains(said), "{pane}");
        assert_eq!(marker.exists(), ran, "{pane}");
    }
}

/// A command that hides itself from the prompt: after the real command, a
/// carriage return and an erase-line (`\r\x1b[2K`) would leave only `ls`
/// on the operator's screen. The prompt shows it whole, the controls
/// visible (`␍␛[2K`), on the line that names what runs.
#[test]
fn a_command_that_hides_itself_is_shown_whole_in_the_prompt() {
    let server = Served::start(&[]);
    let tmux = Tmux::new();
    let marker = server.dir.path().join("hidden-ran.txt");
    let ask = format!("touch {}; echo pwned\r\x1b[2Kls", marker.display());
    let pane = prompting_run(&server, &tmux, "hide", &ask);
    let shown = format!("touch {}; echo pwned", marker.display());
    let line = pane.lines().find(|l| l.contains(&shown) && l.contains("(ask command:*)"));
    let line = line.unwrap_or_else(|| panic!("the prompt hides the command:\n{pane}"));
    assert!(line.contains(&format!("{shown}␍␛[2Kls (ask command:*)")), "{line}");
    tmux.run(&["send-keys", "-t", "hide", "n", "Enter"]);
    let pane = wait_pane(&tmux, "hide", "cli-exit=");
    assert!(pane.contains("cli-exit=0"), "the run did not finish:\n{pane}");
    assert!(!marker.exists(), "denied, yet it ran:\n{pane}");
}
