//! Fleet throughput: `SANDHOLD_BENCH_FLEET_RUNS` (default 200) short
//! durable runs (`echo`) over three real `sandhold node`s, each in a
//! network namespace of its own joined by a veth pair (as the fleet tests:
//! `sandhold_tests::fleet`), beside the same runs on one `sandhold serve`
//! with its own embedded local provider. The runs go on
//! `SANDHOLD_BENCH_FLEET_THREADS` (default 30) threads at once, each
//! thread's runs one after another (they take turns on its sandbox), so
//! each thread's first run also makes its sandbox. Reported: runs/s over
//! the whole batch (first `StartRun` to last terminal chunk), first chunk
//! (from the `StartRun` call to the run's output line reaching the client)
//! p50 and p99, and how the fleet spread the sandboxes.
//!
//! All on this machine: the nodes share its cores with the control plane,
//! so the fleet's figures measure what the node hop costs, not what more
//! hosts would add. Needs root and `ip netns` (skipped otherwise).
//!
//! `scripts/bench fleet`, or `cargo bench -p control-plane --bench fleet`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sandhold_tests::bench::{Row, ms, summary};
use sandhold_tests::fleet::{Fleet, Netns, NodeSpec};
use sandhold_tests::provider::Kind;
use sandhold_tests::run::{command_run, definition, put_definition};
use sandhold_tests::server::{ServerProcess, TenantServer};
use shared::proto::v1 as api;

const NODES: usize = 3;

struct Outcome {
    wall: Duration,
    first_chunk: Row,
    /// Sandboxes per node (`""`: the server's own providers).
    spread: BTreeMap<String, usize>,
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let runs = env_or("SANDHOLD_BENCH_FLEET_RUNS", 200);
    let threads = env_or("SANDHOLD_BENCH_FLEET_THREADS", 30).clamp(1, runs.max(1));
    if !Netns::available() {
        eprintln!("fleet bench skipped: it needs root and `ip netns` (nodes live in network namespaces)");
        return;
    }
    // A run's record ends a moment after its client read the end, so a
    // thread's next run may overlap it: no per-tenant cap in the way.
    let flags = ["--max-running-runs-per-tenant", "10000", "--max-sandboxes-per-tenant", "10000"];
    let single = TenantServer::start_with_args("bench-one", &[], &flags).await;
    let one = measure(&single.server, &single.token, runs, threads).await;
    drop(single);

    let mut fleet = Fleet::start("bench-fleet", &flags).await.expect("root and `ip netns`");
    let names: Vec<String> = (1..=NODES).map(|i| format!("node-{i}")).collect();
    for name in &names {
        // Room for every thread's sandbox on any node.
        fleet.add_node(NodeSpec { name: name.clone(), slots: Some(threads as u32), ..Default::default() });
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    fleet.wait_state(&names, "ready").await;
    let three = measure(&fleet.server, &fleet.token, runs, threads).await;

    let rate = |o: &Outcome| runs as f64 / o.wall.as_secs_f64();
    println!("fleet: {runs} short runs on {threads} threads at once (dev or release as built)");
    println!(
        "{:<28} {:>8} {:>16} {:>16}  sandboxes per node",
        "", "runs/s", "first chunk p50", "first chunk p99"
    );
    for (name, o) in [("one embedded server", &one), ("three nodes (netns)", &three)] {
        let spread: Vec<String> = o
            .spread
            .iter()
            .map(|(n, c)| format!("{}={c}", if n.is_empty() { "server" } else { n }))
            .collect();
        println!(
            "{name:<28} {:>8.1} {:>13.1} ms {:>13.1} ms  {}",
            rate(o),
            ms(o.first_chunk.quantile(0.5)),
            ms(o.first_chunk.quantile(0.99)),
            spread.join(" ")
        );
    }
    summary(
        95,
        &format!("{runs} short runs over {NODES} nodes (runs/s; first chunk p50, p99)"),
        &format!(
            "{:.1}/s; {:.0} ms, {:.0} ms",
            rate(&three),
            ms(three.first_chunk.quantile(0.5)),
            ms(three.first_chunk.quantile(0.99))
        ),
        &format!(
            "one server: {:.1}/s; {:.0} ms, {:.0} ms",
            rate(&one),
            ms(one.first_chunk.quantile(0.5)),
            ms(one.first_chunk.quantile(0.99))
        ),
        Some(rate(&three) / rate(&one)),
        "—",
    );
}

/// `runs` runs of `echo` spread over `threads` threads of a local
/// definition, every thread at once; each must finish with its line.
async fn measure(server: &ServerProcess, token: &str, runs: usize, threads: usize) -> Outcome {
    let mut sandboxes = server.sandboxes(token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let nonce = sandhold_tests::nonce();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..threads {
        // Runs t, t + threads, t + 2 threads, ... go on thread t.
        let mine: Vec<usize> = (t..runs).step_by(threads).collect();
        let mut client = server.runs(token).await;
        let thread = format!("bench-{nonce}-{t}");
        let nonce = nonce.clone();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            for i in mine {
                let run_id = format!("r{i}-{nonce}");
                let called = Instant::now();
                let request = command_run(&run_id, &thread, "def", "echo first");
                let mut stream = client.start_run(request).await.expect("StartRun").into_inner();
                let mut first = None;
                let mut finished = false;
                while let Some(event) = stream.message().await.expect("run stream") {
                    let Some(api::run_event::Event::Chunk(c)) = event.event else { continue };
                    let chunk = c.chunk.expect("a chunk");
                    match chunk.r#type() {
                        api::ChunkType::TextMessageContent
                            if first.is_none() && chunk.delta.contains("first") =>
                        {
                            first = Some(called.elapsed())
                        }
                        api::ChunkType::RunFinished => finished = true,
                        api::ChunkType::RunError => panic!("{run_id} failed: {chunk:?}"),
                        _ => {}
                    }
                }
                assert!(finished, "{run_id} ended without RUN_FINISHED");
                samples.push(first.unwrap_or_else(|| panic!("{run_id} never printed its line")));
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await.expect("a thread's runs"));
    }
    let wall = started.elapsed();
    let listed = sandboxes.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner();
    let mut spread = BTreeMap::new();
    for sandbox in listed.sandboxes {
        *spread.entry(sandbox.node).or_default() += 1;
    }
    Outcome { wall, first_chunk: Row { name: "first chunk", samples }, spread }
}
