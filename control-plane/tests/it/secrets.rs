//! Secret values never leave a sandbox, end to end: three real replicas on
//! PostgreSQL and Redis, local sandboxes (real agents), a value printed by
//! setup, by runs on stdout and stderr, split across lines, escaped into a
//! config file, in a failed run's error; two takeovers by replicas that
//! never had the value, and a checkpoint after one. Then the database
//! (every table, and `pg_dump`), the data dir (blob store, SQLite-free
//! here) and every server's log are searched for the value and its escaped
//! forms: none; the clients saw the marker.

use std::path::Path;

use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::sandbox::{contains, table_dump};
use shared::proto::v1 as api;

const LEASE_TTL_MS: u64 = 2000;
const LEASE_RENEW_MS: u64 = 500;
const MARKER: &str = "[secret:TOK]";

/// What a client saw, as text: deltas and error messages.
fn shown(seen: &Seen) -> String {
    seen.chunks.iter().map(|(_, c)| format!("{}{}\n", c.delta, c.error_message)).collect()
}

/// The value and the forms it takes escaped (what must be found nowhere).
fn forms(value: &str) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> =
        shared::mask::encoded_forms(value).into_iter().map(String::into_bytes).collect();
    // bytea columns print as hex
    out.extend(out.clone().iter().map(|f| hex::encode(f).into_bytes()).collect::<Vec<_>>());
    out
}

