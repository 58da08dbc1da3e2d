//! Cloning a workspace's source and git skills, with `git` inside the
//! sandbox.
//!
//! - Shallow by default (`--depth 1 --single-branch`), a depth, or the full
//!   history. A local path is cloned as a `file://` URL: git ignores
//!   `--depth` for plain paths.
//! - A ref is a branch or tag (`--branch`); a full commit id is fetched into
//!   a fresh repository instead (`--branch` cannot name a commit).
//! - An HTTPS token comes from a named secret and reaches git only through
//!   the environment of the clone: a credential helper defined in
//!   `GIT_CONFIG_*` variables prints it from `$SANDHOLD_GIT_TOKEN`. It is
//!   never in an argv, a URL, a progress event or an error.
//! - Errors name the URL without credentials and carry git's own message.

use std::collections::HashMap;
use std::time::Duration;

use shared::secret::Secret;

use super::remote::Remote;
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

/// The variable the credential helper reads the token from.
const TOKEN_VAR: &str = "SANDHOLD_GIT_TOKEN";
/// Prints the token as a password; defined in the environment, holds no
/// secret itself.
const CREDENTIAL_HELPER: &str = "!f() { test \"$1\" = get || return 0; echo username=x-access-token; echo \"password=$SANDHOLD_GIT_TOKEN\"; }; f";

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

fn is_commit_id(r: &str) -> bool {
    r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The git invocations of one clone, in order, each an argv.
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

/// The environment of the clone: no prompts, the token helper when there
/// is a token, and a local source's path for [`SAFE_SOURCE_WRAPPER`].
pub(crate) fn environment(token: Option<&Secret>, url: &str) -> HashMap<String, String> {
    let mut env = HashMap::from([("GIT_TERMINAL_PROMPT".to_string(), "0".to_string())]);
    if let Some(token) = token {
        env.insert(TOKEN_VAR.to_string(), token.expose().to_string());
        env.insert("GIT_CONFIG_COUNT".to_string(), "1".to_string());
        env.insert("GIT_CONFIG_KEY_0".to_string(), "credential.helper".to_string());
        env.insert("GIT_CONFIG_VALUE_0".to_string(), CREDENTIAL_HELPER.to_string());
    }
    if let Some(path) = local_source(url) {
        env.insert(SAFE_DIR_VAR.to_string(), path);
    }
    env
}

/// Make the clone; a failure names the URL (without credentials) and
/// git's error.
pub(crate) async fn clone(remote: &Remote<'_>, c: &Clone<'_>, timeout: Duration) -> Result<(), Error> {
    let shown = display_url(c.url);
    for argv in commands(c) {
        let done = remote.run(&wrapped(c.url, argv), environment(c.token, c.url), timeout).await.map_err(
            |e| match e {
                Error::Agent(mut e) => {
                    e.message = format!("cloning {shown}: {} (is git installed in the sandbox?)", e.message);
                    Error::Agent(e)
                }
                other => other,
            },
        )?;
        if done.ok() {
            continue;
        }
        let git_error = String::from_utf8_lossy(&done.stderr);
        // git may echo the URL it was given, credentials and all.
        let git_error = remote.redactor.mask(git_error.trim()).replace(c.url, &shown);
        let why = if done.timed_out {
            format!("timed out after {timeout:?}")
        } else {
            format!("git exited with {}", done.code)
        };
        return Err(Error::CloneFailed { url: shown, why, git_error, exit_code: done.code });
    }
    // Credentials written into the URL would stay in .git/config (and in
    // any snapshot): keep the remote without them.
    let clean = display_url(&fetch_url(c.url));
    if clean != fetch_url(c.url) {
        let argv = ["git", "-C", c.into, "remote", "set-url", "origin", &clean].map(String::from);
        remote.run(&argv, environment(None, c.url), timeout).await?;
    }
    Ok(())
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
        let env = environment(Some(&token), "https://h/r.git");
        assert_eq!(env.get(TOKEN_VAR).map(String::as_str), Some("tok-value-123"));
        assert!(env.values().filter(|v| v.contains("tok-value-123")).count() == 1, "only the token variable");
    }

    #[test]
    fn a_local_source_is_cloned_with_itself_as_a_safe_directory() {
        let env = environment(None, "/srv/r.git");
        assert_eq!(env.get(SAFE_DIR_VAR).map(String::as_str), Some("/srv/r.git"));
        let argv = vec!["git".to_string(), "clone".to_string()];
        let local = wrapped("file:///srv/r.git", argv.clone());
        assert_eq!(local[..2], ["sh", "-c"]);
        assert_eq!(local[4..], argv[..], "the git command runs as it was, through the wrapper");
        assert_eq!(wrapped("https://h/r.git", argv.clone()), argv, "a remote source needs no wrapper");
        assert!(!environment(None, "https://h/r.git").contains_key(SAFE_DIR_VAR));
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
