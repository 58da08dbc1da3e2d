//! How the agent starts every child process: its own process group (so a
//! timeout or a dropped stream kills the whole tree), and an environment
//! scrubbed of the agent's own configuration (the token file path and any
//! other `SANDHOLD_AGENT_*` variable never reach a child).

use std::collections::HashMap;
use std::path::Path;

/// Prefix of the agent's own environment variables; all are removed from
/// children.
pub const AGENT_ENV_PREFIX: &str = "SANDHOLD_AGENT_";

/// Remove the agent's own variables from `cmd`'s inherited environment, then
/// apply `env`. Call for every child the agent starts.
pub fn scrub_env(cmd: &mut std::process::Command, env: &HashMap<String, String>) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with(AGENT_ENV_PREFIX) {
            cmd.env_remove(&key);
        }
    }
    for (k, v) in env {
        if !k.starts_with(AGENT_ENV_PREFIX) {
            cmd.env(k, v);
        }
    }
}

/// A `std::process::Command` for `argv` (or `/bin/sh -c shell`) in `cwd`,
/// with a scrubbed environment, in a new process group. Convert with
/// `tokio::process::Command::from` for async use.
pub fn command(
    program: &str,
    args: &[String],
    cwd: &Path,
    env: &HashMap<String, String>,
) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).current_dir(cwd);
    scrub_env(&mut cmd, env);
    cmd.process_group(0);
    cmd
}

/// Kill a whole process group (ignores a group that is already gone).
pub fn kill_group(pgid: u32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid as i32), signal);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_variables_do_not_reach_children() {
        // SAFETY-free: set_var is unsafe in edition 2024 only because of
        // concurrent readers; this test process's other tests do not read it.
        unsafe { std::env::set_var("SANDHOLD_AGENT_TOKEN_FILE", "/secret/token") };
        let mut env = HashMap::new();
        env.insert("VISIBLE".to_string(), "yes".to_string());
        env.insert("SANDHOLD_AGENT_SMUGGLED".to_string(), "no".to_string());
        let out = command("/usr/bin/env", &[], Path::new("/"), &env).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("VISIBLE=yes"));
        assert!(!text.contains("SANDHOLD_AGENT_"), "{text}");
    }
}
