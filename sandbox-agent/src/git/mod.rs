//! git's network half with a credential (`ProcessService.Git`): a push, a
//! fetch or a clone's fetch ([`clone`]) that carries the workspace source's
//! (or a git skill's) token, done so that nothing of the run user can read
//! the token or make the agent run its code.
//!
//! - git is the image's `/usr/bin/git` (or `/bin/git`), owned by root and
//!   writable by no one else: never the first `git` on a PATH.
//! - It runs as the agent's own user, in a scratch repository of the
//!   agent's (beside the journals, closed to the run user) that borrows the
//!   sandbox repository's objects through `objects/info/alternates`. The
//!   sandbox repository's config (hooks, `core.fsmonitor`, credential
//!   helpers, `url.*.insteadOf`, `remote.*`) is never read, nor any system
//!   or global config.
//! - The token reaches git as an `http.extraHeader` in `GIT_CONFIG_*`
//!   variables of that one process: not in an argv (`/proc/*/cmdline` is
//!   world-readable), and `/proc/<pid>/environ` of another uid is closed to
//!   the run user. Only https (or http to loopback) is allowed, redirects
//!   are not followed, and the URL is the caller's, not the repository's.
//! - Fetched packs (and a shallow clone's boundary, `shallow`) are copied
//!   into the repository with the run user's file credentials, so a link
//!   the run user plants there leads nowhere it could not write itself.

mod clone;

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    ExecResponse, ExitStatus, GitFetch, GitPush, GitRequest, exit_status, git_request,
};

use crate::confine::Root;
use crate::run_user::{FsAs, RunUser};

/// Where the agent looks for git, in order.
const GIT_PATHS: [&str; 2] = ["/usr/bin/git", "/bin/git"];
/// How long one transfer may take when the request sets no bound.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// What git prints that is kept (its errors are short).
const OUTPUT_LIMIT: usize = 64 * 1024;
/// What a clone's answer keeps: its list of refs can be long.
const CLONE_OUTPUT_LIMIT: usize = 1024 * 1024;

/// The agent's git for authenticated transfers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Transfers {
    root: Root,
    /// Where scratch repositories go: the agent's own, closed to the run
    /// user.
    scratch: PathBuf,
    run_user: Option<RunUser>,
}

impl Transfers {
    pub fn new(root: Root, scratch: PathBuf, run_user: Option<RunUser>) -> Self {
        Self { root, scratch, run_user }
    }

    /// Run the push, fetch or clone of `req`; git's own failure is a
    /// non-zero status in the answer, a request the agent refuses is an
    /// error.
    pub async fn run(&self, req: GitRequest) -> Result<ExecResponse, Error> {
        let started = Instant::now();
        check_url(&req.url)?;
        if req.token.is_empty() || req.token.contains(['\n', '\r', '\0']) {
            return Err(Error::invalid_field("token", "required, on one line"));
        }
        let objects = self.objects_of(&req.repo)?;
        let git = git_binary()?;
        let scratch = tempfile::Builder::new()
            .prefix("git-")
            .tempdir_in(&self.scratch)
            .map_err(|e| Error::internal(format!("creating a scratch repository: {e}")))?;
        let timeout = req.timeout_ms.filter(|ms| *ms > 0).map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let git = Git { binary: git, dir: scratch.path().join("r.git"), home: scratch.path().to_path_buf() };
        // GIT_DIR names where the repository goes.
        let init = git.run(&["init", "--quiet", "--bare"], None, timeout).await?;
        if !init.ok() {
            return Ok(init.response(started, OUTPUT_LIMIT));
        }
        std::fs::write(git.dir.join("objects/info/alternates"), format!("{}\n", path_str(&objects)?))
            .map_err(|e| Error::internal(format!("linking the scratch repository: {e}")))?;
        let header = authorization(&req.token);
        let (done, limit) = match req.op {
            Some(git_request::Op::Push(push)) => {
                (git.push(&req.url, &push, &header, timeout).await?, OUTPUT_LIMIT)
            }
            Some(git_request::Op::Fetch(fetch)) => {
                let done = git.fetch(&req.url, &fetch, &header, timeout).await?;
                if done.ok() {
                    self.adopt(&git.dir, &objects).await?;
                }
                (done, OUTPUT_LIMIT)
            }
            Some(git_request::Op::Clone(clone)) => {
                let done = git.clone(&req.url, &clone, &header, timeout).await?;
                if done.ok() {
                    self.adopt(&git.dir, &objects).await?;
                }
                (done, CLONE_OUTPUT_LIMIT)
            }
            None => return Err(Error::invalid_field("op", "push, fetch or clone")),
        };
        Ok(done.response(started, limit))
    }

