//! JournalService over a real Unix socket: starts, follows, bounded reads,
//! exit probes, forgery, restarts of the agent and kill -9 of the daemon.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use sandbox_agent::AgentOptions;
use sandhold_tests::agent::TestAgent;
use sandhold_tests::wait::eventually;
use shared::error::{Error, ErrorCode};
use shared::ids::RunId;
use shared::journal;
use shared::proto::agent::v1::journal_service_client::JournalServiceClient;
use shared::proto::agent::v1::{
    Argv, Command, DeleteJournalsRequest, FollowRequest, ListJournalsRequest, ProbeExitRequest,
    ReadJournalRequest, RunExit, RunState, StartRunRequest, command, follow_response, start_run_request,
};
use shared::secret::Secret;
use shared::transport::{Address, AuthedChannel, BearerToken, authed, connect};
use tonic::Code;

type Client = JournalServiceClient<AuthedChannel>;

const KEY: &[u8] = b"per-run-secret-key-0123456789";
const LONG: Duration = Duration::from_secs(120);

fn use_real_shim() {
    sandbox_agent::journal::set_shim_program(env!("CARGO_BIN_EXE_sandhold-agent"));
}

fn shell(s: &str) -> Option<Command> {
    Some(Command { kind: Some(command::Kind::Shell(s.to_string())) })
}

fn start_req(run_id: &str, script: &str) -> StartRunRequest {
    StartRunRequest {
        run_id: run_id.into(),
        command: shell(script),
        sentinel_key: KEY.to_vec(),
        ..Default::default()
    }
}

async fn client(agent: &TestAgent) -> Client {
    JournalServiceClient::new(agent.channel().await)
}

/// Follow to the end: every line with its end offset, then the exit.
async fn follow_all(c: &mut Client, run_id: &str, from: u64, key: &[u8]) -> (Vec<(Vec<u8>, u64)>, RunExit) {
    let req = FollowRequest {
        run_id: run_id.into(),
        from_byte: from,
        sentinel_key: key.to_vec(),
        first_byte_timeout_ms: Some(0),
        ..Default::default()
    };
    tokio::time::timeout(LONG, async {
        let mut stream = c.follow(req).await.expect("follow").into_inner();
        let mut lines = Vec::new();
        while let Some(msg) = stream.next().await {
            match msg.expect("follow message").event.expect("event") {
                follow_response::Event::Lines(l) => {
                    lines.extend(l.lines.into_iter().map(|l| (l.data, l.end_offset)))
                }
                follow_response::Event::Exit(e) => {
                    assert!(stream.next().await.is_none(), "nothing follows the exit");
                    return (lines, e);
                }
            }
        }
        panic!("follow ended without an exit");
    })
    .await
    .expect("follow finished in time")
}

async fn probe(c: &mut Client, run_id: &str, key: &[u8]) -> (RunState, Option<i32>) {
    let r = c
        .probe_exit(ProbeExitRequest { run_id: run_id.into(), sentinel_key: key.to_vec() })
        .await
        .unwrap()
        .into_inner();
    (r.state(), r.exit_code)
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    assert!(eventually(LONG, || std::future::ready(cond())).await, "timed out waiting for {what}");
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn a_run_is_journaled_followed_and_probed() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let started = c
        .start_run(start_req("run-basic", "printf 'one\\ntwo\\n'; echo oops >&2; exit 3"))
        .await
        .unwrap()
        .into_inner();
    assert!(started.pid > 0 && started.supervisor_pid > 0);
    assert_eq!(started.journal_path, agent.journal_dir.join("run-basic.ndjson").display().to_string());

    let (lines, exit) = follow_all(&mut c, "run-basic", 0, KEY).await;
    assert_eq!(lines, vec![(b"one".to_vec(), 4), (b"two".to_vec(), 8)]);
    assert_eq!(exit.exit_code, 3);
    assert_eq!(exit.stderr_tail, b"oops\n");
    assert_eq!(exit.sentinel_offset, 8);

    // On disk: the output, then exactly the keyed sentinel.
    let nonce = journal::nonce(KEY, &RunId::parse("run-basic").unwrap());
    let data = std::fs::read(agent.journal_dir.join("run-basic.ndjson")).unwrap();
    assert_eq!(data, format!("one\ntwo\n{}", journal::sentinel_line(3, &nonce)).into_bytes());

    assert_eq!(probe(&mut c, "run-basic", KEY).await, (RunState::Finished, Some(3)));
    // Another key does not recognise the sentinel; the supervisor is gone:
    // unknown, never finished.
    wait_for("supervisor exit", || {
        !agent.journal_dir.join("run-basic.lock").exists() || {
            !sandbox_agent::shim::lock_is_held(&agent.journal_dir.join("run-basic.lock"))
        }
    })
    .await;
    assert_eq!(probe(&mut c, "run-basic", b"other key").await, (RunState::Unknown, None));
    assert_eq!(probe(&mut c, "run-basic", b"").await, (RunState::Unknown, None));

    wait_for("exit hint", || agent.journal_dir.join("run-basic.exit").exists()).await;
    let list = c.list_journals(ListJournalsRequest {}).await.unwrap().into_inner().journals;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].run_id, "run-basic");
    assert_eq!(list[0].journal_bytes, data.len() as u64);
    assert_eq!(list[0].stderr_bytes, 5);
    assert_eq!(list[0].state(), RunState::Finished);
    assert_eq!(list[0].exit_code, Some(3));
    assert!(list[0].mtime_ms > 0);

    let del = c
        .delete_journals(DeleteJournalsRequest { run_ids: vec!["run-basic".into(), "never-was".into()] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(del.deleted, vec!["run-basic"]);
    assert_eq!(del.not_found, vec!["never-was"]);
    assert_eq!(files_in(&agent.journal_dir), Vec::<String>::new());
    agent.stop().await;
}

#[tokio::test]
async fn bad_and_reused_run_ids_touch_no_file() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    for bad in ["", ".", "..", "a/b", "../x", "a b", &"x".repeat(201), "é"] {
        let st = c.start_run(start_req(bad, "echo hi")).await.unwrap_err();
        assert_eq!(st.code(), Code::InvalidArgument, "{bad:?}");
        let st = c
            .follow(FollowRequest { run_id: bad.into(), ..Default::default() })
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(st.code(), Code::InvalidArgument, "{bad:?}");
        let st = c.delete_journals(DeleteJournalsRequest { run_ids: vec![bad.into()] }).await.unwrap_err();
        assert_eq!(st.code(), Code::InvalidArgument, "{bad:?}");
    }
    assert_eq!(files_in(&agent.journal_dir), Vec::<String>::new());
    assert!(
        files_in(agent.dir.path()).iter().all(|f| ["root", "journal", "agent.sock"].contains(&f.as_str()))
    );

    // A second start of the same id is refused and does not touch the run.
    c.start_run(start_req("dup", "echo first")).await.unwrap();
    let (lines, _) = follow_all(&mut c, "dup", 0, KEY).await;
    assert_eq!(lines, vec![(b"first".to_vec(), 6)]);
    let before = std::fs::read(agent.journal_dir.join("dup.ndjson")).unwrap();
    let st = c.start_run(start_req("dup", "echo second")).await.unwrap_err();
    assert_eq!(st.code(), Code::AlreadyExists);
    assert_eq!(Error::from_status(&st).code, ErrorCode::AlreadyExists);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(std::fs::read(agent.journal_dir.join("dup.ndjson")).unwrap(), before);

    // A command that cannot start leaves no journal behind.
    let req = StartRunRequest {
        run_id: "nope".into(),
        command: Some(Command {
            kind: Some(command::Kind::Argv(Argv { args: vec!["/no/such/program".into()] })),
        }),
        ..Default::default()
    };
    let st = c.start_run(req).await.unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition, "{st:?}");
    assert!(!agent.journal_dir.join("nope.ndjson").exists());
    // The cwd is confined.
    let mut req = start_req("escape", "pwd");
    req.cwd = "../..".into();
    assert_eq!(c.start_run(req).await.unwrap_err().code(), Code::PermissionDenied);
    assert!(!agent.journal_dir.join("escape.ndjson").exists());
    agent.stop().await;
}

