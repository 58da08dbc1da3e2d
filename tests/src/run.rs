//! RunService helpers: definitions, `command` runs, reading run streams,
//! and a lease holder of the tests' own.

use std::time::{Duration, Instant};

use shared::proto::v1 as api;

use crate::docker::TEST_IMAGE;
use crate::provider::Kind;
use crate::server::{Runs, Sandboxes};
use crate::wait::PATIENCE;

pub fn definition(id: &str, kind: Kind) -> api::SandboxDefinition {
    let provider = match kind {
        Kind::Local => api::provider_spec::Provider::Local(api::LocalProvider {}),
        Kind::Docker => api::provider_spec::Provider::Docker(api::DockerProvider {
            image: TEST_IMAGE.into(),
            ..Default::default()
        }),
    };
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec { provider: Some(provider) }),
        ..Default::default()
    }
}

pub async fn put_definition(sandboxes: &mut Sandboxes, def: api::SandboxDefinition) {
    sandboxes
        .put_definition(api::PutDefinitionRequest { definition: Some(def) })
        .await
        .expect("put definition");
}

/// A durable `command` run of `sh -c script`.
pub fn command_run(run_id: &str, thread: &str, definition: &str, script: &str) -> api::StartRunRequest {
    api::StartRunRequest {
        thread_id: thread.into(),
        run_id: run_id.into(),
        definition_id: definition.into(),
        harness: "command".into(),
        options: Some(api::HarnessOptions {
            command: vec!["sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        durable: true,
        ..Default::default()
    }
}

/// A shell loop printing `line 1` .. `line n`, pausing `pause` every
/// `every` lines.
pub fn numbered_lines(n: u32, every: u32, pause: &str) -> String {
    format!(
        "i=1; while [ $i -le {n} ]; do echo \"line $i\"; if [ $((i % {every})) -eq 0 ]; then sleep {pause}; fi; i=$((i+1)); done"
    )
}

/// What a client saw of a run: chunks with their offsets, in order.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub chunks: Vec<(String, api::Chunk)>,
}

impl Seen {
    pub fn last_offset(&self) -> Option<String> {
        self.chunks.last().map(|(o, _)| o.clone())
    }

    /// `N` of every text line `line N`, in the order seen.
    pub fn line_numbers(&self) -> Vec<u32> {
        self.chunks
            .iter()
            .filter(|(_, c)| c.r#type() == api::ChunkType::TextMessageContent)
            .filter_map(|(_, c)| c.delta.trim_end().strip_prefix("line ")?.parse().ok())
            .collect()
    }

    pub fn terminal(&self) -> Option<&api::Chunk> {
        self.chunks
            .iter()
            .map(|(_, c)| c)
            .find(|c| matches!(c.r#type(), api::ChunkType::RunFinished | api::ChunkType::RunError))
    }

    pub fn has_text(&self, needle: &str) -> bool {
        self.chunks.iter().any(|(_, c)| c.delta.contains(needle))
    }
}

/// Read a run stream until it ends, `stop` says so, or it fails. Returns
/// what was seen and whether the stream ended by itself.
pub async fn read_until(
    stream: &mut tonic::Streaming<api::RunEvent>,
    seen: &mut Seen,
    mut stop: impl FnMut(&Seen) -> bool,
) -> Result<bool, tonic::Status> {
    loop {
        let message = tokio::time::timeout(PATIENCE, stream.message()).await.expect("run stream stalled")?;
        let Some(event) = message else { return Ok(true) };
        if let Some(api::run_event::Event::Chunk(c)) = event.event {
            seen.chunks.push((c.offset, *c.chunk.expect("a chunk")));
            if stop(seen) {
                return Ok(false);
            }
        }
    }
}

/// The run's record once it is terminal (panics after [`PATIENCE`]).
pub async fn wait_terminal(runs: &mut Runs, run_id: &str) -> api::Run {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let run = runs
            .get_run(api::GetRunRequest { run_id: run_id.into() })
            .await
            .unwrap()
            .into_inner()
            .run
            .unwrap();
        if run.status != api::RunStatus::Running as i32 {
            return run;
        }
        assert!(Instant::now() < deadline, "run {run_id} stayed running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Attach to `run_id` right after the last chunk `seen` holds.
pub async fn attach_after(
    runs: &mut Runs,
    run_id: &str,
    seen: &Seen,
) -> Result<tonic::Streaming<api::RunEvent>, tonic::Status> {
    let request = api::AttachRunRequest {
        run_id: run_id.into(),
        after_offset: seen.last_offset().unwrap_or_default(),
        ..Default::default()
    };
    Ok(runs.attach_run(request).await?.into_inner())
}

/// Start a durable `command` run of `script` on thread `thread` and read
/// until it has printed `lines` numbered lines.
pub async fn start_and_read(
    runs: &mut Runs,
    run_id: &str,
    thread: &str,
    script: &str,
    lines: usize,
) -> (tonic::Streaming<api::RunEvent>, Seen) {
    let mut stream = runs.start_run(command_run(run_id, thread, "def", script)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.line_numbers().len() >= lines).await.unwrap();
    (stream, seen)
}

/// A lease holder of its own on the Redis lease store the servers share,
/// taking leases the way any replica does.
pub async fn lease_holder(redis_url: &str, ttl_ms: u64, renew_ms: u64) -> control_plane::lease::Leases {
    use control_plane::lease::{LeaseOptions, Leases, RedisLockStore};
    let store = RedisLockStore::connect(redis_url, Duration::from_millis(ttl_ms)).await.unwrap();
    let options = LeaseOptions {
        ttl: Duration::from_millis(ttl_ms),
        renew_every: Duration::from_millis(renew_ms),
        ..Default::default()
    };
    Leases::new(std::sync::Arc::new(store), options).unwrap()
}

/// Whether the lease `name` (e.g. `run:<id>`) is held by anyone in the
/// Redis lease store at `redis_url`, read without taking it.
pub async fn lease_held(redis_url: &str, name: &str) -> bool {
    let client = redis::Client::open(redis_url).expect("a redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connecting to redis");
    let key = format!("{}{name}", control_plane::lease::DEFAULT_NAMESPACE);
    redis::cmd("EXISTS").arg(&key).query_async::<bool>(&mut conn).await.expect("redis EXISTS")
}

/// Whether a local sandbox under `data_dir` holds the journal of `run_id`
/// with its exit recorded (`<run_id>.exit`, written after the exit
/// sentinel).
pub fn local_exit_recorded(data_dir: &std::path::Path, run_id: &str) -> bool {
    let Ok(sandboxes) = std::fs::read_dir(data_dir.join("sandboxes")) else { return false };
    let exit = format!("{run_id}.{}", shared::journal::EXIT_EXT);
    sandboxes.flatten().any(|s| s.path().join("journal").join(&exit).is_file())
}

/// The journal directory inside a Docker sandbox (the Docker provider's
/// `--journal-dir`).
pub const DOCKER_JOURNAL_DIR: &str = "/run/sandhold/journal";

/// As [`local_exit_recorded`], in the Docker sandbox `container`.
pub fn docker_exit_recorded(container: &str, run_id: &str) -> bool {
    let exit = format!("{DOCKER_JOURNAL_DIR}/{run_id}.{}", shared::journal::EXIT_EXT);
    std::process::Command::new("docker")
        .args(["exec", container, "test", "-f", &exit])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Start a durable `command` run of `script` and read its stream to the
/// end: everything it delivered.
pub async fn run_to_end(runs: &mut Runs, run_id: &str, thread: &str, definition: &str, script: &str) -> Seen {
    let mut stream =
        runs.start_run(command_run(run_id, thread, definition, script)).await.unwrap().into_inner();
    let mut seen = Seen::default();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap(), "the stream ended");
    seen
}

/// The name of the lease a replica drives `tenant`'s run `run` under (run
/// ids are per tenant, so the lease names both).
pub fn run_lease(tenant: &str, run: &str) -> String {
    use control_plane::store::{RunId, RunKey, Tenant};
    control_plane::runs::lease_name(&RunKey::new(Tenant::new(tenant), RunId::parse(run).expect("a run id")))
}
