//! ProcessService over a real Unix socket: Exec, Spawn, ListProcesses and
//! SignalProcess, and the token kept out of children and logs (real binary).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sandhold_tests::agent::TestAgent;
use sandhold_tests::wait::eventually;
use shared::proto::agent::v1::exit_status::Status as Exit;
use shared::proto::agent::v1::process_service_client::ProcessServiceClient;
use shared::proto::agent::v1::{
    Argv, CloseStdin, Command, ExecRequest, ExecResponse, ListProcessesRequest, OutputStream,
    SignalProcessRequest, SpawnRequest, SpawnResponse, SpawnStart, command, spawn_request, spawn_response,
};
use shared::transport::AuthedChannel;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

type Client = ProcessServiceClient<AuthedChannel>;

fn argv(args: &[&str]) -> Option<Command> {
    Some(Command {
        kind: Some(command::Kind::Argv(Argv { args: args.iter().map(|a| a.to_string()).collect() })),
    })
}

fn shell(script: &str) -> Option<Command> {
    Some(Command { kind: Some(command::Kind::Shell(script.into())) })
}

fn exec_req(command: Option<Command>) -> ExecRequest {
    ExecRequest { command, ..Default::default() }
}

async fn exec(c: &mut Client, req: ExecRequest) -> ExecResponse {
    c.exec(req).await.unwrap().into_inner()
}

fn code(r: &ExecResponse) -> Option<Exit> {
    r.status.and_then(|s| s.status)
}

/// Whether `pid` is a live process (a zombie counts as gone: it has exited
/// and waits only to be reaped).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().next().unwrap();
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Poll `cond` until it holds, with a deadline generous enough for a
/// loaded machine.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let held = eventually(Duration::from_secs(30), || std::future::ready(cond())).await;
    assert!(held, "timed out waiting for: {what}");
}

#[tokio::test]
async fn exec_captures_stdout_stderr_exit_code_env_and_cwd() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);

    let r = exec(&mut c, exec_req(argv(&["sh", "-c", "echo out; echo err >&2; exit 7"]))).await;
    assert_eq!((r.stdout.as_slice(), r.stderr.as_slice()), (&b"out\n"[..], &b"err\n"[..]));
    assert_eq!(code(&r), Some(Exit::Code(7)));
    assert!(!r.timed_out && !r.stdout_truncated && !r.stderr_truncated);

    std::fs::create_dir_all(agent.root.join("sub/dir")).unwrap();
    let mut req = exec_req(shell("printf '%s|' \"$GREETING\" \"$(pwd)\""));
    req.env = HashMap::from([("GREETING".to_string(), "hello world".to_string())]);
    req.cwd = "sub/dir".into();
    let r = exec(&mut c, req).await;
    assert_eq!(
        String::from_utf8(r.stdout.clone()).unwrap(),
        format!("hello world|{}|", agent.root.join("sub/dir").display())
    );
    assert_eq!(code(&r), Some(Exit::Code(0)));

    // Default cwd is the root.
    let r = exec(&mut c, exec_req(argv(&["pwd"]))).await;
    assert_eq!(r.stdout, format!("{}\n", agent.root.display()).into_bytes());
    agent.stop().await;
}

#[tokio::test]
async fn exec_feeds_stdin_and_reports_signals() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 256) as u8).collect();
    let mut req = exec_req(argv(&["cat"]));
    req.stdin = data.clone();
    let r = exec(&mut c, req).await;
    assert_eq!(r.stdout, data, "stdin larger than a pipe buffer comes back intact");

    // Without stdin bytes, stdin is /dev/null (EOF at once).
    let r = exec(&mut c, exec_req(shell("cat; echo done"))).await;
    assert_eq!(r.stdout, b"done\n");

    let r = exec(&mut c, exec_req(shell("kill -USR1 $$"))).await;
    assert_eq!(code(&r), Some(Exit::Signal(10)));
    agent.stop().await;
}

#[tokio::test]
async fn exec_caps_output_and_flags_truncation() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let mut req = exec_req(shell("head -c 100000 /dev/zero; echo short >&2"));
    req.output_limit_bytes = Some(1000);
    let r = exec(&mut c, req).await;
    assert_eq!(r.stdout, vec![0u8; 1000]);
    assert!(r.stdout_truncated);
    assert_eq!(r.stderr, b"short\n");
    assert!(!r.stderr_truncated);
    assert_eq!(code(&r), Some(Exit::Code(0)), "the process ran to completion past the cap");
    agent.stop().await;
}

