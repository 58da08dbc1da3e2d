//! Fault test of the event-log fence, with real processes: a writer process
//! appending in a loop is SIGSTOPped, another process claims the run, the
//! writer is SIGCONTed. Nothing of the old epoch may land after the claim,
//! and every append the old writer saw succeed must have landed before it.
//!
//! And group commit under `kill -9`: a process appending to many runs at
//! once (their appends sharing transactions) is SIGKILLed; every chunk it
//! had been told was stored is in the log afterwards, once, at the offset
//! it was told, and every log is contiguous.
//!
//! The child processes are this test binary again, entering
//! [`fault_child_process`] with `SANDHOLD_FAULT_ROLE` set; in a normal test
//! run that entry point does nothing.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use control_plane::store::{Error, FIRST_EPOCH, LogWriter, NewChunk, NewRun, RunId, RunKey, Stores, Tenant};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sandhold_tests::database::ScratchDatabase;

const ROLE: &str = "SANDHOLD_FAULT_ROLE";
const URL: &str = "SANDHOLD_FAULT_DATABASE_URL";
const RUN: &str = "SANDHOLD_FAULT_RUN";
/// The tenant of every run here (run ids are per tenant).
const TENANT: &str = "fault";
const BATCH: usize = 4;
const DEADLINE: Duration = Duration::from_secs(120);
/// Runs the killed writer appends to at once.
const GROUP_RUNS: usize = 64;
/// Acknowledged chunks to wait for before the kill.
const ACKS_BEFORE_KILL: usize = 3_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn batch(tag: &str) -> Vec<NewChunk> {
    (0..BATCH).map(|i| NewChunk::new("fault", format!("{tag}-{i}").into_bytes())).collect()
}

/// Protocol lines on stdout, prefixed so the test harness's own output is
/// easy to skip.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "FAULT {line}").unwrap();
    out.flush().unwrap();
}

#[test]
fn fault_child_process() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let url = std::env::var(URL).unwrap();
    let run = RunKey::new(Tenant::new(TENANT), RunId::parse(&std::env::var(RUN).unwrap()).unwrap());
    runtime().block_on(async move {
        let stores = Stores::open(&url).await.unwrap();
        match role.as_str() {
            // Append as the first driver until refused.
            "writer" => {
                let writer = LogWriter::new(stores.events.clone(), run, FIRST_EPOCH);
                for i in 0.. {
                    match writer.append(&batch(&format!("old{i}"))).await {
                        Ok(_) => say(&format!("APPENDED {i}")),
                        Err(Error::Fenced { .. }) => {
                            say("FENCED");
                            break;
                        }
                        Err(other) => panic!("writer: {other}"),
                    }
                }
            }
            // Take the run over and write one batch as its new driver.
            // Append to GROUP_RUNS runs (`<RUN>-<i>`) at once until killed,
            // saying which chunk was stored at which offset once acknowledged.
            "group-writer" => {
                let appenders: Vec<_> = (0..GROUP_RUNS)
                    .map(|i| {
                        let run = RunKey::new(
                            run.tenant.clone(),
                            RunId::parse(&format!("{}-{i}", run.run)).unwrap(),
                        );
                        let writer = LogWriter::new(stores.events.clone(), run, FIRST_EPOCH);
                        tokio::spawn(async move {
                            for n in 0.. {
                                let chunks: Vec<NewChunk> = (0..1 + (i + n) % 3)
                                    .map(|k| NewChunk::new("fault", format!("r{i}-{n}-{k}").into_bytes()))
                                    .collect();
                                let offsets = writer.append(&chunks).await.unwrap();
                                for (chunk, offset) in chunks.iter().zip(offsets) {
                                    let payload = String::from_utf8_lossy(&chunk.payload);
                                    say(&format!("ACK {i} {offset} {payload} END"));
                                }
                            }
                        })
                    })
                    .collect();
                for appender in appenders {
                    appender.await.unwrap();
                }
            }
            "claimer" => {
                let epoch = stores.runs.claim(&run).await.unwrap().driver_epoch;
                LogWriter::new(stores.events.clone(), run, epoch).append(&batch("new")).await.unwrap();
                say(&format!("CLAIMED {epoch}"));
            }
            other => panic!("unknown role {other}"),
        }
        stores.close().await;
    });
}

fn spawn_child(role: &str, url: &str, run: &RunId) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        // The test's name in this binary: its module (without the crate), then its own.
        .args(["--exact", "event_log_fault::fault_child_process", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(URL, url)
        .env(RUN, run.as_str())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The harness may have started the line ("test ... ").
            if let Some(at) = line.find("FAULT ")
                && lines_tx.send(line[at + "FAULT ".len()..].to_owned()).is_err()
            {
                break;
            }
        }
    });
    (child, lines_rx)
}

