//! `SandboxService` over a real server socket against plain `docker`
//! baselines, measured in the same run, printed as a table:
//!
//! - cold: `EnsureSandbox` (Docker, no setup) until `ready` vs
//!   `docker run --rm IMAGE true`
//! - warm: `EnsureSandbox` of a running sandbox (`resumed`)
//! - pool: `EnsureSandbox` of a new thread that claims a sandbox from its
//!   definition's warm pool (`claimed`), beside the cold create
//! - exec: `Exec` of `true` through the control plane vs
//!   `docker exec CONTAINER true` on the same container
//!
//! `cargo bench -p control-plane --bench sandbox` (needs the Docker engine
//! and the busybox test image; `SANDHOLD_BENCH_ROUNDS` sets the rounds,
//! default 10).

use std::time::{Duration, Instant};

use shared::proto::v1 as api;
use shared::proto::v1::sandbox_service_client::SandboxServiceClient;

use sandhold_tests::auth::bearer;
use sandhold_tests::bench::{Row, ms, summary};
use sandhold_tests::docker::{self, TEST_IMAGE as IMAGE};
use sandhold_tests::server::{Sandboxes, embedded as embedded_server};

async fn ensure(client: &mut Sandboxes, thread: &str) -> api::EnsureReady {
    ensure_of(client, "bench", thread).await
}

async fn ensure_of(client: &mut Sandboxes, definition: &str, thread: &str) -> api::EnsureReady {
    let mut stream = client
        .ensure_sandbox(api::EnsureSandboxRequest {
            definition_id: definition.into(),
            thread_id: thread.into(),
            ..Default::default()
        })
        .await
        .expect("ensure")
        .into_inner();
    while let Some(m) = stream.message().await.expect("ensure stream") {
        if let Some(api::ensure_sandbox_response::Event::Ready(r)) = m.event {
            return r;
        }
    }
    panic!("ensure ended without ready");
}

#[tokio::main]
async fn main() {
    if std::process::Command::new("docker").arg("info").output().map(|o| !o.status.success()).unwrap_or(true)
    {
        eprintln!("sandbox bench skipped: the Docker engine is not reachable");
        return;
    }
    let rounds: usize =
        std::env::var("SANDHOLD_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(10);
    let dir = sandhold_tests::local::TestDir::new("shb");
    let (server, channel) = embedded_server(dir.path(), None).await;
    let token = bearer(server.local_token().expect("a single-user server").expose());
    let mut client = SandboxServiceClient::with_interceptor(channel, token);
    let definition = api::SandboxDefinition {
        id: "bench".into(),
        provider: Some(api::ProviderSpec {
            provider: Some(api::provider_spec::Provider::Docker(api::DockerProvider {
                image: IMAGE.into(),
                ..Default::default()
            })),
        }),
        ..Default::default()
    };
    loop {
        match client.put_definition(api::PutDefinitionRequest { definition: Some(definition.clone()) }).await
        {
            Ok(_) => break,
            Err(s) if s.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(s) => panic!("put definition: {s}"),
        }
    }

    let mut cold = Vec::new();
    for i in 0..rounds {
        let thread = format!("cold-{i}");
        let started = Instant::now();
        let ready = ensure(&mut client, &thread).await;
        cold.push(started.elapsed());
        assert_eq!(ready.outcome, api::EnsureOutcome::Created as i32);
        client.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: ready.sandbox_id }).await.unwrap();
    }
    let pooled = claims_from_a_pool(&mut client, &definition, rounds).await;
    let mut docker_run = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        docker::cli(&["run", "--rm", "--network", "none", IMAGE, "true"]);
        docker_run.push(started.elapsed());
    }

    let ready = ensure(&mut client, "warm").await;
    let sandbox = ready.sandbox_id.clone();
    let container = ready.sandbox.unwrap().provider_sandbox_id;
    let mut warm = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let r = ensure(&mut client, "warm").await;
        warm.push(started.elapsed());
        assert_eq!(r.outcome, api::EnsureOutcome::Resumed as i32);
    }
    let mut exec = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        client
            .exec(api::ExecRequest {
                sandbox_id: sandbox.clone(),
                command: Some(api::Command {
                    kind: Some(api::command::Kind::Argv(api::Argv { args: vec!["true".into()] })),
                }),
                ..Default::default()
            })
            .await
            .unwrap();
        exec.push(started.elapsed());
    }
    let mut docker_exec = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        docker::cli(&["exec", &container, "true"]);
        docker_exec.push(started.elapsed());
    }
    client.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: sandbox }).await.unwrap();
    server.stop().await.unwrap();

    let rows = [
        Row { name: "cold EnsureSandbox (docker)", samples: cold },
        Row { name: "docker run --rm IMAGE true", samples: docker_run },
        Row { name: "warm EnsureSandbox (resume)", samples: warm },
        Row { name: "Exec true (control plane)", samples: exec },
        Row { name: "docker exec CONTAINER true", samples: docker_exec },
        Row { name: "new thread from warm pool", samples: pooled },
    ];
    println!("{:<30} {:>6} {:>12} {:>12}", "operation", "n", "median ms", "p95 ms");
    for r in &rows {
        println!(
            "{:<30} {:>6} {:>12.2} {:>12.2}",
            r.name,
            r.samples.len(),
            ms(r.quantile(0.5)),
            ms(r.quantile(0.95))
        );
    }
    let ratio = |a: &Row, b: &Row| ms(a.quantile(0.5)) / ms(b.quantile(0.5));
    println!();
    println!("cold ensure / docker run (median): {:.2}x", ratio(&rows[0], &rows[1]));
    println!("control-plane Exec / docker exec (median): {:.2}x", ratio(&rows[3], &rows[4]));
    let median = |r: &Row| ms(r.quantile(0.5));
    summary(
        40,
        "cold `EnsureSandbox` (Docker)",
        &format!("{:.0} ms", median(&rows[0])),
        &format!("`docker run --rm` {:.0} ms", median(&rows[1])),
        Some(ratio(&rows[0], &rows[1])),
        "≤ 1.2×",
    );
    summary(50, "warm `EnsureSandbox` (resume)", &format!("{:.1} ms", median(&rows[2])), "—", None, "≤ 5 ms");
    summary(
        35,
        "`EnsureSandbox` of a new thread from a warm pool",
        &format!("p50 {:.1} ms, p99 {:.1} ms", median(&rows[5]), ms(rows[5].quantile(0.99))),
        &format!("cold create {:.0} ms", median(&rows[0])),
        Some(ratio(&rows[5], &rows[0])),
        "≤ 20 ms p50, ≤ 50 ms p99",
    );
}