#[tokio::test]
async fn unknown_runs_are_not_found_at_once_and_create_nothing() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let t = std::time::Instant::now();
    let st = c
        .follow(FollowRequest { run_id: "ghost".into(), ..Default::default() })
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(st.code(), Code::NotFound);
    // Well under the 10 s first-byte bound: it did not wait for anything.
    assert!(t.elapsed() < Duration::from_secs(5));
    let st = c
        .read_journal(ReadJournalRequest { run_id: "ghost".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::NotFound);
    assert_eq!(probe(&mut c, "ghost", KEY).await, (RunState::Unknown, None));
    assert_eq!(files_in(&agent.journal_dir), Vec::<String>::new());
    agent.stop().await;
}

#[tokio::test]
async fn the_first_byte_bound_fails_stalled_reads_only() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let flag = agent.root.join("go");
    c.start_run(start_req(
        "quiet",
        &format!(
            "n=0; while [ ! -e {} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done; echo late",
            flag.display()
        ),
    ))
    .await
    .unwrap();
    let req = FollowRequest {
        run_id: "quiet".into(),
        sentinel_key: KEY.to_vec(),
        first_byte_timeout_ms: Some(300),
        ..Default::default()
    };
    let mut stream = c.follow(req).await.unwrap().into_inner();
    let st = tokio::time::timeout(LONG, stream.next()).await.unwrap().unwrap().unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition);
    assert_eq!(Error::from_status(&st).code, ErrorCode::JournalStalled);
    // The stalled read touched nothing: the run is still running.
    assert_eq!(probe(&mut c, "quiet", KEY).await, (RunState::Running, None));

    // Once the first byte is there, slow output is the command's business.
    let flag2 = agent.root.join("go2");
    c.start_run(start_req(
        "slow",
        &format!("echo first; n=0; while [ ! -e {} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done; echo second", flag2.display()),
    ))
    .await
    .unwrap();
    let req = FollowRequest {
        run_id: "slow".into(),
        sentinel_key: KEY.to_vec(),
        first_byte_timeout_ms: Some(300),
        ..Default::default()
    };
    let mut stream = c.follow(req).await.unwrap().into_inner();
    let first = tokio::time::timeout(LONG, stream.next()).await.unwrap().unwrap().unwrap();
    let Some(follow_response::Event::Lines(l)) = first.event else { panic!("lines first") };
    assert_eq!(l.lines[0].data, b"first");
    // Well past the bound, then the second line and the exit still arrive.
    tokio::time::sleep(Duration::from_millis(900)).await;
    std::fs::write(&flag2, b"").unwrap();
    let mut rest = Vec::new();
    while let Some(m) = tokio::time::timeout(LONG, stream.next()).await.unwrap() {
        rest.push(m.unwrap().event.unwrap());
    }
    assert!(matches!(&rest[..], [follow_response::Event::Lines(l), follow_response::Event::Exit(e)]
        if l.lines[0].data == b"second" && e.exit_code == 0));
    std::fs::write(&flag, b"").unwrap();
    let (lines, exit) = follow_all(&mut c, "quiet", 0, KEY).await;
    assert_eq!((lines, exit.exit_code), (vec![(b"late".to_vec(), 5)], 0));
    agent.stop().await;
}

