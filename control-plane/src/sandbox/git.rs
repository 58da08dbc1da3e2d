//! Git on a repository in a live sandbox (the workspace root by default):
//! status, diff, add, commit, branch, push and pull, each one or a few
//! `git` commands run by the sandbox's agent as the run user, with their
//! output parsed into structured answers.
//!
//! - Nothing the caller sends is read by git as an option: refs, remotes
//!   and branch names starting with `-` are refused, paths follow `--`.
//! - Push and pull to `origin` authenticate with the token of the
//!   workspace source's `auth_secret` (the call's `secrets`, else the
//!   sandbox's last ensure), to the source's URL: the network half runs in
//!   the agent (`ProcessService.Git`) as the agent's user, never the run
//!   user, with none of the repository's hooks or config; the local half
//!   (which commit, the tracking ref, the merge) runs as the run user. A
//!   token never reaches a process of the run user, nor a remote the
//!   repository names (the run can rewrite `.git/config`). Other remotes
//!   get no token.
//! - git's refusals (nothing to commit, a rejected push, a diverged pull)
//!   are FAILED_PRECONDITION with git's own message.

use std::collections::HashMap;

use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use shared::secret::Secret;

use super::ensure::secrets_of;
use super::lifecycle::Live;
use super::{Error, Sandboxes, definition};
use crate::provision::InvalidField;
use crate::store::Tenant;

/// How long one git command may run (a push of a large history is the
/// long one).
const GIT_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// A repository in a live sandbox.
struct Repo {
    live: Live,
    /// Relative to the workspace root.
    path: String,
}

/// What one git command printed.
struct Output {
    stdout: Vec<u8>,
    truncated: bool,
}

impl Output {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).trim_end().to_string()
    }
}

/// The credential of the workspace source: its URL and token.
struct Credential {
    url: String,
    token: Secret,
}

/// `done` as an [`Output`], or [`Error::Git`] carrying git's message when
/// it failed (`what` names the command).
fn outcome(what: &str, done: agent::ExecResponse) -> Result<Output, Error> {
    let code = match done.status.and_then(|s| s.status) {
        Some(agent::exit_status::Status::Code(c)) => c,
        Some(agent::exit_status::Status::Signal(n)) => 128 + n,
        None => -1,
    };
    if done.timed_out {
        return Err(Error::Git(format!("git {what} timed out")));
    }
    if code != 0 {
        let said = [done.stderr, done.stdout]
            .iter()
            .map(|b| String::from_utf8_lossy(b).trim().to_string())
            .find(|s| !s.is_empty())
            .unwrap_or_else(|| format!("exit code {code}"));
        return Err(Error::Git(format!("git {what}: {said}")));
    }
    Ok(Output { stdout: done.stdout, truncated: done.stdout_truncated })
}

impl Repo {
    /// The push or fetch `op` with `credential`, by the agent's own git.
    async fn transfer(&self, credential: &Credential, op: agent::git_request::Op) -> Result<Output, Error> {
        let what = match op {
            agent::git_request::Op::Push(_) => "push",
            agent::git_request::Op::Fetch(_) => "fetch",
            agent::git_request::Op::Clone(_) => "clone",
        };
        let done = self
            .live
            .agent
            .process()
            .git(agent::GitRequest {
                repo: self.path.clone(),
                url: credential.url.clone(),
                token: credential.token.expose().to_string(),
                op: Some(op),
                timeout_ms: Some(GIT_TIMEOUT_MS),
            })
            .await
            .map_err(Error::Rpc)?
            .into_inner();
        outcome(what, done)
    }

    /// The commit `rev` names, or `None` when it names none.
    async fn commit_of(&self, rev: &str) -> Option<String> {
        let spec = format!("{rev}^{{commit}}");
        self.git(&["rev-parse", "--verify", "--quiet", &spec], HashMap::new(), b"")
            .await
            .ok()
            .map(|o| o.text())
    }

