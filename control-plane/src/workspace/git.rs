//! Cloning a workspace's source and git skills, with `git` inside the
//! sandbox.
//!
//! - Shallow by default (`--depth 1 --single-branch`), a depth, or the full
//!   history. A local path is cloned as a `file://` URL: git ignores
//!   `--depth` for plain paths.
//! - A ref is a branch or tag (`--branch`); a full commit id is fetched into
//!   a fresh repository instead (`--branch` cannot name a commit). Empty:
//!   the branch the remote's HEAD names.
//! - Without a token, `git clone` runs as the run user.
//! - With a token (the named `auth_secret`) and an http(s) URL, no process
//!   of the run user ever holds the token: the run user's git (which may be
//!   any `git` first on its PATH) only makes the repository (`git init`),
//!   and, once the objects are in, the remote, the refs and the checkout.
//!   The fetch in between is the agent's (`ProcessService.Git`, a
//!   `GitClone`): its own `/usr/bin/git`, as its own user, hardened, the
//!   token in that git's environment alone (see the agent's `git` module).
//!   Only https, or http to loopback, carries a token; another scheme (a
//!   local path, ssh) has no use for it and is cloned as without one.
//! - The token is never in an argv, a URL, a progress event or an error;
//!   errors name the URL without credentials and carry git's own message.

use std::collections::HashMap;
use std::time::Duration;

use shared::proto::agent::v1 as agent;
use shared::secret::Secret;

use super::remote::{Finished, Remote};
use crate::provision::{Error, Secrets};

/// How much history a clone fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum History {
    Depth(u32),
    Full,
}

/// One clone to make.
#[derive(Debug)]
pub(crate) struct Clone<'a> {
    pub url: &'a str,
    pub git_ref: &'a str,
    pub history: History,
    /// Relative to the sandbox root; `.` for the root itself.
    pub into: &'a str,
    pub token: Option<&'a Secret>,
}

/// `url` as git should fetch it: a plain absolute path becomes `file://`.
pub(crate) fn fetch_url(url: &str) -> String {
    if url.starts_with('/') { format!("file://{url}") } else { url.to_string() }
}

/// `url` fit for a message: any `user:password@` removed.
pub(crate) fn display_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://{host}{path}"),
        None => url.to_string(),
    }
}

/// Whether git fetches `url` over HTTP, where a token is of use.
fn is_http(url: &str) -> bool {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    matches!(scheme.as_deref(), Some("https" | "http"))
}

