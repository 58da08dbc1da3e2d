//! Docker for the tests: the local test image, the docker CLI as an
//! observer independent of the provider under test, and the one cleanup
//! guard.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The busybox test image `scripts/build-test-images` builds locally (no
/// registry).
pub const TEST_IMAGE: &str = "sandhold-test-busybox:latest";

/// Debian with git, bash and python3 (`scripts/build-test-images
/// --debian`): for what the busybox image cannot run.
pub const DEBIAN_IMAGE: &str = "sandhold-test-debian:latest";

pub use control_plane::provider::LABEL_TENANT;
use control_plane::provider::docker::LABEL_HOST_DIR;

/// Make sure the test images exist (built locally; no registry), once per
/// test binary.
pub fn ensure_test_image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-test-images");
        let out = Command::new(&script).output().expect("running scripts/build-test-images");
        assert!(out.status.success(), "build-test-images failed: {}", String::from_utf8_lossy(&out.stderr));
    });
}

/// Make sure [`DEBIAN_IMAGE`] exists and is current (the first build
/// bootstraps Debian, later ones reuse a cache), once per test binary.
pub fn ensure_debian_image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-test-images");
        let out = Command::new(&script).arg("--debian").output().expect("running scripts/build-test-images");
        assert!(
            out.status.success(),
            "build-test-images --debian failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// Removes every container (with its volumes) and image of a test's
/// tenant when dropped, so a failing Docker test leaves nothing behind.
pub struct DockerCleanup {
    pub tenant: String,
}

impl Drop for DockerCleanup {
    fn drop(&mut self) {
        let filter = format!("label={LABEL_TENANT}={}", self.tenant);
        let containers = ids(&["ps", "-aq", "--filter", &filter]);
        if !containers.is_empty() {
            let _ = Command::new("docker").args(["rm", "-fv"]).args(&containers).output();
        }
        let images = ids(&["images", "-q", "--filter", &filter]);
        if !images.is_empty() {
            let _ = Command::new("docker").args(["rmi", "-f"]).args(&images).output();
        }
    }
}

/// Removes, when dropped, every container whose sandbox directory is under
/// `dir`: for tests whose sandboxes have no tenant of their own (the CLI's
/// `default`), run by a server the test's directory holds. Such a server is
/// killed with the directory, maybe before it destroyed a finished run's
/// sandbox.
pub struct DockerUnder {
    pub dir: PathBuf,
}

impl Drop for DockerUnder {
    fn drop(&mut self) {
        let format = format!("{{{{.ID}}}} {{{{.Label \"{LABEL_HOST_DIR}\"}}}}");
        let out = Command::new("docker")
            .args(["ps", "-a", "--filter", &format!("label={LABEL_HOST_DIR}"), "--format", &format])
            .output()
            .expect("docker");
        let under: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, dir)| std::path::Path::new(dir).starts_with(&self.dir))
            .map(|(id, _)| id.to_string())
            .collect();
        if !under.is_empty() {
            let _ = Command::new("docker").args(["rm", "-fv"]).args(&under).output();
        }
    }
}

/// Whitespace-separated ids a docker CLI listing prints.
fn ids(args: &[&str]) -> Vec<String> {
    let out = Command::new("docker").args(args).output().expect("docker");
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

/// Ids of containers (all states) carrying `label` (`key` or `key=value`).
pub fn containers(label: &str) -> Vec<String> {
    ids(&["ps", "-aq", "--filter", &format!("label={label}")])
}

/// Ids of running containers carrying `label`.
pub fn running(label: &str) -> Vec<String> {
    ids(&["ps", "-q", "--filter", &format!("label={label}")])
}

/// Ids of images carrying `label`.
pub fn images(label: &str) -> Vec<String> {
    ids(&["images", "-q", "--filter", &format!("label={label}")])
}

pub fn inspect(id: &str, format: &str) -> String {
    let out =
        Command::new("docker").args(["inspect", "--format", format, id]).output().expect("docker inspect");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `docker args...`, asserting success.
pub fn cli(args: &[&str]) {
    let out = Command::new("docker").args(args).output().expect("docker");
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}
