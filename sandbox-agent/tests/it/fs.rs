//! FsService over a real Unix socket: every RPC's success and failure paths,
//! and a table of hostile paths against every RPC with sentinels outside the
//! root that must come out untouched.

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use sandhold_tests::agent::TestAgent;
use shared::proto::agent::v1::fs_service_client::FsServiceClient;
use shared::proto::agent::v1::{
    ExistsRequest, FileType, ListDirRequest, MakeDirRequest, ReadFileRequest, RemoveRequest, RenameRequest,
    StatRequest, WriteFileHeader, WriteFileRequest, write_file_request,
};
use shared::transport::AuthedChannel;
use tonic::{Code, Status};

type Client = FsServiceClient<AuthedChannel>;

async fn client(agent: &TestAgent) -> Client {
    FsServiceClient::new(agent.channel().await)
}

async fn read(c: &mut Client, path: &str, offset: u64, limit: u64) -> Result<Vec<Vec<u8>>, Status> {
    let mut stream = c.read_file(ReadFileRequest { path: path.into(), offset, limit }).await?.into_inner();
    let mut chunks = Vec::new();
    while let Some(msg) = stream.message().await? {
        chunks.push(msg.data);
    }
    Ok(chunks)
}

async fn read_all(c: &mut Client, path: &str) -> Result<Vec<u8>, Status> {
    Ok(read(c, path, 0, 0).await?.concat())
}

fn write_messages(path: &str, data: &[u8], mode: Option<u32>, make_parents: bool) -> Vec<WriteFileRequest> {
    let mut msgs = vec![WriteFileRequest {
        request: Some(write_file_request::Request::Header(WriteFileHeader {
            path: path.into(),
            mode,
            make_parents,
            size: Some(data.len() as u64),
            end_required: false,
        })),
    }];
    for chunk in data.chunks(50_000) {
        msgs.push(WriteFileRequest { request: Some(write_file_request::Request::Data(chunk.to_vec())) });
    }
    msgs
}

async fn write(
    c: &mut Client,
    path: &str,
    data: &[u8],
    mode: Option<u32>,
    make_parents: bool,
) -> Result<u64, Status> {
    let msgs = write_messages(path, data, mode, make_parents);
    Ok(c.write_file(tokio_stream::iter(msgs)).await?.into_inner().bytes_written)
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

#[tokio::test]
async fn write_then_read_round_trips_in_64k_chunks_with_offset_and_limit() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(write(&mut c, "big.bin", &data, None, false).await.unwrap(), data.len() as u64);
    assert_eq!(std::fs::read(agent.root.join("big.bin")).unwrap(), data);

    let chunks = read(&mut c, "big.bin", 0, 0).await.unwrap();
    assert_eq!(chunks.len(), 5, "300,000 bytes in 64 KiB chunks");
    assert!(chunks.iter().all(|ch| ch.len() <= 64 * 1024));
    assert_eq!(chunks[0].len(), 64 * 1024);
    assert_eq!(chunks.concat(), data);

    let part = read(&mut c, "big.bin", 1000, 70_000).await.unwrap().concat();
    assert_eq!(part, &data[1000..71_000]);
    let tail = read(&mut c, "big.bin", 299_990, 0).await.unwrap().concat();
    assert_eq!(tail, &data[299_990..]);
    assert!(read(&mut c, "big.bin", 400_000, 0).await.unwrap().concat().is_empty());

    // Empty files exist and read as nothing.
    write(&mut c, "empty", b"", None, false).await.unwrap();
    assert_eq!(std::fs::read(agent.root.join("empty")).unwrap(), b"");
    assert!(read_all(&mut c, "empty").await.unwrap().is_empty());
    agent.stop().await;
}

