//! The live display of an ensure: a spinner line with the phase (setup step
//! i/n and its command), the current step's last output line and the elapsed
//! time, on stderr; a step's stderr lines stay above it as they come. When
//! stdout is not a terminal: plain lines instead, one per phase or step
//! change and one per output line.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shared::proto::v1::{EnsurePhase, EnsureProgress, OutputStream};

pub struct EnsureDisplay {
    bar: Option<ProgressBar>,
    /// The phase line last shown (plain mode prints only changes).
    headline: String,
    last_output: String,
}

impl EnsureDisplay {
    /// A spinner when stdout is a terminal, plain lines otherwise.
    pub fn new() -> Self {
        Self::with_terminal(std::io::stdout().is_terminal() && std::io::stderr().is_terminal())
    }

    pub fn with_terminal(terminal: bool) -> Self {
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{spinner:.cyan} [{elapsed:>3}] {msg}")
                    .expect("valid template")
                    .tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ "),
            );
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Self { bar, headline: String::new(), last_output: String::new() }
    }

    pub fn update(&mut self, progress: &EnsureProgress) {
        if !progress.warning.is_empty() {
            // Kept on the terminal, above the spinner.
            let line = format!("warning: {}", super::terminal::visible_line(&progress.warning));
            match &self.bar {
                Some(bar) => bar.println(line),
                None => eprintln!("{line}"),
            }
            return;
        }
        let headline = headline(progress);
        let new_headline = headline != self.headline;
        if new_headline {
            self.last_output.clear();
        }
        // Setup output is the sandbox's: shown, never obeyed.
        if !progress.output_line.is_empty() {
            self.last_output = super::terminal::visible_line(&progress.output_line).into_owned();
        }
        match &self.bar {
            // What a step says on stderr (a warning, an error) is kept.
            Some(bar)
                if progress.output_stream() == OutputStream::Stderr && !progress.output_line.is_empty() =>
            {
                if new_headline {
                    bar.println(&headline);
                }
                bar.println(format!("  | {}", self.last_output));
                bar.set_message(headline.clone());
            }
            Some(bar) => {
                let msg = if self.last_output.is_empty() {
                    headline.clone()
                } else {
                    format!("{headline}\n    \x1b[2m{}\x1b[0m", clip(&self.last_output, 100))
                };
                bar.set_message(msg);
            }
            None => {
                if new_headline {
                    eprintln!("{headline}");
                }
                if !progress.output_line.is_empty() {
                    eprintln!("  | {}", self.last_output);
                }
            }
        }
        self.headline = headline;
    }

    /// Leave a last line saying how it ended.
    pub fn finish(&mut self, message: &str) {
        match self.bar.take() {
            Some(bar) => bar.finish_with_message(message.to_string()),
            None => eprintln!("{message}"),
        }
    }

    /// Remove the spinner without a trace (an error follows).
    pub fn abandon(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for EnsureDisplay {
    fn drop(&mut self) {
        self.abandon();
    }
}

fn headline(p: &EnsureProgress) -> String {
    let phase = match p.phase() {
        EnsurePhase::Unspecified => "preparing",
        EnsurePhase::Resolving => "resolving the definition",
        EnsurePhase::Resuming => "resuming the sandbox",
        EnsurePhase::RestoringSnapshot => "restoring the snapshot",
        EnsurePhase::RestoringCheckpoint => "restoring the checkpoint",
        EnsurePhase::Creating => "creating the sandbox",
        EnsurePhase::Cloning => "cloning the repository",
        EnsurePhase::Setup => "setup",
        EnsurePhase::Projecting => "writing instructions and skills",
        EnsurePhase::Snapshotting => "taking a snapshot",
    };
    if !p.network.is_empty() {
        clip(&p.message, 120)
    } else if p.phase() == EnsurePhase::Setup && p.steps > 0 {
        format!("setup step {}/{}: {}", p.step, p.steps, clip(&p.command, 80))
    } else if !p.message.is_empty() && p.phase() != EnsurePhase::Setup {
        format!("{phase}: {}", clip(&p.message, 100))
    } else {
        phase.to_string()
    }
}

/// At most `max` characters, with an ellipsis when cut.
pub fn clip(s: &str, max: usize) -> String {
    let s = s.trim_end();
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_steps_show_their_index_and_command() {
        let p = EnsureProgress {
            phase: EnsurePhase::Setup as i32,
            step: 2,
            steps: 3,
            command: "npm ci".into(),
            ..Default::default()
        };
        assert_eq!(headline(&p), "setup step 2/3: npm ci");
        let p = EnsureProgress {
            phase: EnsurePhase::Creating as i32,
            message: "local".into(),
            ..Default::default()
        };
        assert_eq!(headline(&p), "creating the sandbox: local");
        assert_eq!(clip("abcdef", 4), "abc…");
    }
}
