//! Another user of the operator's machine against a server without API
//! tokens on loopback: the operator's `sandhold serve`, and the embedded
//! server a running `sandhold run` listens with. Loopback is no credential:
//! the attacker (uid 65534, through `setpriv`) knows the address and the
//! data dir, and every directory on the way is open to it; only the
//! `local-token` file (mode 600) is not. Without it every call is
//! UNAUTHENTICATED and nothing runs as the operator.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use sandhold_tests::cli::{Live, Served, as_nobody, json_lines, ok, sandhold, sandhold_bin, stderr};
use sandhold_tests::local::TestDir;
use sandhold_tests::wait::PATIENCE;

/// Open every directory from `dir` up to /tmp to other users, as a home
/// directory often is: the token file's own mode is all that protects it.
fn open_up(dir: &Path) {
    let mut d = Some(dir);
    while let Some(path) = d.filter(|p| p.starts_with("/tmp") && *p != Path::new("/tmp")) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        d = path.parent();
    }
}

/// The attacker's tries on the server at `addr` whose data dir is `data`:
/// read the token file, start a run that would leave `marker`, list runs.
fn attack(addr: &str, data: &Path, marker: &Path) {
    let token_file = control_plane::auth::local::path(data);
    assert!(token_file.is_file(), "the server made its token file");
    assert_eq!(std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777, 0o600);
    let read = as_nobody(Path::new("/bin/cat")).arg(&token_file).output().unwrap();
    assert!(!read.status.success(), "another user read the token: {}", String::from_utf8_lossy(&read.stdout));

    let cli = |args: &[&str]| -> Output {
        as_nobody(&sandhold_bin())
            .env("SANDHOLD_SERVER", addr)
            .env("SANDHOLD_DATA_DIR", data)
            .args(args)
            .output()
            .unwrap()
    };
    let run = cli(&["run", "--", "touch", marker.to_str().unwrap()]);
    assert_ne!(run.status.code(), Some(0), "another user started a run:\n{}", stderr(&run));
    assert!(stderr(&run).contains("local-token"), "UNAUTHENTICATED, saying which token: {}", stderr(&run));
    let listed = cli(&["runs"]);
    assert_ne!(listed.status.code(), Some(0), "another user listed the runs:\n{}", stderr(&listed));
    // Given time to run, had it been started.
    std::thread::sleep(Duration::from_secs(1));
    assert!(!marker.exists(), "a command ran as the operator for another user");
}

/// The operator's `sandhold serve` (no tokens, 127.0.0.1): the operator's
/// CLI works with no flag, another user's is refused.
#[test]
fn another_user_cannot_run_commands_on_the_operators_serve() {
    let server = Served::start(&[]);
    open_up(&server.dir.path().join("data"));
    let marker = server.dir.path().join("pwned-serve");

    attack(&server.addr, &server.dir.path().join("data"), &marker);

    // The operator: the CLI finds the token in the data dir by itself.
    let operator = sandhold(&server.dir.path().join("data"))
        .env("SANDHOLD_SERVER", &server.addr)
        .args(["runs", "--output", "json"])
        .output()
        .unwrap();
    assert!(json_lines(ok(&operator)).is_empty(), "the attacker's run never started");
}

/// A running `sandhold run` listens on a random loopback port with its
/// embedded server (the local provider on, private egress allowed):
/// another user who finds the port still cannot use it.
#[test]
fn another_user_cannot_run_commands_on_a_running_sandhold_run() {
    let dir = TestDir::new("sh-run-uid");
    let data = dir.path().join("data");
    let mut cmd = sandhold(&data);
    cmd.args(["run", "--", "sh", "-c", "echo operator-run-up; sleep 60"]);
    let mut live = Live::spawn(cmd);
    live.until("the operator's run started", |l| l.contains("operator-run-up"));
    open_up(&data);

    // What another user can learn: the port, from `ss` or this log.
    let log = std::fs::read_to_string(data.join("embedded.log")).unwrap();
    let serving =
        log.lines().find(|l| l.contains("sandhold serving")).expect("the embedded server logs its address");
    let at = serving.find("127.0.0.1:").expect("a loopback address");
    let addr: String =
        serving[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect();

    attack(&addr, &data, &dir.path().join("pwned-run"));
    live.signal(nix::sys::signal::Signal::SIGINT);
    live.signal(nix::sys::signal::Signal::SIGINT);
    let deadline = Instant::now() + PATIENCE;
    while live.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
}
