//! ShellService over a real Unix socket. The robustness cases run against
//! every shell found here: bash, `/bin/sh` (dash on Debian) and busybox sh.

use std::collections::HashMap;
use std::time::Duration;

use sandhold_tests::agent::TestAgent;
use sandhold_tests::local::processes_under;
use sandhold_tests::wait::eventually;
use shared::proto::agent::v1::shell_service_client::ShellServiceClient;
use shared::proto::agent::v1::{
    CloseShellRequest, OpenShellRequest, OutputStream, RunInShellRequest, RunParallelRequest,
    ShellCommandExit, run_in_shell_response, run_parallel_response,
};
use shared::transport::AuthedChannel;
use tonic::Code;

type Client = ShellServiceClient<AuthedChannel>;

/// Shells to test with: `""` is the agent's default (bash when installed).
fn shells(agent: &TestAgent) -> Vec<String> {
    let mut shells = vec![String::new(), "/bin/sh".to_string()];
    if let Some(busybox) =
        ["/usr/bin/busybox", "/bin/busybox"].iter().find(|p| std::path::Path::new(p).exists())
    {
        // Busybox picks the applet from argv[0].
        let link = agent.dir.path().join("bin/sh");
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let _ = std::os::unix::fs::symlink(busybox, &link);
        shells.push(link.display().to_string());
    }
    shells
}

async fn open(c: &mut Client, shell: &str) -> String {
    c.open_shell(OpenShellRequest { cwd: String::new(), env: HashMap::new(), shell: shell.into() })
        .await
        .unwrap()
        .into_inner()
        .session_id
}

/// Output of one command, per stream, and its exit.
#[derive(Debug, Default)]
struct Ran {
    stdout: String,
    stderr: String,
    exit: ShellCommandExit,
}

async fn run(c: &mut Client, session: &str, command: &str, timeout_ms: Option<u64>) -> Ran {
    let req = RunInShellRequest {
        session_id: session.into(),
        command: command.into(),
        timeout_ms,
        end_shell_on_timeout: false,
    };
    run_request(c, req).await
}

async fn run_request(c: &mut Client, req: RunInShellRequest) -> Ran {
    let command = req.command.clone();
    let mut stream = c.run_in_shell(req).await.unwrap().into_inner();
    let mut ran = Ran::default();
    let mut exits = 0;
    while let Some(msg) = tokio::time::timeout(Duration::from_secs(60), stream.message())
        .await
        .unwrap_or_else(|_| panic!("{command:?} did not finish"))
        .unwrap()
    {
        match msg.event {
            Some(run_in_shell_response::Event::Output(chunk)) => {
                assert_eq!(exits, 0, "output after exit");
                let text = String::from_utf8_lossy(&chunk.data).into_owned();
                match chunk.stream() {
                    OutputStream::Stderr => ran.stderr.push_str(&text),
                    _ => ran.stdout.push_str(&text),
                }
            }
            Some(run_in_shell_response::Event::Exit(exit)) => {
                exits += 1;
                ran.exit = exit;
            }
            None => {}
        }
    }
    assert_eq!(exits, 1, "exactly one exit for {command:?}");
    ran
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().next().unwrap();
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

async fn wait_gone(pid: u32) {
    let gone = eventually(Duration::from_secs(30), || std::future::ready(!alive(pid))).await;
    assert!(gone, "pid {pid} still alive");
}

#[tokio::test]
async fn cd_export_and_variables_carry_over_between_commands() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    std::fs::create_dir_all(agent.root.join("sub/dir")).unwrap();
    for sh in shells(&agent) {
        let s = open(&mut c, &sh).await;
        let r = run(&mut c, &s, "cd sub/dir && export GREETING='hi there' && LOCAL=only-here", None).await;
        assert_eq!((r.exit.exit_code, r.exit.shell_exited, r.exit.timed_out), (0, false, false), "{sh}");
        let r =
            run(&mut c, &s, "pwd; echo \"$GREETING|$LOCAL\"; sh -c 'echo \"child:$GREETING\"'", None).await;
        assert_eq!(
            r.stdout,
            format!("{}\nhi there|only-here\nchild:hi there\n", agent.root.join("sub/dir").display()),
            "{sh}"
        );
        let r = run(&mut c, &s, "echo to-err >&2; false", None).await;
        assert_eq!((r.stdout.as_str(), r.stderr.as_str(), r.exit.exit_code), ("", "to-err\n", 1), "{sh}");
        c.close_shell(CloseShellRequest { session_id: s }).await.unwrap();
    }
    agent.stop().await;
}

