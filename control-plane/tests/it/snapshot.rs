//! `SnapshotService` and the lifecycle's restore over a real server: a
//! workspace captured in a Docker sandbox comes back byte for byte (minus
//! exclusions, secrets zeroed) in a local one; forks copy the chosen
//! checkpoint into empty threads only, with the conversation (runs and
//! their event logs) up to it; two saves racing on one thread: one wins,
//! the other is fenced; another tenant sees nothing; a restore into a new
//! sandbox removes what provisioning brought back and the checkpoint lacks,
//! and leaves excluded paths as provisioning made them. Blobs are per
//! tenant: another tenant's identical bytes are uploaded again (no de-dup
//! oracle), and a fake agent claiming another tenant's hash gets nothing of
//! theirs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane::agent::AgentClient;
use control_plane::snapshot::{self, SaveRequest, Snapshots as SnapshotOps};
use control_plane::store::{self, BlobKey, Stores, Tenant};

use sandhold_tests::auth::{Bearer, bearer};
use sandhold_tests::docker::{DockerCleanup, TEST_IMAGE, ensure_test_image};
use sandhold_tests::fleet::{Place, served};
use sandhold_tests::run::{command_run, put_definition, wait_terminal};
use sandhold_tests::server::{Runs, Sandboxes};
use sandhold_tests::under_each_runtime;
use sandhold_tests::wait::PATIENCE;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1 as agent;
use shared::proto::agent::v1::info_service_server::{InfoService, InfoServiceServer};
use shared::proto::agent::v1::snapshot_service_server::{SnapshotService, SnapshotServiceServer};
use shared::proto::v1 as api;
use shared::proto::v1::run_service_client::RunServiceClient;
use shared::proto::v1::snapshot_service_client::SnapshotServiceClient;
use shared::secret::Secret;
use shared::transport::Address;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const SECRET: &str = "sk-test-5f1e0c9a7b3d";

type Snapshots = SnapshotServiceClient<InterceptedService<Channel, Bearer>>;

/// The `SandboxService` test server, with `SnapshotService` and
/// `RunService` clients of both tenants beside its `SandboxService` ones.
struct Harness {
    inner: sandhold_tests::server::Harness,
    acme: Snapshots,
    other: Snapshots,
    runs: Runs,
    other_runs: Runs,
}

impl Harness {
    async fn start() -> Self {
        let inner = sandhold_tests::server::Harness::start().await;
        let addr = inner.server.as_ref().unwrap().local_addr();
        let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let (a, b) = (bearer(&format!("tok-a-{}", inner.nonce)), bearer(&format!("tok-b-{}", inner.nonce)));
        let acme = SnapshotServiceClient::with_interceptor(channel.clone(), a.clone());
        let other = SnapshotServiceClient::with_interceptor(channel.clone(), b.clone());
        let runs = RunServiceClient::with_interceptor(channel.clone(), a);
        let other_runs = RunServiceClient::with_interceptor(channel.clone(), b);
        Self { inner, acme, other, runs, other_runs }
    }

    async fn stop(&mut self) {
        self.inner.stop().await;
    }

    async fn define(&mut self, id: &str, provider: api::provider_spec::Provider) {
        self.define_with_setup(id, provider, None).await;
    }

    /// With `setup`, every new sandbox runs it (before any restore).
    async fn define_with_setup(
        &mut self,
        id: &str,
        provider: api::provider_spec::Provider,
        setup: Option<&str>,
    ) {
        let definition = snapshot_definition(id, provider, setup);
        self.inner
            .acme
            .put_definition(api::PutDefinitionRequest { definition: Some(definition) })
            .await
            .unwrap();
    }

    async fn ensure(&mut self, definition: &str, thread: &str) -> api::EnsureReady {
        let req = api::EnsureSandboxRequest {
            definition_id: definition.into(),
            thread_id: thread.into(),
            secrets: [("API_TOKEN".to_string(), SECRET.to_string())].into(),
            run_id: String::new(),
        };
        sandhold_tests::sandbox::ensure(&mut self.inner.acme, req).await.1.unwrap()
    }

    async fn sh(&mut self, sandbox: &str, script: &str) -> String {
        let (code, out) = sandhold_tests::sandbox::sh(&mut self.inner.acme, sandbox, script).await;
        assert_eq!(code, 0, "{script}: {out}");
        out
    }

    async fn save(&mut self, thread: &str, label: &str) -> Result<api::Checkpoint, Error> {
        save(&mut self.acme, thread, label).await
    }

    /// Fork `thread`'s `checkpoint` into `new_thread`.
    async fn fork(&mut self, thread: &str, checkpoint: &str, new_thread: &str) {
        let req = api::ForkSnapshotRequest {
            thread_id: thread.into(),
            checkpoint_id: checkpoint.into(),
            new_thread_id: new_thread.into(),
        };
        self.acme.fork_snapshot(req).await.unwrap();
    }

    /// A durable `command` run of `sh -c script` on `thread`, read to its
    /// end; returns the chunks it streamed, with their offsets.
    async fn run(&mut self, thread: &str, run_id: &str, script: &str) -> Vec<(String, api::Chunk)> {
        let mut req = command_run(run_id, thread, "local", script);
        req.secrets = [("API_TOKEN".to_string(), SECRET.to_string())].into();
        let stream = self.runs.start_run(req).await.unwrap().into_inner();
        let chunks = read_chunks(stream).await;
        let record = wait_terminal(&mut self.runs, run_id).await;
        assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
        chunks
    }

