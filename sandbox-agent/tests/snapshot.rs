//! `SnapshotService` through the real tonic stack: capture (policy,
//! unsupported entries, secret zeroing) and restore (hostile manifests are
//! refused with nothing written).

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::TestAgent;
use sha2::{Digest, Sha256};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::snapshot_service_client::SnapshotServiceClient;
use shared::proto::agent::v1::{
    BlobRef, CapturePolicy, CaptureRequest, EntryKind, ManifestEntry, ReadBlobsRequest, RestoreBlob,
    RestoreEntries, RestoreHeader, RestoreRequest, restore_request,
};
use shared::transport::AuthedChannel;

type Client = SnapshotServiceClient<AuthedChannel>;
/// Blobs as sent: hash and bytes.
type Blobs = Vec<(String, Vec<u8>)>;

async fn client(agent: &TestAgent) -> Client {
    SnapshotServiceClient::new(agent.channel().await)
}

async fn capture(
    c: &mut Client,
    policy: CapturePolicy,
    secrets: &[&str],
) -> Result<Vec<ManifestEntry>, Error> {
    let req = CaptureRequest {
        policy: Some(policy),
        redact_values: secrets.iter().map(|s| s.to_string()).collect(),
    };
    let mut stream = c.capture(req).await.map_err(|s| Error::from_status(&s))?.into_inner();
    let mut out = Vec::new();
    while let Some(batch) = stream.message().await.map_err(|s| Error::from_status(&s))? {
        out.extend(batch.entries);
    }
    Ok(out)
}

/// Every blob of `entries`, by hash.
async fn read_blobs(
    c: &mut Client,
    entries: &[ManifestEntry],
    secrets: &[&str],
) -> BTreeMap<String, Vec<u8>> {
    let mut wanted = BTreeMap::new();
    for e in entries.iter().filter(|e| e.kind == EntryKind::File as i32) {
        wanted.entry(e.sha256.clone()).or_insert_with(|| e.path.clone());
    }
    let req = ReadBlobsRequest {
        blobs: wanted
            .iter()
            .map(|(sha256, path)| BlobRef { path: path.clone(), sha256: sha256.clone() })
            .collect(),
        redact_values: secrets.iter().map(|s| s.to_string()).collect(),
        policy: None,
    };
    let mut stream = c.read_blobs(req).await.unwrap().into_inner();
    let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    while let Some(msg) = stream.message().await.unwrap() {
        blobs.entry(msg.sha256).or_default().extend(msg.data);
    }
    blobs
}

fn restore_messages(entries: &[ManifestEntry], blobs: &[(String, Vec<u8>)]) -> Vec<RestoreRequest> {
    let mut msgs = vec![RestoreRequest {
        request: Some(restore_request::Request::Header(RestoreHeader {
            entry_count: entries.len() as u64,
            blob_count: blobs.len() as u64,
        })),
    }];
    msgs.push(RestoreRequest {
        request: Some(restore_request::Request::Entries(RestoreEntries { entries: entries.to_vec() })),
    });
    for (sha256, data) in blobs {
        msgs.push(RestoreRequest {
            request: Some(restore_request::Request::Blob(RestoreBlob {
                sha256: sha256.clone(),
                data: data.clone(),
            })),
        });
    }
    msgs
}