/// True once `child` exited successfully; false if it is still running
/// after `within`.
fn exited_within(child: &mut Child, what: &str, within: Duration) -> bool {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{what} exited with {status}");
            return true;
        }
        if started.elapsed() >= within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child, what: &str) {
    assert!(exited_within(child, what, DEADLINE), "{what} did not exit");
}

/// One round on its own run; `appends_before_stop` varies where the writer
/// is caught.
fn round(
    stores: &Stores,
    rt: &tokio::runtime::Runtime,
    url: &str,
    index: usize,
    appends_before_stop: usize,
    claim_stall: Duration,
) -> bool {
    let run = RunId::parse(&format!("fault-{index}")).unwrap();
    let new = NewRun::bare(run.clone(), TENANT, "fault");
    let key = new.key();
    rt.block_on(stores.runs.create_or_resume(new)).unwrap();

    let (mut writer, writer_lines) = spawn_child("writer", url, &run);
    let mut acknowledged = 0;
    while acknowledged < appends_before_stop {
        let line = writer_lines.recv_timeout(DEADLINE).expect("the writer appends");
        assert!(line.starts_with("APPENDED"), "{line}");
        acknowledged += 1;
    }
    let writer_pid = Pid::from_raw(writer.id() as i32);
    kill(writer_pid, Signal::SIGSTOP).unwrap();

    let (mut claimer, claimer_lines) = spawn_child("claimer", url, &run);
    // On PostgreSQL an append is one statement, so a stopped writer holds no
    // lock and the claim goes through while it is stopped. On SQLite the
    // writer may be stopped inside its BEGIN IMMEDIATE transaction, holding
    // the database's write lock; then the claim waits for it to resume (and
    // its batch lands before the claim, which is allowed).
    let claimed_while_stopped = exited_within(&mut claimer, "claimer", claim_stall);
    let old_at_claim = if claimed_while_stopped {
        let at_claim = rt.block_on(stores.events.snapshot(&key)).unwrap();
        Some(at_claim.chunks.iter().filter(|c| c.epoch == FIRST_EPOCH).count())
    } else {
        None
    };
    kill(writer_pid, Signal::SIGCONT).unwrap();
    wait_exit(&mut claimer, "claimer");
    let claimed = claimer_lines.recv_timeout(DEADLINE).unwrap();
    assert_eq!(claimed, format!("CLAIMED {}", FIRST_EPOCH + 1));

    wait_exit(&mut writer, "writer");
    // Until the reader thread saw EOF and hung up: after the exit it may
    // not have forwarded the last lines (`FENCED`) yet.
    let mut fenced = false;
    for line in writer_lines.iter() {
        match line.as_str() {
            "FENCED" => fenced = true,
            appended => {
                assert!(appended.starts_with("APPENDED"), "{appended}");
                acknowledged += 1;
            }
        }
    }
    assert!(fenced, "the old writer is refused once it resumes");

    let log = rt.block_on(stores.events.snapshot(&key)).unwrap();
    let old: Vec<_> = log.chunks.iter().filter(|c| c.epoch == FIRST_EPOCH).collect();
    if let Some(old_at_claim) = old_at_claim {
        assert_eq!(old.len(), old_at_claim, "round {index}: old-epoch rows landed after the claim");
    }
    assert_eq!(
        old.len(),
        acknowledged * BATCH,
        "round {index}: every acknowledged append landed, nothing else"
    );
    assert_eq!(log.chunks.len(), old.len() + BATCH, "the successor's batch is there");
    let first_new = log.chunks.iter().position(|c| c.epoch != FIRST_EPOCH).unwrap();
    assert!(
        log.chunks[first_new..].iter().all(|c| c.epoch == FIRST_EPOCH + 1),
        "round {index}: an old-epoch row follows the successor's"
    );
    claimed_while_stopped
}

/// Returns how many rounds claimed while the writer was stopped.
fn fault_rounds(url: &str, rounds: usize, claim_stall: Duration) -> usize {
    let rt = runtime();
    let stores = rt.block_on(Stores::open(url)).unwrap();
    let mut claimed_while_stopped = 0;
    for index in 0..rounds {
        // 1..=16 acknowledged appends before the stop, spread over rounds.
        if round(&stores, &rt, url, index, 1 + (index * 7) % 16, claim_stall) {
            claimed_while_stopped += 1;
        }
    }
    rt.block_on(stores.close());
    claimed_while_stopped
}