#[tokio::test]
async fn a_parallel_group_starts_from_the_shells_state_and_runs_concurrently() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    std::fs::create_dir_all(agent.root.join("work")).unwrap();
    for sh in shells(&agent) {
        let s = open(&mut c, &sh).await;
        run(&mut c, &s, "cd work && export MODE=parallel-$$ && rm -f a b", None).await;
        let mode = run(&mut c, &s, "echo $MODE", None).await.stdout;
        // The first two wait for each other: only concurrent runs finish.
        let commands = vec![
            "pwd; echo \"mode=$MODE\"".to_string(),
            "touch a; while [ ! -e b ]; do sleep 0.02; done; echo saw-b".to_string(),
            "touch b; while [ ! -e a ]; do sleep 0.02; done; echo saw-a >&2; exit 4".to_string(),
        ];
        let req = RunParallelRequest { session_id: s.clone(), commands, timeout_ms: Some(60_000) };
        let mut stream = c.run_parallel(req).await.unwrap().into_inner();
        let mut out: HashMap<u32, String> = HashMap::new();
        let mut exits: HashMap<u32, ShellCommandExit> = HashMap::new();
        while let Some(msg) =
            tokio::time::timeout(Duration::from_secs(90), stream.message()).await.unwrap().unwrap()
        {
            match msg.event {
                Some(run_parallel_response::Event::Output(chunk)) => {
                    out.entry(msg.index).or_default().push_str(&String::from_utf8_lossy(&chunk.data))
                }
                Some(run_parallel_response::Event::Exit(exit)) => {
                    assert!(exits.insert(msg.index, exit).is_none(), "one exit per command");
                }
                None => {}
            }
        }
        assert_eq!(out[&0], format!("{}\nmode={}", agent.root.join("work").display(), mode), "{sh}");
        assert_eq!(out[&1], "saw-b\n");
        assert_eq!(out[&2], "saw-a\n");
        assert_eq!([0, 1, 2].map(|i| exits[&i].exit_code), [0, 0, 4], "{sh}");
        assert_eq!(exits[&2].output_tail, b"saw-a\n");
        // The group did not change the shell.
        let r = run(&mut c, &s, "pwd", None).await;
        assert_eq!(r.stdout, format!("{}\n", agent.root.join("work").display()));
        c.close_shell(CloseShellRequest { session_id: s }).await.unwrap();
    }
    agent.stop().await;
}

#[tokio::test]
async fn marker_lookalikes_stdin_readers_and_syntax_errors_do_not_confuse_the_shell() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    for sh in shells(&agent) {
        let s = open(&mut c, &sh).await;
        // Whatever marker-like text a command prints is its output, and it
        // cannot write a status line of its own.
        let fake = "__sandhold_end_00000000000000000000000000000000__";
        let cmd = format!(
            "printf '%s' '{fake}'; echo; printf '%s\\n' '{fake}' >&2; echo '00000000000000000000000000000000 0' >&3; exit_code_is=5; (exit 5)"
        );
        let r = run(&mut c, &s, &cmd, None).await;
        assert_eq!(r.stdout, format!("{fake}\n"), "{sh}");
        assert!(r.stderr.starts_with(&format!("{fake}\n")), "{sh}: {:?}", r.stderr);
        assert_eq!((r.exit.exit_code, r.exit.shell_exited), (5, false), "{sh}");

        // A command reading stdin gets EOF, not the commands that follow.
        let r = run(&mut c, &s, "read line; echo \"read:[$line] rc=$?\"; cat; echo after-cat", None).await;
        assert_eq!(r.stdout, "read:[] rc=1\nafter-cat\n", "{sh}");
        assert_eq!(run(&mut c, &s, "echo next", None).await.stdout, "next\n", "{sh}");

        // Syntax errors fail the command, not the shell.
        let r = run(&mut c, &s, "if then fi (", None).await;
        assert_ne!(r.exit.exit_code, 0, "{sh}");
        assert!(!r.exit.shell_exited, "{sh}");
        let r = run(&mut c, &s, "echo 'quote'\"s\" \\$HOME; printf 'no newline'", None).await;
        assert_eq!(r.stdout, "quotes $HOME\nno newline", "{sh}");
        c.close_shell(CloseShellRequest { session_id: s }).await.unwrap();
    }
    agent.stop().await;
}