    /// The objects directory of the repository whose work tree is `repo`:
    /// a real directory inside the root (a `.git` file pointing elsewhere,
    /// or a link, is refused).
    fn objects_of(&self, repo: &str) -> Result<PathBuf, Error> {
        let work_tree = crate::confine::resolve_cwd(&self.root, repo)?;
        let git_dir = work_tree.join(".git");
        let objects = git_dir.join("objects");
        for dir in [&git_dir, &objects] {
            let meta = std::fs::symlink_metadata(dir).map_err(|_| {
                Error::new(ErrorCode::FailedPrecondition, format!("{repo:?} is not a git repository"))
            })?;
            if !meta.is_dir() {
                return Err(Error::new(
                    ErrorCode::FailedPrecondition,
                    format!("{} is not a directory (a linked .git is not supported here)", dir.display()),
                ));
            }
        }
        Ok(objects)
    }

    /// Hand what the scratch repository `scratch` fetched to the
    /// repository whose objects are `objects`, as the run user (off the
    /// async threads: a clone's pack can be large).
    async fn adopt(&self, scratch: &Path, objects: &Path) -> Result<(), Error> {
        let (scratch, objects, user) = (scratch.to_path_buf(), objects.to_path_buf(), self.run_user.clone());
        tokio::task::spawn_blocking(move || {
            adopt_packs(&scratch.join("objects/pack"), &objects.join("pack"), user.as_ref())?;
            let git_dir = objects.parent().unwrap_or(&objects);
            adopt_shallow(&scratch.join("shallow"), &git_dir.join("shallow"), user.as_ref())
        })
        .await
        .map_err(|e| Error::internal(format!("adopting fetched objects: {e}")))?
    }
}

/// Copy the packs git fetched into the repository's `objects/pack`, as
/// `user`; each index after its pack, so git never sees an index without
/// its pack.
fn adopt_packs(from: &Path, to: &Path, user: Option<&RunUser>) -> Result<(), Error> {
    let mut names: Vec<OsString> = match std::fs::read_dir(from) {
        Ok(entries) => entries.flatten().map(|e| e.file_name()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::internal(format!("listing fetched packs: {e}"))),
    };
    names.sort_by_key(|n| Path::new(n).extension().is_some_and(|e| e == "idx"));
    for name in names {
        let mut data = std::fs::File::open(from.join(&name))
            .map_err(|e| Error::internal(format!("reading a fetched pack: {e}")))?;
        let _as_user = FsAs::new(user)?;
        copy_new(&to.join(&name), &mut data)
            .map_err(|e| Error::internal(format!("adding a fetched pack to the repository: {e}")))?;
    }
    Ok(())
}

/// Add the commits of the scratch repository's `shallow` file `from` (a
/// shallow fetch's boundary, without which git would look for the parents
/// of those commits) to the repository's, `to`, as `user`.
fn adopt_shallow(from: &Path, to: &Path, user: Option<&RunUser>) -> Result<(), Error> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let fetched = match std::fs::read_to_string(from) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::internal(format!("reading the fetched shallow list: {e}"))),
    };
    let _as_user = FsAs::new(user)?;
    let failed = |e: std::io::Error| Error::internal(format!("adding to the repository's shallow list: {e}"));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)
        .map_err(failed)?;
    let mut known = String::new();
    file.read_to_string(&mut known).map_err(failed)?;
    let known: std::collections::HashSet<&str> = known.lines().collect();
    let new: String = fetched.lines().filter(|id| !known.contains(id)).map(|id| format!("{id}\n")).collect();
    file.write_all(new.as_bytes()).map_err(failed)
}

