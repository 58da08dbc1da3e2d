//! The rest of the sandbox handle (issue #21) through a real server and
//! the real CLI: ports forwarded from a Docker sandbox without a network,
//! a terminal there (under runc and under gVisor), git on the workspace (status, diff, branch, commit, push), and an
//! interactive terminal driven through tmux. Each new call is also tried
//! by another tenant (NOT_FOUND) and on a provider without the capability
//! (UNIMPLEMENTED, reason UNSUPPORTED).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandhold_tests::docker::{DEBIAN_IMAGE, DockerCleanup, ensure_debian_image};
use sandhold_tests::fleet::{Place, Served, served};
use sandhold_tests::local::{TestDir, bare_origin as origin, git};
use sandhold_tests::provider::Kind;
use sandhold_tests::run::{definition, put_definition};
use sandhold_tests::sandbox::{ensure, sh};
use sandhold_tests::server::{Sandboxes, TenantServer};
use sandhold_tests::tmux::{Tmux, has_line};
use sandhold_tests::under_each_runtime;
use sandhold_tests::wait::{PATIENCE, eventually};
use shared::proto::v1 as api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::ReceiverStream;

/// One MiB the sandbox serves and the test expects, byte for byte.
fn big_file() -> Vec<u8> {
    (0..1usize << 20).map(|i| (i % 251) as u8).collect()
}

async fn sandbox_of(s: &dyn Served, def: api::SandboxDefinition, thread: &str) -> String {
    let mut sandboxes = s.server().sandboxes(s.token()).await;
    let definition_id = def.id.clone();
    put_definition(&mut sandboxes, def).await;
    let req = api::EnsureSandboxRequest { definition_id, thread_id: thread.into(), ..Default::default() };
    let (_, ready) = ensure(&mut sandboxes, req).await;
    ready.unwrap_or_else(|e| panic!("ensure: {e:?}\n{}", s.logs())).sandbox_id
}

fn debian(id: &str) -> api::SandboxDefinition {
    let docker = api::DockerProvider { image: DEBIAN_IMAGE.into(), ..Default::default() };
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
        ..Default::default()
    }
}

/// The CLI pointed at the test's server, as its tenant.
fn cli(s: &dyn Served, data: &Path) -> Command {
    let mut cmd = sandhold_tests::cli::sandhold(data);
    cmd.env("SANDHOLD_SERVER", &s.server().addr).env("SANDHOLD_TOKEN", s.token());
    cmd
}

/// A `sandhold port-forward` child, interrupted (as Ctrl-C) on drop.
struct Forwarder {
    child: Child,
    local: String,
}

impl Forwarder {
    fn start(s: &dyn Served, data: &Path, sandbox: &str, spec: &str) -> Self {
        let mut child = cli(s, data)
            .args(["port-forward", sandbox, spec])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning sandhold port-forward");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines.next().expect("port-forward said nothing").unwrap();
        let local = first
            .strip_prefix("Forwarding from ")
            .and_then(|r| r.split_once(' '))
            .map(|(addr, _)| addr.to_string())
            .unwrap_or_else(|| panic!("unexpected first line: {first}"));
        // Keep draining (per-connection errors would fill the pipe).
        std::thread::spawn(move || lines.for_each(|l| eprintln!("port-forward: {}", l.unwrap_or_default())));
        Self { child, local }
    }

