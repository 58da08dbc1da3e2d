//! What the Docker benches share: the test image, the static agent, the
//! docker CLI, and a row of samples with its quantiles.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

pub const IMAGE: &str = "sandhold-test-busybox:latest";

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
