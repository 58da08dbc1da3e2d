//! A fleet for the tests: a control plane and `sandhold node`s, each node
//! in a network namespace of its own ([`Netns`]) joined to this host by a
//! veth pair whose addresses (in 10.213.0.0/16) exist only on that pair.
//! Nothing listens on any other address than those and loopback.
//!
//! [`Fleet`] owns everything it starts: nodes are killed, namespaces and
//! their veth pairs deleted, and the local sandboxes under its data dir
//! killed when it is dropped.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use shared::proto::v1 as api;

use crate::local::TestDir;
use crate::server::{ServerOptions, ServerProcess};
use crate::tls::TestCa;
use crate::wait::PATIENCE;

/// The port every node listens on inside its namespace.
pub const NODE_PORT: u16 = 7600;

fn ip(args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn must(args: &[&str]) {
    assert!(ip(args), "ip {}", args.join(" "));
}

/// A network namespace and the veth pair joining it to this host:
/// `host_ip` (10.213.N.1) on this side, `ns_ip` (10.213.N.2) inside, and a
/// route inside to the rest of 10.213.0.0/16 through this host (which holds
/// the control plane's address). Deleted on drop.
pub struct Netns {
    pub name: String,
    veth: String,
    pub host_ip: Ipv4Addr,
    pub ns_ip: Ipv4Addr,
}

impl Netns {
    /// Whether this process may make namespaces (root, `ip` present).
    pub fn available() -> bool {
        nix::unistd::geteuid().is_root() && ip(&["netns", "list"])
    }

    /// The first free pair number takes it: another test holding a pair's
    /// name makes `ip link add` fail, and the next number is tried.
    pub fn new() -> Self {
        for n in 1..=250u8 {
            let (veth, peer, name) = (format!("shf{n}h"), format!("shf{n}n"), format!("sandhold-fleet-{n}"));
            if !ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer]) {
                continue;
            }
            if !ip(&["netns", "add", &name]) {
                ip(&["link", "del", &veth]);
                continue;
            }
            let (host_ip, ns_ip) = (Ipv4Addr::new(10, 213, n, 1), Ipv4Addr::new(10, 213, n, 2));
            let ns = Self { name, veth, host_ip, ns_ip };
            must(&["link", "set", &peer, "netns", &ns.name]);
            must(&["addr", "add", &format!("{host_ip}/30"), "dev", &ns.veth]);
            must(&["link", "set", &ns.veth, "up"]);
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &ns.name, "ip"];
                all.extend_from_slice(args);
                must(&all);
            };
            inside(&["addr", "add", &format!("{ns_ip}/30"), "dev", &peer]);
            inside(&["link", "set", &peer, "up"]);
            inside(&["link", "set", "lo", "up"]);
            inside(&["route", "add", "10.213.0.0/16", "via", &host_ip.to_string()]);
            return ns;
        }
        panic!("no free veth pair number in 1..=250");
    }

    /// `ip netns exec NAME PROGRAM`.
    pub fn command(&self, program: &Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Cut the namespace off (its veth down): a partition.
    pub fn cut(&self) {
        must(&["link", "set", &self.veth, "down"]);
    }

    /// Join it again.
    pub fn heal(&self) {
        must(&["link", "set", &self.veth, "up"]);
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.name]);
        ip(&["link", "del", &self.veth]);
    }
}

/// What a node is started with.
#[derive(Clone, Debug, Default)]
pub struct NodeSpec {
    pub name: String,
    /// `--label K=V` flags.
    pub labels: Vec<String>,
    /// `--sandbox-slots`; `None`: the default.
    pub slots: Option<u32>,
    /// Offer Docker besides local.
    pub docker: bool,
    /// Present a certificate from another CA than the fleet's.
    pub other_ca: bool,
    /// Present another join token than the control plane's.
    pub wrong_join_token: bool,
}

/// A real `sandhold node` in its namespace: killed on drop, restartable.
pub struct Node {
    pub spec: NodeSpec,
    pub ns: Netns,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    child: Option<tokio::process::Child>,
}