#[tokio::test]
async fn write_sets_the_exact_mode_replaces_atomically_and_leaves_no_temp_files() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    write(&mut c, "default-mode", b"x", None, false).await.unwrap();
    assert_eq!(mode_of(&agent.root.join("default-mode")), 0o644);
    write(&mut c, "script.sh", b"#!/bin/sh\n", Some(0o750), false).await.unwrap();
    assert_eq!(mode_of(&agent.root.join("script.sh")), 0o750);

    std::fs::write(agent.root.join("target"), b"old").unwrap();
    write(&mut c, "target", b"new contents", Some(0o600), false).await.unwrap();
    assert_eq!(std::fs::read(agent.root.join("target")).unwrap(), b"new contents");
    assert_eq!(mode_of(&agent.root.join("target")), 0o600);

    let names: Vec<String> = std::fs::read_dir(&agent.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(".sandhold-write")), "{names:?}");
    agent.stop().await;
}

#[tokio::test]
async fn an_interrupted_write_leaves_the_target_and_the_directory_as_they_were() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    std::fs::write(agent.root.join("target"), b"old").unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    // Header announcing 1,000 bytes, then only part of them.
    let mut msgs = write_messages("target", &[b'n'; 1000], None, false);
    msgs.truncate(1);
    msgs.push(WriteFileRequest { request: Some(write_file_request::Request::Data(b"partial".to_vec())) });
    for m in msgs {
        tx.send(m).await.unwrap();
    }
    let call =
        tokio::spawn(async move { c.write_file(tokio_stream::wrappers::ReceiverStream::new(rx)).await });
    // Wait until the agent has created its temp file, then cut the call.
    let temp_exists = || {
        std::fs::read_dir(&agent.root)
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().starts_with(".sandhold-write"))
    };
    common_wait(&temp_exists, "temp file created").await;
    // Dropping the call drops the client's only channel: the connection
    // goes away mid-stream, while the request stream itself never ended
    // (`tx` is still alive).
    call.abort();
    let _ = call.await;
    common_wait(|| !temp_exists(), "temp file removed").await;
    assert_eq!(std::fs::read(agent.root.join("target")).unwrap(), b"old");
    drop(tx);
    agent.stop().await;
}

/// Poll `cond` until it holds (generous deadline for a loaded machine).
async fn common_wait(cond: impl Fn() -> bool, what: &str) {
    let within = std::time::Duration::from_secs(30);
    let held = sandhold_tests::wait::eventually(within, || std::future::ready(cond())).await;
    assert!(held, "timed out waiting for: {what}");
}

#[tokio::test]
async fn write_failures() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let e = write(&mut c, "missing/dir/f", b"x", None, false).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(!agent.root.join("missing").exists());
    write(&mut c, "missing/dir/f", b"x", None, true).await.unwrap();
    assert_eq!(std::fs::read(agent.root.join("missing/dir/f")).unwrap(), b"x");

    std::fs::create_dir(agent.root.join("adir")).unwrap();
    assert_eq!(write(&mut c, "adir", b"x", None, false).await.unwrap_err().code(), Code::FailedPrecondition);
    std::fs::write(agent.root.join("afile"), b"f").unwrap();
    assert_eq!(
        write(&mut c, "afile/child", b"x", None, true).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert_eq!(write(&mut c, "", b"x", None, false).await.unwrap_err().code(), Code::InvalidArgument);

    // A stream that ends short of (or beyond) the declared size commits nothing.
    std::fs::write(agent.root.join("kept"), b"old").unwrap();
    let mut msgs = write_messages("kept", b"0123456789", None, false);
    msgs.pop();
    msgs.push(WriteFileRequest { request: Some(write_file_request::Request::Data(b"01234".to_vec())) });
    assert_eq!(c.write_file(tokio_stream::iter(msgs)).await.unwrap_err().code(), Code::InvalidArgument);
    let mut msgs = write_messages("kept", b"0123456789", None, false);
    msgs.push(WriteFileRequest { request: Some(write_file_request::Request::Data(b"extra".to_vec())) });
    assert_eq!(c.write_file(tokio_stream::iter(msgs)).await.unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(std::fs::read(agent.root.join("kept")).unwrap(), b"old");
    // Without a size, the end of the stream commits.
    let header = WriteFileHeader { path: "unsized".into(), size: None, ..Default::default() };
    let msgs = vec![
        WriteFileRequest { request: Some(write_file_request::Request::Header(header)) },
        WriteFileRequest { request: Some(write_file_request::Request::Data(b"abc".to_vec())) },
    ];
    assert_eq!(c.write_file(tokio_stream::iter(msgs)).await.unwrap().into_inner().bytes_written, 3);
    assert_eq!(std::fs::read(agent.root.join("unsized")).unwrap(), b"abc");

    // With `end_required`, only the end message commits (a forwarder's
    // client that broke off sends none), and nothing may follow it.
    let unsized_msgs = |path: &str, end: bool, after: bool| {
        let header = WriteFileHeader { path: path.into(), end_required: true, ..Default::default() };
        let mut msgs = vec![
            WriteFileRequest { request: Some(write_file_request::Request::Header(header)) },
            WriteFileRequest { request: Some(write_file_request::Request::Data(b"new".to_vec())) },
        ];
        if end {
            msgs.push(WriteFileRequest {
                request: Some(write_file_request::Request::End(Default::default())),
            });
        }
        if after {
            msgs.push(WriteFileRequest {
                request: Some(write_file_request::Request::Data(b"more".to_vec())),
            });
        }
        msgs
    };
    let refused = c.write_file(tokio_stream::iter(unsized_msgs("kept", false, false))).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("without its end message"), "{refused:?}");
    let refused = c.write_file(tokio_stream::iter(unsized_msgs("kept", true, true))).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(std::fs::read(agent.root.join("kept")).unwrap(), b"old");
    let written = c.write_file(tokio_stream::iter(unsized_msgs("kept", true, false))).await.unwrap();
    assert_eq!(written.into_inner().bytes_written, 3);
    assert_eq!(std::fs::read(agent.root.join("kept")).unwrap(), b"new");

    // The first message must be the header.
    let msgs = vec![WriteFileRequest { request: Some(write_file_request::Request::Data(b"x".to_vec())) }];
    assert_eq!(c.write_file(tokio_stream::iter(msgs)).await.unwrap_err().code(), Code::InvalidArgument);
    agent.stop().await;
}

