//! Processes in a live sandbox, run by its agent: `Exec` to completion and
//! `ExecStream` with stdin, signals and output both ways. Each runs with
//! the secrets of the sandbox's last ensure, then the call's plain env,
//! then the call's secrets.

use std::collections::{BTreeMap, HashMap};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::ensure::secrets_of;
use super::lifecycle::Live;
use super::sandboxes::Optional;
use super::{Error, Sandboxes};
use crate::provision::{InvalidField, valid_env_name};
use crate::store::Tenant;

/// How long an `Exec` without a `timeout_ms` may run: an hour, then it is
/// killed and answers `timed_out`.
pub const EXEC_TIMEOUT_DEFAULT_MS: u64 = 60 * 60 * 1000;

/// What an `ExecStream` answers: the pid, output, then the exit.
pub type ExecEvents = BoxStream<'static, Result<api::ExecStreamResponse, Error>>;
/// What an `OpenTerminal` answers: the pid, the terminal's output, then
/// the exit.
pub type TerminalEvents = BoxStream<'static, Result<api::OpenTerminalResponse, Error>>;

/// A terminal's command when the caller names none: the run user's login
/// shell, bash where the image has it.
const LOGIN_SHELL: &str = r#"exec "$(command -v bash || echo /bin/sh)" -l"#;
/// $TERM when the caller sets none.
const DEFAULT_TERM: &str = "xterm-256color";

impl Sandboxes {
    /// Run a command in the tenant's sandbox to completion.
    pub async fn exec(&self, tenant: &Tenant, req: api::ExecRequest) -> Result<api::ExecResponse, Error> {
        if req.output_limit_bytes.is_some_and(|n| n > shared::limits::MAX_EXEC_OUTPUT) {
            let max = shared::limits::MAX_EXEC_OUTPUT;
            return Err(
                InvalidField::new("output_limit_bytes", format!("at most {max} bytes per stream")).into()
            );
        }
        let live = self.live(tenant, &req.sandbox_id).await?;
        let command = agent_command(req.command)?;
        let env = process_env(live.process_secrets(), &live.env, req.env, req.secrets)?;
        let resp = live
            .agent
            .process()
            .exec(agent::ExecRequest {
                command: Some(command),
                cwd: req.cwd,
                env,
                stdin: req.stdin,
                // Unary: never unbounded (see the server's deadlines).
                timeout_ms: Some(req.timeout_ms.filter(|ms| *ms > 0).unwrap_or(EXEC_TIMEOUT_DEFAULT_MS)),
                output_limit_bytes: req.output_limit_bytes,
                // The caller passed the values: its own output is its own.
                mask_secrets: false,
            })
            .await?
            .into_inner();
        Ok(api::ExecResponse {
            status: exit_status(resp.status),
            stdout: resp.stdout,
            stderr: resp.stderr,
            stdout_truncated: resp.stdout_truncated,
            stderr_truncated: resp.stderr_truncated,
            timed_out: resp.timed_out,
            duration_ms: resp.duration_ms,
        })
    }

    /// Start the process `inbound` begins with (`start`) and forward the
    /// rest of it (stdin, close, signals) until the caller's stream ends,
    /// the process's does, or the server shuts down.
    pub async fn exec_stream<S>(&self, tenant: &Tenant, mut inbound: S) -> Result<ExecEvents, Error>
    where
        S: Stream<Item = Result<api::ExecStreamRequest, Status>> + Send + Unpin + 'static,
    {
        let first = inbound.next().await.transpose()?.and_then(|m| m.request);
        let Some(api::exec_stream_request::Request::Start(start)) = first else {
            return Err(InvalidField::new("start", "the first message must be `start`").into());
        };
        let live = self.live(tenant, &start.sandbox_id).await?;
        let command = agent_command(start.command)?;
        let env = process_env(live.process_secrets(), &live.env, start.env, start.secrets)?;
        let start =
            agent::SpawnStart { command: Some(command), cwd: start.cwd, env, detached: false, pty: None };
        let outbound = self.spawn(&live, start, inbound, |message: api::ExecStreamRequest| {
            message.request.and_then(spawn_request)
        });
        let mapped = outbound.await?.map(|item| {
            let event = item?.map(|e| match e {
                agent::spawn_response::Event::Started(s) => {
                    api::exec_stream_response::Event::StartedPid(s.pid)
                }
                agent::spawn_response::Event::Output(o) => {
                    api::exec_stream_response::Event::Output(api::OutputChunk {
                        stream: o.stream,
                        data: o.data,
                    })
                }
                agent::spawn_response::Event::Exited(x) => {
                    api::exec_stream_response::Event::Exited(exit_status(Some(x)).unwrap_or_default())
                }
            });
            Ok(api::ExecStreamResponse { event })
        });
        Ok(Box::pin(mapped))
    }

