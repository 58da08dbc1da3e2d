//! A run's egress: its CLI pointed at the sandbox's model broker, the
//! proxy's environment, the carriers its driver keeps open, and what the
//! run's log says about its connections (`sandbox.network`,
//! `model.unavailable`, and the MODEL_UNREACHABLE ending).

use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::chunk::ChunkFactory;
use shared::proto::v1::{Chunk, SandboxDefinition};

use super::Error;
use crate::agent::AgentClient;
use crate::egress::{self, Connection, LOOPBACK, Plan, Purpose, Upstream};
use crate::harness::{CommandSpec, Harness};

/// What a driver needs to serve a run's egress.
#[derive(Debug, Clone)]
pub(super) struct RunEgress {
    pub plan: Arc<Plan>,
    pub upstream: Option<Upstream>,
    pub unreachable_after: Duration,
}

impl RunEgress {
    /// The egress of a run of `harness` under `definition`, if it has any.
    pub fn of(
        definition: &SandboxDefinition,
        harness: Harness,
        private_ok: bool,
    ) -> Result<Option<Self>, Error> {
        if !egress::wanted(definition) {
            return Ok(None);
        }
        let upstream = egress::upstream_for(definition, harness).map_err(Error::Egress)?;
        Ok(Some(Self {
            plan: Arc::new(Plan::of(definition, private_ok)),
            upstream,
            unreachable_after: egress::unreachable_after(definition),
        }))
    }
}

/// Configure the sandbox's listener with this run's route and point
/// `command` at it: the broker's URL and a placeholder key for the CLI,
/// the proxy's variables when the definition allows hosts.
pub(super) async fn point(
    egress: &RunEgress,
    definition: &SandboxDefinition,
    harness: Harness,
    agent: &AgentClient,
    command: &mut CommandSpec,
) -> Result<(), Error> {
    let placeholder = egress::placeholder();
    let routes = egress.upstream.iter().map(|u| u.route(&placeholder)).collect();
    let port = egress::configure(agent, definition, routes).await.map_err(Error::StartRefused)?;
    if let Some(upstream) = &egress.upstream {
        let base = format!("http://{LOOPBACK}:{port}{}", upstream.path);
        harness.point_at(command, &base, &placeholder);
    }
    if definition.network.as_ref().is_some_and(|n| !n.allow_hosts.is_empty()) {
        for (name, value) in egress::proxy_env(port) {
            command.env.entry(name).or_insert(value);
        }
    }
    Ok(())
}

/// Whether the run's model upstream answers, as its connections tell.
#[derive(Debug, Default)]
pub(super) struct ModelHealth {
    /// Since when every attempt failed, and the last failure.
    failing: Option<(Instant, String)>,
}

impl ModelHealth {
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
        if connection.ended {
            chunks.push(f.custom(egress::SANDBOX_NETWORK, &connection.to_json()));
        }
        chunks
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
        let mut health = ModelHealth::default();
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
}
