//! What the benches share: the test image, the static agent, an embedded
//! server, the docker CLI, and a row of samples with its quantiles.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

pub const IMAGE: &str = "sandhold-test-busybox:latest";

/// An embedded server on a loopback port, its data under `dir` (and in
/// `database_url`; default: SQLite there), the static agent for local and
/// Docker sandboxes; with a channel to it. Dropping the handle stops it.
pub async fn embedded_server(
    dir: &std::path::Path,
    database_url: Option<String>,
) -> (control_plane::server::RunningServer, tonic::transport::Channel) {
    let agent = static_agent();
    let layer = control_plane::config::ConfigLayer {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: Some(dir.to_path_buf()),
        database_url,
        agent_binary: Some(agent.clone()),
        agent_static_binary: Some(agent),
        ..Default::default()
    };
    let config = control_plane::config::ServeConfig::resolve(layer).unwrap();
    let server =
        control_plane::server::start(config, tokio_util::sync::CancellationToken::new()).await.unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.local_addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (server, channel)
}

pub fn static_agent() -> PathBuf {
    if let Some(path) = std::env::var_os("SANDHOLD_AGENT_STATIC_BIN") {
        return PathBuf::from(path);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-agent-static");
    let out = std::process::Command::new(script).output().expect("running scripts/build-agent-static");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

pub fn docker_cli(args: &[&str]) {
    let out = std::process::Command::new("docker").args(args).output().expect("docker");
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

pub struct Row {
    pub name: &'static str,
    pub samples: Vec<Duration>,
}

impl Row {
    pub fn quantile(&self, q: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        s[((s.len() - 1) as f64 * q).round() as usize]
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
