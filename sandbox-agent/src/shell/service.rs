//! `ShellService`: the tonic service over the sessions.

use std::time::Duration;

use shared::error::Error;
use shared::proto::agent::v1::{
    CloseShellRequest, CloseShellResponse, OpenShellRequest, OpenShellResponse, OutputChunk,
    RunInShellRequest, RunInShellResponse, RunParallelRequest, RunParallelResponse, ShellCommandExit,
    run_in_shell_response, run_parallel_response, shell_service_server::ShellService,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::session::{DEFAULT_COMMAND_TIMEOUT, ShellSession, ShellSessions, Sink, Tail, choose_shell};
use crate::child::{self, ChildEvent, RunningChild, spawn_error};
use crate::confine::{Root, resolve_cwd};
use crate::context::AgentContext;
use crate::isolation::Isolation;
use crate::run_user::RunUser;

pub struct Shells {
    root: Root,
    sessions: ShellSessions,
    run_user: Option<RunUser>,
    isolation: Isolation,
}

impl Shells {
    /// The open sessions belong to this service: nothing else reaches them.
    pub fn new(ctx: &AgentContext) -> Self {
        Self {
            root: ctx.root.clone(),
            sessions: ShellSessions::default(),
            run_user: ctx.run_user.clone(),
            isolation: ctx.isolation.clone(),
        }
    }
}

fn timeout_of(timeout_ms: Option<u64>) -> Duration {
    timeout_ms.filter(|ms| *ms > 0).map(Duration::from_millis).unwrap_or(DEFAULT_COMMAND_TIMEOUT)
}

/// Run one command of a parallel group to its end, streaming its output.
async fn drive_parallel(
    index: u32,
    mut running: RunningChild,
    timeout: Duration,
    tx: mpsc::Sender<Result<RunParallelResponse, Status>>,
) {
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let mut tail = Tail::default();
    loop {
        tokio::select! {
            event = running.next_event() => match event {
                Ok(ChildEvent::Output(stream, data)) => {
                    tail.push(&data);
                    let chunk = OutputChunk { stream: stream as i32, data: data.to_vec() };
                    let msg = RunParallelResponse { index, event: Some(run_parallel_response::Event::Output(chunk)) };
                    if tx.send(Ok(msg)).await.is_err() {
                        // Dropping `running` kills the group.
                        return;
                    }
                }
                Ok(ChildEvent::Finished(status)) => {
                    let exit = ShellCommandExit {
                        exit_code: child::shell_code(status),
                        timed_out,
                        output_tail: std::mem::take(&mut tail.0),
                        shell_exited: false,
                    };
                    let _ = tx.send(Ok(RunParallelResponse { index, event: Some(run_parallel_response::Event::Exit(exit)) })).await;
                    return;
                }
                Err(e) => {
                    running.kill_group();
                    let _ = tx.send(Err(Error::internal(format!("waiting for command {index}: {e}")).into())).await;
                    return;
                }
            },
            _ = tokio::time::sleep_until(deadline), if !timed_out => {
                timed_out = true;
                running.kill_group();
            }
            _ = tx.closed() => return,
        }
    }
}

#[tonic::async_trait]
impl ShellService for Shells {
    async fn open_shell(
        &self,
        req: Request<OpenShellRequest>,
    ) -> Result<Response<OpenShellResponse>, Status> {
        let req = req.into_inner();
        let program = choose_shell(&req.shell)?;
        child::validate_env(&req.env)?;
        let cwd = resolve_cwd(&self.root, &req.cwd)?;
        let session =
            ShellSession::open(program, &cwd, &req.env, self.run_user.as_ref(), &self.isolation).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        self.sessions.lock().insert(id.clone(), session);
        Ok(Response::new(OpenShellResponse { session_id: id }))
    }

    type RunInShellStream = ReceiverStream<Result<RunInShellResponse, Status>>;

    async fn run_in_shell(
        &self,
        req: Request<RunInShellRequest>,
    ) -> Result<Response<Self::RunInShellStream>, Status> {
        let req = req.into_inner();
        let session = self.sessions.get(&req.session_id)?;
        if req.command.contains('\0') {
            return Err(Error::invalid_field("command", "contains a NUL byte").into());
        }
        let timeout = timeout_of(req.timeout_ms);
        let (tx, rx) = mpsc::channel(32);
        let sessions = self.sessions.clone();
        tokio::spawn(async move {
            let mut sink = Sink::Client(tx.clone());
            let result = session.run(&req.command, timeout, req.end_shell_on_timeout, &mut sink).await;
            match result {
                Ok(exit) => {
                    if exit.shell_exited {
                        // Background jobs of a dead shell go with it.
                        sessions.close(&req.session_id);
                    }
                    let _ = tx
                        .send(Ok(RunInShellResponse {
                            event: Some(run_in_shell_response::Event::Exit(exit)),
                        }))
                        .await;
                }
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type RunParallelStream = ReceiverStream<Result<RunParallelResponse, Status>>;

    async fn run_parallel(
        &self,
        req: Request<RunParallelRequest>,
    ) -> Result<Response<Self::RunParallelStream>, Status> {
        let req = req.into_inner();
        let session = self.sessions.get(&req.session_id)?;
        if req.commands.is_empty() {
            return Err(Error::invalid_field("commands", "no commands").into());
        }
        if req.commands.iter().any(|c| c.contains('\0')) {
            return Err(Error::invalid_field("commands", "a command contains a NUL byte").into());
        }
        let (cwd, env) = match session.capture_state().await {
            Ok(state) => state,
            Err(e) => {
                if session.exit_code().is_some() {
                    self.sessions.close(&req.session_id);
                }
                return Err(e.into());
            }
        };
        let program = session.program.to_string_lossy().into_owned();
        let mut children = Vec::with_capacity(req.commands.len());
        for command in &req.commands {
            let mut cmd = child::command_with_exact_env(
                &program,
                &["-c".to_owned(), command.clone()],
                &cwd,
                &env,
                self.run_user.as_ref(),
                &self.isolation,
            )
            .map_err(|e| spawn_error(&program, e))?;
            cmd.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            // On an error the children already started are dropped, which
            // kills them.
            let spawned = tokio::process::Command::from(cmd).spawn().map_err(|e| spawn_error(&program, e))?;
            children.push(RunningChild::new(spawned, true).map_err(|e| Error::internal(e.to_string()))?);
        }
        let timeout = timeout_of(req.timeout_ms);
        let (tx, rx) = mpsc::channel(32);
        for (index, running) in children.into_iter().enumerate() {
            tokio::spawn(drive_parallel(index as u32, running, timeout, tx.clone()));
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn close_shell(
        &self,
        req: Request<CloseShellRequest>,
    ) -> Result<Response<CloseShellResponse>, Status> {
        let id = req.into_inner().session_id;
        if !self.sessions.close(&id) {
            return Err(Error::not_found(format!("no shell session {id:?}")).into());
        }
        Ok(Response::new(CloseShellResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use shared::proto::agent::v1::shell_service_client::ShellServiceClient;
    use shared::proto::agent::v1::shell_service_server::ShellServiceServer;
    use tonic::transport::{Channel, Server};

    use super::*;
    use crate::testing;

    /// Stdout of one command, and its exit.
    async fn run(
        client: &mut ShellServiceClient<Channel>,
        id: &str,
        command: &str,
    ) -> (Vec<u8>, ShellCommandExit) {
        let req = RunInShellRequest { session_id: id.into(), command: command.into(), ..Default::default() };
        let mut events = client.run_in_shell(req).await.unwrap().into_inner();
        let mut stdout = Vec::new();
        while let Some(msg) = events.message().await.unwrap() {
            match msg.event {
                Some(run_in_shell_response::Event::Output(chunk))
                    if chunk.stream == shared::proto::agent::v1::OutputStream::Stdout as i32 =>
                {
                    stdout.extend_from_slice(&chunk.data);
                }
                Some(run_in_shell_response::Event::Exit(exit)) => return (stdout, exit),
                _ => {}
            }
        }
        panic!("no exit for {command:?}");
    }

    #[tokio::test]
    async fn a_session_keeps_its_state_between_commands_through_the_real_stack() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = testing::context(dir.path());
        std::fs::create_dir_all(dir.path().join("root/sub")).unwrap();
        let channel =
            testing::channel(Server::builder().add_service(ShellServiceServer::new(Shells::new(&ctx)))).await;
        let mut client = ShellServiceClient::new(channel);
        let id = client.open_shell(OpenShellRequest::default()).await.unwrap().into_inner().session_id;

        let (_, exit) = run(&mut client, &id, "cd sub && export GREETING=hi").await;
        assert_eq!((exit.exit_code, exit.shell_exited), (0, false));
        let (out, exit) =
            run(&mut client, &id, "printf '%s %s' \"$GREETING\" \"${PWD##*/}\"; (exit 3)").await;
        assert_eq!(out, b"hi sub");
        assert_eq!(exit.exit_code, 3);

        client.close_shell(CloseShellRequest { session_id: id.clone() }).await.unwrap();
        let err = client.close_shell(CloseShellRequest { session_id: id }).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
    }
}