/// Create `path` (never through a link) and copy `data` into it; a pack
/// already there has the same name, so the same content.
fn copy_new(path: &Path, data: &mut impl std::io::Read) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    match file {
        Ok(mut file) => std::io::copy(data, &mut file).map(drop),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// https anywhere; http only to a loopback address (tests, a local mirror):
/// a token never crosses a network in clear.
fn check_url(url: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::invalid_field("url", why.to_string()));
    if url.contains(['\n', '\r', '\0', ' ']) {
        return bad("may not contain whitespace");
    }
    if url.starts_with("https://") {
        return Ok(());
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return bad("an authenticated transfer needs an https:// URL");
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return bad("http:// is allowed only to a loopback address; use https://");
    }
    Ok(())
}

/// The header git sends with every request of the transfer.
fn authorization(token: &str) -> String {
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"));
    format!("Authorization: Basic {basic}")
}

/// git at a fixed path, owned by root (or the agent's user) and writable
/// by no one else.
fn git_binary() -> Result<PathBuf, Error> {
    // SAFETY: a plain syscall.
    let me = unsafe { libc::geteuid() };
    for path in GIT_PATHS {
        let Ok(meta) = std::fs::metadata(path) else { continue };
        if meta.is_file() && (meta.uid() == 0 || meta.uid() == me) && meta.mode() & 0o022 == 0 {
            return Ok(PathBuf::from(path));
        }
    }
    Err(Error::new(
        ErrorCode::FailedPrecondition,
        format!(
            "git is not installed at {} (owned by root): the agent needs it for authenticated clones, pushes and pulls",
            GIT_PATHS.join(" or ")
        ),
    ))
}

fn path_str(path: &Path) -> Result<String, Error> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| Error::internal(format!("{} is not UTF-8", path.display())))
}