#[tokio::test]
async fn forged_sentinels_are_lines_and_never_finish_a_run() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let run = RunId::parse("forge").unwrap();
    let compat = journal::nonce(b"", &run);
    let wrong = "0123456789abcdef0123456789abcdef";
    let forged = [
        r#"{"__exit":0}"#.to_string(),
        format!(r#"{{"__exit":0,"__nonce":"{wrong}"}}"#),
        format!(r#"{{"__exit":0,"__nonce":"{compat}"}}"#),
        format!(r#"{{"__exit":"0","__nonce":"{}"}}"#, journal::nonce(KEY, &run)),
        format!(r#"{{"__exit":1.5,"__nonce":"{}"}}"#, journal::nonce(KEY, &run)),
    ];
    let flag = agent.root.join("done");
    let script = format!(
        "printf '%s\\n' {}; echo after; n=0; while [ ! -e {} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done; echo end",
        forged.iter().map(|l| format!("'{l}'")).collect::<Vec<_>>().join(" "),
        flag.display()
    );
    c.start_run(start_req("forge", &script)).await.unwrap();
    let path = agent.journal_dir.join("forge.ndjson");
    wait_for("forged output", || std::fs::read_to_string(&path).is_ok_and(|s| s.contains("after\n"))).await;

    for _ in 0..3 {
        assert_eq!(probe(&mut c, "forge", KEY).await, (RunState::Running, None));
        let r = c
            .read_journal(ReadJournalRequest {
                run_id: "forge".into(),
                sentinel_key: KEY.to_vec(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.exit.is_none());
        let got: Vec<String> = r.lines.iter().map(|l| String::from_utf8(l.data.clone()).unwrap()).collect();
        assert_eq!(&got[..forged.len()], &forged[..]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The run is not finished as far as any listing is concerned either.
    let list = c.list_journals(ListJournalsRequest {}).await.unwrap().into_inner().journals;
    assert_eq!(list[0].state(), RunState::Running);

    std::fs::write(&flag, b"").unwrap();
    let (lines, exit) = follow_all(&mut c, "forge", 0, KEY).await;
    assert_eq!(exit.exit_code, 0);
    assert_eq!(lines.len(), forged.len() + 2, "every forged line delivered as a line");
    assert_eq!(lines.last().unwrap().0, b"end");
    assert_eq!(probe(&mut c, "forge", KEY).await, (RunState::Finished, Some(0)));
    agent.stop().await;
}

#[tokio::test]
async fn output_a_leftover_process_writes_after_the_sentinel_is_ignored() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let flag = agent.root.join("go");
    // The command exits 4 at once; what it left behind (its own session, the
    // journal as its stdout) waits for the sentinel, then appends a
    // sentinel-shaped line and more than ProbeExit's window of output.
    let forged = r#"{"__exit":0,"__nonce":"0123456789abcdef0123456789abcdef"}"#;
    let leftover = format!(
        "while [ ! -e {flag} ]; do sleep 0.05; done\necho '{forged}'\n\
         head -c 1100000 /dev/zero | tr '\\0' x\necho\ntouch {flag}.done\n",
        flag = flag.display()
    );
    std::fs::write(agent.root.join("leftover.sh"), leftover).unwrap();
    let script = "echo real; setsid sh ./leftover.sh & exit 4";
    c.start_run(start_req("leftover", script)).await.unwrap();
    let (lines, exit) = follow_all(&mut c, "leftover", 0, KEY).await;
    assert_eq!((lines.len(), exit.exit_code), (1, 4));
    wait_for("supervisor exit", || agent.journal_dir.join("leftover.exit").exists()).await;
    std::fs::write(&flag, b"").unwrap();
    wait_for("the leftover's writes", || flag.with_extension("done").exists()).await;
    let path = agent.journal_dir.join("leftover.ndjson");
    let data = std::fs::read_to_string(&path).unwrap();
    assert!(data.len() > 1_100_000 && data.contains(forged), "it did append");

    // Every reader stops at the first valid sentinel.
    let (lines, exit) = follow_all(&mut c, "leftover", 0, KEY).await;
    assert_eq!(lines, vec![(b"real".to_vec(), 5)]);
    assert_eq!(exit.exit_code, 4);
    let r = c
        .read_journal(ReadJournalRequest {
            run_id: "leftover".into(),
            sentinel_key: KEY.to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.lines.len(), r.exit.map(|e| e.exit_code)), (1, Some(4)));
    assert_eq!(probe(&mut c, "leftover", KEY).await, (RunState::Finished, Some(4)), "past the tail window");
    agent.stop().await;
}

#[tokio::test]
async fn the_key_never_reaches_the_command() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let key = format!("k{}", uuid::Uuid::new_v4().simple());
    // Everything the command can look at about itself and its supervisor.
    let script = "env; cat /proc/self/cmdline /proc/$PPID/cmdline; echo; \
                  cat /proc/$PPID/environ 2>&1; echo; ls -l /proc/self/fd /proc/$PPID/fd 2>&1; \
                  timeout 2 cat /proc/$PPID/fd/0 2>&1; timeout 2 cat /proc/self/fd/0 2>&1; true";
    let mut req = start_req("secret", script);
    req.sentinel_key = key.clone().into_bytes();
    req.env.insert("VISIBLE".into(), "yes".into());
    c.start_run(req).await.unwrap();
    let (lines, exit) = follow_all(&mut c, "secret", 0, key.as_bytes()).await;
    assert_eq!(exit.exit_code, 0);
    let text: String = lines.iter().map(|(l, _)| String::from_utf8_lossy(l).into_owned() + "\n").collect();
    assert!(text.contains("VISIBLE=yes"), "{text}");
    assert!(!text.contains(&key), "the key leaked: {text}");
    assert!(!String::from_utf8_lossy(&exit.stderr_tail).contains(&key));
    assert!(!text.contains("SANDHOLD_AGENT_"), "{text}");
    agent.stop().await;
}

#[tokio::test]
async fn stdin_bytes_and_confined_stdin_files() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let mut req = start_req("in-bytes", "cat; echo done");
    req.stdin = Some(start_run_request::Stdin::StdinBytes(b"hello\nworld\n".to_vec()));
    c.start_run(req).await.unwrap();
    let (lines, _) = follow_all(&mut c, "in-bytes", 0, KEY).await;
    let texts: Vec<&[u8]> = lines.iter().map(|(l, _)| l.as_slice()).collect();
    assert_eq!(texts, vec![&b"hello"[..], b"world", b"done"]);
    assert!(!agent.journal_dir.join("in-bytes.in").exists(), "stdin file removed once opened");

    std::fs::write(agent.root.join("prompt.txt"), b"the prompt\n").unwrap();
    let mut req = start_req("in-file", "cat");
    req.stdin = Some(start_run_request::Stdin::StdinFile("prompt.txt".into()));
    c.start_run(req).await.unwrap();
    let (lines, _) = follow_all(&mut c, "in-file", 0, KEY).await;
    assert_eq!(lines, vec![(b"the prompt".to_vec(), 11)]);
    assert!(agent.root.join("prompt.txt").exists(), "a prompt file is the caller's");

    let mut req = start_req("in-escape", "cat");
    req.stdin = Some(start_run_request::Stdin::StdinFile("../journal/in-file.ndjson".into()));
    assert_eq!(c.start_run(req).await.unwrap_err().code(), Code::PermissionDenied);
    assert!(!agent.journal_dir.join("in-escape.ndjson").exists());
    agent.stop().await;
}

#[tokio::test]
async fn offsets_are_bytes_and_every_offset_resumes_the_exact_suffix() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    // Multi-byte UTF-8: offsets count bytes, not characters.
    c.start_run(start_req("utf8", "printf 'é\\n🎉x\\n日本語\\n'")).await.unwrap();
    let (lines, _) = follow_all(&mut c, "utf8", 0, KEY).await;
    assert_eq!(
        lines,
        vec![
            ("é".as_bytes().to_vec(), 3),
            ("🎉x".as_bytes().to_vec(), 9),
            ("日本語".as_bytes().to_vec(), 19)
        ]
    );

    c.start_run(start_req(
        "resume",
        "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); echo \"{\\\"n\\\":$i,\\\"t\\\":\\\"ü€\\\"}\"; done",
    ))
    .await
    .unwrap();
    let (all, exit) = follow_all(&mut c, "resume", 0, KEY).await;
    assert_eq!(all.len(), 3000);
    let data = std::fs::read(agent.journal_dir.join("resume.ndjson")).unwrap();
    let body = &data[..exit.sentinel_offset as usize];
    let mut offset = 0u64;
    for (i, (line, end)) in all.iter().enumerate() {
        assert_eq!(line, format!("{{\"n\":{},\"t\":\"ü€\"}}", i + 1).as_bytes());
        offset += line.len() as u64 + 1;
        assert_eq!(*end, offset);
    }
    assert_eq!(offset, body.len() as u64);

    for from in (0..=body.len()).step_by(997) {
        let (lines, e) = follow_all(&mut c, "resume", from as u64, KEY).await;
        assert_eq!(e.exit_code, 0);
        let mut got = Vec::new();
        for (line, end) in &lines {
            got.extend_from_slice(line);
            got.push(b'\n');
            assert_eq!(*end, from as u64 + got.len() as u64);
        }
        assert_eq!(got, &body[from..], "suffix from {from}");
    }

    // Bounded reads page through the same bytes and stop at the sentinel.
    let mut from = 0;
    let mut got = Vec::new();
    loop {
        let r = c
            .read_journal(ReadJournalRequest {
                run_id: "resume".into(),
                from_byte: from,
                max_bytes: 997,
                sentinel_key: KEY.to_vec(),
            })
            .await
            .unwrap()
            .into_inner();
        for l in &r.lines {
            got.extend_from_slice(&l.data);
            got.push(b'\n');
        }
        assert!(r.next_offset > from, "progress from {from}");
        from = r.next_offset;
        if let Some(e) = r.exit {
            assert_eq!(e.exit_code, 0);
            assert_eq!(e.sentinel_offset, body.len() as u64);
            break;
        }
    }
    assert_eq!(got, body);
    agent.stop().await;
}

#[tokio::test]
async fn partial_lines_wait_for_their_newline_and_a_dropped_follow_stops_nothing() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let flag = agent.root.join("go");
    c.start_run(start_req(
        "partial",
        &format!("printf 'abc'; n=0; while [ ! -e {} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done; printf 'def\\n'", flag.display()),
    ))
    .await
    .unwrap();
    let path = agent.journal_dir.join("partial.ndjson");
    wait_for("partial line", || std::fs::metadata(&path).is_ok_and(|m| m.len() == 3)).await;

    // A follower that goes away: the run goes on.
    let mut dropped = c
        .follow(FollowRequest { run_id: "partial".into(), sentinel_key: KEY.to_vec(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), dropped.next()).await.is_err(),
        "no partial line"
    );
    drop(dropped);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(probe(&mut c, "partial", KEY).await, (RunState::Running, None));

    let mut stream = c
        .follow(FollowRequest { run_id: "partial".into(), sentinel_key: KEY.to_vec(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.next()).await.is_err(),
        "no partial line"
    );
    std::fs::write(&flag, b"").unwrap();
    let m = tokio::time::timeout(LONG, stream.next()).await.unwrap().unwrap().unwrap();
    let Some(follow_response::Event::Lines(l)) = m.event else { panic!("lines") };
    assert_eq!((l.lines[0].data.as_slice(), l.lines[0].end_offset), (&b"abcdef"[..], 7));
    agent.stop().await;
}

#[tokio::test]
async fn a_partial_last_line_is_closed_before_the_sentinel() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    c.start_run(start_req("no-newline", "printf 'tail without newline'; exit 7")).await.unwrap();
    let (lines, exit) = follow_all(&mut c, "no-newline", 0, KEY).await;
    assert_eq!(lines, vec![(b"tail without newline".to_vec(), 21)]);
    assert_eq!((exit.exit_code, exit.sentinel_offset), (7, 21));
    // Killed by a signal: 128 + signal, as a shell reports it.
    c.start_run(start_req("killed", "kill -9 $$")).await.unwrap();
    let (_, exit) = follow_all(&mut c, "killed", 0, KEY).await;
    assert_eq!(exit.exit_code, 137);
    agent.stop().await;
}

/// An agent served in-process on a given journal dir (to restart "the same"
/// agent).
struct Served {
    socket: PathBuf,
    token: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn serve_on(dir: &Path, name: &str) -> Served {
    let socket = dir.join(format!("{name}.sock"));
    let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
    let options = AgentOptions {
        listen: Address::Unix(socket.clone()),
        root: dir.join("root"),
        token: Secret::new(token.clone()),
        journal_dir: dir.join("journal"),
        run_user: None,
        unconfined: false,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(sandbox_agent::serve(options, async move {
        let _ = stopped.await;
    }));
    // Listening, not only bound: the file exists a moment before connects
    // are accepted.
    wait_for("socket", || std::os::unix::net::UnixStream::connect(&socket).is_ok()).await;
    Served { socket, token, stop, task }
}

async fn client_for(socket: &Path, token: &str) -> Client {
    let ch = connect(&Address::Unix(socket.to_path_buf())).await.unwrap();
    JournalServiceClient::new(authed(ch, BearerToken::new(token).unwrap()))
}

#[tokio::test]
async fn a_restarted_agent_serves_runs_of_its_predecessor() {
    use_real_shim();
    let dir = sandhold_tests::local::TestDir::new("journal");
    let first = serve_on(dir.path(), "a").await;
    let mut c = client_for(&first.socket, &first.token).await;
    let flag = dir.path().join("root/go");
    c.start_run(start_req("before", "echo done-before")).await.unwrap();
    follow_all(&mut c, "before", 0, KEY).await;
    // The supervisor records the exit hint just after the sentinel.
    let hint = dir.path().join("journal/before.exit");
    wait_for("exit hint", || hint.exists()).await;
    c.start_run(start_req(
        "across",
        &format!("echo one; n=0; while [ ! -e {} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done; echo two; exit 4", flag.display()),
    ))
    .await
    .unwrap();
    let path = dir.path().join("journal/across.ndjson");
    wait_for("first line", || std::fs::metadata(&path).is_ok_and(|m| m.len() == 4)).await;
    let _ = first.stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), first.task).await;

    let second = serve_on(dir.path(), "b").await;
    let mut c = client_for(&second.socket, &second.token).await;
    let list = c.list_journals(ListJournalsRequest {}).await.unwrap().into_inner().journals;
    let states: Vec<(String, RunState)> = list.iter().map(|j| (j.run_id.clone(), j.state())).collect();
    assert_eq!(states, vec![("across".into(), RunState::Running), ("before".into(), RunState::Finished)]);
    assert_eq!(probe(&mut c, "across", KEY).await, (RunState::Running, None));
    assert_eq!(probe(&mut c, "before", KEY).await, (RunState::Finished, Some(0)));

    std::fs::write(&flag, b"").unwrap();
    let (lines, exit) = follow_all(&mut c, "across", 0, KEY).await;
    assert_eq!(lines, vec![(b"one".to_vec(), 4), (b"two".to_vec(), 8)]);
    assert_eq!(exit.exit_code, 4);
    assert_eq!(probe(&mut c, "across", KEY).await, (RunState::Finished, Some(4)));
    let _ = second.stop.send(());
    let _ = second.task.await;
}

/// The real binary as its own process (killed when dropped, so a failing
/// test leaves no daemon behind).
struct AgentProcess {
    child: std::process::Child,
    socket: PathBuf,
    token: String,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn spawn_agent(dir: &Path, name: &str) -> AgentProcess {
    let socket = dir.join(format!("{name}.sock"));
    let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
    let token_file = dir.join(format!("{name}.token"));
    std::fs::write(&token_file, &token).unwrap();
    std::fs::create_dir_all(dir.join("root")).unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_sandhold-agent"))
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--token-file")
        .arg(&token_file)
        .arg("--journal-dir")
        .arg(dir.join("journal"))
        .stderr(log)
        .spawn()
        .unwrap();
    wait_for("agent socket", || std::os::unix::net::UnixStream::connect(&socket).is_ok()).await;
    AgentProcess { child, socket, token }
}

#[tokio::test]
async fn kill_9_of_the_agent_daemon_loses_no_byte() {
    let dir = sandhold_tests::local::TestDir::new("journal");
    let mut first = spawn_agent(dir.path(), "first").await;
    let mut c = client_for(&first.socket, &first.token).await;
    // 100,000 numbered lines, slowly enough that the kill lands mid-run.
    let script = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo \"line $i\"; \
                  if [ $((i % 2000)) -eq 0 ]; then sleep 0.05; fi; done";
    c.start_run(start_req("survive", script)).await.unwrap();
    let path = dir.path().join("journal/survive.ndjson");
    wait_for("some output", || std::fs::metadata(&path).is_ok_and(|m| m.len() > 10_000)).await;
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();
    drop(first);
    let size_at_kill = std::fs::metadata(&path).unwrap().len();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("__exit"), "the kill must land while the command runs (size {size_at_kill})");
    drop(c);

    let second = spawn_agent(dir.path(), "second").await;
    let mut c = client_for(&second.socket, &second.token).await;
    let (lines, exit) = follow_all(&mut c, "survive", 0, KEY).await;
    assert_eq!(exit.exit_code, 0, "the command was neither stopped nor SIGPIPEd");
    assert_eq!(lines.len(), 100_000);
    for (i, (line, _)) in lines.iter().enumerate() {
        assert_eq!(line, format!("line {}", i + 1).as_bytes());
    }
    assert_eq!(probe(&mut c, "survive", KEY).await, (RunState::Finished, Some(0)));
    drop(second);
}

#[tokio::test]
async fn a_line_over_the_maximum_is_never_served_and_names_its_offset() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let script = "echo before; head -c 5242880 /dev/zero | tr '\\0' x; echo; echo after";
    c.start_run(start_req("long", script)).await.unwrap();
    // Follow serves the lines before it, then fails at the line's start.
    let (lines, e) = follow_to_error(&mut c, "long").await;
    assert_eq!(lines, vec![(b"before".to_vec(), 7)]);
    assert_eq!(
        (e.code, e.metadata.get("offset").map(String::as_str)),
        (ErrorCode::LineTooLong, Some("7")),
        "{e:?}"
    );
    // ReadJournal, even with room for it, stops before it; a read from it fails.
    let read = |from_byte| ReadJournalRequest {
        run_id: "long".into(),
        sentinel_key: KEY.to_vec(),
        from_byte,
        max_bytes: journal::MAX_LINE as u64 * 8,
    };
    let r = c.read_journal(read(0)).await.unwrap().into_inner();
    assert_eq!((r.lines.len(), r.next_offset, r.exit), (1, 7, None));
    let e = Error::from_status(&c.read_journal(read(7)).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::LineTooLong);
    agent.stop().await;
}

/// A line past the maximum that is still being written (no newline yet)
/// fails a read from its start at once, even when one read takes in the
/// whole journal: it was answered with no lines (the CI run of stop 55
/// caught it, the writer paused 4 KiB past the maximum).
#[tokio::test]
async fn a_line_past_the_maximum_still_being_written_fails_a_read_at_once() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let over = journal::MAX_LINE + 4096;
    let script = format!("echo before; head -c {over} /dev/zero | tr '\\0' x; sleep 30");
    c.start_run(start_req("paused", &script)).await.unwrap();
    let read = ReadJournalRequest {
        run_id: "paused".into(),
        sentinel_key: KEY.to_vec(),
        from_byte: 7,
        max_bytes: journal::MAX_LINE as u64 * 8,
    };
    let size = 7 + over as u64;
    let mut grown = false;
    for _ in 0..200 {
        let r = c.read_journal(ReadJournalRequest { from_byte: 0, max_bytes: 8, ..read.clone() }).await;
        if r.is_ok_and(|r| r.into_inner().journal_size >= size) {
            grown = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(grown, "the command did not write its long line");
    let e = Error::from_status(&c.read_journal(read).await.unwrap_err());
    assert_eq!((e.code, e.metadata.get("offset").map(String::as_str)), (ErrorCode::LineTooLong, Some("7")));
    agent.stop().await;
}

/// The value no byte served may hold, and its marker.
const VALUE: &str = "supersecretvalue123";
const MARKER: &str = "[secret:TOK]";

async fn put_secret(socket: &Path, token: &str, name: &str, value: &str) {
    use shared::proto::agent::v1::secret_service_client::SecretServiceClient;
    use shared::proto::agent::v1::{NamedSecret, PutSecretsRequest};
    let ch = connect(&Address::Unix(socket.to_path_buf())).await.unwrap();
    let mut c = SecretServiceClient::new(authed(ch, BearerToken::new(token).unwrap()));
    let secrets = vec![NamedSecret { name: name.into(), value: value.into() }];
    c.put_secrets(PutSecretsRequest { secrets }).await.unwrap();
}

#[tokio::test]
async fn secrets_are_masked_at_the_source_and_a_restarted_agent_refuses_without_them() {
    use_real_shim();
    let dir = sandhold_tests::local::TestDir::new("journal");
    let first = serve_on(dir.path(), "a").await;
    put_secret(&first.socket, &first.token, "TOK", VALUE).await;
    let mut c = client_for(&first.socket, &first.token).await;
    // Whole, split across two lines, split across two writes, JSON-escaped
    // beside a quote, on stderr; then a failure.
    let script = format!(
        r#"echo "the token is {VALUE}"; echo "a supersec"; echo "retvalue123 b"; printf 'x supers'; sleep 0.3; printf 'ecretvalue123 y\n'; echo '{{"t":"{VALUE}"}}'; echo "err {VALUE}" >&2; exit 3"#
    );
    c.start_run(start_req("masked", &script)).await.unwrap();
    let (lines, exit) = follow_all(&mut c, "masked", 0, KEY).await;
    let text: Vec<String> = lines.iter().map(|(l, _)| String::from_utf8_lossy(l).into_owned()).collect();
    assert_eq!(
        text,
        vec![
            format!("the token is {MARKER}"),
            format!("a {MARKER} b"),
            format!("x {MARKER} y"),
            format!("{{\"t\":\"{MARKER}\"}}"),
        ]
    );
    assert_eq!(exit.exit_code, 3);
    assert_eq!(String::from_utf8_lossy(&exit.stderr_tail), format!("err {MARKER}\n"));
    // Offsets are the raw journal's: resuming at each gives the same suffix.
    for (i, (_, end)) in lines.iter().enumerate() {
        let (rest, _) = follow_all(&mut c, "masked", *end, KEY).await;
        assert_eq!(rest, lines[i + 1..].to_vec());
    }
    let read = |from: u64| ReadJournalRequest {
        run_id: "masked".into(),
        from_byte: from,
        max_bytes: 8,
        sentinel_key: KEY.to_vec(),
    };
    let mut from = 0;
    let mut bounded = Vec::new();
    loop {
        let r = c.read_journal(read(from)).await.unwrap().into_inner();
        bounded.extend(r.lines.into_iter().map(|l| (l.data, l.end_offset)));
        from = r.next_offset;
        if let Some(exit) = r.exit {
            assert!(!String::from_utf8_lossy(&exit.stderr_tail).contains(VALUE));
            break;
        }
    }
    assert_eq!(bounded, lines, "bounded reads mask like follow");
    // The journal itself holds the value (it is the sandbox's); its names
    // file holds only the name.
    let names = std::fs::read_to_string(dir.path().join("journal/masked.secrets")).unwrap();
    assert_eq!(names, "TOK\n");
    let _ = first.stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), first.task).await;

    // A restarted agent has the names, not the values: it refuses.
    let second = serve_on(dir.path(), "b").await;
    let mut c = client_for(&second.socket, &second.token).await;
    let req = FollowRequest { run_id: "masked".into(), sentinel_key: KEY.to_vec(), ..Default::default() };
    let status = c.follow(req).await.unwrap_err();
    let err = Error::from_status(&status);
    assert_eq!(err.code, ErrorCode::SecretsMissing, "{}", err.message);
    assert!(err.message.contains("TOK") && !err.message.contains(VALUE), "{}", err.message);
    let status = c.read_journal(read(0)).await.unwrap_err();
    assert_eq!(Error::from_status(&status).code, ErrorCode::SecretsMissing);
    // Handed back, it serves the same masked bytes.
    put_secret(&second.socket, &second.token, "TOK", VALUE).await;
    let (again, _) = follow_all(&mut c, "masked", 0, KEY).await;
    assert_eq!(again, lines);
    let _ = second.stop.send(());
    let _ = second.task.await;
}

