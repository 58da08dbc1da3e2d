//! Sandbox egress, carried by the control plane.
//!
//! A sandbox with no network still reaches two kinds of destination, both
//! through its agent's loopback listener (`EgressService`):
//! - its harness's model API, through the broker: the harness is given the
//!   broker's URL and a per-run placeholder key; the agent swaps in the
//!   real key (it holds it; no process in the sandbox does) and speaks TLS
//!   to the upstream itself;
//! - the hosts the definition's `network.allow_hosts` lists, through the
//!   proxy (`HTTPS_PROXY` / `HTTP_PROXY`).
//!
//! Every upstream connection rides a carrier ([`Carriers`]) that this
//! replica keeps open while it uses the sandbox; this side decides where a
//! connection may go ([`Plan`]) and reports each one ([`Connection`]),
//! refused ones included. Nothing here ever sees a key in the clear unless
//! the upstream is plain HTTP (then it passes as bytes).
//!
//! Design note: the key stays in the agent, so a run survives the death of
//! its driving replica without any secret stored: the next driver opens
//! new carriers and the agent goes on adding the key. The control plane
//! enforces the allowlist because nothing inside the sandbox is trusted.

mod carrier;
mod hosts;
mod limits;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use shared::policy::{Action, Effect, Policy, Rule};
use shared::proto::agent::v1 as agent;
use shared::proto::v1::SandboxDefinition;
use tokio::net::TcpStream;

pub use carrier::{Carriers, Connection};
pub use hosts::{HostPattern, is_private, resolve};
pub use limits::{EgressLimits, Limits, MAX_HOST, Slot};

use crate::agent::AgentClient;
use crate::harness::Harness;

pub use shared::chunk::{MODEL_UNAVAILABLE, SANDBOX_NETWORK};
/// How long a model upstream may stay unreachable when the definition
/// does not say.
pub const DEFAULT_MODEL_UNREACHABLE: Duration = Duration::from_secs(120);
/// Where the broker and proxy listen, as the sandbox sees it.
pub const LOOPBACK: &str = "127.0.0.1";
/// The longest reason an agent's refusal is recorded with.
const MAX_BLOCKED: usize = 300;

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Model,
    Proxy,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Model => "model",
            Purpose::Proxy => "proxy",
        }
    }

    fn from_wire(purpose: i32) -> Self {
        if purpose == agent::CarryPurpose::Model as i32 { Purpose::Model } else { Purpose::Proxy }
    }
}

/// A model upstream, parsed: where the broker sends a harness's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub harness: Harness,
    pub scheme: String,
    pub host: String,
    pub port: u16,
    /// The URL's path without a trailing `/` (e.g. `/v1`): the harness's
    /// base URL is the broker's origin plus this.
    pub path: String,
    pub key_secret: String,
}

