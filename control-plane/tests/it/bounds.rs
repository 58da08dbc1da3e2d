//! Bounds (issue 17), hit on purpose against a real `sandhold serve`: what
//! a command that prints without end, or a client that reads nothing, can
//! make the server hold. Each test reads the server's peak RSS (`VmHWM` in
//! `/proc/<pid>/status`) and holds it under a stated ceiling.

use std::time::{Duration, Instant};

use sandhold_tests::provider::Kind;
use sandhold_tests::run::{definition, put_definition, run_to_end, wait_terminal};
use sandhold_tests::sandbox::ensure;
use sandhold_tests::server::TenantServer;
use sandhold_tests::wait::eventually;
use shared::proto::v1 as api;
use shared::proto::v1::snapshot_service_client::SnapshotServiceClient;

/// The peak resident set of process `pid`, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib / 1024
}

/// What a server may hold at its peak while 4 GiB of setup output pass
/// through it: its own working set (tens of MiB) plus the bounded progress
/// buffer (256 events of at most 8 KiB), far below the 4 GiB an unbounded
/// buffer holds.
const SETUP_CEILING_MIB: u64 = 256;

#[tokio::test]
async fn a_setup_step_printing_4_gib_to_a_client_that_reads_nothing_keeps_the_server_small() {
    let s = TenantServer::start("bounds-setup", &[]).await;
    let done = s.server.log.with_file_name("setup-done");
    let go = s.server.log.with_file_name("setup-go");
    let mut def = definition("def", Kind::Local);
    // 4 GiB in lines of 16 KiB (each cut at 8 KiB), then the mark; once the
    // client reads again, one line of 64 KiB.
    def.workspace = Some(api::WorkspaceDefinition {
        setup: vec![api::SetupStep {
            step: Some(api::setup_step::Step::Serial(format!(
                "yes $(head -c 16383 /dev/zero | tr '\\0' y) | head -c 4294967296; echo done > {}; \
                 while [ ! -e {} ]; do sleep 0.05; done; head -c 65536 /dev/zero | tr '\\0' z; echo",
                done.display(),
                go.display()
            ))),
        }],
        ..Default::default()
    });
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, def).await;
    let started = Instant::now();
    let mut stream = sandboxes
        .ensure_sandbox(api::EnsureSandboxRequest {
            definition_id: "def".into(),
            thread_id: "thread-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Read nothing until setup has printed everything.
    let finished = eventually(Duration::from_secs(600), || std::future::ready(done.exists())).await;
    assert!(finished, "setup did not finish: {}", s.server.log_text());
    let peak = peak_rss_mib(s.server.pid());
    eprintln!("4 GiB of setup output in {:?}; server peak RSS {peak} MiB", started.elapsed());
    assert!(peak < SETUP_CEILING_MIB, "the server's peak RSS was {peak} MiB");

    // The stream holds the first events, a note counting what it dropped,
    // the last lines (the cut one says how much it lost) and the outcome.
    let (mut lines, mut notes, mut ready) = (Vec::new(), Vec::new(), None);
    while let Some(m) = stream.message().await.unwrap() {
        if !go.exists() {
            std::fs::write(&go, b"").unwrap();
        }
        match m.event.unwrap() {
            api::ensure_sandbox_response::Event::Progress(p) if !p.output_line.is_empty() => {
                lines.push(p.output_line)
            }
            api::ensure_sandbox_response::Event::Progress(p) => notes.push(p.message),
            api::ensure_sandbox_response::Event::Ready(r) => ready = Some(r),
        }
    }
    assert!(ready.is_some(), "the ensure's outcome was not dropped");
    // What was kept is what the buffer held when the client began to read
    // plus what setup still had in flight then, not the 262144 lines.
    assert!(lines.len() < 10_000, "{} lines were kept", lines.len());
    assert_eq!(lines[0], format!("{} [{} bytes cut]", "y".repeat(8 * 1024), 16383 - 8 * 1024));
    // A note is sent each time the buffer has room again, so there may be
    // several (a short gap while the transport still took events, then the
    // long one); together they count every event that was dropped.
    let counts: Vec<u64> = notes
        .iter()
        .filter_map(|n| n.split_once(" progress events dropped").and_then(|(n, _)| n.parse().ok()))
        .collect();
    assert!(!counts.is_empty(), "no note of dropped events: {notes:?}");
    let dropped: u64 = counts.iter().sum();
    // 4 GiB / 16 KiB lines: 262144, nearly all dropped.
    assert!(dropped > 250_000, "{dropped} dropped in {counts:?}");
    let cut = lines.iter().find(|l| l.starts_with('z')).expect("the long line");
    assert_eq!(cut, &format!("{} [{} bytes cut]", "z".repeat(8 * 1024), 65536 - 8 * 1024));
}

/// What a run whose command prints 5 MiB without a newline may add to a
/// server's peak, over what the same server reached with a short run (its
/// own working set, which grows with the binary, not with the line): the
/// line is cut at 1 MiB and never held whole.
const LINE_GROWTH_MIB: u64 = 16;

#[tokio::test]
async fn a_5_mib_line_ends_the_run_with_line_too_long_at_once() {
    let s = TenantServer::start("bounds-line", &[]).await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let mut runs = s.server.runs(&s.token).await;
    run_to_end(&mut runs, "warm-up", "thread-0", "def", "echo warm").await;
    let base = peak_rss_mib(s.server.pid());
    // The command would go on for a minute after the line: the run must
    // end at the line, not when the command does.
    let script = "echo before; head -c 5242880 /dev/zero | tr '\\0' x; echo; echo after; sleep 60";
    let started = Instant::now();
    let seen = run_to_end(&mut runs, "long-line", "thread-1", "def", script).await;
    let took = started.elapsed();
    eprintln!("the run ended after {took:?}");
    assert!(seen.has_text("before") && !seen.has_text("after"), "{:?}", seen.chunks);
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(
        (terminal.r#type, terminal.error_code.as_str()),
        (api::ChunkType::RunError as i32, "LINE_TOO_LONG"),
        "{terminal:?}"
    );
    assert!(terminal.error_message.contains("longer than 1048576 bytes at byte 7"), "{terminal:?}");
    let record = wait_terminal(&mut runs, "long-line").await;
    assert_eq!(record.status, api::RunStatus::Failed as i32);
    assert_eq!(record.error.map(|e| e.code), Some("LINE_TOO_LONG".to_string()));
    assert!(took < Duration::from_secs(50), "the run waited for its command: {took:?}");
    // One follow, no reconnect loop.
    let log = s.server.log_text();
    assert!(!log.contains("follow broke; reconnecting"), "{log}");
    let peak = peak_rss_mib(s.server.pid());
    eprintln!("the server's peak RSS: {base} MiB after a short run, {peak} MiB after the long line");
    assert!(peak < base + LINE_GROWTH_MIB, "the line took the server's peak from {base} to {peak} MiB");
}

/// What a server may hold at its peak while a 1 GiB file is captured,
/// stored and restored through it: its own working set plus a few 1 MiB
/// pieces in flight (the agent's channel, the HTTP/2 windows), far below
/// the 1 GiB a server that joins a file (or a blob) holds.
const SNAPSHOT_CEILING_MIB: u64 = 256;

/// A definition with portable snapshots whose per-file maximum is
/// `max_file_bytes` (0: the operator's).
fn snapshot_definition(id: &str, max_file_bytes: u64) -> api::SandboxDefinition {
    let mut def = definition(id, Kind::Local);
    def.lifecycle = Some(api::Lifecycle {
        portable_snapshots: Some(api::PortableSnapshots {
            enabled: true,
            max_file_bytes,
            ..Default::default()
        }),
        ..Default::default()
    });
    def
}

/// A sandbox of `definition` for `thread` holding `big.bin`, a sparse
/// 1 GiB file with a mark in its middle, and `small.txt`; returns the
/// sandbox and `stat`/`sha256sum` of big.bin.
async fn sandbox_with_a_sparse_gib(
    sandboxes: &mut sandhold_tests::server::Sandboxes,
    definition: &str,
    thread: &str,
) -> (String, String) {
    let req = api::EnsureSandboxRequest {
        definition_id: definition.into(),
        thread_id: thread.into(),
        ..Default::default()
    };
    let id = ensure(sandboxes, req).await.1.unwrap().sandbox_id;
    let make = "truncate -s 1G big.bin && printf mark | dd of=big.bin bs=1 seek=536870912 conv=notrunc 2>/dev/null \
                && printf small > small.txt";
    let (code, out) = sandhold_tests::sandbox::sh(sandboxes, &id, make).await;
    assert_eq!(code, 0, "{out}");
    let (code, digest) = sandhold_tests::sandbox::sh(sandboxes, &id, PROBE).await;
    assert_eq!(code, 0, "{digest}");
    (id, digest)
}

const PROBE: &str = "stat -c %s big.bin && sha256sum big.bin && cat small.txt";

/// The blob files of the server's blob store (temp files included).
fn blob_files(data_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    walkdir::WalkDir::new(data_dir.join("snapshot-blobs"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file() && e.file_name() != "tenant")
        .map(|e| e.into_path())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_a_sparse_gib_is_refused_under_a_small_maximum_and_streamed_under_a_large_one() {
    // The operator allows 2 GiB files (above the 512 MiB default); the
    // "small" definition lowers that to 1 MiB.
    let s =
        TenantServer::start_with_args("bounds-snapshot", &[], &["--max-snapshot-file-bytes", "2147483648"])
            .await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, snapshot_definition("small", 1 << 20)).await;
    put_definition(&mut sandboxes, snapshot_definition("big", 0)).await;
    let mut snapshots = shared::sized!(SnapshotServiceClient::with_interceptor(
        s.server.channel().await,
        sandhold_tests::auth::bearer(&s.token)
    ));
    let save = |thread: &str| api::SaveSnapshotRequest {
        thread_id: thread.into(),
        run_id: "r".into(),
        label: "gib".into(),
        sandbox_id: String::new(),
    };
    let data_dir = s.server.log.parent().unwrap().to_path_buf();

    // Under 1 MiB: refused from the manifest, naming the file; nothing recorded.
    sandbox_with_a_sparse_gib(&mut sandboxes, "small", "t-small").await;
    let refused = snapshots.save_snapshot(save("t-small")).await.unwrap_err();
    let wire = shared::error::Error::from_status(&refused);
    assert_eq!(wire.code, shared::error::ErrorCode::SnapshotTooLarge, "{wire:?}");
    let meta = |k: &str| wire.metadata.get(k).cloned().unwrap_or_default();
    assert_eq!(
        (meta("path"), meta("size"), meta("max"), meta("limit")),
        (
            "big.bin".to_string(),
            "1073741824".to_string(),
            "1048576".to_string(),
            "lifecycle.portable_snapshots.max_file_bytes".to_string()
        )
    );
    let listed = snapshots.list_snapshots(api::ListSnapshotsRequest { thread_id: "t-small".into() }).await;
    assert!(listed.unwrap().into_inner().checkpoints.is_empty(), "no checkpoint recorded");
    assert_eq!(blob_files(&data_dir), Vec::<std::path::PathBuf>::new(), "no blob stored, not even small.txt");
    let peak = peak_rss_mib(s.server.pid());
    eprintln!("refused 1 GiB save: server peak RSS {peak} MiB");
    assert!(peak < SNAPSHOT_CEILING_MIB, "the server's peak RSS was {peak} MiB");

    // Under 2 GiB: saved, then restored into a new sandbox byte for byte.
    let (first, digest) = sandbox_with_a_sparse_gib(&mut sandboxes, "big", "t-big").await;
    let started = Instant::now();
    let saved = snapshots.save_snapshot(save("t-big")).await.unwrap().into_inner().checkpoint.unwrap();
    eprintln!("saved 1 GiB in {:?}", started.elapsed());
    assert_eq!(saved.uploaded_bytes, (1 << 30) + 5, "{saved:?}");
    sandboxes.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: first }).await.unwrap();
    let req = api::EnsureSandboxRequest {
        definition_id: "big".into(),
        thread_id: "t-big".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let second = ensure(&mut sandboxes, req).await.1.unwrap();
    eprintln!("restored 1 GiB in {:?}", started.elapsed());
    assert_eq!(second.restored_checkpoint_id, saved.checkpoint_id);
    let (code, restored) = sandhold_tests::sandbox::sh(&mut sandboxes, &second.sandbox_id, PROBE).await;
    assert_eq!(code, 0, "{restored}");
    assert_eq!(restored, digest, "the same size, bytes and hash");
    assert!(restored.starts_with("1073741824\n"), "{restored}");
    let peak = peak_rss_mib(s.server.pid());
    eprintln!("1 GiB saved and restored: server peak RSS {peak} MiB");
    assert!(peak < SNAPSHOT_CEILING_MIB, "the server's peak RSS was {peak} MiB");
}

#[tokio::test]
async fn exec_output_up_to_its_maximum_arrives_whole_and_a_larger_limit_is_refused() {
    let s = TenantServer::start("bounds-exec", &[]).await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let req = api::EnsureSandboxRequest {
        definition_id: "def".into(),
        thread_id: "t".into(),
        ..Default::default()
    };
    let (_, ready) = ensure(&mut sandboxes, req).await;
    let sandbox_id = ready.unwrap().sandbox_id;
    let max = shared::limits::MAX_EXEC_OUTPUT;
    let exec = |script: &str, output_limit_bytes: Option<u64>| api::ExecRequest {
        sandbox_id: sandbox_id.clone(),
        command: Some(api::Command { kind: Some(api::command::Kind::Shell(script.into())) }),
        timeout_ms: Some(60_000),
        output_limit_bytes,
        ..Default::default()
    };
    // Both streams full: far over gRPC's default 4 MiB message, within the
    // limit every hop sets.
    let script = format!("head -c {} /dev/zero; head -c {} /dev/zero >&2", max + 10, max + 10);
    let r = sandboxes.exec(exec(&script, None)).await.unwrap().into_inner();
    assert_eq!((r.stdout.len() as u64, r.stderr.len() as u64), (max, max));
    assert!(r.stdout_truncated && r.stderr_truncated);
    let status = sandboxes.exec(exec("true", Some(max + 1))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("output_limit_bytes"), "{status:?}");
}

/// A server with a 20 MB run log and 200 attaches that read nothing: each
/// costs a page of the log and an HTTP/2 window, not the log.
const ATTACH_CEILING_MIB: u64 = 320;

#[tokio::test]
async fn two_hundred_attaches_that_read_nothing_do_not_each_hold_the_log() {
    let s = TenantServer::start("bounds-attach", &[]).await;
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let mut runs = s.server.runs(&s.token).await;
    let script = "yes $(head -c 3999 /dev/zero | tr '\\0' a) | head -n 5000";
    let seen = run_to_end(&mut runs, "big-log", "thread-1", "def", script).await;
    assert_eq!(wait_terminal(&mut runs, "big-log").await.status, api::RunStatus::Completed as i32);
    let text: usize = seen.chunks.iter().map(|(_, c)| c.delta.len()).sum();
    assert!(text >= 20_000_000, "{text} bytes of text");
    let before = peak_rss_mib(s.server.pid());

    let mut streams = Vec::new();
    for _ in 0..200 {
        let req = api::AttachRunRequest { run_id: "big-log".into(), ..Default::default() };
        streams.push(runs.attach_run(req).await.unwrap().into_inner());
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak = peak_rss_mib(s.server.pid());
    eprintln!("peak RSS {before} MiB before the attaches, {peak} MiB with 200 that read nothing");
    assert!(peak < ATTACH_CEILING_MIB, "the server's peak RSS was {peak} MiB");
    // The log is still whole for a reader (on a connection of its own: the
    // 200 unread streams hold their connection's HTTP/2 window).
    let mut fresh = s.server.runs(&s.token).await;
    let req = api::AttachRunRequest { run_id: "big-log".into(), ..Default::default() };
    let mut one = fresh.attach_run(req).await.unwrap().into_inner();
    let mut got = 0usize;
    while let Some(m) = one.message().await.unwrap() {
        if let Some(api::run_event::Event::Chunk(c)) = m.event {
            got += c.chunk.map(|c| c.delta.len()).unwrap_or(0);
        }
    }
    assert_eq!(got, text);
}

/// A server driving `yes` under a 1 MiB journal cap.
const JOURNAL_CAP: u64 = 1 << 20;
/// The setup test's ceiling: what the cap bounds is the journal on disk
/// (asserted below); the server's memory must not grow with the output,
/// and a debug server's allocator arenas alone vary by tens of MiB.
const JOURNAL_CEILING_MIB: u64 = SETUP_CEILING_MIB;

/// The largest `<run_id>.ndjson` under the local sandboxes of `data_dir`.
fn journal_bytes(data_dir: &std::path::Path, run_id: &str) -> u64 {
    let Ok(sandboxes) = std::fs::read_dir(data_dir.join("sandboxes")) else { return 0 };
    let name = format!("{run_id}.{}", shared::journal::NDJSON_EXT);
    sandboxes
        .flatten()
        .filter_map(|s| std::fs::metadata(s.path().join("journal").join(&name)).ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn yes_under_a_small_journal_cap_ends_the_run_with_journal_full() {
    let s = TenantServer::start("bounds-journal", &[]).await;
    let data_dir = s.server.log.parent().unwrap().to_path_buf();
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    // Over the operator's maximum: refused, naming the field and the max.
    let over = api::SandboxDefinition { max_journal_bytes: Some(64 << 30), ..definition("def", Kind::Local) };
    let status =
        sandboxes.put_definition(api::PutDefinitionRequest { definition: Some(over) }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("max_journal_bytes")
            && status.message().contains("over the maximum of 8589934592"),
        "{status:?}"
    );
    let capped =
        api::SandboxDefinition { max_journal_bytes: Some(JOURNAL_CAP), ..definition("def", Kind::Local) };
    put_definition(&mut sandboxes, capped).await;
    let mut runs = s.server.runs(&s.token).await;

    // Watch the journal on the host while the run lasts.
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = {
        let (stop, dir) = (stop.clone(), data_dir.clone());
        tokio::spawn(async move {
            let mut largest = 0;
            while !stop.is_cancelled() {
                largest = largest.max(journal_bytes(&dir, "yes"));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            largest
        })
    };
    // Lines of 1000 bytes (1048 fit the cap, the next is cut), from a
    // `yes` whose pid the test keeps; a sleep beside it in the group.
    let pid_file = data_dir.join("yes.pid");
    let script = format!(
        "sleep 600 & echo $! > {0}.sleep; echo $$ > {0}; exec yes $(head -c 999 /dev/zero | tr '\\0' y)",
        pid_file.display()
    );
    let seen = run_to_end(&mut runs, "yes", "thread-1", "def", &script).await;
    stop.cancel();
    let largest = watcher.await.unwrap();

    let bytes = assert_full_at_the_cap(&mut runs, &seen).await;
    // The stored log is what was delivered.
    let req = api::AttachRunRequest { run_id: "yes".into(), ..Default::default() };
    let mut stored = runs.attach_run(req).await.unwrap().into_inner();
    let mut stored_bytes = 0u64;
    while let Some(m) = stored.message().await.unwrap() {
        if let Some(api::run_event::Event::Chunk(c)) = m.event {
            let c = c.chunk.unwrap();
            if c.r#type() == api::ChunkType::TextMessageContent {
                stored_bytes += c.delta.len() as u64;
            }
        }
    }
    assert_eq!(stored_bytes, bytes);
    // The journal on the host never held more than the cap and one line
    // (the cut one's newline and the sentinel).
    assert!(largest <= JOURNAL_CAP + 128, "the journal reached {largest} bytes");
    // The command's processes are gone, the sleep beside it too.
    for file in [pid_file.clone(), pid_file.with_extension("pid.sleep")] {
        let pid: u32 = std::fs::read_to_string(&file).unwrap().trim().parse().unwrap();
        let gone = eventually(Duration::from_secs(30), || {
            std::future::ready(!sandhold_tests::local::alive(pid as i32))
        })
        .await;
        assert!(gone, "process {pid} ({}) outlived the run", file.display());
    }
    let peak = peak_rss_mib(s.server.pid());
    eprintln!("yes under a 1 MiB cap: {bytes} bytes delivered; server peak RSS {peak} MiB");
    assert!(peak < JOURNAL_CEILING_MIB, "the server's peak RSS was {peak} MiB");
}

/// `seen` (1000-byte lines under a 1 MiB cap) ended with JOURNAL_FULL after
/// every whole line before the cap and nothing after it, and its record
/// says so. Returns the bytes delivered.
async fn assert_full_at_the_cap(
    runs: &mut sandhold_tests::server::Runs,
    seen: &sandhold_tests::run::Seen,
) -> u64 {
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(
        (terminal.r#type, terminal.error_code.as_str()),
        (api::ChunkType::RunError as i32, "JOURNAL_FULL"),
        "{terminal:?}"
    );
    assert!(terminal.error_message.contains("cap of 1048576 bytes"), "{terminal:?}");
    let record = wait_terminal(runs, "yes").await;
    assert_eq!(record.status, api::RunStatus::Failed as i32);
    assert_eq!(record.error.map(|e| e.code), Some("JOURNAL_FULL".to_string()));
    let text: Vec<&str> = seen
        .chunks
        .iter()
        .map(|(_, c)| c)
        .filter(|c| c.r#type() == api::ChunkType::TextMessageContent)
        .map(|c| c.delta.as_str())
        .collect();
    let bytes: u64 = text.iter().map(|d| d.len() as u64).sum();
    assert_eq!(text.len(), 1048);
    assert!(text.iter().all(|d| d.len() == 1000 && d.ends_with("y\n")));
    assert!(bytes <= JOURNAL_CAP && bytes > JOURNAL_CAP - 1000, "{bytes} bytes delivered");
    bytes
}

#[tokio::test]
async fn yes_under_a_small_journal_cap_in_docker_ends_the_run_with_journal_full() {
    if !sandhold_tests::services::docker() {
        return;
    }
    sandhold_tests::docker::ensure_test_image();
    let s = TenantServer::start("bounds-journal-docker", &[]).await;
    let _cleanup = sandhold_tests::docker::DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let capped =
        api::SandboxDefinition { max_journal_bytes: Some(JOURNAL_CAP), ..definition("def", Kind::Docker) };
    put_definition(&mut sandboxes, capped).await;
    let mut runs = s.server.runs(&s.token).await;
    // The run user in the container, under the kernel's limit the shim set.
    let script = "exec yes $(head -c 999 /dev/zero | tr '\\0' y)";
    let seen = run_to_end(&mut runs, "yes", "thread-1", "def", script).await;
    assert_full_at_the_cap(&mut runs, &seen).await;
}

/// A tmpfs of `size` mounted on `dir` (created), unmounted when dropped.
/// `None` (the test skips) unless root; under SANDHOLD_REQUIRE_SERVICES=1
/// a missing root is a failure.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Option<Self> {
        let uid = std::process::Command::new("id").arg("-u").output().unwrap();
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            assert!(!sandhold_tests::services::required(), "mounting a tmpfs needs root");
            eprintln!("skipping: mounting a tmpfs needs root");
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs on {}", dir.display());
        Some(Self(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a sandbox process the directory's cleanup kills after this
        // may still hold a file open there.
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test]
async fn a_full_disk_under_the_data_dir_ends_the_run_clearly_and_loses_no_acknowledged_chunk() {
    use sandhold_tests::run::{Seen, attach_after, read_until};
    use sandhold_tests::server::{ServerOptions, ServerProcess};
    let dir = sandhold_tests::local::TestDir::new("bounds-disk");
    let data_dir = dir.path().join("data");
    let Some(_disk) = Tmpfs::mount(&data_dir, "8m") else { return };
    let token = "tok-full-disk-0123456789";
    let opts = ServerOptions {
        data_dir: data_dir.clone(),
        tokens: vec![format!("tdisk={token}")],
        ..Default::default()
    };
    let mut server = ServerProcess::start(&opts).await;
    let mut sandboxes = server.sandboxes(token).await;
    put_definition(&mut sandboxes, definition("def", Kind::Local)).await;
    let mut runs = server.runs(token).await;
    // Numbered lines the client reads (and so the store acknowledged), then,
    // once the test says so, output until the disk (journal and database
    // alike) is full.
    let go = dir.path().join("go");
    let script = format!(
        "i=1; while [ $i -le 50 ]; do echo \"line $i\"; i=$((i+1)); done; \
         while [ ! -e {} ]; do sleep 0.05; done; exec yes $(head -c 999 /dev/zero | tr '\\0' y)",
        go.display()
    );
    let request = sandhold_tests::run::command_run("full", "thread-1", "def", &script);
    let mut stream = runs.start_run(request).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |s| s.line_numbers().len() >= 50).await.unwrap();
    std::fs::write(&go, "").unwrap();
    assert!(read_until(&mut stream, &mut seen, |_| false).await.unwrap(), "the stream ended");
    assert_eq!(seen.line_numbers(), (1..=50).collect::<Vec<_>>(), "the lines before the flood");
    let terminal = seen.terminal().expect("a terminal chunk");
    assert_eq!(
        (terminal.r#type, terminal.error_code.as_str()),
        (api::ChunkType::RunError as i32, "STORAGE_FULL"),
        "{terminal:?}\n{}",
        server.log_text()
    );
    assert!(terminal.error_message.contains("disk"), "{terminal:?}");
    // The server keeps serving, and did not retry the full disk in a loop:
    // an append while the command runs ends the run at once; only the
    // conclusion's last writes retry (a few times, as its stopped sandbox
    // frees what it held: `append_last`).
    let record = wait_terminal(&mut runs, "full").await;
    assert_eq!(record.status, api::RunStatus::Failed as i32);
    assert_eq!(record.error.map(|e| e.code), Some("STORAGE_FULL".to_string()));
    let log = server.log_text();
    let retries: Vec<&str> = log.lines().filter(|l| l.contains("append failed; retrying")).collect();
    assert!(
        retries.iter().all(|l| l.contains("run.conclude")),
        "a running append retried a full disk:\n{log}"
    );
    assert!(retries.len() <= 4, "the conclusion retried {} times, past its bound:\n{log}", retries.len());

    // After a restart every chunk the client was sent is in the stored log.
    server.kill9().await;
    let server = ServerProcess::start(&opts).await;
    let mut runs = server.runs(token).await;
    let mut stored = attach_after(&mut runs, "full", &Seen::default()).await.unwrap();
    let mut again = Seen::default();
    assert!(read_until(&mut stored, &mut again, |_| false).await.unwrap());
    assert_eq!(again.chunks, seen.chunks, "the stored log is what the client was sent");
}

/// The file `<run_id>.<ext>` of a local sandbox's journal under `data_dir`.
fn journal_file(data_dir: &std::path::Path, run_id: &str, ext: &str) -> Option<std::path::PathBuf> {
    let sandboxes = std::fs::read_dir(data_dir.join("sandboxes")).ok()?;
    sandboxes.flatten().map(|s| s.path().join("journal").join(format!("{run_id}.{ext}"))).find(|p| p.exists())
}

#[tokio::test]
async fn the_journal_cap_holds_while_no_server_runs_and_a_takeover_ends_the_run_with_journal_full() {
    use sandhold_tests::server::{ServerOptions, ServerProcess};
    let mut s = TenantServer::start("bounds-journal-away", &[]).await;
    let data_dir = s.server.log.parent().unwrap().to_path_buf();
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let capped =
        api::SandboxDefinition { max_journal_bytes: Some(JOURNAL_CAP), ..definition("def", Kind::Local) };
    put_definition(&mut sandboxes, capped).await;
    let mut runs = s.server.runs(&s.token).await;
    // The command waits for the test, which first kills the server.
    let go = data_dir.join("go");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exec yes $(head -c 999 /dev/zero | tr '\\0' y)",
        go.display()
    );
    let request = sandhold_tests::run::command_run("yes", "thread-1", "def", &script);
    let _stream = runs.start_run(request).await.unwrap().into_inner();
    let started = eventually(Duration::from_secs(60), || {
        std::future::ready(journal_file(&data_dir, "yes", "ndjson").is_some())
    })
    .await;
    assert!(started, "the run's journal never appeared: {}", s.server.log_text());
    s.server.kill9().await;
    std::fs::write(&go, "").unwrap();
    // With no server at all, the sandbox stops the command at the cap.
    let full = eventually(Duration::from_secs(60), || {
        std::future::ready(journal_file(&data_dir, "yes", "full").is_some())
    })
    .await;
    assert!(full, "the journal was never marked full");
    let journal = journal_file(&data_dir, "yes", "ndjson").unwrap();
    let on_disk = std::fs::metadata(&journal).unwrap().len();
    assert!(on_disk <= JOURNAL_CAP + 128, "the journal holds {on_disk} bytes");

    // A new server takes the run over on attach and ends it there.
    let opts =
        ServerOptions { data_dir, tokens: vec![format!("{}={}", s.tenant, s.token)], ..Default::default() };
    s.server = ServerProcess::start(&opts).await;
    let mut runs = s.server.runs(&s.token).await;
    let mut stream = sandhold_tests::run::attach_after(&mut runs, "yes", &Default::default()).await.unwrap();
    let mut seen = sandhold_tests::run::Seen::default();
    assert!(sandhold_tests::run::read_until(&mut stream, &mut seen, |_| false).await.unwrap());
    assert_full_at_the_cap(&mut runs, &seen).await;
}

/// Fill the filesystem under `dir` with one file until it refuses a byte.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write as _;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 64 * 1024];
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // What a whole block no longer fits, bytes at a time.
    while file.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
    path
}

/// A terminal status the SQLite store says it wrote is on disk. The window
/// the server met: its run's end is written while the disk is still full.
/// SQLite commits a statement's own transaction when the statement ends; a
/// write read only to its first `RETURNING` row commits at the statement's
/// reset, where a failure was lost, and the store answered with a record
/// that never reached the disk (launchbadge/sqlx#3430).
#[tokio::test]
async fn a_status_written_on_a_full_disk_is_refused_not_acknowledged_and_lost() {
    use control_plane::store::{
        Error, FIRST_EPOCH, NewRun, RunError, RunFinish, RunId, RunStatus, Stores, Timestamp,
    };
    let dir = sandhold_tests::local::TestDir::new("bounds-store-full");
    let data_dir = dir.path().join("data");
    let Some(_disk) = Tmpfs::mount(&data_dir, "2m") else { return };
    let stores = Stores::open(&control_plane::store::default_database_url(&data_dir)).await.unwrap();
    let new = NewRun::bare(RunId::parse("full").unwrap(), "tenant", "thread");
    let key = new.key();
    stores.runs.create_or_resume(new).await.unwrap();
    empty_wal(&data_dir);
    let filler = fill(&data_dir);

    let finish = || RunFinish {
        status: RunStatus::Failed,
        error: Some(RunError { code: "STORAGE_FULL".into(), message: "the disk is full".into() }),
        usage: None,
        finished_at: Timestamp::now(),
        session_id: None,
    };
    let written = stores.runs.finish(&key, FIRST_EPOCH, finish()).await;
    std::fs::remove_file(&filler).unwrap();
    assert!(matches!(written, Err(Error::StorageFull(_))), "{written:?}");
    assert_eq!(stores.runs.get(&key).await.unwrap().status, RunStatus::Running);
    // With room again, the same write lands.
    assert_eq!(stores.runs.finish(&key, FIRST_EPOCH, finish()).await.unwrap().status, RunStatus::Failed);
    assert_eq!(stores.runs.get(&key).await.unwrap().status, RunStatus::Failed);
}

/// Empty the write-ahead log of the SQLite database in `data_dir`, so the
/// next commit needs new room on the disk.
fn empty_wal(data_dir: &std::path::Path) {
    let checkpoint = std::process::Command::new("sqlite3")
        .arg(data_dir.join("sandhold.db"))
        .arg("PRAGMA wal_checkpoint(TRUNCATE)")
        .output()
        .unwrap();
    assert!(checkpoint.status.success(), "{checkpoint:?}");
    assert_eq!(std::fs::metadata(data_dir.join("sandhold.db-wal")).unwrap().len(), 0);
}

/// Appends of many runs committed as one group on a full disk: the group's
/// COMMIT fails, and so does every append in it; none is acknowledged and
/// none is in the log. With room again they land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_grouped_on_a_full_disk_are_all_refused_none_acknowledged() {
    use control_plane::store::{Error, FIRST_EPOCH, NewChunk, NewRun, RunId, Stores};
    const RUNS: usize = 8;
    let dir = sandhold_tests::local::TestDir::new("bounds-group-full");
    let data_dir = dir.path().join("data");
    let Some(_disk) = Tmpfs::mount(&data_dir, "2m") else { return };
    let stores = Stores::open(&control_plane::store::default_database_url(&data_dir)).await.unwrap();
    let mut keys = Vec::new();
    for i in 0..RUNS {
        let new = NewRun::bare(RunId::parse(&format!("full-{i}")).unwrap(), "tenant", "thread");
        keys.push(new.key());
        stores.runs.create_or_resume(new).await.unwrap();
    }
    empty_wal(&data_dir);
    let filler = fill(&data_dir);

    let batch = |i: usize| -> Vec<NewChunk> {
        (0..4).map(|k| NewChunk::new("k", format!("{i}-{k}-{}", "x".repeat(2_000)).into_bytes())).collect()
    };
    let appends = futures::future::join_all(keys.iter().enumerate().map(|(i, key)| {
        let events = stores.events.clone();
        async move { events.append(key, FIRST_EPOCH, &batch(i)).await }
    }))
    .await;
    std::fs::remove_file(&filler).unwrap();
    for (i, append) in appends.iter().enumerate() {
        assert!(matches!(append, Err(Error::StorageFull(_))), "run {i}: {append:?}");
    }
    for key in &keys {
        assert!(stores.events.snapshot(key).await.unwrap().chunks.is_empty(), "nothing of a refused group");
    }
    // With room again, the same appends land.
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(stores.events.append(key, FIRST_EPOCH, &batch(i)).await.unwrap().len(), 4);
    }
    stores.close().await;
}