#[tokio::test]
async fn exit_ends_the_session_and_a_new_one_can_be_opened() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    for sh in shells(&agent) {
        let s = open(&mut c, &sh).await;
        // A background job holding the output pipes must not delay the report.
        let r = run(&mut c, &s, "sleep 1000 & echo bg=$!; echo bye; exit 3", None).await;
        assert_eq!((r.exit.exit_code, r.exit.shell_exited), (3, true), "{sh}");
        assert!(r.stdout.ends_with("bye\n"), "{sh}: {:?}", r.stdout);
        let bg: u32 = r.stdout.lines().next().unwrap().strip_prefix("bg=").unwrap().parse().unwrap();
        // The dead shell's leftovers are killed with it.
        wait_gone(bg).await;
        let req = RunInShellRequest {
            session_id: s.clone(),
            command: "true".into(),
            timeout_ms: None,
            end_shell_on_timeout: false,
        };
        assert_eq!(c.run_in_shell(req).await.unwrap_err().code(), Code::NotFound, "{sh}");
        let s2 = open(&mut c, &sh).await;
        assert_eq!(run(&mut c, &s2, "echo again", None).await.stdout, "again\n", "{sh}");
        c.close_shell(CloseShellRequest { session_id: s2 }).await.unwrap();
    }
    agent.stop().await;
}

#[tokio::test]
async fn background_jobs_do_not_hold_up_commands_and_die_with_the_session() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    for sh in shells(&agent) {
        let s = open(&mut c, &sh).await;
        let r = run(&mut c, &s, "sleep 1000 & echo $!", None).await;
        assert_eq!(r.exit.exit_code, 0, "{sh}");
        let bg: u32 = r.stdout.trim().parse().unwrap();
        assert!(alive(bg));
        assert_eq!(run(&mut c, &s, "echo still-here", None).await.stdout, "still-here\n", "{sh}");
        c.close_shell(CloseShellRequest { session_id: s.clone() }).await.unwrap();
        wait_gone(bg).await;
        let e = c.close_shell(CloseShellRequest { session_id: s }).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }
    agent.stop().await;
}

#[tokio::test]
async fn a_timeout_kills_the_commands_process_group_and_keeps_the_shell() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    for sh in shells(&agent) {
        let s = open(&mut c, &sh).await;
        run(&mut c, &s, "mkdir -p kept && cd kept", None).await;
        let r = run(&mut c, &s, "sleep 1000 & echo bg=$!; sh -c 'echo fg=$$; exec sleep 1000'", Some(3_000))
            .await;
        assert!(r.exit.timed_out, "{sh}");
        assert!(!r.exit.shell_exited, "{sh}");
        assert_eq!(r.exit.exit_code, 137, "{sh}: killed by SIGKILL");
        let pid = |key: &str| -> u32 {
            r.stdout.lines().find_map(|l| l.strip_prefix(key)).unwrap().parse().unwrap()
        };
        wait_gone(pid("fg=")).await;
        wait_gone(pid("bg=")).await;
        // Same shell, same state.
        let r = run(&mut c, &s, "pwd", None).await;
        assert_eq!(r.stdout, format!("{}\n", agent.root.join("kept").display()), "{sh}");
        c.close_shell(CloseShellRequest { session_id: s }).await.unwrap();
    }
    agent.stop().await;
}

/// Setup's mode: the rest of a timed-out compound command must not run, so
/// the shell ends with it.
#[tokio::test]
async fn a_timeout_can_end_the_shell_so_the_rest_of_the_command_never_runs() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    for sh in shells(&agent) {
        let s = open(&mut c, &sh).await;
        let req = RunInShellRequest {
            session_id: s.clone(),
            command: "sleep 2; echo late > late.txt".into(),
            timeout_ms: Some(300),
            end_shell_on_timeout: true,
        };
        let r = run_request(&mut c, req).await;
        assert!(r.exit.timed_out && r.exit.shell_exited, "{sh}: {:?}", r.exit);
        // Until nothing is left that could run the rest: no process works
        // in the agent's root any more (the shell and its children did).
        let ended = eventually(Duration::from_secs(30), || {
            std::future::ready(processes_under(&agent.root).is_empty())
        })
        .await;
        assert!(ended, "{sh}: processes left in the root: {:?}", processes_under(&agent.root));
        assert!(!agent.root.join("late.txt").exists(), "{sh}: the rest of the command ran");
    }
    agent.stop().await;
}

