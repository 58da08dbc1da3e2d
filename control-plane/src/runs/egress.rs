//! A run's egress: its CLI pointed at the sandbox's model broker, the
//! proxy's environment, the carriers its driver keeps open, and what the
//! run's log says about its connections (`sandbox.network`,
//! `model.unavailable`, and the MODEL_UNREACHABLE ending).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;

use shared::chunk::{ChunkFactory, NETWORK_BLOCKED};
use shared::proto::v1::{Chunk, SandboxDefinition};

use super::Error;
use super::usage::RunBudget;
use crate::agent::AgentClient;
use crate::egress::{self, Connection, LOOPBACK, Plan, Purpose, Upstream};
use crate::harness::{CommandSpec, Harness};
use crate::sandbox::RunSandbox;

/// Refused destinations recorded one by one; refusals past them are
/// counted and folded into one record every [`FOLD_EVERY`].
const DISTINCT_REFUSALS: usize = 32;
const FOLD_EVERY: u64 = 100;

/// What a driver needs to serve a run's egress.
#[derive(Debug, Clone)]
pub(super) struct RunEgress {
    pub plan: Arc<Plan>,
    pub upstream: Option<Upstream>,
    pub unreachable_after: Duration,
    /// What the run's connection records may add to its stored log: the
    /// run's journal cap, so a sandbox dialing without end cannot grow the
    /// log past what its own output may.
    pub log_budget: u64,
}

impl RunEgress {
    /// The egress of `tenant`'s run of `harness` in sandbox `key` under
    /// `definition`, if it has any, within the operator's bounds as the
    /// sandbox port tells them, and the sandbox's live rules.
    pub fn of(
        definition: &SandboxDefinition,
        harness: Harness,
        sandbox: &RunSandbox,
        (tenant, key): (&str, &str),
    ) -> Result<Option<Self>, Error> {
        if !egress::wanted(definition) {
            return Ok(None);
        }
        let upstream = egress::upstream_for(definition, harness).map_err(Error::Egress)?;
        Ok(Some(Self {
            plan: Arc::new(
                Plan::of(definition, sandbox.egress_private_addresses(), sandbox.egress_limits(tenant))
                    .with_live(sandbox.live_rules(key)),
            ),
            upstream,
            unreachable_after: egress::unreachable_after(definition),
            log_budget: sandbox.journal_cap(definition),
        }))
    }
}

impl RunEgress {
    /// The same egress, its asks made in `asks`'s run.
    pub fn asking(mut self, asks: Arc<dyn egress::RunAsks>) -> Self {
        self.plan = Arc::new((*self.plan).clone().with_asks(asks));
        self
    }
}

/// How long a dial after an answer waits for the answer to reach the
/// run's log (the driver records it as it follows the journal).
pub(crate) const ANSWER_INDEXED_WITHIN: Duration = Duration::from_secs(15);

/// A run's network asks, checked against its stored log's request index.
pub(crate) struct StoredAsks {
    pub events: Arc<dyn crate::store::EventLog>,
    pub runs: Arc<dyn crate::store::RunStore>,
    /// The run the plan serves, and its thread.
    pub key: crate::store::RunKey,
    pub thread: String,
    /// How long an answer may take to be indexed ([`ANSWER_INDEXED_WITHIN`]).
    pub wait: Duration,
}

#[async_trait::async_trait]
impl egress::RunAsks for StoredAsks {
    fn run_id(&self) -> String {
        self.key.run.to_string()
    }