    /// Start the terminal `inbound` begins with (`start`) and forward the
    /// rest of it (typed bytes, resizes, signals) until the caller's
    /// stream ends (which kills the terminal's command), the command's
    /// does, or the server shuts down.
    pub async fn open_terminal<S>(&self, tenant: &Tenant, mut inbound: S) -> Result<TerminalEvents, Error>
    where
        S: Stream<Item = Result<api::OpenTerminalRequest, Status>> + Send + Unpin + 'static,
    {
        let first = inbound.next().await.transpose()?.and_then(|m| m.request);
        let Some(api::open_terminal_request::Request::Start(start)) = first else {
            return Err(InvalidField::new("start", "the first message must be `start`").into());
        };
        let size = start.size.unwrap_or(api::TerminalSize { rows: 24, cols: 80 });
        let size = terminal_size(size, "start.size")?;
        let live = self.live_for(tenant, &start.sandbox_id, Optional::Terminal).await?;
        let command = match start.command {
            None => agent::Command { kind: Some(agent::command::Kind::Shell(LOGIN_SHELL.into())) },
            given => agent_command(given)?,
        };
        let mut env = process_env(live.process_secrets(), &live.env, start.env, start.secrets)?;
        let term = if start.term.is_empty() { DEFAULT_TERM.to_string() } else { start.term };
        env.insert("TERM".into(), term);
        let start = agent::SpawnStart {
            command: Some(command),
            cwd: start.cwd,
            env,
            detached: false,
            pty: Some(size),
        };
        let outbound = self.spawn(&live, start, inbound, |message: api::OpenTerminalRequest| {
            use agent::spawn_request::Request;
            match message.request? {
                api::open_terminal_request::Request::Input(data) => Some(Request::Stdin(data)),
                api::open_terminal_request::Request::Resize(size) => {
                    // The agent refuses (and logs) a bad size; it is never fatal.
                    Some(Request::Resize(agent::TerminalSize { rows: size.rows, cols: size.cols }))
                }
                api::open_terminal_request::Request::Signal(n) => Some(Request::Signal(n)),
                api::open_terminal_request::Request::Start(_) => None,
            }
        });
        let mapped = outbound.await?.map(|item| {
            let event = item?.map(|e| match e {
                agent::spawn_response::Event::Started(s) => {
                    api::open_terminal_response::Event::StartedPid(s.pid)
                }
                agent::spawn_response::Event::Output(o) => api::open_terminal_response::Event::Output(o.data),
                agent::spawn_response::Event::Exited(x) => {
                    api::open_terminal_response::Event::Exited(exit_status(Some(x)).unwrap_or_default())
                }
            });
            Ok(api::OpenTerminalResponse { event })
        });
        Ok(Box::pin(mapped))
    }

    /// Spawn `start` through the live sandbox's agent and forward the
    /// caller's later messages, as `to_agent` maps them, to it. Answers the
    /// agent's events.
    async fn spawn<T, S>(
        &self,
        live: &Live,
        start: agent::SpawnStart,
        inbound: S,
        to_agent: impl Fn(T) -> Option<agent::spawn_request::Request> + Send + 'static,
    ) -> Result<BoxStream<'static, Result<Option<agent::spawn_response::Event>, Error>>, Error>
    where
        T: Send + 'static,
        S: Stream<Item = Result<T, Status>> + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel::<agent::SpawnRequest>(16);
        let start = agent::SpawnRequest { request: Some(agent::spawn_request::Request::Start(start)) };
        tx.send(start).await.map_err(|_| Error::Closed("process stream closed before start"))?;
        // Held by the response stream: a client that half-closes its side
        // after `start` must not end the agent's request stream (and with it
        // the process) while output is still flowing.
        let hold_open = tx.clone();
        self.forward(inbound, tx, move |message: T| {
            Some(agent::SpawnRequest { request: Some(to_agent(message)?) })
        });
        let outbound = live.agent.process().spawn(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Box::pin(outbound.map(move |item| {
            let _ = &hold_open;
            Ok(item?.event)
        })))
    }
}

/// A terminal's size as the agent takes it, refused when a side is 0.
fn terminal_size(size: api::TerminalSize, field: &str) -> Result<agent::TerminalSize, Error> {
    if size.rows == 0 || size.cols == 0 || size.rows > u32::from(u16::MAX) || size.cols > u32::from(u16::MAX)
    {
        let message = format!("{} rows x {} columns: each must be 1-65535", size.rows, size.cols);
        return Err(InvalidField::new(field, message).into());
    }
    Ok(agent::TerminalSize { rows: size.rows, cols: size.cols })
}

/// What a caller's message after `start` asks of the agent (`None` for a
/// second `start`, or nothing).
fn spawn_request(request: api::exec_stream_request::Request) -> Option<agent::spawn_request::Request> {
    match request {
        api::exec_stream_request::Request::Stdin(data) => Some(agent::spawn_request::Request::Stdin(data)),
        api::exec_stream_request::Request::CloseStdin(_) => {
            Some(agent::spawn_request::Request::CloseStdin(agent::CloseStdin {}))
        }
        api::exec_stream_request::Request::Signal(n) => Some(agent::spawn_request::Request::Signal(n)),
        api::exec_stream_request::Request::Start(_) => None,
    }
}

