//! runc against gVisor, side by side in one run on one machine: what a
//! Docker sandbox costs under each runtime.
//!
//! - cold: `create` until the agent answers
//! - exec: agent `Exec` of `true` in a running sandbox
//! - journal: a journaled run printing 200,000 lines, followed to its end
//! - files: a setup-like step making 5,000 small files in 50 directories
//!   (what `npm install` does to a file system), then `find | wc`
//! - Claude Code: a real `sandhold serve`, the real CLI from the toolchain
//!   dir in a Debian sandbox, its model (the fake, `tests/fake-model`)
//!   reached through the broker; one run asked to write a file (a tool
//!   call, then the answer) per round, each on a new thread: `StartRun`
//!   to its terminal chunk, and the part of it after the sandbox's setup
//!
//! `cargo bench -p control-plane --bench isolation` (needs the Docker engine
//! with `runsc` registered, `scripts/services`, and the agent CLIs,
//! `scripts/install-agent-clis`; `SANDHOLD_BENCH_ROUNDS` sets the rounds,
//! default 5).

use std::time::{Duration, Instant};

use control_plane::agent::AgentClient;
use control_plane::config::Runtime;
use control_plane::provider::{DockerOptions, DockerProvider, DockerProviderOptions, Provider, SandboxSpec};
use shared::proto::agent::v1::{
    Argv, Command, ExecRequest, FollowRequest, StartRunRequest, command, follow_response,
};

use sandhold_tests::agent::static_agent;
use sandhold_tests::bench::{Row, ms, summary};
use sandhold_tests::docker::{DockerCleanup, TEST_IMAGE as IMAGE, ensure_debian_image};
use sandhold_tests::model::{CLAUDE, FakeModel, broker_server};
use sandhold_tests::run::{Seen, put_definition};
use sandhold_tests::sandbox::of_thread;
use sandhold_tests::wait::PATIENCE;
use shared::proto::v1 as api;

const LINES: u32 = 200_000;
const FILES: &str = "for d in $(seq 1 50); do mkdir -p m/$d; for f in $(seq 1 100); do echo \"module $d $f\" > m/$d/$f.js; done; done; find m -type f | wc -l";

async fn journal_run(agent: &AgentClient, n: usize) -> (Duration, u64) {
    let run_id = format!("bench-{n}-{}", std::process::id());
    let command = Command { kind: Some(command::Kind::Shell(format!("seq 1 {LINES}"))) };
    let started = Instant::now();
    agent
        .journal()
        .start_run(StartRunRequest { run_id: run_id.clone(), command: Some(command), ..Default::default() })
        .await
        .expect("start run");
    let mut stream = agent
        .journal()
        .follow(FollowRequest { run_id, first_byte_timeout_ms: Some(0), ..Default::default() })
        .await
        .expect("follow")
        .into_inner();
    let mut bytes = 0u64;
    while let Some(msg) = stream.message().await.expect("follow stream") {
        match msg.event {
            Some(follow_response::Event::Lines(lines)) => {
                bytes += lines.lines.iter().map(|l| l.data.len() as u64 + 1).sum::<u64>()
            }
            Some(follow_response::Event::Exit(_)) => break,
            None => {}
        }
    }
    (started.elapsed(), bytes)
}

async fn measure(provider: &DockerProvider, runtime: Runtime, rounds: usize) -> Vec<Row> {
    let spec = SandboxSpec {
        key: "bench".into(),
        tenant: format!("bench-{}", std::process::id()),
        definition_id: "bench".into(),
        docker: DockerOptions { image: Some(IMAGE.into()), runtime: Some(runtime), ..Default::default() },
        ..Default::default()
    };
    let mut cold = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let s = provider.create(&spec).await.expect("create");
        cold.push(started.elapsed());
        provider.destroy(&s.provider_id).await.expect("destroy");
    }
    let sandbox = provider.create(&spec).await.expect("create");
    let agent = AgentClient::connect(&sandbox.address, &sandbox.token).await.expect("agent");
    let exec = |kind| ExecRequest {
        command: Some(Command { kind: Some(kind) }),
        timeout_ms: Some(600_000),
        ..Default::default()
    };
    let mut warm = Vec::new();
    for _ in 0..rounds * 10 {
        let started = Instant::now();
        agent
            .process()
            .exec(exec(command::Kind::Argv(Argv { args: vec!["true".into()] })))
            .await
            .expect("exec");
        warm.push(started.elapsed());
    }
    let mut journal = Vec::new();
    let mut throughput = Vec::new();
    for n in 0..rounds {
        let (took, bytes) = journal_run(&agent, n).await;
        journal.push(took);
        // MB/s as a "duration" row would mislead: kept apart, printed below.
        throughput.push(bytes as f64 / took.as_secs_f64() / 1e6);
    }
    let mut files = Vec::new();
    for n in 0..rounds {
        let started = Instant::now();
        let out = agent
            .process()
            .exec(exec(command::Kind::Shell(format!("mkdir r{n} && cd r{n} && {FILES}"))))
            .await
            .expect("files")
            .into_inner();
        files.push(started.elapsed());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "5000", "the step made every file");
    }
    provider.destroy(&sandbox.provider_id).await.expect("destroy");
    let claude_code = claude_code(runtime, rounds).await;
    throughput.sort_by(f64::total_cmp);
    println!("{}: journal throughput median {:.1} MB/s", runtime.as_str(), throughput[throughput.len() / 2]);
    let name =
        |what: &str| -> &'static str { Box::leak(format!("{} {what}", runtime.as_str()).into_boxed_str()) };
    let mut rows = vec![
        Row { name: name("cold create + agent ready"), samples: cold },
        Row { name: name("warm Exec true"), samples: warm },
        Row { name: name("journal 200k lines, followed"), samples: journal },
        Row { name: name("setup: 5,000 small files"), samples: files },
    ];
    if let Some((whole, run)) = claude_code {
        rows.push(Row { name: name("Claude Code run, StartRun to end"), samples: whole });
        rows.push(Row { name: name("Claude Code run, sandbox set up to end"), samples: run });
    }
    rows
}

