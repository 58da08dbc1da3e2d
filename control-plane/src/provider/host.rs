//! What both providers do on this host to start a sandbox's agent: its
//! token, the short name of its directory, the socket path limit, the
//! agent binary.

use std::path::{Path, PathBuf};

use shared::secret::Secret;

use super::{Error, Result};

/// A fresh random token for a sandbox's agent (256 bits, hex).
pub(crate) fn new_token() -> Secret {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    Secret::new(hex::encode(bytes))
}

/// A short random name for a sandbox's host directory. Short on purpose:
/// the agent's socket lives in it and Unix socket paths are limited to 107
/// bytes.
pub(crate) fn new_short_id() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Longest path a Unix socket may have (`sun_path` is 108 bytes with the
/// terminating NUL).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// Refuse a socket path the kernel would refuse, with a message that says
/// what to shorten.
pub(crate) fn check_socket_path(path: &std::path::Path, what: &str) -> Result<()> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(Error::SocketPathTooLong(format!(
            "{what} {} would put sandbox agent sockets at {len} bytes, over the {MAX_SOCKET_PATH}-byte limit \
                 of Unix socket paths; choose a shorter directory",
            path.display()
        )));
    }
    Ok(())
}

/// Write `contents` to a new file only its owner can read (tokens).
pub(crate) fn write_private_file(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// The longest token file read: a sandbox must not make us read a big one.
const MAX_TOKEN_FILE: u64 = 4096;

/// Read a token file the control plane wrote into a sandbox's host
/// directory, refusing what a sandbox could have put in its place: a
/// symlink (opened with `O_NOFOLLOW`, so the target, maybe a host file, is
/// never read), a FIFO or device (opened non-blocking, then it must be a
/// regular file), another owner than one of `owners`, a mode other than
/// 0600, more than 4 KiB.
pub(crate) fn read_private_file(path: &Path, owners: &[u32]) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

    use nix::fcntl::OFlag;
    let refused = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == nix::errno::Errno::ELOOP as i32 => refused("it is a symlink".into()),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(refused("it is not a regular file".into()));
    }
    if !owners.contains(&meta.uid()) {
        return Err(refused(format!("it is owned by uid {}, not {owners:?}", meta.uid())));
    }
    if meta.mode() & 0o7777 != 0o600 {
        return Err(refused(format!("its mode is {:o}, not 600", meta.mode() & 0o7777)));
    }
    let mut text = String::new();
    file.take(MAX_TOKEN_FILE + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_TOKEN_FILE {
        return Err(refused("it is longer than a token".into()));
    }
    Ok(text)
}

/// Refuse to connect to `path` unless it is a Unix socket itself (not a
/// symlink to one elsewhere on this host). `Ok(false)`: not there yet.
pub(crate) fn is_agent_socket(path: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => Ok(true),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a socket (a symlink or another file put there from inside the sandbox?)",
                path.display()
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// This process's effective uid: the owner of the files it writes.
pub(crate) fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Where the agent binary is when none is configured: `sandhold-agent` next
/// to the current executable (an installed pair, or cargo's target dir,
/// whose test binaries live one level below in `deps/`), else on `PATH`.
pub fn default_agent_binary() -> Option<PathBuf> {
    const NAME: &str = "sandhold-agent";
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        for candidate in [dir.join(NAME), dir.join("..").join(NAME)] {
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(NAME)).find(|c| c.is_file())
}

/// Where `scripts/build-agent-static` puts the static agent, relative to
/// cargo's target dir (`target/debug/sandhold` →
/// `target/static/x86_64-unknown-linux-gnu/debug/sandhold-agent`).
const STATIC_BUILD_DIR: &str = "static/x86_64-unknown-linux-gnu";

/// Where a static agent (one that runs in any image) is when none is
/// configured: where `scripts/build-agent-static` puts it next to this
/// executable's build, else the agent [`default_agent_binary`] finds when
/// that one is static itself (an installed release build).
pub fn default_static_agent_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    static_agent_near(&exe).or_else(|| default_agent_binary().filter(|p| is_static_executable(p)))
}

/// The static agent of the build `exe` belongs to: `exe` is
/// `<target>/<profile>/sandhold` (or a test binary in
/// `<target>/<profile>/deps/`).
fn static_agent_near(exe: &Path) -> Option<PathBuf> {
    let mut dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent()?;
    }
    let profile = dir.file_name()?;
    let candidate = dir.parent()?.join(STATIC_BUILD_DIR).join(profile).join("sandhold-agent");
    (candidate.is_file() && is_static_executable(&candidate)).then_some(candidate)
}

/// Whether the file at `path` is an executable that needs no dynamic
/// loader ([`is_static_elf`]), so it runs in an image with no libc at all.
/// Reads the ELF header and program headers only (the first 64 KiB, where
/// linkers put them; the whole file when they lie beyond).
pub fn is_static_executable(path: &Path) -> bool {
    use std::io::Read;
    let head = std::fs::File::open(path).and_then(|file| {
        let mut head = Vec::with_capacity(64 << 10);
        file.take(64 << 10).read_to_end(&mut head)?;
        Ok(head)
    });
    match head {
        Ok(head) if head.len() >= 64 && program_headers_end(&head) > head.len() as u64 => {
            std::fs::read(path).is_ok_and(|bytes| is_static_elf(&bytes))
        }
        Ok(head) => is_static_elf(&head),
        Err(_) => false,
    }
}

