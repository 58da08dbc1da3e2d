//! A fleet, end to end: a control plane and real `sandhold node`s, each
//! node in a network namespace of its own joined to the host by a veth
//! pair (`sandhold_tests::fleet`). Registration and placement, runs and
//! sandbox calls through a node's tunnel, a node daemon killed and started
//! again, mutual TLS refusing another CA, and a drained node.

use std::collections::BTreeMap;
use std::time::Duration;

use sandhold_tests::fleet::{Fleet, NodeSpec, Place, served};
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::sandbox::{ensure, sh};
use sandhold_tests::wait::PATIENCE;
use shared::proto::v1 as api;

fn node(name: &str, labels: &[&str], slots: u32) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        labels: labels.iter().map(|l| l.to_string()).collect(),
        slots: Some(slots),
        ..Default::default()
    }
}

/// A local definition whose node must carry `require`.
fn placed(id: &str, require: &[&str]) -> api::SandboxDefinition {
    let mut d = definition(id, Kind::Local);
    d.placement = Some(api::Placement { require: require.iter().map(|r| r.to_string()).collect() });
    d
}

fn ensure_request(definition: &str, thread: &str) -> api::EnsureSandboxRequest {
    api::EnsureSandboxRequest {
        definition_id: definition.into(),
        thread_id: thread.into(),
        secrets: Default::default(),
        run_id: String::new(),
    }
}

/// Three nodes register with their labels and capacity (`nodes ls`); 30
/// sandboxes requiring a label fill the nodes carrying it up to their
/// slots and no further, each in the node's own data dir; a requirement no
/// node meets is refused naming it, and so is one whose nodes are full.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_register_and_sandboxes_are_placed_by_labels_and_capacity() {
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", crate::metrics::free_port()).parse().unwrap();
    let Some(mut fleet) = Fleet::start("fleet-place", &["--metrics-listen", &metrics.to_string()]).await
    else {
        return;
    };
    fleet.add_node(node("node-a", &["zone=a"], 12));
    fleet.add_node(node("node-b", &["zone=b"], 10));
    fleet.add_node(node("node-c", &["zone=a"], 8));
    let nodes = fleet.wait_state(&["node-a", "node-b", "node-c"], "ready").await;
    let a = nodes.iter().find(|n| n.name == "node-a").unwrap();
    assert_eq!(a.labels.get("zone").map(String::as_str), Some("a"));
    assert_eq!(a.capacity.as_ref().unwrap().sandbox_slots, 12);
    assert!(a.capacity.as_ref().unwrap().memory_bytes > 0);
    assert_eq!(a.providers, ["local"]);
    assert!(a.address.starts_with("https://10.213."), "{}", a.address);

    // The operator's CLI lists them.
    let out = sandhold_tests::cli::sandhold(fleet.data_dir())
        .args(["nodes", "ls", "--output", "json", "--server", &format!("http://{}", fleet.server.addr)])
        .env("SANDHOLD_TOKEN", &fleet.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = listed.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["node-a", "node-b", "node-c"]);
    assert_eq!(listed[1]["labels"]["zone"], "b");
    assert_eq!(listed[0]["state"], "ready");

    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, placed("zone-a", &["zone=a"])).await;
    put_definition(&mut sandboxes, placed("zone-b", &["zone=b"])).await;
    put_definition(&mut sandboxes, placed("gpu", &["gpu=true"])).await;
    // 30 sandboxes: 20 needing zone=a (nodes a and c, 12 + 8 slots), 10
    // needing zone=b (node b, 10 slots).
    let mut on = BTreeMap::<String, u32>::new();
    for i in 0..30 {
        let definition = if i % 3 == 2 { "zone-b" } else { "zone-a" };
        let (_, ready) = ensure(&mut sandboxes, ensure_request(definition, &format!("t{i}"))).await;
        let ready = ready.unwrap_or_else(|s| panic!("ensure {i}: {s}\n{}", fleet.logs()));
        let sandbox = ready.sandbox.unwrap();
        *on.entry(sandbox.node.clone()).or_default() += 1;
        // The sandbox lives in its node's data dir and answers through it.
        let (code, out) = sh(&mut sandboxes, &ready.sandbox_id, "echo hello-from-$((6*7))").await;
        assert_eq!((code, out.trim()), (0, "hello-from-42"));
        let node = fleet.nodes.iter().find(|n| n.spec.name == sandbox.node).unwrap();
        assert!(
            walk_has(&node.data_dir, &sandbox.provider_sandbox_id),
            "{} not under {}",
            sandbox.provider_sandbox_id,
            node.data_dir.display()
        );
    }
    let expected = [("node-a".to_string(), 12), ("node-b".to_string(), 10), ("node-c".to_string(), 8)];
    assert_eq!(on, BTreeMap::from(expected));
    let (_, full) = ensure(&mut sandboxes, ensure_request("zone-a", "t-full")).await;
    let full = full.unwrap_err();
    assert_eq!(full.code(), tonic::Code::FailedPrecondition, "{full}");
    assert!(full.message().contains("all 2 ready nodes with zone=a are full"), "{full}");
    let (_, full_b) = ensure(&mut sandboxes, ensure_request("zone-b", "t-full-b")).await;
    assert!(full_b.unwrap_err().message().contains("all 1 ready nodes with zone=b are full"));
    let (_, none) = ensure(&mut sandboxes, ensure_request("gpu", "t-gpu")).await;
    let none = none.unwrap_err();
    assert!(none.message().contains("no node has gpu=true"), "{none}");

    // `nodes ls` counts them; `sandboxes ls` names each one's node.
    let counts: BTreeMap<String, u32> =
        fleet.list().await.into_iter().map(|n| (n.name, n.sandboxes)).collect();
    assert_eq!((counts["node-a"], counts["node-b"], counts["node-c"]), (12, 10, 8));
    let out = sandhold_tests::cli::sandhold(fleet.data_dir())
        .args(["sandboxes", "ls", "--server", &format!("http://{}", fleet.server.addr)])
        .env("SANDHOLD_TOKEN", &fleet.token)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().next().unwrap().contains("NODE"), "{text}");
    assert_eq!(text.lines().filter(|l| l.contains("node-c")).count(), 8, "{text}");

    // The metrics say the same, and count the two refusals by reason.
    let scraped = tokio::task::spawn_blocking(move || crate::metrics::scrape(metrics)).await.unwrap();
    let value = |series: &str| crate::metrics::value(&scraped, series);
    assert_eq!(value("sandhold_node_sandboxes{node=\"node-a\"}"), 12.0);
    assert_eq!(value("sandhold_node_sandbox_slots{node=\"node-c\"}"), 8.0);
    assert!(value("sandhold_node_heartbeat_age_seconds{node=\"node-b\"}") < 60.0);
    assert_eq!(value("sandhold_placement_failures_total{reason=\"full\"}"), 2.0);
    assert_eq!(value("sandhold_placement_failures_total{reason=\"labels\"}"), 1.0);
}

