//! Live network rules (issue #38): `UpdateNetworkPolicy` and `sandhold
//! sandboxes network` change what a running sandbox's proxy lets through,
//! for the next connection, on every replica; within the definition's and
//! the operator's bounds; never for another tenant. Real `sandhold serve`
//! processes, local sandboxes, plain HTTP servers on 127.0.0.x.

use std::path::Path;

use sandhold_tests::git_remote::HostServer;
use sandhold_tests::local::TestDir;
use sandhold_tests::provider::Kind;
use sandhold_tests::run::{Seen, command_run, definition, put_definition, read_until};
use sandhold_tests::server::{Runs, Sandboxes, ServerProcess};
use shared::proto::v1 as api;

use crate::broker::customs;

/// The run's client: for each target in turn, once the file `go<i>`
/// exists, one `GET http://<target>/` through the sandbox's proxy (never
/// around it: `NO_PROXY` names 127.0.0.1), printed as `TRY <i> <status>
/// <last line>`; then it waits for the file `end`.
const CLIENT: &str = r#"
import os, socket, sys, time
port = int(os.environ["HTTP_PROXY"].rstrip("/").rsplit(":", 1)[1])
d, targets = sys.argv[1], sys.argv[2:]
print("ready", flush=True)
for i, t in enumerate(targets):
    while not os.path.exists(os.path.join(d, "go%d" % i)):
        time.sleep(0.05)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(("GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (t, t)).encode())
    answer = b""
    while True:
        piece = s.recv(65536)
        if not piece:
            break
        answer += piece
    s.close()
    lines = answer.decode(errors="replace").strip().splitlines() or ["none none"]
    print("TRY %d %s %s" % (i, lines[0].split(" ")[1], lines[-1]), flush=True)
while not os.path.exists(os.path.join(d, "end")):
    time.sleep(0.05)
"#;

/// The run's command: [`CLIENT`] over `targets`, its files in `dir`.
fn client(dir: &Path, targets: &[String]) -> String {
    let script = dir.join("client.py");
    std::fs::write(&script, CLIENT).unwrap();
    format!("python3 {} {} {}", script.display(), dir.display(), targets.join(" "))
}

/// A run of [`CLIENT`], stepped by the test.
struct Client<'a> {
    stream: tonic::Streaming<api::RunEvent>,
    seen: Seen,
    dir: &'a Path,
    step: usize,
}

impl<'a> Client<'a> {
    /// Run `run_id` on thread `t` of definition `net`, until it is ready.
    async fn start(runs: &mut Runs, run_id: &str, dir: &'a Path, targets: &[String]) -> Self {
        Self::start_on(runs, run_id, "t", dir, targets).await
    }

    /// Run `run_id` on `thread` of definition `net`, until it is ready.
    async fn start_on(
        runs: &mut Runs,
        run_id: &str,
        thread: &str,
        dir: &'a Path,
        targets: &[String],
    ) -> Self {
        let request = command_run(run_id, thread, "net", &client(dir, targets));
        let stream = runs.start_run(request).await.unwrap().into_inner();
        let mut run = Client { stream, seen: Seen::default(), dir, step: 0 };
        read_until(&mut run.stream, &mut run.seen, |s| s.has_text("ready")).await.unwrap();
        run
    }

    /// The next target tried: its status and the answer's last line.
    async fn try_next(&mut self) -> String {
        let i = self.step;
        self.step += 1;
        std::fs::write(self.dir.join(format!("go{i}")), b"").unwrap();
        self.answered(i).await
    }

    /// What try `i` (already started) got.
    async fn answered(&mut self, i: usize) -> String {
        let prefix = format!("TRY {i} ");
        read_until(&mut self.stream, &mut self.seen, |s| s.has_text(&prefix)).await.unwrap();
        let line = self.seen.chunks.iter().find(|(_, c)| c.delta.contains(&prefix)).unwrap().1.delta.clone();
        line.trim().trim_start_matches(&prefix).to_string()
    }

    /// Until the run's log holds the `network.policy` of `version`.
    async fn recorded(&mut self, version: u64) -> Vec<serde_json::Value> {
        read_until(&mut self.stream, &mut self.seen, |s| {
            customs(s, "network.policy").iter().any(|p| p["version"] == version)
        })
        .await
        .unwrap();
        customs(&self.seen, "network.policy")
    }

    async fn end(mut self) -> Seen {
        std::fs::write(self.dir.join("end"), b"").unwrap();
        read_until(&mut self.stream, &mut self.seen, |_| false).await.unwrap();
        assert_eq!(self.seen.terminal().map(api::Chunk::r#type), Some(api::ChunkType::RunFinished));
        self.seen
    }
}

/// A local definition whose proxy allows only `127.0.0.2:9` (nothing
/// listens there) and denies `denied` outright.
fn proxied(denied: &str) -> api::SandboxDefinition {
    let mut def = definition("net", Kind::Local);
    def.network = Some(api::Network {
        allow_hosts: vec!["127.0.0.2:9".into()],
        deny: vec![api::NetworkRule { host: denied.into(), ..Default::default() }],
        ..Default::default()
    });
    def
}

/// The sandbox of `thread`, as `sandboxes` lists it.
async fn sandbox_of(sandboxes: &mut Sandboxes, thread: &str) -> String {
    let listed = sandboxes
        .list_sandboxes(api::ListSandboxesRequest { thread_id: thread.into(), with_state: false })
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert_eq!(listed.len(), 1, "{listed:?}");
    listed[0].sandbox_id.clone()
}

fn update(sandbox: &str, allow: &[&str], deny: &[&str]) -> api::UpdateNetworkPolicyRequest {
    api::UpdateNetworkPolicyRequest {
        sandbox_id: sandbox.into(),
        allow_hosts: allow.iter().map(|h| h.to_string()).collect(),
        deny_hosts: deny.iter().map(|h| h.to_string()).collect(),
        reset: false,
    }
}

/// `sandhold sandboxes network` against `server` as `token`.
fn cli(dir: &Path, server: &ServerProcess, token: &str, args: &[&str]) -> std::process::Output {
    sandhold_tests::cli::sandhold(dir)
        .env("SANDHOLD_TOKEN", token)
        .args(["sandboxes", "network"])
        .args(args)
        .args(["--server", &server.addr])
        .output()
        .unwrap()
}

/// Two replicas on PostgreSQL: the run is driven by the first; its rules
/// are changed through the second (the CLI), and the first's proxy follows
/// them at the next connection: refused before, through after the allow,
/// refused again after the deny. Each change is on the run's record.
#[tokio::test]
async fn a_live_change_lets_the_next_connection_through_and_the_reverse_refuses_it() {
    let Some(cluster) = sandhold_tests::cluster::Cluster::create("live-net").await else { return };
    let dir = TestDir::new("live-net-client");
    let web = HostServer::start(dir.path(), "127.0.0.1", "hello from the host\n");
    let target = format!("127.0.0.1:{}", web.port);
    let (tenant, token) = (format!("t{}", cluster.nonce), format!("tok-{}", cluster.nonce));
    let tokens = vec![format!("{tenant}={token}")];
    let flags = vec!["--egress-private-addresses".to_string()];
    let a = cluster.replica("a", tokens.clone(), (2000, 500), flags.clone()).await;
    let b = cluster.replica("b", tokens, (2000, 500), flags).await;
    put_definition(&mut a.sandboxes(&token).await, proxied("127.0.0.5")).await;

    let mut run =
        Client::start(&mut a.runs(&token).await, "live", dir.path(), &vec![target.clone(); 3]).await;
    let sandbox = sandbox_of(&mut b.sandboxes(&token).await, "t").await;

    let refused = run.try_next().await;
    assert!(refused.starts_with("403"), "before any change: {refused}\n{}", a.log_text());

    let out = cli(dir.path(), &b, &token, &[&sandbox, "--allow-host", &target]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(&format!("live       allow {target}")), "{shown}");
    let through = run.try_next().await;
    assert_eq!(through, "200 hello from the host", "after the allow\n{}", a.log_text());

    let out = cli(dir.path(), &b, &token, &[&sandbox, "--deny-host", &target, "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let policy: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(policy["deny_hosts"], serde_json::json!([target]), "{policy}");
    let again = run.try_next().await;
    assert!(again.starts_with("403"), "after the deny: {again}");

    let recorded = run.recorded(2).await;
    let changes: Vec<_> = recorded.iter().map(|p| (p["version"].clone(), p["change"].clone())).collect();
    assert_eq!(
        changes,
        [
            (1.into(), serde_json::json!({"allow_hosts": [target], "deny_hosts": [], "reset": false})),
            (2.into(), serde_json::json!({"allow_hosts": [], "deny_hosts": [target], "reset": false})),
        ],
        "{recorded:?}"
    );
    assert!(recorded.iter().all(|p| p["changed_by"] == tenant.as_str()), "{recorded:?}");
    assert_eq!(recorded[1]["deny_hosts"], serde_json::json!([target]), "the latest with the rules it left");
    let seen = run.end().await;
    let blocked = customs(&seen, "network.blocked");
    assert_eq!(
        blocked[0]["blocked"],
        serde_json::json!([{"host": "127.0.0.1", "port": web.port, "count": 2}])
    );
    drop((a, b));
    cluster.tear_down().await;
}

/// An allow outside the operator's egress hosts or under the definition's
/// deny is PERMISSION_DENIED, and another tenant's change (or read) of the
/// sandbox is NOT_FOUND; after each, the connection is still refused. The
/// owner's allow of the same host then lets it through (the refusals were
/// the bounds, not the setup).
#[tokio::test]
async fn live_changes_outside_the_bounds_or_from_another_tenant_are_refused() {
    let operator = ["--egress-private-addresses", "--egress-host", "127.0.0.1,127.0.0.2"];
    let s =
        sandhold_tests::server::TenantServer::start_with_args("live-net-bounds", &["other"], &operator).await;
    let dir = TestDir::new("live-net-bounds-client");
    let ours = HostServer::start(dir.path(), "127.0.0.1", "ours\n");
    let outside = HostServer::start(dir.path(), "127.0.0.3", "outside\n");
    let denied = HostServer::start(dir.path(), "127.0.0.2", "denied\n");
    let [ours, outside, denied] = [&ours, &outside, &denied].map(|w| w.port);
    let (ours, outside, denied) =
        (format!("127.0.0.1:{ours}"), format!("127.0.0.3:{outside}"), format!("127.0.0.2:{denied}"));
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, proxied(&denied)).await;
    let targets = [outside.clone(), denied.clone(), ours.clone(), ours.clone()];
    let mut run = Client::start(&mut s.server.runs(&s.token).await, "bounds", dir.path(), &targets).await;
    let sandbox = sandbox_of(&mut sandboxes, "t").await;

    let status = sandboxes.update_network_policy(update(&sandbox, &[&outside], &[])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("egress_hosts"), "{}", status.message());
    assert!(run.try_next().await.starts_with("403"), "outside the operator's hosts");

    let status = sandboxes.update_network_policy(update(&sandbox, &[&denied], &[])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("network.deny[0]"), "{}", status.message());
    assert!(run.try_next().await.starts_with("403"), "under the definition's deny");

    let mut theirs = s.server.sandboxes(&s.token_of("other")).await;
    for request in [update(&sandbox, &[&ours], &[]), update(&sandbox, &[], &[])] {
        let status = theirs.update_network_policy(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    }
    assert!(run.try_next().await.starts_with("403"), "after another tenant's change");
    let unchanged = sandboxes.update_network_policy(update(&sandbox, &[], &[])).await.unwrap().into_inner();
    assert_eq!(unchanged.policy.unwrap().version, 0, "no change was made");

    let changed =
        sandboxes.update_network_policy(update(&sandbox, &[&ours], &[])).await.unwrap().into_inner();
    let policy = changed.policy.unwrap();
    assert_eq!((policy.version, policy.allow_hosts.clone()), (1, vec![ours.clone()]));
    assert_eq!(policy.definition_deny, std::slice::from_ref(&denied));
    assert_eq!(run.try_next().await, "200 ours", "{}", s.server.log_text());
    assert_eq!(run.recorded(1).await.len(), 1);
    run.end().await;
}

/// The one request `run_id` waits on, once there is one.
async fn waiting(runs: &mut Runs, run_id: &str) -> api::RunRequest {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let request = api::ListRequestsRequest { run_id: run_id.into(), include_answered: false };
        let pending = runs.list_requests(request).await.unwrap().into_inner().requests;
        if let [one] = pending.as_slice() {
            return one.clone();
        }
        assert!(pending.is_empty(), "{pending:?}");
        assert!(std::time::Instant::now() < deadline, "no request of {run_id} came");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Answer a network request.
async fn answer(runs: &mut Runs, run_id: &str, request_id: &str, allow: bool, scope: &str) {
    let permission = api::PermissionAnswer { allow, scope: scope.into(), ..Default::default() };
    let request = api::RespondToRequestRequest {
        run_id: run_id.into(),
        request_id: request_id.into(),
        answer: Some(api::respond_to_request_request::Answer::Permission(permission)),
    };
    runs.respond_to_request(request).await.unwrap();
}

/// A local definition whose proxy asks before it connects to `asked`, its
/// requests denied `timeout_ms` after they are asked.
fn asking(asked: &str, timeout_ms: u64) -> api::SandboxDefinition {
    let mut def = proxied("127.0.0.5");
    let network = def.network.as_mut().unwrap();
    network.ask = vec![api::NetworkRule { host: asked.into(), ..Default::default() }];
    def.policy = Some(api::SandboxPolicy { request_timeout_ms: timeout_ms, ..Default::default() });
    def
}

/// A server whose definition `net` asks before connecting to `target`, a
/// web server on 127.0.0.1 answering "asked for".
struct Asking {
    s: sandhold_tests::server::TenantServer,
    dir: TestDir,
    web: HostServer,
    target: String,
}

impl Asking {
    async fn start(prefix: &str, timeout_ms: u64) -> Self {
        let args = ["--egress-private-addresses"];
        let s = sandhold_tests::server::TenantServer::start_with_args(prefix, &[], &args).await;
        let dir = TestDir::new(&format!("{prefix}-client"));
        let web = HostServer::start(dir.path(), "127.0.0.1", "asked for\n");
        let target = format!("127.0.0.1:{}", web.port);
        put_definition(&mut s.server.sandboxes(&s.token).await, asking(&target, timeout_ms)).await;
        Self { s, dir, web, target }
    }
}

/// A connection under an ask rule waits on a request of kind `network`:
/// an allow lets it through, a deny and the deadline refuse it (nothing
/// reaches the server), and an allow of scope `run` lets the next one
/// through with no second request.
#[tokio::test]
async fn a_network_ask_is_a_request_allow_lets_it_through_and_deny_or_the_deadline_refuse_it() {
    let Asking { s, dir, web, target } = Asking::start("net-ask", 3_000).await;
    let mut runs = s.server.runs(&s.token).await;
    let mut run = Client::start(&mut runs, "ask", dir.path(), &vec![target.clone(); 5]).await;

    // Allowed once.
    std::fs::write(dir.path().join("go0"), b"").unwrap();
    let request = waiting(&mut runs, "ask").await;
    assert_eq!(request.kind, "network", "{request:?}");
    let input: serde_json::Value = serde_json::from_str(&request.input_json).unwrap();
    assert_eq!((input["host"].as_str(), input["port"].as_u64()), (Some("127.0.0.1"), Some(web.port.into())));
    assert!(request.rule.contains("ask"), "{request:?}");
    answer(&mut runs, "ask", &request.request_id, true, "once").await;
    run.step = 1;
    let through = run.answered(0).await;
    assert_eq!(through, "200 asked for", "{}", s.server.log_text());

    // Denied.
    std::fs::write(dir.path().join("go1"), b"").unwrap();
    let request = waiting(&mut runs, "ask").await;
    answer(&mut runs, "ask", &request.request_id, false, "").await;
    run.step = 2;
    assert!(run.answered(1).await.starts_with("403"), "a deny refuses");

    // Unanswered past the deadline.
    std::fs::write(dir.path().join("go2"), b"").unwrap();
    let unanswered = waiting(&mut runs, "ask").await;
    run.step = 3;
    assert!(run.answered(2).await.starts_with("403"), "the deadline refuses");

    // Allowed for the run: the next connection asks nothing.
    std::fs::write(dir.path().join("go3"), b"").unwrap();
    let request = waiting(&mut runs, "ask").await;
    answer(&mut runs, "ask", &request.request_id, true, "run").await;
    run.step = 4;
    assert_eq!(run.answered(3).await, "200 asked for");
    assert_eq!(run.try_next().await, "200 asked for", "scope run: no second request");

    let all = runs
        .list_requests(api::ListRequestsRequest { run_id: "ask".into(), include_answered: true })
        .await
        .unwrap()
        .into_inner()
        .requests;
    let answers: Vec<(bool, String, String)> = all
        .iter()
        .map(|r| r.answer.as_ref().map(|a| (a.allowed, a.answered_by.clone(), a.scope.clone())).unwrap())
        .collect();
    let want = |allowed: bool, by: &str, scope: &str| (allowed, by.to_string(), scope.to_string());
    assert_eq!(
        answers,
        [
            want(true, "client", "once"),
            want(false, "client", ""),
            want(false, "deadline", ""),
            want(true, "client", "run")
        ],
        "{all:?}"
    );
    assert_eq!(all[2].request_id, unanswered.request_id);
    run.end().await;
}

/// Scopes across runs: an allow for the run does not outlive it, an allow
/// for the thread lets that thread's later runs through with no request,
/// and another thread still asks (and is refused on a deny).
#[tokio::test]
async fn a_network_allow_for_the_thread_covers_its_later_runs_and_no_other_thread() {
    let Asking { s, dir, web: _web, target } = Asking::start("net-ask-thread", 30_000).await;
    let mut runs = s.server.runs(&s.token).await;
    // Run `run_id` on `thread` for one connection (in a directory of its
    // own); with `answer`, the request it makes is answered so.
    async fn one_connection(
        runs: &mut Runs,
        dir: &Path,
        (run_id, thread): (&str, &str),
        target: &str,
        answer_with: Option<(bool, &str)>,
    ) -> (String, Vec<api::RunRequest>) {
        let dir = dir.join(run_id);
        std::fs::create_dir_all(&dir).unwrap();
        let mut run = Client::start_on(runs, run_id, thread, &dir, &[target.to_string()]).await;
        std::fs::write(dir.join("go0"), b"").unwrap();
        if let Some((allow, scope)) = answer_with {
            let asked = waiting(runs, run_id).await;
            answer(runs, run_id, &asked.request_id, allow, scope).await;
        }
        run.step = 1;
        let got = run.answered(0).await;
        run.end().await;
        let request = api::ListRequestsRequest { run_id: run_id.into(), include_answered: true };
        (got, runs.list_requests(request).await.unwrap().into_inner().requests)
    }
    let log = || s.server.log_text();

    // Allowed for its run only: the thread's next run asks again.
    let (got, _) = one_connection(&mut runs, dir.path(), ("r1", "t"), &target, Some((true, "run"))).await;
    assert_eq!(got, "200 asked for", "{}", log());
    // Allowed for the thread.
    let (got, _) = one_connection(&mut runs, dir.path(), ("r2", "t"), &target, Some((true, "thread"))).await;
    assert_eq!(got, "200 asked for", "{}", log());
    // The thread's next run goes through and asks nothing.
    let (got, asked) = one_connection(&mut runs, dir.path(), ("r3", "t"), &target, None).await;
    assert_eq!((got.as_str(), asked.len()), ("200 asked for", 0), "{asked:?}\n{}", log());
    // Another thread asks for itself, and its deny refuses.
    let (got, asked) = one_connection(&mut runs, dir.path(), ("u1", "u"), &target, Some((false, ""))).await;
    assert!(got.starts_with("403") && asked.len() == 1, "{got} {asked:?}");
}

/// A connection waiting on its network request outlives the replica that
/// drove the run: that replica is killed (SIGKILL), the run is taken over
/// by a second one, the request is answered there, and the connection
/// goes through.
#[tokio::test]
async fn a_network_ask_is_answered_from_a_second_replica_after_the_driver_is_killed() {
    let Some(cluster) = sandhold_tests::cluster::Cluster::create("net-ask-kill").await else { return };
    let dir = TestDir::new("net-ask-kill-client");
    let web = HostServer::start(dir.path(), "127.0.0.1", "after the takeover\n");
    let target = format!("127.0.0.1:{}", web.port);
    let token = format!("tok-{}", cluster.nonce);
    let tokens = vec![format!("t{}={token}", cluster.nonce)];
    let flags: Vec<String> =
        ["--egress-private-addresses", "--sweep-interval-ms", "1000"].iter().map(|f| f.to_string()).collect();
    let mut a = cluster.replica("a", tokens.clone(), (2000, 500), flags.clone()).await;
    let b = cluster.replica("b", tokens, (2000, 500), flags).await;
    put_definition(&mut a.sandboxes(&token).await, asking(&target, 120_000)).await;
    let mut runs_a = a.runs(&token).await;
    let mut run = Client::start(&mut runs_a, "ask-kill", dir.path(), std::slice::from_ref(&target)).await;
    std::fs::write(dir.path().join("go0"), b"").unwrap();
    let asked = waiting(&mut runs_a, "ask-kill").await;

    a.kill9().await;
    let mut runs_b = b.runs(&token).await;
    run.stream = sandhold_tests::run::attach_after(&mut runs_b, "ask-kill", &run.seen).await.unwrap();
    let still = waiting(&mut runs_b, "ask-kill").await;
    assert_eq!(still.request_id, asked.request_id, "the same request waits");
    answer(&mut runs_b, "ask-kill", &asked.request_id, true, "once").await;
    run.step = 1;
    assert_eq!(run.answered(0).await, "200 after the takeover", "{}", b.log_text());
    run.end().await;
    drop((a, b));
    cluster.tear_down().await;
}