/// `rounds` ensures of new threads under a copy of `definition` with a
/// warm pool, each once the pool has a sandbox ready (so each is a claim,
/// not a miss); the claimed sandboxes are destroyed after.
async fn claims_from_a_pool(
    client: &mut Sandboxes,
    definition: &api::SandboxDefinition,
    rounds: usize,
) -> Vec<Duration> {
    let mut pooled = definition.clone();
    pooled.id = "pooled".into();
    pooled.lifecycle = Some(api::Lifecycle { warm: 2, ..Default::default() });
    client.put_definition(api::PutDefinitionRequest { definition: Some(pooled) }).await.unwrap();
    let mut samples = Vec::new();
    let mut claimed = Vec::new();
    for i in 0..rounds {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let pools =
                client.list_warm_pools(api::ListWarmPoolsRequest {}).await.unwrap().into_inner().pools;
            if pools.iter().any(|p| p.definition_id == "pooled" && p.ready > 0) {
                break;
            }
            assert!(Instant::now() < deadline, "the warm pool never refilled: {pools:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let started = Instant::now();
        let ready = ensure_of(client, "pooled", &format!("pool-{i}")).await;
        samples.push(started.elapsed());
        assert_eq!(ready.outcome(), api::EnsureOutcome::Claimed, "{ready:?}");
        claimed.push(ready.sandbox_id);
    }
    for sandbox_id in claimed {
        client.destroy_sandbox(api::DestroySandboxRequest { sandbox_id }).await.unwrap();
    }
    // The pool goes with its definition.
    client.delete_definition(api::DeleteDefinitionRequest { id: "pooled".into() }).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.list_warm_pools(api::ListWarmPoolsRequest {}).await.unwrap().into_inner().pools.len()
        + docker::containers("dev.sandhold.definition=pooled").len()
        > 0
    {
        assert!(Instant::now() < deadline, "the warm pool's sandboxes outlived its definition");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    samples
}
