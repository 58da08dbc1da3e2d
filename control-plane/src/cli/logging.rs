//! The one tracing init of the binary: a `RUST_LOG`-style filter, pretty or
//! JSON lines on stderr, structured fields; colours only on a terminal. When
//! the OTEL variables ask for traces, the same spans are also exported
//! ([`crate::telemetry`]); the log filter governs the log lines only.

use std::sync::{Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::config::LogFormat;
use crate::telemetry::Tracing;

/// Install the global subscriber. `filter` uses `RUST_LOG` syntax
/// (`info,control_plane::lease=debug`); an invalid one falls back to `info`
/// with a warning rather than refusing to start.
pub fn init(format: LogFormat, filter: &str, traces: Option<&Tracing>) {
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
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .log_internal_errors(false);
    let lines = match format {
        LogFormat::Pretty => lines.with_filter(env_filter).boxed(),
        LogFormat::Json => {
            lines.json().flatten_event(true).with_current_span(false).with_filter(env_filter).boxed()
        }
    };
    let installed =
        tracing_subscriber::registry().with(lines).with(traces.map(|t| t.layer())).try_init().is_ok();
    if !installed {
        // Already installed (tests that start several servers in-process).
        return;
    }
    if let Some(e) = bad_filter {
        tracing::warn!(filter, error = %e, "invalid log filter, using info");
    }
}

/// The embedded server's subscriber: JSON lines appended to `path`, so the
/// server's logging never mixes with a command's output.
pub fn init_to_file(path: &std::path::Path, filter: &str, traces: Option<&Tracing>) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    if let Some(deferred) = DEFERRED.get() {
        // A client that exports traces installed its subscriber first.
        let _ = deferred.set(Mutex::new(file));
        return Ok(());
    }
    let env_filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = file_lines(std::sync::Mutex::new(file)).with_filter(env_filter);
    let _ = tracing_subscriber::registry().with(lines).with(traces.map(|t| t.layer())).try_init();
    Ok(())
}

/// A client command's subscriber while it exports traces: the spans, and
/// (should it start an embedded server) that server's log lines at `info`,
/// to the file [`init_to_file`] names later.
pub fn init_client(traces: &Tracing) {
    let deferred = DEFERRED.get_or_init(OnceLock::new);
    let lines = file_lines(DeferredFile(deferred)).with_filter(EnvFilter::new("info"));
    let _ = tracing_subscriber::registry().with(lines).with(traces.layer()).try_init();
}

fn file_lines<S, W>(writer: W) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(false)
        .log_internal_errors(false)
        .json()
        .flatten_event(true)
        .with_current_span(false)
}

/// The log file of an embedded server a tracing client may start.
static DEFERRED: OnceLock<OnceLock<Mutex<std::fs::File>>> = OnceLock::new();

/// Writes to the deferred file once there is one; nowhere before.
struct DeferredFile(&'static OnceLock<Mutex<std::fs::File>>);

impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for DeferredFile {
    type Writer = Box<dyn std::io::Write + 'w>;

    fn make_writer(&'w self) -> Self::Writer {
        match self.0.get() {
            Some(file) => Box::new(file.make_writer()),
            None => Box::new(std::io::sink()),
        }
    }
}
