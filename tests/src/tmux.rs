//! A tmux server of the test's own, to drive terminal programs in a real
//! pane (`send-keys`, `capture-pane`).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::wait::PATIENCE;

/// A tmux server of its own (its own socket), killed on drop.
pub struct Tmux {
    socket: String,
}

impl Default for Tmux {
    fn default() -> Self {
        Self::new()
    }
}

impl Tmux {
    pub fn new() -> Self {
        crate::services::program("tmux").expect("tmux");
        Self { socket: format!("sandhold-test-{}", crate::nonce()) }
    }

    /// `tmux ARGS` on this server; `-u`: panes are captured as UTF-8 (not
    /// `_`) whatever the test's locale.
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-u", "-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn pane(&self) -> String {
        self.run(&["capture-pane", "-p", "-J", "-t", "s"])
    }

    pub fn size(&self) -> String {
        self.run(&["display-message", "-p", "-t", "s", "#{pane_height} #{pane_width}"]).trim().to_string()
    }

    /// Until one of the pane's lines is `line`; the pane's text either way.
    pub fn wait_for_line(&self, line: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let pane = self.pane();
            if has_line(&pane, line) || Instant::now() > deadline {
                return pane;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Until the pane shows `text`; the pane's text either way.
    pub fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let pane = self.pane();
            if pane.contains(text) || Instant::now() > deadline {
                return pane;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether one of `pane`'s lines is exactly `line`.
pub fn has_line(pane: &str, line: &str) -> bool {
    pane.lines().any(|l| l.trim_end() == line)
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).output();
    }
}