/// Whether a file or directory named `name` is anywhere under `dir`.
fn walk_has(dir: &std::path::Path, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries
        .flatten()
        .any(|e| e.file_name().to_string_lossy() == name || (e.path().is_dir() && walk_has(&e.path(), name)))
}

/// A durable command run in a sandbox on a node in another namespace
/// streams every line once, in order, through the node's tunnel; files
/// written and read there (exec, a 3 MiB file) arrive intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_on_a_node_streams_every_chunk_once() {
    run_and_files(Place::OnANode).await;
}

/// The same body on a single host (the sandbox on the server's own
/// provider).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_on_a_single_host_streams_every_chunk_once() {
    run_and_files(Place::SingleHost).await;
}

async fn run_and_files(place: Place) {
    let Some(fleet) = served(place, "fleet-run", &[]).await else { return };
    let fleet = fleet.as_ref();
    let mut sandboxes = fleet.server().sandboxes(fleet.token()).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let mut runs = fleet.server().runs(fleet.token()).await;
    let run_id = format!("run-{}", fleet.tenant());
    let seen = run_to_end(&mut runs, &run_id, "thread", "def", &numbered_lines(500, 50, "0.05")).await;
    assert_eq!(seen.line_numbers(), (1..=500).collect::<Vec<_>>(), "{}", fleet.logs());
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    let sandbox = sandhold_tests::sandbox::of_thread(&mut sandboxes, "thread").await;
    let expected = if place == Place::OnANode { "node-1" } else { "" };
    assert_eq!(sandbox.node, expected);

    // Files go through the node too: 3 MiB written, read back, byte for byte.
    let data: Vec<u8> = (0..3usize << 20).map(|i| (i % 253) as u8).collect();
    sandhold_tests::sandbox::write_file(&mut sandboxes, &sandbox.sandbox_id, "out/big.bin", &data)
        .await
        .unwrap_or_else(|e| panic!("write: {e}\n{}", fleet.logs()));
    let request = api::ReadFileRequest {
        sandbox_id: sandbox.sandbox_id.clone(),
        path: "out/big.bin".into(),
        ..Default::default()
    };
    let mut chunks = sandboxes.read_file(request).await.unwrap().into_inner();
    let mut read = Vec::new();
    while let Some(chunk) = tokio::time::timeout(PATIENCE, chunks.message()).await.unwrap().unwrap() {
        read.extend(chunk.data);
    }
    assert!(read == data, "read {} bytes back", read.len());
    let (code, out) = sh(&mut sandboxes, &sandbox.sandbox_id, "wc -c < out/big.bin").await;
    assert_eq!((code, out.trim()), (0, (3usize << 20).to_string().as_str()));
}

type Readers = Vec<(String, tokio::task::JoinHandle<Seen>)>;

/// Start `n` durable runs of `lines` numbered lines on `definition`, each
/// on a thread of its own; returns the run ids and their readers, which
/// read each stream to its end (the control plane is not restarted: a
/// stream that breaks is a failure), once every run has streamed a line.
async fn start_runs(fleet: &Fleet, prefix: &str, n: usize, lines: u32, definition: &str) -> Readers {
    start_runs_on(fleet, &fleet.server, prefix, n, lines, definition).await
}