#[tokio::test]
async fn exec_timeout_kills_the_whole_process_group() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let mut req = exec_req(shell("sleep 1000 & echo $! > bg.pid; echo $$ > sh.pid; wait"));
    // Long enough for the pid files to be written on a loaded machine.
    req.timeout_ms = Some(2_000);
    let r = exec(&mut c, req).await;
    assert!(r.timed_out);
    assert_eq!(code(&r), Some(Exit::Signal(9)));
    let read_pid = |name: &str| -> u32 {
        std::fs::read_to_string(agent.root.join(name)).unwrap().trim().parse().unwrap()
    };
    let (bg, sh) = (read_pid("bg.pid"), read_pid("sh.pid"));
    wait_for("the shell is gone", || !alive(sh)).await;
    wait_for("its background child is gone", || !alive(bg)).await;
    agent.stop().await;
}

#[tokio::test]
async fn exec_failures() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);
    std::fs::write(agent.root.join("file"), b"").unwrap();
    let with_cwd =
        |cwd: &str| ExecRequest { command: argv(&["true"]), cwd: cwd.into(), ..Default::default() };
    let cases: Vec<(ExecRequest, Code)> = vec![
        (exec_req(None), Code::InvalidArgument),
        (exec_req(argv(&[])), Code::InvalidArgument),
        (exec_req(argv(&["a\0b"])), Code::InvalidArgument),
        (exec_req(argv(&["/nonexistent/program"])), Code::NotFound),
        (with_cwd("../"), Code::PermissionDenied),
        (with_cwd("/etc"), Code::PermissionDenied),
        (with_cwd("missing"), Code::NotFound),
        (with_cwd("file"), Code::FailedPrecondition),
        (
            ExecRequest {
                command: argv(&["true"]),
                env: HashMap::from([("A=B".to_string(), "x".to_string())]),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
    ];
    for (req, expected) in cases {
        let desc = format!("{req:?}");
        assert_eq!(c.exec(req).await.unwrap_err().code(), expected, "{desc}");
    }
    agent.stop().await;
}

/// Start a Spawn call; returns the request sender, the response stream and
/// the pid from `started`.
async fn spawn(
    c: &mut Client,
    start: SpawnStart,
) -> (mpsc::Sender<SpawnRequest>, Streaming<SpawnResponse>, u32) {
    let (tx, rx) = mpsc::channel(16);
    tx.send(SpawnRequest { request: Some(spawn_request::Request::Start(start)) }).await.unwrap();
    let mut stream = c.spawn(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let Some(spawn_response::Event::Started(started)) = first.event else { panic!("first event: {first:?}") };
    (tx, stream, started.pid)
}

/// Read events until stdout holds `needle`; returns stdout so far.
async fn read_until(stream: &mut Streaming<SpawnResponse>, needle: &str) -> String {
    let mut out = String::new();
    while !out.contains(needle) {
        let msg = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("output in time")
            .unwrap()
            .unwrap_or_else(|| panic!("stream ended before {needle:?}; got {out:?}"));
        match msg.event {
            Some(spawn_response::Event::Output(chunk)) if chunk.stream() == OutputStream::Stdout => {
                out.push_str(&String::from_utf8_lossy(&chunk.data))
            }
            Some(spawn_response::Event::Output(_)) => {}
            other => panic!("unexpected event before {needle:?}: {other:?}"),
        }
    }
    out
}

/// Read to the end; returns the exit.
async fn read_exit(stream: &mut Streaming<SpawnResponse>) -> Exit {
    let mut exit = None;
    while let Some(msg) =
        tokio::time::timeout(Duration::from_secs(30), stream.message()).await.unwrap().unwrap()
    {
        if let Some(spawn_response::Event::Exited(status)) = msg.event {
            assert!(exit.is_none(), "exactly one exited");
            exit = status.status;
        }
    }
    exit.expect("an exited event")
}

fn start(cmd: Option<Command>, detached: bool) -> SpawnStart {
    SpawnStart { command: cmd, cwd: String::new(), env: HashMap::new(), detached, pty: None }
}

#[tokio::test]
async fn spawn_round_trips_stdin_through_cat() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let (tx, mut stream, pid) = spawn(&mut c, start(argv(&["cat"]), false)).await;
    assert!(pid > 1);
    tx.send(SpawnRequest { request: Some(spawn_request::Request::Stdin(b"ping\n".to_vec())) }).await.unwrap();
    assert_eq!(read_until(&mut stream, "ping\n").await, "ping\n");
    tx.send(SpawnRequest { request: Some(spawn_request::Request::Stdin(b"pong\n".to_vec())) }).await.unwrap();
    assert_eq!(read_until(&mut stream, "pong\n").await, "pong\n");
    tx.send(SpawnRequest { request: Some(spawn_request::Request::CloseStdin(CloseStdin {})) }).await.unwrap();
    assert_eq!(read_exit(&mut stream).await, Exit::Code(0));

    let listed = c.list_processes(ListProcessesRequest {}).await.unwrap().into_inner().processes;
    let me = listed.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(me.command, "cat");
    assert!(!me.running);
    assert_eq!(me.status.and_then(|s| s.status), Some(Exit::Code(0)));
    drop(tx);
    agent.stop().await;
}

#[tokio::test]
async fn spawn_streams_stderr_tagged_and_delivers_any_signal() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let script = "trap 'echo got-usr1' USR1; trap 'echo got-rt >&2' 40; echo ready; \
                  while :; do sleep 0.05; done";
    let (tx, mut stream, pid) = spawn(&mut c, start(argv(&["bash", "-c", script]), false)).await;
    read_until(&mut stream, "ready").await;
    tx.send(SpawnRequest { request: Some(spawn_request::Request::Signal(10)) }).await.unwrap();
    read_until(&mut stream, "got-usr1").await;
    // A real-time signal, which the usual TERM/KILL-only APIs cannot send;
    // the trap writes to stderr, so the chunk must be tagged as such.
    tx.send(SpawnRequest { request: Some(spawn_request::Request::Signal(40)) }).await.unwrap();
    let mut err = String::new();
    while !err.contains("got-rt") {
        let msg =
            tokio::time::timeout(Duration::from_secs(30), stream.message()).await.unwrap().unwrap().unwrap();
        if let Some(spawn_response::Event::Output(chunk)) = msg.event
            && chunk.stream() == OutputStream::Stderr
        {
            err.push_str(&String::from_utf8_lossy(&chunk.data));
        }
    }
    // SignalProcess reaches it too.
    let listed = c.list_processes(ListProcessesRequest {}).await.unwrap().into_inner().processes;
    assert!(listed.iter().any(|p| p.pid == pid && p.running && !p.detached));
    c.signal_process(SignalProcessRequest { pid, signal: 15 }).await.unwrap();
    assert_eq!(read_exit(&mut stream).await, Exit::Signal(15));
    drop(tx);
    agent.stop().await;
}

