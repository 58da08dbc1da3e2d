//! `sandhold git SANDBOX status|diff|add|commit|branch|push|pull`: git on
//! a live sandbox's workspace through the `Git*` calls of
//! `SandboxService`.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use shared::proto::v1 as api;

use super::client::ClientArgs;
use super::output::{OutputFormat, json_line, message_json, status_error};
use super::run::{SecretRef, secret_values, with_connection};

#[derive(Debug, Clone, Args)]
pub struct GitArgs {
    #[command(flatten)]
    pub target: super::ids::SandboxTarget,
    /// The repository, relative to the workspace root (default: the root).
    #[arg(long, value_name = "DIR", global = true)]
    pub repo: Option<String>,
    #[command(subcommand)]
    pub command: GitCommand,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, Subcommand)]
pub enum GitCommand {
    /// Branch, upstream, ahead/behind and changed files.
    #[command(after_help = "Example:\n  sandhold git 3f2a9c status")]
    Status,
    /// The diff of the working tree (or, with --staged, the index) against HEAD or BASE.
    #[command(
        after_help = "Examples:\n  sandhold git 3f2a9c diff\n  sandhold git 3f2a9c diff --staged main -- src/"
    )]
    Diff {
        /// A commit, branch or tag to compare against (default HEAD).
        base: Option<String>,
        /// The index (what `add` staged) instead of the working tree.
        #[arg(long)]
        staged: bool,
        /// Only these paths.
        #[arg(last = true)]
        paths: Vec<String>,
    },
    /// Stage changes (default: all of them, untracked and deleted files included).
    #[command(
        after_help = "Examples:\n  sandhold git 3f2a9c add\n  sandhold git 3f2a9c add src/main.rs README.md"
    )]
    Add {
        /// Only these paths, relative to the repository (default: everything).
        paths: Vec<String>,
    },
    /// Commit (every change unless --staged-only), as the author given.
    #[command(
        after_help = "Example:\n  sandhold git 3f2a9c commit -m 'Fix the parser' --author 'Ada <ada@example.com>'"
    )]
    Commit {
        /// The commit message.
        #[arg(short, long, value_name = "MSG")]
        message: String,
        /// Author and committer, "Name <email>" (default: $SANDHOLD_GIT_AUTHOR, else
        /// git's user.name/user.email here).
        #[arg(long, value_name = "NAME <EMAIL>")]
        author: Option<String>,
        /// Commit only what is staged.
        #[arg(long)]
        staged_only: bool,
    },
    /// Switch to branch NAME, creating it from HEAD when it does not exist (or with -c).
    #[command(after_help = "Example:\n  sandhold git 3f2a9c branch fix-parser")]
    Branch {
        /// The branch to switch to (or create).
        name: String,
        /// Fail if NAME exists instead of switching to it.
        #[arg(short, long)]
        create: bool,
    },
    /// Push a branch (default: the current one) to REMOTE (default origin).
    #[command(
        after_help = "Example:\n  sandhold git 3f2a9c push origin fix-parser --secret GIT_TOKEN=GITHUB_TOKEN"
    )]
    Push {
        /// The remote to push to [default: origin].
        remote: Option<String>,
        /// The branch to push [default: the current one].
        branch: Option<String>,
        /// Overwrite the remote branch, but only if it is where this
        /// repository last saw it (`--force-with-lease`).
        #[arg(long)]
        force: bool,
        /// A secret for the push, NAME=ENV_VAR (the workspace's auth_secret). Repeatable.
        #[arg(long = "secret", value_name = "NAME=ENV_VAR")]
        secrets: Vec<SecretRef>,
    },
    /// Fast-forward from REMOTE's BRANCH (default: the upstream).
    #[command(after_help = "Example:\n  sandhold git 3f2a9c pull --secret GIT_TOKEN=GITHUB_TOKEN")]
    Pull {
        /// The remote to pull from [default: the upstream's].
        remote: Option<String>,
        /// The branch to pull [default: the upstream's].
        branch: Option<String>,
        /// A secret for the pull, NAME=ENV_VAR (the workspace's auth_secret). Repeatable.
        #[arg(long = "secret", value_name = "NAME=ENV_VAR")]
        secrets: Vec<SecretRef>,
    },
}

/// "Name <email>" as an author.
fn parse_author(s: &str) -> anyhow::Result<api::GitAuthor> {
    let (name, rest) =
        s.split_once('<').ok_or_else(|| anyhow::anyhow!("--author {s:?}: expected \"Name <email>\""))?;
    let email =
        rest.strip_suffix('>').ok_or_else(|| anyhow::anyhow!("--author {s:?}: expected \"Name <email>\""))?;
    Ok(api::GitAuthor { name: name.trim().to_string(), email: email.trim().to_string() })
}

