//! `sandhold daemon`: the user's background server. Client commands without
//! `--server` start it when it is not running (`client.rs`) and reuse it;
//! it stops by itself once nothing has happened for `--idle-stop` (no run
//! it drives, no call or stream in flight). `status`, `stop` and `start`
//! are for people; `serve` is the server process itself.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::background::{self, Files, State};
use super::client::EmbeddedArgs;
use super::format::OutputFormat;
use super::output::{json_line, print_error};

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Whether the background server of the data dir runs: pid, socket, log, runs.
    #[command(after_help = "Examples:\n  sandhold daemon status\n  sandhold daemon status --output json")]
    Status(DaemonArgs),
    /// Stop the background server now (runs it drives detach and are resumed by the next one).
    #[command(after_help = "Example:\n  sandhold daemon stop")]
    Stop(DaemonArgs),
    /// Start the background server now, if it is not running (client commands start it when needed).
    #[command(after_help = "Example:\n  sandhold daemon start --idle-stop 1h")]
    Start(StartArgs),
    /// The background server process itself (what `start` runs).
    #[command(
        hide = true,
        after_help = "Example:\n  sandhold daemon serve --data-dir ~/.local/share/sandhold"
    )]
    Serve(StartArgs),
}

/// Which background server: the one of the data dir.
#[derive(Debug, Clone, Args)]
pub struct DaemonArgs {
    /// human: for people; json: one JSON object, for scripts.
    #[arg(long, env = "SANDHOLD_OUTPUT", value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,

    #[command(flatten)]
    pub embedded: EmbeddedArgs,
}

#[derive(Debug, Clone, Args)]
pub struct StartArgs {
    /// Stop after this long with no run driven and no call in flight (e.g. 15m, 2h; 0: never).
    #[arg(long, env = background::IDLE_STOP_VAR, value_name = "DURATION", value_parser = parse_idle, default_value = "15m")]
    pub idle_stop: Duration,

    #[command(flatten)]
    pub daemon: DaemonArgs,
}

fn parse_idle(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    crate::config::parse_span(text)
}

pub fn daemon(command: DaemonCommand) -> ExitCode {
    if let DaemonCommand::Serve(args) = command {
        return serve(args);
    }
    let output = match &command {
        DaemonCommand::Status(a) | DaemonCommand::Stop(a) => a.output,
        DaemonCommand::Start(a) | DaemonCommand::Serve(a) => a.daemon.output,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(super::run::EXIT_USAGE);
        }
    };
    let result = runtime.block_on(async move {
        match command {
            DaemonCommand::Status(args) => status(args).await,
            DaemonCommand::Stop(args) => stop(args).await,
            DaemonCommand::Start(args) => start(args).await,
            DaemonCommand::Serve(_) => unreachable!("handled above"),
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            print_error(output, &e);
            ExitCode::from(super::run::EXIT_USAGE)
        }
    }
}

async fn status(args: DaemonArgs) -> anyhow::Result<u8> {
    let files = Files::of(&args.embedded.data_dir());
    let Some(pid) = background::running(&files) else {
        match args.output {
            OutputFormat::Json => json_line(&json!({ "running": false, "socket": files.socket })),
            OutputFormat::Human => println!(
                "no background server runs for {} (a command without --server starts one)",
                args.embedded.data_dir().display()
            ),
        }
        return Ok(3);
    };
    let state = State::read(&files);
    let serving = background::serving(&files).await;
    let running_runs = if serving { count_running_runs(&args).await.ok() } else { None };
    let now = shared::chunk::now_ms();
    match args.output {
        OutputFormat::Json => json_line(&json!({
            "running": true,
            "pid": pid,
            "serving": serving,
            "version": state.as_ref().map(|s| s.version.clone()),
            "started_at_ms": state.as_ref().map(|s| s.started_at_ms),
            "idle_stop_ms": state.as_ref().map(|s| s.idle_stop_ms),
            "socket": files.socket,
            "log": files.log,
            "running_runs": running_runs,
        })),
        OutputFormat::Human => {
            let up = state
                .as_ref()
                .map(|s| {
                    background::span_text(Duration::from_millis(
                        u64::try_from(now - s.started_at_ms).unwrap_or(0),
                    ))
                })
                .unwrap_or_else(|| "?".into());
            let version = state.as_ref().map_or("?", |s| s.version.as_str());
            println!(
                "background server: {} (pid {pid}, sandhold {version}, up {up})",
                if serving { "running" } else { "starting or stopping" }
            );
            println!("  socket:  {}", files.server());
            println!("  log:     {}", files.log.display());
            if let Some(n) = running_runs {
                println!("  runs:    {n} running");
            }
            if let Some(s) = &state {
                let idle = if s.idle_stop_ms == 0 {
                    "never stops by itself".to_string()
                } else {
                    format!(
                        "stops after {} with no run or call",
                        background::span_text(Duration::from_millis(s.idle_stop_ms))
                    )
                };
                println!("  idle:    {idle}; `sandhold daemon stop` stops it now");
            }
        }
    }
    Ok(0)
}