/// As [`start_runs`], through the control-plane replica `server`.
async fn start_runs_on(
    fleet: &Fleet,
    server: &sandhold_tests::server::ServerProcess,
    prefix: &str,
    n: usize,
    lines: u32,
    definition: &str,
) -> Readers {
    let (streaming, mut started) = tokio::sync::mpsc::channel::<()>(n.max(1));
    let mut out = Vec::new();
    for i in 0..n {
        let mut runs = server.runs(&fleet.token).await;
        let run_id = format!("{prefix}{i}-{}", fleet.nonce);
        let request = command_run(
            &run_id,
            &format!("{prefix}-thread-{i}"),
            definition,
            &numbered_lines(lines, 20, "0.2"),
        );
        let mut stream = runs.start_run(request).await.unwrap().into_inner();
        let streaming = streaming.clone();
        out.push((
            run_id,
            tokio::spawn(async move {
                let mut seen = Seen::default();
                read_until(&mut stream, &mut seen, |s| {
                    !s.line_numbers().is_empty() || s.terminal().is_some()
                })
                .await
                .expect("the run's stream broke");
                let _ = streaming.send(()).await;
                if seen.terminal().is_none() {
                    read_until(&mut stream, &mut seen, |_| false).await.expect("the run's stream broke");
                }
                seen
            }),
        ));
    }
    for _ in 0..n {
        tokio::time::timeout(PATIENCE, started.recv()).await.expect("every run streams");
    }
    out
}

/// Each run ended COMPLETED and its client saw every line once, in order.
async fn assert_all_complete(fleet: &Fleet, runs: Readers, lines: u32) {
    let mut client = fleet.server.runs(&fleet.token).await;
    for (run_id, reader) in runs {
        let seen = tokio::time::timeout(PATIENCE * 2, reader)
            .await
            .unwrap_or_else(|_| panic!("{run_id} never ended:\n{}", fleet.logs()))
            .unwrap();
        assert_eq!(
            seen.line_numbers(),
            (1..=lines).collect::<Vec<_>>(),
            "{run_id}: every line once, in order"
        );
        let terminal = seen.terminal().unwrap_or_else(|| panic!("{run_id}: no terminal chunk"));
        assert_eq!(
            terminal.r#type(),
            api::ChunkType::RunFinished,
            "{run_id}: {terminal:?}\n{}",
            fleet.logs()
        );
        let record = wait_terminal(&mut client, &run_id).await;
        assert_eq!(record.status, api::RunStatus::Completed as i32, "{run_id}: {record:?}");
    }
}

/// The node daemon is SIGKILLed while six runs stream from its sandboxes
/// (three local, three in Docker containers) and started again: its
/// sandboxes ran on, it adopts them, and every run completes with every
/// line delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_daemon_killed_during_runs_adopts_its_sandboxes_and_every_run_completes() {
    let Some(fleet) = Fleet::start("fleet-kill", &[]).await else { return };
    node_killed_during_runs(fleet).await;
}

/// The same under two control-plane replicas on PostgreSQL + Redis: the
/// Docker runs are started through the second replica, which reaches the
/// node (registered through the first) on its own channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_two_replicas_a_node_daemon_killed_during_runs_adopts_its_sandboxes() {
    let Some(fleet) = Fleet::start_replicated("fleet-kill2", &[]).await else { return };
    node_killed_during_runs(fleet).await;
}