fn is_commit_id(r: &str) -> bool {
    r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The git invocations of one clone without a token, in order, each an
/// argv.
pub(crate) fn commands(c: &Clone<'_>) -> Vec<Vec<String>> {
    let url = fetch_url(c.url);
    let depth = match c.history {
        History::Depth(d) => Some(d.max(1).to_string()),
        History::Full => None,
    };
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    if is_commit_id(c.git_ref) {
        let git_c = |args: &[&str]| {
            let mut v = owned(&["git", "-C", c.into]);
            v.extend(owned(args));
            v
        };
        let mut fetch = git_c(&["fetch", "--quiet"]);
        if let Some(d) = &depth {
            fetch.extend(["--depth".to_string(), d.clone()]);
        }
        fetch.extend(["origin".to_string(), c.git_ref.to_string()]);
        return vec![
            owned(&["git", "init", "--quiet", c.into]),
            git_c(&["remote", "add", "origin", &url]),
            fetch,
            git_c(&["checkout", "--quiet", "--detach", "FETCH_HEAD"]),
        ];
    }
    let mut clone = owned(&["git", "clone", "--quiet"]);
    if let Some(d) = depth {
        clone.extend(["--depth".to_string(), d, "--single-branch".to_string()]);
    }
    if !c.git_ref.is_empty() {
        clone.extend(["--branch".to_string(), c.git_ref.to_string()]);
    }
    clone.extend(["--".to_string(), url, c.into.to_string()]);
    vec![clone]
}

/// The variable [`SAFE_SOURCE_WRAPPER`] reads a local source's path from.
const SAFE_DIR_VAR: &str = "SANDHOLD_GIT_SAFE_DIR";

/// Runs its arguments (a git command) with a temporary global config that
/// includes the user's own and names `$SANDHOLD_GIT_SAFE_DIR` a
/// `safe.directory`. A local source (a path or `file://`) is usually the
/// operator's read-only mount, owned by another user than the run user,
/// and git refuses to read a repository of another owner; it honours
/// `safe.directory` only from a system or global config file (not from
/// `-c` or `GIT_CONFIG_*` before git 2.46, e.g. Debian 12's 2.39).
const SAFE_SOURCE_WRAPPER: &str = r#"f=$(mktemp) || exit 1
printf '[include]\n\tpath = ~/.gitconfig\n[safe]\n\tdirectory = %s\n' "$SANDHOLD_GIT_SAFE_DIR" >"$f"
GIT_CONFIG_GLOBAL=$f "$@"
rc=$?
rm -f "$f"
exit $rc"#;

/// The path of a local source, `None` for a remote one.
fn local_source(url: &str) -> Option<String> {
    fetch_url(url).strip_prefix("file://").map(str::to_string)
}

/// `argv` as run for a clone from `url`: through [`SAFE_SOURCE_WRAPPER`]
/// when the source is local.
fn wrapped(url: &str, argv: Vec<String>) -> Vec<String> {
    if local_source(url).is_none() {
        return argv;
    }
    let mut wrapped = ["sh", "-c", SAFE_SOURCE_WRAPPER, "sh"].map(String::from).to_vec();
    wrapped.extend(argv);
    wrapped
}

/// The environment of the run user's git: no prompts, and a local
/// source's path for [`SAFE_SOURCE_WRAPPER`]. Never a token.
pub(crate) fn environment(url: &str) -> HashMap<String, String> {
    let mut env = HashMap::from([("GIT_TERMINAL_PROMPT".to_string(), "0".to_string())]);
    if let Some(path) = local_source(url) {
        env.insert(SAFE_DIR_VAR.to_string(), path);
    }
    env
}

/// Make the clone; a failure names the URL (without credentials) and
/// git's error.
/// Keep `patterns` (gitignore lines) out of the workspace repository's
/// untracked files, in `.git/info/exclude` (the clone's own, never a
/// tracked `.gitignore`): what Sandhold writes into a workspace (the
/// instructions file and its aliases, projected skills) is not the
/// user's change, and `git add --all` (a commit, an attempt's push) must
/// not take it. Nothing when the workspace is no repository.
pub(crate) async fn exclude(remote: &Remote<'_>, patterns: &[String]) -> Result<(), Error> {
    const FILE: &str = ".git/info/exclude";
    if patterns.is_empty() || !remote.exists(".git/HEAD").await? {
        return Ok(());
    }
    let mut text =
        remote.read(FILE).await?.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let missing: Vec<&String> = patterns.iter().filter(|p| !text.lines().any(|l| l == p.as_str())).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# written by Sandhold: what it projects into the workspace\n");
    for p in missing {
        text.push_str(p);
        text.push('\n');
    }
    remote.write(FILE, text.as_bytes(), None).await
}

pub(crate) async fn clone(remote: &Remote<'_>, c: &Clone<'_>, timeout: Duration) -> Result<(), Error> {
    if let Some(token) = c.token.filter(|_| is_http(c.url)) {
        return clone_with_token(remote, c, token, timeout).await;
    }
    for argv in commands(c) {
        step(remote, c, &wrapped(c.url, argv), Vec::new(), timeout).await?;
    }
    // Credentials written into the URL would stay in .git/config (and in
    // any snapshot): keep the remote without them.
    let clean = display_url(&fetch_url(c.url));
    if clean != fetch_url(c.url) {
        let argv = ["git", "-C", c.into, "remote", "set-url", "origin", &clean].map(String::from);
        remote.run(&argv, environment(c.url), timeout).await?;
    }
    Ok(())
}

/// One git command of the run user's for the clone `c`, with `stdin`; a
/// failure names the URL (without credentials) and git's error.
async fn step(
    remote: &Remote<'_>,
    c: &Clone<'_>,
    argv: &[String],
    stdin: Vec<u8>,
    timeout: Duration,
) -> Result<(), Error> {
    let shown = display_url(c.url);
    let done =
        remote.run_with_input(argv, environment(c.url), stdin, timeout).await.map_err(|e| match e {
            Error::Agent(mut e) => {
                e.message = format!("cloning {shown}: {} (is git installed in the sandbox?)", e.message);
                Error::Agent(e)
            }
            other => other,
        })?;
    failed(remote, c, &done, timeout)
}

/// `done` as the clone's error when it failed.
fn failed(remote: &Remote<'_>, c: &Clone<'_>, done: &Finished, timeout: Duration) -> Result<(), Error> {
    if done.ok() {
        return Ok(());
    }
    let shown = display_url(c.url);
    let git_error = String::from_utf8_lossy(&done.stderr);
    // git may echo the URL it was given, credentials and all.
    let git_error = remote.redactor.mask(git_error.trim()).replace(c.url, &shown);
    let why = if done.timed_out {
        format!("timed out after {timeout:?}")
    } else {
        format!("git exited with {}", done.code)
    };
    Err(Error::CloneFailed { url: shown, why, git_error, exit_code: done.code })
}

/// The clone of an http(s) source with `token`: the repository made by the
/// run user's git, the fetch by the agent's, then the remote, the refs and
/// the checkout by the run user's again; the token only in the agent.
async fn clone_with_token(
    remote: &Remote<'_>,
    c: &Clone<'_>,
    token: &Secret,
    timeout: Duration,
) -> Result<(), Error> {
    let git_c = |args: &[&str]| {
        let mut v = vec!["git".to_string(), "-C".to_string(), c.into.to_string()];
        v.extend(args.iter().map(|a| a.to_string()));
        v
    };
    let init = ["git", "init", "--quiet", c.into].map(String::from);
    step(remote, c, &init, Vec::new(), timeout).await?;
    let depth = match c.history {
        History::Depth(d) => d.max(1),
        History::Full => 0,
    };
    let req = agent::GitRequest {
        repo: c.into.to_string(),
        url: c.url.to_string(),
        token: token.expose().to_string(),
        op: Some(agent::git_request::Op::Clone(agent::GitClone { r#ref: c.git_ref.to_string(), depth })),
        timeout_ms: None,
    };
    let done = remote.git(req, timeout, &format!("cloning {}", display_url(c.url))).await?;
    failed(remote, c, &done, timeout)?;
    let fetched = Fetched::parse(&String::from_utf8_lossy(&done.stdout));

    let clean = display_url(c.url);
    let mut add = git_c(&["remote", "add"]);
    if let (History::Depth(_), Some((_, Some(branch)))) = (c.history, &fetched.checkout) {
        // One branch fetched, one branch to fetch later, as `git clone
        // --single-branch` leaves it.
        if let Some(b) = branch.strip_prefix("refs/heads/") {
            add.extend(["-t".to_string(), b.to_string()]);
        }
    }
    add.extend(["--".to_string(), "origin".to_string(), clean]);
    step(remote, c, &add, Vec::new(), timeout).await?;
    if !fetched.refs.is_empty() {
        let updates: String = fetched.refs.iter().map(|(name, id)| format!("update {name} {id}\n")).collect();
        step(remote, c, &git_c(&["update-ref", "--stdin"]), updates.into_bytes(), timeout).await?;
    }
    for (name, target) in &fetched.symrefs {
        step(remote, c, &git_c(&["symbolic-ref", name, target]), Vec::new(), timeout).await?;
    }
    let checkout = match &fetched.checkout {
        None => return Ok(()),
        Some((_, Some(at))) if at.starts_with("refs/heads/") => {
            let b = &at["refs/heads/".len()..];
            git_c(&["checkout", "--quiet", "-b", b, "--track", &format!("refs/remotes/origin/{b}")])
        }
        Some((commit, _)) => git_c(&["checkout", "--quiet", "--detach", commit]),
    };
    step(remote, c, &checkout, Vec::new(), timeout).await
}

/// What the agent's clone fetch brought (the stdout of a `GitClone`).
#[derive(Debug, Default, PartialEq, Eq)]
struct Fetched {
    /// The commit to check out, and the ref it is at (`refs/heads/<b>`,
    /// `refs/tags/<t>`) when it is at one; `None`: the remote has no
    /// commits.
    checkout: Option<(String, Option<String>)>,
    /// `(name, object id)` of each ref to make.
    refs: Vec<(String, String)>,
    /// `(name, target)` of each symbolic ref to make.
    symrefs: Vec<(String, String)>,
}

impl Fetched {
    /// Complete lines only: an answer cut at its limit loses its last refs,
    /// never makes a wrong one.
    fn parse(out: &str) -> Self {
        let mut fetched = Fetched::default();
        for line in out.split_inclusive('\n').filter_map(|l| l.strip_suffix('\n')) {
            let mut words = line.split(' ');
            match (words.next(), words.next(), words.next()) {
                (Some("checkout"), Some(commit), at) => {
                    fetched.checkout = Some((commit.to_string(), at.map(str::to_string)));
                }
                (Some("ref"), Some(name), Some(id)) => fetched.refs.push((name.to_string(), id.to_string())),
                (Some("symref"), Some(name), Some(target)) => {
                    fetched.symrefs.push((name.to_string(), target.to_string()))
                }
                _ => {}
            }
        }
        fetched
    }
}

/// The secrets the workspace's git authenticates with (its source's and
/// its git skills' `auth_secret`): for git alone, so withheld from every
/// process of the sandbox like a model key.
pub(crate) fn auth_secrets(definition: &shared::proto::v1::SandboxDefinition) -> Vec<String> {
    use shared::proto::v1::{skill, source};
    let Some(w) = &definition.workspace else { return Vec::new() };
    let source = match w.source.as_ref().and_then(|s| s.source.as_ref()) {
        Some(source::Source::Git(g)) => Some(g.auth_secret.clone()),
        _ => None,
    };
    let skills = w.skills.iter().filter_map(|s| match &s.skill {
        Some(skill::Skill::Git(g)) => Some(g.auth_secret.clone()),
        _ => None,
    });
    source.into_iter().chain(skills).filter(|name| !name.is_empty()).collect()
}

/// The value of the secret `name` (none when `name` is empty); an error
/// naming it, never a value, when the request did not pass it.
pub(super) fn auth_token<'a>(
    secrets: &'a Secrets,
    name: &str,
    what: &str,
) -> Result<Option<&'a Secret>, Error> {
    if name.is_empty() {
        return Ok(None);
    }
    secrets.get(name).map(Some).ok_or_else(|| Error::SecretNotPassed {
        needs: format!("{what} authenticates with"),
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clone_of<'a>(url: &'a str, git_ref: &'a str, history: History) -> Clone<'a> {
        Clone { url, git_ref, history, into: ".", token: None }
    }

    #[test]
    fn shallow_by_default_a_depth_or_full() {
        let shallow = commands(&clone_of("https://h/r.git", "", History::Depth(1)));
        assert_eq!(
            shallow,
            vec![
                ["git", "clone", "--quiet", "--depth", "1", "--single-branch", "--", "https://h/r.git", "."]
                    .map(String::from)
                    .to_vec()
            ]
        );
        let full = commands(&clone_of("/srv/r.git", "dev", History::Full));
        assert_eq!(
            full,
            vec![
                ["git", "clone", "--quiet", "--branch", "dev", "--", "file:///srv/r.git", "."]
                    .map(String::from)
                    .to_vec()
            ]
        );
    }

    #[test]
    fn a_commit_id_is_fetched_into_a_fresh_repository() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let cmds = commands(&clone_of("file:///r.git", sha, History::Depth(2)));
        assert_eq!(cmds.len(), 4);
        assert_eq!(
            cmds[2],
            ["git", "-C", ".", "fetch", "--quiet", "--depth", "2", "origin", sha].map(String::from)
        );
    }

    #[test]
    fn credentials_leave_the_url_and_the_token_stays_out_of_argv() {
        assert_eq!(display_url("https://user:pw@github.com/o/r.git"), "https://github.com/o/r.git");
        assert_eq!(display_url("https://tok@h"), "https://h");
        assert_eq!(display_url("file:///a@b/r.git"), "file:///a@b/r.git");
        assert_eq!(display_url("/srv/r.git"), "/srv/r.git");
        let token = Secret::new("tok-value-123");
        let c = Clone { token: Some(&token), ..clone_of("https://h/r.git", "main", History::Depth(1)) };
        for argv in commands(&c) {
            assert!(argv.iter().all(|a| !a.contains("tok-value-123")), "{argv:?}");
        }
    }

    #[test]
    fn a_token_is_for_http_sources_only() {
        for http in ["https://h/r.git", "HTTPS://h/r.git", "http://127.0.0.1:8/r.git"] {
            assert!(is_http(http), "{http}");
        }
        for other in ["/srv/r.git", "file:///srv/r.git", "ssh://h/r.git", "git@h:r.git", "git://h/r"] {
            assert!(!is_http(other), "{other}");
        }
    }

    #[test]
    fn the_agents_answer_says_what_to_check_out_and_which_refs_to_make() {
        let main = "1".repeat(40);
        let tag = "2".repeat(40);
        let out = format!(
            "checkout {main} refs/heads/main\nref refs/remotes/origin/main {main}\nref refs/tags/v1 {tag}\n\
             symref refs/remotes/origin/HEAD refs/remotes/origin/main\nref refs/tags/cut-sh"
        );
        let fetched = Fetched::parse(&out);
        assert_eq!(fetched.checkout, Some((main.clone(), Some("refs/heads/main".to_string()))));
        assert_eq!(
            fetched.refs,
            [("refs/remotes/origin/main".to_string(), main.clone()), ("refs/tags/v1".to_string(), tag)],
            "a line cut at the output limit is dropped"
        );
        assert_eq!(
            fetched.symrefs,
            [("refs/remotes/origin/HEAD".to_string(), "refs/remotes/origin/main".to_string())]
        );
        assert_eq!(Fetched::parse(&format!("checkout {main}\n")).checkout, Some((main, None)));
        assert_eq!(Fetched::parse(""), Fetched::default(), "a remote without commits");
    }

    #[test]
    fn a_local_source_is_cloned_with_itself_as_a_safe_directory() {
        let env = environment("/srv/r.git");
        assert_eq!(env.get(SAFE_DIR_VAR).map(String::as_str), Some("/srv/r.git"));
        let argv = vec!["git".to_string(), "clone".to_string()];
        let local = wrapped("file:///srv/r.git", argv.clone());
        assert_eq!(local[..2], ["sh", "-c"]);
        assert_eq!(local[4..], argv[..], "the git command runs as it was, through the wrapper");
        assert_eq!(wrapped("https://h/r.git", argv.clone()), argv, "a remote source needs no wrapper");
        assert!(!environment("https://h/r.git").contains_key(SAFE_DIR_VAR));
    }

    /// The wrapper with the machine's own sh and git: a repository owned by
    /// someone else is refused without it and cloned with it.
    #[test]
    fn the_wrapper_makes_git_accept_the_source() {
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                SAFE_SOURCE_WRAPPER,
                "sh",
                "sh",
                "-c",
                "git config --global --get-all safe.directory",
            ])
            .env(SAFE_DIR_VAR, "/srv/a b.git")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "/srv/a b.git\n");
    }
}
