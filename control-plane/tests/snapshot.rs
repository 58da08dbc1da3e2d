//! `SnapshotService` and the lifecycle's restore over a real server: a
//! workspace captured in a Docker sandbox comes back byte for byte (minus
//! exclusions, secrets zeroed) in a local one; forks copy the chosen
//! checkpoint into empty threads only, with the conversation (runs and
//! their event logs) up to it; two saves racing on one thread: one wins,
//! the other is fenced; another tenant sees nothing; a restore into a new
//! sandbox removes what provisioning brought back and the checkpoint lacks,
//! and leaves excluded paths as provisioning made them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sandhold_tests::auth::{Bearer, bearer};
use sandhold_tests::docker::{DockerCleanup, TEST_IMAGE, ensure_test_image};
use sandhold_tests::run::{command_run, wait_terminal};
use sandhold_tests::server::Runs;
use sandhold_tests::wait::PATIENCE;
use shared::error::{Error, ErrorCode};
use shared::proto::v1 as api;
use shared::proto::v1::run_service_client::RunServiceClient;
use shared::proto::v1::snapshot_service_client::SnapshotServiceClient;
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
        let workspace = setup.map(|setup| api::WorkspaceDefinition {
            setup: vec![api::SetupStep { step: Some(api::setup_step::Step::Serial(setup.into())) }],
            ..Default::default()
        });
        let definition = api::SandboxDefinition {
            id: id.into(),
            provider: Some(api::ProviderSpec { provider: Some(provider) }),
            secret_names: vec!["API_TOKEN".into()],
            workspace,
            lifecycle: Some(api::Lifecycle {
                portable_snapshots: Some(api::PortableSnapshots { enabled: true, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        };
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
            out.push((c.offset, c.chunk.unwrap()));
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
    head -c 300000 /dev/urandom > src/deep/er/blob.bin && \
    printf same > a.txt && printf same > b.txt && : > zero.txt && \
    printf \"token=$API_TOKEN;again=$API_TOKEN\\n\" > config.ini && \
    printf x > .git/objects/1 && printf y > node_modules/pkg/i.js && printf z > .env && printf w > web/.env.d/k && \
    printf instructions > CLAUDE.md";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_docker_workspace_restores_byte_for_byte_into_a_local_sandbox() {
    if !sandhold_tests::services::docker() {
        return;
    }
    ensure_test_image();
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.inner.tenant.clone() };
    h.define(
        "docker",
        api::provider_spec::Provider::Docker(api::DockerProvider {
            image: TEST_IMAGE.into(),
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
    h.acme
        .fork_snapshot(api::ForkSnapshotRequest {
            thread_id: "thread-d".into(),
            checkpoint_id: saved.checkpoint_id.clone(),
            new_thread_id: "thread-l".into(),
        })
        .await
        .unwrap();
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
    let mut h = Harness::start().await;
    // Provisioning makes these in every new sandbox of the thread, before
    // the restore (as a git clone would bring back a deleted file).
    let setup = "printf base > tracked.txt && printf old > gone.txt && mkdir -p stale/deep node_modules/pkg .git && \
                 printf s > stale/deep/s.txt && printf dep > node_modules/pkg/i.js && printf E=1 > .env && \
                 printf ref > .git/HEAD";
    let local = api::provider_spec::Provider::Local(api::LocalProvider {});
    h.define_with_setup("local", local, Some(setup)).await;
    let first = h.ensure("local", "t").await;
    h.sh(
        &first.sandbox_id,
        "rm gone.txt && rm -r stale && echo changed > tracked.txt && echo mine > node_modules/pkg/i.js && \
         echo E=2 > .env",
    )
    .await;
    let saved = h.save("t", "after edits").await.unwrap();
    h.inner
        .acme
        .destroy_sandbox(api::DestroySandboxRequest { sandbox_id: first.sandbox_id.clone() })
        .await
        .unwrap();

    let second = h.ensure("local", "t").await;
    assert_eq!(second.outcome, api::EnsureOutcome::Created as i32);
    assert_eq!(second.restored_checkpoint_id, saved.checkpoint_id);
    let probe = "for f in tracked.txt gone.txt stale node_modules/pkg/i.js .env .git/HEAD; do \
                 if [ -f \"$f\" ]; then echo \"$f=$(cat \"$f\")\"; elif [ -e \"$f\" ]; then echo \"$f is there\"; \
                 else echo \"$f absent\"; fi; done";
    assert_eq!(
        h.sh(&second.sandbox_id, probe).await,
        "tracked.txt=changed\n\
         gone.txt absent\n\
         stale absent\n\
         node_modules/pkg/i.js=dep\n\
         .env=E=1\n\
         .git/HEAD=ref\n",
        "the checkpoint's files, nothing it lacks, and the excluded paths as provisioning made them"
    );
    h.stop().await;
}