#[tokio::test]
async fn read_failures() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    assert_eq!(read_all(&mut c, "nope").await.unwrap_err().code(), Code::NotFound);
    std::fs::create_dir(agent.root.join("d")).unwrap();
    assert_eq!(read_all(&mut c, "d").await.unwrap_err().code(), Code::FailedPrecondition);
    agent.stop().await;
}

#[tokio::test]
async fn list_dir_reports_entries_never_follows_symlinks_and_honours_depth() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let r = &agent.root;
    std::fs::create_dir_all(r.join("d/sub/deeper")).unwrap();
    std::fs::write(r.join("d/file.txt"), b"12345").unwrap();
    std::fs::set_permissions(r.join("d/file.txt"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::write(r.join("d/sub/inner.txt"), b"x").unwrap();
    std::fs::write(r.join("d/sub/deeper/deepest.txt"), b"x").unwrap();
    symlink("sub", r.join("d/link-to-sub")).unwrap();
    symlink(agent.dir.path(), r.join("d/link-outside")).unwrap();

    let entries =
        c.list_dir(ListDirRequest { path: "d".into(), depth: 0 }).await.unwrap().into_inner().entries;
    let by_path: BTreeMap<_, _> = entries.iter().map(|e| (e.path.as_str(), e)).collect();
    assert_eq!(
        by_path.keys().copied().collect::<Vec<_>>(),
        vec!["d/file.txt", "d/link-outside", "d/link-to-sub", "d/sub"]
    );
    let file = by_path["d/file.txt"];
    assert_eq!(
        (file.name.as_str(), file.r#type(), file.size, file.mode),
        ("file.txt", FileType::File, 5, 0o640)
    );
    let expected_mtime = std::fs::metadata(r.join("d/file.txt"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert_eq!(file.mtime_ms, expected_mtime);
    assert_eq!(by_path["d/sub"].r#type(), FileType::Directory);
    let link = by_path["d/link-to-sub"];
    assert_eq!((link.r#type(), link.symlink_target.as_str()), (FileType::Symlink, "sub"));
    assert_eq!(by_path["d/link-outside"].r#type(), FileType::Symlink);

    let deep = c.list_dir(ListDirRequest { path: "d".into(), depth: 2 }).await.unwrap().into_inner().entries;
    let paths: Vec<&str> = deep.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        vec!["d/file.txt", "d/link-outside", "d/link-to-sub", "d/sub", "d/sub/deeper", "d/sub/inner.txt"],
        "depth 2 lists one level below, and never through a symlink"
    );
    let all = c.list_dir(ListDirRequest { path: "d".into(), depth: 10 }).await.unwrap().into_inner().entries;
    assert!(all.iter().any(|e| e.path == "d/sub/deeper/deepest.txt"));
    assert!(
        all.iter().all(|e| !e.path.starts_with("d/link-to-sub/") && !e.path.starts_with("d/link-outside/"))
    );

    // The root itself.
    let top = c.list_dir(ListDirRequest { path: "".into(), depth: 1 }).await.unwrap().into_inner().entries;
    assert_eq!(top.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), vec!["d"]);

    assert_eq!(
        c.list_dir(ListDirRequest { path: "nope".into(), depth: 1 }).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        c.list_dir(ListDirRequest { path: "d/file.txt".into(), depth: 1 }).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    agent.stop().await;
}

#[tokio::test]
async fn stat_follows_inside_links_lstat_does_not() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let r = &agent.root;
    std::fs::write(r.join("f"), b"abc").unwrap();
    symlink("f", r.join("link")).unwrap();
    symlink("../outside.txt", r.join("out-link")).unwrap();

    let s = c.stat(StatRequest { path: "link".into() }).await.unwrap().into_inner().info.unwrap();
    assert_eq!((s.r#type(), s.size, s.path.as_str()), (FileType::File, 3, "f"));
    let l = c.lstat(StatRequest { path: "link".into() }).await.unwrap().into_inner().info.unwrap();
    assert_eq!((l.r#type(), l.symlink_target.as_str(), l.path.as_str()), (FileType::Symlink, "f", "link"));

    // A link leading outside can be looked at, not followed.
    assert_eq!(
        c.stat(StatRequest { path: "out-link".into() }).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let l = c.lstat(StatRequest { path: "out-link".into() }).await.unwrap().into_inner().info.unwrap();
    assert_eq!((l.r#type(), l.symlink_target.as_str()), (FileType::Symlink, "../outside.txt"));

    let root = c.stat(StatRequest { path: "".into() }).await.unwrap().into_inner().info.unwrap();
    assert_eq!(root.r#type(), FileType::Directory);
    assert_eq!(c.stat(StatRequest { path: "nope".into() }).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(c.lstat(StatRequest { path: "nope".into() }).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(
        c.stat(StatRequest { path: "f/below-a-file".into() }).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    agent.stop().await;
}

#[tokio::test]
async fn make_dir_with_and_without_parents() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let mk = |path: &str, parents: bool| MakeDirRequest { path: path.into(), parents };
    c.make_dir(mk("one", false)).await.unwrap();
    assert!(agent.root.join("one").is_dir());
    assert_eq!(c.make_dir(mk("one", false)).await.unwrap_err().code(), Code::AlreadyExists);
    c.make_dir(mk("one", true)).await.unwrap();
    assert_eq!(c.make_dir(mk("a/b/c", false)).await.unwrap_err().code(), Code::NotFound);
    assert!(!agent.root.join("a").exists());
    c.make_dir(mk("a/b/c", true)).await.unwrap();
    assert!(agent.root.join("a/b/c").is_dir());
    std::fs::write(agent.root.join("file"), b"").unwrap();
    assert_eq!(c.make_dir(mk("file", true)).await.unwrap_err().code(), Code::AlreadyExists);
    assert_eq!(c.make_dir(mk("file/sub", true)).await.unwrap_err().code(), Code::FailedPrecondition);
    agent.stop().await;
}

#[tokio::test]
async fn remove_files_dirs_and_links_never_what_links_point_to() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let r = &agent.root;
    let outside = agent.dir.path().join("outside_dir");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), b"keep me").unwrap();

    std::fs::write(r.join("f"), b"").unwrap();
    c.remove(RemoveRequest { path: "f".into(), recursive: false }).await.unwrap();
    assert!(!r.join("f").exists());
    assert_eq!(
        c.remove(RemoveRequest { path: "f".into(), recursive: false }).await.unwrap_err().code(),
        Code::NotFound
    );

    std::fs::create_dir_all(r.join("tree/sub")).unwrap();
    std::fs::write(r.join("tree/sub/x"), b"").unwrap();
    // A link inside the tree pointing outside: removing the tree removes
    // the link, not the directory it points to.
    symlink(&outside, r.join("tree/sub/escape")).unwrap();
    assert_eq!(
        c.remove(RemoveRequest { path: "tree".into(), recursive: false }).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    c.remove(RemoveRequest { path: "tree".into(), recursive: true }).await.unwrap();
    assert!(!r.join("tree").exists());
    assert_eq!(std::fs::read(outside.join("secret.txt")).unwrap(), b"keep me");

    // Removing a link to a directory outside removes the link only.
    symlink(&outside, r.join("out-link")).unwrap();
    c.remove(RemoveRequest { path: "out-link".into(), recursive: true }).await.unwrap();
    assert!(std::fs::symlink_metadata(r.join("out-link")).is_err());
    assert_eq!(std::fs::read(outside.join("secret.txt")).unwrap(), b"keep me");

    std::fs::create_dir(r.join("empty")).unwrap();
    c.remove(RemoveRequest { path: "empty".into(), recursive: false }).await.unwrap();
    assert!(!r.join("empty").exists());

    for root in ["", ".", "a/.."] {
        assert_eq!(
            c.remove(RemoveRequest { path: root.into(), recursive: true }).await.unwrap_err().code(),
            Code::InvalidArgument,
            "{root:?}"
        );
    }
    assert!(r.is_dir());
    agent.stop().await;
}

#[tokio::test]
async fn rename_and_exists() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let r = &agent.root;
    std::fs::write(r.join("a"), b"A").unwrap();
    let ren = |from: &str, to: &str| RenameRequest { from: from.into(), to: to.into() };
    c.rename(ren("a", "b")).await.unwrap();
    assert!(!r.join("a").exists());
    assert_eq!(std::fs::read(r.join("b")).unwrap(), b"A");
    assert_eq!(c.rename(ren("a", "c")).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(c.rename(ren("b", "nodir/c")).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(c.rename(ren("", "x")).await.unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(c.rename(ren("b", "")).await.unwrap_err().code(), Code::InvalidArgument);
    std::fs::create_dir_all(r.join("d/inner")).unwrap();
    assert_eq!(c.rename(ren("d", "d/inner/d")).await.unwrap_err().code(), Code::InvalidArgument);
    // A link is renamed as a link.
    symlink("b", r.join("link")).unwrap();
    c.rename(ren("link", "link2")).await.unwrap();
    assert_eq!(std::fs::read_link(r.join("link2")).unwrap(), PathBuf::from("b"));

    let exists = |path: &str| ExistsRequest { path: path.into() };
    assert!(c.exists(exists("b")).await.unwrap().into_inner().exists);
    assert!(c.exists(exists("link2")).await.unwrap().into_inner().exists);
    assert!(c.exists(exists("")).await.unwrap().into_inner().exists);
    assert!(!c.exists(exists("a")).await.unwrap().into_inner().exists);
    assert!(!c.exists(exists("b/below-a-file")).await.unwrap().into_inner().exists);
    symlink("nowhere", r.join("dangling")).unwrap();
    assert!(!c.exists(exists("dangling")).await.unwrap().into_inner().exists);
    agent.stop().await;
}

/// Everything under `dir` except the sandbox root (and the agent's socket
/// and journal): names, file contents and link targets.
fn snapshot_outside(dir: &Path, root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(p: &Path, root: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for e in std::fs::read_dir(p).unwrap() {
            let path = e.unwrap().path();
            if path == root
                || path.file_name().is_some_and(|n| n == "agent.sock" || n == "journal" || n == "root")
            {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(path.clone(), format!("link {:?}", std::fs::read_link(&path).unwrap()));
            } else if meta.is_dir() {
                out.insert(path.clone(), "dir".into());
                walk(&path, root, out);
            } else {
                out.insert(path.clone(), format!("file {:?}", std::fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, root, &mut out);
    out
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, Status>, what: &str) {
    match result {
        Ok(v) => panic!("{what}: accepted ({v:?})"),
        Err(s) => assert!(
            matches!(s.code(), Code::InvalidArgument | Code::PermissionDenied),
            "{what}: wrong code {:?}: {}",
            s.code(),
            s.message()
        ),
    }
}

#[tokio::test]
async fn hostile_paths_are_refused_by_every_rpc_and_touch_nothing_outside() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let dir = agent.dir.path().canonicalize().unwrap();
    let r = &agent.root;

    // Sentinels outside the root.
    std::fs::write(dir.join("outside.txt"), b"outside sentinel").unwrap();
    std::fs::create_dir(dir.join("outside_dir")).unwrap();
    std::fs::write(dir.join("outside_dir/secret.txt"), b"secret sentinel").unwrap();
    // Traps inside the root.
    std::fs::create_dir_all(r.join("a/b")).unwrap();
    std::fs::write(r.join("safe.txt"), b"safe").unwrap();
    symlink("/", r.join("to-root")).unwrap();
    symlink("..", r.join("to-parent")).unwrap();
    symlink(&dir, r.join("parent-abs")).unwrap();
    symlink(dir.join("outside_dir"), r.join("outdir")).unwrap();
    symlink("../../outside_dir", r.join("a/outlink")).unwrap();
    symlink("a/outlink", r.join("chain2")).unwrap();
    symlink("chain2", r.join("chain1")).unwrap();
    symlink("a/b", r.join("ab")).unwrap();
    symlink("loop", r.join("loop")).unwrap();
    symlink("a/../..", r.join("dotdot")).unwrap();
    let before = snapshot_outside(&dir, r);
    let root_before = snapshot_outside(r, Path::new("/nonexistent"));
    // Where a mutating RPC would land if /etc were reachable: a name that
    // does not exist, so a broken agent cannot damage the machine.
    let etc_probe = format!("/etc/sandhold-confinement-probe-{}", uuid::Uuid::new_v4().simple());
    let d = dir.display();

    let table: Vec<(String, String)> = vec![
        ("../outside.txt".into(), "climbs out with .."),
        ("./../outside.txt".into(), "climbs out after ."),
        ("a/../../outside.txt".into(), ".. past the root"),
        ("a/b/../../../outside_dir/secret.txt".into(), "deeper .. past the root"),
        ("/etc/passwd".into(), "absolute path outside"),
        (format!("{d}/outside.txt"), "absolute path of a file outside"),
        ("/".into(), "absolute /"),
        (format!("to-root{d}/outside.txt"), "through a symlink to /"),
        ("to-root/etc/passwd".into(), "through a symlink to / (etc)"),
        ("to-parent/outside.txt".into(), "through a relative symlink to .."),
        ("parent-abs/outside.txt".into(), "through an absolute symlink outside"),
        ("outdir/secret.txt".into(), "symlinked parent dir pointing outside"),
        ("outdir/created-by-attack".into(), "new name in a symlinked dir outside"),
        ("chain1/secret.txt".into(), "symlink chain that leaves the root"),
        ("ab/../../../outside.txt".into(), ".. after a symlink"),
        ("dotdot/outside.txt".into(), "symlink whose target climbs out"),
        ("loop/x".into(), "symlink loop"),
        ("a\0b".into(), "NUL byte"),
        ("x".repeat(5000), "5,000-byte name"),
        ("y".repeat(300), "component over 255 bytes"),
    ]
    .into_iter()
    .map(|(p, why)| (p, why.to_string()))
    .collect();
    assert!(table.len() >= 15);

    for (path, why) in &table {
        // Mutating RPCs never get a real system path, see `etc_probe`.
        let mutable =
            if path.contains("/etc/passwd") || path == "/" { etc_probe.clone() } else { path.clone() };
        let what = |rpc: &str| format!("{rpc}({why}: {:?})", path.chars().take(60).collect::<String>());

        assert_refused(read_all(&mut c, path).await, &what("read"));
        assert_refused(
            c.list_dir(ListDirRequest { path: path.clone(), depth: 3 }).await.map(|r| r.into_inner()),
            &what("list"),
        );
        assert_refused(
            c.stat(StatRequest { path: path.clone() }).await.map(|r| r.into_inner()),
            &what("stat"),
        );
        assert_refused(
            c.lstat(StatRequest { path: path.clone() }).await.map(|r| r.into_inner()),
            &what("lstat"),
        );
        assert_refused(
            c.exists(ExistsRequest { path: path.clone() }).await.map(|r| r.into_inner()),
            &what("exists"),
        );
        assert_refused(write(&mut c, &mutable, b"pwned", Some(0o777), true).await, &what("write"));
        assert_refused(
            c.make_dir(MakeDirRequest { path: mutable.clone(), parents: true }).await.map(|r| r.into_inner()),
            &what("mkdir"),
        );
        assert_refused(
            c.remove(RemoveRequest { path: mutable.clone(), recursive: true }).await.map(|r| r.into_inner()),
            &what("remove"),
        );
        assert_refused(
            c.rename(RenameRequest { from: mutable.clone(), to: "moved-in".into() })
                .await
                .map(|r| r.into_inner()),
            &what("rename from"),
        );
        assert_refused(
            c.rename(RenameRequest { from: "safe.txt".into(), to: mutable.clone() })
                .await
                .map(|r| r.into_inner()),
            &what("rename to"),
        );
    }

    assert_eq!(snapshot_outside(&dir, r), before, "something outside the root changed");
    assert_eq!(
        snapshot_outside(r, Path::new("/nonexistent")),
        root_before,
        "something inside the root changed"
    );
    assert_eq!(std::fs::read(r.join("safe.txt")).unwrap(), b"safe");
    assert!(!r.join("moved-in").exists());
    assert!(!Path::new(&etc_probe).exists());
    agent.stop().await;
}

#[tokio::test]
async fn a_final_symlink_leading_outside_is_never_followed() {
    let agent = TestAgent::start().await;
    let mut c = client(&agent).await;
    let dir = agent.dir.path().canonicalize().unwrap();
    let r = &agent.root;
    std::fs::write(dir.join("outside.txt"), b"outside sentinel").unwrap();
    std::fs::create_dir(dir.join("outside_dir")).unwrap();
    std::fs::write(dir.join("outside_dir/secret.txt"), b"secret sentinel").unwrap();
    symlink("../outside.txt", r.join("up")).unwrap();
    symlink(dir.join("outside_dir"), r.join("updir")).unwrap();
    symlink(dir.join("outside_dir/not-yet"), r.join("dangling-out")).unwrap();
    let before = snapshot_outside(&dir, r);

    // Following it: refused.
    assert_refused(read_all(&mut c, "up").await, "read through link");
    assert_refused(c.stat(StatRequest { path: "up".into() }).await, "stat through link");
    assert_refused(c.exists(ExistsRequest { path: "up".into() }).await, "exists through link");
    assert_refused(write(&mut c, "up", b"pwned", None, false).await, "write through link");
    assert_refused(write(&mut c, "dangling-out", b"pwned", None, false).await, "write through dangling link");
    assert_refused(c.list_dir(ListDirRequest { path: "updir".into(), depth: 1 }).await, "list through link");
    // The entry itself: fine, and only the link is affected.
    assert_eq!(
        c.make_dir(MakeDirRequest { path: "updir".into(), parents: true }).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    let l = c.lstat(StatRequest { path: "up".into() }).await.unwrap().into_inner().info.unwrap();
    assert_eq!(l.r#type(), FileType::Symlink);
    c.rename(RenameRequest { from: "up".into(), to: "up-moved".into() }).await.unwrap();
    assert_eq!(std::fs::read_link(r.join("up-moved")).unwrap(), PathBuf::from("../outside.txt"));
    c.remove(RemoveRequest { path: "up-moved".into(), recursive: false }).await.unwrap();
    c.remove(RemoveRequest { path: "updir".into(), recursive: true }).await.unwrap();
    c.remove(RemoveRequest { path: "dangling-out".into(), recursive: false }).await.unwrap();
    assert!(std::fs::read_dir(r).unwrap().next().is_none(), "the links are gone");
    assert_eq!(snapshot_outside(&dir, r), before, "something outside the root changed");
    agent.stop().await;
}
