//! The sandbox agent: the static binary every sandbox of the tests runs,
//! and an agent served in-process for the agent's own tests.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use sandbox_agent::AgentOptions;
use shared::secret::Secret;
use shared::transport::{Address, AuthedChannel, BearerToken, authed, connect};
use tokio::sync::oneshot;

use crate::local::TestDir;

/// The statically linked agent: `SANDHOLD_AGENT_STATIC_BIN`, else built by
/// `scripts/build-agent-static` once per test binary. Static so the same
/// binary serves the local provider and any container image.
pub fn static_agent() -> PathBuf {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("SANDHOLD_AGENT_STATIC_BIN") {
                return PathBuf::from(path);
            }
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-agent-static");
            let out =
                std::process::Command::new(&script).output().expect("running scripts/build-agent-static");
            assert!(
                out.status.success(),
                "build-agent-static failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        })
        .clone()
}

/// An agent served in-process on a real Unix socket in a temp dir, through
/// the real tonic stack, with authenticated client channels. Stopped by
/// [`TestAgent::stop`], or when dropped (its task is aborted, and what its
/// runs and shells left running is killed with its [`TestDir`]).
pub struct TestAgent {
    pub dir: TestDir,
    pub root: PathBuf,
    pub journal_dir: PathBuf,
    pub socket: PathBuf,
    pub token: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestAgent {
    pub async fn start() -> Self {
        let dir = TestDir::new("agent");
        let root = dir.path().join("root");
        let journal_dir = dir.path().join("journal");
        let socket = dir.path().join("agent.sock");
        let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
        let mut agent = Self { dir, root, journal_dir, socket, token, stop: None, task: None };
        agent.serve().await;
        agent.root = agent.root.canonicalize().unwrap();
        agent
    }

    /// Serve on this agent's directories and socket.
    async fn serve(&mut self) {
        let options = AgentOptions {
            listen: Address::Unix(self.socket.clone()),
            root: self.root.clone(),
            token: Secret::new(self.token.clone()),
            journal_dir: self.journal_dir.clone(),
            run_user: None,
            unconfined: false,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        self.task = Some(tokio::spawn(sandbox_agent::serve(options, async move {
            let _ = stopped.await;
        })));
        self.stop = Some(stop);
        let socket = &self.socket;
        let listening =
            crate::wait::eventually(Duration::from_secs(2), || std::future::ready(socket.exists())).await;
        assert!(listening, "agent did not start listening");
    }

    /// Stop this agent and start another on the same directories (what the
    /// journal dir keeps survives; what the agent held in memory does not).
    pub async fn restart(&mut self) {
        self.halt().await;
        self.serve().await;
    }

    async fn halt(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }

    /// A channel carrying this agent's token.
    pub async fn channel(&self) -> AuthedChannel {
        self.channel_with_token(&self.token).await
    }

    pub async fn channel_with_token(&self, token: &str) -> AuthedChannel {
        let ch = connect(&Address::Unix(self.socket.clone())).await.unwrap();
        authed(ch, BearerToken::new(token).unwrap())
    }

    /// A channel with no token at all.
    pub async fn raw_channel(&self) -> tonic::transport::Channel {
        connect(&Address::Unix(self.socket.clone())).await.unwrap()
    }

    pub async fn stop(mut self) {
        self.halt().await;
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