impl Upstream {
    /// `url` (empty: the harness's public API) for `harness`.
    pub fn parse(harness: Harness, url: &str, key_secret: &str) -> Result<Self, String> {
        let Some(api) = harness.model_api() else {
            return Err(format!("the {} harness has no model API to broker", harness.name()));
        };
        let url = if url.is_empty() { api.default_upstream } else { url };
        let parsed = url::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        let scheme = parsed.scheme().to_string();
        if scheme != "http" && scheme != "https" {
            return Err(format!("{url:?}: the scheme must be http or https"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(format!("{url:?}: no credentials in the URL (name a secret in key_secret)"));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(format!("{url:?}: no query or fragment"));
        }
        let host = match parsed.host() {
            Some(url::Host::Domain(d)) => d.to_string(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
            None => return Err(format!("{url:?} has no host")),
        };
        let port = parsed.port_or_known_default().unwrap_or(443);
        Ok(Self {
            harness,
            scheme,
            host,
            port,
            path: parsed.path().trim_end_matches('/').to_string(),
            key_secret: key_secret.to_string(),
        })
    }

    /// What the upstream is called in events and errors (never a key).
    pub fn display(&self) -> String {
        format!("{}://{}:{}{}", self.scheme, self.host, self.port, self.path)
    }

    /// The agent's route for run `run_id` with `placeholder`: its answers
    /// metered under the run, refused past `budget`.
    pub fn route(
        &self,
        placeholder: &str,
        run_id: &str,
        budget: Option<agent::RouteBudget>,
    ) -> agent::EgressRoute {
        agent::EgressRoute {
            placeholder: placeholder.to_string(),
            scheme: self.scheme.clone(),
            host: self.host.trim_start_matches('[').trim_end_matches(']').to_string(),
            port: u32::from(self.port),
            secret_name: self.key_secret.clone(),
            label: self.harness.name().to_string(),
            run_id: run_id.to_string(),
            budget,
        }
    }
}

/// The model upstream `definition` gives `harness`, if it brokers one.
pub fn upstream_for(definition: &SandboxDefinition, harness: Harness) -> Result<Option<Upstream>, String> {
    definition
        .model_access
        .iter()
        .find(|m| m.harness == harness.name())
        .map(|m| Upstream::parse(harness, &m.upstream, &m.key_secret))
        .transpose()
}

/// Settle which secret is each harness's model key, so every client gets
/// the same answer: an entry with no `key_secret` takes the first of the
/// harness's key variables (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`, ...)
/// among the definition's `secret_names`. With none of them there is no key
/// to broker: the entry is dropped when it names no upstream either (the
/// CLI then uses whatever the image gives it), and refused when it does.
pub fn settle_model_keys(definition: &mut SandboxDefinition) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let names = definition.secret_names.clone();
    let mut keep = Vec::with_capacity(definition.model_access.len());
    for (i, mut m) in std::mem::take(&mut definition.model_access).into_iter().enumerate() {
        let api = Harness::parse(&m.harness).ok().and_then(|h| h.model_api());
        if let (true, Some(api)) = (m.key_secret.is_empty(), api) {
            match api.key_vars.iter().find(|v| names.iter().any(|n| n == *v)) {
                Some(v) => m.key_secret = v.to_string(),
                None if m.upstream.is_empty() => continue,
                None => out.push((
                    format!("definition.model_access[{i}].key_secret"),
                    format!(
                        "{} needs its model key as a secret the broker adds: name one of {} in secret_names",
                        m.harness,
                        api.key_vars.join(", ")
                    ),
                )),
            }
        }
        keep.push(m);
    }
    definition.model_access = keep;
    out
}

/// Secrets no process in the sandbox may see: the model keys and the
/// brokered credentials, which only the agent holds (a credential's
/// variable holds its placeholder instead, see [`Listening::env`]).
pub fn withheld(definition: &SandboxDefinition) -> BTreeSet<String> {
    let credentials = definition.network.iter().flat_map(|n| n.credentials.iter().map(|c| c.secret.clone()));
    definition.model_access.iter().map(|m| m.key_secret.clone()).chain(credentials).collect()
}

/// Whether `definition` needs the agent's egress listener at all.
pub fn wanted(definition: &SandboxDefinition) -> bool {
    !definition.model_access.is_empty() || proxied(definition)
}

/// Whether `definition`'s processes are given the proxy: it allows hosts,
/// or brokers credentials.
pub fn proxied(definition: &SandboxDefinition) -> bool {
    definition.network.as_ref().is_some_and(|n| {
        !n.allow_hosts.is_empty() || !n.credentials.is_empty() || !n.allow.is_empty() || !n.ask.is_empty()
    })
}

/// The agent's listener, as configured.
#[derive(Debug, Clone, Default)]
pub struct Listening {
    pub port: u16,
    /// Secret name -> the placeholder its variable holds.
    pub placeholders: Vec<(String, String)>,
    /// The interception CA's certificate and the bundle with it, when
    /// there are credentials.
    pub ca_cert: String,
    pub ca_bundle: String,
}

impl Listening {
    /// The environment of a process of `definition`: the proxy's variables
    /// (when it is proxied), the credentials' placeholders, and the
    /// variables TLS clients read their trusted roots from.
    pub fn env(&self, definition: &SandboxDefinition) -> Vec<(String, String)> {
        let mut env = if proxied(definition) { proxy_env(self.port) } else { Vec::new() };
        env.extend(self.placeholders.iter().cloned());
        if !self.ca_bundle.is_empty() {
            for name in ["SSL_CERT_FILE", "GIT_SSL_CAINFO", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"] {
                env.push((name.to_string(), self.ca_bundle.clone()));
            }
        }
        if !self.ca_cert.is_empty() {
            env.push(("NODE_EXTRA_CA_CERTS".to_string(), self.ca_cert.clone()));
        }
        env
    }
}

/// The model-unreachable bound of `definition`.
pub fn unreachable_after(definition: &SandboxDefinition) -> Duration {
    match definition.network.as_ref().map(|n| n.model_unreachable_ms) {
        Some(ms) if ms > 0 => Duration::from_millis(ms),
        _ => DEFAULT_MODEL_UNREACHABLE,
    }
}

/// A sandbox's live host rules (`UpdateNetworkPolicy`), read at each
/// connection so a change reaches every replica's carriers at once.
#[async_trait::async_trait]
pub trait LiveRules: Send + Sync {
    /// The rules now; `Err` says why they could not be read (the
    /// connection is then refused: a deny must not be missed).
    async fn now(&self) -> Result<LiveHosts, String>;
}

/// Host patterns allowed and denied on top of a definition's rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveHosts {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

impl LiveHosts {
    /// The rules they add: a host rule each (any method, any path).
    fn rules(&self) -> Vec<Rule> {
        let each = |hosts: &[String], effect: Effect| {
            hosts
                .iter()
                .filter_map(|h| HostPattern::parse(h).ok())
                .map(|host| Rule {
                    action: Action::Request,
                    pattern: shared::hosts::request_pattern(&host, &[], None),
                    effect,
                })
                .collect::<Vec<_>>()
        };
        let mut rules = each(&self.allow, Effect::Allow);
        rules.extend(each(&self.deny, Effect::Deny));
        rules
    }
}

/// The network requests of the run a plan serves (`network.ask`): a
/// destination under an ask rule is asked in this run, and a dial that
/// says its request was answered is checked here before it connects.
#[async_trait::async_trait]
pub trait RunAsks: Send + Sync {
    /// The run whose request dir an ask goes to.
    fn run_id(&self) -> String;
    /// Whether request `request_id` of run `run_id` was answered allow for
    /// `dial`'s destination, and its scope covers a connection carried for
    /// this run; `Err` says why not.
    async fn check(&self, run_id: &str, request_id: &str, dial: &agent::CarryDial) -> Result<(), String>;
}

/// What the rules make of a destination they do not refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Allow,
    /// An ask rule matched (its text).
    Ask(String),
}

/// Where one sandbox's egress may go.
#[derive(Clone)]
pub struct Plan {
    /// `network.allow_hosts`, the credentials' hosts, and `network.allow`,
    /// `ask` and `deny`, as `shared::policy` request rules (default deny).
    rules: Policy,
    /// The hosts some rule judges by method or path: their connections are
    /// intercepted, one dial per request, never a blind tunnel.
    judged: Vec<HostPattern>,
    models: Vec<Upstream>,
    private_ok: bool,
    limits: Limits,
    /// The sandbox's live rules, when it has a record to keep them in.
    live: Option<Arc<dyn LiveRules>>,
    /// The run that asks, for a run's plan (setup's has none: an ask
    /// refuses there).
    asks: Option<Arc<dyn RunAsks>>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("rules", &self.rules)
            .field("judged", &self.judged)
            .field("models", &self.models)
            .field("private_ok", &self.private_ok)
            .field("live", &self.live.is_some())
            .field("asks", &self.asks.is_some())
            .finish()
    }
}