async fn restore(
    c: &mut Client,
    entries: &[ManifestEntry],
    blobs: &[(String, Vec<u8>)],
) -> Result<(), Error> {
    c.restore(futures::stream::iter(restore_messages(entries, blobs)))
        .await
        .map(drop)
        .map_err(|s| Error::from_status(&s))
}

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// Every entry below `root` with its bytes (directories as `None`).
fn tree(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Option<Vec<u8>>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                out.insert(rel, None);
                walk(root, &p, out);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn file_entry(path: &str, data: &[u8]) -> ManifestEntry {
    ManifestEntry {
        path: path.into(),
        kind: EntryKind::File as i32,
        size: data.len() as u64,
        mode: 0o644,
        sha256: sha(data),
    }
}

#[tokio::test]
async fn capture_then_restore_reproduces_the_tree_minus_exclusions() {
    let source = TestAgent::start().await;
    let target = TestAgent::start().await;
    let root = &source.root;
    write(root, "src/main.rs", b"fn main() {}\n");
    write(root, "src/lib/deep/mod.rs", &vec![7u8; 300_000]);
    write(root, "same-a.txt", b"same");
    write(root, "same-b.txt", b"same");
    write(root, "empty.txt", b"");
    std::fs::create_dir_all(root.join("empty-dir")).unwrap();
    std::fs::set_permissions(root.join("src/main.rs"), std::fs::Permissions::from_mode(0o600)).unwrap();
    // Excluded by default.
    write(root, ".git/config", b"[core]");
    write(root, "web/node_modules/x/index.js", b"x");
    write(root, ".env.local", b"TOKEN=1");
    write(root, "CLAUDE.md", b"instructions");
    write(root, ".claude/skills/review/SKILL.md", b"skill");
    write(root, shared::snapshot::PROJECTION_MARKER, b"{}");
    std::os::unix::fs::symlink("/etc/passwd", root.join("web/node_modules/link")).unwrap();
    write(root, "docs/CLAUDE.md", b"kept: not at the root");

    let mut c = client(&source).await;
    let entries = capture(&mut c, CapturePolicy::default(), &[]).await.unwrap();
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            ".claude/skills",
            ".sandhold",
            "docs/CLAUDE.md",
            "empty-dir",
            "empty.txt",
            "same-a.txt",
            "same-b.txt",
            "src/lib/deep/mod.rs",
            "src/main.rs",
            "web"
        ]
    );
    let main = entries.iter().find(|e| e.path == "src/main.rs").unwrap();
    assert_eq!((main.mode, main.size, main.sha256.as_str()), (0o600, 13, sha(b"fn main() {}\n").as_str()));
    let blobs = read_blobs(&mut c, &entries, &[]).await;
    assert_eq!(blobs.len(), 5, "identical files share one blob");
    for (hash, data) in &blobs {
        assert_eq!(&sha(data), hash);
    }

    let mut t = client(&target).await;
    restore(&mut t, &entries, &blobs.into_iter().collect::<Vec<_>>()).await.unwrap();
    let mut expected = tree(root);
    expected.retain(|path, _| {
        !shared::snapshot::default_excluded(path) && !shared::snapshot::always_excluded(path)
    });
    assert!(expected.contains_key(".claude/skills") && !expected.contains_key(".git"));
    assert_eq!(tree(&target.root), expected);
    let mode = std::fs::metadata(target.root.join("src/main.rs")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    source.stop().await;
    target.stop().await;
}

