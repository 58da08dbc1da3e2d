//! `sandhold run --attempts N` (one task fanned out to N attempts, followed
//! side by side), `sandhold attempts show SET` and `sandhold attempts
//! promote SET RUN_ID [--push BRANCH]`.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::{Value, json};
use shared::chunk::{ChunkType, JsonChunk};
use shared::proto::v1 as api;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use super::client::{ClientArgs, Connection};
use super::output::{OutputFormat, json_line, status_error};
use super::run::{RunArgs, SecretRef, prepare, resolve, secret_values, status_name, with_connection};

/// How long `run --attempts` waits, once every run has ended, for the
/// attempts' evaluations (diff, test) before printing what it has.
const EVALUATION_WAIT: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone, Subcommand)]
pub enum AttemptsCommand {
    /// Each attempt of a set: status, files changed, lines added and
    /// removed, the test's exit code, tokens, duration.
    #[command(
        after_help = "Examples:\n  sandhold attempts show att-3f2a9c1d0b7e --output json\n  sandhold attempts show att-3f2a9c1d0b7e --wait"
    )]
    Show {
        /// The set's id (`sandhold run --attempts` prints it).
        set: String,
        /// Wait until every attempt's run has ended and been evaluated.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Make an attempt the thread's: its files become the thread's
    /// checkpoint and its conversation the thread's; the other attempts'
    /// sandboxes are destroyed.
    #[command(after_help = "Examples:\n  sandhold attempts promote att-3f2a9c1d0b7e att-3f2a9c1d0b7e-1\n  \
                            sandhold attempts promote att-3f2a9c1d0b7e att-3f2a9c1d0b7e-1 --push fix/login")]
    Promote {
        /// The set's id (`sandhold run --attempts` prints it).
        set: String,
        /// The attempt's run id.
        run_id: String,
        /// Then push the winner's workspace to this branch of the workspace's
        /// origin: its changes are committed (as --author) on a new branch of
        /// that name and pushed from its sandbox, as `sandhold git push` does.
        #[arg(long, value_name = "BRANCH")]
        push: Option<String>,
        /// With --push: author and committer of the winner's commit,
        /// "Name <email>" (default: $SANDHOLD_GIT_AUTHOR, else git's
        /// user.name/user.email here).
        #[arg(long, value_name = "NAME <EMAIL>", requires = "push")]
        author: Option<String>,
        /// A secret for the push, NAME=ENV_VAR (e.g. the workspace
        /// source's auth secret). Repeatable.
        #[arg(long = "secret", value_name = "NAME=ENV_VAR")]
        secrets: Vec<SecretRef>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn attempts(command: AttemptsCommand) -> ExitCode {
    match command {
        AttemptsCommand::Show { set, wait, client } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let set = if wait { evaluated_set(conn, &set).await? } else { get_set(conn, &set).await? };
                print_set(&set, format);
                Ok(0)
            })
            .await
        }
        AttemptsCommand::Promote { set, run_id, push, author, secrets, client } => {
            let format = client.output;
            with_connection(&client, async move |conn| {
                let request = api::PromoteAttemptRequest { attempt_set_id: set.clone(), run_id: run_id.clone() };
                let promoted = conn.runs().promote_attempt(request).await.map_err(status_error)?.into_inner();
                let thread = promoted.set.as_ref().map(|s| s.thread_id.clone()).unwrap_or_default();
                match format {
                    OutputFormat::Json => json_line(&json!({
                        "attempt_set_id": set, "run_id": run_id, "thread_id": thread,
                        "checkpoint_id": promoted.checkpoint_id,
                    })),
                    OutputFormat::Human => println!(
                        "promoted {run_id}: thread {thread} continues from checkpoint {}",
                        promoted.checkpoint_id
                    ),
                }
                if let Some(branch) = push {
                    let secrets = secret_values(&secrets)?;
                    let pushed = push_winner(conn, &set, &run_id, &branch, author, secrets).await?;
                    match format {
                        OutputFormat::Json => json_line(&json!({
                            "run_id": run_id, "pushed": pushed.branch, "remote": pushed.remote, "commit": pushed.commit,
                        })),
                        OutputFormat::Human => println!("pushed {} to {} ({})", pushed.branch, pushed.remote, pushed.commit),
                    }
                }
                Ok(0)
            })
            .await
        }
    }
}