/// Follow until the stream fails: the lines served, then the error.
async fn follow_to_error(c: &mut Client, run_id: &str) -> (Vec<(Vec<u8>, u64)>, Error) {
    let req = FollowRequest {
        run_id: run_id.into(),
        sentinel_key: KEY.to_vec(),
        first_byte_timeout_ms: Some(0),
        ..Default::default()
    };
    let mut stream = c.follow(req).await.unwrap().into_inner();
    let mut lines = Vec::new();
    let status = tokio::time::timeout(LONG, async {
        loop {
            match stream.next().await.expect("follow ends with the error") {
                Ok(m) => match m.event.unwrap() {
                    follow_response::Event::Lines(l) => {
                        lines.extend(l.lines.into_iter().map(|l| (l.data, l.end_offset)))
                    }
                    follow_response::Event::Exit(e) => panic!("served the exit instead of failing: {e:?}"),
                },
                Err(status) => return status,
            }
        }
    })
    .await
    .unwrap();
    (lines, Error::from_status(&status))
}

#[tokio::test]
async fn a_journal_at_its_cap_stops_the_command_group_and_reads_end_with_journal_full() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    const CAP: u64 = 64 << 10;
    // `yes` meets the cap; the sleep beside it in its group would outlive
    // it by minutes if the shim did not stop the group.
    let req =
        StartRunRequest { max_journal_bytes: CAP, ..start_req("capped", "yes & sleep 600; echo never") };
    let started = c.start_run(req).await.unwrap().into_inner();
    let (lines, e) = follow_to_error(&mut c, "capped").await;
    assert_eq!(e.code, ErrorCode::JournalFull, "{e:?}");
    assert_eq!(e.metadata.get("max").map(String::as_str), Some("65536"));
    assert_eq!(e.metadata.get("stream").map(String::as_str), Some("stdout"));
    // Everything up to the cap, nothing past it: `y` lines fill it exactly.
    assert_eq!(lines.len() as u64, CAP / 2);
    assert!(lines.iter().all(|(l, _)| l == b"y"));
    assert_eq!(lines.last().map(|l| l.1), Some(CAP));
    // On disk: the cap's worth, then the sentinel (one short line).
    let on_disk = std::fs::metadata(agent.journal_dir.join("capped.ndjson")).unwrap().len();
    assert!(on_disk > CAP && on_disk <= CAP + 128, "{on_disk} bytes on disk");
    assert!(agent.journal_dir.join("capped.full").exists());
    // The group (yes, sh and the sleep) is gone.
    wait_for("the command's group to be gone", || {
        sandbox_agent::child::group_members(started.pid, 0).is_empty()
    })
    .await;
    // A bounded read ends there too, and the probe calls it finished.
    let read = ReadJournalRequest {
        run_id: "capped".into(),
        sentinel_key: KEY.to_vec(),
        from_byte: CAP,
        max_bytes: 0,
    };
    let e = Error::from_status(&c.read_journal(read).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::JournalFull);
    assert_eq!(probe(&mut c, "capped", KEY).await.0, RunState::Finished);
    agent.stop().await;
}