impl Node {
    fn spawn(&mut self) {
        let mut cmd = self.ns.command(&crate::cli::sandhold_bin());
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("SANDHOLD_LOG", "info,control_plane=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap())
            .kill_on_drop(true);
        self.child = Some(cmd.spawn().expect("spawning sandhold node"));
    }

    /// SIGKILL, no goodbye (its sandboxes go on).
    pub async fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Start it again with the same flags and data dir.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "kill it first");
        self.spawn();
    }

    /// Until it exits (a node the control plane refused exits).
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        tokio::time::timeout(within, child.wait()).await.ok().map(|s| s.unwrap())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where its NodeService listens.
    pub fn address(&self) -> String {
        format!("https://{}:{NODE_PORT}", self.ns.ns_ip)
    }
}

/// A control plane (one `sandhold serve` with API tokens, listening on a
/// veth address of a namespace of its own) and its nodes.
pub struct Fleet {
    // Killed before anything else goes.
    pub nodes: Vec<Node>,
    pub server: ServerProcess,
    /// More replicas of the control plane ([`Fleet::start_replicated`]), on
    /// the same PostgreSQL database and Redis as `server`.
    pub replicas: Vec<ServerProcess>,
    /// Their database, dropped by [`Fleet::tear_down`].
    db: Option<crate::database::ScratchDatabase>,
    pub token: String,
    pub tenant: String,
    pub nonce: String,
    pub join_token: String,
    pub ca: TestCa,
    /// A CA nobody trusts.
    pub other_ca: TestCa,
    /// The control plane's client files towards nodes.
    pub cp_files: crate::tls::ServerFiles,
    hub: Netns,
    /// What the control plane was started with (more replicas start so).
    options: ServerOptions,
    // Last: kills the local sandboxes under it, then goes.
    dir: TestDir,
}

impl Fleet {
    /// `None` (the test skips) without root or `ip`, unless services are
    /// required. `extra` more `sandhold serve` flags.
    pub async fn start(prefix: &str, extra: &[&str]) -> Option<Self> {
        Self::start_with(prefix, extra, false, &[]).await
    }

    /// Two control-plane replicas (`server`, and `replicas[0]`; `extra` more
    /// flags of both) on a scratch PostgreSQL database and Redis, both on
    /// the veth address; nodes
    /// register through the first, and either dials any node. `None` (the
    /// test skips) as [`Fleet::start`], or without PostgreSQL and Redis.
    /// End it with [`Fleet::tear_down`].
    pub async fn start_replicated(prefix: &str, extra: &[&str]) -> Option<Self> {
        let (admin_url, redis_url) = (crate::services::postgres_url()?, crate::services::redis_url()?);
        let db = crate::database::ScratchDatabase::create(&admin_url).await.unwrap();
        let mut fleet =
            Self::start_deployment(prefix, extra, false, &[], Some((db.url(), &redis_url))).await?;
        let mut options = fleet.options.clone();
        options.replica_id = Some(format!("b-{}", fleet.nonce));
        fleet.replicas.push(ServerProcess::start(&options).await);
        fleet.db = Some(db);
        Some(fleet)
    }

    /// Drop the replicas' scratch database (after everything else stopped).
    pub async fn tear_down(mut self) {
        let db = self.db.take();
        drop(self);
        if let Some(db) = db {
            let _ = db.drop_database().await;
        }
    }

    /// As [`Fleet::start`], with `others` more tenants (`<name><nonce>`,
    /// token `<name>-<nonce>`, as [`crate::server::TenantServer`]'s).
    pub async fn start_with_others(prefix: &str, others: &[&str]) -> Option<Self> {
        Self::start_with(prefix, &[], false, others).await
    }

    /// As [`Fleet::start`], the control plane presenting nodes a
    /// certificate from another CA than the one they trust.
    pub async fn start_presenting_another_ca(prefix: &str) -> Option<Self> {
        Self::start_with(prefix, &[], true, &[]).await
    }

    async fn start_with(prefix: &str, extra: &[&str], cp_other_ca: bool, others: &[&str]) -> Option<Self> {
        Self::start_deployment(prefix, extra, cp_other_ca, others, None).await
    }