/// Claude Code runs, each on a new thread (so each the same work: a new
/// sandbox, the tool call, the answer), timed from `StartRun` to the
/// terminal chunk, and from the sandbox's last preparation event (its
/// setup done) to it. `None` (the rows left out) without the CLI.
async fn claude_code(runtime: Runtime, rounds: usize) -> Option<(Vec<Duration>, Vec<Duration>)> {
    sandhold_tests::model::cli("claude")?;
    ensure_debian_image();
    let s = broker_server(&format!("bench-claude-{}", runtime.as_str())).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let model = FakeModel::start("tool");
    let mut definition = CLAUDE.definition("def", (CLAUDE.upstream)(model.port));
    sandhold_tests::runtime::Runtime::from(runtime).apply(&mut definition);
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, definition).await;
    let mut runs = s.server.runs(&s.token).await;
    let (mut whole, mut run) = (Vec::new(), Vec::new());
    for n in 0..rounds {
        let request = CLAUDE.start_request(&format!("r{n}-{}", s.nonce), &format!("t{n}"), "def", "sk-bench");
        let started = Instant::now();
        let mut stream = runs.start_run(request).await.expect("start run").into_inner();
        // The stream brings the sandbox's preparation, then the run's log.
        let (mut prepared, mut seen) = (None, Seen::default());
        while let Some(event) = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("the run stream stalled")
            .unwrap_or_else(|e| panic!("{e:?}\n{}", s.server.log_text()))
        {
            match event.event {
                Some(api::run_event::Event::Progress(_)) => prepared = Some(Instant::now()),
                Some(api::run_event::Event::Chunk(c)) => {
                    seen.chunks.push((c.offset, *c.chunk.expect("a chunk")))
                }
                None => {}
            }
        }
        let ended = Instant::now();
        let terminal = seen.terminal().expect("a terminal chunk");
        assert_eq!(terminal.r#type(), api::ChunkType::RunFinished, "{terminal:?}\n{}", s.server.log_text());
        whole.push(ended - started);
        run.push(ended - prepared.expect("the sandbox's preparation"));
        let sandbox = of_thread(&mut sandboxes, &format!("t{n}")).await;
        let destroy = api::DestroySandboxRequest { sandbox_id: sandbox.sandbox_id };
        sandboxes.destroy_sandbox(destroy).await.expect("destroy the round's sandbox");
    }
    Some((whole, run))
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("SANDHOLD_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    let state = sandhold_tests::local::TestDir::new("sh-bi");
    let provider =
        match DockerProvider::connect(DockerProviderOptions::new(static_agent(), state.path())).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("isolation bench skipped: {e}");
                return;
            }
        };
    if provider.check_runtime(Runtime::Gvisor).await.is_err() {
        eprintln!("isolation bench skipped: the engine has no runsc (scripts/services registers it)");
        return;
    }
    let runc = measure(&provider, Runtime::Runc, rounds).await;
    let gvisor = measure(&provider, Runtime::Gvisor, rounds).await;
    println!("{:<46} {:>5} {:>11} {:>11}", "operation", "n", "median ms", "p95 ms");
    for row in runc.iter().chain(&gvisor) {
        println!(
            "{:<46} {:>5} {:>11.2} {:>11.2}",
            row.name,
            row.samples.len(),
            ms(row.quantile(0.5)),
            ms(row.quantile(0.95))
        );
    }
    println!();
    for (i, (r, g)) in runc.iter().zip(&gvisor).enumerate() {
        let measure = r.name.trim_start_matches("runc ");
        let ratio = ms(g.quantile(0.5)) / ms(r.quantile(0.5));
        println!("{measure}: gVisor / runc (median) {ratio:.2}x");
        summary(
            60 + i as u32,
            &format!("{measure} under gVisor"),
            &format!("{:.1} ms", ms(g.quantile(0.5))),
            &format!("runc {:.1} ms", ms(r.quantile(0.5))),
            Some(ratio),
            "—",
        );
    }
}
