//! The model broker's cost: HTTP requests to a model upstream on this
//! machine through a sandbox agent's broker (the placeholder swapped for
//! the key, every connection carried by the control plane's `Carry`
//! streams) against the same requests sent to the upstream directly, in
//! the same run:
//!
//! - round trip of a small request (a model call's shape: a JSON POST and
//!   a short JSON answer), p50 and p99, and what the broker adds;
//! - a streamed answer of 64 MiB: bytes per second.
//!
//! The upstream is a minimal HTTP/1.1 server in this process (so its own
//! cost is the same on both paths), the agent is served in-process on a
//! Unix socket as in a local sandbox, and the carriers are the control
//! plane's own (`egress::Carriers`).
//!
//! `cargo bench -p control-plane --bench broker` (`SANDHOLD_BENCH_ROUNDS`:
//! requests per row, default 500).

use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane::agent::AgentClient;
use control_plane::egress::{self, Carriers, Plan};
use sandhold_tests::agent::TestAgent;
use sandhold_tests::bench::{Row, ms};
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use shared::secret::Secret;
use shared::transport::Address;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &str = "sk-bench-real-key-0123456789";
const BIG: usize = 64 << 20;
const SMALL_ANSWER: &str = r#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"ok"}]}"#;

/// The upstream: answers `/big` with BIG bytes, anything else with a small
/// JSON body; one request per connection.
async fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let head = read_head(&mut socket).await;
                let big = head.starts_with("POST /big") || head.starts_with("GET /big");
                let body_len = content_length(&head);
                let mut body = vec![0u8; body_len];
                let _ = socket.read_exact(&mut body).await;
                if big {
                    let header =
                        format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\nconnection: close\r\n\r\n");
                    let _ = socket.write_all(header.as_bytes()).await;
                    let piece = vec![b'x'; 1 << 20];
                    for _ in 0..(BIG >> 20) {
                        if socket.write_all(&piece).await.is_err() {
                            return;
                        }
                    }
                } else {
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{SMALL_ANSWER}",
                        SMALL_ANSWER.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                }
                let _ = socket.shutdown().await;
            });
        }
    });
    port
}

async fn read_head(socket: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match socket.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0)
}

/// One request to `port`; returns the answer's length (headers included).
async fn request(port: u16, path: &str, key: &str) -> usize {
    let body = r#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nx-api-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return total,
            Ok(n) => total += n,
        }
    }
}

#[tokio::main]
async fn main() {
    let rounds: usize =
        std::env::var("SANDHOLD_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(500);
    let upstream_port = upstream().await;
    let test_agent = TestAgent::start().await;
    let agent = AgentClient::connect(
        &Address::Unix(test_agent.socket.clone()),
        &Secret::new(test_agent.token.clone()),
    )
    .await
    .expect("connecting to the agent");
    agent
        .secrets()
        .put_secrets(agent::PutSecretsRequest {
            secrets: vec![agent::NamedSecret { name: "ANTHROPIC_API_KEY".into(), value: KEY.into() }],
        })
        .await
        .expect("handing over the key");
    let definition = api::SandboxDefinition {
        id: "bench".into(),
        secret_names: vec!["ANTHROPIC_API_KEY".into()],
        model_access: vec![api::ModelAccess {
            harness: "claude-code".into(),
            upstream: format!("http://127.0.0.1:{upstream_port}"),
            key_secret: "ANTHROPIC_API_KEY".into(),
        }],
        ..Default::default()
    };
    let placeholder = egress::placeholder();
    let route = egress::upstream_for(&definition, control_plane::harness::Harness::ClaudeCode)
        .unwrap()
        .unwrap()
        .route(&placeholder, "", None);
    let broker =
        egress::configure(&agent, &definition, vec![route]).await.expect("configuring the broker").port;
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let limits = egress::EgressLimits::new(
        control_plane::config::DEFAULT_EGRESS_MAX_CONNECTIONS_PER_SANDBOX as usize,
        control_plane::config::DEFAULT_EGRESS_MAX_CONNECTIONS_PER_TENANT as usize,
    );
    let plan = Arc::new(Plan::of(&definition, true, limits.sandbox("bench")));
    let carriers = Carriers::open(agent.clone(), plan, events);
    tokio::spawn(async move { while seen.recv().await.is_some() {} });

    // Warm both paths (the first brokered request waits for carriers).
    for _ in 0..10 {
        assert!(request(upstream_port, "/v1/messages", KEY).await > SMALL_ANSWER.len());
        assert!(request(broker, "/v1/messages", &placeholder).await > SMALL_ANSWER.len());
    }
    let mut direct = Row { name: "direct to the upstream", samples: Vec::new() };
    let mut brokered = Row { name: "through the broker", samples: Vec::new() };
    for _ in 0..rounds {
        let t = Instant::now();
        request(upstream_port, "/v1/messages", KEY).await;
        direct.samples.push(t.elapsed());
        let t = Instant::now();
        request(broker, "/v1/messages", &placeholder).await;
        brokered.samples.push(t.elapsed());
    }
    let big = |port: u16, key: String| async move {
        let t = Instant::now();
        let n = request(port, "/big", &key).await;
        assert!(n >= BIG, "a streamed answer was cut: {n} bytes");
        n as f64 / t.elapsed().as_secs_f64() / (1 << 20) as f64
    };
    let mut direct_mb = Vec::new();
    let mut brokered_mb = Vec::new();
    for _ in 0..3 {
        direct_mb.push(big(upstream_port, KEY.into()).await);
        brokered_mb.push(big(broker, placeholder.clone()).await);
    }
    let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);

    println!("model broker: {rounds} requests per row, 64 MiB streamed answers (best of 3)");
    println!("| path | p50 ms | p99 ms | streamed MiB/s |");
    println!("|---|---:|---:|---:|");
    for (row, mb) in [(&direct, best(&direct_mb)), (&brokered, best(&brokered_mb))] {
        println!(
            "| {} | {:.2} | {:.2} | {:.0} |",
            row.name,
            ms(row.quantile(0.5)),
            ms(row.quantile(0.99)),
            mb
        );
    }
    let added = |q: f64| ms(brokered.quantile(q)) - ms(direct.quantile(q));
    println!(
        "| added by the broker | {:.2} | {:.2} | {:.2}x of direct |",
        added(0.5),
        added(0.99),
        best(&brokered_mb) / best(&direct_mb)
    );
    drop(carriers);
    tokio::time::sleep(Duration::from_millis(100)).await;
    test_agent.stop().await;
}