    /// Ctrl-C, and the exit status.
    fn interrupt(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "port-forward did not stop on Ctrl-C");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` over HTTP/1.0 from `addr`: the body.
async fn get(addr: &str, path: &str) -> Vec<u8> {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(format!("GET {path} HTTP/1.0\r\nHost: sandbox\r\n\r\n").as_bytes()).await.unwrap();
    let mut response = Vec::new();
    socket.read_to_end(&mut response).await.unwrap();
    let at = response.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP response");
    assert!(response.starts_with(b"HTTP/1.0 200"), "{:?}", String::from_utf8_lossy(&response[..at]));
    response.split_off(at + 4)
}

under_each_runtime! {
/// A Python server in a Docker sandbox with no network, reached through
/// `sandhold port-forward`: 20 concurrent GETs of 1 MiB arrive intact, and
/// a local connection that closes closes the sandbox's side.
#[tokio_test(flavor = "multi_thread", worker_threads = 4)]
async fn port_forward_reaches_a_server_in_a_docker_sandbox_without_network(runtime) {
    port_forward(Place::SingleHost, runtime).await;
}
}

/// The same through a sandbox on a node in another network namespace: the
/// port's bytes go through the node's tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn port_forward_reaches_a_server_in_a_docker_sandbox_on_a_node() {
    if sandhold_tests::runtime::Runtime::Runc.available() {
        port_forward(Place::OnANode, sandhold_tests::runtime::Runtime::Runc).await;
    }
}

async fn port_forward(place: Place, runtime: sandhold_tests::runtime::Runtime) {
    ensure_debian_image();
    let Some(s) = served(place, "ports", &["other"]).await else { return };
    let s = s.as_ref();
    let _cleanup = DockerCleanup { tenant: s.tenant().to_string() };
    let mut def = debian("py");
    runtime.apply(&mut def);
    let sandbox = sandbox_of(s, def, "ports").await;
    let mut sandboxes = s.server().sandboxes(s.token()).await;
    let got = sandboxes.get_sandbox(api::GetSandboxRequest { sandbox_id: sandbox.clone() }).await.unwrap();
    let capabilities = got.into_inner().sandbox.unwrap().capabilities.unwrap();
    assert!(capabilities.ports && capabilities.terminal, "{capabilities:?}");

    // The kernel's own list (gVisor's `/sys/class/net` is empty for the run
    // user; `/proc/net/dev` answers under both).
    let (_, links) = sh(&mut sandboxes, &sandbox, "sed -n 's/^ *\\([^:]*\\):.*/\\1/p' /proc/net/dev").await;
    assert_eq!(links.trim(), "lo", "the sandbox has no network but its loopback");
    let (code, out) = sh(&mut sandboxes, &sandbox, SERVERS).await;
    assert_eq!(code, 0, "{out}");
    let listening = eventually(PATIENCE, || {
        let mut sandboxes = sandboxes.clone();
        let sandbox = sandbox.clone();
        async move {
            let probe = "python3 -c \"import socket; [socket.create_connection(('127.0.0.1', p)).close() for p in (8000, 8001)]\"";
            sh(&mut sandboxes, &sandbox, probe).await.0 == 0
        }
    })
    .await;
    assert!(listening, "the servers never listened");

    let data = TestDir::new("ports-cli");
    let mut web = Forwarder::start(s, data.path(), &sandbox, "0:8000");
    let expected = big_file();
    let gets: Vec<_> = (0..20)
        .map(|_| {
            tokio::spawn({
                let addr = web.local.clone();
                async move { get(&addr, "/big.bin").await }
            })
        })
        .collect();
    for g in gets {
        let body = tokio::time::timeout(PATIENCE, g).await.expect("a GET stalled").unwrap();
        assert!(body == expected, "a body differs: {} bytes", body.len());
    }
    assert!(web.interrupt().success(), "port-forward exits 0 on Ctrl-C");
    drop(web);

    // Closing the local side closes the sandbox's: the server there reads
    // end of file, and only then records what it got.
    let eof = Forwarder::start(s, data.path(), &sandbox, "127.0.0.1:0:8001");
    let mut socket = tokio::net::TcpStream::connect(&eof.local).await.unwrap();
    socket.write_all(b"bye").await.unwrap();
    drop(socket);
    let closed = eventually(PATIENCE, || {
        let mut sandboxes = sandboxes.clone();
        let sandbox = sandbox.clone();
        async move { sh(&mut sandboxes, &sandbox, "cat /tmp/closed").await.1 == "bye" }
    })
    .await;
    assert!(closed, "the sandbox side never saw the connection close");

    // Another tenant's sandbox does not exist for it.
    let mut other = s.server().sandboxes(&s.token_of("other")).await;
    let err = connect_port(&mut other, &sandbox, 8000).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    // Nothing listens on 8002: a clear refusal.
    let err = connect_port(&mut sandboxes, &sandbox, 8002).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("8002"), "{err:?}");
}

under_each_runtime! {
/// A terminal in a Docker sandbox runs as the run user, on a
/// pseudo-terminal, and ends with its command's code.
async fn a_terminal_in_a_docker_sandbox_is_the_run_users_on_a_pty(runtime) {
    terminal_on_a_pty(Place::SingleHost, runtime).await;
}
}

/// The same in a sandbox on a node in another network namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminal_in_a_docker_sandbox_on_a_node_is_the_run_users_on_a_pty() {
    if sandhold_tests::runtime::Runtime::Runc.available() {
        terminal_on_a_pty(Place::OnANode, sandhold_tests::runtime::Runtime::Runc).await;
    }
}

async fn terminal_on_a_pty(place: Place, runtime: sandhold_tests::runtime::Runtime) {
    ensure_debian_image();
    let Some(s) = served(place, "terminal", &[]).await else { return };
    let s = s.as_ref();
    let _cleanup = DockerCleanup { tenant: s.tenant().to_string() };
    let mut def = debian("term");
    runtime.apply(&mut def);
    let sandbox = sandbox_of(s, def, "terminal").await;
    let mut sandboxes = s.server().sandboxes(s.token()).await;
    let (output, exit) = terminal(&mut sandboxes, &sandbox, "id -u; tty; exit 4").await;
    let lines: Vec<&str> = output.lines().map(str::trim).collect();
    assert_ne!(lines.first().copied(), Some("0"), "the terminal runs as root: {output:?}");
    assert!(lines.get(1).is_some_and(|l| l.starts_with("/dev/pts/")), "{output:?}");
    assert_eq!(exit, Some(api::exit_status::Status::Code(4)));
}

/// Two servers for the port test, started in the background: Python's
/// `http.server` on 8000 over /tmp/www (holding big.bin), and on 8001 one
/// that reads each connection to its end and only then writes what it got
/// to /tmp/closed.
const SERVERS: &str = r#"set -e
mkdir -p /tmp/www
python3 -c 'import sys; sys.stdout.buffer.write(bytes(i % 251 for i in range(1 << 20)))' > /tmp/www/big.bin
cat > /tmp/eof.py <<'PY'
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 8001))
s.listen(8)
while True:
    c, _ = s.accept()
    got = b''
    while True:
        b = c.recv(100)
        if not b:
            break
        got += b
    if got:
        open('/tmp/closed', 'wb').write(got)
    c.close()
PY
cd /tmp/www
nohup python3 -m http.server 8000 --bind 127.0.0.1 >/tmp/http.log 2>&1 &
nohup python3 /tmp/eof.py >/tmp/eof.log 2>&1 &
"#;

/// `script` on a terminal through `OpenTerminal`: what it printed and how
/// it ended.
async fn terminal(
    sandboxes: &mut Sandboxes,
    sandbox: &str,
    script: &str,
) -> (String, Option<api::exit_status::Status>) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let start = api::OpenTerminalStart {
        sandbox_id: sandbox.into(),
        command: Some(api::Command { kind: Some(api::command::Kind::Shell(script.into())) }),
        ..Default::default()
    };
    tx.send(api::OpenTerminalRequest { request: Some(api::open_terminal_request::Request::Start(start)) })
        .await
        .unwrap();
    let mut stream = sandboxes.open_terminal(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let (mut output, mut exit) = (Vec::new(), None);
    while let Some(m) = tokio::time::timeout(PATIENCE, stream.message()).await.unwrap().unwrap() {
        match m.event {
            Some(api::open_terminal_response::Event::Output(data)) => output.extend(data),
            Some(api::open_terminal_response::Event::Exited(x)) => exit = x.status,
            _ => {}
        }
    }
    drop(tx);
    (String::from_utf8_lossy(&output).into_owned(), exit)
}

/// `ConnectPort` to `port`: opened, or the refusal.
async fn connect_port(sandboxes: &mut Sandboxes, sandbox: &str, port: u32) -> Result<(), tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let open = api::ConnectPortOpen { sandbox_id: sandbox.into(), port };
    tx.send(api::ConnectPortRequest { request: Some(api::connect_port_request::Request::Open(open)) })
        .await
        .unwrap();
    let mut stream = sandboxes.connect_port(ReceiverStream::new(rx)).await?.into_inner();
    let first = stream.message().await?;
    drop(tx);
    match first {
        Some(api::ConnectPortResponse { event: Some(api::connect_port_response::Event::Opened(_)) }) => {
            Ok(())
        }
        other => panic!("expected opened, got {other:?}"),
    }
}

/// A local sandbox shares the host's network: `ConnectPort` is not its to
/// offer, and says so with the capability's name.
#[tokio::test]
async fn a_local_sandbox_has_no_ports_of_its_own() {
    let s = TenantServer::start("ports-local", &[]).await;
    let sandbox = sandbox_of(&s, definition("local", Kind::Local), "ports-local").await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let got = sandboxes.get_sandbox(api::GetSandboxRequest { sandbox_id: sandbox.clone() }).await.unwrap();
    let capabilities = got.into_inner().sandbox.unwrap().capabilities.unwrap();
    assert!(!capabilities.ports && capabilities.terminal, "{capabilities:?}");
    let err = connect_port(&mut sandboxes, &sandbox, 8000).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
    let wire = shared::error::Error::from_status(&err);
    assert_eq!(wire.code, shared::error::ErrorCode::Unsupported);
    assert_eq!(wire.metadata.get("capability").map(String::as_str), Some("ports"));
}

fn with_source(mut def: api::SandboxDefinition, url: &str) -> api::SandboxDefinition {
    let source = api::GitSource {
        url: url.into(),
        history: Some(api::git_source::History::Full(true)),
        ..Default::default()
    };
    def.workspace = Some(api::WorkspaceDefinition {
        source: Some(api::Source { source: Some(api::source::Source::Git(source)) }),
        ..Default::default()
    });
    def
}

/// On the local provider, through the CLI: an agent-like edit shows in
/// `sandhold git status` and `diff`; a commit on a new branch is pushed to
/// the bare repository the workspace was cloned from, with the author and
/// message given.
#[tokio::test]
async fn git_through_the_cli_commits_on_a_branch_and_pushes_it() {
    let s = TenantServer::start("git-local", &["other"]).await;
    let dir = TestDir::new("git-origin");
    let bare = origin(dir.path());
    let def = with_source(definition("git", Kind::Local), &bare.display().to_string());
    let sandbox = sandbox_of(&s, def, "git").await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let (code, _) = sh(&mut sandboxes, &sandbox, "echo two >> app.txt && echo new > notes.md").await;
    assert_eq!(code, 0);

    let data = TestDir::new("git-cli");
    let run = |args: &[&str]| {
        let out = cli(&s, data.path()).arg("git").arg(&sandbox).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "git {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let status = run(&["status"]);
    assert!(status.contains("on main"), "{status}");
    assert!(status.contains(" M app.txt") && status.contains("?? notes.md"), "{status}");
    let diff = run(&["diff"]);
    assert!(diff.contains("+two") && diff.contains("app.txt"), "{diff}");
    assert!(run(&["branch", "feature/fix"]).contains("on feature/fix"));
    let committed =
        run(&["commit", "-m", "Fix the app\n\nWith notes.", "--author", "Ada Lovelace <ada@example.com>"]);
    assert!(committed.contains("on feature/fix"), "{committed}");
    let pushed = run(&["push"]);
    assert!(pushed.contains("origin feature/fix"), "{pushed}");

    let head = git(&bare, &["log", "-1", "--format=%an|%ae|%cn|%s|%b", "feature/fix"]);
    assert_eq!(head, "Ada Lovelace|ada@example.com|Ada Lovelace|Fix the app|With notes.");
    let files = git(&bare, &["show", "--name-only", "--format=", "feature/fix"]);
    assert_eq!(files.lines().collect::<Vec<_>>(), ["app.txt", "notes.md"]);
    let clean = run(&["status"]);
    assert!(
        clean.contains("0 ahead and 0 behind origin/feature/fix") && clean.contains("working tree clean"),
        "{clean}"
    );

    // Nothing left to commit: git's refusal, as a precondition.
    let mut commit = api::GitCommitRequest {
        sandbox_id: sandbox.clone(),
        message: "again".into(),
        author: Some(api::GitAuthor { name: "Ada".into(), email: "ada@example.com".into() }),
        all: true,
        ..Default::default()
    };
    let err = sandboxes.git_commit(commit.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("nothing to commit"), "{err:?}");
    // A value git would take for an option never reaches it.
    let err = sandboxes
        .git_push(api::GitPushRequest {
            sandbox_id: sandbox.clone(),
            remote: "--receive-pack=touch /tmp/x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    commit.author = None;
    let err = sandboxes.git_commit(commit).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    // Another tenant: not found, for every git call.
    let mut other = s.server.sandboxes(&s.token_of("other")).await;
    let err = other
        .git_status(api::GitStatusRequest { sandbox_id: sandbox.clone(), path: String::new() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    let err = other
        .git_push(api::GitPushRequest { sandbox_id: sandbox.clone(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
}

/// On Docker, through the API: the same flow, pushing to a bare repository
/// inside the sandbox (the clone's source is a read-only mount).
#[tokio::test]
async fn git_in_a_docker_sandbox_commits_and_pushes_to_a_repository_it_can_reach() {
    if !sandhold_tests::services::docker() {
        return;
    }
    ensure_debian_image();
    let dir = TestDir::new("git-origin-docker");
    let prefix = dir.path().display().to_string();
    let s = TenantServer::start_with_args("git-docker", &[], &["--docker-bind-prefix", &prefix]).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    origin(dir.path());
    let mut def = with_source(debian("git-docker"), "/fixtures/origin.git");
    if let Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(d)) }) =
        def.provider.as_mut()
    {
        d.mounts.push(api::Mount {
            source: dir.path().display().to_string(),
            target: "/fixtures".into(),
            read_only: true,
        });
    }
    let sandbox = sandbox_of(&s, def, "git").await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let (code, out) = sh(
        &mut sandboxes,
        &sandbox,
        "git init -q --bare /tmp/review.git && git remote add review /tmp/review.git && echo changed > app.txt",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let status = sandboxes
        .git_status(api::GitStatusRequest { sandbox_id: sandbox.clone(), path: String::new() })
        .await
        .unwrap()
        .into_inner();
    let files: Vec<_> = status.files.iter().map(|f| (f.path.as_str(), f.unstaged())).collect();
    assert_eq!(files, [("app.txt", api::GitChange::Modified)]);
    let diff = sandboxes
        .git_diff(api::GitDiffRequest { sandbox_id: sandbox.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        diff.files.iter().map(|f| (f.path.as_str(), f.added, f.deleted)).collect::<Vec<_>>(),
        [("app.txt", 1, 1)]
    );
    let branch = sandboxes
        .git_branch(api::GitBranchRequest {
            sandbox_id: sandbox.clone(),
            name: "agent/work".into(),
            create: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(branch.branch, "agent/work");
    let commit = sandboxes
        .git_commit(api::GitCommitRequest {
            sandbox_id: sandbox.clone(),
            message: "Change the app".into(),
            author: Some(api::GitAuthor { name: "Bot".into(), email: "bot@example.com".into() }),
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let pushed = sandboxes
        .git_push(api::GitPushRequest {
            sandbox_id: sandbox.clone(),
            remote: "review".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((pushed.branch.as_str(), pushed.commit.as_str()), ("agent/work", commit.commit.as_str()));
    let (_, log) = sh(
        &mut sandboxes,
        &sandbox,
        "git --git-dir /tmp/review.git log -1 --format='%H|%an|%ae|%s' agent/work",
    )
    .await;
    assert_eq!(log.trim(), format!("{}|Bot|bot@example.com|Change the app", commit.commit));
}

/// `sandhold shell` in a tmux pane: the shell in the sandbox sees the
/// pane's size and follows a resize, `exit 3` exits the CLI with 3, and
/// the local terminal's settings are as they were.
#[tokio::test]
async fn shell_is_a_terminal_that_follows_its_window_and_exits_with_the_code() {
    let s = TenantServer::start("shell", &["other"]).await;
    let sandbox = sandbox_of(&s, definition("term", Kind::Local), "shell").await;
    let data = TestDir::new("shell-cli");
    let tmux = Tmux::new();
    let bin = sandhold_tests::cli::sandhold_bin();
    // The CLI runs inside a wrapper that records the local terminal's
    // settings before and after it, and its exit code.
    let wrapper = format!(
        "before=$(stty -g); SANDHOLD_DATA_DIR={data} SANDHOLD_SERVER={addr} SANDHOLD_TOKEN={token} {bin} shell {sandbox} -- bash --norc --noprofile; \
         code=$?; after=$(stty -g); [ \"$before\" = \"$after\" ] && echo terminal-restored; echo cli-exit=$code; sleep 600",
        data = data.path().display(),
        addr = s.server.addr,
        token = s.token,
        bin = bin.display(),
    );
    tmux.run(&["new-session", "-d", "-s", "s", "-x", "100", "-y", "30", "sh", "-c", &wrapper]);
    tmux.run(&["set-option", "-t", "s", "status", "off"]);
    // bash's own prompt (no rc files): `bash-5.2# `, or `$ ` for a user.
    let prompt = tmux.wait_for("bash-");
    assert!(prompt.contains("bash-"), "no prompt from the sandbox's bash:\n{prompt}");