#[tokio::test]
async fn the_line_the_cap_cuts_is_never_served() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    const CAP: u64 = 64 << 10;
    // Lines of 1000 bytes: 65 fit, the 66th is cut 536 bytes in.
    let script = "yes $(head -c 999 /dev/zero | tr '\\0' y)";
    let req = StartRunRequest { max_journal_bytes: CAP, ..start_req("cut", script) };
    c.start_run(req).await.unwrap();
    let (lines, e) = follow_to_error(&mut c, "cut").await;
    assert_eq!(e.code, ErrorCode::JournalFull, "{e:?}");
    assert_eq!(lines.len(), 65);
    assert!(lines.iter().all(|(l, _)| l.len() == 999));
    assert_eq!(lines.last().map(|l| l.1), Some(65_000));
    // On disk the cut line is there (closed by the supervisor's newline)
    // and the sentinel after it; a bounded read skips it to the error.
    let on_disk = std::fs::metadata(agent.journal_dir.join("cut.ndjson")).unwrap().len();
    assert!(on_disk > CAP + 1 && on_disk <= CAP + 128, "{on_disk} bytes on disk");
    let read = |from_byte| ReadJournalRequest {
        run_id: "cut".into(),
        sentinel_key: KEY.to_vec(),
        from_byte,
        max_bytes: 1 << 20,
    };
    let r = c.read_journal(read(0)).await.unwrap().into_inner();
    assert_eq!((r.lines.len(), r.lines.last().map(|l| l.end_offset), r.exit), (65, Some(65_000), None));
    let e = Error::from_status(&c.read_journal(read(65_000)).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::JournalFull);
    agent.stop().await;
}