#[test]
fn stopped_writer_lands_nothing_after_a_claim_postgres() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
    let rt = runtime();
    let scratch = rt.block_on(ScratchDatabase::create(&admin_url)).unwrap();
    let claimed_while_stopped = fault_rounds(scratch.url(), 20, DEADLINE);
    assert_eq!(claimed_while_stopped, 20, "a stopped writer never holds up a claim");
    rt.block_on(scratch.drop_database()).unwrap();
}

#[test]
fn stopped_writer_lands_nothing_after_a_claim_sqlite() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = control_plane::store::default_database_url(dir.path());
    fault_rounds(&url, 5, Duration::from_secs(3));
}

/// SIGKILL a process appending to many runs at once, mid-group: what it
/// had acknowledged is stored, once, where it said; nothing is stored twice.
fn killed_mid_group_loses_nothing_acknowledged(url: &str) {
    let rt = runtime();
    let stores = rt.block_on(Stores::open(url)).unwrap();
    let keys: Vec<RunKey> = (0..GROUP_RUNS)
        .map(|i| {
            let new = NewRun::bare(RunId::parse(&format!("kill-{i}")).unwrap(), TENANT, "fault");
            let key = new.key();
            rt.block_on(stores.runs.create_or_resume(new)).unwrap();
            key
        })
        .collect();
    let (mut writer, lines) = spawn_child("group-writer", url, &RunId::parse("kill").unwrap());
    let mut acknowledged: Vec<String> = Vec::new();
    while acknowledged.len() < ACKS_BEFORE_KILL {
        acknowledged.push(lines.recv_timeout(DEADLINE).expect("the writer appends"));
    }
    kill(Pid::from_raw(writer.id() as i32), Signal::SIGKILL).unwrap();
    let status = writer.wait().unwrap();
    assert!(!status.success(), "{status}");
    // Until the reader thread saw EOF: what was printed before the kill.
    acknowledged.extend(lines.iter());

    let mut stored_at: std::collections::HashMap<(usize, String), String> = Default::default();
    for line in &acknowledged {
        // A line the kill cut short was never whole, so never acknowledged.
        let Some(line) = line.strip_suffix(" END") else { continue };
        let fields: Vec<&str> = line.split(' ').collect();
        assert!(matches!(fields.as_slice(), ["ACK", _, _, _]), "{line}");
        let run: usize = fields[1].parse().unwrap();
        let earlier = stored_at.insert((run, fields[2].to_owned()), fields[3].to_owned());
        assert!(earlier.is_none(), "offset {} of run {run} acknowledged twice", fields[2]);
    }
    assert!(stored_at.len() >= ACKS_BEFORE_KILL - 1);

    let mut stored_total = 0;
    for (i, key) in keys.iter().enumerate() {
        let log = rt.block_on(stores.events.snapshot(key)).unwrap();
        stored_total += log.chunks.len();
        let offsets: Vec<String> = log.chunks.iter().map(|c| c.offset.to_string()).collect();
        let contiguous: Vec<String> = (1..=log.chunks.len()).map(|n| n.to_string()).collect();
        assert_eq!(offsets, contiguous, "run {i}: offsets contiguous");
        let payloads: std::collections::HashSet<&[u8]> =
            log.chunks.iter().map(|c| c.payload.as_ref()).collect();
        assert_eq!(payloads.len(), log.chunks.len(), "run {i}: a chunk stored twice");
        let by_offset: std::collections::HashMap<String, &[u8]> =
            log.chunks.iter().map(|c| (c.offset.to_string(), c.payload.as_ref())).collect();
        for ((run, offset), payload) in stored_at.iter().filter(|((run, _), _)| *run == i) {
            assert_eq!(
                by_offset.get(offset).copied(),
                Some(payload.as_bytes()),
                "run {run}: acknowledged chunk {payload} at offset {offset} is not in the log"
            );
        }
    }
    assert!(stored_total >= stored_at.len());
    eprintln!("kill -9 mid-group: {} chunks acknowledged, {stored_total} stored", stored_at.len());
    rt.block_on(stores.close());
}

#[test]
fn killed_mid_group_loses_nothing_acknowledged_sqlite() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    killed_mid_group_loses_nothing_acknowledged(&control_plane::store::default_database_url(dir.path()));
}

#[test]
fn killed_mid_group_loses_nothing_acknowledged_postgres() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
    let rt = runtime();
    let scratch = rt.block_on(ScratchDatabase::create(&admin_url)).unwrap();
    killed_mid_group_loses_nothing_acknowledged(scratch.url());
    rt.block_on(scratch.drop_database()).unwrap();
}