    async fn check(
        &self,
        run_id: &str,
        request_id: &str,
        dial: &shared::proto::agent::v1::CarryDial,
    ) -> Result<(), String> {
        let run = shared::ids::RunId::parse(run_id).map_err(|e| format!("request {request_id}: {e}"))?;
        let key = crate::store::RunKey::new(self.key.tenant.clone(), run);
        let same_run = key == self.key;
        if !same_run {
            let record = self.runs.get(&key).await.map_err(|e| format!("request {request_id}: {e}"))?;
            if record.thread_id != self.thread {
                return Err(format!("request {request_id} was asked in another thread"));
            }
        }
        let waited = Instant::now();
        let (asked, answered) = loop {
            let indexed = self.events.request(&key, request_id).await.map_err(|e| e.to_string())?;
            match indexed {
                Some(i) if i.answered.is_some() => break (i.asked, i.answered.expect("answered")),
                Some(_) | None if waited.elapsed() < self.wait => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                _ => return Err(format!("request {request_id} has no recorded answer")),
            }
        };
        let decode = |c| super::log::decode_chunk(c).map_err(|e| e.to_string());
        let (asked, answered) = (decode(&asked)?, decode(&answered)?);
        let (Some(q), Some(a)) = (asked.request, answered.request) else {
            return Err(format!("request {request_id} is not a request"));
        };
        if q.kind != "network" || !a.allowed {
            return Err(format!("request {request_id} is no allowed network request"));
        }
        let input: serde_json::Value = serde_json::from_str(&q.input_json).unwrap_or_default();
        let same_place = input["host"] == dial.host.as_str() && input["port"] == dial.port;
        let same_request = input["method"] == dial.method.as_str() && input["path"] == dial.path.as_str();
        let covered = match a.scope.as_str() {
            "thread" => same_place,
            "run" => same_place && same_run,
            _ => same_place && same_run && same_request,
        };
        if !covered {
            return Err(format!("the answer of request {request_id} does not cover this connection"));
        }
        Ok(())
    }
}

/// Configure the sandbox's listener with this run's route and point
/// `command` at it: the broker's URL and a placeholder key for the CLI,
/// the proxy's variables when the definition allows hosts. The route
/// meters the run's answers, and refuses requests past `budget`.
pub(super) async fn point(
    egress: &RunEgress,
    definition: &SandboxDefinition,
    (harness, run_id, budget): (Harness, &str, Option<RunBudget>),
    agent: &AgentClient,
    command: &mut CommandSpec,
) -> Result<(), Error> {
    let placeholder = egress::placeholder();
    let budget = budget.map(|b| b.route());
    let routes = egress.upstream.iter().map(|u| u.route(&placeholder, run_id, budget)).collect();
    let listening = egress::configure(agent, definition, routes).await.map_err(Error::StartRefused)?;
    if let Some(upstream) = &egress.upstream {
        let base = format!("http://{LOOPBACK}:{}{}", listening.port, upstream.path);
        harness.point_at(command, &base, &placeholder);
    }
    for (name, value) in listening.env(definition) {
        command.env.entry(name).or_insert(value);
    }
    Ok(())
}

/// Whether the run's model upstream answers, as its connections tell, and
/// what of its connections goes into the run's log: refusals coalesced,
/// everything within the run's log budget.
#[derive(Debug, Default)]
pub(super) struct ModelHealth {
    /// Since when every attempt failed, and the last failure.
    failing: Option<(Instant, String)>,
    budget: u64,
    spent: u64,
    /// Refused destinations recorded in full so far.
    refused: HashSet<(String, u16)>,
    /// Refusals since the last one recorded.
    folded: u64,
    /// The budget ran out (said once in the server's log).
    over: bool,
    /// Refused connections per destination (the first [`BLOCKED_LISTED`]),
    /// and how many more, for the run's `network.blocked` summary.
    blocked: BTreeMap<(String, u16), u64>,
    blocked_other: u64,
}

/// Destinations a run's `network.blocked` lists one by one.
const BLOCKED_LISTED: usize = 64;

impl ModelHealth {
    /// The health of a run whose connection records may take `budget`
    /// bytes of its log.
    pub fn new(budget: u64) -> Self {
        Self { budget, ..Self::default() }
    }

