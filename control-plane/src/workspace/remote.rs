//! The few file and process operations provisioning needs, over a sandbox's
//! agent. Every error message passes through the [`Masks`], so a secret
//! that reached a command's output or an agent's message never leaves.

use std::collections::HashMap;
use std::time::Duration;

use shared::proto::agent::v1 as agent;

use crate::agent::AgentClient;
use crate::provision::{Error, Masks};

/// How a process ended, with its captured output.
#[derive(Debug)]
pub(crate) struct Finished {
    /// The exit code; 128 + signal for a killed process.
    pub code: i32,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.code == 0 && !self.timed_out
    }
}

/// One sandbox, as provisioning sees it.
pub(crate) struct Remote<'a> {
    pub agent: &'a AgentClient,
    pub redactor: &'a Masks,
}

impl Remote<'_> {
    fn error(&self, what: &str, status: &tonic::Status) -> Error {
        Error::agent(what, status, self.redactor)
    }

    pub async fn exists(&self, path: &str) -> Result<bool, Error> {
        self.agent
            .fs()
            .exists(agent::ExistsRequest { path: path.to_string() })
            .await
            .map(|r| r.into_inner().exists)
            .map_err(|s| self.error(&format!("checking {path}"), &s))
    }

    /// The entry at `path` without following a final symlink; `None` when
    /// there is none.
    pub async fn lstat(&self, path: &str) -> Result<Option<agent::FileInfo>, Error> {
        match self.agent.fs().lstat(agent::StatRequest { path: path.to_string() }).await {
            Ok(r) => Ok(r.into_inner().info),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(self.error(&format!("inspecting {path}"), &s)),
        }
    }

    pub async fn read(&self, path: &str) -> Result<Option<Vec<u8>>, Error> {
        let what = format!("reading {path}");
        let mut stream = match self
            .agent
            .fs()
            .read_file(agent::ReadFileRequest { path: path.to_string(), ..Default::default() })
            .await
        {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(None),
            Err(s) => return Err(self.error(&what, &s)),
        };
        let mut data = Vec::new();
        loop {
            match stream.message().await {
                Ok(Some(chunk)) => data.extend_from_slice(&chunk.data),
                Ok(None) => return Ok(Some(data)),
                Err(s) if s.code() == tonic::Code::NotFound => return Ok(None),
                Err(s) => return Err(self.error(&what, &s)),
            }
        }
    }

    /// Write `data` to `path` (parents made), atomically.
    pub async fn write(&self, path: &str, data: &[u8], mode: Option<u32>) -> Result<(), Error> {
        let header = agent::WriteFileRequest {
            request: Some(agent::write_file_request::Request::Header(agent::WriteFileHeader {
                path: path.to_string(),
                mode,
                make_parents: true,
                size: Some(data.len() as u64),
                end_required: false,
            })),
        };
        let body = agent::WriteFileRequest {
            request: Some(agent::write_file_request::Request::Data(data.to_vec())),
        };
        self.agent
            .fs()
            .write_file(futures::stream::iter(vec![header, body]))
            .await
            .map(drop)
            .map_err(|s| self.error(&format!("writing {path}"), &s))
    }

    pub async fn remove(&self, path: &str) -> Result<(), Error> {
        match self.agent.fs().remove(agent::RemoveRequest { path: path.to_string(), recursive: true }).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(self.error(&format!("removing {path}"), &s)),
        }
    }

    pub async fn make_dir(&self, path: &str) -> Result<(), Error> {
        self.agent
            .fs()
            .make_dir(agent::MakeDirRequest { path: path.to_string(), parents: true })
            .await
            .map(drop)
            .map_err(|s| self.error(&format!("making {path}"), &s))
    }

    /// Entries under `path`, `depth` levels down (symlinks not followed).
    pub async fn list(&self, path: &str, depth: u32) -> Result<Vec<agent::FileInfo>, Error> {
        self.agent
            .fs()
            .list_dir(agent::ListDirRequest { path: path.to_string(), depth })
            .await
            .map(|r| r.into_inner().entries)
            .map_err(|s| self.error(&format!("listing {path}"), &s))
    }

    /// Run `argv` (no shell) in the sandbox root with `env` added. A program
    /// that cannot be started is an error; a non-zero exit is not.
    pub async fn run(
        &self,
        argv: &[String],
        env: HashMap<String, String>,
        timeout: Duration,
    ) -> Result<Finished, Error> {
        self.run_with_input(argv, env, Vec::new(), timeout).await
    }

    /// [`Remote::run`] with `stdin` written to the program.
    pub async fn run_with_input(
        &self,
        argv: &[String],
        env: HashMap<String, String>,
        stdin: Vec<u8>,
        timeout: Duration,
    ) -> Result<Finished, Error> {
        let program = argv.first().map(String::as_str).unwrap_or_default();
        let resp = self
            .agent
            .process()
            .exec(agent::ExecRequest {
                command: Some(agent::Command {
                    kind: Some(agent::command::Kind::Argv(agent::Argv { args: argv.to_vec() })),
                }),
                env,
                stdin,
                timeout_ms: Some(millis(timeout)),
                output_limit_bytes: Some(256 * 1024),
                ..Default::default()
            })
            .await
            .map_err(|s| self.error(&format!("running {program}"), &s))?
            .into_inner();
        Ok(finished(resp))
    }

    /// An authenticated git transfer, run by the agent as its own user
    /// (`ProcessService.Git`) for at most `timeout` a git command: the token
    /// never reaches a process of the run user. A request the agent refuses
    /// is an error (said to have happened while `doing`); git's own failure
    /// is not.
    pub async fn git(
        &self,
        mut req: agent::GitRequest,
        timeout: Duration,
        doing: &str,
    ) -> Result<Finished, Error> {
        req.timeout_ms = Some(millis(timeout));
        let resp = self.agent.process().git(req).await.map_err(|s| self.error(doing, &s))?.into_inner();
        Ok(finished(resp))
    }

    /// A symlink at `link` pointing to `target` (relative to the link's
    /// directory); where the sandbox cannot make one, a copy of what
    /// `target_from_root` names. Returns whether a symlink was made.
    pub async fn link_or_copy(
        &self,
        target: &str,
        link: &str,
        target_from_root: &str,
    ) -> Result<bool, Error> {
        self.remove(link).await?;
        if let Some(parent) = parent_of(link) {
            self.make_dir(parent).await?;
        }
        let ln = ["ln", "-s", "--", target, link].map(String::from);
        if let Ok(done) = self.run(&ln, HashMap::new(), Duration::from_secs(60)).await
            && done.ok()
            && self.lstat(link).await?.is_some_and(|i| i.r#type == agent::FileType::Symlink as i32)
        {
            return Ok(true);
        }
        let info = self
            .lstat(target_from_root)
            .await?
            .ok_or_else(|| Error::Vanished(format!("{target_from_root} vanished while linking {link}")))?;
        if info.r#type == agent::FileType::Directory as i32 {
            let cp = ["cp", "-R", "--", target_from_root, link].map(String::from);
            let done = self.run(&cp, HashMap::new(), Duration::from_secs(300)).await?;
            if !done.ok() {
                return Err(Error::LinkFailed(self.redactor.mask(&format!(
                    "could neither link nor copy {target_from_root} to {link}: {}",
                    String::from_utf8_lossy(&done.stderr).trim()
                ))));
            }
        } else {
            let data = self.read(target_from_root).await?.unwrap_or_default();
            self.write(link, &data, None).await?;
        }
        Ok(false)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How a process ended, from the agent's answer.
fn finished(resp: agent::ExecResponse) -> Finished {
    let code = match resp.status.and_then(|s| s.status) {
        Some(agent::exit_status::Status::Code(c)) => c,
        Some(agent::exit_status::Status::Signal(s)) => 128 + s,
        None => -1,
    };
    Finished { code, timed_out: resp.timed_out, stdout: resp.stdout, stderr: resp.stderr }
}

/// The directory part of a relative path, if any.
pub(crate) fn parent_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(dir, _)| dir).filter(|d| !d.is_empty())
}
