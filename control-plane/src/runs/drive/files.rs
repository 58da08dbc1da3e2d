//! File changes of a run's workspace: the watch while it runs (its events
//! become `sandbox.file` chunks in the pump), and the git changes after it
//! ended (`file.changed` chunks).

use futures::StreamExt;
use shared::chunk::{ChunkFactory, FILE_CHANGED};
use shared::proto::agent::v1 as agent;
use shared::proto::v1::Chunk;
use tokio::sync::mpsc;
use tracing::debug;

use crate::agent::AgentClient;
use crate::provision::Masks;

/// `file.changed` chunks after a run, at most (the rest are summarized in a
/// `harness.warning`).
const MAX_CHANGED_FILES: usize = 40;
/// Bytes of one file's diff kept in its `file.changed` chunk.
const MAX_DIFF_BYTES: usize = 64 << 10;

/// File events of the run's workspace while it runs, until the receiver
/// goes. Best effort: a sandbox that cannot watch yields no events.
pub(super) async fn watch_files(agent: AgentClient, cwd: String, tx: mpsc::Sender<Vec<agent::FileEvent>>) {
    let request = agent::WatchRequest {
        path: if cwd.is_empty() { ".".into() } else { cwd },
        recursive: true,
        coalesce_ms: Some(100),
        ..Default::default()
    };
    let mut stream = match agent.watch().watch(request).await {
        Ok(s) => s.into_inner(),
        Err(status) => {
            debug!(error = %status.message(), "file watch unavailable");
            return;
        }
    };
    while let Some(Ok(message)) = stream.next().await {
        if let Some(agent::watch_response::Kind::Events(events)) = message.kind
            && tx.send(events.events).await.is_err()
        {
            return;
        }
    }
}

/// `git status` of the run's workspace after it ended, as `file.changed`
/// chunks (path, diff). Nothing when it is not a git work tree or git is
/// missing.
pub(super) async fn changed_files(
    agent: &AgentClient,
    cwd: &str,
    factory: &ChunkFactory,
    redactor: &Masks,
) -> Vec<Chunk> {
    // NUL-separated: path, diff, path, diff, ... Untracked files diff
    // against /dev/null.
    const SCRIPT: &str = r#"git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 0
max=$1; limit=$2; n=0
printf 'total\0'
{ git -c core.quotepath=off diff --name-only HEAD 2>/dev/null || git -c core.quotepath=off diff --name-only; git -c core.quotepath=off ls-files --others --exclude-standard; } | sort -u > "${TMPDIR:-/tmp}/.sandhold-changed.$$"
printf '%s\0' "$(wc -l < "${TMPDIR:-/tmp}/.sandhold-changed.$$")"
while IFS= read -r f; do
  n=$((n+1)); [ "$n" -gt "$max" ] && break
  printf '%s\0' "$f"
  if git ls-files --error-unmatch -- "$f" >/dev/null 2>&1; then git -c core.quotepath=off diff HEAD -- "$f" 2>/dev/null | head -c "$limit"
  else git -c core.quotepath=off diff --no-index -- /dev/null "$f" 2>/dev/null | head -c "$limit"; fi
  printf '\0'
done < "${TMPDIR:-/tmp}/.sandhold-changed.$$"
rm -f "${TMPDIR:-/tmp}/.sandhold-changed.$$"
"#;
    let request = agent::ExecRequest {
        command: Some(agent::Command {
            kind: Some(agent::command::Kind::Argv(agent::Argv {
                args: vec![
                    "sh".into(),
                    "-c".into(),
                    SCRIPT.into(),
                    "sh".into(),
                    MAX_CHANGED_FILES.to_string(),
                    MAX_DIFF_BYTES.to_string(),
                ],
            })),
        }),
        cwd: cwd.to_owned(),
        timeout_ms: Some(30_000),
        // Masked by the agent, which holds the values also after a
        // takeover (this replica may never have had them).
        mask_secrets: true,
        ..Default::default()
    };
    let out = match agent.process().exec(request).await {
        Ok(r) => r.into_inner().stdout,
        Err(status) => {
            debug!(error = %status.message(), "git diff after the run failed");
            return Vec::new();
        }
    };
    let mut fields = out.split(|b| *b == 0).map(|f| String::from_utf8_lossy(f).into_owned());
    let total: usize = match (fields.next(), fields.next()) {
        (Some(t), Some(n)) if t == "total" => n.trim().parse().unwrap_or(0),
        _ => return Vec::new(), // not a git work tree
    };
    let rest: Vec<String> = fields.collect();
    let mut chunks = Vec::new();
    for pair in rest.chunks(2) {
        if let [path, diff] = pair {
            let value = serde_json::json!({"path": path, "diff": redactor.mask(diff)});
            chunks.push(factory.custom(FILE_CHANGED, &value));
        }
    }
    if total > chunks.len() {
        let message = format!("{} more changed files are not listed", total - chunks.len());
        chunks.push(factory.warning(&message, None));
    }
    chunks
}
