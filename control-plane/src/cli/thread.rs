//! What `sandhold run --thread T` says about the thread's definition. A
//! thread keeps its sandbox: a run with no definition flags takes the
//! definition the server says the thread uses, and flags that make another
//! definition say what they change (the run then gets a sandbox of that
//! definition).

use shared::proto::v1 as api;

use super::client::Connection;
use super::output::status_error;

/// The definition a run of `thread` uses when it names none, as the
/// server decides it; `None` for a new thread.
pub async fn definition_of(
    conn: &Connection,
    thread: &str,
) -> anyhow::Result<Option<api::SandboxDefinition>> {
    let request = api::GetDefinitionRequest { thread_id: thread.to_string(), ..Default::default() };
    match conn.sandboxes().get_definition(request).await {
        Ok(r) => Ok(r.into_inner().definition),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(status_error(s)),
    }
}

/// Store `definition`; the server's settled form back (its id, the model
/// keys it picked).
pub async fn put_definition(
    conn: &Connection,
    definition: api::SandboxDefinition,
) -> anyhow::Result<api::SandboxDefinition> {
    let request = api::PutDefinitionRequest { definition: Some(definition) };
    let stored = conn.sandboxes().put_definition(request).await.map_err(status_error)?;
    Ok(stored.into_inner().definition.unwrap_or_default())
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
