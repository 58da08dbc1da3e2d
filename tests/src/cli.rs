//! Running the real `sandhold` binary as a user would: the CLI against a
//! spawned `sandhold serve`, or with its embedded server.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{LazyLock, mpsc};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::local::TestDir;
use crate::wait::PATIENCE;

/// The `sandhold` binary cargo built for the running test or bench: it
/// sits beside the `deps/` directory the test executable runs from
/// (`SANDHOLD_BIN` overrides). Cargo builds a package's binaries before its
/// integration tests and benches, so it is current.
pub fn sandhold_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SANDHOLD_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test executable");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let bin = profile_dir.join("sandhold");
    assert!(
        bin.is_file(),
        "no sandhold binary at {} (run through cargo test -p control-plane)",
        bin.display()
    );
    bin
}

/// The agent every sandbox of these tests runs (static: it also serves
/// Docker images).
pub fn agent() -> PathBuf {
    crate::agent::static_agent()
}

/// `sandhold` with only the variables a test sets: none of the caller's
/// `SANDHOLD_*` leak in, the data dir is the test's. Without `--server` it
/// uses a server in its own process (`--embedded`), which ends with it: a
/// test about what a command leaves behind sees only the command's work.
/// [`sandhold_background`] is the default a user gets.
pub fn sandhold(data_dir: &Path) -> Command {
    let mut cmd = sandhold_background(data_dir);
    cmd.env("SANDHOLD_EMBEDDED", "1");
    cmd
}

