//! The fetch of a clone (`GitClone`): what `git clone` would fetch, fetched
//! like every transfer (the scratch repository, the hardening, the token in
//! that git's environment alone) for a repository the caller has just made
//! as the run user. The caller makes the refs and checks out, as the run
//! user, from what this prints.
//!
//! - An empty ref is the branch the remote's HEAD names (`ls-remote
//!   --symref`); a name is a branch, else a tag, as for `git clone
//!   --branch`; a full commit id is fetched by itself.
//! - A depth fetches that one branch (its tags following, as `git clone
//!   --single-branch` does), tag or commit; the full history fetches every
//!   branch (as `refs/remotes/origin/*`) and tag.

use std::collections::HashMap;
use std::time::Duration;

use shared::error::Error;
use shared::proto::agent::v1::GitClone;

use super::{Done, Git, branch_name, object_id};

/// What the clone checks out.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// A branch of the remote, fetched as `refs/remotes/origin/<name>`.
    Branch(String),
    Tag(String),
    /// A commit id: given, or the remote's HEAD when it is on no branch.
    Commit(String),
}

/// What `ls-remote --symref` said.
#[derive(Debug, Default)]
struct Listing {
    /// The branch the remote's HEAD names.
    head_branch: Option<String>,
    /// Object id by ref name (`HEAD` included).
    refs: HashMap<String, String>,
}

impl Listing {
    fn parse(out: &[u8]) -> Self {
        let mut listing = Listing::default();
        for line in String::from_utf8_lossy(out).lines() {
            let Some((left, name)) = line.split_once('\t') else { continue };
            match left.strip_prefix("ref: ") {
                Some(target) if name == "HEAD" => {
                    listing.head_branch = target.strip_prefix("refs/heads/").map(str::to_string);
                }
                Some(_) => {}
                None => {
                    listing.refs.insert(name.to_string(), left.to_string());
                }
            }
        }
        listing
    }

    /// What `git_ref` names here; `None` for a remote without commits.
    fn target(&self, git_ref: &str) -> Result<Option<Target>, String> {
        if git_ref.is_empty() {
            let Some(head) = self.refs.get("HEAD") else { return Ok(None) };
            return Ok(Some(match &self.head_branch {
                Some(branch) => Target::Branch(branch.clone()),
                None => Target::Commit(head.clone()),
            }));
        }
        if self.refs.contains_key(&format!("refs/heads/{git_ref}")) {
            Ok(Some(Target::Branch(git_ref.to_string())))
        } else if self.refs.contains_key(&format!("refs/tags/{git_ref}")) {
            Ok(Some(Target::Tag(git_ref.to_string())))
        } else {
            Err(format!("fatal: Remote branch {git_ref} not found in upstream origin"))
        }
    }
}

/// The `git fetch` arguments after `--quiet` that bring `target` (with the
/// refspecs, after the URL) at `depth` (0: the full history).
fn fetch_args(url: &str, target: &Target, depth: u32) -> Vec<String> {
    let mut args = Vec::new();
    if depth > 0 {
        args.extend(["--depth".to_string(), depth.to_string()]);
    }
    let refspec = match (target, depth) {
        (Target::Commit(id), _) => ("--no-tags", id.clone()),
        (_, 0) => ("--tags", "+refs/heads/*:refs/remotes/origin/*".to_string()),
        // Without --no-tags the tags on what is fetched follow.
        (Target::Branch(b), _) => ("", format!("+refs/heads/{b}:refs/remotes/origin/{b}")),
        (Target::Tag(t), _) => ("--no-tags", format!("+refs/tags/{t}:refs/tags/{t}")),
    };
    if !refspec.0.is_empty() {
        args.push(refspec.0.to_string());
    }
    args.extend(["--".to_string(), url.to_string(), refspec.1]);
    args
}

/// A failure of the clone's own, said as git would.
fn refused(message: String) -> Done {
    use std::os::unix::process::ExitStatusExt;
    Done {
        status: std::process::ExitStatus::from_raw(128 << 8),
        stdout: Vec::new(),
        stderr: format!("{message}\n").into_bytes(),
        timed_out: false,
    }
}