    let size = tmux.size();
    tmux.run(&["send-keys", "-t", "s", "echo in-sandbox=$PWD; stty size", "Enter"]);
    let pane = tmux.wait_for_line(&size);
    assert!(has_line(&pane, &size), "stty size should say {size}:\n{pane}");
    assert!(pane.contains("in-sandbox=/"), "{pane}");

    tmux.run(&["resize-window", "-t", "s", "-x", "120", "-y", "40"]);
    let resized = tmux.size();
    assert_ne!(resized, size);
    // The resize travels as a message: ask until the shell sees it.
    let deadline = Instant::now() + PATIENCE;
    let mut pane = String::new();
    while Instant::now() < deadline {
        tmux.run(&["send-keys", "-t", "s", "clear; stty size", "Enter"]);
        std::thread::sleep(Duration::from_millis(300));
        pane = tmux.pane();
        if has_line(&pane, &resized) {
            break;
        }
    }
    assert!(has_line(&pane, &resized), "stty size should follow to {resized}:\n{pane}");

    // Another tenant cannot open a terminal there.
    let mut other = s.server.sandboxes(&s.token_of("other")).await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let start = api::OpenTerminalStart { sandbox_id: sandbox.clone(), ..Default::default() };
    tx.send(api::OpenTerminalRequest { request: Some(api::open_terminal_request::Request::Start(start)) })
        .await
        .unwrap();
    let err = other.open_terminal(ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");

    tmux.run(&["send-keys", "-t", "s", "exit 3", "Enter"]);
    let pane = tmux.wait_for("cli-exit=");
    assert!(pane.contains("cli-exit=3"), "{pane}");
    assert!(pane.contains("terminal-restored"), "the local terminal was left changed:\n{pane}");
}

/// Standard base64 (what HTTP Basic auth sends), padding ignored.
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        let Some(v) = ALPHABET.iter().position(|a| *a == c) else { continue };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// An HTTP git remote on the host's loopback that asks for Basic auth and
/// records every password it is sent (then refuses: the push fails, but
/// what reached the remote is what the test checks).
async fn recording_remote() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && socket.read_exact(&mut byte).await.is_ok() {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let basic = head.lines().find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    let value = value.trim();
                    (name.eq_ignore_ascii_case("authorization"))
                        .then(|| value.strip_prefix("Basic ").map(str::to_string))?
                });
                let reply: &[u8] = match basic {
                    Some(b) => {
                        let decoded = String::from_utf8_lossy(&base64_decode(&b)).into_owned();
                        record.lock().unwrap().push(decoded.split_once(':').map(|(_, p)| p.to_string()).unwrap_or(decoded));
                        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    }
                    None => b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                };
                let _ = socket.write_all(reply).await;
            });
        }
    });
    (port, seen)
}