/// The promoted attempt's workspace, pushed to `branch` of its origin: its
/// changes (if any) committed on a new branch of that name, then pushed.
async fn push_winner(
    conn: &Connection,
    set: &str,
    run_id: &str,
    branch: &str,
    author: Option<String>,
    secrets: std::collections::HashMap<String, String>,
) -> anyhow::Result<api::GitPushResponse> {
    let run =
        conn.runs().get_run(api::GetRunRequest { run_id: run_id.to_string() }).await.map_err(status_error)?;
    let sandbox_id = run.into_inner().run.unwrap_or_default().sandbox_id;
    let mut sandboxes = conn.sandboxes();
    let status = api::GitStatusRequest { sandbox_id: sandbox_id.clone(), path: String::new() };
    let status = sandboxes.git_status(status).await.map_err(status_error)?.into_inner();
    if status.branch != branch {
        let create = api::GitBranchRequest {
            sandbox_id: sandbox_id.clone(),
            name: branch.to_string(),
            create: true,
            ..Default::default()
        };
        sandboxes.git_branch(create).await.map_err(status_error)?;
    }
    if !status.files.is_empty() {
        let commit = api::GitCommitRequest {
            sandbox_id: sandbox_id.clone(),
            message: format!("{run_id}: the promoted attempt of {set}"),
            author: Some(super::git::author(author)?),
            all: true,
            ..Default::default()
        };
        sandboxes.git_commit(commit).await.map_err(status_error)?;
    }
    let push = api::GitPushRequest { sandbox_id, branch: branch.to_string(), secrets, ..Default::default() };
    Ok(sandboxes.git_push(push).await.map_err(status_error)?.into_inner())
}

/// `sandhold run --attempts N` / `--attempt HARNESS[:MODEL]`...
pub async fn run(args: RunArgs) -> ExitCode {
    let prepared = match prepare(&args) {
        Ok(p) => p,
        Err(e) => {
            super::output::print_error(args.client.output, &e);
            return ExitCode::from(super::run::EXIT_USAGE);
        }
    };
    let client = args.client.clone();
    with_connection(&client, async move |conn| {
        let (run, notice) = resolve(conn, &args, prepared).await?;
        if let Some(line) = notice {
            eprintln!("{line}");
        }
        let attempts = args
            .attempt
            .iter()
            .map(|a| match a.split_once(':') {
                Some((harness, model)) => api::AttemptSpec { harness: harness.into(), model: model.into() },
                None => api::AttemptSpec { harness: a.clone(), model: String::new() },
            })
            .collect();
        let request =
            api::StartAttemptsRequest { run: Some(run), count: args.attempts.unwrap_or_default(), attempts };
        follow_attempts(conn, request, args.client.output, args.detach).await
    })
    .await
}