#[tokio::test]
async fn stderr_has_the_cap_too_and_a_run_under_it_ends_as_usual() {
    use_real_shim();
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    const CAP: u64 = 32 << 10;
    let req = StartRunRequest { max_journal_bytes: CAP, ..start_req("err-capped", "echo out; yes >&2") };
    c.start_run(req).await.unwrap();
    let (lines, e) = follow_to_error(&mut c, "err-capped").await;
    assert_eq!(
        (e.code, e.metadata.get("stream").map(String::as_str)),
        (ErrorCode::JournalFull, Some("stderr"))
    );
    assert_eq!(lines, vec![(b"out".to_vec(), 4)]);
    assert!(std::fs::metadata(agent.journal_dir.join("err-capped.err")).unwrap().len() <= CAP);

    // Under the cap: the exit, no marker, and files the command writes
    // under the cap are whole.
    let script = "head -c 1000 /dev/zero > small.bin; wc -c < small.bin";
    let req = StartRunRequest { max_journal_bytes: CAP, ..start_req("under", script) };
    c.start_run(req).await.unwrap();
    let (lines, exit) = follow_all(&mut c, "under", 0, KEY).await;
    assert_eq!((lines.len(), exit.exit_code), (1, 0));
    assert_eq!(String::from_utf8_lossy(&lines[0].0).trim(), "1000");
    assert!(!agent.journal_dir.join("under.full").exists());
    agent.stop().await;
}