    /// The checkpoint saved after run `run_id` of `thread`, once it is there.
    async fn checkpoint_after(&mut self, thread: &str, run_id: &str) -> api::Checkpoint {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(c) = self.list(thread).await.into_iter().find(|c| c.run_id == run_id) {
                return c;
            }
            assert!(Instant::now() < deadline, "no checkpoint after run {run_id}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Everything AttachRun replays of a run (it ends: the run is terminal).
    async fn attach(&mut self, run_id: &str) -> Vec<(String, api::Chunk)> {
        let req = api::AttachRunRequest { run_id: run_id.into(), ..Default::default() };
        read_chunks(self.runs.attach_run(req).await.unwrap().into_inner()).await
    }

    async fn artifact(&mut self, thread: &str, checkpoint: &str, path: &str) -> Result<Vec<u8>, Error> {
        read_artifact(&mut self.acme, thread, checkpoint, path).await
    }

    async fn list(&mut self, thread: &str) -> Vec<api::Checkpoint> {
        self.acme
            .list_snapshots(api::ListSnapshotsRequest { thread_id: thread.into() })
            .await
            .unwrap()
            .into_inner()
            .checkpoints
    }

    /// Every byte the blob store holds (the directory under the data dir).
    fn blob_store_bytes(&self) -> Vec<u8> {
        fn walk(dir: &std::path::Path, out: &mut Vec<u8>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() { walk(&p, out) } else { out.extend(std::fs::read(&p).unwrap()) }
            }
        }
        let mut out = Vec::new();
        walk(&self.inner.dir.path().join("snapshot-blobs"), &mut out);
        out
    }
}

/// A definition with portable snapshots on; with `setup`, every new
/// sandbox runs it (before any restore).
fn snapshot_definition(
    id: &str,
    provider: api::provider_spec::Provider,
    setup: Option<&str>,
) -> api::SandboxDefinition {
    let workspace = setup.map(|setup| api::WorkspaceDefinition {
        setup: vec![api::SetupStep { step: Some(api::setup_step::Step::Serial(setup.into())) }],
        ..Default::default()
    });
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(api::ProviderSpec { provider: Some(provider) }),
        secret_names: vec!["API_TOKEN".into()],
        workspace,
        lifecycle: Some(api::Lifecycle {
            portable_snapshots: Some(api::PortableSnapshots { enabled: true, ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn save(c: &mut Snapshots, thread: &str, label: &str) -> Result<api::Checkpoint, Error> {
    save_status(c, thread, label).await.map_err(|s| Error::from_status(&s))
}

async fn save_status(c: &mut Snapshots, thread: &str, label: &str) -> Result<api::Checkpoint, tonic::Status> {
    c.save_snapshot(api::SaveSnapshotRequest {
        thread_id: thread.into(),
        run_id: format!("run-{label}"),
        label: label.into(),
        sandbox_id: String::new(),
    })
    .await
    .map(|r| r.into_inner().checkpoint.unwrap())
}

/// The chunks of a run stream, with their offsets, until it ends.
async fn read_chunks(mut stream: tonic::Streaming<api::RunEvent>) -> Vec<(String, api::Chunk)> {
    let mut out = Vec::new();
    loop {
        let message =
            tokio::time::timeout(PATIENCE, stream.message()).await.expect("run stream stalled").unwrap();
        let Some(event) = message else { return out };
        if let Some(api::run_event::Event::Chunk(c)) = event.event {
            out.push((c.offset, *c.chunk.unwrap()));
        }
    }
}

async fn read_artifact(
    c: &mut Snapshots,
    thread: &str,
    checkpoint: &str,
    path: &str,
) -> Result<Vec<u8>, Error> {
    let req = api::ReadArtifactRequest {
        thread_id: thread.into(),
        checkpoint_id: checkpoint.into(),
        path: path.into(),
    };
    let mut stream = c.read_artifact(req).await.map_err(|s| Error::from_status(&s))?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await.map_err(|s| Error::from_status(&s))? {
        out.extend(m.data);
    }
    Ok(out)
}

/// `sha256sum` of every file and every directory, sorted, by path.
const TREE: &str = "find . -type d | sort | sed 's/^/dir /'; find . -type f | sort | while read -r f; do \
                    printf 'file %s ' \"$f\"; sha256sum < \"$f\" | cut -d' ' -f1; done";

fn tree_lines(listing: &str) -> BTreeMap<String, String> {
    listing
        .lines()
        .map(|l| {
            let (kind, rest) = l.split_once(' ').unwrap();
            let (path, hash) = rest.rsplit_once(' ').map_or((rest, ""), |(p, h)| (p, h));
            let path = if kind == "dir" { rest } else { path };
            (
                path.trim_start_matches("./").to_string(),
                if kind == "dir" { "dir".into() } else { hash.to_string() },
            )
        })
        .collect()
}

/// A workspace with nested files, an empty dir, duplicates, a secret in a
/// file, and what the default policy leaves out.
const WORKSPACE: &str = "mkdir -p src/deep/er empty/dir .git/objects node_modules/pkg web/.env.d && \
    printf 'fn main() {}\\n' > src/main.rs && \
    head -c 2500000 /dev/urandom > src/deep/er/blob.bin && \
    printf same > a.txt && printf same > b.txt && : > zero.txt && \
    printf \"token=$API_TOKEN;again=$API_TOKEN\\n\" > config.ini && \
    printf x > .git/objects/1 && printf y > node_modules/pkg/i.js && printf z > .env && printf w > web/.env.d/k && \
    printf instructions > CLAUDE.md";

under_each_runtime! {
/// A portable snapshot of a Docker sandbox under each runtime: captured
/// there, restored byte for byte into a local sandbox and into another
/// Docker sandbox of the same runtime.
#[tokio_test(flavor = "multi_thread", worker_threads = 4)]
async fn a_docker_workspace_restores_byte_for_byte_into_a_local_sandbox(runtime) {
    ensure_test_image();
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.inner.tenant.clone() };
    h.define(
        "docker",
        api::provider_spec::Provider::Docker(api::DockerProvider {
            image: TEST_IMAGE.into(),
            runtime: runtime.name().into(),
            ..Default::default()
        }),
    )
    .await;
    h.define("local", api::provider_spec::Provider::Local(api::LocalProvider {})).await;
    let docker = h.ensure("docker", "thread-d").await;
    assert_eq!(docker.restored_checkpoint_id, "", "nothing to restore yet");
    h.sh(&docker.sandbox_id, WORKSPACE).await;
    let original = tree_lines(&h.sh(&docker.sandbox_id, TREE).await);
    let saved = h.save("thread-d", "first").await.unwrap();
    assert!(saved.head);
    assert_eq!(saved.file_count, 6, "{saved:?}");

    // The secret is zeros in what was stored, and nowhere in the blob store.
    let config = h.artifact("thread-d", &saved.checkpoint_id, "config.ini").await.unwrap();
    let zeros = "\0".repeat(SECRET.len());
    assert_eq!(config, format!("token={zeros};again={zeros}\n").into_bytes());
    let stored = h.blob_store_bytes();
    assert!(!stored.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "a copy of the secret was stored");

    // A local sandbox of another thread, forked from it, starts from it.
    h.fork("thread-d", &saved.checkpoint_id, "thread-l").await;
    let local = h.ensure("local", "thread-l").await;
    assert!(!local.restored_checkpoint_id.is_empty(), "the fork's checkpoint is restored");
    let restored = tree_lines(&h.sh(&local.sandbox_id, TREE).await);
    let mut expected = original.clone();
    expected.retain(|p, _| {
        !(p.starts_with(".git")
            || p.starts_with("node_modules")
            || p.starts_with(".env")
            || p.contains("/.env")
            || p == "CLAUDE.md")
    });
    // The secret-bearing file is the one difference: zeroed.
    let config_hash = hex_sha256(&config);
    expected.insert("config.ini".into(), config_hash);
    // `web` keeps only an excluded child: it comes back empty.
    assert_eq!(restored, expected);
    assert!(restored.contains_key("empty/dir") && restored.contains_key("zero.txt"));

    // And into a new Docker sandbox of the same runtime.
    h.fork("thread-d", &saved.checkpoint_id, "thread-r").await;
    let again = h.ensure("docker", "thread-r").await;
    assert!(!again.restored_checkpoint_id.is_empty(), "the fork's checkpoint is restored");
    assert_eq!(tree_lines(&h.sh(&again.sandbox_id, TREE).await), expected);
    h.stop().await;
}
}

/// A first save of many small files (a source tree) stores them in one
/// pack, not a file each; the secret in some of them is zeros there too,
/// and a new sandbox of a fork gets the tree back byte for byte (its
/// blobs read out of the pack).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_small_files_are_saved_in_one_pack_and_restored_byte_for_byte() {
    let mut h = Harness::start().await;
    h.define("local", api::provider_spec::Provider::Local(api::LocalProvider {})).await;
    let first = h.ensure("local", "many").await;
    h.sh(
        &first.sandbox_id,
        "for i in $(seq 1 300); do mkdir -p src/m$((i % 9)); \
           printf 'module %s\n' $i > src/m$((i % 9))/f$i.rs; done && \
         for i in 1 2 3; do printf \"key$i=$API_TOKEN\n\" > src/m$i/secret.env; done && \
         head -c 1500000 /dev/urandom > large.bin",
    )
    .await;
    assert_eq!(h.sh(&first.sandbox_id, "cat src/m1/secret.env").await, format!("key1={SECRET}\n"));
    let original = tree_lines(&h.sh(&first.sandbox_id, TREE).await);
    let saved = h.save("many", "first").await.unwrap();
    assert_eq!(saved.file_count, 304, "{saved:?}");

    let blobs = h.inner.dir.path().join("snapshot-blobs");
    let files: Vec<std::path::PathBuf> = walkdir::WalkDir::new(&blobs)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file() && e.file_name() != "tenant")
        .map(|e| e.into_path())
        .collect();
    let packs = files.iter().filter(|f| f.extension().is_some_and(|x| x == "pack")).count();
    assert_eq!((packs, files.len()), (1, 2), "one pack and the large file: {files:?}");
    let stored = h.blob_store_bytes();
    assert!(!stored.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "a copy of the secret was stored");
    assert!(stored.windows(11).any(|w| w == b"module 299\n"), "the pack holds the files' bytes");

    h.fork("many", &saved.checkpoint_id, "many-fork").await;
    let fork = h.ensure("local", "many-fork").await;
    assert!(!fork.restored_checkpoint_id.is_empty(), "the fork's checkpoint is restored");
    let mut expected = original;
    for i in 1..=3 {
        let zeroed = format!("key{i}={}\n", "\0".repeat(SECRET.len()));
        expected.insert(format!("src/m{i}/secret.env"), hex_sha256(zeroed.as_bytes()));
    }
    assert_eq!(tree_lines(&h.sh(&fork.sandbox_id, TREE).await), expected);

    // The pack lost from disk (the server read it before): a restore that
    // needs it looks again, finds the blobs nowhere, and the new sandbox's
    // agent refuses the restore as incomplete.
    let pack = files.iter().find(|f| f.extension().is_some_and(|x| x == "pack")).unwrap();
    std::fs::remove_file(pack).unwrap();
    h.fork("many", &saved.checkpoint_id, "many-lost").await;
    let req = api::EnsureSandboxRequest {
        definition_id: "local".into(),
        thread_id: "many-lost".into(),
        secrets: [("API_TOKEN".to_string(), SECRET.to_string())].into(),
        run_id: String::new(),
    };
    let (_, lost) = sandhold_tests::sandbox::ensure(&mut h.inner.acme, req).await;
    let status = lost.expect_err("a restore without its blobs fails");
    assert!(status.message().contains("is missing"), "{status:?}");
    h.stop().await;
}

fn hex_sha256(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forks_copy_the_chosen_checkpoint_saves_are_fenced_and_tenants_are_apart() {
    let mut h = Harness::start().await;
    h.define("local", api::provider_spec::Provider::Local(api::LocalProvider {})).await;
    let a = h.ensure("local", "a").await.sandbox_id;
    h.sh(&a, "echo v1 > notes.txt").await;
    let one = h.save("a", "one").await.unwrap();
    h.sh(&a, "echo v2 > notes.txt && echo new > added.txt").await;
    let two = h.save("a", "two").await.unwrap();
    assert_eq!(two.parent_id, one.checkpoint_id);
    assert!(two.uploaded_bytes > 0 && two.uploaded_bytes < 20, "only changed blobs are uploaded: {two:?}");
    let three = h.save("a", "three").await.unwrap();
    assert_eq!(three.uploaded_bytes, 0, "an unchanged tree uploads nothing");
    let listed: Vec<(String, bool)> = h.list("a").await.into_iter().map(|c| (c.label, c.head)).collect();
    assert_eq!(listed, [("one".into(), false), ("two".into(), false), ("three".into(), true)]);

    // Fork the first (not the latest) into an empty thread.
    let fork = |thread: &str, checkpoint: &str, new: &str| api::ForkSnapshotRequest {
        thread_id: thread.into(),
        checkpoint_id: checkpoint.into(),
        new_thread_id: new.into(),
    };
    let copy = h.acme.fork_snapshot(fork("a", &one.checkpoint_id, "b")).await.unwrap().into_inner();
    let copy = copy.checkpoint.unwrap();
    assert_eq!((copy.forked_from.as_str(), copy.label.as_str()), (one.checkpoint_id.as_str(), "one"));
    assert_eq!(h.artifact("b", &copy.checkpoint_id, "notes.txt").await.unwrap(), b"v1\n");
    let err = h.acme.fork_snapshot(fork("a", &two.checkpoint_id, "b")).await.unwrap_err();
    assert_eq!(Error::from_status(&err).code, ErrorCode::FailedPrecondition, "{err}");
    let err = h.acme.fork_snapshot(fork("a", &two.checkpoint_id, "a")).await.unwrap_err();
    assert_eq!(Error::from_status(&err).code, ErrorCode::FailedPrecondition, "{err}");
    // A checkpoint read through the wrong thread is not found.
    assert_eq!(h.artifact("b", &one.checkpoint_id, "notes.txt").await.unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(h.artifact("a", &one.checkpoint_id, "missing").await.unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(
        h.artifact("a", &one.checkpoint_id, "../x").await.unwrap_err().code,
        ErrorCode::InvalidArgument
    );

    // The forked thread's first sandbox starts from the copy.
    let b = h.ensure("local", "b").await;
    assert_eq!(b.restored_checkpoint_id, copy.checkpoint_id);
    assert_eq!(h.sh(&b.sandbox_id, "cat notes.txt; ls").await, "v1\nnotes.txt\n");
    // A resumed sandbox is never overwritten.
    h.sh(&b.sandbox_id, "echo live > notes.txt").await;
    let again = h.ensure("local", "b").await;
    assert_eq!(again.outcome, api::EnsureOutcome::Resumed as i32);
    assert_eq!(again.restored_checkpoint_id, "");
    assert_eq!(h.sh(&b.sandbox_id, "cat notes.txt").await, "live\n");

    // Another tenant sees nothing and can touch nothing.
    let other = &mut h.other;
    let listed = other.list_snapshots(api::ListSnapshotsRequest { thread_id: "a".into() }).await.unwrap();
    assert!(listed.into_inner().checkpoints.is_empty());
    let code = |r: Result<(), tonic::Status>| r.map_err(|s| s.code()).unwrap_err();
    assert_eq!(
        code(
            read_artifact(other, "a", &one.checkpoint_id, "notes.txt").await.map(drop).map_err(|e| e.into())
        ),
        tonic::Code::NotFound
    );
    assert_eq!(
        code(other.fork_snapshot(fork("a", &one.checkpoint_id, "z")).await.map(drop)),
        tonic::Code::NotFound
    );
    let delete =
        api::DeleteSnapshotRequest { thread_id: "a".into(), checkpoint_id: one.checkpoint_id.clone() };
    assert_eq!(code(other.delete_snapshot(delete.clone()).await.map(drop)), tonic::Code::NotFound);
    let save = api::SaveSnapshotRequest { thread_id: "a".into(), ..Default::default() };
    assert_eq!(code(other.save_snapshot(save).await.map(drop)), tonic::Code::FailedPrecondition);

    // Deleting checkpoints; the head moves back; garbage goes.
    h.acme.delete_snapshot(delete).await.unwrap();
    assert!(h.list("a").await.iter().all(|c| c.checkpoint_id != one.checkpoint_id));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_copies_the_conversation_up_to_the_checkpoint() {
    let mut h = Harness::start().await;
    h.define("local", api::provider_spec::Provider::Local(api::LocalProvider {})).await;
    let first = h.run("src", "conv-1", "echo one; echo first > notes.txt").await;
    h.checkpoint_after("src", "conv-1").await;
    let second = h.run("src", "conv-2", "echo two >&2; echo two; exit 0").await;
    let chosen = h.checkpoint_after("src", "conv-2").await;
    // Timestamps are milliseconds: the next run starts strictly later.
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.run("src", "conv-3", "echo three").await;
    h.checkpoint_after("src", "conv-3").await;

    let fork = h
        .acme
        .fork_snapshot(api::ForkSnapshotRequest {
            thread_id: "src".into(),
            checkpoint_id: chosen.checkpoint_id.clone(),
            new_thread_id: "dst".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fork.run_ids.len(), 2, "{fork:?}");
    let listed = h
        .runs
        .list_runs(api::ListRunsRequest { thread_id: "dst".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .runs;
    // Newest first: the runs up to the chosen checkpoint, not the later one.
    let ids: Vec<(&str, &str)> =
        listed.iter().map(|r| (r.run_id.as_str(), r.forked_from_run.as_str())).collect();
    assert_eq!(
        ids,
        [(fork.run_ids[1].as_str(), "conv-2"), (fork.run_ids[0].as_str(), "conv-1")],
        "{listed:?}"
    );
    for (copy, (source, streamed)) in listed.iter().rev().zip([("conv-1", &first), ("conv-2", &second)]) {
        let original = h.runs.get_run(api::GetRunRequest { run_id: source.into() }).await.unwrap();
        let original = original.into_inner().run.unwrap();
        assert_eq!(copy.thread_id, "dst");
        assert_eq!(copy.status, api::RunStatus::Completed as i32);
        assert_eq!(
            (copy.started_at_ms, copy.finished_at_ms, &copy.usage, &copy.harness, &copy.definition_id),
            (
                original.started_at_ms,
                original.finished_at_ms,
                &original.usage,
                &original.harness,
                &original.definition_id
            )
        );
        assert_eq!((copy.sandbox_id.as_str(), copy.detached_since_ms), ("", None));
        // AttachRun replays the source's chunks, offsets included, and ends.
        let replayed = h.attach(&copy.run_id).await;
        assert_eq!(&replayed, streamed, "the copy of {source} replays what the run streamed");
        assert_eq!(replayed, h.attach(source).await);
        assert!(replayed.iter().any(|(_, c)| c.r#type() == api::ChunkType::RunFinished));
    }
    let active = h.runs.get_active_run(api::GetActiveRunRequest { thread_id: "dst".into() }).await.unwrap();
    assert_eq!(active.into_inner().run, None, "copies are ended runs");

    // Another tenant sees none of it.
    let theirs = h
        .other_runs
        .list_runs(api::ListRunsRequest { thread_id: "dst".into(), ..Default::default() })
        .await
        .unwrap();
    assert!(theirs.into_inner().runs.is_empty());
    let err = h.other_runs.get_run(api::GetRunRequest { run_id: fork.run_ids[0].clone() }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let req = api::AttachRunRequest { run_id: fork.run_ids[0].clone(), ..Default::default() };
    assert_eq!(h.other_runs.attach_run(req).await.unwrap_err().code(), tonic::Code::NotFound);

    // The forked thread goes on from the copied checkpoint.
    let dst = h.ensure("local", "dst").await;
    assert_eq!(dst.restored_checkpoint_id, fork.checkpoint.unwrap().checkpoint_id);
    assert_eq!(h.sh(&dst.sandbox_id, "cat notes.txt").await, "first\n");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_saves_racing_on_one_thread_one_wins_the_other_is_fenced() {
    let mut h = Harness::start().await;
    h.define("local", api::provider_spec::Provider::Local(api::LocalProvider {})).await;
    let sandbox = h.ensure("local", "race").await.sandbox_id;
    // 10 MB to hash: each capture takes far longer (seconds) than the two
    // claims are apart (milliseconds), so both saves hold a claim before
    // either commits.
    h.sh(&sandbox, "mkdir d && for i in $(seq 1 10); do head -c 1000000 /dev/urandom > d/f$i; done").await;
    for round in 0..3 {
        h.sh(&sandbox, &format!("echo {round} > round.txt")).await;
        let before = h.list("race").await.len();
        let (mut a, mut b) = (h.acme.clone(), h.acme.clone());
        let (one, two) = tokio::join!(save_status(&mut a, "race", "a"), save_status(&mut b, "race", "b"));
        let (winner, loser) = match (one, two) {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
            other => panic!("round {round}: not one winner and one fenced save: {other:?}"),
        };
        // `from_status` takes the code from the ErrorInfo reason (ABORTED
        // alone would read as CLAIM_LOST).
        let reason = Error::from_status(&loser).code;
        assert!(
            matches!(reason, ErrorCode::SnapshotWriterLost | ErrorCode::SnapshotStaleHead),
            "round {round}: the loser's ErrorInfo reason is not a fence: {loser:?}"
        );
        assert_eq!(loser.code(), tonic::Code::Aborted);
        let listed = h.list("race").await;
        assert_eq!(listed.len(), before + 1, "round {round}: only the winner landed");
        let head: Vec<&str> = listed.iter().filter(|c| c.head).map(|c| c.checkpoint_id.as_str()).collect();
        assert_eq!(head, [winner.checkpoint_id.as_str()], "round {round}: the head is the winner's");
        assert_eq!(
            h.artifact("race", &winner.checkpoint_id, "round.txt").await.unwrap(),
            format!("{round}\n").into_bytes()
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_removes_what_the_checkpoint_lacks_and_keeps_excluded_paths() {
    restore_removes_what_the_checkpoint_lacks(Place::SingleHost).await;
}

/// The same with the sandboxes on a node in another network namespace: the
/// capture and the restore go through the node's tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_on_a_node_removes_what_the_checkpoint_lacks_and_keeps_excluded_paths() {
    restore_removes_what_the_checkpoint_lacks(Place::OnANode).await;
}

async fn restore_removes_what_the_checkpoint_lacks(place: Place) {
    let Some(s) = served(place, "snap-restore", &[]).await else { return };
    let s = s.as_ref();
    let mut sandboxes = s.server().sandboxes(s.token()).await;
    let mut snapshots =
        SnapshotServiceClient::with_interceptor(s.server().channel().await, bearer(s.token()));
    let ensure = |sandboxes: &Sandboxes| {
        let mut sandboxes = sandboxes.clone();
        async move {
            let req = api::EnsureSandboxRequest {
                definition_id: "local".into(),
                thread_id: "t".into(),
                secrets: [("API_TOKEN".to_string(), SECRET.to_string())].into(),
                run_id: String::new(),
            };
            sandhold_tests::sandbox::ensure(&mut sandboxes, req).await.1.unwrap_or_else(|e| panic!("{e}"))
        }
    };
    let sh = |sandboxes: &Sandboxes, sandbox: &str, script: &str| {
        let (mut sandboxes, sandbox, script) = (sandboxes.clone(), sandbox.to_string(), script.to_string());
        async move {
            let (code, out) = sandhold_tests::sandbox::sh(&mut sandboxes, &sandbox, &script).await;
            assert_eq!(code, 0, "{script}: {out}");
            out
        }
    };
    // Provisioning makes these in every new sandbox of the thread, before
    // the restore (as a git clone would bring back a deleted file).
    let setup = "printf base > tracked.txt && printf old > gone.txt && mkdir -p stale/deep node_modules/pkg .git && \
                 printf s > stale/deep/s.txt && printf dep > node_modules/pkg/i.js && printf E=1 > .env && \
                 printf ref > .git/HEAD";
    let local = api::provider_spec::Provider::Local(api::LocalProvider {});
    put_definition(&mut sandboxes, snapshot_definition("local", local, Some(setup))).await;
    let first = ensure(&sandboxes).await;
    if place == Place::OnANode {
        assert_eq!(first.sandbox.as_ref().unwrap().node, "node-1", "{first:?}");
    }
    sh(
        &sandboxes,
        &first.sandbox_id,
        "rm gone.txt && rm -r stale && echo changed > tracked.txt && echo mine > node_modules/pkg/i.js && \
         echo E=2 > .env",
    )
    .await;
    let saved =
        save(&mut snapshots, "t", "after edits").await.unwrap_or_else(|e| panic!("{e}\n{}", s.logs()));
    sandboxes
        .destroy_sandbox(api::DestroySandboxRequest { sandbox_id: first.sandbox_id.clone() })
        .await
        .unwrap();

    let second = ensure(&sandboxes).await;
    assert_eq!(second.outcome, api::EnsureOutcome::Created as i32);
    assert_eq!(second.restored_checkpoint_id, saved.checkpoint_id);
    let probe = "for f in tracked.txt gone.txt stale node_modules/pkg/i.js .env .git/HEAD; do \
                 if [ -f \"$f\" ]; then echo \"$f=$(cat \"$f\")\"; elif [ -e \"$f\" ]; then echo \"$f is there\"; \
                 else echo \"$f absent\"; fi; done";
    assert_eq!(
        sh(&sandboxes, &second.sandbox_id, probe).await,
        "tracked.txt=changed\n\
         gone.txt absent\n\
         stale absent\n\
         node_modules/pkg/i.js=dep\n\
         .env=E=1\n\
         .git/HEAD=ref\n",
        "the checkpoint's files, nothing it lacks, and the excluded paths as provisioning made them"
    );
}

/// The blob de-dup oracle over the real server: the other tenant saving the
/// very file acme saved uploads it (its `uploaded_bytes` says so), so what
/// acme stored tells it nothing; de-duplication stays within a tenant, and
/// each tenant reads its own copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_tenants_identical_bytes_are_uploaded_again_so_dedup_is_no_oracle() {
    let mut h = Harness::start().await;
    let local = || api::provider_spec::Provider::Local(api::LocalProvider {});
    h.define("local", local()).await;
    let theirs = snapshot_definition("local", local(), None);
    h.inner.other.put_definition(api::PutDefinitionRequest { definition: Some(theirs) }).await.unwrap();
    const PLAN: &str = "acme ships the merger on friday";
    let write = format!("printf '{PLAN}' > plan.txt");

    let a = h.ensure("local", "a").await.sandbox_id;
    h.sh(&a, &write).await;
    let first = h.save("a", "one").await.unwrap();
    assert!(first.uploaded_bytes >= PLAN.len() as u64, "{first:?}");
    // Within acme the same bytes are de-duplicated (here is the oracle
    // there would be across tenants).
    let a2 = h.ensure("local", "a2").await.sandbox_id;
    h.sh(&a2, &write).await;
    assert_eq!(h.save("a2", "same").await.unwrap().uploaded_bytes, 0);

    // The other tenant guesses acme's file right: it is uploaded all the same.
    let req = api::EnsureSandboxRequest {
        definition_id: "local".into(),
        thread_id: "b".into(),
        secrets: [("API_TOKEN".to_string(), SECRET.to_string())].into(),
        run_id: String::new(),
    };
    let b = sandhold_tests::sandbox::ensure(&mut h.inner.other, req).await.1.unwrap().sandbox_id;
    let (code, out) = sandhold_tests::sandbox::sh(&mut h.inner.other, &b, &write).await;
    assert_eq!(code, 0, "{out}");
    let guess = save(&mut h.other, "b", "guess").await.unwrap();
    assert_eq!(
        guess.uploaded_bytes, first.uploaded_bytes,
        "the same workspace uploads the same bytes, whatever another tenant stored"
    );
    assert_eq!(save(&mut h.other, "b", "again").await.unwrap().uploaded_bytes, 0, "its own dedup");
    let read = read_artifact(&mut h.other, "b", &guess.checkpoint_id, "plan.txt").await.unwrap();
    assert_eq!(read, PLAN.as_bytes());
    // Two copies on disk: one per tenant.
    let stored = h.blob_store_bytes();
    let copies = stored.windows(PLAN.len()).filter(|w| *w == PLAN.as_bytes()).count();
    assert_eq!(copies, 2, "one blob per tenant");
    h.stop().await;
}

/// What a fake agent (tenant code can replace or drive the agent in its
/// sandbox) says, for [`snapshot::save`] to be checked against: a manifest
/// of its choosing, and for `ReadBlobs` the blobs it chooses to send,
/// whatever was asked. Records which hashes the control plane asked for.
#[derive(Clone, Default)]
struct FakeAgent {
    manifest: Vec<agent::ManifestEntry>,
    sends: Vec<(String, Vec<u8>)>,
    asked: Arc<Mutex<Vec<String>>>,
}

type Messages<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl InfoService for FakeAgent {
    async fn get_info(
        &self,
        _: tonic::Request<agent::GetInfoRequest>,
    ) -> Result<tonic::Response<agent::GetInfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(agent::GetInfoResponse {
            agent_version: "0.0.0-fake".into(),
            protocol_version: shared::AGENT_PROTOCOL_VERSION,
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl SnapshotService for FakeAgent {
    type CaptureStream = Messages<agent::CaptureResponse>;
    type ReadBlobsStream = Messages<agent::ReadBlobsResponse>;

    async fn capture(
        &self,
        _: tonic::Request<agent::CaptureRequest>,
    ) -> Result<tonic::Response<Self::CaptureStream>, tonic::Status> {
        let batch = agent::CaptureResponse { entries: self.manifest.clone() };
        Ok(tonic::Response::new(Box::pin(futures::stream::iter([Ok(batch)]))))
    }

    async fn read_blobs(
        &self,
        req: tonic::Request<agent::ReadBlobsRequest>,
    ) -> Result<tonic::Response<Self::ReadBlobsStream>, tonic::Status> {
        self.asked.lock().unwrap().extend(req.into_inner().blobs.into_iter().map(|b| b.sha256));
        let sends = self.sends.iter().map(|(sha256, data)| {
            Ok(agent::ReadBlobsResponse { sha256: sha256.clone(), data: data.clone().into(), last: true })
        });
        Ok(tonic::Response::new(Box::pin(futures::stream::iter(sends.collect::<Vec<_>>()))))
    }

    async fn restore(
        &self,
        _: tonic::Request<tonic::Streaming<agent::RestoreRequest>>,
    ) -> Result<tonic::Response<agent::RestoreResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("a fake agent restores nothing"))
    }
}

impl FakeAgent {
    /// Reports one file at `path` with the hash and size of `data`.
    fn claiming(path: &str, data: &[u8]) -> Self {
        let entry = agent::ManifestEntry {
            path: path.into(),
            kind: agent::EntryKind::File as i32,
            size: data.len() as u64,
            mode: 0o644,
            sha256: hex_sha256(data),
        };
        Self { manifest: vec![entry], ..Default::default() }
    }

    /// Answers `ReadBlobs` with `data` under `sha256`.
    fn sending(mut self, sha256: &str, data: &[u8]) -> Self {
        self.sends.push((sha256.into(), data.to_vec()));
        self
    }

    async fn serve(self, dir: &std::path::Path, name: &str) -> AgentClient {
        let path = dir.join(format!("{name}.sock"));
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(InfoServiceServer::new(self.clone()))
                .add_service(SnapshotServiceServer::new(self))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        AgentClient::connect(&Address::Unix(path), &Secret::new("fake")).await.unwrap()
    }
}

/// A fake agent of the globex tenant claims the hash of acme's file: with
/// no bytes, or with other bytes, the save asks for the blob and fails,
/// leaving globex no checkpoint and no read of acme's bytes; with the very
/// bytes, globex stores (and is counted for) its own copy; collecting
/// acme's copy then leaves globex's. On SQLite + directory and on
/// PostgreSQL when there is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_agent_claiming_another_tenants_hash_gets_nothing_of_theirs() {
    on_sqlite_and_postgres(|stores, dir, round| Box::pin(fake_agent_attack(stores, dir, round))).await;
}

/// `case` on SQLite + directory, then on PostgreSQL when there is one.
async fn on_sqlite_and_postgres(
    case: for<'a> fn(&'a Stores, &'a std::path::Path, usize) -> futures::future::BoxFuture<'a, ()>,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut urls = vec![format!("sqlite://{}", dir.path().join("sandhold.db").display())];
    let scratch = match sandhold_tests::services::postgres_url() {
        Some(admin) => Some(sandhold_tests::database::ScratchDatabase::create(&admin).await.unwrap()),
        None => None,
    };
    urls.extend(scratch.as_ref().map(|s| s.url().to_string()));
    for (i, url) in urls.iter().enumerate() {
        let stores = Stores::open(url).await.unwrap();
        case(&stores, dir.path(), i).await;
        stores.close().await;
    }
    if let Some(scratch) = scratch {
        scratch.drop_database().await.unwrap();
    }
}

async fn fake_agent_attack(stores: &Stores, dir: &std::path::Path, round: usize) {
    let (acme, globex) = (Tenant::new("acme"), Tenant::new("globex"));
    let secrets = Default::default();
    let request = |tenant, label| SaveRequest {
        tenant,
        thread_id: "t",
        run_id: "r",
        label,
        policy: Default::default(),
        secrets: &secrets,
        maxima: Default::default(),
    };
    let plan = b"acme's plan: ship on friday".to_vec();
    let h = hex_sha256(&plan);
    let honest = FakeAgent::claiming("plan.txt", &plan).sending(&h, &plan);
    let client = honest.serve(dir, &format!("acme-{round}")).await;
    let saved = snapshot::save(stores, &client, request(&acme, "acme's")).await.unwrap();
    assert_eq!(saved.uploaded_bytes, plan.len() as u64);

    // Claimed, not sent: the bytes are asked for, and the save fails.
    let silent = FakeAgent::claiming("stolen.txt", &plan);
    let asked = silent.asked.clone();
    let client = silent.serve(dir, &format!("silent-{round}")).await;
    let err = snapshot::save(stores, &client, request(&globex, "claimed")).await.unwrap_err();
    assert!(matches!(&err, snapshot::Error::Corrupt(why) if why.contains("did not send")), "{err:?}");
    assert_eq!(
        *asked.lock().unwrap(),
        std::slice::from_ref(&h),
        "the control plane asked for the claimed blob"
    );

    // Claimed, and other bytes sent under the hash (as an agent reading a
    // file changed since its manifest does): refused on receipt, naming
    // the file.
    let forged = FakeAgent::claiming("stolen.txt", &plan).sending(&h, b"acme's plan: ship on monday");
    let client = forged.serve(dir, &format!("forged-{round}")).await;
    let err = snapshot::save(stores, &client, request(&globex, "forged")).await.unwrap_err();
    assert!(
        matches!(&err, snapshot::Error::ChangedWhileCaptured(why) if why.contains("\"stolen.txt\": bytes hash to")),
        "{err:?}"
    );

    // Nothing of globex references acme's bytes, nor can globex read them.
    let snapshots = SnapshotOps::new(stores.clone());
    assert!(snapshots.list(&globex, "t").await.unwrap().checkpoints.is_empty());
    let theirs = snapshot::read_blob(stores, &globex, &h).await.unwrap_err();
    assert!(matches!(theirs, snapshot::Error::Store(store::Error::NotFound(_))), "{theirs:?}");
    assert_eq!(snapshot::read_blob(stores, &acme, &h).await.unwrap(), plan);

    // Sent for real (globex has the bytes itself): its own copy, counted.
    let knows = FakeAgent::claiming("guessed.txt", &plan).sending(&h, &plan);
    let client = knows.serve(dir, &format!("knows-{round}")).await;
    let guessed = snapshot::save(stores, &client, request(&globex, "guessed")).await.unwrap();
    assert_eq!(guessed.uploaded_bytes, plan.len() as u64, "uploaded: no de-dup oracle");

    // Collecting acme's copy leaves globex's.
    snapshots.delete(&acme, "t", &saved.checkpoint_id).await.unwrap();
    assert_eq!(snapshot::collect_garbage(stores).await.unwrap(), [BlobKey::new(&acme, &h)]);
    assert_eq!(snapshot::read_blob(stores, &globex, &h).await.unwrap(), plan);
    assert!(snapshot::read_blob(stores, &acme, &h).await.is_err());
}

/// A fake agent against the maxima: a manifest declaring a file (or a
/// total) over a maximum is refused before a byte is asked for; bytes past
/// what the manifest declared are refused as they arrive (as a change when
/// under the maximum, as too large past it); nothing is recorded or
/// stored. On SQLite + directory and on PostgreSQL when there is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_agent_over_the_maxima_is_refused_before_and_while_streaming() {
    on_sqlite_and_postgres(|stores, dir, round| Box::pin(fake_agent_over_maxima(stores, dir, round))).await;
}

async fn fake_agent_over_maxima(stores: &Stores, dir: &std::path::Path, round: usize) {
    use control_plane::config::SnapshotLimits;
    let acme = Tenant::new("acme");
    let secrets = Default::default();
    let limits = SnapshotLimits { max_snapshot_file_bytes: 100, max_snapshot_bytes: 150 };
    let request = |label| SaveRequest {
        tenant: &acme,
        thread_id: "t",
        run_id: "r",
        label,
        policy: Default::default(),
        secrets: &secrets,
        maxima: snapshot::Maxima::new(limits, None),
    };
    // Declared over the per-file maximum: nothing is asked for.
    let big = vec![b'b'; 101];
    let declared = FakeAgent::claiming("big.bin", &big).sending(&hex_sha256(&big), &big);
    let asked = declared.asked.clone();
    let client = declared.serve(dir, &format!("declared-{round}")).await;
    let err = snapshot::save(stores, &client, request("declared")).await.unwrap_err();
    assert_eq!(too_large(err), Ok(("big.bin".into(), "101".into(), "max-snapshot-file-bytes".into())));
    assert!(asked.lock().unwrap().is_empty(), "no blob was asked for");

    // Two files under the per-file maximum, over the per-snapshot one.
    let (a, b) = (vec![b'a'; 80], vec![b'c'; 80]);
    let mut two = FakeAgent::claiming("a.txt", &a);
    two.manifest.extend(FakeAgent::claiming("b.txt", &b).manifest);
    let asked = two.asked.clone();
    let client = two.serve(dir, &format!("two-{round}")).await;
    let err = snapshot::save(stores, &client, request("two")).await.unwrap_err();
    assert_eq!(too_large(err), Ok((String::new(), "160".into(), "max-snapshot-bytes".into())));
    assert!(asked.lock().unwrap().is_empty(), "no blob was asked for");

    // Declared small, sent larger: past the declaration, a change; past the
    // maximum, too large. The manifest's hash is of the declared bytes.
    let small = b"small".to_vec();
    let grown = FakeAgent::claiming("s.txt", &small).sending(&hex_sha256(&small), &[b's'; 50]);
    let client = grown.serve(dir, &format!("grown-{round}")).await;
    let err = snapshot::save(stores, &client, request("grown")).await.unwrap_err();
    assert!(
        matches!(&err, snapshot::Error::ChangedWhileCaptured(why) if why.contains("more than the 5 bytes")),
        "{err:?}"
    );
    let huge = FakeAgent::claiming("s.txt", &small).sending(&hex_sha256(&small), &[b's'; 4096]);
    let client = huge.serve(dir, &format!("huge-{round}")).await;
    let err = snapshot::save(stores, &client, request("huge")).await.unwrap_err();
    assert_eq!(too_large(err), Ok(("s.txt".into(), "4096".into(), "max-snapshot-file-bytes".into())));

    // Nothing recorded, nothing stored.
    assert!(SnapshotOps::new(stores.clone()).list(&acme, "t").await.unwrap().checkpoints.is_empty());
    assert_eq!(stores.blobs.stats().await.unwrap().count, 0, "{:?}", stores.blobs.list().await.unwrap());
}

/// The path, size and setting of a SNAPSHOT_TOO_LARGE refusal, as a
/// client sees them; any other error as it is.
fn too_large(err: snapshot::Error) -> Result<(String, String, String), String> {
    let shown = format!("{err:?}");
    let wire = Error::from(err);
    if wire.code != ErrorCode::SnapshotTooLarge {
        return Err(shown);
    }
    let meta = |k: &str| wire.metadata.get(k).cloned().unwrap_or_default();
    Ok((meta("path"), meta("size"), meta("limit")))
}