/// The workspace's `auth_secret` token reaches the workspace source's URL
/// (the call's value over the ensure's), whatever remote the repository
/// names, and no other remote; it is written down nowhere it could be read
/// later: not in `.git/config`, not in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_authenticates_with_the_auth_secret_and_leaves_it_nowhere() {
    let s = TenantServer::start("git-auth", &[]).await;
    let dir = TestDir::new("git-auth-origin");
    let bare = origin(dir.path());
    let with_auth = |url: &str| {
        let mut def = with_source(definition("auth", Kind::Local), url);
        def.secret_names = vec!["GIT_TOKEN".into()];
        if let Some(api::source::Source::Git(g)) =
            def.workspace.as_mut().and_then(|w| w.source.as_mut()).and_then(|s| s.source.as_mut())
        {
            g.auth_secret = "GIT_TOKEN".into();
        }
        def
    };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, with_auth(&bare.display().to_string())).await;
    let req = api::EnsureSandboxRequest {
        definition_id: "auth".into(),
        thread_id: "auth".into(),
        secrets: [("GIT_TOKEN".to_string(), "ensure-token-4e1f".to_string())].into(),
        ..Default::default()
    };
    let sandbox = ensure(&mut sandboxes, req).await.1.unwrap().sandbox_id;
    // The source moves to a remote that asks for credentials; the
    // repository's own origin stays the clone's.
    let (port, seen) = recording_remote().await;
    put_definition(&mut sandboxes, with_auth(&format!("http://127.0.0.1:{port}/app.git"))).await;

    let push = |remote: &str, secrets: &[(&str, &str)]| api::GitPushRequest {
        sandbox_id: sandbox.clone(),
        remote: remote.into(),
        secrets: secrets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    let err = sandboxes.git_push(push("", &[("GIT_TOKEN", "call-token-9b2c")])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(!err.message().contains("call-token-9b2c"), "{err:?}");
    let err = sandboxes.git_push(push("origin", &[])).await.unwrap_err();
    assert!(!err.message().contains("ensure-token-4e1f"), "{err:?}");
    let passwords = seen.lock().unwrap().clone();
    assert!(passwords.contains(&"call-token-9b2c".to_string()), "{passwords:?}");
    assert!(
        passwords.contains(&"ensure-token-4e1f".to_string()),
        "the ensure's token without a call's: {passwords:?}"
    );
    // A remote the run adds (here the same listener) gets no token.
    let (code, out) =
        sh(&mut sandboxes, &sandbox, &format!("git remote add review http://127.0.0.1:{port}/app.git")).await;
    assert_eq!(code, 0, "{out}");
    let err = sandboxes.git_push(push("review", &[("GIT_TOKEN", "call-token-9b2c")])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_eq!(seen.lock().unwrap().len(), passwords.len(), "a remote the run named was sent a token");
    let (_, config) = sh(&mut sandboxes, &sandbox, "cat .git/config; git config --list --show-origin").await;
    assert!(!config.contains("token-"), "a token was written down: {config}");
}