#[tokio::test]
async fn unsupported_entries_fail_the_capture_naming_the_path_unless_excluded() {
    let agent = TestAgent::start().await;
    let root = &agent.root;
    write(root, "ok.txt", b"ok");
    write(root, "bin/tool", b"#!/bin/sh\n");
    std::fs::set_permissions(root.join("bin/tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = client(&agent).await;
    let err = capture(&mut c, CapturePolicy::default(), &[]).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::SnapshotUnsupportedEntry);
    assert_eq!(err.metadata.get("path").map(String::as_str), Some("bin/tool"));
    std::fs::remove_file(root.join("bin/tool")).unwrap();

    std::os::unix::fs::symlink("ok.txt", root.join("link")).unwrap();
    let err = capture(&mut c, CapturePolicy::default(), &[]).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::SnapshotUnsupportedEntry);
    assert_eq!(err.metadata.get("path").map(String::as_str), Some("link"));

    nix::unistd::mkfifo(&root.join("bin/fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let policy = CapturePolicy { exclude: vec!["link".into()], ..Default::default() };
    let err = capture(&mut c, policy.clone(), &[]).await.unwrap_err();
    assert_eq!(err.metadata.get("path").map(String::as_str), Some("bin/fifo"));

    // Excluded (or not included), they are fine.
    let policy = CapturePolicy { exclude: vec!["link".into(), "bin".into()], ..Default::default() };
    let entries = capture(&mut c, policy, &[]).await.unwrap();
    assert_eq!(entries.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["ok.txt"]);
    let only = CapturePolicy { include: vec!["ok.txt".into()], ..Default::default() };
    assert_eq!(capture(&mut c, only, &[]).await.unwrap().len(), 1);
    agent.stop().await;
}

#[tokio::test]
async fn secret_values_are_zeroed_before_hashing_and_in_every_blob() {
    let agent = TestAgent::start().await;
    let secret = "sk-live-7f3a9c1e55d2";
    let content = format!("config:\n  token: {secret}\n  again={secret}!\n");
    write(&agent.root, "settings.yaml", content.as_bytes());
    write(&agent.root, "secret.key", b"private material");
    let mut c = client(&agent).await;
    let policy = CapturePolicy { redact: vec!["*.key".into()], ..Default::default() };
    let entries = capture(&mut c, policy.clone(), &[secret]).await.unwrap();
    let zeroed = content.replace(secret, &"\0".repeat(secret.len()));
    let settings = entries.iter().find(|e| e.path == "settings.yaml").unwrap();
    assert_eq!(settings.sha256, sha(zeroed.as_bytes()), "the hash is of the zeroed bytes");
    assert_eq!(settings.size, content.len() as u64);

    let req = ReadBlobsRequest {
        blobs: entries.iter().map(|e| BlobRef { path: e.path.clone(), sha256: e.sha256.clone() }).collect(),
        redact_values: vec![secret.into()],
        policy: Some(policy),
    };
    let mut stream = c.read_blobs(req).await.unwrap().into_inner();
    let mut all = Vec::new();
    while let Some(msg) = stream.message().await.unwrap() {
        all.extend(msg.data);
    }
    let text = String::from_utf8_lossy(&all);
    assert!(!text.contains(secret), "no copy of the secret leaves the agent");
    assert!(!text.contains("private material"), "redacted files are zeroed");
    assert!(text.contains("token: \0\0\0"));
    agent.stop().await;
}

#[tokio::test]
async fn hostile_manifests_are_refused_with_nothing_written() {
    let agent = TestAgent::start().await;
    write(&agent.root, "existing.txt", b"before");
    let before = tree(&agent.root);
    let mut c = client(&agent).await;
    let good = b"good bytes".to_vec();
    let other = b"other".to_vec();
    let blob = |data: &Vec<u8>| (sha(data), data.clone());
    let cases: Vec<(&str, Vec<ManifestEntry>, Blobs)> = vec![
        (
            "parent escape",
            vec![file_entry("ok.txt", &other), file_entry("../x", &good)],
            vec![blob(&other), blob(&good)],
        ),
        (
            "absolute",
            vec![file_entry("ok.txt", &other), file_entry("/tmp/abs", &good)],
            vec![blob(&other), blob(&good)],
        ),
        (
            "duplicate path",
            vec![file_entry("ok.txt", &other), file_entry("ok.txt", &good)],
            vec![blob(&other), blob(&good)],
        ),
        (
            "hash mismatch",
            vec![file_entry("ok.txt", &other), file_entry("a.txt", &good)],
            vec![blob(&other), (sha(&good), b"evil bytes".to_vec())],
        ),
        ("missing blob", vec![file_entry("ok.txt", &other), file_entry("a.txt", &good)], vec![blob(&other)]),
        (
            "size lie (short)",
            vec![file_entry("ok.txt", &other), ManifestEntry { size: 4, ..file_entry("a.txt", &good) }],
            vec![blob(&other), blob(&good)],
        ),
        (
            "size lie (long)",
            vec![file_entry("ok.txt", &other), ManifestEntry { size: 40, ..file_entry("a.txt", &good) }],
            vec![blob(&other), blob(&good)],
        ),
        (
            "executable",
            vec![file_entry("ok.txt", &other), ManifestEntry { mode: 0o755, ..file_entry("a.txt", &good) }],
            vec![blob(&other), blob(&good)],
        ),
        (
            "file over an existing file's path",
            vec![file_entry("ok.txt", &other), file_entry("existing.txt/x", &good)],
            vec![blob(&other), blob(&good)],
        ),
        ("unlisted blob", vec![file_entry("ok.txt", &other)], vec![blob(&other), blob(&good)]),
    ];
    for (name, entries, blobs) in cases {
        let err = restore(&mut c, &entries, &blobs).await.expect_err(name);
        assert_eq!(err.code, ErrorCode::InvalidArgument, "{name}: {err}");
        assert_eq!(tree(&agent.root), before, "{name}: something was written");
    }
    // Nothing outside the root either.
    assert!(!agent.root.parent().unwrap().join("x").exists());
    assert!(!Path::new("/tmp/abs").exists());
    let staging: Vec<_> = std::fs::read_dir(agent.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".sandhold-restore"))
        .collect();
    assert!(staging.is_empty(), "staging dirs are removed");

    // A symlink in the way is refused too.
    std::os::unix::fs::symlink("/tmp", agent.root.join("out")).unwrap();
    let err = restore(&mut c, &[file_entry("out/x.txt", &good)], &[blob(&good)]).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err}");
    assert!(!Path::new("/tmp/x.txt").exists() || std::fs::read("/tmp/x.txt").unwrap() != good);

    // And the valid manifest goes through.
    restore(&mut c, &[file_entry("a/b.txt", &good)], &[blob(&good)]).await.unwrap();
    assert_eq!(std::fs::read(agent.root.join("a/b.txt")).unwrap(), good);
    agent.stop().await;
}