async fn node_killed_during_runs(mut fleet: Fleet) {
    const LINES: u32 = 400;
    let docker = sandhold_tests::runtime::Runtime::Runc.available();
    let cleanup = sandhold_tests::docker::DockerCleanup { tenant: fleet.tenant.clone() };
    fleet.add_node(NodeSpec { docker, ..node("node-k", &[], 8) });
    fleet.wait_state(&["node-k"], "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, definition("local", Kind::Local)).await;
    let mut runs = start_runs(&fleet, "kl", 3, LINES, "local").await;
    if docker {
        sandhold_tests::docker::ensure_test_image();
        put_definition(&mut sandboxes, definition("docker", Kind::Docker)).await;
        let second = fleet.replicas.first().unwrap_or(&fleet.server);
        runs.extend(start_runs_on(&fleet, second, "kd", 3, LINES, "docker").await);
    }
    // Mid-stream: every run has printed, and goes on for 4 s in all.
    tokio::time::sleep(Duration::from_millis(300)).await;
    fleet.nodes[0].kill9().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fleet.nodes[0].restart();
    assert_all_complete(&fleet, runs, LINES).await;
    assert!(fleet.nodes[0].log_text().matches("sandhold node serving").count() >= 2, "{}", fleet.logs());
    if docker {
        let sandbox = sandhold_tests::sandbox::of_thread(&mut sandboxes, "kd-thread-0").await;
        assert_eq!((sandbox.provider.as_str(), sandbox.node.as_str()), ("docker", "node-k"));
    }
    drop(cleanup);
    fleet.tear_down().await;
}

/// A drained node gets no new sandbox, and the run already on it finishes;
/// drained through one replica, the other (PostgreSQL and Redis) places no
/// new sandbox there either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drained_node_gets_no_new_sandbox_and_its_run_finishes() {
    const LINES: u32 = 200;
    let Some(mut fleet) = Fleet::start_replicated("fleet-drain", &[]).await else { return };
    fleet.add_node(node("node-d", &[], 8));
    fleet.wait_state(&["node-d"], "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let running = start_runs(&fleet, "d", 1, LINES, "def").await;
    fleet.add_node(node("node-e", &[], 8));
    fleet.wait_state(&["node-e"], "ready").await;
    let out = sandhold_tests::cli::sandhold(fleet.data_dir())
        .args(["nodes", "drain", "node-d", "--server", &format!("http://{}", fleet.server.addr)])
        .env("SANDHOLD_TOKEN", &fleet.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fleet.wait_state(&["node-d"], "draining").await;
    // The drain was asked of one replica; the other places no sandbox there.
    let mut other = fleet.replicas[0].sandboxes(&fleet.token).await;
    for i in 0..4 {
        let (_, ready) = ensure(&mut other, ensure_request("def", &format!("new-{i}"))).await;
        assert_eq!(ready.unwrap().sandbox.unwrap().node, "node-e", "a new sandbox on the drained node");
    }
    assert_all_complete(&fleet, running, LINES).await;
    let sandbox = sandhold_tests::sandbox::of_thread(&mut sandboxes, "d-thread-0").await;
    assert_eq!(sandbox.node, "node-d", "the running run's sandbox stays where it is");
    drop((sandboxes, other));
    fleet.tear_down().await;
}

/// A node whose certificate comes from another CA is refused: the control
/// plane's dial back fails its TLS handshake, the node is not listed, and
/// it exits saying so. So is a node with another join token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_from_another_ca_or_with_another_join_token_is_refused() {
    let Some(mut fleet) = Fleet::start("fleet-ca", &[]).await else { return };
    fleet.add_node(NodeSpec { name: "intruder".into(), other_ca: true, ..Default::default() });
    fleet.add_node(NodeSpec { name: "tokenless".into(), wrong_join_token: true, ..Default::default() });
    fleet.add_node(node("member", &[], 4));
    fleet.wait_state(&["member"], "ready").await;
    for (i, why) in [(0, "certificate"), (1, "join token")] {
        let status = fleet.nodes[i].exited(PATIENCE).await.unwrap_or_else(|| panic!("{}", fleet.logs()));
        assert!(!status.success());
        let log = fleet.nodes[i].log_text();
        assert!(log.contains("refused this node"), "{log}");
        assert!(log.contains(why), "{why}: {log}");
    }
    let names: Vec<String> = fleet.list().await.into_iter().map(|n| n.name).collect();
    assert_eq!(names, ["member"]);
}

/// A control plane presenting a certificate from another CA than the
/// node's is refused by the node: its dial back fails, so the node never
/// joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_control_plane_from_another_ca_is_refused_by_the_node() {
    let Some(mut fleet) = Fleet::start_presenting_another_ca("fleet-cpca").await else { return };
    fleet.add_node(node("careful", &[], 4));
    let status = fleet.nodes[0].exited(PATIENCE).await.unwrap_or_else(|| panic!("{}", fleet.logs()));
    assert!(!status.success());
    let log = fleet.nodes[0].log_text();
    assert!(log.contains("refused this node") && log.contains("mutual TLS"), "{log}");
    assert!(fleet.list().await.is_empty());
}

/// A local definition whose threads keep portable checkpoints.
fn portable(id: &str) -> api::SandboxDefinition {
    let mut d = definition(id, Kind::Local);
    let portable = api::PortableSnapshots { enabled: true, ..Default::default() };
    d.lifecycle = Some(api::Lifecycle { portable_snapshots: Some(portable), ..Default::default() });
    d
}

/// `sandhold nodes rm` during a run: the run ends RUN_ERROR SANDBOX_LOST
/// with every line it delivered before kept, the removed node may not come
/// back, and the thread's next run gets a sandbox on another node restored
/// from its latest checkpoint (a file an earlier run wrote is there).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removed_nodes_runs_end_sandbox_lost_and_the_thread_continues_on_another_node() {
    let Some(mut fleet) = Fleet::start("fleet-rm", &[]).await else { return };
    fleet.add_node(node("node-x", &[], 8));
    fleet.wait_state(&["node-x"], "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, portable("def")).await;
    let mut runs = fleet.server.runs(&fleet.token).await;
    let first =
        run_to_end(&mut runs, &format!("r1-{}", fleet.nonce), "t", "def", "echo kept > kept.txt; echo wrote")
            .await;
    assert!(first.has_text("wrote"), "{:?}", first.chunks);
    fleet.add_node(node("node-y", &[], 8));
    fleet.wait_state(&["node-y"], "ready").await;

    let run_id = format!("r2-{}", fleet.nonce);
    let mut stream = runs
        .start_run(command_run(&run_id, "t", "def", &numbered_lines(1000, 10, "0.2")))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.line_numbers().len() >= 20).await.unwrap();
    let out = sandhold_tests::cli::sandhold(fleet.data_dir())
        .args(["nodes", "rm", "node-x", "--server", &format!("http://{}", fleet.server.addr)])
        .env("SANDHOLD_TOKEN", &fleet.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    read_until(&mut stream, &mut seen, |_| false).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.r#type(), api::ChunkType::RunError, "{terminal:?}\n{}", fleet.logs());
    assert_eq!(terminal.error_code, "SANDBOX_LOST", "{terminal:?}");
    let lines = seen.line_numbers();
    assert!(lines.len() >= 20 && lines.len() < 1000, "{} lines", lines.len());
    assert_eq!(lines, (1..=lines.len() as u32).collect::<Vec<_>>(), "what was delivered stays, once each");
    // The removed node is told so and stops; it may not join again.
    let status = fleet.nodes[0].exited(PATIENCE).await.unwrap_or_else(|| panic!("{}", fleet.logs()));
    assert!(!status.success());
    assert!(fleet.nodes[0].log_text().contains("removed by the operator"), "{}", fleet.nodes[0].log_text());
    let names: Vec<String> = fleet.list().await.into_iter().map(|n| n.name).collect();
    assert_eq!(names, ["node-y"]);

    let next = run_to_end(&mut runs, &format!("r3-{}", fleet.nonce), "t", "def", "cat kept.txt").await;
    assert!(next.has_text("kept"), "the checkpoint was restored: {:?}\n{}", next.chunks, fleet.logs());
    assert_eq!(sandhold_tests::sandbox::of_thread(&mut sandboxes, "t").await.node, "node-y");
}

