//! The user's background server, as a user meets it: the first command
//! without `--server` starts it and says so, later ones reuse it, a
//! detached run goes on in it with nobody attached, it stops by itself when
//! idle (never under a run) and on `sandhold daemon stop`; and only its own
//! user reaches its socket, even with the token in hand.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use sandhold_tests::cli::{
    Background, NOBODY, as_nobody, json_lines, ok, sandhold, sandhold_background, sandhold_bin, stderr,
    stdout,
};
use sandhold_tests::local::{TestDir, alive};
use sandhold_tests::wait::until;

const STARTED: &str = "started your background server";

fn run_status(data: &Path, run_id: &str) -> String {
    let out = ok(&sandhold(data).args(["runs", "--output", "json"]).output().unwrap()).clone();
    json_lines(&out)
        .into_iter()
        .find(|r| r["run_id"] == run_id)
        .map(|r| r["status"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// A detached run progresses with no client: the background server drives
/// it to its end. Before, each command's own server ended with it and the
/// run stayed `running` with an empty log until someone attached.
#[test]
fn a_detached_run_goes_on_in_the_background_server_and_later_commands_reuse_it() {
    let dir = TestDir::new("daemon-detach");
    let data = dir.path().join("data");
    let daemon = Background(data.clone());
    let marker = dir.path().join("done");
    let script = format!("sleep 1; echo finished; touch {}", marker.display());
    let started = sandhold_background(&data)
        .args(["run", "--detach", "--output", "json", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    ok(&started);
    assert_eq!(stderr(&started).matches(STARTED).count(), 1, "said once: {}", stderr(&started));
    let run_id = json_lines(&started)
        .iter()
        .find_map(|l| l["run_id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("a run id: {}", stdout(&started)));
    let pid = daemon.pid().expect("a background server runs");

    // Nobody attaches; the run ends anyway.
    until("the detached command to run", || marker.exists());
    until("the run to be recorded completed", || {
        let out = sandhold_background(&data).args(["runs", "--output", "json"]).output().unwrap();
        assert!(!stderr(&out).contains(STARTED), "reused, not started again: {}", stderr(&out));
        json_lines(&out).iter().any(|r| r["run_id"] == run_id.as_str() && r["status"] == "completed")
    });
    let logs = ok(&sandhold_background(&data).args(["logs", &run_id]).output().unwrap()).clone();
    assert!(stdout(&logs).contains("finished"), "the log holds its output: {}", stdout(&logs));
    assert_eq!(daemon.pid(), Some(pid), "the same server served every command");

    let status = ok(&sandhold_background(&data).args(["daemon", "status"]).output().unwrap()).clone();
    assert!(stdout(&status).contains(&format!("pid {pid}")), "{}", stdout(&status));
    let socket = data.join("daemon/sandhold.sock");
    assert_eq!(std::fs::metadata(data.join("daemon")).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);

    let stopped = ok(&sandhold_background(&data).args(["daemon", "stop"]).output().unwrap()).clone();
    assert!(stdout(&stopped).contains(&format!("stopped the background server (pid {pid})")));
    assert!(!alive(pid), "the process is gone");
    assert!(!socket.exists(), "its socket went with it");
    let status = sandhold_background(&data).args(["daemon", "status"]).output().unwrap();
    assert_eq!(status.status.code(), Some(3), "none runs: {}", stdout(&status));
}

/// Idle: no run driven, no call in flight, for --idle-stop. A run it
/// drives keeps it up past that; once the run is over it stops by itself.
#[test]
fn the_background_server_stops_when_idle_but_never_under_a_run() {
    let dir = TestDir::new("daemon-idle");
    let data = dir.path().join("data");
    let daemon = Background(data.clone());
    let start =
        ok(&sandhold_background(&data).args(["daemon", "start", "--idle-stop", "1s"]).output().unwrap())
            .clone();
    assert!(
        stderr(&start).contains(STARTED) && stderr(&start).contains("stops after 1s"),
        "{}",
        stderr(&start)
    );
    let pid = daemon.pid().expect("started");
    let started = ok(&sandhold_background(&data)
        .args(["run", "--detach", "--output", "json", "--", "sh", "-c", "sleep 4; echo late"])
        .output()
        .unwrap())
    .clone();
    let run_id = json_lines(&started).iter().find_map(|l| l["run_id"].as_str().map(str::to_string)).unwrap();
    // Well past the idle period, the run is still being driven.
    std::thread::sleep(Duration::from_millis(2_500));
    assert!(alive(pid), "stopped under a running run");
    until("the idle server to stop", || !alive(pid));
    // It drove the run to its end before stopping (read without starting it again).
    assert_eq!(run_status(&data, &run_id), "completed");
    assert!(daemon.pid().is_none(), "nothing runs after the idle stop");
}

/// Two commands at once with no server: both are served, by one server.
#[test]
fn commands_racing_to_start_the_background_server_share_one() {
    let dir = TestDir::new("daemon-race");
    let data = dir.path().join("data");
    let daemon = Background(data.clone());
    let children: Vec<_> = (0..3)
        .map(|_| {
            sandhold_background(&data)
                .args(["sandboxes", "ls"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for out in &outs {
        ok(out);
    }
    let pid = daemon.pid().expect("one runs");
    let servers = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).to_string();
            cmdline.contains("daemon\0serve") && cmdline.contains(data.to_str().unwrap())
        })
        .count();
    assert_eq!(servers, 1, "one background server (pid {pid}) for the data dir");
}

/// The socket is removed (its data dir deleted): the server stops rather
/// than serve a data dir nobody can reach.
#[test]
fn the_background_server_stops_when_its_socket_is_removed() {
    let dir = TestDir::new("daemon-gone");
    let data = dir.path().join("data");
    let daemon = Background(data.clone());
    ok(&sandhold_background(&data).args(["daemon", "start"]).output().unwrap());
    let pid = daemon.pid().expect("started");
    std::fs::remove_file(data.join("daemon/sandhold.sock")).unwrap();
    until("the server to notice", || !alive(pid));
}

/// Another user of the machine, given every advantage: every folder on the
/// way open, the socket's mode opened to all, and the local token leaked
/// to them. The server still serves only its own user (the peer's uid is
/// checked on every connection), so nothing runs as the owner.
#[test]
fn another_user_cannot_use_the_background_server_even_with_its_token() {
    let dir = TestDir::new("daemon-hostile");
    let data = dir.path().join("data");
    let _daemon = Background(data.clone());
    ok(&sandhold_background(&data).args(["daemon", "start"]).output().unwrap());
    let socket = data.join("daemon/sandhold.sock");
    let mut d = Some(socket.parent().unwrap());
    while let Some(path) = d.filter(|p| p.starts_with("/tmp") && *p != Path::new("/tmp")) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        d = path.parent();
    }
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let token = std::fs::read_to_string(control_plane::auth::local::path(&data)).unwrap();
    let marker = dir.path().join("pwned");
    let attempt = as_nobody(&sandhold_bin())
        .env("SANDHOLD_SERVER", format!("unix:{}", socket.display()))
        .env("SANDHOLD_TOKEN", token.trim())
        .args(["run", "--", "touch", marker.to_str().unwrap()])
        .output()
        .unwrap();
    assert_ne!(attempt.status.code(), Some(0), "another user ran a command:\n{}", stderr(&attempt));
    let listed = as_nobody(&sandhold_bin())
        .env("SANDHOLD_SERVER", format!("unix:{}", socket.display()))
        .env("SANDHOLD_TOKEN", token.trim())
        .args(["runs"])
        .output()
        .unwrap();
    assert_ne!(listed.status.code(), Some(0), "another user listed runs:\n{}", stdout(&listed));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!marker.exists(), "a command ran as the owner for another user");
    // The owner, same socket, same token: served.
    ok(&sandhold_background(&data).args(["runs"]).output().unwrap());
}

/// A `daemon/` folder someone else made in the data dir is not trusted
/// with the socket: the start fails and says why.
#[test]
fn a_daemon_folder_owned_by_another_user_is_refused() {
    let dir = TestDir::new("daemon-squat");
    let data = dir.path().join("data");
    let _daemon = Background(data.clone());
    std::fs::create_dir_all(data.join("daemon")).unwrap();
    nix::unistd::chown(&data.join("daemon"), Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
    let out = sandhold_background(&data).args(["runs"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("belongs to another user"), "{}", stderr(&out));
}
