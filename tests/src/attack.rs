//! Attacks on the run user's confinement: a static helper that tries the
//! system calls the seccomp denylist names (`syscalls.c`), and the reading
//! of what it printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The source of the helper.
pub const SYSCALLS_SOURCE: &str = include_str!("syscalls.c");

/// The helper, built once per test process with the system's C compiler
/// (statically, so it runs in a FROM-scratch image too).
pub fn syscalls_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("sandhold-syscalls-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let source = dir.join("syscalls.c");
            std::fs::write(&source, SYSCALLS_SOURCE).unwrap();
            let binary = dir.join("syscalls");
            let status = std::process::Command::new("cc")
                .args(["-static", "-O1", "-o"])
                .arg(&binary)
                .arg(&source)
                .status()
                .expect("a C compiler (cc) builds the syscall attack helper");
            assert!(status.success(), "cc failed to build the syscall attack helper");
            binary
        })
        .clone()
}

/// Copy the helper to `dir/name`, executable, and return its path.
pub fn install_syscalls(dir: &Path, name: &str) -> PathBuf {
    let target = dir.join(name);
    std::fs::copy(syscalls_binary(), &target).unwrap();
    target
}

/// `name=outcome` lines into a map.
pub fn outcomes(stdout: &[u8]) -> BTreeMap<String, String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The calls every confined sandbox must refuse with `EPERM`, and what
/// `clone3` must answer.
pub const DENIED: &[&str] = &[
    "mount",
    "umount2",
    "bpf",
    "io_uring_setup",
    "perf_event_open",
    "keyctl",
    "userfaultfd",
    "open_by_handle_at",
    "unshare_user",
    "clone_user",
    "ptrace",
];

/// Assert the helper's output shows the denylist in force: each of
/// [`DENIED`] `EPERM`, `clone3` `ENOSYS`, and a plain fork still working.
pub fn assert_denied(stdout: &[u8]) {
    let got = outcomes(stdout);
    for name in DENIED {
        assert_eq!(got.get(*name).map(String::as_str), Some("EPERM"), "{name}: {got:?}");
    }
    assert_eq!(got.get("clone3").map(String::as_str), Some("ENOSYS"), "{got:?}");
    assert_eq!(got.get("fork").map(String::as_str), Some("ok"), "{got:?}");
}
