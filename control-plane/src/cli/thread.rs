//! Which definition `sandhold run --thread T` uses. A thread keeps its
//! sandbox: a run with no definition flags takes the definition the thread's
//! sandbox was made from, and flags that make another definition say what
//! they change (the run then gets a sandbox of that definition).

use shared::proto::v1 as api;

use super::client::Connection;
use super::output::status_error;

/// The definition the thread's newest run used, or, for a thread with no
/// run yet (a sandbox ensured through the API), its newest sandbox's.
/// `None` for a new thread.
pub async fn definition_of(conn: &Connection, thread: &str) -> anyhow::Result<Option<String>> {
    let runs = conn
        .runs()
        .list_runs(api::ListRunsRequest { thread_id: thread.to_string(), limit: 1 })
        .await
        .map_err(status_error)?
        .into_inner()
        .runs;
    if let Some(run) = runs.into_iter().next().filter(|r| !r.definition_id.is_empty()) {
        return Ok(Some(run.definition_id));
    }
    let sandboxes = conn
        .sandboxes()
        .list_sandboxes(api::ListSandboxesRequest { thread_id: thread.to_string() })
        .await
        .map_err(status_error)?
        .into_inner()
        .sandboxes;
    let newest =
        sandboxes.into_iter().filter(|s| !s.definition_id.is_empty()).max_by_key(|s| s.updated_at_ms);
    Ok(newest.map(|s| s.definition_id))
}

/// The stored definition `id`, if it is still there.
pub async fn stored(conn: &Connection, id: &str) -> anyhow::Result<Option<api::SandboxDefinition>> {
    match conn.sandboxes().get_definition(api::GetDefinitionRequest { id: id.to_string() }).await {
        Ok(r) => Ok(r.into_inner().definition),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(status_error(s)),
    }
}

/// What `new` changes of `old`, one phrase per part, for a person.
pub fn changes(old: &api::SandboxDefinition, new: &api::SandboxDefinition) -> Vec<String> {
    let parts: [(&str, Show); 5] = [
        ("sandbox", provider),
        ("repository", source),
        ("setup", setup),
        ("secrets", |d| d.secret_names.join(", ")),
        ("lifecycle", |d| format!("{:?}", d.lifecycle)),
    ];
    let mut changed: Vec<String> = parts
        .iter()
        .filter_map(|(part, show)| {
            let (was, now) = (show(old), show(new));
            (was != now).then(|| format!("{part}: {} → {}", shown(&was), shown(&now)))
        })
        .collect();
    if changed.is_empty() {
        // Fields the flags never set (a definition file's): not spelled out.
        changed.push("settings of the definition file".to_string());
    }
    changed
}

/// One part of a definition, as a person reads it.
type Show = fn(&api::SandboxDefinition) -> String;

fn shown(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

fn provider(d: &api::SandboxDefinition) -> String {
    crate::provider::describe(d)
}

fn source(d: &api::SandboxDefinition) -> String {
    match d.workspace.as_ref().and_then(|w| w.source.as_ref()).and_then(|s| s.source.as_ref()) {
        Some(api::source::Source::Git(git)) => git.url.clone(),
        _ => String::new(),
    }
}

fn setup(d: &api::SandboxDefinition) -> String {
    let steps = d.workspace.as_ref().map(|w| w.setup.as_slice()).unwrap_or_default();
    steps
        .iter()
        .map(|s| match &s.step {
            Some(api::setup_step::Step::Serial(cmd)) => format!("`{cmd}`"),
            other => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::definition_file::FromFlags;

    fn flags(image: Option<&str>, setup: &[&str]) -> api::SandboxDefinition {
        FromFlags {
            image: image.map(str::to_string),
            setup: setup.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
        .build()
        .unwrap()
    }

    #[test]
    fn names_each_part_the_flags_change_with_before_and_after() {
        let old = flags(None, &["echo a > a.txt"]);
        assert_eq!(
            changes(&old, &flags(None, &["echo b > b.txt"])),
            ["setup: `echo a > a.txt` → `echo b > b.txt`"]
        );
        assert_eq!(
            changes(&old, &flags(Some("busybox"), &[])),
            ["sandbox: local → docker busybox", "setup: `echo a > a.txt` → none"]
        );
    }

    #[test]
    fn a_change_the_flags_cannot_show_is_still_named() {
        let old = flags(None, &[]);
        let mut new = old.clone();
        new.env.insert("A".into(), "1".into());
        assert_eq!(changes(&old, &new), ["settings of the definition file"]);
    }
}