impl Git {
    /// Fetch what a clone of `url` at `clone.ref` needs; on success stdout
    /// lists what to check out and the refs to make (see `GitClone`).
    pub(super) async fn clone(
        &self,
        url: &str,
        clone: &GitClone,
        header: &str,
        timeout: Duration,
    ) -> Result<Done, Error> {
        let git_ref = clone.r#ref.as_str();
        let mut listing = Listing::default();
        let target = if object_id("clone.ref", git_ref).is_ok() {
            Target::Commit(git_ref.to_string())
        } else {
            if !git_ref.is_empty() {
                branch_name("clone.ref", git_ref)?;
            }
            let mut args = vec!["ls-remote".to_string(), "--symref".to_string(), "--".to_string()];
            args.extend([url.to_string(), "HEAD".to_string()]);
            if !git_ref.is_empty() {
                args.extend([format!("refs/heads/{git_ref}"), format!("refs/tags/{git_ref}")]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let listed = self.run(&args, Some(header), timeout).await?;
            if !listed.ok() {
                return Ok(listed);
            }
            listing = Listing::parse(&listed.stdout);
            match listing.target(git_ref) {
                Ok(Some(target)) => target,
                // Nothing to fetch: the caller keeps its empty repository.
                Ok(None) => return Ok(Done { stdout: Vec::new(), ..listed }),
                Err(message) => return Ok(refused(message)),
            }
        };
        let mut args = vec!["fetch".to_string(), "--quiet".to_string()];
        args.extend(fetch_args(url, &target, clone.depth));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let fetched = self.run(&args, Some(header), timeout).await?;
        if !fetched.ok() {
            return Ok(fetched);
        }

        let (at, checkout_ref) = match &target {
            Target::Branch(b) => (format!("refs/remotes/origin/{b}"), format!(" refs/heads/{b}")),
            Target::Tag(t) => (format!("refs/tags/{t}"), format!(" refs/tags/{t}")),
            Target::Commit(id) => (id.clone(), String::new()),
        };
        let commit = self.run(&["rev-parse", "--verify", &format!("{at}^{{commit}}")], None, timeout).await?;
        if !commit.ok() {
            return Ok(commit);
        }
        let refs = self
            .run(
                &["for-each-ref", "--format=%(refname) %(objectname)", "refs/remotes/origin/", "refs/tags/"],
                None,
                timeout,
            )
            .await?;
        if !refs.ok() {
            return Ok(refs);
        }
        let mut out = format!("checkout {}{checkout_ref}\n", String::from_utf8_lossy(&commit.stdout).trim());
        let refs = String::from_utf8_lossy(&refs.stdout).into_owned();
        for line in refs.lines() {
            out.push_str(&format!("ref {line}\n"));
        }
        if let Some(head) = &listing.head_branch {
            let tracking = format!("refs/remotes/origin/{head}");
            if refs.lines().any(|l| l.split(' ').next() == Some(tracking.as_str())) {
                out.push_str(&format!("symref refs/remotes/origin/HEAD {tracking}\n"));
            }
        }
        Ok(Done { stdout: out.into_bytes(), ..fetched })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: &str = "1111111111111111111111111111111111111111";
    const TAG: &str = "2222222222222222222222222222222222222222";

    fn listing() -> Listing {
        Listing::parse(
            format!(
                "ref: refs/heads/main\tHEAD\n{MAIN}\tHEAD\n{MAIN}\trefs/heads/main\n{TAG}\trefs/tags/v1\n{MAIN}\trefs/tags/v1^{{}}\n"
            )
            .as_bytes(),
        )
    }

    #[test]
    fn an_empty_ref_is_the_branch_the_remote_head_names_and_a_name_a_branch_before_a_tag() {
        let l = listing();
        assert_eq!(l.target("").unwrap(), Some(Target::Branch("main".into())));
        assert_eq!(l.target("v1").unwrap(), Some(Target::Tag("v1".into())));
        assert_eq!(l.target("main").unwrap(), Some(Target::Branch("main".into())));
        assert!(l.target("nope").unwrap_err().contains("Remote branch nope not found"));
        let detached = Listing::parse(format!("{MAIN}\tHEAD\n").as_bytes());
        assert_eq!(detached.target("").unwrap(), Some(Target::Commit(MAIN.into())));
        assert_eq!(Listing::parse(b"").target("").unwrap(), None, "a remote without commits");
    }

    #[test]
    fn a_depth_fetches_one_thing_and_the_full_history_every_branch_and_tag() {
        let branch = Target::Branch("dev".into());
        assert_eq!(
            fetch_args("https://h/r", &branch, 1),
            ["--depth", "1", "--", "https://h/r", "+refs/heads/dev:refs/remotes/origin/dev"]
        );
        assert_eq!(
            fetch_args("https://h/r", &branch, 0),
            ["--tags", "--", "https://h/r", "+refs/heads/*:refs/remotes/origin/*"]
        );
        assert_eq!(
            fetch_args("https://h/r", &Target::Tag("v1".into()), 2),
            ["--depth", "2", "--no-tags", "--", "https://h/r", "+refs/tags/v1:refs/tags/v1"]
        );
        assert_eq!(
            fetch_args("https://h/r", &Target::Commit(MAIN.into()), 0),
            ["--no-tags", "--", "https://h/r", MAIN]
        );
    }
}