#[tokio::test]
async fn dropping_the_stream_kills_the_group_unless_detached() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let script = "sleep 1000 & echo child=$!; wait";
    let (tx, mut stream, attached_pid) = spawn(&mut c, start(shell(script), false)).await;
    let out = read_until(&mut stream, "\n").await;
    let attached_child: u32 = out.trim().strip_prefix("child=").unwrap().parse().unwrap();
    let (dtx, mut dstream, detached_pid) = spawn(&mut c, start(shell(script), true)).await;
    let out = read_until(&mut dstream, "\n").await;
    let detached_child: u32 = out.trim().strip_prefix("child=").unwrap().parse().unwrap();
    assert!(alive(attached_pid) && alive(attached_child) && alive(detached_pid) && alive(detached_child));

    drop((tx, stream, dtx, dstream));
    wait_for("the attached process is killed", || !alive(attached_pid)).await;
    wait_for("its child is killed", || !alive(attached_child)).await;
    // Both drops were sent together and the attached one has been handled;
    // the detached process is still running, and listed as such.
    assert!(alive(detached_pid) && alive(detached_child));
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let listed = c.list_processes(ListProcessesRequest {}).await.unwrap().into_inner().processes;
    let d = listed.iter().find(|p| p.pid == detached_pid).expect("detached listed");
    assert!(d.detached && d.running);

    // It stays killable by pid.
    c.signal_process(SignalProcessRequest { pid: detached_pid, signal: 9 }).await.unwrap();
    wait_for("the detached process is killed", || !alive(detached_pid) && !alive(detached_child)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = c.list_processes(ListProcessesRequest {}).await.unwrap().into_inner().processes;
        let d = listed.iter().find(|p| p.pid == detached_pid).expect("still listed");
        if !d.running {
            assert_eq!(d.status.and_then(|s| s.status), Some(Exit::Signal(9)));
            break;
        }
        assert!(Instant::now() < deadline, "the table never recorded the exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.stop().await;
}

#[tokio::test]
async fn signal_process_and_spawn_failures() {
    let agent = TestAgent::start().await;
    let mut c = ProcessServiceClient::new(agent.channel().await);
    // A pid the agent did not start (our own test process) is unknown.
    let e = c.signal_process(SignalProcessRequest { pid: std::process::id(), signal: 15 }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c.signal_process(SignalProcessRequest { pid: 1, signal: 0 }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.signal_process(SignalProcessRequest { pid: 1, signal: 1000 }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // An exited process is not signalled (its pid may be someone else's now).
    let r = exec(&mut c, exec_req(shell("echo $$"))).await;
    let pid: u32 = String::from_utf8(r.stdout).unwrap().trim().parse().unwrap();
    let e = c.signal_process(SignalProcessRequest { pid, signal: 15 }).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);

    // The first Spawn message must be start.
    let msgs = vec![SpawnRequest { request: Some(spawn_request::Request::Stdin(b"x".to_vec())) }];
    assert_eq!(c.spawn(tokio_stream::iter(msgs)).await.unwrap_err().code(), Code::InvalidArgument);
    let msgs: Vec<SpawnRequest> = vec![];
    assert_eq!(c.spawn(tokio_stream::iter(msgs)).await.unwrap_err().code(), Code::InvalidArgument);
    for (cmd, cwd, expected) in [
        (argv(&["/nonexistent/program"]), "", Code::NotFound),
        (argv(&["true"]), "../outside", Code::PermissionDenied),
        (None, "", Code::InvalidArgument),
    ] {
        let st =
            SpawnStart { command: cmd, cwd: cwd.into(), env: HashMap::new(), detached: false, pty: None };
        let msgs = vec![SpawnRequest { request: Some(spawn_request::Request::Start(st)) }];
        assert_eq!(c.spawn(tokio_stream::iter(msgs)).await.unwrap_err().code(), expected);
    }
    agent.stop().await;
}

/// The real binary, started with its configuration in `SANDHOLD_AGENT_*`
/// variables and debug logging: no child sees those variables or the
/// token, and no log line carries the token.
#[tokio::test]
async fn token_never_reaches_children_or_logs() {
    use shared::transport::{Address, BearerToken, authed, connect};
    let dir = tempfile::tempdir().unwrap();
    let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let socket = dir.path().join("agent.sock");
    let log_path = dir.path().join("agent.log");
    // Killed when the test fails before it stops the agent itself.
    let agent = sandhold_tests::local::ChildGuard::new(
        std::process::Command::new(env!("CARGO_BIN_EXE_sandhold-agent"))
            .arg("serve")
            .env("SANDHOLD_AGENT_LISTEN", format!("unix:{}", socket.display()))
            .env("SANDHOLD_AGENT_ROOT", dir.path().join("root"))
            .env("SANDHOLD_AGENT_TOKEN_FILE", &token_file)
            .env("SANDHOLD_AGENT_LOG", "debug")
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for("the agent listens", || socket.exists()).await;
    let address = Address::Unix(socket.clone());

    let mut c = ProcessServiceClient::new(authed(
        connect(&address).await.unwrap(),
        BearerToken::new(&token).unwrap(),
    ));
    let r = exec(&mut c, exec_req(argv(&["env"]))).await;
    let env = String::from_utf8(r.stdout).unwrap();
    assert!(env.contains("PATH="), "env ran: {env}");
    assert!(!env.contains(&token), "token in a child's env: {env}");
    assert!(!env.contains("SANDHOLD_AGENT_"), "agent variables in a child's env: {env}");
    // Also through a shell string and a spawned process.
    let r = exec(&mut c, exec_req(shell("env; cat /proc/self/environ"))).await;
    let env = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(!env.contains(&token) && !env.contains("SANDHOLD_AGENT_"), "{env}");
    let (tx, mut stream, _) = spawn(&mut c, start(argv(&["env"]), false)).await;
    drop(tx);
    let mut out = String::new();
    while let Some(msg) = stream.message().await.unwrap() {
        if let Some(spawn_response::Event::Output(chunk)) = msg.event {
            out.push_str(&String::from_utf8_lossy(&chunk.data));
        }
    }
    assert!(out.contains("PATH=") && !out.contains(&token) && !out.contains("SANDHOLD_AGENT_"), "{out}");

    // A wrong token and no token are refused (and logged, if at all, without
    // the right one).
    let mut wrong = ProcessServiceClient::new(authed(
        connect(&address).await.unwrap(),
        BearerToken::new("nope").unwrap(),
    ));
    assert_eq!(wrong.exec(exec_req(argv(&["true"]))).await.unwrap_err().code(), Code::Unauthenticated);
    let mut none = ProcessServiceClient::new(connect(&address).await.unwrap());
    assert_eq!(none.exec(exec_req(argv(&["true"]))).await.unwrap_err().code(), Code::Unauthenticated);

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let mut agent = agent.take();
    let status = tokio::task::spawn_blocking(move || agent.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("agent listening"), "the log was captured: {log}");
    assert!(!log.contains(&token), "token in the agent's log:\n{log}");
}
