//! Docker provider against plain `docker` baselines, measured in the same
//! run on the same machine, printed as a table:
//!
//! - cold: `create` until the agent answers vs `docker run --rm IMAGE true`
//! - warm: `resume` of a running sandbox
//! - exec: agent `Exec` of `true` vs `docker exec CONTAINER true`, on the
//!   same container
//!
//! `cargo bench -p control-plane --bench docker` (needs the Docker engine and
//! the busybox test image; `SANDHOLD_BENCH_ROUNDS` sets the rounds, default 10).

use std::time::{Duration, Instant};

use control_plane::agent::AgentClient;
use control_plane::provider::{DockerProvider, DockerProviderOptions, Provider, SandboxSpec};
use shared::proto::agent::v1::{Argv, Command, ExecRequest, command};

use sandhold_tests::agent::static_agent;
use sandhold_tests::bench::{Row, ms};
use sandhold_tests::docker::{self, TEST_IMAGE as IMAGE};

async fn time<F, Fut>(rounds: usize, mut f: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        f().await;
        samples.push(started.elapsed());
    }
    samples
}

#[tokio::main]
async fn main() {
    if std::process::Command::new("docker").arg("info").output().map(|o| !o.status.success()).unwrap_or(true)
    {
        eprintln!("docker bench skipped: the Docker engine is not reachable");
        return;
    }
    let rounds: usize =
        std::env::var("SANDHOLD_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(10);
    let state = sandhold_tests::local::TestDir::new("sh-b");
    let provider = DockerProvider::connect(DockerProviderOptions::new(static_agent(), state.path()))
        .await
        .expect("docker provider");
    let spec = SandboxSpec {
        key: "bench".into(),
        tenant: format!("bench-{}", std::process::id()),
        definition_id: "bench".into(),
        docker: control_plane::provider::DockerOptions { image: Some(IMAGE.into()), ..Default::default() },
        ..Default::default()
    };

    // Cold: one create (agent answering) per round, destroyed outside the
    // timed part.
    let mut created = Vec::new();
    let mut cold = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        created.push(provider.create(&spec).await.expect("create"));
        cold.push(started.elapsed());
    }
    for s in created.drain(..) {
        provider.destroy(&s.provider_id).await.expect("destroy");
    }
    let docker_run = time(rounds, || async {
        docker::cli(&["run", "--rm", "--network", "none", IMAGE, "true"]);
    })
    .await;

    let sandbox = provider.create(&spec).await.expect("create");
    let warm = time(rounds * 3, || async {
        provider.resume(&sandbox.provider_id).await.expect("resume").expect("present");
    })
    .await;
    let agent = AgentClient::connect(&sandbox.address, &sandbox.token).await.expect("agent");
    let exec = ExecRequest {
        command: Some(Command { kind: Some(command::Kind::Argv(Argv { args: vec!["true".into()] })) }),
        ..Default::default()
    };
    let agent_exec = time(rounds * 5, || async {
        agent.process().exec(exec.clone()).await.expect("exec");
    })
    .await;
    let docker_exec = time(rounds * 5, || async {
        docker::cli(&["exec", &sandbox.provider_id, "true"]);
    })
    .await;
    provider.destroy(&sandbox.provider_id).await.expect("destroy");

    let rows = [
        Row { name: "cold create + agent ready", samples: cold },
        Row { name: "docker run --rm IMAGE true", samples: docker_run },
        Row { name: "warm resume", samples: warm },
        Row { name: "agent Exec true", samples: agent_exec },
        Row { name: "docker exec CONTAINER true", samples: docker_exec },
    ];
    println!("{:<30} {:>6} {:>12} {:>12}", "operation", "n", "median ms", "p95 ms");
    for row in &rows {
        println!(
            "{:<30} {:>6} {:>12.2} {:>12.2}",
            row.name,
            row.samples.len(),
            ms(row.quantile(0.5)),
            ms(row.quantile(0.95))
        );
    }
    let ratio = |a: &Row, b: &Row| ms(a.quantile(0.5)) / ms(b.quantile(0.5));
    println!();
    println!("cold create / docker run (median): {:.2}x", ratio(&rows[0], &rows[1]));
    println!("agent Exec / docker exec (median): {:.2}x", ratio(&rows[3], &rows[4]));
}
