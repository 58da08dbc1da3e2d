//! Sandbox and run ids as people type them: a unique prefix names the
//! sandbox (of its 64 hex digits; the console and `sandboxes ls` show 16)
//! or the run; an ambiguous one is refused with the candidates. Or no
//! sandbox id at all: `--thread` names the thread's sandbox.

use shared::proto::v1 as api;

use super::client::Connection;
use super::output::status_error;

/// Which sandbox a command works on: an id (or a prefix), or a thread's.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxTarget {
    /// The sandbox: its id from `sandhold sandboxes ls`, or a unique prefix
    /// of it (or --thread instead).
    #[arg(required_unless_present = "thread", value_name = "SANDBOX_ID")]
    pub sandbox_id: Option<String>,
    /// The sandbox of this thread (its newest) instead of an id.
    #[arg(long = "thread", value_name = "THREAD", conflicts_with = "sandbox_id")]
    pub thread: Option<String>,
}

impl SandboxTarget {
    /// The full id of the sandbox this names.
    pub async fn resolve(&self, conn: &Connection) -> anyhow::Result<String> {
        match (&self.sandbox_id, &self.thread) {
            (Some(id), _) => sandbox_id(conn, id).await,
            (None, Some(thread)) => of_thread(conn, thread).await,
            (None, None) => anyhow::bail!("name the sandbox: SANDBOX_ID or --thread THREAD"),
        }
    }
}

/// The newest sandbox of `thread`.
async fn of_thread(conn: &Connection, thread: &str) -> anyhow::Result<String> {
    let request = api::ListSandboxesRequest { thread_id: thread.to_string(), ..Default::default() };
    let listed = conn.sandboxes().list_sandboxes(request).await.map_err(status_error)?.into_inner().sandboxes;
    match listed.into_iter().max_by_key(|s| s.updated_at_ms) {
        Some(s) => Ok(s.sandbox_id),
        None => anyhow::bail!(
            "thread {thread:?} has no sandbox: a run of it makes one (`sandhold run --thread {thread} -- ...`); \
             see `sandhold sandboxes ls`"
        ),
    }
}

/// The full id of the sandbox `given` names (itself, or the one sandbox
/// of the tenant whose id starts with it).
pub async fn sandbox_id(conn: &Connection, given: &str) -> anyhow::Result<String> {
    if given.len() == 64 {
        return Ok(given.to_string());
    }
    let listed = conn
        .sandboxes()
        .list_sandboxes(api::ListSandboxesRequest::default())
        .await
        .map_err(status_error)?
        .into_inner()
        .sandboxes;
    pick(given, listed.into_iter().map(|s| s.sandbox_id).collect(), &SANDBOXES)
}

/// A page of the runs a prefix search reads.
const RUNS_PAGE: u32 = 1000;

/// The full id of the run `given` names: the run of that id, or the one of
/// the tenant's runs whose id starts with it (the server narrows the list
/// to runs mentioning the text, so every run is searched).
pub async fn run_id(conn: &Connection, given: &str) -> anyhow::Result<String> {
    let exact = conn.runs().get_run(api::GetRunRequest { run_id: given.to_string() }).await;
    match exact {
        Ok(_) => return Ok(given.to_string()),
        // Not a run's id, or not even shaped like one: perhaps a prefix.
        Err(s) if matches!(s.code(), tonic::Code::NotFound | tonic::Code::InvalidArgument) => {}
        Err(s) => return Err(status_error(s)),
    }
    let mut ids = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = api::ListRunsRequest {
            limit: RUNS_PAGE,
            query: given.to_string(),
            page_token,
            ..Default::default()
        };
        let page = conn.runs().list_runs(request).await.map_err(status_error)?.into_inner();
        ids.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    pick(given, ids, &RUNS)
}

/// What kind of id is looked for, to say so.
struct Kind {
    one: &'static str,
    many: &'static str,
    list: &'static str,
    /// How much of a candidate an ambiguity shows.
    shown: usize,
}

const SANDBOXES: Kind = Kind { one: "sandbox", many: "sandboxes", list: "sandhold sandboxes ls", shown: 16 };
const RUNS: Kind = Kind { one: "run", many: "runs", list: "sandhold runs", shown: 64 };

fn pick(given: &str, ids: Vec<String>, kind: &Kind) -> anyhow::Result<String> {
    let Kind { one, many, list, shown } = kind;
    if given.is_empty() {
        anyhow::bail!("no {one} id given: see `{list}`");
    }
    let mut matching: Vec<String> = ids.into_iter().filter(|id| id.starts_with(given)).collect();
    match matching.len() {
        1 => Ok(matching.remove(0)),
        0 => anyhow::bail!("no {one} id starts with {given:?}: see `{list}`"),
        n => {
            matching.sort();
            let candidates: Vec<&str> =
                matching.iter().take(5).map(|id| &id[..id.len().min(*shown)]).collect();
            anyhow::bail!(
                "{given:?} names {n} {many} ({}{}): give more of the id",
                candidates.join(", "),
                if n > 5 { ", ..." } else { "" }
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unique_prefix_names_its_sandbox_and_an_ambiguous_one_lists_the_candidates() {
        let ids = || vec![format!("ab12{}", "0".repeat(60)), format!("ab34{}", "1".repeat(60))];
        assert_eq!(pick("ab1", ids(), &SANDBOXES).unwrap(), ids()[0]);
        let ambiguous = pick("ab", ids(), &SANDBOXES).unwrap_err().to_string();
        assert!(
            ambiguous.contains("names 2 sandboxes")
                && ambiguous.contains("ab12")
                && ambiguous.contains("ab34")
        );
        assert!(pick("ff", ids(), &SANDBOXES).unwrap_err().to_string().contains("sandboxes ls"));
        assert!(pick("", ids(), &SANDBOXES).is_err());
        let runs = vec!["run-3f2a01".to_string(), "run-3f2a02".to_string(), "run-77".to_string()];
        assert_eq!(pick("run-7", runs.clone(), &RUNS).unwrap(), "run-77");
        let ambiguous = pick("run-3f2a", runs, &RUNS).unwrap_err().to_string();
        assert!(ambiguous.contains("names 2 runs (run-3f2a01, run-3f2a02)"), "{ambiguous}");
    }
}
