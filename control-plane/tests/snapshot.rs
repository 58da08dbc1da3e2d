//! `SnapshotService` and the lifecycle's restore over a real server: a
//! workspace captured in a Docker sandbox comes back byte for byte (minus
//! exclusions, secrets zeroed) in a local one; forks copy the chosen
//! checkpoint into empty threads only; saves racing on one thread are
//! fenced; another tenant sees nothing.

mod provider_support;
mod sandbox_support;

use std::collections::BTreeMap;

use sandbox_support::{Bearer, DockerCleanup};
use shared::error::{Error, ErrorCode};
use shared::proto::v1 as api;
use shared::proto::v1::snapshot_service_client::SnapshotServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const SECRET: &str = "sk-test-5f1e0c9a7b3d";

type Snapshots = SnapshotServiceClient<InterceptedService<Channel, Bearer>>;

/// The `SandboxService` test server, with `SnapshotService` clients of
/// both tenants beside its `SandboxService` ones.
struct Harness {
    inner: sandbox_support::Harness,
    acme: Snapshots,
    other: Snapshots,
}

impl Harness {
    async fn start() -> Self {
        let inner = sandbox_support::Harness::start().await;
        let addr = inner.server.as_ref().unwrap().local_addr();
        let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let client = |token: String| {
            SnapshotServiceClient::with_interceptor(
                channel.clone(),
                Bearer(format!("Bearer {token}").parse().unwrap()),
            )
        };
        let acme = client(format!("tok-a-{}", inner.nonce));
        let other = client(format!("tok-b-{}", inner.nonce));
        Self { inner, acme, other }
    }

    async fn stop(&mut self) {
        self.inner.stop().await;
    }

    async fn define(&mut self, id: &str, provider: api::provider_spec::Provider) {
        let definition = api::SandboxDefinition {
            id: id.into(),
            provider: Some(api::ProviderSpec { provider: Some(provider) }),
            secret_names: vec!["API_TOKEN".into()],
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
        sandbox_support::ensure(&mut self.inner.acme, req).await.1.unwrap()
    }

    async fn sh(&mut self, sandbox: &str, script: &str) -> String {
        let (code, out) = sandbox_support::sh(&mut self.inner.acme, sandbox, script).await;
        assert_eq!(code, 0, "{script}: {out}");
        out
    }

    async fn save(&mut self, thread: &str, label: &str) -> Result<api::Checkpoint, Error> {
        self.acme
            .save_snapshot(api::SaveSnapshotRequest {
                thread_id: thread.into(),
                run_id: format!("run-{label}"),
                label: label.into(),
                sandbox_id: String::new(),
            })
            .await
            .map(|r| r.into_inner().checkpoint.unwrap())
            .map_err(|s| Error::from_status(&s))
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
    provider_support::ensure_test_image();
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.inner.tenant.clone() };
    h.define(
        "docker",
        api::provider_spec::Provider::Docker(api::DockerProvider {
            image: provider_support::test_image(),
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

    // Saves racing on one thread: each one wins or is fenced, never both land half.
    let saves = futures::future::join_all((0..4).map(|i| {
        let mut snapshots = h.acme.clone();
        async move {
            snapshots
                .save_snapshot(api::SaveSnapshotRequest {
                    thread_id: "a".into(),
                    run_id: String::new(),
                    label: format!("race-{i}"),
                    sandbox_id: String::new(),
                })
                .await
                .map_err(|s| Error::from_status(&s))
        }
    }))
    .await;
    let won = saves.iter().filter(|s| s.is_ok()).count();
    for s in &saves {
        if let Err(e) = s {
            assert!(matches!(e.code, ErrorCode::SnapshotWriterLost | ErrorCode::SnapshotStaleHead), "{e}");
        }
    }
    assert!(won >= 1);
    assert_eq!(h.list("a").await.len(), 3 + won, "exactly the winners landed");

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