/// The config every git of a transfer runs with, overriding anything.
const HARDENING: [(&str, &str); 12] = [
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.askPass", ""),
    // An empty value drops every helper configured before it.
    ("credential.helper", ""),
    ("protocol.allow", "never"),
    ("protocol.https.allow", "always"),
    ("protocol.http.allow", "always"),
    ("http.followRedirects", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("submodule.recurse", "false"),
    ("push.recurseSubmodules", "no"),
    // Packs are kept as they come, so they can be handed over whole.
    ("fetch.unpackLimit", "1"),
];

/// One scratch repository and the git that works in it.
struct Git {
    binary: PathBuf,
    dir: PathBuf,
    home: PathBuf,
}

/// What one git run left.
struct Done {
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    timed_out: bool,
}

impl Done {
    fn ok(&self) -> bool {
        !self.timed_out && self.status.success()
    }

    fn response(self, started: Instant, limit: usize) -> ExecResponse {
        use std::os::unix::process::ExitStatusExt;
        let status = match (self.status.code(), self.status.signal()) {
            (Some(code), _) => exit_status::Status::Code(code),
            (None, Some(signal)) => exit_status::Status::Signal(signal),
            (None, None) => exit_status::Status::Code(-1),
        };
        let cut = |mut v: Vec<u8>| {
            let truncated = v.len() > limit;
            v.truncate(limit);
            (v, truncated)
        };
        let (stdout, stdout_truncated) = cut(self.stdout);
        let (stderr, stderr_truncated) = cut(self.stderr);
        ExecResponse {
            status: Some(ExitStatus { status: Some(status) }),
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            timed_out: self.timed_out,
            duration_ms: started.elapsed().as_millis() as u64,
        }
    }
}

impl Git {
    async fn push(&self, url: &str, push: &GitPush, header: &str, timeout: Duration) -> Result<Done, Error> {
        object_id("push.commit", &push.commit)?;
        branch_name("push.branch", &push.branch)?;
        let mut args = vec!["push".to_string(), "--quiet".to_string()];
        if push.force {
            if !push.expect.is_empty() {
                object_id("push.expect", &push.expect)?;
            }
            args.push(format!("--force-with-lease=refs/heads/{}:{}", push.branch, push.expect));
        }
        args.extend([
            "--".to_string(),
            url.to_string(),
            format!("{}:refs/heads/{}", push.commit, push.branch),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&args, Some(header), timeout).await
    }

    /// Fetch the branch (or HEAD); on success stdout is its commit id.
    async fn fetch(
        &self,
        url: &str,
        fetch: &GitFetch,
        header: &str,
        timeout: Duration,
    ) -> Result<Done, Error> {
        let what = match fetch.branch.as_str() {
            "" => "HEAD".to_string(),
            branch => {
                branch_name("fetch.branch", branch)?;
                format!("refs/heads/{branch}")
            }
        };
        // The repository's commits as refs of the scratch one, so the
        // remote sends only what is new.
        for (i, have) in fetch.haves.iter().enumerate() {
            object_id("fetch.haves", have)?;
            let _ = self.run(&["update-ref", &format!("refs/haves/{i}"), have], None, timeout).await?;
        }
        let done =
            self.run(&["fetch", "--quiet", "--no-tags", "--", url, &what], Some(header), timeout).await?;
        if !done.ok() {
            return Ok(done);
        }
        self.run(&["rev-parse", "--verify", "FETCH_HEAD^{commit}"], None, timeout).await
    }

    /// `git ARGS` in the scratch repository with nothing inherited: only
    /// the variables below, no system or global config, the hardening,
    /// and the header when there is one.
    async fn run(&self, args: &[&str], header: Option<&str>, timeout: Duration) -> Result<Done, Error> {
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("LC_ALL", "C")
            .env("GIT_DIR", &self.dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .current_dir(&self.home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut config: Vec<(&str, &str)> = HARDENING.to_vec();
        if let Some(header) = header {
            config.push(("http.extraHeader", header));
        }
        cmd.env("GIT_CONFIG_COUNT", config.len().to_string());
        for (i, (key, value)) in config.iter().enumerate() {
            cmd.env(format!("GIT_CONFIG_KEY_{i}"), key).env(format!("GIT_CONFIG_VALUE_{i}"), value);
        }
        let child =
            cmd.spawn().map_err(|e| Error::internal(format!("starting {}: {e}", self.binary.display())))?;
        let pid = child.id();
        match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(Ok(out)) => {
                Ok(Done { status: out.status, stdout: out.stdout, stderr: out.stderr, timed_out: false })
            }
            Ok(Err(e)) => Err(Error::internal(format!("waiting for git: {e}"))),
            Err(_) => {
                if let Some(pid) = pid {
                    // SAFETY: a plain syscall on the group git leads.
                    unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
                }
                use std::os::unix::process::ExitStatusExt;
                Ok(Done {
                    status: std::process::ExitStatus::from_raw(libc::SIGKILL),
                    stdout: Vec::new(),
                    stderr: b"timed out".to_vec(),
                    timed_out: true,
                })
            }
        }
    }
}

fn object_id(field: &str, id: &str) -> Result<(), Error> {
    let ok = matches!(id.len(), 40 | 64) && id.bytes().all(|b| b.is_ascii_hexdigit());
    if !ok {
        return Err(Error::invalid_field(field, format!("{id:?} is not a full commit id")));
    }
    Ok(())
}

fn branch_name(field: &str, name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && !name.starts_with(['-', '/'])
        && !name.contains([':', ' ', '\\', '~', '^', '?', '*', '[', '\0', '\n'])
        && !name.contains("..");
    if !ok {
        return Err(Error::invalid_field(field, format!("{name:?} is not a branch name")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_only_to_https_or_loopback_http() {
        for ok in [
            "https://github.com/o/r.git",
            "http://127.0.0.1:8080/r.git",
            "http://[::1]/r",
            "http://localhost/r",
        ] {
            check_url(ok).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
        }
        for bad in [
            "http://example.com/r.git",
            "file:///srv/r.git",
            "ext::sh -c id",
            "ssh://h/r",
            "/srv/r.git",
            "http://127.0.0.1.evil.com/r",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_header_is_basic_with_the_access_token_user() {
        assert_eq!(authorization("tok"), "Authorization: Basic eC1hY2Nlc3MtdG9rZW46dG9r");
    }

    #[test]
    fn names_git_would_read_as_options_or_refspecs_are_refused() {
        assert!(branch_name("b", "feature/x").is_ok());
        for bad in ["-f", "a:b", "a..b", ""] {
            assert!(branch_name("b", bad).is_err(), "{bad}");
        }
        assert!(object_id("c", &"a".repeat(40)).is_ok());
        assert!(object_id("c", "HEAD").is_err());
    }
}