/// A partition shorter than the grace period: the node's veth is down for
/// 20 s while its runs go on (driven by two replicas on PostgreSQL and
/// Redis); once it heals, the drives catch up from their journal offsets
/// and every run completes with every line once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_shorter_than_the_grace_loses_and_doubles_nothing() {
    const LINES: u32 = 300;
    let Some(mut fleet) = Fleet::start_replicated("fleet-cut", &[]).await else { return };
    fleet.add_node(node("node-p", &[], 8));
    fleet.wait_state(&["node-p"], "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    // 300 lines over 30 s: they straddle the partition. Started through
    // either replica, so both drive runs on the node.
    let mut runs = Vec::new();
    for i in 0..3 {
        let replica = if i % 2 == 0 { &fleet.server } else { &fleet.replicas[0] };
        let mut client = replica.runs(&fleet.token).await;
        let run_id = format!("p{i}-{}", fleet.nonce);
        let request = command_run(&run_id, &format!("p-thread-{i}"), "def", &numbered_lines(LINES, 10, "1"));
        let mut stream = client.start_run(request).await.unwrap().into_inner();
        runs.push((
            run_id,
            tokio::spawn(async move {
                let mut seen = Seen::default();
                read_until(&mut stream, &mut seen, |_| false).await.expect("the run's stream broke");
                seen
            }),
        ));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    fleet.nodes[0].ns.cut();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let during = fleet.list().await;
    assert_eq!(during[0].state, "unreachable", "{during:?}");
    fleet.nodes[0].ns.heal();
    assert_all_complete(&fleet, runs, LINES).await;
    drop(sandboxes);
    fleet.tear_down().await;
}

/// A partition past the grace period: the node is lost, its runs end
/// RUN_ERROR SANDBOX_LOST, and the thread's next run continues on another
/// node from its latest checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_past_the_grace_loses_the_sandbox_and_the_thread_moves() {
    let Some(mut fleet) = Fleet::start("fleet-lost", &["--node-grace-ms", "8000"]).await else { return };
    fleet.add_node(node("node-l", &[], 8));
    fleet.wait_state(&["node-l"], "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, portable("def")).await;
    let mut runs = fleet.server.runs(&fleet.token).await;
    run_to_end(&mut runs, &format!("l1-{}", fleet.nonce), "t", "def", "echo kept > kept.txt").await;
    fleet.add_node(node("node-m", &[], 8));
    fleet.wait_state(&["node-m"], "ready").await;
    let run_id = format!("l2-{}", fleet.nonce);
    let mut stream = runs
        .start_run(command_run(&run_id, "t", "def", &numbered_lines(1000, 10, "0.5")))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.line_numbers().len() >= 10).await.unwrap();
    fleet.nodes[0].ns.cut();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.error_code, "SANDBOX_LOST", "{terminal:?}\n{}", fleet.logs());
    let lines = seen.line_numbers();
    assert_eq!(lines, (1..=lines.len() as u32).collect::<Vec<_>>(), "what was delivered stays, once each");
    assert_eq!(fleet.list().await.iter().find(|n| n.name == "node-l").unwrap().state, "lost");
    let next = run_to_end(&mut runs, &format!("l3-{}", fleet.nonce), "t", "def", "cat kept.txt").await;
    assert!(next.has_text("kept"), "the checkpoint was restored: {:?}\n{}", next.chunks, fleet.logs());
    assert_eq!(sandhold_tests::sandbox::of_thread(&mut sandboxes, "t").await.node, "node-m");
    fleet.nodes[0].ns.heal();
}

