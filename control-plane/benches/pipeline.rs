//! The whole run pipeline against the journal alone.
//!
//! A command prints N chunk lines (`{"type":"TEXT_MESSAGE_CONTENT",
//! "delta":"<wall clock ns>"}`) as fast as it can. Pipeline: journal → agent
//! Follow → driver (translate, align, fenced append) → event log → a
//! client's StartRun stream, on SQLite and on PostgreSQL. Baseline, in the
//! same process: the same command in a local sandbox followed straight
//! through the agent's JournalService (#3's path alone). Per path: chunks/s
//! over the whole run, and latency from the line's write to its receipt,
//! p50 and p99.
//!
//! `SANDHOLD_BENCH_LINES` (default 100000) sets N.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use control_plane::agent::AgentClient;
use control_plane::provider::{LocalProvider, LocalProviderOptions, Provider, SandboxSpec};
use sandhold_tests::agent::static_agent;
use sandhold_tests::auth::bearer;
use sandhold_tests::bench::{Row, ms, summary};
use sandhold_tests::server::embedded as embedded_server;
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use shared::proto::v1::run_service_client::RunServiceClient;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;

fn script(lines: usize) -> Vec<String> {
    let program = format!(
        "import sys, time\nw = sys.stdout.write\nfor i in range({lines}):\n    \
         w('{{\"type\":\"TEXT_MESSAGE_CONTENT\",\"message_id\":\"m\",\"delta\":\"%d\"}}\\n' % time.time_ns())\n    \
         sys.stdout.flush()\n"
    );
    vec!["python3".into(), "-c".into(), program]
}

fn now_ns() -> i128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i128
}

/// Latency of one received line, from the timestamp it carries.
fn latency(delta: &str) -> Option<Duration> {
    let written: i128 = delta.trim().parse().ok()?;
    Some(Duration::from_nanos((now_ns() - written).max(0) as u64))
}

struct Outcome {
    path: String,
    chunks: usize,
    elapsed: Duration,
    latencies: Row,
}