/// Why a connection was not made.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub reason: String,
    /// The plan refused it (as opposed to a failed connection).
    pub refused: bool,
    /// Not refused but asked: the agent asks in this run and dials again.
    pub ask: Option<agent::CarryAsk>,
}

impl Plan {
    /// The plan of a `definition` under the operator's `private_ok`, its
    /// connections held within `limits` (its sandbox's and tenant's).
    /// Patterns were validated with the definition; one that does not parse
    /// now is skipped (it allows nothing).
    pub fn of(definition: &SandboxDefinition, private_ok: bool, limits: Limits) -> Self {
        let network = definition.network.clone().unwrap_or_default();
        let (rules, judged) = rules_of(&network);
        let models = definition
            .model_access
            .iter()
            .filter_map(|m| {
                Upstream::parse(Harness::parse(&m.harness).ok()?, &m.upstream, &m.key_secret).ok()
            })
            .collect();
        Self { rules, judged, models, private_ok, limits, live: None, asks: None }
    }

    /// The same plan, its asks made in (and checked against) a run.
    pub fn with_asks(mut self, asks: Arc<dyn RunAsks>) -> Self {
        self.asks = Some(asks);
        self
    }

    /// The same plan, each proxy connection also judged by the sandbox's
    /// live rules as `live` reads them then.
    pub fn with_live(mut self, live: Arc<dyn LiveRules>) -> Self {
        self.live = Some(live);
        self
    }