    /// Run `git ARGS` in the repository with `env` added (and `stdin`);
    /// a non-zero exit is [`Error::Git`] carrying git's message.
    async fn git(&self, args: &[&str], env: HashMap<String, String>, stdin: &[u8]) -> Result<Output, Error> {
        let mut full: HashMap<String, String> = self.live.env.clone().into_iter().collect();
        full.extend(env);
        // Messages git prints are parsed: never translated. No prompt can
        // be answered here.
        full.insert("LC_ALL".into(), "C".into());
        full.insert("GIT_TERMINAL_PROMPT".into(), "0".into());
        let mut argv = vec!["git".to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let done = self
            .live
            .agent
            .process()
            .exec(agent::ExecRequest {
                command: Some(agent::Command {
                    kind: Some(agent::command::Kind::Argv(agent::Argv { args: argv })),
                }),
                cwd: self.path.clone(),
                env: full,
                stdin: stdin.to_vec(),
                timeout_ms: Some(GIT_TIMEOUT_MS),
                output_limit_bytes: None,
                mask_secrets: false,
            })
            .await
            .map_err(|status| match status.code() {
                tonic::Code::NotFound if status.message().contains("program") => {
                    Error::Git("git is not installed in the sandbox's image".into())
                }
                _ => Error::Rpc(status),
            })?
            .into_inner();
        outcome(args[0], done)
    }

    /// The commit HEAD names (empty before the first commit) and the
    /// current branch (empty when detached).
    async fn head(&self) -> Result<(String, String), Error> {
        let status = self.status().await?;
        Ok((status.head, status.branch))
    }

    /// The remote branch `branch` pulls from (its configured merge ref),
    /// else the branch's own name.
    async fn upstream_branch(&self, branch: &str) -> String {
        if branch.is_empty() {
            return String::new();
        }
        let key = format!("branch.{branch}.merge");
        match self.git(&["config", "--get", &key], HashMap::new(), b"").await {
            Ok(merge) => merge.text().strip_prefix("refs/heads/").unwrap_or(branch).to_string(),
            Err(_) => branch.to_string(),
        }
    }

    async fn status(&self) -> Result<api::GitStatusResponse, Error> {
        let out = self.git(&["status", "--porcelain=v2", "--branch", "-z"], HashMap::new(), b"").await?;
        Ok(parse_status(&out.stdout))
    }
}

impl Sandboxes {
    async fn repo(&self, tenant: &Tenant, sandbox_id: &str, path: String) -> Result<Repo, Error> {
        let live = self.live(tenant, InvalidField::required("sandbox_id", sandbox_id)?).await?;
        Ok(Repo { live, path })
    }

