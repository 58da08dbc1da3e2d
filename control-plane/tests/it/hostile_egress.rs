//! Issue 33, medium 7, hit like a hostile tenant against a real `sandhold
//! serve` and its local sandboxes: a run that opens connections through
//! the sandbox's proxy without end must not exhaust the control plane's
//! sockets (nor another tenant's egress), and one that dials refused names
//! without end must not grow the run's stored log past its journal cap.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prost::Message;
use sandhold_tests::local::TestDir;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::{
    Seen, attach_after, command_run, definition, put_definition, read_until, run_to_end, wait_terminal,
};
use sandhold_tests::server::TenantServer;
use shared::proto::v1 as api;

/// A run's client: `count` CONNECTs through the sandbox's proxy, one after
/// another, to `target` (`{i}` numbered). `hold` keeps every connection
/// open until the file `go` exists; `echo` sends `ping` on each tunnel and
/// prints what comes back; `close` closes each at once. Prints the tally
/// of status codes.
///
/// `close` prints a line after each dial, as a hostile run would: the
/// driver's bound on out-of-band chunks in a row (48) starts again at each
/// journal line, so only the records' own budget bounds them.
const CLIENT: &str = r#"
import os, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
port = int(os.environ["HTTP_PROXY"].rstrip("/").rsplit(":", 1)[1])
mode, count, target, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
held, codes = [], {}
# A line first: out-of-band records are kept once the run's log is caught up.
print("dialing", flush=True)
for i in range(count):
    t = target.replace("{i}", str(i))
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        c = s.recv(1)
        if not c:
            break
        head += c
    code = head.split(b" ")[1].decode() if b" " in head else "none"
    codes[code] = codes.get(code, 0) + 1
    if mode == "echo" and code == "200":
        s.sendall(b"ping")
        print("echoed %r" % s.recv(4), flush=True)
    if mode == "hold":
        held.append(s)
    else:
        s.close()
        # A line between dials: the driver's bound on out-of-band records
        # in a row starts again after each.
        print("dialed %d" % i, flush=True)
print("codes " + " ".join("%s=%d" % kv for kv in sorted(codes.items())), flush=True)
while go != "-" and not os.path.exists(go):
    time.sleep(0.05)
"#;

/// A TCP server on 127.0.0.1 that echoes on every connection it accepts
/// and counts them.
struct Sink {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Sink {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        // Ends with the test process; it holds nothing but its sockets.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = stream.read(&mut buf) {
                        if stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { port, accepted }
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn client_command(dir: &TestDir, mode: &str, count: usize, target: &str, go: &str) -> String {
    let script = dir.path().join("client.py");
    std::fs::write(&script, CLIENT).unwrap();
    format!("python3 {} {mode} {count} '{target}' {go}", script.display())
}

fn proxied_definition(allow: &str) -> api::SandboxDefinition {
    let mut def = definition("def", Kind::Local);
    def.network = Some(api::Network { allow_hosts: vec![allow.to_string()], ..Default::default() });
    def
}

#[tokio::test]
async fn hostile_a_connect_flood_leaves_the_servers_sockets_bounded_and_other_tenants_unaffected() {
    let s = TenantServer::start_with_args("egress-flood", &["other"], &["--egress-private-addresses"]).await;
    let dir = TestDir::new("egress-flood-client");
    let sink = Sink::start();
    let allow = format!("127.0.0.1:{}", sink.port);
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, proxied_definition(&allow)).await;
    let other_token = s.token_of("other");
    let mut other_sandboxes = s.server.sandboxes(&other_token).await;
    put_definition(&mut other_sandboxes, proxied_definition(&allow)).await;

    let baseline = open_fds(s.server.pid());
    let go = dir.path().join("go");
    let flood = client_command(&dir, "hold", 1_200, &allow, &go.display().to_string());
    let mut runs = s.server.runs(&s.token).await;
    let mut stream = runs.start_run(command_run("flood", "t", "def", &flood)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.has_text("codes ")).await.unwrap();
    let held = open_fds(s.server.pid());
    let codes = seen.chunks.iter().find(|(_, c)| c.delta.contains("codes ")).unwrap().1.delta.clone();
    let allowed = control_plane::config::DEFAULT_EGRESS_MAX_CONNECTIONS_PER_SANDBOX as usize;
    assert_eq!(codes.trim(), format!("codes 200={allowed} 403={}", 1_200 - allowed), "{codes}");
    assert!(sink.accepted.load(Ordering::SeqCst) <= allowed, "{}", sink.accepted.load(Ordering::SeqCst));
    // A local sandbox and its run cost the server some descriptors; the
    // flood's connections at most one socket each within the limit.
    assert!(held <= baseline + allowed + 64, "open descriptors went from {baseline} to {held}");

    // Meanwhile another tenant's run reaches the same host.
    let mut other_runs = s.server.runs(&other_token).await;
    let echo = client_command(&dir, "echo", 1, &allow, "-");
    let other = run_to_end(&mut other_runs, "other", "t", "def", &echo).await;
    assert!(other.has_text("echoed b'ping'"), "{:?}\n{}", other.chunks, s.server.log_text());
    assert_eq!(other.terminal().map(api::Chunk::r#type), Some(api::ChunkType::RunFinished));

    std::fs::write(&go, b"").unwrap();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap();
    let record = wait_terminal(&mut runs, "flood").await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    let refused = seen
        .chunks
        .iter()
        .filter(|(_, c)| c.name == "sandbox.network")
        .map(|(_, c)| serde_json::from_str::<serde_json::Value>(&c.value_json).unwrap())
        .find(|n| n["allowed"] == false)
        .expect("a refusal recorded");
    assert!(refused["error"].as_str().is_some_and(|e| e.contains("the most one sandbox may")), "{refused}");
}

#[tokio::test]
async fn hostile_a_refused_dial_flood_does_not_grow_the_stored_log_past_the_journal_cap() {
    let s = TenantServer::start("egress-refused", &[]).await;
    let dir = TestDir::new("egress-refused-client");
    let cap: u64 = 64 * 1024;
    let mut def = proxied_definition("allowed.example");
    def.max_journal_bytes = Some(cap);
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, def).await;
    // Every name different and long (250 bytes), refused by the allowlist.
    let target = format!("{{i}}.{}.example:443", "a".repeat(230));
    let flood = client_command(&dir, "close", 1_500, &target, "-");
    let mut runs = s.server.runs(&s.token).await;
    let seen = run_to_end(&mut runs, "refused", "t", "def", &flood).await;
    assert!(
        seen.has_text("codes 403=1500"),
        "{:?}",
        seen.chunks.iter().map(|(_, c)| &c.delta).collect::<Vec<_>>()
    );
    let record = wait_terminal(&mut runs, "refused").await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");

    // The log as stored, read again from its start.
    let mut stored = attach_after(&mut runs, "refused", &Seen::default()).await.unwrap();
    let mut log = Seen::default();
    read_until(&mut stored, &mut log, |_| false).await.unwrap();
    let network: Vec<&api::Chunk> =
        log.chunks.iter().map(|(_, c)| c).filter(|c| c.name == "sandbox.network").collect();
    let bytes: u64 = network.iter().map(|c| c.encoded_len() as u64).sum();
    assert!(bytes <= cap, "{} connection records, {bytes} bytes, over the cap of {cap}", network.len());
    assert!(!network.is_empty(), "the refusals are recorded");
}
