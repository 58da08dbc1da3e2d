//! What both providers do on this host to start a sandbox's agent: its
//! token, the short name of its directory, the socket path limit, the
//! agent binary.

use std::path::PathBuf;

use shared::error::{Error, ErrorCode};
use shared::secret::Secret;

use super::Result;

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
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            format!(
                "{what} {} would put sandbox agent sockets at {len} bytes, over the {MAX_SOCKET_PATH}-byte limit \
                 of Unix socket paths; choose a shorter directory",
                path.display()
            ),
        ));
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

#[cfg(test)]
mod tests {
    use shared::error::ErrorCode;

    use super::*;

    #[test]
    fn long_socket_paths_are_refused_with_advice() {
        let long = std::path::PathBuf::from(format!("/{}", "d".repeat(120)));
        let err = check_socket_path(&long, "data dir").unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(err.message.contains("shorter"), "{}", err.message);
        assert!(check_socket_path(std::path::Path::new("/tmp/x/agent.sock"), "data dir").is_ok());
    }

    #[test]
    fn tokens_and_ids_are_random() {
        assert_ne!(new_token().expose(), new_token().expose());
        assert_eq!(new_token().expose().len(), 64);
        assert_eq!(new_short_id().len(), 16);
    }
}
