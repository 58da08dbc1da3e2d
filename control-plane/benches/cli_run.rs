//! `sandhold run` as a user runs it, against the same work without
//! Sandhold, measured in the same run:
//!
//! - durable throughput: `sandhold run --local --output json` (embedded
//!   server, SQLite) of `awk` printing `SANDHOLD_BENCH_CLI_LINES` (default
//!   200,000) JSON chunk lines, timed from the run's first chunk on the CLI's
//!   stdout to the CLI's exit (and as a whole, start-up included), against
//!   TanStack AI sandbox 0.2.4's `spawnNdjson` reading the same lines
//!   through a pipe (not durable; `SANDHOLD_BENCH_TANSTACK` names the
//!   directory `scripts/bench` installed it in) and a plain pipe read and
//!   parsed by this process;
//! - cold Docker: `sandhold run --image IMG -- true` (embedded server, a new
//!   container each time) against `docker run --rm IMG true`, after one
//!   round of each that is not counted (the first makes the data dir).
//!
//! `cargo bench -p control-plane --bench cli_run`; `SANDHOLD_BENCH_CLI_ROUNDS`
//! sets the rounds of the durable run and its baselines, taken in turn and
//! compared by their medians (default 5: one round of each swung the ratio
//! between 0.17× and 0.47× on a host whose speed drifts);
//! `SANDHOLD_BENCH_ROUNDS` sets the counted Docker rounds (default 5).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandhold_tests::bench::{Row, ms, summary};
use sandhold_tests::cli::sandhold;
use sandhold_tests::docker::{self, TEST_IMAGE as IMAGE};

fn awk_program(lines: usize) -> String {
    format!(
        "BEGIN {{ for (i = 0; i < {lines}; i++) printf \"{{\\\"type\\\":\\\"TEXT_MESSAGE_CONTENT\\\",\\\"message_id\\\":\\\"m\\\",\\\"delta\\\":\\\"%d\\\"}}\\n\", i }}"
    )
}

struct Durable {
    /// From the run's first chunk on stdout to the CLI's exit.
    streaming: Duration,
    /// The whole command: start-up, sandbox, run, exit.
    whole: Duration,
}

/// `sandhold run --local --output json -- awk PROGRAM`, reading its stdout.
fn durable(data: &Path, lines: usize) -> Durable {
    let started = Instant::now();
    let mut child = sandhold(data)
        .args(["run", "--local", "--output", "json", "--", "awk", &awk_program(lines)])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("sandhold run");
    let mut first_chunk = None;
    let mut chunks = 0;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.expect("stdout");
        if first_chunk.is_none() && line.contains("\"type\"") {
            first_chunk = Some(Instant::now());
        }
        if line.contains("\"TEXT_MESSAGE_CONTENT\"") {
            chunks += 1;
        }
    }
    assert!(child.wait().unwrap().success(), "sandhold run failed");
    let whole = started.elapsed();
    assert_eq!(chunks, lines, "every line came back as a chunk");
    Durable { streaming: first_chunk.expect("a chunk").elapsed(), whole }
}

/// The same awk through a pipe into this process, each line parsed.
fn plain_pipe(lines: usize) -> Duration {
    let started = Instant::now();
    let mut child = Command::new("awk").arg(awk_program(lines)).stdout(Stdio::piped()).spawn().unwrap();
    let mut n = 0;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let value: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        n += usize::from(value["type"] == "TEXT_MESSAGE_CONTENT");
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(n, lines);
    started.elapsed()
}