    /// Take `connection` into account; returns the chunks it becomes.
    pub fn observe(
        &mut self,
        connection: &Connection,
        upstream: Option<&Upstream>,
        f: &ChunkFactory,
    ) -> Vec<Chunk> {
        let mut chunks = Vec::new();
        if connection.purpose == Purpose::Model {
            match &connection.error {
                None => self.failing = None,
                Some(error) => {
                    let since = self.failing.get_or_insert_with(|| (Instant::now(), String::new()));
                    since.1 = error.clone();
                    let shown = upstream
                        .map(Upstream::display)
                        .unwrap_or_else(|| format!("{}:{}", connection.host, connection.port));
                    chunks.push(f.custom(
                        egress::MODEL_UNAVAILABLE,
                        &serde_json::json!({
                            "upstream": shown,
                            "error": error,
                            "unreachable_ms": since.0.elapsed().as_millis() as u64,
                        }),
                    ));
                }
            }
        }
        if connection.ended && !connection.allowed {
            let destination = (connection.host.clone(), connection.port);
            let listed = self.blocked.len();
            match self.blocked.get_mut(&destination) {
                Some(count) => *count += 1,
                None if listed < BLOCKED_LISTED => {
                    self.blocked.insert(destination, 1);
                }
                None => self.blocked_other += 1,
            }
        }
        if connection.ended
            && let Some(record) = self.record(connection)
        {
            chunks.push(f.custom(egress::SANDBOX_NETWORK, &record));
        }
        chunks.retain(|c| self.spend(c));
        chunks
    }

    /// The `sandbox.network` record of an ended connection, if it gets
    /// one: a refusal of a destination refused before (or past the first
    /// [`DISTINCT_REFUSALS`]) is counted, and every [`FOLD_EVERY`]th such
    /// one is recorded with `"repeated"`: how many it stands for.
    fn record(&mut self, connection: &Connection) -> Option<serde_json::Value> {
        if connection.allowed {
            return Some(connection.to_json());
        }
        let destination = (connection.host.clone(), connection.port);
        if self.refused.len() < DISTINCT_REFUSALS && self.refused.insert(destination) {
            return Some(connection.to_json());
        }
        self.folded += 1;
        if self.folded < FOLD_EVERY {
            return None;
        }
        let mut record = connection.to_json();
        record["repeated"] = std::mem::take(&mut self.folded).into();
        Some(record)
    }

    /// Whether `chunk` fits in what is left of the budget (taking it).
    fn spend(&mut self, chunk: &Chunk) -> bool {
        let size = chunk.encoded_len() as u64;
        if self.spent + size > self.budget {
            if !std::mem::replace(&mut self.over, true) {
                tracing::warn!(
                    run_id = %chunk.run_id,
                    budget = self.budget,
                    "the run's connection records reached its journal cap; further ones are not logged"
                );
            }
            return false;
        }
        self.spent += size;
        true
    }

    /// The run's `network.blocked` chunk: what this drive saw refused, by
    /// destination (`None` when nothing was).
    /// Taken once: the counts start again.
    pub fn take_blocked(&mut self, f: &ChunkFactory) -> Option<Chunk> {
        let chunk = self.blocked(f);
        self.blocked.clear();
        self.blocked_other = 0;
        chunk
    }

    fn blocked(&self, f: &ChunkFactory) -> Option<Chunk> {
        if self.blocked.is_empty() {
            return None;
        }
        let listed: Vec<serde_json::Value> = self
            .blocked
            .iter()
            .map(|((host, port), count)| serde_json::json!({"host": host, "port": port, "count": count}))
            .collect();
        Some(f.custom(NETWORK_BLOCKED, &serde_json::json!({"blocked": listed, "other": self.blocked_other})))
    }