/// Where the program header table of the ELF header `head` ends.
fn program_headers_end(head: &[u8]) -> u64 {
    let (phoff, phentsize, phnum) = program_headers(head);
    (phoff as u64).saturating_add((phentsize * phnum) as u64)
}

/// Where the program header table of the ELF header `head` (64 bytes at
/// least) starts, the size of an entry and their number.
fn program_headers(head: &[u8]) -> (usize, usize, usize) {
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(head[32..40].try_into().unwrap_or_default()) as usize;
    (phoff, u16_at(54), u16_at(56))
}

/// Whether `bytes` are a 64-bit little-endian ELF with no `PT_INTERP`
/// program header (no dynamic loader).
pub(crate) fn is_static_elf(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return false; // only 64-bit little-endian is built here
    }
    let (phoff, phentsize, phnum) = program_headers(bytes);
    (0..phnum).all(|i| {
        let at = phoff + i * phentsize;
        bytes
            .get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap_or_default()) != PT_INTERP)
    })
}

#[cfg(test)]
mod tests {
    use shared::error::{Error as WireError, ErrorCode};

    use super::*;

    #[test]
    fn a_static_agent_is_found_where_the_build_script_puts_it() {
        // This test binary is dynamic; /bin/busybox (busybox-static, which
        // the test images need) is not.
        let me = std::env::current_exe().unwrap();
        assert!(!is_static_executable(&me));
        assert!(!is_static_elf(b"#!/bin/sh\necho hi\n"));
        assert!(!is_static_executable(Path::new("/etc/passwd")));
        let busybox = Path::new("/bin/busybox");
        assert!(is_static_executable(busybox), "busybox-static is installed by scripts/build-test-images");

        let target = tempfile::tempdir().unwrap();
        let exe = target.path().join("debug/sandhold");
        let agent = target.path().join("static/x86_64-unknown-linux-gnu/debug/sandhold-agent");
        std::fs::create_dir_all(agent.parent().unwrap()).unwrap();
        std::fs::create_dir_all(exe.parent().unwrap().join("deps")).unwrap();
        assert_eq!(static_agent_near(&exe), None, "nothing built yet");
        std::fs::copy(&me, &agent).unwrap();
        assert_eq!(static_agent_near(&exe), None, "a dynamic binary there is not taken");
        std::fs::copy(busybox, &agent).unwrap();
        assert_eq!(static_agent_near(&exe), Some(agent.clone()));
        assert_eq!(static_agent_near(&exe.parent().unwrap().join("deps/test-bin")), Some(agent));
    }

    /// Only the headers are read, but program headers past the first
    /// 64 KiB are still seen: a loader named there makes it dynamic.
    #[test]
    fn program_headers_far_into_the_file_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let elf = |segment: u32| {
            let mut bytes = vec![0u8; 70_000 + 56];
            bytes[..6].copy_from_slice(b"\x7fELF\x02\x01");
            bytes[32..40].copy_from_slice(&70_000u64.to_le_bytes());
            bytes[54..56].copy_from_slice(&56u16.to_le_bytes());
            bytes[56..58].copy_from_slice(&1u16.to_le_bytes());
            bytes[70_000..70_004].copy_from_slice(&segment.to_le_bytes());
            bytes
        };
        let (interp, load) = (dir.path().join("interp"), dir.path().join("load"));
        std::fs::write(&interp, elf(3)).unwrap();
        std::fs::write(&load, elf(1)).unwrap();
        assert!(!is_static_executable(&interp), "a PT_INTERP past 64 KiB");
        assert!(is_static_executable(&load));
    }

    #[test]
    fn long_socket_paths_are_refused_with_advice() {
        let long = std::path::PathBuf::from(format!("/{}", "d".repeat(120)));
        let err = WireError::from(check_socket_path(&long, "data dir").unwrap_err());
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(err.message.contains("shorter"), "{}", err.message);
        assert!(check_socket_path(std::path::Path::new("/tmp/x/agent.sock"), "data dir").is_ok());
    }

    #[test]
    fn token_files_are_read_only_when_they_are_ours() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        write_private_file(&token, b"tok-123").unwrap();
        assert_eq!(read_private_file(&token, &[own_uid()]).unwrap(), "tok-123");
        let err = read_private_file(&token, &[own_uid() + 1]).unwrap_err();
        assert!(err.to_string().contains("owned by uid"), "{err}");

        let secret = dir.path().join("host-secret");
        std::fs::write(&secret, "host secret").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let err = read_private_file(&link, &[own_uid()]).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");

        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_private_file(&token, &[own_uid()]).unwrap_err().to_string().contains("mode"));
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = read_private_file(&fifo, &[own_uid()]).unwrap_err();
        assert!(err.to_string().contains("regular file"), "a FIFO must not block the reader: {err}");
    }

    #[test]
    fn only_a_socket_itself_is_an_agent_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        assert!(!is_agent_socket(&sock).unwrap(), "not there yet");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(is_agent_socket(&sock).unwrap());
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&sock, &link).unwrap();
        assert!(is_agent_socket(&link).is_err(), "a symlink to a socket is refused");
        std::fs::write(dir.path().join("file"), "x").unwrap();
        assert!(is_agent_socket(&dir.path().join("file")).is_err());
    }

    #[test]
    fn tokens_and_ids_are_random() {
        assert_ne!(new_token().expose(), new_token().expose());
        assert_eq!(new_token().expose().len(), 64);
        assert_eq!(new_short_id().len(), 16);
    }
}