async fn pipeline(lines: usize, database_url: Option<String>, label: &str) -> Outcome {
    let dir = sandhold_tests::local::TestDir::new("shp");
    let (server, channel) = embedded_server(dir.path(), database_url).await;
    let token = bearer(server.local_token().expect("a single-user server").expose());
    let mut sandboxes = SandboxServiceClient::with_interceptor(channel.clone(), token.clone());
    let mut runs = RunServiceClient::with_interceptor(channel, token).max_decoding_message_size(64 << 20);
    let definition = api::SandboxDefinition {
        id: "bench".into(),
        provider: Some(api::ProviderSpec {
            provider: Some(api::provider_spec::Provider::Local(api::LocalProvider {})),
        }),
        ..Default::default()
    };
    loop {
        match sandboxes
            .put_definition(api::PutDefinitionRequest { definition: Some(definition.clone()) })
            .await
        {
            Ok(_) => break,
            Err(s) if s.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(s) => panic!("put definition: {s}"),
        }
    }
    // Warm the sandbox so the measured run is the pipeline, not its setup.
    let warm = api::EnsureSandboxRequest {
        definition_id: "bench".into(),
        thread_id: "t".into(),
        ..Default::default()
    };
    let mut ensure = sandboxes.ensure_sandbox(warm).await.unwrap().into_inner();
    while ensure.message().await.unwrap().is_some() {}

    let request = api::StartRunRequest {
        thread_id: "t".into(),
        run_id: format!("bench-{}", uuid::Uuid::new_v4().simple()),
        definition_id: "bench".into(),
        harness: "command".into(),
        options: Some(api::HarnessOptions { command: script(lines), ..Default::default() }),
        durable: true,
        ..Default::default()
    };
    let started = Instant::now();
    let mut stream = runs.start_run(request).await.unwrap().into_inner();
    let mut samples = Vec::with_capacity(lines);
    while let Some(event) = stream.message().await.unwrap() {
        let Some(api::run_event::Event::Chunk(c)) = event.event else { continue };
        let chunk = c.chunk.unwrap();
        if chunk.r#type() == api::ChunkType::TextMessageContent
            && let Some(l) = latency(&chunk.delta)
        {
            samples.push(l);
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(samples.len(), lines, "{label}: every line arrived");
    server.stop().await.unwrap();
    Outcome {
        path: format!("pipeline, {label}"),
        chunks: lines,
        elapsed,
        latencies: Row { name: "", samples },
    }
}

async fn journal_alone(lines: usize) -> Outcome {
    let dir = sandhold_tests::local::TestDir::new("shj");
    let mut options = LocalProviderOptions::new(dir.path());
    options.agent_binary = Some(static_agent());
    let provider = LocalProvider::new(options).unwrap();
    let spec = SandboxSpec {
        key: "bench".into(),
        tenant: "bench".into(),
        definition_id: "bench".into(),
        env: BTreeMap::new(),
        ..Default::default()
    };
    let sandbox = provider.create(&spec).await.unwrap();
    let client =
        AgentClient::connect_with_deadline(&sandbox.address, &sandbox.token, Duration::from_secs(60))
            .await
            .unwrap();
    let command = script(lines);
    let started = Instant::now();
    client
        .journal()
        .start_run(agent::StartRunRequest {
            run_id: "baseline".into(),
            command: Some(agent::Command {
                kind: Some(agent::command::Kind::Argv(agent::Argv { args: command })),
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut follow = client
        .journal()
        .follow(agent::FollowRequest {
            run_id: "baseline".into(),
            first_byte_timeout_ms: Some(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut samples = Vec::with_capacity(lines);
    while let Some(message) = follow.message().await.unwrap() {
        match message.event {
            Some(agent::follow_response::Event::Lines(batch)) => {
                for line in batch.lines {
                    let value: serde_json::Value = serde_json::from_slice(&line.data).unwrap();
                    if let Some(l) = value["delta"].as_str().and_then(latency) {
                        samples.push(l);
                    }
                }
            }
            Some(agent::follow_response::Event::Exit(_)) => break,
            None => {}
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(samples.len(), lines, "journal alone: every line arrived");
    provider.destroy(&sandbox.provider_id).await.unwrap();
    Outcome {
        path: "journal Follow alone (baseline)".into(),
        chunks: lines,
        elapsed,
        latencies: Row { name: "", samples },
    }
}

#[tokio::main]
async fn main() {
    let lines: usize =
        std::env::var("SANDHOLD_BENCH_LINES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let mut outcomes = vec![journal_alone(lines).await, pipeline(lines, None, "SQLite").await];
    match std::env::var("SANDHOLD_TEST_DATABASE_URL") {
        Ok(url) => outcomes.push(pipeline(lines, Some(url), "PostgreSQL").await),
        Err(_) => {
            eprintln!("PostgreSQL row skipped: SANDHOLD_TEST_DATABASE_URL is not set (scripts/bench sets it)")
        }
    }
    println!("{lines} chunk lines, written as fast as python can flush them");
    println!("{:<34} {:>12} {:>10} {:>10} {:>10}", "path", "chunks/s", "total s", "p50 ms", "p99 ms");
    for o in &outcomes {
        println!(
            "{:<34} {:>12.0} {:>10.2} {:>10.1} {:>10.1}",
            o.path,
            o.chunks as f64 / o.elapsed.as_secs_f64(),
            o.elapsed.as_secs_f64(),
            ms(o.latencies.quantile(0.5)),
            ms(o.latencies.quantile(0.99)),
        );
    }
    let rate = |o: &Outcome| o.chunks as f64 / o.elapsed.as_secs_f64();
    let follow = &outcomes[0];
    for (i, o) in outcomes.iter().enumerate().skip(1) {
        summary(
            20 + i as u32,
            &format!("{} ({lines} lines as fast as they come)", o.path),
            &format!("{:.1}k chunks/s, p50 {:.0} ms", rate(o) / 1e3, ms(o.latencies.quantile(0.5))),
            &format!(
                "journal Follow alone {:.1}k/s, p50 {:.1} ms",
                rate(follow) / 1e3,
                ms(follow.latencies.quantile(0.5))
            ),
            Some(rate(o) / rate(follow)),
            "≥ 0.8× of Follow alone; p50 ≤ 20 ms",
        );
    }
}