/// The reaper forgets the sandboxes of a node that is gone: one node
/// removed (`nodes rm`), another cut off past the grace; a sweep removes
/// the instance records of the sandboxes on both and the warm pool row on
/// the removed one, so they are listed no more and count against no quota;
/// the sandbox on the third node, which lives, stays. A sandbox of the lost
/// node destroyed by its owner is forgotten at once. When the lost node
/// comes back, the next sweep destroys the sandboxes it still holds (its
/// orphans now).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reaper_forgets_the_sandboxes_of_a_removed_or_lost_node() {
    let args = ["--node-grace-ms", "4000", "--orphan-sandbox-grace-ms", "0"];
    let Some(mut fleet) = Fleet::start("fleet-forget", &args).await else { return };
    fleet.add_node(node("node-r", &["zone=r"], 8));
    fleet.add_node(node("node-l", &["zone=l"], 8));
    fleet.add_node(node("node-k", &["zone=k"], 8));
    fleet.wait_state(&["node-r", "node-l", "node-k"], "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    let mut on_l = Vec::new();
    for zone in ["r", "l", "k"] {
        put_definition(&mut sandboxes, placed(&format!("on-{zone}"), &[&format!("zone={zone}")])).await;
        let (_, ready) =
            ensure(&mut sandboxes, ensure_request(&format!("on-{zone}"), &format!("t{zone}"))).await;
        let sandbox = ready.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs())).sandbox.unwrap();
        assert_eq!(sandbox.node, format!("node-{zone}"));
        if zone == "l" {
            on_l.push(sandbox.provider_sandbox_id);
        }
    }
    let (_, doomed) = ensure(&mut sandboxes, ensure_request("on-l", "tl-destroyed")).await;
    let doomed = doomed.unwrap();
    on_l.push(doomed.sandbox.unwrap().provider_sandbox_id);
    let doomed = doomed.sandbox_id;
    let mut pooled = placed("pool-r", &["zone=r"]);
    pooled.lifecycle = Some(api::Lifecycle { warm: 1, ..Default::default() });
    put_definition(&mut sandboxes, pooled).await;
    let pool = |sandboxes: &sandhold_tests::server::Sandboxes| {
        let mut sandboxes = sandboxes.clone();
        async move {
            let pools =
                sandboxes.list_warm_pools(api::ListWarmPoolsRequest {}).await.unwrap().into_inner().pools;
            pools.into_iter().find(|p| p.definition_id == "pool-r").unwrap_or_default()
        }
    };
    let filled = sandhold_tests::wait::eventually(PATIENCE, || {
        let pool = pool(&sandboxes);
        async move { pool.await.ready == 1 }
    })
    .await;
    assert!(filled, "the pool never filled: {:?}\n{}", pool(&sandboxes).await, fleet.logs());

    let mut admin = fleet.server.admin(&fleet.token).await;
    admin.remove_node(api::RemoveNodeRequest { name: "node-r".into() }).await.unwrap();
    fleet.nodes[1].ns.cut();
    fleet.wait_state(&["node-l"], "lost").await;
    let listed = |sandboxes: &sandhold_tests::server::Sandboxes| {
        let mut sandboxes = sandboxes.clone();
        async move {
            let all =
                sandboxes.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner();
            let mut nodes: Vec<String> = all.sandboxes.into_iter().map(|s| s.node).collect();
            nodes.sort();
            nodes
        }
    };
    // Destroying a sandbox of the lost node forgets it (the node cannot be asked).
    sandboxes
        .destroy_sandbox(api::DestroySandboxRequest { sandbox_id: doomed })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
    assert_eq!(
        listed(&sandboxes).await,
        ["node-k", "node-l", "node-r"],
        "nothing is forgotten before a sweep"
    );

    admin.sweep(api::SweepRequest {}).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
    assert_eq!(listed(&sandboxes).await, ["node-k"], "{}", fleet.logs());
    let log = fleet.server.log_text();
    let forgotten =
        |what: &str| log.lines().filter(|l| l.contains(&format!(": {what}: its node is gone"))).count();
    assert_eq!(forgotten("sandbox forgotten"), 3, "{log}");
    assert_eq!(forgotten("pooled sandbox forgotten"), 1, "{log}");
    // The pool's row on the removed node went: nothing ready (no other
    // node has zone=r to refill it on).
    assert_eq!(pool(&sandboxes).await.ready, 0);
    // The sandbox on the node that lives answers as before.
    let tk = sandhold_tests::sandbox::of_thread(&mut sandboxes, "tk").await;
    assert_eq!(sh(&mut sandboxes, &tk.sandbox_id, "echo still").await, (0, "still\n".to_string()));

    // The lost node comes back holding both of its sandboxes: orphans, which
    // the next sweep destroys; the sandbox on node-k stays.
    fleet.nodes[1].ns.heal();
    fleet.wait_state(&["node-l"], "ready").await;
    let data_l = fleet.nodes[1].data_dir.clone();
    assert!(on_l.iter().all(|id| walk_has(&data_l, id)), "node-l kept its sandboxes while cut off");
    admin.sweep(api::SweepRequest {}).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
    for id in &on_l {
        assert!(!walk_has(&data_l, id), "{id} is still on node-l after the sweep\n{}", fleet.logs());
    }
    let destroyed =
        fleet.server.log_text().lines().filter(|l| l.contains("orphaned sandbox destroyed")).count();
    assert_eq!(destroyed, 2, "{}", fleet.logs());
    assert_eq!(sh(&mut sandboxes, &tk.sandbox_id, "echo still").await, (0, "still\n".to_string()));
}

