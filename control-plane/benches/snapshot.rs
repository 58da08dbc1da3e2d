//! Portable snapshots against `tar c | tar x` of the same tree, measured in
//! the same run, printed as a table:
//!
//! - capture: `snapshot::save` of a tree (default 200 MB in 20,000 files)
//!   from a local sandbox's agent into the SQLite + directory stores
//! - restore: `snapshot::restore` of that checkpoint into a second sandbox
//! - tar: `tar -C src -cf - . | tar -C dst -xf -`, and the same followed by
//!   `sync -f` (what it costs made durable, as a capture is; for context)
//! - second capture after changing 10 files: the bytes it stored
//!
//! `cargo bench -p control-plane --bench snapshot`; `SANDHOLD_BENCH_FILES`
//! and `SANDHOLD_BENCH_FILE_BYTES` change the tree (default 20000 x 10240).
//!
//! Everything (trees, sandboxes, stores) is on a fresh journaled ext4 file
//! system on a loop device when the bench runs as root with `mkfs.ext4`
//! (`SANDHOLD_BENCH_FRESH_FS=0` keeps it in `/tmp`): every figure here is
//! file creations, and on a file system without a journal (this machine's
//! root) each creation skips every inode freed in the last 30 s to 5 min,
//! so both sides ran up to 6x slower after whatever deleted files before
//! them (`tar` 0.47 s to 3.04 s on one tree).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use control_plane::agent::AgentClient;
use control_plane::provider::{LocalProvider, LocalProviderOptions, Provider, SandboxSpec};
use control_plane::provision::Secrets;
use control_plane::snapshot::{self, SaveRequest};
use control_plane::store::{Stores, Tenant, default_database_url};
use rand::RngCore;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `files` files of `bytes` random bytes each, 100 per directory.
fn make_tree(root: &Path, files: usize, bytes: usize) {
    let mut rng = rand::thread_rng();
    let mut buf = vec![0u8; bytes];
    for i in 0..files {
        let dir = root.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        rng.fill_bytes(&mut buf);
        std::fs::File::create(dir.join(format!("f{i:05}.dat"))).unwrap().write_all(&buf).unwrap();
    }
}

/// A fresh journaled ext4 file system on a loop device, mounted for the
/// bench's life; unmounted and its image removed on drop.
struct FreshFs {
    image: std::path::PathBuf,
    mount: std::path::PathBuf,
}

impl FreshFs {
    /// `None` (and why, on stderr) where it cannot be made.
    fn mount(under: &Path) -> Option<Self> {
        if std::env::var("SANDHOLD_BENCH_FRESH_FS").as_deref() == Ok("0") {
            return None;
        }
        // SAFETY: a plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("snapshot bench: not root, so on /tmp's file system as it is");
            return None;
        }
        let (image, mount) = (under.join("fs.img"), under.join("fs"));
        std::fs::create_dir_all(&mount).unwrap();
        // Sparse: blocks are taken as they are written.
        std::fs::File::create(&image).unwrap().set_len(8 << 30).unwrap();
        let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
            std::process::Command::new(cmd).args(args).output().map(|o| o.status.success()).unwrap_or(false)
        };
        let made = run("mkfs.ext4", &["-q".as_ref(), "-F".as_ref(), image.as_os_str()])
            && run("mount", &["-o".as_ref(), "loop".as_ref(), image.as_os_str(), mount.as_os_str()]);
        if !made {
            eprintln!("snapshot bench: no loop-mounted ext4 here, so on /tmp's file system as it is");
            let _ = std::fs::remove_file(&image);
            return None;
        }
        Some(Self { image, mount })
    }
}

