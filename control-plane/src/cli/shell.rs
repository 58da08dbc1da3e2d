//! `sandhold shell SANDBOX [-- CMD]`: an interactive terminal in a live
//! sandbox through `OpenTerminal`. The local terminal is put in raw mode
//! (every key goes to the sandbox, Ctrl-C included), its size follows
//! SIGWINCH, and it is restored however the command ends; the CLI exits
//! with the command's code.

use std::os::fd::AsFd;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use nix::sys::termios::{self, SetArg, Termios};
use shared::proto::v1 as api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::output::{process_exit_code, status_error};
use super::run::{secret_values, with_connection};
use super::sandboxes::ProcessArgs;

#[derive(Debug, Clone, Args)]
pub struct ShellArgs {
    #[command(flatten)]
    pub process: ProcessArgs,
    /// The program and its arguments. Default: the run user's login shell.
    #[arg(last = true, value_name = "CMD", help_heading = None::<&str>)]
    pub command: Vec<String>,
}

/// The local terminal in raw mode while this lives; its settings come
/// back on drop (an error, a panic unwinding, the normal end).
struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Raw mode on stdin, or `None` when stdin is not a terminal.
    fn enter() -> Option<Self> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSAFLUSH, &raw).ok()?;
        Some(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSAFLUSH, &self.saved);
    }
}

/// The local terminal's size (rows, columns), if stdout or stdin is one.
fn local_size() -> Option<api::TerminalSize> {
    for fd in [nix::libc::STDOUT_FILENO, nix::libc::STDIN_FILENO] {
        let mut size = nix::libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCGWINSZ writes one `winsize` to the pointer, which is
        // valid for the call.
        let rc = unsafe { nix::libc::ioctl(fd, nix::libc::TIOCGWINSZ, &mut size) };
        if rc == 0 && size.ws_row > 0 && size.ws_col > 0 {
            return Some(api::TerminalSize { rows: u32::from(size.ws_row), cols: u32::from(size.ws_col) });
        }
    }
    None
}

pub async fn shell(args: ShellArgs) -> ExitCode {
    let (args, command) = (args.process, args.command);
    let client = args.client.clone();
    with_connection(&client, async move |conn| {
        let secrets = secret_values(&args.secrets)?;
        let command = (!command.is_empty()).then(|| api::Command {
            kind: Some(api::command::Kind::Argv(api::Argv { args: command.clone() })),
        });
        let start = api::OpenTerminalStart {
            sandbox_id: args.target.resolve(conn).await?,
            command,
            cwd: args.cwd.clone().unwrap_or_default(),
            env: Default::default(),
            secrets,
            size: local_size(),
            term: std::env::var("TERM").unwrap_or_default(),
        };
        let (tx, rx) = mpsc::channel(64);
        tx.send(api::OpenTerminalRequest {
            request: Some(api::open_terminal_request::Request::Start(start)),
        })
        .await?;
        let mut responses =
            conn.sandboxes().open_terminal(ReceiverStream::new(rx)).await.map_err(status_error)?.into_inner();
        // Only once the terminal is there: an error before it prints on a
        // terminal in its normal mode.
        let raw = RawMode::enter();
        let input = tokio::spawn(forward_input(tx));
        let mut stdout = tokio::io::stdout();
        let result = async {
            while let Some(response) = responses.next().await {
                match response.map_err(status_error)?.event {
                    Some(api::open_terminal_response::Event::Output(data)) => {
                        stdout.write_all(&data).await?;
                        stdout.flush().await?;
                    }
                    Some(api::open_terminal_response::Event::Exited(status)) => {
                        return Ok(process_exit_code(status.status));
                    }
                    _ => {}
                }
            }
            bail!("the server ended the terminal before its command exited")
        }
        .await;
        input.abort();
        drop(raw);
        result
    })
    .await
}

/// Send what is typed, and the local terminal's new size on each SIGWINCH.
/// At the end of local input (not a terminal: a pipe or a file) nothing
/// more is sent; the command ends on its own.
async fn forward_input(tx: mpsc::Sender<api::OpenTerminalRequest>) {
    use api::open_terminal_request::Request;
    let mut resized = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 4096];
    let mut input_open = true;
    loop {
        let request = tokio::select! {
            n = stdin.read(&mut buf), if input_open => match n {
                Ok(0) | Err(_) => {
                    input_open = false;
                    continue;
                }
                Ok(n) => Request::Input(buf[..n].to_vec()),
            },
            Some(()) = async { match resized.as_mut() { Some(s) => s.recv().await, None => None } } => {
                match local_size() {
                    Some(size) => Request::Resize(size),
                    None => continue,
                }
            }
            else => {
                // Nothing left to send; the request stream stays open (its
                // end would end the call).
                std::future::pending::<()>().await;
                continue;
            }
        };
        if tx.send(api::OpenTerminalRequest { request: Some(request) }).await.is_err() {
            return;
        }
    }
}
