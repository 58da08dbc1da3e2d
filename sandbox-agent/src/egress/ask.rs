//! Network asks: a destination under a `network.ask` rule becomes a durable
//! request of kind `network` in the run's request dir (the run whose
//! driver's carrier took the dial), answered like every other request
//! (`RequestService.Answer`, from any replica). The connection waits here,
//! in the agent, so a driver's death does not lose it: the answer comes
//! through the request dir, and the dial after an allow goes out on
//! whichever carrier is there then, carrying the request's id for the
//! control plane to check in the run's log.
//!
//! An allow of scope `run` or `thread` is kept as a grant in memory (and
//! so lost with an agent restart: the next connection asks again): a later
//! connection to the same host and port carried for that run (or, for
//! `thread`, any run of the sandbox) dials with the granting request's id
//! and asks nothing.

use std::path::PathBuf;
use std::sync::Mutex;

use shared::ids::RunId;
use shared::proto::agent::v1::{CarryAsk, CarryDial};
use shared::requests::{Request, RequestKind};

use crate::request_dir::{self, RequestDir};

/// Grants kept at most (the oldest go first).
const MAX_GRANTS: usize = 1024;

#[derive(Debug, Clone)]
struct Grant {
    /// The run the request was asked in.
    run_id: String,
    /// Any run of the sandbox (scope `thread`), not only `run_id`.
    thread: bool,
    host: String,
    port: u32,
    request_id: String,
}

/// The agent's network asks.
#[derive(Debug)]
pub struct Asks {
    journal_dir: PathBuf,
    grants: Mutex<Vec<Grant>>,
}

impl Asks {
    pub fn new(journal_dir: PathBuf) -> Self {
        Self { journal_dir, grants: Mutex::default() }
    }

    /// The request a `run`/`thread` allow granted for `dial` carried for
    /// run `run_id`: (its run, its id).
    fn granted(&self, run_id: &str, dial: &CarryDial) -> Option<(String, String)> {
        let grants = self.grants.lock().expect("grants poisoned");
        grants
            .iter()
            .rev()
            .find(|g| (g.thread || g.run_id == run_id) && g.host == dial.host && g.port == dial.port)
            .map(|g| (g.run_id.clone(), g.request_id.clone()))
    }

    /// Answer `ask` for `dial`: a grant that covers it, else a request in the
    /// run's request dir, waited for. `Ok`: (the run, the request id) to
    /// dial again with; `Err`: why not (denied, by whom).
    pub async fn ask(&self, ask: &CarryAsk, dial: &CarryDial) -> Result<(String, String), String> {
        if let Some(granted) = self.granted(&ask.run_id, dial) {
            return Ok(granted);
        }
        let run_id = RunId::parse(&ask.run_id).map_err(|e| format!("the ask names no run: {e}"))?;
        let Some(dir) = RequestDir::find(&self.journal_dir, &run_id) else {
            return Err(format!(
                "run {run_id} takes no requests (it has no request dir), so the ask is refused"
            ));
        };
        let request = Request {
            request_id: String::new(),
            kind: RequestKind::Network,
            tool: "network".into(),
            input: serde_json::json!({
                "host": dial.host,
                "port": dial.port,
                "method": dial.method,
                "path": dial.path,
            }),
            tool_call_id: String::new(),
            rule: ask.rule.clone(),
            deadline_ms: 0,
        };
        let answer = tokio::task::spawn_blocking(move || request_dir::ask(&dir, request))
            .await
            .map_err(|e| format!("the ask failed: {e}"))?
            .map_err(|e| format!("the ask could not be written: {e}"))?;
        if !answer.allowed {
            let why = if answer.message.is_empty() { String::new() } else { format!(": {}", answer.message) };
            return Err(format!(
                "the network request {} was denied by {}{why}",
                answer.request_id,
                answer.by.as_str()
            ));
        }
        if answer.scope == "run" || answer.scope == "thread" {
            let mut grants = self.grants.lock().expect("grants poisoned");
            if grants.len() >= MAX_GRANTS {
                grants.remove(0);
            }
            grants.push(Grant {
                run_id: ask.run_id.clone(),
                thread: answer.scope == "thread",
                host: dial.host.clone(),
                port: dial.port,
                request_id: answer.request_id.clone(),
            });
        }
        Ok((ask.run_id.clone(), answer.request_id))
    }
}
