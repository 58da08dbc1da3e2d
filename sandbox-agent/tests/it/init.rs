//! `sandhold-agent init`: the daemon it supervises comes back after a
//! `kill -9`, and SIGTERM stops both.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shared::proto::agent::v1::GetInfoRequest;
use shared::proto::agent::v1::info_service_client::InfoServiceClient;
use shared::transport::{Address, BearerToken, authed, connect};

async fn agent_pid(socket: &std::path::Path, token: &str) -> Option<u32> {
    let ch = connect(&Address::Unix(socket.to_path_buf())).await.ok()?;
    let mut client = InfoServiceClient::new(authed(ch, BearerToken::new(token).unwrap()));
    client.get_info(GetInfoRequest {}).await.ok().map(|r| r.into_inner().pid)
}

async fn wait_for_pid(socket: &std::path::Path, token: &str, not: Option<u32>) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(pid) = agent_pid(socket, token).await
            && Some(pid) != not
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "agent did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn init_restarts_a_killed_daemon_and_stops_on_sigterm() {
    // Kills init and its daemon when the test ends, also when it fails.
    let dir = sandhold_tests::local::TestDir::new("agent-init");
    let socket = dir.path().join("agent.sock");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "init-test-token").unwrap();
    let mut init = Command::new(env!("CARGO_BIN_EXE_sandhold-agent"))
        .arg("init")
        .arg("--")
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--token-file")
        .arg(&token_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let first = wait_for_pid(&socket, "init-test-token", None).await;
    assert_ne!(first, init.id(), "the daemon is a child of init, not init itself");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let second = wait_for_pid(&socket, "init-test-token", Some(first)).await;
    assert_ne!(first, second);

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = init.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "init did not exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    // The daemon is gone too: nothing answers on the socket.
    assert!(agent_pid(&socket, "init-test-token").await.is_none());
}