    /// `shared`: the replicas' database and Redis URLs (else the embedded
    /// stores).
    async fn start_deployment(
        prefix: &str,
        extra: &[&str],
        cp_other_ca: bool,
        others: &[&str],
        shared: Option<(&str, &str)>,
    ) -> Option<Self> {
        if !Netns::available() {
            assert!(!crate::services::required(), "fleet tests need root and `ip netns`");
            eprintln!("skipping: fleet tests need root and `ip netns`");
            return None;
        }
        let dir = TestDir::new(prefix);
        let hub = Netns::new();
        let ca = TestCa::new("fleet ca");
        let other_ca = TestCa::new("another ca");
        let cp_dir = dir.path().join("cp-tls");
        std::fs::create_dir_all(&cp_dir).unwrap();
        let cp_files = ca.write(&cp_dir, &ca.leaf_for(&["control-plane"], 1));
        if cp_other_ca {
            other_ca.leaf_for(&["control-plane"], 1).write(&cp_files);
        }
        let nonce = crate::nonce();
        let (tenant, token, join_token) =
            (format!("t{nonce}"), format!("tok-{nonce}"), format!("join-{nonce}"));
        let join_file = dir.path().join("join-token");
        std::fs::write(&join_file, &join_token).unwrap();
        std::fs::set_permissions(&join_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let mut options = ServerOptions {
            data_dir: dir.path().join("cp"),
            tokens: std::iter::once(format!("{tenant}={token}"))
                .chain(others.iter().map(|o| format!("{o}{nonce}={o}-{nonce}")))
                .collect(),
            listen_ip: Some(IpAddr::V4(hub.host_ip)),
            database_url: shared.map(|(db, _)| db.to_string()),
            redis_url: shared.map(|(_, redis)| redis.to_string()),
            replica_id: shared.map(|_| format!("a-{nonce}")),
            ..Default::default()
        };
        let path = |p: &Path| p.display().to_string();
        options.extra_args = [
            "--insecure-listen",
            "--operator-tenant",
            &tenant,
            "--node-join-token-file",
            &path(&join_file),
            "--node-tls-cert",
            &path(&cp_files.cert),
            "--node-tls-key",
            &path(&cp_files.key),
            "--node-tls-ca",
            &path(&cp_files.ca),
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().map(|s| s.to_string()))
        .collect();
        let server = ServerProcess::start(&options).await;
        Some(Self {
            nodes: Vec::new(),
            server,
            replicas: Vec::new(),
            db: None,
            options,
            token,
            tenant,
            nonce,
            join_token,
            ca,
            other_ca,
            cp_files,
            hub,
            dir,
        })
    }

    /// Start a node in a namespace of its own; returns its index.
    pub fn add_node(&mut self, spec: NodeSpec) -> usize {
        let ns = Netns::new();
        let data_dir = self.dir.path().join(&spec.name);
        let tls_dir = data_dir.join("tls");
        std::fs::create_dir_all(&tls_dir).unwrap();
        let ns_ip = ns.ns_ip.to_string();
        let issuer = if spec.other_ca { &self.other_ca } else { &self.ca };
        let files = issuer.write(&tls_dir, &issuer.leaf_for(&[&ns_ip], 2 + self.nodes.len() as u64));
        // Whatever its own certificate, a node trusts the fleet's CA for
        // the control plane.
        std::fs::write(&files.ca, self.ca.pem()).unwrap();
        let agent = crate::agent::static_agent();
        let mut args: Vec<OsString> =
            vec!["node".into(), "--listen".into(), format!("{ns_ip}:{NODE_PORT}").into()];
        args.extend(["--advertise".into(), format!("https://{ns_ip}:{NODE_PORT}").into()]);
        args.extend(["--server".into(), format!("http://{}", self.server.addr).into()]);
        args.extend(["--name".into(), spec.name.clone().into()]);
        for label in &spec.labels {
            args.extend(["--label".into(), label.into()]);
        }
        args.extend([
            "--tls-cert".into(),
            files.cert.into_os_string(),
            "--tls-key".into(),
            files.key.into_os_string(),
        ]);
        args.extend(["--tls-ca".into(), files.ca.into_os_string()]);
        args.extend(["--data-dir".into(), data_dir.clone().into_os_string()]);
        args.extend(["--agent-binary".into(), agent.clone().into_os_string()]);
        args.extend(["--agent-static-binary".into(), agent.into_os_string()]);
        args.extend(["--provider".into(), if spec.docker { "local,docker" } else { "local" }.into()]);
        if let Some(slots) = spec.slots {
            args.extend(["--sandbox-slots".into(), slots.to_string().into()]);
        }
        let log = self.dir.path().join(format!("{}.log", spec.name));
        let token =
            if spec.wrong_join_token { format!("not-{}", self.join_token) } else { self.join_token.clone() };
        let env = vec![("SANDHOLD_NODE_JOIN_TOKEN".to_string(), token)];
        let mut node = Node { spec, ns, data_dir, log, args, env, child: None };
        node.spawn();
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// The nodes as the control plane lists them.
    pub async fn list(&self) -> Vec<api::Node> {
        let mut admin = self.server.admin(&self.token).await;
        admin.list_nodes(api::ListNodesRequest {}).await.unwrap().into_inner().nodes
    }

    /// Wait until `names` are all listed `state`.
    pub async fn wait_state(&self, names: &[&str], state: &str) -> Vec<api::Node> {
        let until = Instant::now() + PATIENCE;
        loop {
            let nodes = self.list().await;
            if names.iter().all(|n| nodes.iter().any(|m| m.name == *n && m.state == state)) {
                return nodes;
            }
            assert!(Instant::now() < until, "nodes {names:?} never {state}: {nodes:?}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The server's and every node's log, for a failure.
    pub fn logs(&self) -> String {
        let mut out = format!("--- control plane\n{}", tail(&self.server.log_text(), 60));
        for replica in &self.replicas {
            out.push_str(&format!("\n--- another replica\n{}", tail(&replica.log_text(), 40)));
        }
        for node in &self.nodes {
            out.push_str(&format!("\n--- {}\n{}", node.spec.name, tail(&node.log_text(), 40)));
        }
        out
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The namespace the control plane listens in (its veth address).
    pub fn hub(&self) -> &Netns {
        &self.hub
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A control plane with the test's tenant, wherever its sandboxes live:
/// one test body runs against a single host ([`crate::server::TenantServer`])
/// and against a fleet whose sandboxes are on a node in another namespace.
pub trait Served: Send + Sync {
    fn server(&self) -> &ServerProcess;
    fn token(&self) -> &str;
    fn tenant(&self) -> &str;
    /// The token of `other`, one of the tenants it was started with.
    fn token_of(&self, other: &str) -> String;
    /// What to print when the test fails.
    fn logs(&self) -> String;
    /// The network namespace its sandboxes live in; `None`: this host's.
    /// A server a sandbox dials directly (the fake model as a CLI's own
    /// base URL) must listen there.
    fn sandbox_netns(&self) -> Option<&str> {
        None
    }
}

impl Served for crate::server::TenantServer {
    fn server(&self) -> &ServerProcess {
        &self.server
    }
    fn token(&self) -> &str {
        &self.token
    }
    fn tenant(&self) -> &str {
        &self.tenant
    }
    fn token_of(&self, other: &str) -> String {
        crate::server::TenantServer::token_of(self, other)
    }
    fn logs(&self) -> String {
        self.server.log_text()
    }
}

impl Served for Fleet {
    fn server(&self) -> &ServerProcess {
        &self.server
    }
    fn token(&self) -> &str {
        &self.token
    }
    fn tenant(&self) -> &str {
        &self.tenant
    }
    fn token_of(&self, other: &str) -> String {
        format!("{other}-{}", self.nonce)
    }
    fn logs(&self) -> String {
        Fleet::logs(self)
    }
    fn sandbox_netns(&self) -> Option<&str> {
        self.nodes.first().map(|n| n.ns.name.as_str())
    }
}

/// Where a test's sandboxes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// On the server's own providers.
    SingleHost,
    /// On a node (local and Docker) in another network namespace.
    OnANode,
}

/// A control plane (tenants `others` besides the test's) whose sandboxes
/// live at `place`; `None`: the test skips (see [`Fleet::start`]).
pub async fn served(place: Place, prefix: &str, others: &[&str]) -> Option<Box<dyn Served>> {
    served_with(place, prefix, others, &[]).await
}

/// As [`served`], the control plane started with `extra` more flags.
pub async fn served_with(
    place: Place,
    prefix: &str,
    others: &[&str],
    extra: &[&str],
) -> Option<Box<dyn Served>> {
    match place {
        Place::SingleHost => {
            Some(Box::new(crate::server::TenantServer::start_full(prefix, others, None, None, extra).await))
        }
        Place::OnANode => {
            let mut fleet = Fleet::start_with(prefix, extra, false, others).await?;
            fleet.add_node(NodeSpec { name: "node-1".into(), docker: true, ..Default::default() });
            fleet.wait_state(&["node-1"], "ready").await;
            Some(Box::new(fleet))
        }
    }
}