/// The node daemon is SIGKILLed while it makes a sandbox (its setup waits
/// on a file): the EnsureSandbox fails at once saying so, nothing is
/// recorded (no sandbox listed, the tenant's one-sandbox quota free again),
/// and once the node is back the thread's next ensure makes its sandbox,
/// removing the half-made one the node kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_during_create_fails_the_ensure_and_leaves_nothing_half_made() {
    let Some(mut fleet) = Fleet::start("fleet-halfmade", &["--max-sandboxes-per-tenant", "1"]).await else {
        return;
    };
    fleet.add_node(node("node-h", &[], 8));
    fleet.wait_state(&["node-h"], "ready").await;
    let hold = fleet.data_dir().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let mut def = definition("slow", Kind::Local);
    def.workspace = Some(api::WorkspaceDefinition {
        setup: vec![api::SetupStep {
            step: Some(api::setup_step::Step::Serial(format!(
                "echo setting-up; while [ -e {} ]; do sleep 0.1; done; echo set-up",
                hold.display()
            ))),
        }],
        ..Default::default()
    });
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, def).await;
    let mut stream = sandboxes.ensure_sandbox(ensure_request("slow", "t")).await.unwrap().into_inner();
    loop {
        let message = tokio::time::timeout(PATIENCE, stream.message()).await.expect("ensure stalled");
        let event = message.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs())).unwrap().event.unwrap();
        match event {
            api::ensure_sandbox_response::Event::Progress(p) if p.output_line == "setting-up" => break,
            api::ensure_sandbox_response::Event::Ready(r) => panic!("ready while its setup waits: {r:?}"),
            _ => {}
        }
    }
    fleet.nodes[0].kill9().await;
    let failed = loop {
        let message = tokio::time::timeout(PATIENCE, stream.message()).await.expect("the ensure hung");
        match message {
            Ok(Some(m)) => assert!(
                !matches!(m.event, Some(api::ensure_sandbox_response::Event::Ready(_))),
                "ready with its node dead"
            ),
            Ok(None) => panic!("the ensure ended without ready or error"),
            Err(status) => break status,
        }
    };
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}\n{}", fleet.logs());
    assert!(failed.message().contains("node-h"), "the error names the node: {failed:?}");
    let listed = sandboxes.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner();
    assert!(listed.sandboxes.is_empty(), "a record of a half-made sandbox: {listed:?}");

    fleet.nodes[0].restart();
    // Registered again (its last heartbeat before the kill may still read ready).
    let back = sandhold_tests::wait::eventually(PATIENCE, || {
        let registered = fleet.nodes[0].log_text().matches("registered with the control plane").count();
        async move { registered >= 2 }
    })
    .await;
    assert!(back, "{}", fleet.logs());
    std::fs::remove_file(&hold).unwrap();
    let (_, ready) = ensure(&mut sandboxes, ensure_request("slow", "t")).await;
    let ready = ready.unwrap_or_else(|e| panic!("the quota is free again: {e}\n{}", fleet.logs()));
    assert_eq!(ready.outcome, api::EnsureOutcome::Created as i32);
    assert!(
        fleet.server.log_text().contains("removing an unrecorded sandbox of this key"),
        "{}",
        fleet.logs()
    );
    let (code, out) = sh(&mut sandboxes, &ready.sandbox_id, "echo ok").await;
    assert_eq!((code, out.as_str()), (0, "ok\n"));
}

