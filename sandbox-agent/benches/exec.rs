//! `Exec` of `true` through the agent over its Unix socket, against spawning
//! `true` directly from this process with `std::process::Command`: median,
//! p99 and their ratio. Run with `cargo bench -p sandbox-agent --bench exec`.

use std::time::{Duration, Instant};

use sandbox_agent::AgentOptions;
use shared::proto::agent::v1::process_service_client::ProcessServiceClient;
use shared::proto::agent::v1::{Argv, Command, ExecRequest, command, exit_status};
use shared::secret::Secret;
use shared::transport::{Address, BearerToken, authed, connect};

const WARM_UP: usize = 30;
const N: usize = 300;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("agent.sock");
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let options = AgentOptions {
        listen: Address::Unix(socket.clone()),
        root: dir.path().join("root"),
        token: Secret::new(token.clone()),
        journal_dir: dir.path().join("journal"),
        run_user: None,
        unconfined: false,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(sandbox_agent::serve(options, async move {
        let _ = stopped.await;
    }));

    let mut through_agent = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the agent did not start listening");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let channel = connect(&Address::Unix(socket.clone())).await.expect("connect");
        let mut client = ProcessServiceClient::new(authed(channel, BearerToken::new(&token).expect("token")));
        let request = ExecRequest {
            command: Some(Command { kind: Some(command::Kind::Argv(Argv { args: vec!["true".into()] })) }),
            ..Default::default()
        };
        let mut samples = Vec::with_capacity(N);
        for i in 0..WARM_UP + N {
            let started = Instant::now();
            let response = client.exec(request.clone()).await.expect("exec").into_inner();
            let elapsed = started.elapsed();
            assert_eq!(response.status.and_then(|s| s.status), Some(exit_status::Status::Code(0)));
            if i >= WARM_UP {
                samples.push(elapsed);
            }
        }
        samples
    });

    let mut direct = Vec::with_capacity(N);
    for i in 0..WARM_UP + N {
        let started = Instant::now();
        let status = std::process::Command::new("true").status().expect("spawn true");
        let elapsed = started.elapsed();
        assert!(status.success());
        if i >= WARM_UP {
            direct.push(elapsed);
        }
    }

    let _ = stop.send(());
    let _ = runtime.block_on(server);

    through_agent.sort();
    direct.sort();
    let (agent_median, agent_p99) = (percentile(&through_agent, 50.0), percentile(&through_agent, 99.0));
    let (direct_median, direct_p99) = (percentile(&direct, 50.0), percentile(&direct, 99.0));
    println!("exec of `true`: N={N} each after {WARM_UP} warm-up runs");
    println!("{:<32} {:>12} {:>12}", "", "median", "p99");
    println!("{:<32} {:>9.3} ms {:>9.3} ms", "agent Exec over unix socket", ms(agent_median), ms(agent_p99));
    println!(
        "{:<32} {:>9.3} ms {:>9.3} ms",
        "direct std::process::Command",
        ms(direct_median),
        ms(direct_p99)
    );
    println!(
        "{:<32} {:>11.2}x {:>11.2}x",
        "ratio (agent / direct)",
        ms(agent_median) / ms(direct_median),
        ms(agent_p99) / ms(direct_p99)
    );
    sandhold_tests::bench::summary(
        60,
        "`Exec` of `true` through the agent",
        &format!("{:.2} ms", ms(agent_median)),
        &format!("spawn from Rust {:.2} ms", ms(direct_median)),
        Some(ms(agent_median) / ms(direct_median)),
        "≤ 1.2×",
    );
}
