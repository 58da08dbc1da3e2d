//! `SnapshotService` through the real tonic stack: capture (policy,
//! unsupported entries, secret zeroing) and restore (hostile manifests are
//! refused with nothing written; a restore leaves the workspace equal to the
//! checkpoint outside the policy's exclusions, which stay untouched).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sandhold_tests::agent::TestAgent;
use sha2::{Digest, Sha256};
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::snapshot_service_client::SnapshotServiceClient;
use shared::proto::agent::v1::{
    BlobRef, CapturePolicy, CaptureRequest, EntryKind, ManifestEntry, ReadBlobsRequest, RestoreBlob,
    RestoreEntries, RestoreHeader, RestoreRequest, RestoreResponse, restore_request,
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

fn restore_messages(
    entries: &[ManifestEntry],
    blobs: &[(String, Vec<u8>)],
    policy: Option<CapturePolicy>,
) -> Vec<RestoreRequest> {
    let mut msgs = vec![RestoreRequest {
        request: Some(restore_request::Request::Header(RestoreHeader {
            entry_count: entries.len() as u64,
            blob_count: blobs.len() as u64,
            policy,
        })),
    }];
    msgs.push(RestoreRequest {
        request: Some(restore_request::Request::Entries(RestoreEntries { entries: entries.to_vec() })),
    });
    for (sha256, data) in blobs {
        msgs.push(RestoreRequest {
            request: Some(restore_request::Request::Blob(RestoreBlob {
                sha256: sha256.clone(),
                data: data.clone().into(),
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
    restore_under(c, entries, blobs, None).await.map(drop)
}

async fn restore_under(
    c: &mut Client,
    entries: &[ManifestEntry],
    blobs: &[(String, Vec<u8>)],
    policy: Option<CapturePolicy>,
) -> Result<RestoreResponse, Error> {
    c.restore(futures::stream::iter(restore_messages(entries, blobs, policy)))
        .await
        .map(|r| r.into_inner())
        .map_err(|s| Error::from_status(&s))
}

/// Capture `agent`'s workspace under `policy` with every blob.
async fn capture_all(agent: &TestAgent, policy: CapturePolicy) -> (Vec<ManifestEntry>, Blobs) {
    let mut c = client(agent).await;
    let entries = capture(&mut c, policy, &[]).await.unwrap();
    let blobs = read_blobs(&mut c, &entries, &[]).await.into_iter().collect();
    (entries, blobs)
}

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// Every entry below `root` with its bytes (directories as `None`, a
/// symlink as `symlink to <target>`, never followed).
fn tree(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Option<Vec<u8>>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_symlink() {
                let target = std::fs::read_link(&p).unwrap();
                out.insert(rel, Some(format!("symlink to {}", target.display()).into_bytes()));
            } else if meta.is_dir() {
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

/// A tree of many files is hashed on several threads: every entry still
/// carries its own file's size and zeroed hash (none swapped with another
/// thread's), in path order, secret values zeroed before hashing; a file
/// that cannot be captured still fails the capture naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_of_many_files_hashes_each_its_own_bytes() {
    let agent = TestAgent::start().await;
    let secret = "sk-live-0a1b2c3d4e5f";
    let mut expected = BTreeMap::new();
    for i in 0..2_000 {
        let (rel, content) = if i % 100 == 7 {
            (format!("d{}/conf-{i}.env", i % 13), format!("token={secret}\n{i}\n"))
        } else {
            (format!("d{}/sub{}/f{i}.txt", i % 13, i % 5), format!("file {i}\n").repeat(i % 50 + 1))
        };
        write(&agent.root, &rel, content.as_bytes());
        let zeroed = content.replace(secret, &"\0".repeat(secret.len()));
        expected.insert(rel, (content.len() as u64, sha(zeroed.as_bytes())));
    }
    let mut c = client(&agent).await;
    let entries = capture(&mut c, CapturePolicy::default(), &[secret]).await.unwrap();
    let files: Vec<&ManifestEntry> = entries.iter().filter(|e| e.kind == EntryKind::File as i32).collect();
    let got: BTreeMap<String, (u64, String)> =
        files.iter().map(|e| (e.path.clone(), (e.size, e.sha256.clone()))).collect();
    assert_eq!(got, expected);
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.is_sorted(), "in path order");

    // One executable file among them: refused, named.
    let bad = agent.root.join("d12/sub0/f1000.txt");
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = capture(&mut c, CapturePolicy::default(), &[secret]).await.unwrap_err();
    assert!(err.message.contains("d12/sub0/f1000.txt"), "{err:?}");
    agent.stop().await;
}

#[tokio::test]
async fn hostile_manifests_are_refused_with_nothing_written() {
    let agent = TestAgent::start().await;
    write(&agent.root, "existing.txt", b"before");
    write(&agent.root, "pkg/node_modules/a.js", b"excluded");
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
            "a directory in the way holding an excluded path",
            vec![file_entry("ok.txt", &other), file_entry("pkg", &good)],
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

    // And the valid manifest goes through: what it lacks goes, what the
    // policy excludes stays.
    restore(&mut c, &[file_entry("a/b.txt", &good)], &[blob(&good)]).await.unwrap();
    let after = tree(&agent.root);
    let paths: Vec<&str> = after.keys().map(String::as_str).collect();
    assert_eq!(paths, ["a", "a/b.txt", "pkg", "pkg/node_modules", "pkg/node_modules/a.js"]);
    assert_eq!(after["a/b.txt"].as_deref(), Some(good.as_slice()));
    agent.stop().await;
}

/// Excluded by the default policy, by path (itself or an ancestor).
fn excluded(path: &str) -> bool {
    let mut p = path;
    loop {
        if shared::snapshot::default_excluded(p) || shared::snapshot::always_excluded(p) {
            return true;
        }
        match p.rsplit_once('/') {
            Some((parent, _)) => p = parent,
            None => return false,
        }
    }
}

#[tokio::test]
async fn restore_leaves_the_workspace_equal_to_the_checkpoint_outside_exclusions() {
    let source = TestAgent::start().await;
    let target = TestAgent::start().await;
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "keep.txt", b"outside the sandbox");
    // The checkpoint.
    let s = &source.root;
    write(s, "kept.txt", b"new");
    write(s, "dir/sub/file.txt", b"deep");
    std::fs::create_dir_all(s.join("empty-dir")).unwrap();
    write(s, "x", b"x is a file now");
    write(s, "y/z.txt", b"y is a directory now");
    write(s, "web/index.html", b"<html>");
    write(s, "out/x.txt", b"in a directory where a symlink was");
    // What a new sandbox holds after provisioning.
    let t = &target.root;
    write(t, "kept.txt", b"old");
    write(t, "gone.txt", b"deleted before the checkpoint");
    write(t, "stale/deep/s.txt", b"a whole tree the checkpoint lacks");
    std::fs::create_dir_all(t.join("empty-stale")).unwrap();
    write(t, "x/inner.txt", b"a directory where the checkpoint has a file");
    write(t, "y", b"a file where the checkpoint has a directory");
    write(t, "web/old.js", b"old");
    std::os::unix::fs::symlink(outside.path(), t.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), t.join("out")).unwrap();
    // Excluded: left exactly as they are.
    write(t, ".git/HEAD", b"ref: refs/heads/main");
    write(t, "node_modules/p/i.js", b"dep");
    write(t, ".env", b"E=1");
    write(t, "stale2/node_modules/m.js", b"only excluded paths below");
    write(t, "CLAUDE.md", b"instructions");
    write(t, shared::snapshot::PROJECTION_MARKER, b"{}");
    let split = |tree: BTreeMap<String, Option<Vec<u8>>>| -> (BTreeMap<_, _>, BTreeMap<_, _>) {
        tree.into_iter().partition(|(p, _)| excluded(p))
    };
    let (excluded_before, _) = split(tree(t));

    let (entries, blobs) = capture_all(&source, CapturePolicy::default()).await;
    let mut c = client(&target).await;
    let response = restore_under(&mut c, &entries, &blobs, None).await.unwrap();
    // gone.txt, stale, empty-stale, x, y, web/old.js, link, out.
    assert_eq!((response.paths_removed, response.entries_excluded), (8, 0), "{response:?}");

    let (excluded_after, managed) = split(tree(t));
    assert_eq!(excluded_after, excluded_before, "excluded paths are untouched");
    let (_, mut expected) = split(tree(s));
    // Directories that hold only excluded paths stay.
    expected.insert(".sandhold".into(), None);
    expected.insert("stale2".into(), None);
    assert_eq!(managed, expected);
    assert_eq!(tree(outside.path()).keys().collect::<Vec<_>>(), ["keep.txt"], "no write through a link");
    // A capture of the restored workspace is the checkpoint again (plus
    // those directories, as empty ones).
    let (again, _) = capture_all(&target, CapturePolicy::default()).await;
    let extra: Vec<&str> = again.iter().filter(|e| !entries.contains(e)).map(|e| e.path.as_str()).collect();
    assert_eq!(extra, [".sandhold", "stale2"]);
    assert!(entries.iter().all(|e| again.contains(e)));
    source.stop().await;
    target.stop().await;
}

#[tokio::test]
async fn restore_writes_nothing_at_excluded_paths_and_removes_only_what_the_policy_includes() {
    let source = TestAgent::start().await;
    let target = TestAgent::start().await;
    let outside = tempfile::tempdir().unwrap();
    let s = &source.root;
    write(s, ".git/config", b"captured under a policy that kept .git");
    write(s, "node_modules/x.txt", b"would go through the link");
    write(s, "src/a.rs", b"fn a() {}");
    let keep_everything =
        CapturePolicy { exclude: vec!["nothing-is-called-this".into()], ..Default::default() };
    let (entries, blobs) = capture_all(&source, keep_everything).await;
    assert_eq!(entries.len(), 3);

    let t = &target.root;
    write(t, ".git/config", b"the sandbox's own");
    std::os::unix::fs::symlink(outside.path(), t.join("node_modules")).unwrap();
    write(t, "src/old.rs", b"included and not in the checkpoint");
    write(t, "docs/readme.md", b"not included: not the snapshot's business");
    let policy = CapturePolicy { include: vec!["src/**".into()], ..Default::default() };
    let mut c = client(&target).await;
    let response = restore_under(&mut c, &entries, &blobs, Some(policy)).await.unwrap();
    assert_eq!((response.files_written, response.entries_excluded, response.paths_removed), (1, 2, 1));
    let after = tree(t);
    assert_eq!(after[".git/config"].as_deref(), Some(&b"the sandbox's own"[..]));
    assert!(after["node_modules"].as_ref().unwrap().starts_with(b"symlink to "), "{after:?}");
    assert!(tree(outside.path()).is_empty(), "nothing written through the excluded link");
    assert_eq!(after["src/a.rs"].as_deref(), Some(&b"fn a() {}"[..]));
    assert!(!after.contains_key("src/old.rs"));
    assert_eq!(after["docs/readme.md"].as_deref(), Some(&b"not included: not the snapshot's business"[..]));
    source.stop().await;
    target.stop().await;
}