/// The environment of a process: the sandbox's `SetEnv` variables
/// (`sandbox`), the ensure's secrets (`ensured`), then the call's plain
/// env, then the call's secrets.
fn process_env<'a>(
    ensured: impl Iterator<Item = (&'a String, &'a shared::secret::Secret)>,
    sandbox: &BTreeMap<String, String>,
    env: HashMap<String, String>,
    secrets: HashMap<String, String>,
) -> Result<HashMap<String, String>, Error> {
    let mut out: HashMap<String, String> = sandbox.clone().into_iter().collect();
    out.extend(ensured.map(|(k, v)| (k.clone(), v.expose().to_string())));
    for (k, v) in env {
        if !valid_env_name(&k) {
            return Err(InvalidField::new(format!("env[{k}]"), "not a valid variable name").into());
        }
        out.insert(k, v);
    }
    for (k, v) in secrets_of("secrets", secrets)? {
        out.insert(k, v.expose().to_string());
    }
    Ok(out)
}

fn agent_command(command: Option<api::Command>) -> Result<agent::Command, Error> {
    let kind = match command.and_then(|c| c.kind) {
        Some(api::command::Kind::Argv(a)) if !a.args.is_empty() => {
            agent::command::Kind::Argv(agent::Argv { args: a.args })
        }
        Some(api::command::Kind::Shell(s)) if !s.is_empty() => agent::command::Kind::Shell(s),
        _ => return Err(InvalidField::new("command", "required: a non-empty argv or shell string").into()),
    };
    Ok(agent::Command { kind: Some(kind) })
}

fn exit_status(s: Option<agent::ExitStatus>) -> Option<api::ExitStatus> {
    let status = s?.status.map(|s| match s {
        agent::exit_status::Status::Code(c) => api::exit_status::Status::Code(c),
        agent::exit_status::Status::Signal(n) => api::exit_status::Status::Signal(n),
    });
    Some(api::ExitStatus { status })
}

#[cfg(test)]
mod tests {
    use shared::secret::Secret;

    use crate::provision::Secrets;

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn refused_field(e: Error) -> String {
        match e {
            Error::InvalidField(e) => e.field,
            other => panic!("not a field error: {other:?}"),
        }
    }

    #[test]
    fn the_call_overrides_the_ensure_and_its_secrets_override_its_env() {
        let ensured = Secrets::from([
            ("TOKEN".to_string(), Secret::new("from-ensure")),
            ("KEEP".to_string(), Secret::new("kept")),
        ]);
        let sandbox = BTreeMap::from([
            ("STAGE".to_string(), "from-set-env".to_string()),
            ("MODE".to_string(), "from-set-env".to_string()),
        ]);
        let env = process_env(
            ensured.iter(),
            &sandbox,
            map(&[("TOKEN", "from-env"), ("MODE", "plain")]),
            map(&[("MODE", "from-secrets-1")]),
        )
        .unwrap();
        assert_eq!(
            env,
            map(&[
                ("TOKEN", "from-env"),
                ("KEEP", "kept"),
                ("MODE", "from-secrets-1"),
                ("STAGE", "from-set-env")
            ])
        );
    }

    #[test]
    fn invalid_variable_names_are_refused_by_field() {
        let bad_env =
            process_env(Secrets::new().iter(), &BTreeMap::new(), map(&[("1X", "v")]), HashMap::new())
                .unwrap_err();
        assert_eq!(refused_field(bad_env), "env[1X]");
        let bad_secret =
            process_env(Secrets::new().iter(), &BTreeMap::new(), HashMap::new(), map(&[("a-b", "v")]))
                .unwrap_err();
        assert_eq!(refused_field(bad_secret), "secrets[a-b]");
    }

    #[test]
    fn a_command_is_a_non_empty_argv_or_shell_string() {
        let argv = |args: &[&str]| {
            Some(api::Command {
                kind: Some(api::command::Kind::Argv(api::Argv {
                    args: args.iter().map(|a| a.to_string()).collect(),
                })),
            })
        };
        let shell = |s: &str| Some(api::Command { kind: Some(api::command::Kind::Shell(s.into())) });
        assert_eq!(
            agent_command(argv(&["ls", "-l"])).unwrap().kind,
            Some(agent::command::Kind::Argv(agent::Argv { args: vec!["ls".into(), "-l".into()] }))
        );
        assert_eq!(
            agent_command(shell("echo hi")).unwrap().kind,
            Some(agent::command::Kind::Shell("echo hi".into()))
        );
        for empty in [None, argv(&[]), shell(""), Some(api::Command { kind: None })] {
            assert_eq!(refused_field(agent_command(empty).unwrap_err()), "command");
        }
    }

    #[test]
    fn exit_statuses_keep_codes_and_signals() {
        let code = agent::ExitStatus { status: Some(agent::exit_status::Status::Code(3)) };
        assert_eq!(exit_status(Some(code)).unwrap().status, Some(api::exit_status::Status::Code(3)));
        let signal = agent::ExitStatus { status: Some(agent::exit_status::Status::Signal(9)) };
        assert_eq!(exit_status(Some(signal)).unwrap().status, Some(api::exit_status::Status::Signal(9)));
        assert_eq!(exit_status(None), None);
    }
}