#[tokio::test]
async fn a_shell_stuck_in_a_builtin_loop_is_killed_and_reported_exited_on_timeout() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    let s = open(&mut c, "").await;
    let r = run(&mut c, &s, "while :; do :; done", Some(500)).await;
    assert!(r.exit.timed_out && r.exit.shell_exited, "{:?}", r.exit);
    let s2 = open(&mut c, "").await;
    assert_eq!(run(&mut c, &s2, "echo fresh", None).await.stdout, "fresh\n");
    agent.stop().await;
}

#[tokio::test]
async fn a_failure_reports_the_last_1500_bytes_of_output() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    let s = open(&mut c, "").await;
    let r = run(
        &mut c,
        &s,
        "i=0; while [ $i -lt 500 ]; do i=$((i+1)); echo line$i; done; echo boom; exit 9",
        None,
    )
    .await;
    assert_eq!(r.exit.exit_code, 9);
    assert_eq!(r.exit.output_tail.len(), 1500);
    assert!(r.stdout.starts_with("line1\nline2\n"), "the stream carries everything");
    assert!(String::from_utf8(r.exit.output_tail).unwrap().ends_with("line500\nboom\n"));
    agent.stop().await;
}

#[tokio::test]
async fn shell_failures() {
    let agent = TestAgent::start().await;
    let mut c = ShellServiceClient::new(agent.channel().await);
    let open_with = |cwd: &str, shell: &str, env: HashMap<String, String>| OpenShellRequest {
        cwd: cwd.into(),
        env,
        shell: shell.into(),
    };
    let cases = [
        (open_with("../", "", HashMap::new()), Code::PermissionDenied),
        (open_with("missing", "", HashMap::new()), Code::NotFound),
        (open_with("", "bash", HashMap::new()), Code::InvalidArgument),
        (open_with("", "/nonexistent/sh", HashMap::new()), Code::NotFound),
        (open_with("", "", HashMap::from([("A=B".into(), "x".into())])), Code::InvalidArgument),
    ];
    for (req, expected) in cases {
        let desc = format!("{req:?}");
        assert_eq!(c.open_shell(req).await.unwrap_err().code(), expected, "{desc}");
    }
    let req = RunInShellRequest {
        session_id: "nope".into(),
        command: "true".into(),
        timeout_ms: None,
        end_shell_on_timeout: false,
    };
    assert_eq!(c.run_in_shell(req).await.unwrap_err().code(), Code::NotFound);
    let req =
        RunParallelRequest { session_id: "nope".into(), commands: vec!["true".into()], timeout_ms: None };
    assert_eq!(c.run_parallel(req).await.unwrap_err().code(), Code::NotFound);
    let s = open(&mut c, "").await;
    let req = RunParallelRequest { session_id: s.clone(), commands: vec![], timeout_ms: None };
    assert_eq!(c.run_parallel(req).await.unwrap_err().code(), Code::InvalidArgument);
    let req = RunInShellRequest {
        session_id: s.clone(),
        command: "a\0b".into(),
        timeout_ms: None,
        end_shell_on_timeout: false,
    };
    assert_eq!(c.run_in_shell(req).await.unwrap_err().code(), Code::InvalidArgument);

    // Env and cwd given at open hold for the session.
    std::fs::create_dir_all(agent.root.join("start")).unwrap();
    let req = open_with("start", "", HashMap::from([("FROM_OPEN".into(), "yes".into())]));
    let s2 = c.open_shell(req).await.unwrap().into_inner().session_id;
    let r = run(&mut c, &s2, "echo \"$FROM_OPEN\"; pwd", None).await;
    assert_eq!(r.stdout, format!("yes\n{}\n", agent.root.join("start").display()));
    agent.stop().await;
}