fn files_under(dir: &Path, skip: &str, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() && path.file_name().is_some_and(|n| n != skip) {
            files_under(&path, skip, out);
        } else if meta.is_file() {
            out.push(path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_secret_value_is_masked_everywhere_across_takeovers_and_checkpoints() {
    let Some(cluster) = sandhold_tests::cluster::Cluster::create("secrets").await else { return };
    let nonce = cluster.nonce.clone();
    let token = format!("tok-{nonce}");
    let data_dir = cluster.data_dir();
    let dir = &cluster.dir;
    let mut replicas = Vec::new();
    for i in 0..3 {
        let tokens = vec![format!("t{nonce}={token}")];
        replicas
            .push(cluster.replica(&format!("s{i}"), tokens, (LEASE_TTL_MS, LEASE_RENEW_MS), vec![]).await);
    }
    // A quote and a backslash: its JSON/TOML form differs from it.
    let value = format!("sup\"er\\secret-{nonce}");
    let (head, rest) = value.split_at(6);

    let mut def = definition("def", Kind::Local);
    def.secret_names = vec!["TOK".into()];
    def.workspace = Some(api::WorkspaceDefinition {
        setup: vec![api::SetupStep {
            step: Some(api::setup_step::Step::Serial("echo \"setup $TOK\"".into())),
        }],
        ..Default::default()
    });
    def.lifecycle = Some(api::Lifecycle {
        portable_snapshots: Some(api::PortableSnapshots { enabled: true, ..Default::default() }),
        ..Default::default()
    });
    let mut sandboxes = replicas[0].sandboxes(&token).await;
    put_definition(&mut sandboxes, def).await;
    let with_secret = |mut req: api::StartRunRequest| {
        req.secrets = [("TOK".to_string(), value.clone())].into();
        req
    };

    // A short value is refused where it is declared.
    let mut runs0 = replicas[0].runs(&token).await;
    let mut short = command_run(&format!("short-{nonce}"), "t", "def", "true");
    short.secrets = [("TOK".to_string(), "1234567".to_string())].into();
    let refused = runs0.start_run(short).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("at least 8 bytes"), "{}", refused.message());

    // Run 1, driven by replica 0 (which has the value), killed midway;
    // replica 1 (which never had it) takes it over. It prints the value
    // whole, split across lines and on stderr, then fails. The value is in
    // its command too, which the run's record keeps (masked).
    let flag = dir.path().join("go1");
    let script = format!(
        r#": '{value}'; echo "one $TOK"; printf '%s\n%s\n' "$(printf '%s' "$TOK" | cut -c1-{split})" "$(printf '%s' "$TOK" | cut -c{after}-)"; n=0; while [ ! -e {f} ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; echo "two $TOK"; echo "err $TOK" >&2; exit 3"#,
        value = value.replace('\'', r"'\''"),
        split = head.len(),
        after = head.len() + 1,
        f = flag.display()
    );
    let run1 = format!("one-{nonce}");
    let mut stream =
        runs0.start_run(with_secret(command_run(&run1, "t", "def", &script))).await.unwrap().into_inner();
    let mut seen1 = Seen::default();
    read_until(&mut stream, &mut seen1, |s| s.has_text("one ") && s.chunks.len() >= 3).await.unwrap();
    replicas[0].kill9().await;
    std::fs::write(&flag, b"").unwrap();
    let mut runs1 = replicas[1].runs(&token).await;
    let mut stream = attach_after(&mut runs1, &run1, &seen1).await.unwrap();
    read_until(&mut stream, &mut seen1, |_| false).await.unwrap();
    let record = wait_terminal(&mut runs1, &run1).await;
    assert_eq!(record.status, api::RunStatus::Failed as i32, "{record:?}");
    let text1 = shown(&seen1);
    assert!(text1.contains(&format!("one {MARKER}")), "{text1}");
    assert!(text1.contains(&format!("two {MARKER}")), "{text1}");
    assert!(text1.contains(MARKER) && text1.matches(MARKER).count() >= 4, "split value masked: {text1}");
    let error = record.error.unwrap();
    assert!(error.message.contains(&format!("err {MARKER}")), "the stderr tail, masked: {error:?}");

    // Run 2, started on replica 1 (with the value), killed midway; replica
    // 2 (never had it) takes over, the run completes, and replica 2 saves
    // the after-run checkpoint with the values the agent holds.
    let flag = dir.path().join("go2");
    let script = format!(
        r#"printf '{{"h":"%s"}}\n' "$(printf '%s' "$TOK" | sed 's/[\\"]/\\&/g')" > cfg.json; printf 'raw=%s\n' "$TOK" > raw.txt; cat cfg.json; n=0; while [ ! -e {f} ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; echo "done $TOK""#,
        f = flag.display()
    );
    let run2 = format!("two-{nonce}");
    let mut stream =
        runs1.start_run(with_secret(command_run(&run2, "t", "def", &script))).await.unwrap().into_inner();
    let mut seen2 = Seen::default();
    read_until(&mut stream, &mut seen2, |s| s.has_text("\"h\"")).await.unwrap();
    replicas[1].kill9().await;
    std::fs::write(&flag, b"").unwrap();
    let mut runs2 = replicas[2].runs(&token).await;
    let mut stream = attach_after(&mut runs2, &run2, &seen2).await.unwrap();
    read_until(&mut stream, &mut seen2, |_| false).await.unwrap();
    let record = wait_terminal(&mut runs2, &run2).await;
    assert_eq!(record.status, api::RunStatus::Completed as i32, "{record:?}");
    let text2 = shown(&seen2);
    assert!(text2.contains(&format!("{{\"h\":\"{MARKER}\"}}")), "the escaped form is masked: {text2}");
    assert!(text2.contains(&format!("done {MARKER}")), "{text2}");

    // The checkpoint of replica 2 holds the files, zeroed.
    let channel = replicas[2].channel().await;
    let mut snapshots = shared::proto::v1::snapshot_service_client::SnapshotServiceClient::with_interceptor(
        channel,
        sandhold_tests::auth::bearer(&token),
    );
    let deadline = std::time::Instant::now() + sandhold_tests::wait::PATIENCE;
    let checkpoint = loop {
        let list =
            snapshots.list_snapshots(api::ListSnapshotsRequest { thread_id: "t".into() }).await.unwrap();
        if let Some(c) = list.into_inner().checkpoints.into_iter().find(|c| c.run_id == run2) {
            break c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint after run 2:\n{}",
            replicas[2].log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let mut artifact = snapshots
        .read_artifact(api::ReadArtifactRequest {
            thread_id: "t".into(),
            checkpoint_id: checkpoint.checkpoint_id.clone(),
            path: "raw.txt".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut bytes = Vec::new();
    while let Some(m) = artifact.message().await.unwrap() {
        bytes.extend(m.data);
    }
    assert_eq!(&bytes[..4], b"raw=");
    assert!(bytes[4..bytes.len() - 1].iter().all(|b| *b == 0), "the value is zeroed: {bytes:?}");

    for r in &mut replicas {
        r.kill9().await;
    }
    // Nowhere: not in a table (chunk payloads, records, errors, blobs), not
    // in pg_dump, not in a file of the data dir outside the sandboxes, not
    // in a log.
    let mut haystacks: Vec<(String, Vec<u8>)> =
        vec![("tables".into(), table_dump(cluster.db.url()).await.into_bytes())];
    let dump = std::process::Command::new("pg_dump").arg(cluster.db.url()).output().expect("pg_dump");
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    haystacks.push(("pg_dump".into(), dump.stdout));
    let mut files = Vec::new();
    files_under(&data_dir, "sandboxes", &mut files);
    for f in files {
        haystacks.push((f.display().to_string(), std::fs::read(&f).unwrap_or_default()));
    }
    for (i, r) in replicas.iter().enumerate() {
        let log = r.log_text();
        assert!(log.contains("run finished") || i == 0, "replica {i} logged: {log}");
        haystacks.push((format!("replica {i}'s log"), log.into_bytes()));
    }
    for form in forms(&value) {
        for (what, hay) in &haystacks {
            assert!(
                !contains(hay, &form),
                "{what} holds the value (form {:?})",
                String::from_utf8_lossy(&form)
            );
        }
    }
    for needle in [head.as_bytes(), rest.as_bytes()] {
        assert!(!contains(&haystacks[0].1, needle) || needle.len() < 8, "a part of the value is in a table");
    }
    drop(replicas);
    cluster.tear_down().await;
}
