//! Remotes on this machine for sandboxes to reach through their proxy: a
//! git smart-HTTP remote (the real `git http-backend` behind a small HTTPS
//! server, `tests/git-remote/git_https.py`, with a certificate from a test
//! CA, demanding HTTP basic with a token), and a plain HTTP server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct GitRemote {
    child: Child,
    pub port: u16,
    /// The bare repositories' root (`<root>/repo.git` is served as
    /// `/repo.git`).
    pub root: PathBuf,
    /// The CA that signed its certificate, as PEM.
    pub ca_pem: String,
    log: PathBuf,
}

impl GitRemote {
    /// Serve an empty bare `repo.git` on `addr` (an IP address), in `dir`,
    /// to clients that send `token` as their password.
    pub fn start(dir: &Path, addr: &str, token: &str) -> Self {
        let root = dir.join("remote");
        std::fs::create_dir_all(&root).unwrap();
        let init = Command::new("git")
            .args(["init", "-q", "--bare", "-b", "main"])
            .arg(root.join("repo.git"))
            .status()
            .unwrap();
        assert!(init.success());
        Self::serve(dir, addr, token, root)
    }

    /// A fake API on `addr` instead (same server, same test CA): every
    /// request answered 200 with its method and path, and logged.
    pub fn echo(dir: &Path, addr: &str) -> Self {
        Self::serve(dir, addr, "", PathBuf::from("-"))
    }

    fn serve(dir: &Path, addr: &str, token: &str, root: PathBuf) -> Self {
        let (cert, key, ca) = certificates(dir, addr);
        let (port_file, log) = (dir.join("git-remote.port"), dir.join("git-remote.log"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("git-remote/git_https.py");
        let child = Command::new("python3")
            .arg(script)
            .arg(&root)
            .arg(&cert)
            .arg(&key)
            .arg(token)
            .arg(addr)
            .arg(&port_file)
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file).ok().and_then(|p| p.trim().parse().ok()) {
                break port;
            }
            assert!(std::time::Instant::now() < deadline, "the git remote did not start");
            std::thread::sleep(Duration::from_millis(50));
        };
        Self { child, port, root, ca_pem: std::fs::read_to_string(ca).unwrap(), log }
    }

    /// Its requests, as the server logged them (JSON).
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// `git log --format=%s` of `repo.git`'s `main`.
    pub fn subjects(&self) -> String {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(self.root.join("repo.git"))
            .args(["log", "--format=%s", "main"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A test CA and a server certificate for `addr` it signs, made by
/// `openssl` (P-256: Python's `ssl` loads it): (cert, key, CA) files.
fn certificates(dir: &Path, addr: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (ca_key, ca, key, csr, cert, ext) = (
        dir.join("git-ca.key"),
        dir.join("git-ca.pem"),
        dir.join("git-server.key"),
        dir.join("git-server.csr"),
        dir.join("git-server.pem"),
        dir.join("git-server.ext"),
    );
    std::fs::write(&ext, format!("subjectAltName=IP:{addr}\nbasicConstraints=CA:FALSE\n")).unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let p = |p: &PathBuf| p.display().to_string();
    let curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", "/CN=sandhold test git CA"];
    args.extend(curve);
    let (ca_key_s, ca_s, key_s, csr_s, cert_s, ext_s) =
        (p(&ca_key), p(&ca), p(&key), p(&csr), p(&cert), p(&ext));
    args.extend(["-keyout", &ca_key_s, "-out", &ca_s]);
    openssl(&args);
    let subject = format!("/CN={addr}");
    let mut args = vec!["req", "-subj", &subject];
    args.extend(curve);
    args.extend(["-keyout", &key_s, "-out", &csr_s]);
    openssl(&args);
    openssl(&[
        "x509",
        "-req",
        "-days",
        "2",
        "-in",
        &csr_s,
        "-CA",
        &ca_s,
        "-CAkey",
        &ca_key_s,
        "-CAcreateserial",
        "-out",
        &cert_s,
        "-extfile",
        &ext_s,
    ]);
    (cert, key, ca)
}

impl Drop for GitRemote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP server on the host's `addr` serving `body` at `/`, and
/// answering a POST (to any path) with `body` followed by the request's
/// body, read whole first: a test that sends something where it may not go
/// sees it served back if it got through, and a proxy that refuses a body
/// is not raced by an answer given before the body was read (`http.server`
/// answered a POST 501 at once).
pub struct HostServer {
    child: std::process::Child,
    pub port: u16,
}

const HOST_SERVER: &str = r#"
import http.server, sys
addr, port, body = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], 'rb').read()
class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, status, out):
        self.send_response(status)
        self.send_header('Content-Length', str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def do_GET(self):
        if self.path in ('/', '/index.html'):
            self.reply(200, body)
        else:
            self.reply(404, b'not found')
    def do_POST(self):
        self.reply(200, body + self.rfile.read(int(self.headers.get('Content-Length') or 0)))
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((addr, port), Handler).serve_forever()
"#;

impl HostServer {
    pub fn start(dir: &Path, addr: &str, body: &str) -> Self {
        let served = dir.join(format!("www-{addr}"));
        std::fs::write(&served, body).unwrap();
        let port = std::net::TcpListener::bind(format!("{addr}:0")).unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new("python3")
            .args(["-c", HOST_SERVER, addr, &port.to_string()])
            .arg(&served)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect((addr, port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "the host's HTTP server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