async fn count_running_runs(args: &DaemonArgs) -> anyhow::Result<usize> {
    use shared::proto::v1 as api;
    let conn = super::client::Connection::background(&args.embedded).await?;
    let mut running = 0;
    let mut page_token = String::new();
    // Every page: a user with more running runs than a page still sees them all.
    let result = loop {
        let request = api::ListRunsRequest {
            limit: 1000,
            status: api::RunStatus::Running.into(),
            page_token: page_token.clone(),
            ..Default::default()
        };
        match conn.runs().list_runs(request).await {
            Ok(page) => {
                let page = page.into_inner();
                running += page.runs.len();
                if page.next_page_token.is_empty() {
                    break Ok(running);
                }
                page_token = page.next_page_token;
            }
            Err(status) => break Err(super::output::status_error(status)),
        }
    };
    conn.close().await;
    result
}

async fn stop(args: DaemonArgs) -> anyhow::Result<u8> {
    let files = Files::of(&args.embedded.data_dir());
    let Some(pid) = background::running(&files) else {
        match args.output {
            OutputFormat::Json => json_line(&json!({ "stopped": false, "running": false })),
            OutputFormat::Human => {
                println!("no background server runs for {}", args.embedded.data_dir().display())
            }
        }
        return Ok(0);
    };
    let pid = i32::try_from(pid).context("a pid")?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)
        .with_context(|| format!("signalling the background server (pid {pid})"))?;
    // Its shutdown drains calls and detaches runs within its grace.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while background::running(&files).is_some() {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "the background server (pid {pid}) did not stop within 30 s; see {} (`kill -KILL {pid}` ends it \
                 at once: its runs are resumed by the next server)",
                files.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match args.output {
        OutputFormat::Json => json_line(&json!({ "stopped": true, "pid": pid })),
        OutputFormat::Human => println!("stopped the background server (pid {pid})"),
    }
    Ok(0)
}

async fn start(args: StartArgs) -> anyhow::Result<u8> {
    let files = Files::of(&args.daemon.embedded.data_dir());
    let started = super::client::ensure_background(&args.daemon.embedded, Some(args.idle_stop)).await?;
    let pid = background::running(&files);
    match args.daemon.output {
        OutputFormat::Json => json_line(&json!({ "started": started, "pid": pid, "socket": files.socket })),
        OutputFormat::Human if !started => {
            println!("the background server already runs (pid {})", pid.map_or("?".into(), |p| p.to_string()))
        }
        OutputFormat::Human => {}
    }
    Ok(0)
}

/// The server process: take the data dir's lock (another server holding it
/// means one runs already: done), serve on the socket, stop on a signal,
/// when idle, or when its socket is removed (its data dir is gone).
fn serve(args: StartArgs) -> ExitCode {
    let embedded = &args.daemon.embedded;
    let files = Files::of(&embedded.data_dir());
    match serve_until_done(&args, &files) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandhold daemon serve: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve_until_done(args: &StartArgs, files: &Files) -> anyhow::Result<()> {
    files.make_dir()?;
    let Some(_held) = background::lock(files)? else {
        eprintln!("a background server already runs for this data dir");
        return Ok(());
    };
    let mut config = args.daemon.embedded.config()?;
    config.listen_unix = Some(files.socket.clone());
    config.replica_id = format!("daemon-{}", std::process::id());
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let traces = runtime.block_on(async { crate::telemetry::Tracing::from_env("sandhold") });
    super::logging::init_to_file(&files.log, &config.log_filter, traces.as_ref())
        .with_context(|| format!("opening the log {}", files.log.display()))?;
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        super::serve::watch_signals(shutdown.clone())?;
        // A closed terminal is no reason to stop.
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move { while hangup.recv().await.is_some() {} });
        let server = crate::server::start(config, shutdown.clone()).await?;
        State {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at_ms: shared::chunk::now_ms(),
            idle_stop_ms: u64::try_from(args.idle_stop.as_millis()).unwrap_or(u64::MAX),
            socket: files.socket.clone(),
            log: files.log.clone(),
        }
        .write(files)?;
        let socket_inode = inode(&files.socket);
        info!(socket = %files.socket.display(), idle_stop = ?args.idle_stop, "background server started");
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            if inode(&files.socket) != socket_inode {
                warn!(socket = %files.socket.display(), "the socket was removed or replaced: stopping");
                break;
            }
            let quiet_for = server.quiet_for();
            if !args.idle_stop.is_zero() && quiet_for >= args.idle_stop {
                info!(idle_for = ?quiet_for, "nothing to do: stopping");
                break;
            }
        }
        let result = server.stop().await;
        // Only our own socket: a successor may have bound the path already.
        if inode(&files.socket) == socket_inode {
            let _ = std::fs::remove_file(&files.socket);
        }
        let _ = std::fs::remove_file(&files.state);
        result
    });
    if let Some(traces) = traces {
        traces.flush();
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

fn inode(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}