    /// Whether the plan, with `live` rules on top of the definition's, lets
    /// the sandbox's proxy reach `host:port` with `request` (method and
    /// target; `None`: a tunnel); `Err` says why not.
    fn judge(
        &self,
        host: &str,
        port: u16,
        request: Option<(&str, &str)>,
        live: &LiveHosts,
    ) -> Result<Verdict, String> {
        let subject = match request {
            None if self.judged.iter().any(|p| p.matches(host, port)) => {
                return Err(format!(
                    "{host}:{port}: the sandbox's rules judge its requests by method and path, so a tunnel there is \
                     refused (its https is intercepted)"
                ));
            }
            None => shared::hosts::request_subject("CONNECT", host, port, "/"),
            Some((method, target)) => {
                let path =
                    shared::hosts::normal_path(target).map_err(|why| format!("{host}:{port}: {why}"))?;
                shared::hosts::request_subject(method, host, port, &path)
            }
        };
        let live_rules = live.rules();
        let decision = if live_rules.is_empty() {
            self.rules.decide(Action::Request, &subject)
        } else {
            let mut rules = self.rules.clone();
            rules.rules.extend(live_rules.iter().cloned());
            rules.decide(Action::Request, &subject)
        };
        let what = match request {
            Some((method, target)) => format!("{method} {host}:{port}{target}"),
            None => format!("{host}:{port}"),
        };
        match decision.effect {
            Effect::Allow => Ok(Verdict::Allow),
            Effect::Deny if decision.rule == "default" => {
                Err(format!("{what} is not on the sandbox's allowlist"))
            }
            Effect::Deny
                if live_rules.iter().any(|r| r.effect == Effect::Deny && r.to_string() == decision.rule) =>
            {
                Err(format!(
                    "{what} is refused by the sandbox's live rule `{}` (UpdateNetworkPolicy)",
                    decision.rule
                ))
            }
            Effect::Deny => Err(format!("{what} is refused by the rule `{}`", decision.rule)),
            Effect::Ask => Ok(Verdict::Ask(decision.rule)),
        }
    }

    /// A place for one more open connection under the sandbox's and the
    /// tenant's limits.
    fn admit(&self) -> Result<Slot, Refusal> {
        self.limits.admit().map_err(|reason| Refusal { reason, refused: true, ask: None })
    }