/// TanStack's `spawnNdjson` over the same command, timed by the script
/// itself (spawn to last line, Node's start-up excluded); None when the
/// package is not installed.
fn tanstack(lines: usize) -> Option<Duration> {
    let dir = std::env::var("SANDHOLD_BENCH_TANSTACK").ok()?;
    if !Path::new(&dir).join("node_modules/@tanstack/ai-sandbox").is_dir() {
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/spawn_ndjson.mjs");
    let command = format!("awk '{}'", awk_program(lines));
    let out = Command::new("node").arg(script).arg(&dir).arg(command).output().ok()?;
    assert!(out.status.success(), "spawn_ndjson.mjs: {}", String::from_utf8_lossy(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["lines"].as_u64(), Some(lines as u64), "spawnNdjson saw every line");
    Some(Duration::from_secs_f64(result["seconds"].as_f64().unwrap()))
}

fn per_s(lines: usize, d: Duration) -> f64 {
    lines as f64 / d.as_secs_f64()
}

fn docker_rows(rounds: usize) -> Option<(Row, Row)> {
    if Command::new("docker").arg("info").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("cold docker rows skipped: the Docker engine is not reachable");
        return None;
    }
    let dir = sandhold_tests::local::TestDir::new("shcr");
    let mut cold = Vec::new();
    let mut docker_run = Vec::new();
    // Round 0 is not counted: it makes the data dir (the database and its
    // migrations, the host copy of the agent), which is a first run's,
    // not a cold sandbox's.
    for round in 0..=rounds {
        let started = Instant::now();
        let out = sandhold(&dir.path().join("data"))
            .env("SANDHOLD_AGENT_STATIC_BINARY", sandhold_tests::agent::static_agent())
            .args(["run", "--image", IMAGE, "--", "true"])
            .output()
            .unwrap();
        let took = started.elapsed();
        assert!(out.status.success(), "sandhold run --image: {}", String::from_utf8_lossy(&out.stderr));
        let started = Instant::now();
        docker::cli(&["run", "--rm", "--network", "none", IMAGE, "true"]);
        if round > 0 {
            cold.push(took);
            docker_run.push(started.elapsed());
        }
    }
    Some((
        Row { name: "sandhold run --image IMG -- true", samples: cold },
        Row { name: "docker run --rm IMG true", samples: docker_run },
    ))
}

fn main() {
    let lines: usize =
        std::env::var("SANDHOLD_BENCH_CLI_LINES").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let rounds: usize = std::env::var("SANDHOLD_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    let stream_rounds: usize =
        std::env::var("SANDHOLD_BENCH_CLI_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(5).max(1);
    let dir = sandhold_tests::local::TestDir::new("shcl");
    // Rounds of each, taken in turn (a host whose speed drifts drifts for
    // both), a new data dir each; the medians are compared.
    let (mut streaming, mut whole, mut pipes, mut tanstacks) = (vec![], vec![], vec![], vec![]);
    for round in 0..stream_rounds {
        let run = durable(&dir.path().join(format!("data-{round}")), lines);
        streaming.push(run.streaming);
        whole.push(run.whole);
        pipes.push(plain_pipe(lines));
        tanstacks.extend(tanstack(lines));
    }
    let median = |samples: Vec<Duration>| Row { name: "", samples }.quantile(0.5);
    let tanstack = (!tanstacks.is_empty()).then(|| median(tanstacks));
    let (streaming, whole, pipe) = (median(streaming), median(whole), median(pipes));

    println!("{lines} JSON lines printed by awk; the median of {stream_rounds} rounds, taken in turn");
    println!("{:<52} {:>10} {:>12}", "reader", "seconds", "lines/s");
    let print =
        |name: &str, d: Duration| println!("{name:<52} {:>10.2} {:>12.0}", d.as_secs_f64(), per_s(lines, d));
    print("sandhold run --output json (durable; first chunk → exit)", streaming);
    print("sandhold run --output json (whole command)", whole);
    match tanstack {
        Some(d) => print("TanStack ai-sandbox 0.2.4 spawnNdjson (pipe)", d),
        None => {
            println!("TanStack ai-sandbox 0.2.4 spawnNdjson: not installed (SANDHOLD_BENCH_TANSTACK unset)")
        }
    }
    print("plain pipe, parsed in Rust", pipe);
    let now = format!("{:.0}k chunks/s", per_s(lines, streaming) / 1e3);
    let (baseline_name, baseline) = match tanstack {
        Some(d) => ("TanStack `spawnNdjson` (a pipe, not durable)", d),
        None => ("plain pipe (TanStack not installed)", pipe),
    };
    summary(
        10,
        "durable run → `sandhold run --output json`, embedded SQLite",
        &now,
        &format!("{baseline_name} {:.0}k lines/s", per_s(lines, baseline) / 1e3),
        Some(baseline.as_secs_f64() / streaming.as_secs_f64()),
        "≥ 0.5×",
    );

    if let Some((cold, docker_run)) = docker_rows(rounds) {
        println!();
        println!("{:<34} {:>6} {:>12} {:>12}", "operation", "n", "median ms", "p95 ms");
        for r in [&cold, &docker_run] {
            println!(
                "{:<34} {:>6} {:>12.0} {:>12.0}",
                r.name,
                r.samples.len(),
                ms(r.quantile(0.5)),
                ms(r.quantile(0.95))
            );
        }
        summary(
            30,
            "cold Docker sandbox, `sandhold run --image IMG -- true`",
            &format!("{:.0} ms", ms(cold.quantile(0.5))),
            &format!("`docker run --rm IMG true` {:.0} ms", ms(docker_run.quantile(0.5))),
            Some(ms(cold.quantile(0.5)) / ms(docker_run.quantile(0.5))),
            "≤ 1.3×",
        );
    }
}