/// `sandhold` as a user runs it: without `--server`, through the user's
/// background server of `data_dir` (started by the first command; keep a
/// [`Background`] to stop it).
pub fn sandhold_background(data_dir: &Path) -> Command {
    let mut cmd = Command::new(sandhold_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("SANDHOLD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("SANDHOLD_DATA_DIR", data_dir).env("SANDHOLD_AGENT_BINARY", agent()).stdin(Stdio::null());
    cmd
}

/// The uid and gid of the other user of hostile tests.
pub const NOBODY: u32 = 65534;

/// `program` as uid/gid [`NOBODY`] (through `setpriv`), with no group of
/// root's and none of the caller's `SANDHOLD_*` variables.
pub fn as_nobody(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([&format!("--reuid={NOBODY}"), &format!("--regid={NOBODY}"), "--clear-groups", "--"])
        .arg(program);
    for (k, _) in std::env::vars() {
        if k.starts_with("SANDHOLD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOME", "/nonexistent").stdin(Stdio::null());
    cmd
}

/// Stops, when dropped, the background server of a data dir: `sandhold
/// daemon stop`, then SIGKILL if it is still there.
pub struct Background(pub PathBuf);

impl Background {
    /// The pid of its server, if one runs (the holder of its lock).
    pub fn pid(&self) -> Option<i32> {
        let out =
            sandhold_background(&self.0).args(["daemon", "status", "--output", "json"]).output().ok()?;
        let status: Value = serde_json::from_slice(&out.stdout).ok()?;
        status["pid"].as_i64().and_then(|p| i32::try_from(p).ok())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let pid = self.pid();
        let _ = sandhold_background(&self.0).args(["daemon", "stop"]).output();
        let cmdline = |pid: i32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if let Some(pid) = pid
            && String::from_utf8_lossy(&cmdline(pid)).contains("daemon\0serve")
        {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A `sandhold serve` process on a free loopback port, stopped on drop
/// (and the local sandboxes it made killed with its directory).
pub struct Served {
    pub child: Child,
    /// HOST:PORT the server listens on (loopback even when it listens on
    /// every interface).
    pub addr: String,
    /// What clients pass as --server: `addr`, or `https://addr` with TLS.
    pub server: String,
    /// The CA clients trust (`SANDHOLD_CA_CERT`), with TLS.
    pub ca: Option<PathBuf>,
    pub dir: TestDir,
}

/// How to start a [`Served`] beyond the defaults.
#[derive(Default)]
pub struct ServeOptions {
    /// `0.0.0.0` to listen on every interface [default: 127.0.0.1].
    pub host: Option<&'static str>,
    /// More `sandhold serve` arguments.
    pub args: Vec<String>,
    /// More variables of the server (tokens: `SANDHOLD_TOKENS`).
    pub env: Vec<(String, String)>,
    /// A token the readiness check authenticates with.
    pub token: Option<String>,
    /// Serve TLS with this certificate; clients use https and trust its CA.
    pub tls: Option<crate::tls::ServerFiles>,
}

impl Served {
    pub fn start(tokens: &[&str]) -> Self {
        let mut options = ServeOptions {
            token: tokens.first().map(|t| t.split_once('=').unwrap().1.to_string()),
            ..Default::default()
        };
        if !tokens.is_empty() {
            options.env.push(("SANDHOLD_TOKENS".into(), tokens.join(",")));
        }
        Self::start_with(TestDir::new("sh-cli"), options)
    }

    pub fn start_with(dir: TestDir, options: ServeOptions) -> Self {
        let (child, addr, server, ca) = Self::spawn(&dir, &options);
        let served = Self { child, addr, server, ca, dir };
        served.wait_ready(options.token.as_deref());
        served
    }

    /// Kill the server (SIGKILL: no shutdown, its runs left to a successor)
    /// and start another on the same data dir with `options`, on a new port.
    pub fn kill9_and_restart(&mut self, options: ServeOptions) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        (self.child, self.addr, self.server, self.ca) = Self::spawn(&self.dir, &options);
        self.wait_ready(options.token.as_deref());
    }

    fn spawn(dir: &TestDir, options: &ServeOptions) -> (Child, String, String, Option<PathBuf>) {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let listen = format!("{}:{port}", options.host.unwrap_or("127.0.0.1"));
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(dir.path().join("serve.log")).unwrap();
        let mut cmd = sandhold(&dir.path().join("data"));
        cmd.args(["serve", "--listen", &listen, "--shutdown-grace-ms", "3000"])
            .args(&options.args)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log);
        let (server, ca) = match &options.tls {
            Some(tls) => {
                cmd.arg("--tls-cert").arg(&tls.cert).arg("--tls-key").arg(&tls.key);
                (format!("https://{addr}"), Some(tls.ca.clone()))
            }
            None => (addr.clone(), None),
        };
        let child = cmd.spawn().expect("spawning sandhold serve");
        (child, addr, server, ca)
    }

    /// Until the stores answer (a CLI call succeeds).
    fn wait_ready(&self, token: Option<&str>) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let mut cmd = self.cli();
            if let Some(t) = token {
                cmd.env("SANDHOLD_TOKEN", t);
            }
            let out = cmd.args(["definitions", "ls"]).output().unwrap();
            if out.status.success() {
                return;
            }
            assert!(Instant::now() < deadline, "server never became ready: {}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The token of a server without API tokens (`local-token` in its data
    /// dir), once it has started.
    pub fn local_token(&self) -> Option<String> {
        let path = control_plane::auth::local::path(&self.dir.path().join("data"));
        std::fs::read_to_string(path).ok().map(|t| t.trim().to_string())
    }

    /// The CLI pointed at this server, with its local token when it has no
    /// API tokens (the client's data dir is another one, so it is passed as
    /// `SANDHOLD_TOKEN`; set that again to call with an API token).
    pub fn cli(&self) -> Command {
        let mut cmd = sandhold(&self.dir.path().join("client-data"));
        cmd.env("SANDHOLD_SERVER", &self.server);
        if let Some(token) = self.local_token() {
            cmd.env("SANDHOLD_TOKEN", token);
        }
        if let Some(ca) = &self.ca {
            cmd.env("SANDHOLD_CA_CERT", ca);
        }
        cmd
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every stdout line of a JSON-output command, parsed and held to the
/// schema (see [`json_line`]).
pub fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()).map(json_line).collect()
}

/// One stdout line of `--output json`, parsed; panics unless it is JSON
/// that `docs/schema/cli-output.schema.json` describes, with the line and
/// what the schema says of it.
pub fn json_line(line: &str) -> Value {
    let value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    if let Some(why) = output_violation(&value) {
        panic!(
            "a line of --output json that docs/schema/cli-output.schema.json does not describe: {why}\n{line}"
        );
    }
    value
}

/// Why `line` is not one `--output json` may print (the kind of line it
/// comes closest to, and what of it is wrong), `None` when it is one.
pub fn output_violation(line: &Value) -> Option<String> {
    if OUTPUT_SCHEMA.line.is_valid(line) {
        return None;
    }
    // The closest kind: the one that knows most of the line's keys, then
    // the one with the fewest complaints.
    let keys: Vec<&String> = line.as_object().map(|o| o.keys().collect()).unwrap_or_default();
    let (kind, errors) = OUTPUT_SCHEMA
        .kinds
        .iter()
        .map(|k| {
            let errors: Vec<String> = k
                .validator
                .iter_errors(line)
                .map(|e| format!("at {:?}: {e}", e.instance_path().as_str()))
                .collect();
            let known = keys.iter().filter(|key| k.keys.contains(key.as_str())).count();
            (k, known, errors)
        })
        .min_by_key(|(_, known, errors)| (std::cmp::Reverse(*known), errors.len()))
        .map(|(k, _, errors)| (&k.name, errors))
        .expect("the schema has kinds of lines");
    Some(format!("as a `{kind}` line: {}", errors.join("; ")))
}

/// The schema of `--output json`, compiled: for a whole line, and for each
/// kind of line it lists (to say which one a wrong line misses and how).
struct OutputSchema {
    line: jsonschema::Validator,
    kinds: Vec<LineKind>,
}

struct LineKind {
    name: String,
    validator: jsonschema::Validator,
    /// The keys a line of the kind may have.
    keys: std::collections::BTreeSet<String>,
}

static OUTPUT_SCHEMA: LazyLock<OutputSchema> = LazyLock::new(|| {
    let schema: Value = serde_json::from_str(include_str!("../../docs/schema/cli-output.schema.json"))
        .expect("the schema is JSON");
    let compile = |s: &Value| {
        jsonschema::validator_for(s).unwrap_or_else(|e| panic!("the schema does not compile: {e}"))
    };
    let kinds = schema["anyOf"]
        .as_array()
        .expect("the schema's kinds of lines")
        .iter()
        .map(|kind| {
            let mut one = schema.clone();
            let object = one.as_object_mut().expect("the schema is an object");
            object.remove("anyOf");
            object.insert("$ref".into(), kind["$ref"].clone());
            let name = kind["$ref"].as_str().unwrap_or_default().trim_start_matches("#/$defs/").to_string();
            let keys = schema["$defs"][&name]["properties"].as_object().map(|p| p.keys().cloned().collect());
            LineKind { validator: compile(&one), keys: keys.unwrap_or_default(), name }
        })
        .collect();
    OutputSchema { line: compile(&schema), kinds }
});

pub fn ok(out: &Output) -> &Output {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A spawned CLI whose stdout lines arrive on a channel as they are printed.
/// With `--output json` every stdout line is held to the schema as it
/// arrives (see [`json_line`]).
pub struct Live {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    json: bool,
}

/// Whether `cmd` asks for `--output json`.
fn outputs_json(cmd: &Command) -> bool {
    let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    let flag = args.windows(2).any(|w| w[0] == "--output" && w[1] == "json")
        || args.iter().any(|a| a == "--output=json");
    let env = cmd.get_envs().any(|(k, v)| k == "SANDHOLD_OUTPUT" && v.is_some_and(|v| v == "json"));
    flag || env
}

impl Live {
    pub fn spawn(mut cmd: Command) -> Self {
        let json = outputs_json(&cmd);
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(format!("stderr: {line}"));
            }
        });
        Self { child, lines, seen: Vec::new(), json }
    }

    /// Keep a line that arrived, checking a JSON one.
    fn seen(&mut self, line: String) {
        if self.json && !line.starts_with("stderr: ") {
            json_line(&line);
        }
        self.seen.push(line);
    }

    /// The first line (stdout, or `stderr: ...`) `pred` accepts; panics
    /// after [`PATIENCE`].
    pub fn until(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => panic!("no line {what} within {PATIENCE:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Exit code, after reading what is left of the output (until both
    /// pipes are closed).
    pub fn wait(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Both readers end at EOF and drop their senders.
                let drained = Instant::now() + Duration::from_secs(10);
                while let Ok(line) =
                    self.lines.recv_timeout(drained.saturating_duration_since(Instant::now()))
                {
                    self.seen(line);
                }
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}; saw:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The toolchain dir the tests share (a download of about 1 GiB once, then
/// kept): `SANDHOLD_TEST_TOOLCHAIN_DIR`, else /var/cache/sandhold-toolchains.
/// Filled through the real `sandhold harness install`, once per binary.
pub fn toolchains() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("SANDHOLD_TEST_TOOLCHAIN_DIR").map_or_else(
            || std::path::PathBuf::from("/var/cache/sandhold-toolchains"),
            std::path::PathBuf::from,
        );
        let data = crate::local::TestDir::new("toolchain-cli");
        let out = sandhold(data.path())
            .args(["harness", "install", "claude-code", "codex", "opencode", "--toolchain-dir"])
            .arg(&dir)
            .output()
            .expect("running sandhold harness install");
        assert!(out.status.success(), "harness install: {}", String::from_utf8_lossy(&out.stderr));
        dir
    })
    .clone()
}