/// The author of a commit: the flag, `$SANDHOLD_GIT_AUTHOR`, or this
/// machine's git identity.
pub(super) fn author(flag: Option<String>) -> anyhow::Result<api::GitAuthor> {
    if let Some(a) = flag.or_else(|| std::env::var("SANDHOLD_GIT_AUTHOR").ok()) {
        return parse_author(&a);
    }
    let config = |key: &str| {
        std::process::Command::new("git")
            .args(["config", "--get", key])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match (config("user.name"), config("user.email")) {
        (Some(name), Some(email)) => Ok(api::GitAuthor { name, email }),
        _ => anyhow::bail!("who is the author? pass --author \"Name <email>\" (or set SANDHOLD_GIT_AUTHOR)"),
    }
}

fn change(c: api::GitChange) -> char {
    match c {
        api::GitChange::Modified => 'M',
        api::GitChange::Added => 'A',
        api::GitChange::Deleted => 'D',
        api::GitChange::Renamed => 'R',
        api::GitChange::Copied => 'C',
        api::GitChange::TypeChanged => 'T',
        api::GitChange::Unmerged => 'U',
        api::GitChange::Untracked => '?',
        api::GitChange::Unmodified | api::GitChange::Unspecified => ' ',
    }
}

fn print_status(format: OutputFormat, s: &api::GitStatusResponse) {
    if format == OutputFormat::Json {
        return json_line(&message_json(s, "GitStatusResponse"));
    }
    let branch = if s.branch.is_empty() { "(detached HEAD)" } else { s.branch.as_str() };
    let head = s.head.get(..12).unwrap_or(&s.head);
    match s.upstream.as_str() {
        "" => println!("on {branch} at {head}"),
        up => println!("on {branch} at {head}, {} ahead and {} behind {up}", s.ahead, s.behind),
    }
    for f in &s.files {
        let (x, y) = (change(f.staged()), change(f.unstaged()));
        let (x, y) = if f.unstaged() == api::GitChange::Untracked { ('?', '?') } else { (x, y) };
        match f.original_path.as_str() {
            "" => println!("{x}{y} {}", f.path),
            from => println!("{x}{y} {from} -> {}", f.path),
        }
    }
    if s.files.is_empty() {
        println!("nothing to commit, working tree clean");
    }
}

pub async fn git(args: GitArgs) -> ExitCode {
    let client = args.client.clone();
    let format = client.output;
    with_connection(&client, async move |conn| {
        let mut sandboxes = conn.sandboxes();
        let sandbox_id = args.target.resolve(conn).await?;
        let path = args.repo.clone().unwrap_or_default();
        match args.command {
            GitCommand::Status => {
                let s = sandboxes
                    .git_status(api::GitStatusRequest { sandbox_id, path })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                print_status(format, &s);
            }
            GitCommand::Diff { base, staged, paths } => {
                let d = sandboxes
                    .git_diff(api::GitDiffRequest {
                        sandbox_id,
                        path,
                        base: base.unwrap_or_default(),
                        staged,
                        paths,
                    })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                match format {
                    OutputFormat::Json => json_line(&message_json(&d, "GitDiffResponse")),
                    OutputFormat::Human => print!("{}", d.diff),
                }
                if d.truncated {
                    eprintln!("(the diff was cut at the message limit; narrow it with paths after --)");
                }
            }
            GitCommand::Add { paths } => {
                let s = sandboxes
                    .git_add(api::GitAddRequest { sandbox_id, path, paths })
                    .await
                    .map_err(status_error)?
                    .into_inner()
                    .status
                    .unwrap_or_default();
                print_status(format, &s);
            }
            GitCommand::Commit { message, author: flag, staged_only } => {
                let c = sandboxes
                    .git_commit(api::GitCommitRequest {
                        sandbox_id,
                        path,
                        message,
                        author: Some(author(flag)?),
                        all: !staged_only,
                        allow_empty: false,
                    })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                match format {
                    OutputFormat::Json => json_line(&message_json(&c, "GitCommitResponse")),
                    OutputFormat::Human => println!("committed {} on {}", c.commit, c.branch),
                }
            }
            GitCommand::Branch { name, create } => {
                let switch = |create| api::GitBranchRequest {
                    sandbox_id: sandbox_id.clone(),
                    path: path.clone(),
                    name: name.clone(),
                    create,
                    start_point: String::new(),
                };
                // Without -c: switch to it, creating it when it is new.
                let b = match sandboxes.git_branch(switch(create)).await {
                    Err(e) if !create && e.code() == tonic::Code::FailedPrecondition => {
                        sandboxes.git_branch(switch(true)).await.map_err(|_| status_error(e))?
                    }
                    other => other.map_err(status_error)?,
                }
                .into_inner();
                match format {
                    OutputFormat::Json => json_line(&message_json(&b, "GitBranchResponse")),
                    OutputFormat::Human => println!("on {} at {}", b.branch, b.head),
                }
            }
            GitCommand::Push { remote, branch, force, secrets } => {
                let p = sandboxes
                    .git_push(api::GitPushRequest {
                        sandbox_id,
                        path,
                        remote: remote.unwrap_or_default(),
                        branch: branch.unwrap_or_default(),
                        force,
                        secrets: secret_values(&secrets)?,
                    })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                match format {
                    OutputFormat::Json => json_line(&message_json(&p, "GitPushResponse")),
                    OutputFormat::Human => println!("pushed {} to {} {}", p.commit, p.remote, p.branch),
                }
            }
            GitCommand::Pull { remote, branch, secrets } => {
                let p = sandboxes
                    .git_pull(api::GitPullRequest {
                        sandbox_id,
                        path,
                        remote: remote.unwrap_or_default(),
                        branch: branch.unwrap_or_default(),
                        secrets: secret_values(&secrets)?,
                    })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                match format {
                    OutputFormat::Json => json_line(&message_json(&p, "GitPullResponse")),
                    OutputFormat::Human if p.before == p.after => {
                        println!("already up to date at {}", p.after)
                    }
                    OutputFormat::Human => println!("fast-forwarded {} -> {}", p.before, p.after),
                }
            }
        }
        Ok(0)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authors_are_name_and_email() {
        let a = parse_author("Ada Lovelace <ada@example.com>").unwrap();
        assert_eq!((a.name.as_str(), a.email.as_str()), ("Ada Lovelace", "ada@example.com"));
        assert!(parse_author("Ada").is_err());
        assert!(parse_author("Ada <ada@example.com").is_err());
    }
}