    /// Check `dial` and connect to it.
    async fn connect(&self, dial: &agent::CarryDial, timeout: Duration) -> Result<TcpStream, Refusal> {
        let refuse = |reason: String| Refusal { reason, refused: true, ask: None };
        let port =
            u16::try_from(dial.port).ok().filter(|p| *p > 0).ok_or_else(|| refuse("no port".into()))?;
        let host = dial.host.as_str();
        if host.len() > MAX_HOST {
            return Err(refuse(format!("a host name is {MAX_HOST} bytes at most")));
        }
        if !dial.blocked.is_empty() {
            // The agent refused a request itself; this is its record.
            let why: String = dial.blocked.chars().take(MAX_BLOCKED).collect();
            return Err(refuse(format!("blocked by the sandbox's agent: {why}")));
        }
        let allowed = match Purpose::from_wire(dial.purpose) {
            Purpose::Model => self.models.iter().any(|m| {
                m.harness.name() == dial.route
                    && m.host.trim_start_matches('[').trim_end_matches(']') == host
                    && m.port == port
            }),
            Purpose::Proxy => {
                let request = (!dial.method.is_empty()).then_some((dial.method.as_str(), dial.path.as_str()));
                let live = match &self.live {
                    Some(live) => live.now().await.map_err(|why| {
                        refuse(format!(
                            "{host}:{port}: the sandbox's live network rules could not be read: {why}"
                        ))
                    })?,
                    None => LiveHosts::default(),
                };
                if let Verdict::Ask(rule) = self.judge(host, port, request, &live).map_err(refuse)? {
                    let what = format!("{host}:{port}: under the ask rule `{rule}`");
                    match &self.asks {
                        None => return Err(refuse(format!("{what}, and only a run's connections can ask"))),
                        Some(asks) if dial.request_id.is_empty() => {
                            let ask = agent::CarryAsk { run_id: asks.run_id(), rule };
                            return Err(Refusal {
                                reason: format!("{what}: asked"),
                                refused: true,
                                ask: Some(ask),
                            });
                        }
                        Some(asks) => asks
                            .check(&dial.request_run_id, &dial.request_id, dial)
                            .await
                            .map_err(|why| refuse(format!("{what}: {why}")))?,
                    }
                }
                true
            }
        };
        if !allowed {
            return Err(refuse(format!("{host}:{port} is not on the sandbox's allowlist")));
        }
        let addrs = resolve(host, port, self.private_ok).await.map_err(refuse)?;
        let failed = |reason: String| Refusal { reason, refused: false, ask: None };
        let mut last = String::new();
        for addr in addrs {
            match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(e)) => last = format!("connecting to {host}:{port} ({addr}): {e}"),
                Err(_) => last = format!("connecting to {host}:{port} ({addr}): timed out after {timeout:?}"),
            }
        }
        Err(failed(last))
    }
}

/// The request rules of `network` (see [`Plan`]) and the hosts judged by
/// method or path. A pattern that does not parse now (they were validated
/// with the definition) is left out: it allows nothing, and a deny or ask
/// of it becomes a deny of every host.
fn rules_of(network: &shared::proto::v1::Network) -> (Policy, Vec<HostPattern>) {
    let mut rules = Vec::new();
    let hosts = network.allow_hosts.iter().chain(network.credentials.iter().flat_map(|c| c.hosts.iter()));
    for host in hosts.filter_map(|h| HostPattern::parse(h).ok()) {
        let pattern = shared::hosts::request_pattern(&host, &[], None);
        rules.push(Rule { action: Action::Request, pattern, effect: Effect::Allow });
    }
    let mut judged = Vec::new();
    for (effect, list) in
        [(Effect::Allow, &network.allow), (Effect::Ask, &network.ask), (Effect::Deny, &network.deny)]
    {
        for r in list {
            let host = match HostPattern::parse(&r.host) {
                Ok(host) => host,
                Err(_) if effect == Effect::Allow => continue,
                Err(_) => HostPattern::parse("*").expect("a pattern"),
            };
            if !r.methods.is_empty() || !r.path.is_empty() {
                judged.push(host.clone());
            }
            let path = (!r.path.is_empty()).then_some(r.path.as_str());
            let pattern = shared::hosts::request_pattern(&host, &r.methods, path);
            rules.push(Rule { action: Action::Request, pattern, effect });
        }
    }
    (Policy { default: Effect::Deny, rules, ..Default::default() }, judged)
}

