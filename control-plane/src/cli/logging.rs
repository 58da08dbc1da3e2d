//! The one tracing init of the binary: a `RUST_LOG`-style filter, pretty or
//! JSON lines on stderr, structured fields; colours only on a terminal.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Install the global subscriber. `filter` uses `RUST_LOG` syntax
/// (`info,control_plane::lease=debug`); an invalid one falls back to `info`
/// with a warning rather than refusing to start.
pub fn init(format: LogFormat, filter: &str) {
    let (env_filter, bad_filter) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    // A closed stderr (a dead log pipe) must not take the server down:
    // by default the subscriber reports failed writes with `eprintln!`,
    // which panics when stderr itself is the broken pipe.
    // Colours only for a person at a terminal: stderr sent to a file or a
    // collector gets plain lines, and NO_COLOR is honoured.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .log_internal_errors(false);
    let result = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
    if result.is_err() {
        // Already installed (tests that start several servers in-process).
        return;
    }
    if let Some(e) = bad_filter {
        tracing::warn!(filter, error = %e, "invalid log filter, using info");
    }
}

/// The embedded server's subscriber: JSON lines appended to `path`, so the
/// server's logging never mixes with a command's output.
pub fn init_to_file(path: &std::path::Path, filter: &str) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let env_filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .log_internal_errors(false)
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .try_init();
    Ok(())
}