    /// The run's ending when the upstream has been unreachable past `bound`.
    pub fn expired(&self, bound: Duration, upstream: Option<&Upstream>) -> Option<Error> {
        let (since, error) = self.failing.as_ref()?;
        (since.elapsed() >= bound).then(|| Error::ModelUnreachable {
            upstream: upstream.map(Upstream::display).unwrap_or_default(),
            error: error.clone(),
            waited_ms: since.elapsed().as_millis() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::ids::RunId;

    /// The control plane's check of a dial that names an answered network
    /// request: only an allow whose scope covers the connection lets it
    /// through (the agent, not the control plane, is what a hostile tenant
    /// could drive; it would name any request it likes).
    #[tokio::test]
    async fn a_dial_naming_a_request_connects_only_under_an_allow_that_covers_it() {
        use egress::RunAsks;
        use serde_json::json;
        use shared::chunk::{ChunkRequest, ChunkType};
        use shared::proto::agent::v1::CarryDial;

        use crate::store::{FIRST_EPOCH, NewRun, RunKey, Stores, Tenant};

        let dir = tempfile::tempdir().unwrap();
        let stores = Stores::open(&crate::store::default_database_url(dir.path())).await.unwrap();
        let key = |id: &str| RunKey::new(Tenant::new("t"), RunId::parse(id).unwrap());
        for (id, thread) in [("r1", "th"), ("r2", "th"), ("r3", "other")] {
            stores.runs.create_or_resume(NewRun::bare(RunId::parse(id).unwrap(), "t", thread)).await.unwrap();
        }
        let f = ChunkFactory::new(&RunId::parse("r1").unwrap(), "th", || 0);
        let asked = |id: &str, path: &str| Chunk {
            tool_name: "network".into(),
            request: Some(ChunkRequest {
                request_id: id.into(),
                kind: "network".into(),
                input_json: json!({"host": "h.example", "port": 80, "method": "GET", "path": path})
                    .to_string(),
                ..Default::default()
            }),
            ..f.chunk(ChunkType::PermissionRequested)
        };
        let answered = |id: &str, allowed: bool, scope: &str| Chunk {
            request: Some(ChunkRequest {
                request_id: id.into(),
                kind: "network".into(),
                allowed,
                answered_by: "client".into(),
                scope: scope.into(),
                ..Default::default()
            }),
            ..f.chunk(ChunkType::PermissionResolved)
        };
        let log = [
            asked("once", "/a"),
            answered("once", true, "once"),
            asked("run", "/a"),
            answered("run", true, "run"),
            asked("thread", "/a"),
            answered("thread", true, "thread"),
            asked("denied", "/a"),
            answered("denied", false, ""),
            asked("pending", "/a"),
        ];
        let encoded: Vec<_> = log.iter().map(super::super::log::encode_chunk).collect();
        stores.events.append(&key("r1"), FIRST_EPOCH, &encoded).await.unwrap();
        let asks = |run: &str, thread: &str| StoredAsks {
            events: stores.events.clone(),
            runs: stores.runs.clone(),
            key: key(run),
            thread: thread.into(),
            wait: Duration::from_millis(300),
        };
        let dial = |host: &str, path: &str| CarryDial {
            host: host.into(),
            port: 80,
            method: "GET".into(),
            path: path.into(),
            ..Default::default()
        };
        let (r1, r2, r3) = (asks("r1", "th"), asks("r2", "th"), asks("r3", "other"));
        let check = async |asks: &StoredAsks, id: &str, dial: CarryDial| asks.check("r1", id, &dial).await;
        check(&r1, "once", dial("h.example", "/a")).await.unwrap();
        for (asks, id, dial, why) in [
            (&r1, "once", dial("h.example", "/b"), "another request"),
            (&r1, "once", dial("other.example", "/a"), "another host"),
            (&r2, "once", dial("h.example", "/a"), "another run"),
            (&r2, "run", dial("h.example", "/a"), "another run"),
            (&r3, "thread", dial("h.example", "/a"), "another thread"),
            (&r1, "denied", dial("h.example", "/a"), "denied"),
            (&r1, "pending", dial("h.example", "/a"), "not answered"),
            (&r1, "never", dial("h.example", "/a"), "never asked"),
        ] {
            let refused = check(asks, id, dial).await;
            assert!(refused.is_err(), "{id} {why}: {refused:?}");
        }
        check(&r1, "run", dial("h.example", "/b")).await.unwrap();
        check(&r2, "thread", dial("h.example", "/c")).await.unwrap();
    }

    fn connection(purpose: Purpose, error: Option<&str>, ended: bool) -> Connection {
        Connection {
            host: "api.example".into(),
            port: 443,
            purpose,
            route: "claude-code".into(),
            allowed: true,
            error: error.map(str::to_string),
            sent: 0,
            received: 0,
            duration_ms: 0,
            ended,
        }
    }

    #[test]
    fn failures_are_reported_and_a_success_clears_them() {
        let f = ChunkFactory::new(&RunId::parse("r").unwrap(), "t", || 0);
        let mut health = ModelHealth::new(1 << 20);
        let failed = health.observe(&connection(Purpose::Model, Some("refused"), true), None, &f);
        let names: Vec<&str> = failed.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [egress::MODEL_UNAVAILABLE, egress::SANDBOX_NETWORK]);
        assert!(health.expired(Duration::ZERO, None).is_some());
        assert!(health.expired(Duration::from_secs(60), None).is_none());
        // A connection made (reported before its bytes) clears it, and is
        // not recorded until it ends.
        assert!(health.observe(&connection(Purpose::Model, None, false), None, &f).is_empty());
        assert!(health.expired(Duration::ZERO, None).is_none());
        // A proxy failure is not the model's.
        health.observe(&connection(Purpose::Proxy, Some("refused"), true), None, &f);
        assert!(health.expired(Duration::ZERO, None).is_none());
    }

    /// Issue 33, medium 7: a sandbox dialing refused (and long) names
    /// without end adds a bounded log: refusals of one destination are
    /// folded, and all records together stay within the run's budget.
    #[test]
    fn a_refused_dial_flood_is_coalesced_within_the_budget() {
        let f = ChunkFactory::new(&RunId::parse("r").unwrap(), "t", || 0);
        let budget = 64 * 1024;
        let mut health = ModelHealth::new(budget);
        let refused = |host: String| Connection {
            host,
            allowed: false,
            error: Some("not on the sandbox's allowlist".into()),
            ..connection(Purpose::Proxy, None, true)
        };
        // The same destination again and again: one record, then folds.
        let mut same = Vec::new();
        for _ in 0..1_000 {
            same.extend(health.observe(&refused("refused.example".into()), None, &f));
        }
        assert_eq!(same.len(), 1 + 999 / FOLD_EVERY as usize, "{same:?}");
        let repeated: u64 = same[1..]
            .iter()
            .map(|c| {
                serde_json::from_str::<serde_json::Value>(&c.value_json).unwrap()["repeated"]
                    .as_u64()
                    .unwrap()
            })
            .sum();
        assert_eq!(repeated, 999 / FOLD_EVERY * FOLD_EVERY);
        // Ever new, long names: the log stops growing at the budget.
        let mut spent: u64 = same.iter().map(|c| c.encoded_len() as u64).sum();
        for i in 0..20_000 {
            let host = format!("{i}.{}", "a".repeat(240));
            for c in health.observe(&refused(host), None, &f) {
                spent += c.encoded_len() as u64;
            }
        }
        assert!(spent <= budget, "{spent} > {budget}");
        assert!(spent > budget / 2, "records stopped early: {spent}");
        // Past the budget even an allowed connection is not recorded.
        assert!(health.observe(&connection(Purpose::Proxy, None, true), None, &f).is_empty());
        // The summary counts every refusal, recorded or folded.
        let summary = health.blocked(&f).unwrap();
        let value: serde_json::Value = serde_json::from_str(&summary.value_json).unwrap();
        let listed = value["blocked"].as_array().unwrap();
        assert_eq!(listed.len(), BLOCKED_LISTED);
        let same = listed.iter().find(|b| b["host"] == "refused.example").unwrap();
        assert_eq!(same["count"], 1_000);
        assert_eq!(value["other"], 20_000 - (BLOCKED_LISTED as u64 - 1));
        assert!(health.take_blocked(&f).is_some());
        assert!(health.take_blocked(&f).is_none(), "taken once");
    }
}