/// Start the set, follow every attempt's run side by side until all have
/// ended, then print the set. Exit 0 when any attempt completed, 1 when
/// none did.
async fn follow_attempts(
    conn: &Connection,
    request: api::StartAttemptsRequest,
    format: OutputFormat,
    detach: bool,
) -> anyhow::Result<u8> {
    let started = conn.runs().start_attempts(request).await.map_err(status_error)?.into_inner();
    let set = started.set.unwrap_or_default();
    let runs: Vec<String> = set.attempts.iter().map(|a| a.run_id.clone()).collect();
    match format {
        OutputFormat::Json => json_line(&json!({
            "attempt_set_id": set.attempt_set_id, "thread_id": set.thread_id, "run_ids": runs,
        })),
        OutputFormat::Human => eprintln!(
            "attempts {} (thread {}): {} runs from checkpoint {}",
            set.attempt_set_id,
            set.thread_id,
            runs.len(),
            set.base_checkpoint_id
        ),
    }
    if detach {
        if format == OutputFormat::Human {
            println!("{}", set.attempt_set_id);
        }
        return Ok(0);
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, api::RunChunk)>();
    for (i, run_id) in runs.iter().enumerate() {
        let request = api::AttachRunRequest { run_id: run_id.clone(), ..Default::default() };
        let mut stream = conn.runs().attach_run(request).await.map_err(status_error)?.into_inner();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(Ok(event)) = stream.next().await {
                if let Some(api::run_event::Event::Chunk(chunk)) = event.event
                    && tx.send((i, chunk)).is_err()
                {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut board = Board::new(&set, format);
    while let Some((i, rc)) = rx.recv().await {
        let chunk = rc.chunk.clone().unwrap_or_default();
        if format == OutputFormat::Json {
            json_line(&JsonChunk::line(&rc.offset, &chunk));
        }
        board.saw(i, &chunk);
    }
    board.finish();
    let set = evaluated_set(conn, &set.attempt_set_id).await?;
    print_set(&set, format);
    let completed = set.attempts.iter().any(|a| a.status() == api::RunStatus::Completed);
    Ok(if completed { 0 } else { 1 })
}

/// The set once every attempt is evaluated (the evaluations follow the
/// runs' ends by a keeper's pass), or as it is after [`EVALUATION_WAIT`].
async fn evaluated_set(conn: &Connection, set: &str) -> anyhow::Result<api::AttemptSet> {
    let deadline = Instant::now() + EVALUATION_WAIT;
    let mut got = get_set(conn, set).await?;
    while got.attempts.iter().any(|a| !a.evaluated) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        got = get_set(conn, set).await?;
    }
    Ok(got)
}

async fn get_set(conn: &Connection, set: &str) -> anyhow::Result<api::AttemptSet> {
    let request = api::GetAttemptSetRequest { attempt_set_id: set.to_string() };
    let response = conn.runs().get_attempt_set(request).await.map_err(status_error)?.into_inner();
    Ok(response.set.unwrap_or_default())
}

/// The attempts side by side while they run: on a terminal, one line each,
/// redrawn; otherwise a line whenever an attempt's state changes.
struct Board {
    format: OutputFormat,
    live: bool,
    drawn: usize,
    last_draw: Instant,
    rows: Vec<Row>,
}

struct Row {
    label: String,
    state: &'static str,
    last: String,
    tokens: u64,
}

impl Board {
    fn new(set: &api::AttemptSet, format: OutputFormat) -> Self {
        let rows = set
            .attempts
            .iter()
            .map(|a| Row {
                label: format!("#{} {} {}", a.attempt, a.harness, a.model).trim_end().to_string(),
                state: "starting",
                last: String::new(),
                tokens: 0,
            })
            .collect();
        let live = format == OutputFormat::Human && std::io::stderr().is_terminal();
        Self { format, live, drawn: 0, last_draw: Instant::now(), rows }
    }

    fn saw(&mut self, i: usize, chunk: &api::Chunk) {
        if self.format == OutputFormat::Json {
            return;
        }
        let Some(row) = self.rows.get_mut(i) else { return };
        let before = row.state;
        match chunk.r#type() {
            ChunkType::RunFinished => row.state = "completed",
            ChunkType::RunError if chunk.error_code == "CANCELLED" => row.state = "cancelled",
            ChunkType::RunError => row.state = "failed",
            _ => row.state = "running",
        }
        if let Some(u) = &chunk.usage {
            row.tokens = u.input_tokens + u.output_tokens;
        }
        let text = if chunk.delta.is_empty() { &chunk.content } else { &chunk.delta };
        if let Some(line) = text.lines().rev().find(|l| !l.trim().is_empty()) {
            row.last = line.trim().chars().take(60).collect();
        }
        if self.live {
            if self.last_draw.elapsed() >= Duration::from_millis(200) || row.state != before {
                self.draw();
            }
        } else if row.state != before {
            let row = &self.rows[i];
            eprintln!("{:<28} {}", row.label, row.state);
        }
    }

    fn draw(&mut self) {
        let mut err = std::io::stderr().lock();
        if self.drawn > 0 {
            let _ = write!(err, "\x1b[{}A", self.drawn);
        }
        for row in &self.rows {
            let tokens = if row.tokens > 0 { format!("{} tok", row.tokens) } else { String::new() };
            let _ = writeln!(err, "\x1b[2K{:<28} {:<10} {:>10}  {}", row.label, row.state, tokens, row.last);
        }
        self.drawn = self.rows.len();
        self.last_draw = Instant::now();
    }

    fn finish(&mut self) {
        if self.live {
            self.draw();
        }
    }
}

/// `attempts show`: a table, or one JSON object per attempt.
fn print_set(set: &api::AttemptSet, format: OutputFormat) {
    match format {
        OutputFormat::Json => set.attempts.iter().for_each(|a| json_line(&attempt_json(set, a))),
        OutputFormat::Human => {
            println!(
                "{:<3} {:<22} {:<12} {:<10} {:>5} {:>6} {:>6} {:>5} {:>8} {:>8}",
                "#", "RUN", "HARNESS", "STATUS", "FILES", "+LINES", "-LINES", "TEST", "TOKENS", "TIME"
            );
            for a in &set.attempts {
                let test = match (a.test_exit_code, a.evaluated) {
                    (Some(code), _) => code.to_string(),
                    (None, true) => "-".into(),
                    (None, false) => "…".into(),
                };
                let tokens = a.usage.as_ref().map_or(0, |u| u.input_tokens + u.output_tokens);
                let promoted = if a.run_id == set.promoted_run_id { "  promoted" } else { "" };
                println!(
                    "{:<3} {:<22} {:<12} {:<10} {:>5} {:>6} {:>6} {:>5} {:>8} {:>7.1}s{promoted}",
                    a.attempt,
                    a.run_id,
                    a.harness,
                    status_name(a.status()),
                    a.files_changed,
                    a.lines_added,
                    a.lines_removed,
                    test,
                    tokens,
                    a.duration_ms as f64 / 1000.0
                );
            }
        }
    }
}

/// One attempt under `--output json`.
fn attempt_json(set: &api::AttemptSet, a: &api::Attempt) -> Value {
    let files: BTreeMap<&str, &str> = a.files.iter().map(|f| (f.path.as_str(), f.change.as_str())).collect();
    let tokens = a.usage.as_ref().map_or(0, |u| u.input_tokens + u.output_tokens);
    json!({
        "attempt_set_id": set.attempt_set_id,
        "run_id": a.run_id,
        "attempt": a.attempt,
        "thread_id": a.thread_id,
        "harness": a.harness,
        "model": a.model,
        "status": status_name(a.status()),
        "evaluated": a.evaluated,
        "files_changed": a.files_changed,
        "lines_added": a.lines_added,
        "lines_removed": a.lines_removed,
        "files": files,
        "test_exit_code": a.test_exit_code,
        "test_output_tail": a.test_output_tail,
        "test_error": a.test_error,
        "tokens": tokens,
        "duration_ms": a.duration_ms,
        "checkpoint_id": a.checkpoint_id,
        "promoted": a.run_id == set.promoted_run_id,
        "error": a.error,
    })
}
