//! The instructions file: `AGENTS.md` at the workspace root (the
//! definition's instructions, then its named scripts and the package
//! manager), with `CLAUDE.md` and `GEMINI.md` as symlinks to it, copies
//! where the sandbox cannot make symlinks.

use shared::proto::v1::WorkspaceDefinition;

use super::remote::Remote;
use crate::provision::Error;

pub(crate) const FILE: &str = "AGENTS.md";
/// Names other CLIs look for, pointing at [`FILE`].
pub(crate) const ALIASES: [&str; 2] = ["CLAUDE.md", "GEMINI.md"];

/// The text of `AGENTS.md`, or `None` when there is nothing to say.
pub(crate) fn render(w: &WorkspaceDefinition, package_manager: Option<&str>) -> Option<String> {
    if w.instructions.trim().is_empty() && w.scripts.is_empty() {
        return None;
    }
    let mut out = String::new();
    if !w.instructions.trim().is_empty() {
        out.push_str(w.instructions.trim_end());
        out.push('\n');
    }
    if !w.scripts.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str("## Scripts\n\nRun these from the workspace root:\n\n");
        let mut names: Vec<&String> = w.scripts.keys().collect();
        names.sort();
        for name in names {
            out.push_str(&format!("- `{name}`: `{}`\n", w.scripts[name]));
        }
        if let Some(pm) = package_manager {
            out.push_str(&format!("\nThe package manager is {pm}.\n"));
        }
    }
    Some(out)
}

/// Write `AGENTS.md` and its aliases. Returns whether the aliases are
/// symlinks (false: copies).
pub(crate) async fn write(remote: &Remote<'_>, text: &str) -> Result<bool, Error> {
    remote.write(FILE, text.as_bytes(), None).await?;
    let mut linked = true;
    for alias in ALIASES {
        linked &= remote.link_or_copy(FILE, alias, FILE).await?;
    }
    Ok(linked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_then_scripts_in_name_order() {
        let w = WorkspaceDefinition {
            instructions: "Always test.\n\n".into(),
            scripts: [
                ("test".to_string(), "pnpm test".to_string()),
                ("build".to_string(), "pnpm build".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let text = render(&w, Some("pnpm")).unwrap();
        assert_eq!(
            text,
            "Always test.\n\n## Scripts\n\nRun these from the workspace root:\n\n- `build`: `pnpm build`\n- `test`: `pnpm test`\n\nThe package manager is pnpm.\n"
        );
        assert_eq!(render(&WorkspaceDefinition::default(), None), None);
    }
}