impl Drop for FreshFs {
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            let mut cmd = std::process::Command::new("umount");
            if lazy {
                cmd.arg("-l");
            }
            // Busy while an agent exits: said only by the last try's failure.
            cmd.arg(&self.mount).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success())
        };
        // A sandbox's agent may still be exiting: a few tries, then lazily
        // (the loop device goes with the last user).
        let unmounted = (0..20).any(|_| {
            umount(false) || {
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        });
        if !unmounted && !umount(true) {
            eprintln!("snapshot bench: {} could not be unmounted", self.mount.display());
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

fn mb_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let files = env_or("SANDHOLD_BENCH_FILES", 20_000);
    let file_bytes = env_or("SANDHOLD_BENCH_FILE_BYTES", 10_240);
    let total = (files * file_bytes) as u64;
    let test_dir = sandhold_tests::local::TestDir::new("snapb");
    let fresh = FreshFs::mount(test_dir.path());
    let dir = fresh.as_ref().map_or(test_dir.path(), |fs| fs.mount.as_path());
    let stores = Stores::open(&default_database_url(&dir.join("data"))).await.unwrap();
    let mut options = LocalProviderOptions::new(dir.join("data"));
    options.agent_binary = Some(sandhold_tests::agent::static_agent());
    let provider = LocalProvider::new(options).unwrap();
    let spec = |key: &str| SandboxSpec { key: key.into(), tenant: "bench".into(), ..Default::default() };
    let source = provider.create(&spec("source")).await.unwrap();
    let target = provider.create(&spec("target")).await.unwrap();
    let source_agent = AgentClient::connect(&source.address, &source.token).await.unwrap();
    let target_agent = AgentClient::connect(&target.address, &target.token).await.unwrap();
    let source_root = std::path::PathBuf::from(&source_agent.handshake().root);
    make_tree(&source_root, files, file_bytes);
    let tenant = Tenant::new("bench");
    let secrets = Secrets::new();
    let save = |label: &'static str| {
        let req = SaveRequest {
            tenant: &tenant,
            thread_id: "bench",
            run_id: "",
            label,
            policy: Default::default(),
            secrets: &secrets,
            maxima: Default::default(),
        };
        snapshot::save(&stores, &source_agent, req)
    };

    // Baseline: tar of the same tree into a fresh directory.
    let tar_dst = dir.join("tar-dst");
    std::fs::create_dir_all(&tar_dst).unwrap();
    let started = Instant::now();
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("tar -C '{}' -cf - . | tar -C '{}' -xf -", source_root.display(), tar_dst.display()))
        .status()
        .unwrap();
    assert!(status.success());
    let tar = started.elapsed();
    // What the copy costs made durable, as a capture's blobs are (not the
    // goal's baseline: for context).
    let started = Instant::now();
    let synced = std::process::Command::new("sync").arg("-f").arg(&tar_dst).status().unwrap();
    assert!(synced.success());
    let tar_synced = tar + started.elapsed();

    let started = Instant::now();
    let first = save("first").await.unwrap();
    let capture = started.elapsed();

    let started = Instant::now();
    let restored =
        snapshot::restore(&stores, &target_agent, &tenant, "bench", &first.checkpoint_id, Default::default())
            .await
            .unwrap();
    let restore = started.elapsed();
    assert_eq!(restored.files_written as usize, files);

    let before = stores.blobs.stats().await.unwrap();
    for i in 0..10 {
        let path = source_root.join(format!("d{:03}/f{:05}.dat", (i * 97) / 100, i * 97));
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(b"changed").unwrap();
    }
    let started = Instant::now();
    let second = save("second").await.unwrap();
    let recapture = started.elapsed();
    let after = stores.blobs.stats().await.unwrap();

    println!(
        "portable snapshots: {files} files x {file_bytes} B = {:.0} MB (local sandboxes, SQLite + dir blobs, {})",
        total as f64 / 1e6,
        if fresh.is_some() { "on a fresh journaled ext4" } else { "in /tmp" }
    );
    println!("| operation | time | MB/s |");
    println!("|---|---:|---:|");
    println!("| `tar c \\| tar x` (baseline) | {:.2} s | {:.0} |", tar.as_secs_f64(), mb_per_s(total, tar));
    println!(
        "| the same, then `sync -f` (made durable) | {:.2} s | {:.0} |",
        tar_synced.as_secs_f64(),
        mb_per_s(total, tar_synced)
    );
    println!(
        "| capture (first save: hash + upload all) | {:.2} s | {:.0} |",
        capture.as_secs_f64(),
        mb_per_s(total, capture)
    );
    println!(
        "| restore into a new sandbox | {:.2} s | {:.0} |",
        restore.as_secs_f64(),
        mb_per_s(total, restore)
    );
    println!(
        "| capture after changing 10 files | {:.2} s | {:.0} |",
        recapture.as_secs_f64(),
        mb_per_s(total, recapture)
    );
    println!();
    println!(
        "second capture: {} bytes uploaded, blob store grew by {} bytes in {} blobs (first capture stored {} bytes)",
        second.uploaded_bytes,
        after.bytes - before.bytes,
        after.count - before.count,
        first.uploaded_bytes
    );
    let tar_rate = mb_per_s(total, tar);
    for (order, what, d) in [(70, "capture", capture), (71, "restore", restore)] {
        sandhold_tests::bench::summary(
            order,
            &format!("first portable snapshot {what} ({:.0} MB in {files} files)", total as f64 / 1e6),
            &format!("{:.0} MB/s", mb_per_s(total, d)),
            &format!("`tar c \\| tar x` {tar_rate:.0} MB/s"),
            Some(mb_per_s(total, d) / tar_rate),
            "≥ 0.5×",
        );
    }
    let _ = provider.destroy(&source.provider_id).await;
    let _ = provider.destroy(&target.provider_id).await;
    drop((source_agent, target_agent, provider, stores));
    drop(fresh);
}