/// Follow with the stderr sidecar from the given offsets: every line as
/// (stderr?, text, end offset), then the exit.
async fn follow_both(
    c: &mut Client,
    run_id: &str,
    from: u64,
    stderr_from: u64,
) -> (Vec<(bool, String, u64)>, RunExit) {
    let req = FollowRequest {
        run_id: run_id.into(),
        from_byte: from,
        sentinel_key: KEY.to_vec(),
        first_byte_timeout_ms: Some(0),
        include_stderr: true,
        stderr_from_byte: stderr_from,
    };
    let mut stream = c.follow(req).await.expect("follow").into_inner();
    let mut lines = Vec::new();
    tokio::time::timeout(LONG, async {
        while let Some(msg) = stream.next().await {
            match msg.expect("follow message").event.expect("event") {
                follow_response::Event::Lines(l) => lines.extend(
                    l.lines
                        .into_iter()
                        .map(|l| (l.stderr, String::from_utf8_lossy(&l.data).into_owned(), l.end_offset)),
                ),
                follow_response::Event::Exit(e) => return (lines, e),
            }
        }
        panic!("follow ended without an exit")
    })
    .await
    .expect("follow finished in time")
}

#[tokio::test]
async fn follow_serves_the_stderr_sidecar_tagged_masked_and_resumable_from_both_offsets() {
    use_real_shim();
    let dir = sandhold_tests::local::TestDir::new("journal");
    let agent = serve_on(dir.path(), "a").await;
    put_secret(&agent.socket, &agent.token, "TOK", VALUE).await;
    let mut c = client_for(&agent.socket, &agent.token).await;
    let script =
        format!("echo out1; echo warn1 >&2; sleep 0.4; echo 'key {VALUE}' >&2; echo out2; printf tail >&2");
    c.start_run(start_req("both", &script)).await.unwrap();

    // While it runs, the first stderr line arrives before the exit.
    let req = FollowRequest {
        run_id: "both".into(),
        sentinel_key: KEY.to_vec(),
        first_byte_timeout_ms: Some(0),
        include_stderr: true,
        ..Default::default()
    };
    let mut live = c.follow(req).await.unwrap().into_inner();
    let first_stderr = tokio::time::timeout(LONG, async {
        loop {
            match live.next().await.unwrap().unwrap().event.unwrap() {
                follow_response::Event::Lines(l) => {
                    if let Some(line) = l.lines.into_iter().find(|l| l.stderr) {
                        return line;
                    }
                }
                follow_response::Event::Exit(_) => panic!("the exit came before any stderr line"),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!((first_stderr.data.as_slice(), first_stderr.end_offset), (&b"warn1"[..], 6));
    drop(live);

    let (lines, exit) = follow_both(&mut c, "both", 0, 0).await;
    let stdout: Vec<_> = lines.iter().filter(|l| !l.0).map(|l| (l.1.as_str(), l.2)).collect();
    let stderr: Vec<_> = lines.iter().filter(|l| l.0).map(|l| (l.1.as_str(), l.2)).collect();
    assert_eq!(stdout, [("out1", 5), ("out2", 10)]);
    let masked = format!("key {MARKER}");
    let key_end = 6 + "key ".len() as u64 + VALUE.len() as u64 + 1;
    assert_eq!(stderr, [("warn1", 6), (masked.as_str(), key_end), ("tail", key_end + 4)]);
    assert_eq!(exit.exit_code, 0);
    assert!(lines.iter().all(|l| !l.1.contains(VALUE)), "{lines:?}");

    // Resuming at any pair of offsets serves each line once more, never twice.
    for (out_from, err_from) in [(5, 6), (10, 6), (5, key_end), (10, key_end + 4)] {
        let (rest, _) = follow_both(&mut c, "both", out_from, err_from).await;
        let want: Vec<_> =
            lines.iter().filter(|l| if l.0 { l.2 > err_from } else { l.2 > out_from }).cloned().collect();
        let mut got = rest.clone();
        got.sort_by_key(|l| (l.0, l.2));
        let mut want_sorted = want.clone();
        want_sorted.sort_by_key(|l| (l.0, l.2));
        assert_eq!(got, want_sorted, "from {out_from}/{err_from}");
    }
    // Without include_stderr nothing of the sidecar is served (older drivers).
    let (plain, _) = follow_all(&mut c, "both", 0, KEY).await;
    assert_eq!(plain.len(), 2);
    // A stderr offset past the sidecar's end is refused.
    let req = FollowRequest {
        run_id: "both".into(),
        sentinel_key: KEY.to_vec(),
        include_stderr: true,
        stderr_from_byte: 10_000,
        ..Default::default()
    };
    let status = c.follow(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let _ = agent.stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), agent.task).await;
}