/// The host patterns whose https the agent intercepts so each request is
/// judged: those of rules with methods or a path.
pub fn judged_hosts(definition: &SandboxDefinition) -> Vec<String> {
    let network = definition.network.clone().unwrap_or_default();
    network
        .allow
        .iter()
        .chain(&network.ask)
        .chain(&network.deny)
        .filter(|r| !r.methods.is_empty() || !r.path.is_empty())
        .map(|r| r.host.clone())
        .collect()
}

/// Configure the agent's listener for `definition` (and `routes`, for a
/// run). An agent without egress is refused with what to do.
pub async fn configure(
    agent: &AgentClient,
    definition: &SandboxDefinition,
    routes: Vec<agent::EgressRoute>,
) -> Result<Listening, tonic::Status> {
    let caps = agent.handshake().capabilities.unwrap_or_default();
    if !caps.egress {
        return Err(tonic::Status::failed_precondition(
            "the sandbox's agent has no egress listener (an older sandhold-agent): model access and \
             network.allow_hosts need this version's agent",
        ));
    }
    let network = definition.network.clone().unwrap_or_default();
    let credentials = network
        .credentials
        .iter()
        .map(|c| agent::EgressCredential {
            secret_name: c.secret.clone(),
            hosts: c.hosts.clone(),
            header: c.header.clone(),
            format: c.format.clone(),
            basic: c.basic,
            username: c.username.clone(),
        })
        .collect();
    let request = agent::ConfigureEgressRequest {
        routes,
        extra_roots_pem: network.extra_roots_pem.clone(),
        credentials,
        intercept_hosts: judged_hosts(definition)
            .into_iter()
            .filter(|h| HostPattern::parse(h).is_ok())
            .collect(),
    };
    let answer = agent.egress().configure(request).await?.into_inner();
    let port = u16::try_from(answer.port).map_err(|_| {
        tonic::Status::internal(format!("the agent's egress port {} is not a port", answer.port))
    })?;
    let placeholders = network
        .credentials
        .iter()
        .map(|c| match answer.placeholders.get(&c.secret) {
            Some(p) => Ok((c.secret.clone(), p.clone())),
            None => Err(tonic::Status::internal(format!(
                "the agent gave the credential {} no placeholder",
                c.secret
            ))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Listening { port, placeholders, ca_cert: answer.ca_cert_path, ca_bundle: answer.ca_bundle_path })
}

/// The environment of every process that should use the proxy.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://{LOOPBACK}:{port}");
    let no_proxy = "127.0.0.1,localhost,::1".to_string();
    vec![
        ("HTTPS_PROXY".into(), url.clone()),
        ("HTTP_PROXY".into(), url.clone()),
        ("https_proxy".into(), url.clone()),
        ("http_proxy".into(), url),
        ("NO_PROXY".into(), no_proxy.clone()),
        ("no_proxy".into(), no_proxy),
    ]
}

/// A fresh placeholder key for one run: worthless outside the sandbox's
/// broker, and shaped so no CLI refuses it.
pub fn placeholder() -> String {
    format!("sandhold-placeholder-{}", uuid::Uuid::new_v4().simple())
}

/// Refusals of `definition`'s model access and network against the
/// operator's host patterns: `(field, why)`.
pub fn violations(definition: &SandboxDefinition, operator_hosts: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, m) in definition.model_access.iter().enumerate() {
        let field = format!("definition.model_access[{i}]");
        let harness = match Harness::parse(&m.harness) {
            Ok(h) => h,
            Err(e) => {
                out.push((format!("{field}.harness"), e.to_string()));
                continue;
            }
        };
        if !seen.insert(harness.name()) {
            out.push((format!("{field}.harness"), format!("{} has model access twice", m.harness)));
        }
        if let Err(why) = Upstream::parse(harness, &m.upstream, &m.key_secret) {
            out.push((format!("{field}.upstream"), why));
        }
        if m.key_secret.is_empty() {
            out.push((
                format!("{field}.key_secret"),
                "required: the name of the secret holding the key".into(),
            ));
        } else if !definition.secret_names.contains(&m.key_secret) {
            out.push((
                format!("{field}.key_secret"),
                format!("{:?} is not one of the definition's secret_names", m.key_secret),
            ));
        }
    }
    let operator: Vec<HostPattern> =
        operator_hosts.iter().filter_map(|p| HostPattern::parse(p).ok()).collect();
    if let Some(network) = &definition.network {
        for (i, text) in network.allow_hosts.iter().enumerate() {
            let field = format!("definition.network.allow_hosts[{i}]");
            match HostPattern::parse(text) {
                Err(why) => out.push((field, why)),
                Ok(p) if !p.within(&operator) => out.push((
                    field,
                    format!("{text:?} is outside the hosts the operator allows (egress_hosts)"),
                )),
                Ok(_) => {}
            }
        }
        let models: BTreeSet<&str> = definition.model_access.iter().map(|m| m.key_secret.as_str()).collect();
        let mut credentials = BTreeSet::new();
        for (i, c) in network.credentials.iter().enumerate() {
            let field = |name: &str| format!("definition.network.credentials[{i}].{name}");
            if !definition.secret_names.contains(&c.secret) {
                out.push((
                    field("secret"),
                    format!("{:?} is not one of the definition's secret_names", c.secret),
                ));
            } else if models.contains(c.secret.as_str()) {
                out.push((field("secret"), format!("{} is already a model key (model_access)", c.secret)));
            } else if !credentials.insert(c.secret.as_str()) {
                out.push((field("secret"), format!("{} is a credential twice", c.secret)));
            }
            if c.hosts.is_empty() {
                out.push((field("hosts"), "at least one host it may be sent to".into()));
            }
            for (j, text) in c.hosts.iter().enumerate() {
                match HostPattern::parse(text) {
                    Err(why) => out.push((format!("{}[{j}]", field("hosts")), why)),
                    Ok(p) if !p.within(&operator) => out.push((
                        format!("{}[{j}]", field("hosts")),
                        format!("{text:?} is outside the hosts the operator allows (egress_hosts)"),
                    )),
                    Ok(_) => {}
                }
            }
            if !c.header.is_empty() && http::HeaderName::from_bytes(c.header.as_bytes()).is_err() {
                out.push((field("header"), format!("{:?} is not a header name", c.header)));
            }
            if c.basic && (!c.format.is_empty() || !c.header.is_empty()) {
                out.push((
                    field("basic"),
                    "HTTP basic is sent in Authorization: no header or format with it".into(),
                ));
            }
            if !c.format.is_empty()
                && (c.format.matches("{}").count() != 1
                    || http::HeaderValue::from_str(&c.format.replace("{}", "x")).is_err())
            {
                out.push((field("format"), "a header value with one `{}` standing for the secret".into()));
            }
            if !c.basic && !c.username.is_empty() {
                out.push((field("username"), "only with basic".into()));
            }
            if c.username.contains(':') {
                out.push((field("username"), "no `:` in a basic user name".into()));
            }
        }
        for (name, list) in [("allow", &network.allow), ("ask", &network.ask), ("deny", &network.deny)] {
            for (i, r) in list.iter().enumerate() {
                let field = |f: &str| format!("definition.network.{name}[{i}].{f}");
                match HostPattern::parse(&r.host) {
                    Err(why) => out.push((field("host"), why)),
                    Ok(p) if name == "allow" && !p.within(&operator) => out.push((
                        field("host"),
                        format!("{:?} is outside the hosts the operator allows (egress_hosts)", r.host),
                    )),
                    Ok(_) => {}
                }
                for (j, m) in r.methods.iter().enumerate() {
                    if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                        out.push((
                            format!("{}[{j}]", field("methods")),
                            format!("{m:?}: an upper-case HTTP method"),
                        ));
                    }
                }
                if !r.path.is_empty() {
                    let rule =
                        Rule { action: Action::Request, pattern: r.path.clone(), effect: Effect::Deny };
                    if !r.path.starts_with('/') {
                        out.push((field("path"), format!("{:?}: a glob over an absolute path", r.path)));
                    } else if let Err(e) = (Policy { rules: vec![rule], ..Default::default() }).validate() {
                        out.push((field("path"), e.to_string()));
                    }
                }
            }
        }
        if !network.extra_roots_pem.is_empty()
            && !network.extra_roots_pem.contains("-----BEGIN CERTIFICATE-----")
        {
            out.push(("definition.network.extra_roots_pem".into(), "no PEM certificate in it".into()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use shared::proto::v1 as api;

    use super::*;

    fn rule(host: &str, methods: &[&str], path: &str) -> api::NetworkRule {
        api::NetworkRule {
            host: host.into(),
            methods: methods.iter().map(|m| m.to_string()).collect(),
            path: path.into(),
        }
    }

    /// Rules by method and path: deny > allow, the path judged decoded and
    /// refused with dot segments, a tunnel to a judged host refused.
    #[test]
    fn requests_are_judged_by_method_and_path() {
        let definition = SandboxDefinition {
            network: Some(api::Network {
                allow_hosts: vec!["registry.npmjs.org".into(), "evil.example".into()],
                allow: vec![rule("api.github.com", &["GET"], "/repos/acme/**")],
                deny: vec![
                    rule("evil.example", &[], ""),
                    rule("api.github.com", &[], "/repos/acme/secret/**"),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let plan = Plan::of(&definition, false, EgressLimits::new(0, 0).sandbox("t"));
        let none = LiveHosts::default();
        let judge =
            |host: &str, port: u16, request: Option<(&str, &str)>| plan.judge(host, port, request, &none);
        assert_eq!(judge("api.github.com", 443, Some(("GET", "/repos/acme/x"))), Ok(Verdict::Allow));
        judge("api.github.com", 443, Some(("GET", "/repos/acme/x/pulls?state=open"))).unwrap();
        for (method, target) in [
            ("POST", "/repos/acme/x"),
            ("GET", "/repos/other/x"),
            ("GET", "/repos/acme/secret/key"),
            ("GET", "/repos/acme/x/../../other/x"),
            ("GET", "/repos/acme/%2e%2e/other"),
            ("GET", "/repos/acme%2Fx"),
        ] {
            let refused = judge("api.github.com", 443, Some((method, target))).unwrap_err();
            assert!(refused.contains("api.github.com"), "{method} {target}: {refused}");
        }
        let blind = judge("api.github.com", 443, None).unwrap_err();
        assert!(blind.contains("tunnel there is refused"), "{blind}");
        judge("registry.npmjs.org", 443, None).unwrap();
        judge("registry.npmjs.org", 80, Some(("POST", "/-/v1/login"))).unwrap();
        let denied = judge("evil.example", 443, None).unwrap_err();
        assert!(denied.contains("refused by the rule"), "{denied}");
        let off_list = judge("other.example", 443, None).unwrap_err();
        assert!(off_list.contains("not on the sandbox's allowlist"), "{off_list}");
        assert_eq!(judged_hosts(&definition), ["api.github.com", "api.github.com"]);
    }
}
