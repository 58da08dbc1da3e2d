//! OpenTelemetry traces end to end: a small OTLP/gRPC receiver on
//! 127.0.0.1 (the `opentelemetry-proto` messages on a tonic server) takes
//! what a real `sandhold serve` and a real `sandhold run` export, and the
//! run's trace is checked edge by edge: the CLI's call → StartRun → the
//! run's drive → its start → ensure → provisioning → each setup step, and
//! the drive → its conclusion → the terminal status write. Without the OTEL
//! variables nothing is exported; with an unreachable collector the run
//! goes on and the server warns.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use sandhold_tests::cli::{ServeOptions, Served, ok, stdout};
use sandhold_tests::local::TestDir;
use sandhold_tests::wait::PATIENCE;
use tokio_util::sync::CancellationToken;

/// One received span, flattened.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Got>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans.resource.map(|r| r.attributes).unwrap_or_default();
            let service = text_of(&resource, "service.name").unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                got.push(Got {
                    service: service.clone(),
                    name: span.name.clone(),
                    trace: hex::encode(&span.trace_id),
                    id: hex::encode(&span.span_id),
                    parent: hex::encode(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .filter_map(|kv| Some((kv.key.clone(), shown(kv.value.as_ref()?.value.as_ref()?))))
                        .collect(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn shown(value: &Value) -> String {
    match value {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn text_of(attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| Some(shown(kv.value.as_ref()?.value.as_ref()?)))
}

/// A receiver serving on `listener` until dropped.
struct Collector {
    addr: SocketAddr,
    spans: Receiver,
    stop: CancellationToken,
    _runtime: tokio::runtime::Runtime,
}

impl Collector {
    fn start(bind: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(bind))?;
        let addr = listener.local_addr()?;
        let spans = Receiver::default();
        let stop = CancellationToken::new();
        let service = TraceServiceServer::new(spans.clone());
        let stopped = stop.clone().cancelled_owned();
        runtime.spawn(
            tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stopped,
            ),
        );
        Ok(Self { addr, spans, stop, _runtime: runtime })
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Got> {
        self.spans.0.lock().unwrap().clone()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        // The listener closes; the runtime, dropped next, ends its tasks.
        self.stop.cancel();
    }
}

/// The variables that turn traces on, pointed at `collector`, exporting
/// batches quickly.
fn otel_env(endpoint: &str) -> Vec<(String, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.into()),
        ("OTEL_TRACES_SAMPLER".into(), "parentbased_always_on".into()),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
    ]
}

/// The trace a CLI command made, as the collector received it.
struct Trace {
    /// The CLI's root span (`sandhold <command>`).
    root: Got,
    spans: Vec<Got>,
}

impl Trace {
    /// Until the trace of the CLI's `root` span holds a drive and its
    /// terminal write (the CLI flushed at exit; the server's last spans
    /// follow within its batch delay).
    fn of(collector: &Collector, root: &str, server: &Served) -> Self {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = collector.spans();
            let cli = spans.iter().find(|s| s.name == root && s.service == "sandhold-cli").cloned();
            if let Some(cli) = cli {
                let trace: Vec<Got> = spans.iter().filter(|s| s.trace == cli.trace).cloned().collect();
                if trace.iter().any(|s| s.name == "run") && trace.iter().any(|s| s.name == "store.finish") {
                    return Self { root: cli, spans: trace };
                }
            }
            assert!(
                Instant::now() < deadline,
                "the {root} trace never arrived complete: {spans:#?}\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The one span named `name`, a child of `parent`.
    fn child(&self, parent: &Got, name: &str) -> Got {
        let found: Vec<&Got> = self.spans.iter().filter(|s| s.name == name).collect();
        let names: Vec<&str> = self.spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(found.len(), 1, "one {name} span in {names:?}");
        assert_eq!(found[0].parent, parent.id, "{name}'s parent is {}: {:#?}", parent.name, self.spans);
        found[0].clone()
    }
}

#[test]
fn one_run_is_one_trace_from_the_cli_to_the_terminal_write() {
    let collector = Collector::start("127.0.0.1:0").unwrap();
    let server = Served::start_with(
        TestDir::new("sh-traces"),
        ServeOptions { env: otel_env(&collector.endpoint()), ..Default::default() },
    );
    let out = server
        .cli()
        .envs(otel_env(&collector.endpoint()))
        .args(["run", "--thread", "traced", "--setup", "echo one > one.txt", "--setup", "echo two > two.txt"])
        .args(["--", "sh", "-c", "cat one.txt two.txt"])
        .output()
        .unwrap();
    assert_eq!(stdout(ok(&out)), "one\ntwo\n");

    let trace = Trace::of(&collector, "sandhold run", &server);
    let (cli, spans) = (&trace.root, &trace.spans);
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let child = |parent: &Got, name: &str| trace.child(parent, name);
    assert!(cli.parent.is_empty(), "the CLI's span is the root");
    let start = child(cli, "sandhold.v1.RunService/StartRun");
    assert_eq!(start.service, "sandhold", "the server's spans carry its default service name");
    assert_eq!(start.attributes.get("rpc.grpc.status_code").map(String::as_str), Some("0"));
    let run = child(&start, "run");
    assert_eq!(run.attributes.get("takeover").map(String::as_str), Some("false"));
    assert_eq!(run.attributes.get("ending").map(String::as_str), Some("exited"));
    let launch = child(&run, "run.start");
    let ensure = child(&launch, "sandbox.ensure");
    child(&ensure, "provider.create");
    let provision = child(&ensure, "sandbox.provision");
    let steps: Vec<&Got> = spans.iter().filter(|s| s.name == "setup.step").collect();
    assert_eq!(steps.len(), 2, "a span per setup step: {names:?}");
    for (n, step) in steps.iter().enumerate() {
        assert_eq!(step.parent, provision.id, "setup step {} belongs to the provisioning", n + 1);
    }
    let mut numbers: Vec<&str> = steps.iter().map(|s| s.attributes["step"].as_str()).collect();
    numbers.sort();
    assert_eq!(numbers, ["1", "2"]);
    let conclude = child(&run, "run.conclude");
    child(&conclude, "store.finish");
    // Appends are batched: a span per batch, under the drive, never one a
    // chunk (this run has a handful of chunks; a few batches).
    let appends: Vec<&Got> = spans.iter().filter(|s| s.name == "store.append").collect();
    assert!(!appends.is_empty(), "the log's appends: {names:?}");
    let under_run = |s: &Got| {
        let mut at = s.clone();
        while let Some(parent) = spans.iter().find(|p| p.id == at.parent) {
            if parent.id == run.id || parent.id == start.id {
                return true;
            }
            at = parent.clone();
        }
        false
    };
    assert!(appends.iter().all(|a| under_run(a)), "appends happen in the call or the drive");
    let chunks: usize = appends.iter().map(|a| a.attributes["chunks"].parse::<usize>().unwrap()).sum();
    assert!(appends.len() <= chunks, "no span finer than a batch");
    // The agent's side: each call to the sandbox's agent is a span of the
    // control plane, under what made it (a setup step, the run's drive).
    let agent_calls: Vec<&Got> = spans.iter().filter(|s| s.name.starts_with("sandhold.agent.v1.")).collect();
    for step in &steps {
        assert!(
            agent_calls.iter().any(|c| c.parent == step.id),
            "setup step {} calls its agent: {names:?}",
            step.attributes["step"]
        );
    }
    assert!(
        agent_calls.iter().any(|c| c.name.starts_with("sandhold.agent.v1.JournalService/") && under_run(c)),
        "the run's journal is read through the agent, under the drive: {names:?}"
    );
}

/// A run taken over: its server killed mid-run, a client's `attach` to
/// another server on the same data dir drives it on. One trace from the
/// CLI's attach → AttachRun → the drive (a takeover) → its reconnect, the
/// journal's replay, and the conclusion → the terminal write.
#[test]
fn a_run_taken_over_is_one_trace_from_the_attach_to_the_terminal_write() {
    let collector = Collector::start("127.0.0.1:0").unwrap();
    let options = || ServeOptions {
        env: otel_env(&collector.endpoint()),
        args: ["--sweep-interval-ms", "0", "--lease-ttl-ms", "2000", "--lease-renew-ms", "500"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let mut server = Served::start_with(TestDir::new("sh-traces-takeover"), options());
    let go = server.dir.path().join("go");
    let script = format!("echo waiting; while [ ! -e {} ]; do sleep 0.1; done; echo went", go.display());
    let started = server
        .cli()
        .args(["run", "--detach", "--run-id", "taken", "--thread", "taken", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    ok(&started);
    let log_has = |server: &Served, text: &str| {
        let out = server.cli().args(["logs", "taken"]).output().unwrap();
        stdout(&out).contains(text)
    };
    let deadline = Instant::now() + PATIENCE;
    while !log_has(&server, "waiting") {
        assert!(Instant::now() < deadline, "the run never began: {}", server.log());
        std::thread::sleep(Duration::from_millis(200));
    }

    server.kill9_and_restart(options());
    std::fs::write(&go, "").unwrap();
    let attached =
        server.cli().envs(otel_env(&collector.endpoint())).args(["attach", "taken"]).output().unwrap();
    assert!(stdout(ok(&attached)).contains("went"), "{}", stdout(&attached));

    let trace = Trace::of(&collector, "sandhold attach", &server);
    assert!(trace.root.parent.is_empty(), "the CLI's span is the root");
    let attach = trace.child(&trace.root, "sandhold.v1.RunService/AttachRun");
    let run = trace.child(&attach, "run");
    assert_eq!(run.attributes.get("takeover").map(String::as_str), Some("true"));
    trace.child(&run, "run.takeover");
    trace.child(&run, "run.replay_and_follow");
    let conclude = trace.child(&run, "run.conclude");
    trace.child(&conclude, "store.finish");
}

/// No OTEL variables: nothing is exported, not even to the default OTLP
/// endpoint, and no log line speaks of traces. A collector that cannot be
/// reached: the run completes, and the server says why spans are missing.
#[test]
fn traces_are_off_by_default_and_an_absent_collector_is_a_warning() {
    // The default endpoint, 127.0.0.1:4317: what an exporter started by
    // mistake would send to. Only when the port is ours to listen on.
    let default = Collector::start("127.0.0.1:4317").ok();
    let server = Served::start_with(TestDir::new("sh-traces-off"), ServeOptions::default());
    let out =
        server.cli().args(["run", "--thread", "untraced", "--", "sh", "-c", "echo hi"]).output().unwrap();
    assert_eq!(stdout(ok(&out)), "hi\n");
    drop(server);
    if let Some(default) = &default {
        assert!(default.spans().is_empty(), "exported without OTEL variables: {:#?}", default.spans());
    } else {
        eprintln!("127.0.0.1:4317 is taken: the default endpoint is not watched");
    }

    // Nothing listens on this port (bound, then released).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let server = Served::start_with(
        TestDir::new("sh-traces-gone"),
        ServeOptions { env: otel_env(&format!("http://{closed}")), ..Default::default() },
    );
    let started = Instant::now();
    let out = server
        .cli()
        .envs(otel_env(&format!("http://{closed}")))
        .args(["run", "--thread", "lost-traces", "--", "sh", "-c", "echo still"])
        .output()
        .unwrap();
    assert_eq!(stdout(ok(&out)), "still\n");
    assert!(started.elapsed() < Duration::from_secs(20), "the CLI's flush is bounded");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !server.log().contains("traces: the collector did not take a batch of spans") {
        assert!(Instant::now() < deadline, "no warning about the collector: {}", server.log());
        std::thread::sleep(Duration::from_millis(200));
    }
}