    /// The credential a push or pull to `origin` authenticates with: the
    /// workspace source's URL and token, when the sandbox's definition
    /// names an `auth_secret` and its value is known.
    async fn git_auth(
        &self,
        tenant: &Tenant,
        repo: &Repo,
        sandbox_id: &str,
        secrets: HashMap<String, String>,
    ) -> Result<Option<Credential>, Error> {
        let given = secrets_of("secrets", secrets)?;
        let instance = self.lifecycle.instance(&self.stores, tenant, sandbox_id).await?;
        let source = match self.stores.definitions.get(tenant, &instance.definition_id).await {
            Ok(stored) => {
                definition::from_stored(&stored.body)?.workspace.and_then(|w| w.source).and_then(|s| match s
                    .source
                {
                    Some(api::source::Source::Git(g)) => Some(g),
                    _ => None,
                })
            }
            Err(crate::store::Error::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let Some(source) = source.filter(|g| !g.auth_secret.is_empty()) else { return Ok(None) };
        let token = given.get(&source.auth_secret).or_else(|| repo.live.secrets.get(&source.auth_secret));
        Ok(token
            .map(|token| Credential { url: crate::workspace::fetch_url(&source.url), token: token.clone() }))
    }

    pub async fn git_status(
        &self,
        tenant: &Tenant,
        req: api::GitStatusRequest,
    ) -> Result<api::GitStatusResponse, Error> {
        self.repo(tenant, &req.sandbox_id, req.path).await?.status().await
    }

    pub async fn git_diff(
        &self,
        tenant: &Tenant,
        req: api::GitDiffRequest,
    ) -> Result<api::GitDiffResponse, Error> {
        let repo = self.repo(tenant, &req.sandbox_id, req.path).await?;
        let mut args: Vec<&str> = vec!["diff", "--no-color", "--no-ext-diff"];
        if req.staged {
            args.push("--cached");
        }
        if !req.base.is_empty() {
            not_an_option("base", &req.base)?;
            args.push(&req.base);
        }
        let mut numstat = args.clone();
        numstat.extend(["--numstat", "-z", "--"]);
        numstat.extend(req.paths.iter().map(String::as_str));
        let mut patch = args;
        patch.push("--");
        patch.extend(req.paths.iter().map(String::as_str));
        let files = parse_numstat(&repo.git(&numstat, HashMap::new(), b"").await?.stdout);
        let out = repo.git(&patch, HashMap::new(), b"").await?;
        Ok(api::GitDiffResponse {
            diff: String::from_utf8_lossy(&out.stdout).into_owned(),
            files,
            truncated: out.truncated,
        })
    }

    pub async fn git_add(
        &self,
        tenant: &Tenant,
        req: api::GitAddRequest,
    ) -> Result<api::GitAddResponse, Error> {
        let repo = self.repo(tenant, &req.sandbox_id, req.path).await?;
        let mut args = vec!["add", "--all", "--"];
        args.extend(req.paths.iter().map(String::as_str));
        repo.git(&args, HashMap::new(), b"").await?;
        Ok(api::GitAddResponse { status: Some(repo.status().await?) })
    }

    pub async fn git_commit(
        &self,
        tenant: &Tenant,
        req: api::GitCommitRequest,
    ) -> Result<api::GitCommitResponse, Error> {
        if req.message.trim().is_empty() {
            return Err(InvalidField::new("message", "required").into());
        }
        let author = req.author.unwrap_or_default();
        for (field, value) in [("author.name", &author.name), ("author.email", &author.email)] {
            if value.trim().is_empty() {
                return Err(InvalidField::new(field, "required: a sandbox has no identity of its own").into());
            }
            if value.contains(['<', '>', '\n', '\0']) {
                return Err(InvalidField::new(field, "may not contain <, > or a line break").into());
            }
        }
        let repo = self.repo(tenant, &req.sandbox_id, req.path).await?;
        if req.all {
            repo.git(&["add", "--all"], HashMap::new(), b"").await?;
        }
        let env = HashMap::from([
            ("GIT_AUTHOR_NAME".to_string(), author.name.clone()),
            ("GIT_AUTHOR_EMAIL".to_string(), author.email.clone()),
            ("GIT_COMMITTER_NAME".to_string(), author.name),
            ("GIT_COMMITTER_EMAIL".to_string(), author.email),
        ]);
        let mut args = vec!["commit", "--quiet", "--no-verify", "--file=-"];
        if req.allow_empty {
            args.push("--allow-empty");
        }
        repo.git(&args, env, req.message.as_bytes()).await?;
        let (commit, branch) = repo.head().await?;
        Ok(api::GitCommitResponse { commit, branch })
    }

    pub async fn git_branch(
        &self,
        tenant: &Tenant,
        req: api::GitBranchRequest,
    ) -> Result<api::GitBranchResponse, Error> {
        not_an_option("name", InvalidField::required("name", &req.name)?)?;
        let repo = self.repo(tenant, &req.sandbox_id, req.path).await?;
        repo.git(&["check-ref-format", "--branch", &req.name], HashMap::new(), b"")
            .await
            .map_err(|_| InvalidField::new("name", format!("{:?} is not a valid branch name", req.name)))?;
        let mut args = vec!["switch", "--quiet"];
        if req.create {
            args.extend(["--create", &req.name]);
            if !req.start_point.is_empty() {
                not_an_option("start_point", &req.start_point)?;
                args.push(&req.start_point);
            }
        } else {
            args.push(&req.name);
        }
        repo.git(&args, HashMap::new(), b"").await?;
        let (head, branch) = repo.head().await?;
        Ok(api::GitBranchResponse { branch, head })
    }

    pub async fn git_push(
        &self,
        tenant: &Tenant,
        req: api::GitPushRequest,
    ) -> Result<api::GitPushResponse, Error> {
        let remote = if req.remote.is_empty() { "origin".to_string() } else { req.remote };
        not_an_option("remote", &remote)?;
        let repo = self.repo(tenant, &req.sandbox_id, req.path).await?;
        let (commit, current) = repo.head().await?;
        let branch = if req.branch.is_empty() { current } else { req.branch };
        if branch.is_empty() {
            return Err(InvalidField::new("branch", "HEAD is detached: name the branch to push").into());
        }
        not_an_option("branch", &branch)?;
        let credential = match remote.as_str() {
            "origin" => self.git_auth(tenant, &repo, &req.sandbox_id, req.secrets).await?,
            _ => None,
        };
        if let Some(credential) = credential {
            let local = format!("refs/heads/{branch}");
            let tracking = format!("refs/remotes/{remote}/{branch}");
            let pushed = repo
                .commit_of(&local)
                .await
                .ok_or_else(|| InvalidField::new("branch", format!("no local branch {branch:?} to push")))?;
            let expect = match req.force {
                true => repo.commit_of(&tracking).await.unwrap_or_default(),
                false => String::new(),
            };
            let push =
                agent::GitPush { commit: pushed.clone(), branch: branch.clone(), force: req.force, expect };
            repo.transfer(&credential, agent::git_request::Op::Push(push)).await?;
            // What `push --set-upstream` would have recorded; the push
            // itself is done, so a repository without such a remote only
            // misses the bookkeeping.
            let _ = repo.git(&["update-ref", &tracking, &pushed], HashMap::new(), b"").await;
            let upstream = format!("--set-upstream-to={remote}/{branch}");
            let _ = repo.git(&["branch", "--quiet", &upstream, "--", &branch], HashMap::new(), b"").await;
            return Ok(api::GitPushResponse { remote, branch, commit: pushed });
        }
        let refspec = format!("refs/heads/{branch}:refs/heads/{branch}");
        let mut args = vec!["push", "--quiet", "--set-upstream"];
        if req.force {
            args.push("--force-with-lease");
        }
        args.extend(["--", &remote, &refspec]);
        repo.git(&args, HashMap::new(), b"").await?;
        let commit = repo
            .git(&["rev-parse", "--verify", &format!("refs/heads/{branch}")], HashMap::new(), b"")
            .await
            .map(|o| o.text())
            .unwrap_or(commit);
        Ok(api::GitPushResponse { remote, branch, commit })
    }

    pub async fn git_pull(
        &self,
        tenant: &Tenant,
        req: api::GitPullRequest,
    ) -> Result<api::GitPullResponse, Error> {
        let repo = self.repo(tenant, &req.sandbox_id, req.path).await?;
        let (before, current) = repo.head().await?;
        let credential = match req.remote.as_str() {
            "" | "origin" => self.git_auth(tenant, &repo, &req.sandbox_id, req.secrets).await?,
            _ => None,
        };
        if let Some(credential) = credential {
            if !req.branch.is_empty() {
                not_an_option("branch", &req.branch)?;
            }
            let branch = match req.branch.as_str() {
                "" => repo.upstream_branch(&current).await,
                given => given.to_string(),
            };
            if branch.is_empty() {
                return Err(InvalidField::new("branch", "HEAD is detached: name the branch to pull").into());
            }
            let fetch = agent::GitFetch {
                branch: branch.clone(),
                haves: Vec::from_iter(repo.commit_of("HEAD").await),
            };
            let fetched = repo.transfer(&credential, agent::git_request::Op::Fetch(fetch)).await?.text();
            let tracking = format!("refs/remotes/origin/{branch}");
            let _ = repo.git(&["update-ref", &tracking, &fetched], HashMap::new(), b"").await;
            repo.git(&["merge", "--quiet", "--ff-only", &fetched], HashMap::new(), b"").await?;
            let (after, _) = repo.head().await?;
            return Ok(api::GitPullResponse { before, after });
        }
        let mut args = vec!["pull", "--quiet", "--ff-only", "--no-rebase"];
        if !req.remote.is_empty() {
            not_an_option("remote", &req.remote)?;
            args.push(&req.remote);
            if !req.branch.is_empty() {
                not_an_option("branch", &req.branch)?;
                args.push(&req.branch);
            }
        } else if !req.branch.is_empty() {
            return Err(InvalidField::new("branch", "name the remote too").into());
        }
        repo.git(&args, HashMap::new(), b"").await?;
        let (after, _) = repo.head().await?;
        Ok(api::GitPullResponse { before, after })
    }
}

/// Refuse a value git would read as an option.
fn not_an_option(field: &str, value: &str) -> Result<(), Error> {
    if value.starts_with('-') || value.contains('\0') {
        return Err(InvalidField::new(field, format!("{value:?} may not start with '-'")).into());
    }
    Ok(())
}

fn change(c: u8) -> api::GitChange {
    match c {
        b'.' => api::GitChange::Unmodified,
        b'M' => api::GitChange::Modified,
        b'A' => api::GitChange::Added,
        b'D' => api::GitChange::Deleted,
        b'R' => api::GitChange::Renamed,
        b'C' => api::GitChange::Copied,
        b'T' => api::GitChange::TypeChanged,
        b'U' => api::GitChange::Unmerged,
        _ => api::GitChange::Unspecified,
    }
}

/// `git status --porcelain=v2 --branch -z`, parsed.
fn parse_status(out: &[u8]) -> api::GitStatusResponse {
    let mut status = api::GitStatusResponse::default();
    let mut records = out.split(|b| *b == 0).map(|r| String::from_utf8_lossy(r).into_owned());
    while let Some(record) = records.next() {
        let file = |xy: &str, path: &str| {
            let xy = xy.as_bytes();
            let mut f = api::GitFileStatus { path: path.to_string(), ..Default::default() };
            f.set_staged(change(xy.first().copied().unwrap_or(b'.')));
            f.set_unstaged(change(xy.get(1).copied().unwrap_or(b'.')));
            f
        };
        if let Some(header) = record.strip_prefix("# ") {
            let (key, value) = header.split_once(' ').unwrap_or((header, ""));
            match key {
                "branch.oid" if value != "(initial)" => status.head = value.to_string(),
                "branch.head" if value != "(detached)" => status.branch = value.to_string(),
                "branch.upstream" => status.upstream = value.to_string(),
                "branch.ab" => {
                    for part in value.split(' ') {
                        if let Some(n) = part.strip_prefix('+') {
                            status.ahead = n.parse().unwrap_or(0);
                        } else if let Some(n) = part.strip_prefix('-') {
                            status.behind = n.parse().unwrap_or(0);
                        }
                    }
                }
                _ => {}
            }
        } else if let Some(rest) = record.strip_prefix("1 ") {
            // XY sub mH mI mW hH hI path
            let fields: Vec<&str> = rest.splitn(8, ' ').collect();
            if let [xy, .., path] = fields.as_slice() {
                status.files.push(file(xy, path));
            }
        } else if let Some(rest) = record.strip_prefix("2 ") {
            // XY sub mH mI mW hH hI Xscore path, then the original path.
            let fields: Vec<&str> = rest.splitn(9, ' ').collect();
            if let [xy, .., path] = fields.as_slice() {
                let mut f = file(xy, path);
                f.original_path = records.next().unwrap_or_default();
                status.files.push(f);
            }
        } else if let Some(rest) = record.strip_prefix("u ") {
            // XY sub m1 m2 m3 mW h1 h2 h3 path
            let fields: Vec<&str> = rest.splitn(10, ' ').collect();
            if let [xy, .., path] = fields.as_slice() {
                status.files.push(file(xy, path));
            }
        } else if let Some(path) = record.strip_prefix("? ") {
            let mut f = api::GitFileStatus { path: path.to_string(), ..Default::default() };
            f.set_staged(api::GitChange::Unmodified);
            f.set_unstaged(api::GitChange::Untracked);
            status.files.push(f);
        }
    }
    status
}

/// `git diff --numstat -z`, parsed: `added\tdeleted\tpath\0`, or for a
/// rename `added\tdeleted\t\0old\0new\0`; `-` counts for binary files.
fn parse_numstat(out: &[u8]) -> Vec<api::GitDiffFile> {
    let mut files = Vec::new();
    let mut records = out.split(|b| *b == 0).map(|r| String::from_utf8_lossy(r).into_owned());
    while let Some(record) = records.next() {
        let mut fields = record.splitn(3, '\t');
        let (Some(added), Some(deleted), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let path = if path.is_empty() {
            let _old = records.next();
            records.next().unwrap_or_default()
        } else {
            path.to_string()
        };
        let binary = added == "-" && deleted == "-";
        files.push(api::GitDiffFile {
            path,
            added: added.parse().unwrap_or(0),
            deleted: deleted.parse().unwrap_or(0),
            binary,
        });
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn porcelain_v2_status_becomes_branch_counts_and_files() {
        let out = b"# branch.oid 1111111111111111111111111111111111111111\0# branch.head feature\0# branch.upstream origin/feature\0# branch.ab +2 -1\0\
1 .M N... 100644 100644 100644 aaa aaa src/lib.rs\0\
1 A. N... 000000 100644 100644 000 bbb new file.txt\0\
2 R. N... 100644 100644 100644 ccc ccc R100 renamed.rs\0old.rs\0\
u UU N... 100644 100644 100644 100644 d e f both.txt\0\
? untracked.md\0";
        let s = parse_status(out);
        assert_eq!(
            (s.head.as_str(), s.branch.as_str(), s.upstream.as_str(), s.ahead, s.behind),
            ("1111111111111111111111111111111111111111", "feature", "origin/feature", 2, 1)
        );
        let files: Vec<(&str, &str, api::GitChange, api::GitChange)> = s
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.original_path.as_str(), f.staged(), f.unstaged()))
            .collect();
        use api::GitChange::*;
        assert_eq!(
            files,
            vec![
                ("src/lib.rs", "", Unmodified, Modified),
                ("new file.txt", "", Added, Unmodified),
                ("renamed.rs", "old.rs", Renamed, Unmodified),
                ("both.txt", "", Unmerged, Unmerged),
                ("untracked.md", "", Unmodified, Untracked),
            ]
        );
        let fresh = parse_status(b"# branch.oid (initial)\0# branch.head (detached)\0");
        assert_eq!((fresh.head.as_str(), fresh.branch.as_str()), ("", ""));
    }

    #[test]
    fn numstat_counts_lines_and_flags_binaries_and_renames() {
        let out = b"3\t1\tsrc/a.rs\0-\t-\timage.png\0\x30\t0\t\0old name.txt\0new name.txt\0";
        let files = parse_numstat(out);
        let got: Vec<(&str, u32, u32, bool)> =
            files.iter().map(|f| (f.path.as_str(), f.added, f.deleted, f.binary)).collect();
        assert_eq!(
            got,
            vec![("src/a.rs", 3, 1, false), ("image.png", 0, 0, true), ("new name.txt", 0, 0, false)]
        );
    }

    #[test]
    fn values_that_git_would_read_as_options_are_refused() {
        assert!(not_an_option("remote", "--upload-pack=sh").is_err());
        assert!(not_an_option("branch", "-f").is_err());
        assert!(not_an_option("branch", "feature/x").is_ok());
    }
}