/// The past-grace partition with a real Claude Code conversation: run 1
/// tells the model a fact on a node, run 2 waits on the model when that
/// node is cut off past the grace and ends `SANDBOX_LOST`, and run 3 of the
/// thread, on the other node in a sandbox restored from the checkpoint
/// (and a CLI home that never held the session), sends the model the fact
/// with its question: the conversation carried over. The fake model listens
/// on the control plane's veth address, which both nodes reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_grace_a_claude_code_conversation_continues_on_another_node() {
    let Some(bin) = sandhold_tests::model::cli("claude") else { return };
    let Some(mut fleet) = Fleet::start("fleet-conv", &["--node-grace-ms", "8000"]).await else { return };
    fleet.add_node(node("node-l", &[], 8));
    fleet.wait_state(&["node-l"], "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, portable("def")).await;
    let dir = fleet.data_dir().to_path_buf();
    let stall = dir.join("stall");
    let hub = fleet.hub().host_ip;
    let model = sandhold_tests::model::FakeModel::with(
        "plain",
        sandhold_tests::model::FakeOptions {
            log: Some(dir.join("model.log")),
            stall_file: Some(stall.clone()),
            host: Some(std::net::IpAddr::V4(hub)),
            ..Default::default()
        },
    );
    let options = |home: &str| {
        let home = dir.join(home);
        std::fs::create_dir_all(&home).unwrap();
        let mut options = crate::conversations::claude_options(&bin, &home, model.port);
        let url = format!("http://{hub}:{}", model.port);
        options.env.insert("ANTHROPIC_BASE_URL".into(), url);
        options
    };
    let claude = |run_id: String, prompt: &str, options: api::HarnessOptions| api::StartRunRequest {
        thread_id: "chat".into(),
        run_id,
        definition_id: "def".into(),
        harness: "claude-code".into(),
        options: Some(options),
        prompt: prompt.into(),
        durable: true,
        ..Default::default()
    };
    let nonce = fleet.nonce.clone();
    let (fact, question) =
        (format!("The code word is damson-{nonce}."), format!("Which code word did I give, {nonce}?"));
    let mut runs = fleet.server.runs(&fleet.token).await;

    let run1 = format!("c1-{nonce}");
    let mut stream =
        runs.start_run(claude(run1.clone(), &fact, options("home1"))).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
    let record = wait_terminal(&mut runs, &run1).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{:?}", seen.chunks);
    fleet.server.wait_checkpoint(&fleet.token, "chat", &run1).await;

    fleet.add_node(node("node-m", &[], 8));
    fleet.wait_state(&["node-m"], "ready").await;
    std::fs::write(&stall, b"").unwrap();
    let run2 = format!("c2-{nonce}");
    let mut stream =
        runs.start_run(claude(run2.clone(), "Are you there?", options("home1"))).await.unwrap().into_inner();
    let mut seen = Seen::default();
    // The CLI has asked the model (which waits) when the node is cut off.
    let asked = sandhold_tests::wait::eventually(PATIENCE, || {
        let asked = model.requests().iter().any(|r| r.contains("Are you there?"));
        async move { asked }
    })
    .await;
    assert!(asked, "run 2 never reached the model\n{}", fleet.logs());
    fleet.nodes[0].ns.cut();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.error_code, "SANDBOX_LOST", "{terminal:?}\n{}", fleet.logs());
    std::fs::remove_file(&stall).unwrap();

    let run3 = format!("c3-{nonce}");
    let mut stream =
        runs.start_run(claude(run3.clone(), &question, options("home2"))).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
    let record = wait_terminal(&mut runs, &run3).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}\n{:?}", seen.chunks);
    assert_eq!(sandhold_tests::sandbox::of_thread(&mut sandboxes, "chat").await.node, "node-m");
    crate::conversations::assert_carried(&fleet.logs(), &seen, &model, &fact, &question);
    fleet.nodes[0].ns.heal();
}

/// A run left with neither driver nor client on a node that is then lost:
/// its client went, the replica driving it is SIGKILLed, and the node is
/// cut off past the grace. The other replica's sweep does not call it
/// `unknown` sweep after sweep: the drive it takes over ends it
/// `SANDBOX_LOST` with what it delivered kept once each, and the sandbox is
/// forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_ends_a_driverless_run_on_a_lost_node_and_forgets_its_sandbox() {
    // Short leases: the dead driver's run lease runs out soon.
    let flags = ["--node-grace-ms", "4000", "--lease-ttl-ms", "2000", "--lease-renew-ms", "500"];
    let Some(mut fleet) = Fleet::start_replicated("fleet-orphan", &flags).await else { return };
    fleet.add_node(node("node-o", &[], 8));
    fleet.wait_state(&["node-o"], "ready").await;
    let mut sandboxes = fleet.server.sandboxes(&fleet.token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let run_id = format!("o1-{}", fleet.nonce);
    let mut runs = fleet.server.runs(&fleet.token).await;
    let mut stream = runs
        .start_run(command_run(&run_id, "t", "def", &numbered_lines(1000, 10, "0.5")))
        .await
        .unwrap()
        .into_inner();
    read_until(&mut stream, &mut Seen::default(), |s| s.line_numbers().len() >= 10).await.unwrap();
    drop(stream);
    fleet.server.kill9().await;
    fleet.nodes[0].ns.cut();
    let other = &fleet.replicas[0];
    let mut admin = other.admin(&fleet.token).await;
    let lost = sandhold_tests::wait::eventually(PATIENCE, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.list_nodes(api::ListNodesRequest {}).await.unwrap().into_inner().nodes;
            nodes.iter().any(|n| n.name == "node-o" && n.state == "lost")
        }
    })
    .await;
    assert!(lost, "{}", fleet.logs());

    // The first sweep may find the run's lease still held (until its TTL).
    let mut report = None;
    let until = std::time::Instant::now() + PATIENCE;
    while report.is_none() && std::time::Instant::now() < until {
        let swept =
            admin.sweep(api::SweepRequest {}).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()));
        report = swept.into_inner().runs.into_iter().find(|r| r.run_id == run_id);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = report.unwrap_or_else(|| panic!("no sweep took the run\n{}", fleet.logs()));
    assert_eq!(report.outcome, "finalized", "{report:?}\n{}", fleet.logs());
    let mut runs = other.runs(&fleet.token).await;
    let mut attached = attach_after(&mut runs, &run_id, &Seen::default()).await.unwrap();
    let mut seen = Seen::default();
    read_until(&mut attached, &mut seen, |_| false).await.unwrap();
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.error_code, "SANDBOX_LOST", "{terminal:?}");
    let lines = seen.line_numbers();
    assert!(lines.len() >= 10, "{} lines", lines.len());
    assert_eq!(lines, (1..=lines.len() as u32).collect::<Vec<_>>(), "what was delivered stays, once each");
    let mut sandboxes = other.sandboxes(&fleet.token).await;
    let listed = sandboxes.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner();
    assert!(listed.sandboxes.is_empty(), "{listed:?}");
    fleet.nodes[0].ns.heal();
    fleet.tear_down().await;
}
