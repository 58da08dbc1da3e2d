//! The conformance suites of [`BlobStore`] (directory and PostgreSQL) and
//! [`CheckpointStore`] (SQLite and PostgreSQL), including garbage
//! collection racing saves.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use sha2::Digest;

use super::conformance::{Backend, chunks, new_run};
use super::*;

fn sha(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

// ---------------------------------------------------------------- blobs

/// A blob store under test, with a way to look at its raw storage.
struct BlobBackend {
    blobs: Arc<dyn BlobStore>,
    backend: Backend,
    _dir: Option<tempfile::TempDir>,
}

impl BlobBackend {
    async fn dir() -> Option<Self> {
        let backend = Backend::sqlite().await?;
        assert_eq!(backend.stores.blobs.backend_name(), "dir");
        Some(Self { blobs: backend.stores.blobs.clone(), backend, _dir: None })
    }

    /// A directory store writing named temp files, as on a file system
    /// without `O_TMPFILE`.
    async fn dir_named() -> Option<Self> {
        let backend = Backend::sqlite().await?;
        let dir = tempfile::tempdir().unwrap();
        let store = blob::DirBlobStore::open(dir.path()).unwrap().with_named_temp_files();
        Some(Self { blobs: Arc::new(store), backend, _dir: Some(dir) })
    }

    async fn postgres() -> Option<Self> {
        let backend = Backend::postgres().await?;
        assert_eq!(backend.stores.blobs.backend_name(), "postgres");
        Some(Self { blobs: backend.stores.blobs.clone(), backend, _dir: None })
    }

    async fn finish(self) {
        self.backend.finish().await;
    }

    /// Every byte the store keeps, concatenated.
    async fn raw_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for key in self.blobs.list().await.unwrap() {
            out.extend(read_all(self.blobs.as_ref(), &key.tenant, &key.sha256).await);
        }
        if self.blobs.backend_name() == "postgres" {
            out.extend(self.backend.raw_dump("snapshot_blobs").await.into_bytes());
        }
        out
    }
}

async fn read_all(blobs: &dyn BlobStore, tenant: &Tenant, hash: &str) -> Vec<u8> {
    let mut stream = blobs.read(tenant, hash).await.unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend(chunk.unwrap());
    }
    out
}

fn keys(t: &Tenant, hashes: &[String]) -> Vec<BlobKey> {
    hashes.iter().map(|h| BlobKey::new(t, h)).collect()
}

async fn blobs_round_trip_small_large_and_empty(b: &BlobBackend) {
    let blobs = b.blobs.as_ref();
    let acme = tenant("acme");
    let large: Vec<u8> = (0..(blob::READ_CHUNK * 2 + 123)).map(|i| (i % 251) as u8).collect();
    for data in [b"hello".to_vec(), large, Vec::new()] {
        let h = sha(&data);
        assert_eq!(blobs.missing(&acme, std::slice::from_ref(&h)).await.unwrap(), vec![h.clone()]);
        assert!(blobs.put(&acme, &h, Bytes::from(data.clone())).await.unwrap(), "newly stored");
        assert!(!blobs.put(&acme, &h, Bytes::from(data.clone())).await.unwrap(), "second put is a no-op");
        assert!(blobs.missing(&acme, std::slice::from_ref(&h)).await.unwrap().is_empty());
        assert_eq!(blobs.size(&acme, &h).await.unwrap(), data.len() as u64);
        assert_eq!(read_all(blobs, &acme, &h).await, data);
    }
    let stats = blobs.stats().await.unwrap();
    assert_eq!(stats.count, 3);
    assert_eq!(stats.bytes, 5 + (blob::READ_CHUNK * 2 + 123) as u64);
}

async fn blobs_refuse_bytes_that_do_not_match_their_name(b: &BlobBackend) {
    let blobs = b.blobs.as_ref();
    let acme = tenant("acme");
    let claimed = sha(b"the real bytes");
    let err = blobs.put(&acme, &claimed, Bytes::from_static(b"forged bytes")).await.unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
    assert!(matches!(blobs.read(&acme, &claimed).await.err(), Some(Error::NotFound(_))));
    assert!(matches!(blobs.size(&acme, &claimed).await, Err(Error::NotFound(_))));
    assert!(matches!(blobs.put(&acme, "../../etc/passwd", Bytes::new()).await, Err(Error::Invalid { .. })));
    assert!(!String::from_utf8_lossy(&b.raw_bytes().await).contains("forged bytes"));
    assert_eq!(blobs.stats().await.unwrap().count, 0);
}

async fn blobs_list_and_delete(b: &BlobBackend) {
    let blobs = b.blobs.as_ref();
    let acme = tenant("acme");
    let mut hashes = BTreeSet::new();
    for i in 0..5 {
        let data = format!("blob {i}").into_bytes();
        let h = sha(&data);
        blobs.put(&acme, &h, Bytes::from(data)).await.unwrap();
        hashes.insert(h);
    }
    let listed: BTreeSet<BlobKey> = blobs.list().await.unwrap().into_iter().collect();
    assert_eq!(listed, hashes.iter().map(|h| BlobKey::new(&acme, h)).collect());
    let gone: Vec<String> = hashes.iter().take(2).cloned().collect();
    assert_eq!(blobs.delete(&keys(&acme, &gone)).await.unwrap(), 2);
    assert_eq!(blobs.delete(&keys(&acme, &gone)).await.unwrap(), 0, "absent blobs are ignored");
    assert_eq!(blobs.missing(&acme, &gone).await.unwrap().len(), 2);
    assert_eq!(blobs.list().await.unwrap().len(), 3);
}

/// The blob de-dup oracle and the claimed hash, at the store: the same
/// bytes are two blobs for two tenants, each put, read, listed and deleted
/// on its own; tenant names that are not path-safe stay apart too.
async fn blobs_are_per_tenant(b: &BlobBackend) {
    let blobs = b.blobs.as_ref();
    let (acme, globex) = (tenant("acme"), tenant("globex"));
    let data = b"the same bytes".to_vec();
    let h = sha(&data);
    assert!(blobs.put(&acme, &h, Bytes::from(data.clone())).await.unwrap());
    // What acme stored says nothing to globex, and is not globex's to read.
    assert_eq!(blobs.missing(&globex, std::slice::from_ref(&h)).await.unwrap(), vec![h.clone()]);
    assert!(matches!(blobs.read(&globex, &h).await.err(), Some(Error::NotFound(_))));
    assert!(matches!(blobs.size(&globex, &h).await, Err(Error::NotFound(_))));
    assert!(blobs.put(&globex, &h, Bytes::from(data.clone())).await.unwrap(), "counted as globex's upload");
    assert!(!blobs.put(&globex, &h, Bytes::from(data.clone())).await.unwrap(), "dedup within a tenant");
    assert_eq!(read_all(blobs, &globex, &h).await, data);
    let listed: BTreeSet<BlobKey> = blobs.list().await.unwrap().into_iter().collect();
    assert_eq!(listed, [BlobKey::new(&acme, &h), BlobKey::new(&globex, &h)].into());
    assert_eq!(blobs.stats().await.unwrap(), BlobStats { count: 2, bytes: 2 * data.len() as u64 });

    // Deleting acme's leaves globex's.
    assert_eq!(blobs.delete(&keys(&acme, std::slice::from_ref(&h))).await.unwrap(), 1);
    assert_eq!(blobs.missing(&acme, std::slice::from_ref(&h)).await.unwrap(), vec![h.clone()]);
    assert!(blobs.missing(&globex, std::slice::from_ref(&h)).await.unwrap().is_empty());
    assert_eq!(read_all(blobs, &globex, &h).await, data);

    // Names with separators, dots or nothing at all are tenants like any other.
    let odd =
        [tenant("../globex"), tenant("a/b"), tenant(".."), tenant(""), tenant("acme%2fx"), tenant("ÄCME")];
    for (i, t) in odd.iter().enumerate() {
        let data = format!("odd {i}").into_bytes();
        assert!(blobs.put(t, &sha(&data), Bytes::from(data.clone())).await.unwrap());
        assert_eq!(read_all(blobs, t, &sha(&data)).await, data);
        for other in odd.iter().chain([&acme, &globex]).filter(|o| *o != t) {
            assert_eq!(blobs.missing(other, &[sha(&data)]).await.unwrap().len(), 1, "{t:?} vs {other:?}");
        }
    }
    let listed: BTreeSet<BlobKey> = blobs.list().await.unwrap().into_iter().collect();
    for (i, t) in odd.iter().enumerate() {
        assert!(listed.contains(&BlobKey::new(t, sha(format!("odd {i}").as_bytes()))), "{t:?} is listed");
    }
    assert_eq!(listed.len(), odd.len() + 1);
}

/// An upload in pieces: stored whole once every declared byte came and
/// hashed right; a piece past the declared size, a short upload, other
/// bytes of the right size, and an upload dropped midway store nothing
/// (and do not stand in the way of the next upload of that blob).
async fn blobs_stream_in_pieces_and_refuse_what_was_not_declared(b: &BlobBackend) {
    let blobs = b.blobs.as_ref();
    let acme = tenant("acme");
    let data: Vec<u8> = (0..(blob::READ_CHUNK + 4000)).map(|i| (i % 241) as u8).collect();
    let h = sha(&data);
    let begin = || blobs.begin_put(&acme, &h, data.len() as u64);

    // One byte more than declared: that piece is refused.
    let mut up = begin().await.unwrap();
    up.write(&data).await.unwrap();
    assert!(matches!(up.write(b"x").await, Err(Error::Invalid { .. })));
    drop(up);
    // Short of the declared size.
    let mut up = begin().await.unwrap();
    up.write(&data[..100]).await.unwrap();
    assert!(matches!(up.finish().await, Err(Error::Invalid { .. })));
    // The declared size, other bytes.
    let mut forged = data.clone();
    forged[7] ^= 1;
    let mut up = begin().await.unwrap();
    up.write(&forged).await.unwrap();
    let err = up.finish().await.unwrap_err();
    assert!(matches!(&err, Error::Invalid { reason, .. } if reason.contains("hash to")), "{err:?}");
    // Dropped midway (its save went away).
    let mut up = begin().await.unwrap();
    up.write(&data[..10]).await.unwrap();
    drop(up);
    assert_eq!(blobs.missing(&acme, std::slice::from_ref(&h)).await.unwrap(), vec![h.clone()]);
    assert_eq!(blobs.stats().await.unwrap().count, 0, "nothing of the refused uploads is stored");

    // In uneven pieces: stored, and read back whole. Two uploads of one
    // blob at once: one stores it, the other finds it stored.
    let (mut first, mut second) = (begin().await.unwrap(), begin().await.unwrap());
    for piece in data.chunks(77_777) {
        first.write(piece).await.unwrap();
        second.write(piece).await.unwrap();
    }
    assert_eq!(first.written(), data.len() as u64);
    assert!(first.finish().await.unwrap(), "newly stored");
    assert!(!second.finish().await.unwrap(), "stored already");
    assert_eq!(read_all(blobs, &acme, &h).await, data);
    assert_eq!(blobs.stats().await.unwrap(), BlobStats { count: 1, bytes: data.len() as u64 });
}

/// A save's batch: its blobs (many small ones, which the directory store
/// packs, and a large one) are stored for good once it is sealed, then
/// read, listed, counted and collected as any other; a batch dropped
/// unsealed stores nothing of what it would have stored together.
async fn blobs_of_a_batch_are_stored_once_sealed_and_collected_like_any(b: &BlobBackend) {
    let blobs = b.blobs.as_ref();
    let acme = tenant("acme");
    let mut data: Vec<Vec<u8>> =
        (0..40).map(|i| format!("small blob {i}").repeat(i + 1).into_bytes()).collect();
    data.push((0..(blob::READ_CHUNK + 10)).map(|i| (i % 239) as u8).collect());
    let hashes: Vec<String> = data.iter().map(|d| sha(d)).collect();
    let sizes: Vec<u64> = data.iter().map(|d| d.len() as u64).collect();

    // Dropped unsealed: none of the small ones is stored.
    let batch = blobs.begin_batch(&acme, &sizes).await.unwrap();
    for (h, d) in hashes.iter().zip(&data).take(5) {
        let mut up = batch.begin_put(h, d.len() as u64).await.unwrap();
        up.write(d).await.unwrap();
        assert!(up.finish().await.unwrap());
    }
    drop(batch);
    // Stored one by one (PostgreSQL) or not at all (a pack): never in part.
    let missing = blobs.missing(&acme, &hashes).await.unwrap();
    for (h, d) in hashes.iter().zip(&data) {
        if !missing.contains(h) {
            assert_eq!(read_all(blobs, &acme, h).await, *d);
        }
    }
    assert!(missing.len() >= hashes.len() - 5, "only what was finished");
    if blobs.backend_name() == "dir" {
        assert_eq!(missing, hashes, "the pack was never sealed");
    }
    blobs.delete(&keys(&acme, &hashes)).await.unwrap();

    let batch = blobs.begin_batch(&acme, &sizes).await.unwrap();
    for (h, d) in hashes.iter().zip(&data) {
        let mut up = batch.begin_put(h, d.len() as u64).await.unwrap();
        for piece in d.chunks(1000) {
            up.write(piece).await.unwrap();
        }
        assert!(up.finish().await.unwrap(), "new to the batch");
    }
    // A blob the batch has already (the save never asks twice; a store
    // takes it as stored).
    let mut again = batch.begin_put(&hashes[0], sizes[0]).await.unwrap();
    again.write(&data[0]).await.unwrap();
    assert!(!again.finish().await.unwrap());
    // Bytes that are not the name's are refused in a batch too.
    let mut forged = batch.begin_put(&sha(b"real"), 6).await.unwrap();
    forged.write(b"forged").await.unwrap();
    assert!(matches!(forged.finish().await, Err(Error::Invalid { .. })));
    batch.seal().await.unwrap();

    assert!(blobs.missing(&acme, &hashes).await.unwrap().is_empty());
    assert_eq!(blobs.missing(&tenant("globex"), &hashes).await.unwrap(), hashes, "per tenant");
    for (h, d) in hashes.iter().zip(&data) {
        assert_eq!(read_all(blobs, &acme, h).await, *d);
        assert_eq!(blobs.size(&acme, h).await.unwrap(), d.len() as u64);
    }
    let total: u64 = sizes.iter().sum();
    assert_eq!(blobs.stats().await.unwrap(), BlobStats { count: data.len() as u64, bytes: total });
    let listed: BTreeSet<BlobKey> = blobs.list().await.unwrap().into_iter().collect();
    assert_eq!(listed, keys(&acme, &hashes).into_iter().collect());
    assert!(!String::from_utf8_lossy(&b.raw_bytes().await).contains("forged"));

    // Collected in three rounds: a few, most, the rest; the others stay
    // readable after each.
    let mut left: Vec<usize> = (0..data.len()).collect();
    for round in [3usize, 30, 8] {
        let gone: Vec<usize> = left.drain(..round).collect();
        let gone_hashes: Vec<String> = gone.iter().map(|i| hashes[*i].clone()).collect();
        assert_eq!(blobs.delete(&keys(&acme, &gone_hashes)).await.unwrap(), round as u64);
        assert_eq!(blobs.missing(&acme, &gone_hashes).await.unwrap(), gone_hashes);
        for i in &left {
            assert_eq!(read_all(blobs, &acme, &hashes[*i]).await, data[*i], "round of {round}");
        }
        let bytes: u64 = left.iter().map(|i| sizes[*i]).sum();
        assert_eq!(blobs.stats().await.unwrap(), BlobStats { count: left.len() as u64, bytes });
    }
    assert!(blobs.list().await.unwrap().is_empty());
}

/// What `read_many` gave for each blob: its bytes, or its error. Each
/// blob's pieces must come together, none after its error.
async fn read_many_all(
    blobs: &Arc<dyn BlobStore>,
    t: &Tenant,
    hashes: &[String],
) -> std::collections::BTreeMap<String, Result<Vec<u8>, String>> {
    let mut out = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    let mut pieces = blobs.clone().read_many(t, hashes.to_vec());
    while let Some((sha256, piece)) = pieces.next().await {
        if current.as_ref() != Some(&sha256) {
            assert!(!out.contains_key(&sha256), "the pieces of {sha256} came apart");
            current = Some(sha256.clone());
        }
        let blob = out.entry(sha256).or_insert(Ok(Vec::new()));
        match piece {
            Ok(bytes) => blob.as_mut().expect("no piece after an error").extend_from_slice(&bytes),
            Err(e) => *blob = Err(e.to_string()),
        }
    }
    out
}

/// A restore's read of many blobs at once: each of the tenant's blobs
/// whole (packed, loose, large in pieces, empty), each once; another
/// tenant's blob and one never stored are errors, and the rest still come;
/// after a collection, the collected ones are errors.
async fn blobs_are_read_many_at_once_whole_and_once_each(b: &BlobBackend) {
    let (acme, globex) = (tenant("acme"), tenant("globex"));
    let mut data: Vec<Vec<u8>> = (0..40).map(|i| format!("blob {i}").repeat(i + 1).into_bytes()).collect();
    data.push(Vec::new());
    data.push((0..(blob::READ_CHUNK * 2 + 7)).map(|i| (i % 241) as u8).collect());
    let hashes: Vec<String> = data.iter().map(|d| sha(d)).collect();
    let sizes: Vec<u64> = data.iter().map(|d| d.len() as u64).collect();
    let batch = b.blobs.begin_batch(&acme, &sizes).await.unwrap();
    for (h, d) in hashes.iter().zip(&data) {
        let mut up = batch.begin_put(h, d.len() as u64).await.unwrap();
        up.write(d).await.unwrap();
        up.finish().await.unwrap();
    }
    batch.seal().await.unwrap();
    let loose = b"stored on its own".to_vec();
    b.blobs.put(&acme, &sha(&loose), Bytes::from(loose.clone())).await.unwrap();
    let theirs = b"globex's own".to_vec();
    b.blobs.put(&globex, &sha(&theirs), Bytes::from(theirs.clone())).await.unwrap();
    let never = sha(b"never stored");

    let mut asked = hashes.clone();
    asked.extend([sha(&loose), sha(&theirs), never.clone()]);
    asked.reverse();
    let got = read_many_all(&b.blobs, &acme, &asked).await;
    assert_eq!(got.len(), asked.len(), "every blob answered");
    for (h, d) in hashes.iter().zip(&data).chain([(&sha(&loose), &loose)]) {
        assert_eq!(got[h].as_ref(), Ok(d), "{h}");
    }
    for h in [sha(&theirs), never] {
        assert!(got[&h].as_ref().is_err_and(|e| e.contains("not found")), "{h}: {:?}", got[&h]);
    }

    let gone = &hashes[..30];
    assert_eq!(b.blobs.delete(&keys(&acme, gone)).await.unwrap(), 30);
    let got = read_many_all(&b.blobs, &acme, &hashes).await;
    assert_eq!(got.len(), hashes.len());
    for (i, (h, d)) in hashes.iter().zip(&data).enumerate() {
        if i < 30 {
            assert!(got[h].is_err(), "collected: {h}");
        } else {
            assert_eq!(got[h].as_ref(), Ok(d), "{h}");
        }
    }
}

/// Every case, in a module per backend (named by its [`BlobBackend`]
/// constructor).
macro_rules! blob_suite {
    ($(($module:ident, $backend:ident)),+ ; $cases:tt) => {
        $(blob_suite!(@one $module, $backend, $cases);)+
    };
    (@one $module:ident, $backend:ident, [$($case:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(b) = super::BlobBackend::$backend().await else { return };
                    super::$case(&b).await;
                    b.finish().await;
                }
            )*
        }
    };
}

blob_suite!(
    (blob_dir, dir), (blob_dir_named, dir_named), (blob_postgres, postgres);
    [
        blobs_round_trip_small_large_and_empty,
        blobs_refuse_bytes_that_do_not_match_their_name,
        blobs_list_and_delete,
        blobs_are_per_tenant,
        blobs_stream_in_pieces_and_refuse_what_was_not_declared,
        blobs_of_a_batch_are_stored_once_sealed_and_collected_like_any,
        blobs_are_read_many_at_once_whole_and_once_each,
    ]
);

// ---------------------------------------------------------------- checkpoints

fn tenant(name: &str) -> Tenant {
    Tenant::new(name)
}

fn new_checkpoint(label: &str, blobs: &[&str]) -> NewCheckpoint {
    NewCheckpoint {
        run_id: format!("run-{label}"),
        label: label.into(),
        manifest: format!("manifest of {label}").into_bytes(),
        blobs: blobs.iter().map(|b| sha(b.as_bytes())).collect(),
        file_count: blobs.len() as u64,
        dir_count: 0,
        total_bytes: 10,
        uploaded_bytes: 5,
    }
}

async fn save(b: &Backend, t: &Tenant, thread: &str, label: &str, blobs: &[&str]) -> Checkpoint {
    let cps = b.stores.checkpoints.as_ref();
    let claim = cps.claim_writer(t, thread).await.unwrap();
    cps.commit(&claim, new_checkpoint(label, blobs), "no-pin").await.unwrap()
}

async fn checkpoints_commit_moves_the_head_and_lists_in_order(b: &Backend) {
    let cps = b.stores.checkpoints.as_ref();
    let acme = tenant("acme");
    assert_eq!(cps.head(&acme, "t1").await.unwrap(), None);
    let first = save(b, &acme, "t1", "one", &["a"]).await;
    assert_eq!(first.parent_id, None);
    assert_eq!((first.label.as_str(), first.run_id.as_str(), first.file_count), ("one", "run-one", 1));
    let second = save(b, &acme, "t1", "two", &["a", "b"]).await;
    assert_eq!(second.parent_id.as_deref(), Some(first.checkpoint_id.as_str()));
    assert_eq!(cps.head(&acme, "t1").await.unwrap().unwrap().checkpoint_id, second.checkpoint_id);
    let listed: Vec<String> = cps.list(&acme, "t1").await.unwrap().into_iter().map(|c| c.label).collect();
    assert_eq!(listed, ["one", "two"]);
    let (got, manifest) = cps.get(&acme, "t1", &first.checkpoint_id).await.unwrap();
    assert_eq!((got, manifest), (first.clone(), b"manifest of one".to_vec()));

    // Tenant and thread scoped.
    let other = tenant("globex");
    assert!(matches!(cps.get(&other, "t1", &first.checkpoint_id).await, Err(Error::NotFound(_))));
    assert!(matches!(cps.get(&acme, "t2", &first.checkpoint_id).await, Err(Error::NotFound(_))));
    assert!(cps.list(&other, "t1").await.unwrap().is_empty());
    assert_eq!(cps.head(&other, "t1").await.unwrap(), None);
    assert!(matches!(cps.delete(&other, "t1", &first.checkpoint_id).await, Err(Error::NotFound(_))));
    assert!(matches!(cps.fork(&other, "t1", &first.checkpoint_id, "t9").await, Err(Error::NotFound(_))));

    // Deleting the head makes the newest remaining one the head.
    cps.delete(&acme, "t1", &second.checkpoint_id).await.unwrap();
    assert_eq!(cps.head(&acme, "t1").await.unwrap().unwrap().checkpoint_id, first.checkpoint_id);
    cps.delete(&acme, "t1", &first.checkpoint_id).await.unwrap();
    assert_eq!(cps.head(&acme, "t1").await.unwrap(), None);
    assert!(matches!(cps.delete(&acme, "t1", &first.checkpoint_id).await, Err(Error::NotFound(_))));
}

async fn checkpoints_a_superseded_writer_is_fenced_and_a_moved_head_is_stale(b: &Backend) {
    let cps = b.stores.checkpoints.as_ref();
    let acme = tenant("acme");
    let base = save(b, &acme, "t", "base", &["a"]).await;
    let old = cps.claim_writer(&acme, "t").await.unwrap();
    let new = cps.claim_writer(&acme, "t").await.unwrap();
    assert!(new.epoch > old.epoch);
    let err = cps.commit(&old, new_checkpoint("old", &["x"]), "p").await.unwrap_err();
    assert!(matches!(err, Error::WriterLost { .. }), "{err:?}");
    assert_eq!(shared::error::Error::from(err).code, shared::error::ErrorCode::SnapshotWriterLost);
    let won = cps.commit(&new, new_checkpoint("new", &["y"]), "p").await.unwrap();
    assert_eq!(won.parent_id.as_deref(), Some(base.checkpoint_id.as_str()));
    let err = cps.commit(&new, new_checkpoint("again", &["z"]), "p").await.unwrap_err();
    assert!(matches!(err, Error::StaleHead { .. }), "a claim commits once: {err:?}");

    // A delete moves the head under a live claim.
    let claim = cps.claim_writer(&acme, "t").await.unwrap();
    cps.delete(&acme, "t", &won.checkpoint_id).await.unwrap();
    let err = cps.commit(&claim, new_checkpoint("late", &["z"]), "p").await.unwrap_err();
    assert!(matches!(err, Error::StaleHead { .. }), "{err:?}");
    assert_eq!(shared::error::Error::from(err).code, shared::error::ErrorCode::SnapshotStaleHead);
    let labels: Vec<String> = cps.list(&acme, "t").await.unwrap().into_iter().map(|c| c.label).collect();
    assert_eq!(labels, ["base"], "nothing of a refused writer landed");
    assert!(!b.raw_dump("snapshot_checkpoints").await.contains("manifest of old"));
}

async fn checkpoints_racing_writers_one_wins(b: &Backend) {
    let acme = tenant("acme");
    for round in 0..10 {
        let thread = format!("race-{round}");
        let claims =
            futures::future::join_all((0..2).map(|_| b.stores.checkpoints.claim_writer(&acme, &thread)))
                .await;
        let commits = futures::future::join_all(claims.into_iter().enumerate().map(|(i, c)| {
            let cps = b.stores.checkpoints.clone();
            async move { cps.commit(&c.unwrap(), new_checkpoint(&format!("w{i}"), &["a"]), "p").await }
        }))
        .await;
        let won = commits.iter().filter(|c| c.is_ok()).count();
        let fenced = commits.iter().filter(|c| matches!(c, Err(Error::WriterLost { .. }))).count();
        assert_eq!((won, fenced), (1, 1), "round {round}: {commits:?}");
        assert_eq!(b.stores.checkpoints.list(&acme, &thread).await.unwrap().len(), 1);
    }
}

async fn checkpoints_fork_copies_the_chosen_checkpoint_into_an_empty_thread(b: &Backend) {
    let cps = b.stores.checkpoints.as_ref();
    let acme = tenant("acme");
    let first = save(b, &acme, "src", "first", &["a"]).await;
    let _latest = save(b, &acme, "src", "latest", &["b"]).await;
    let fork = cps.fork(&acme, "src", &first.checkpoint_id, "dst").await.unwrap();
    assert!(fork.runs.is_empty(), "the source thread has no runs");
    let copy = fork.checkpoint;
    assert_eq!(copy.thread_id, "dst");
    assert_eq!(copy.forked_from.as_deref(), Some(first.checkpoint_id.as_str()));
    assert_eq!(copy.label, "first", "the chosen checkpoint, not the latest");
    assert_eq!(cps.head(&acme, "dst").await.unwrap().unwrap().checkpoint_id, copy.checkpoint_id);
    let (_, manifest) = cps.get(&acme, "dst", &copy.checkpoint_id).await.unwrap();
    assert_eq!(manifest, b"manifest of first");

    // Not into a thread that has checkpoints, nor one that has runs.
    let err = cps.fork(&acme, "src", &first.checkpoint_id, "dst").await.unwrap_err();
    assert!(matches!(err, Error::NotEmpty(_)), "{err:?}");
    b.stores
        .runs
        .create_or_resume(NewRun {
            run_id: RunId::parse("run-in-busy").unwrap(),
            thread_id: "busy".into(),
            tenant: acme.clone(),
            sentinel_key: SentinelKey::new("k"),
            sandbox_key: None,
            started_at: Timestamp::now(),
            spec: None,
            definition_id: None,
        })
        .await
        .unwrap();
    let err = cps.fork(&acme, "src", &first.checkpoint_id, "busy").await.unwrap_err();
    assert!(matches!(err, Error::NotEmpty(_)), "{err:?}");
    assert!(cps.list(&acme, "busy").await.unwrap().is_empty(), "a refused fork leaves nothing");

    // The copy keeps its blobs alive after the source is gone.
    cps.delete(&acme, "src", &first.checkpoint_id).await.unwrap();
    let stored = keys(&acme, &[sha(b"a"), sha(b"b"), sha(b"c")]);
    let deleted = cps.sweep(stored, Duration::from_secs(3600), &|_| async { Ok(0) }.boxed()).await.unwrap();
    assert_eq!(deleted, keys(&acme, &[sha(b"c")]));
}

/// A run of `thread` started at `started_at` with `n` chunks, ended with
/// `status` (left running when not terminal).
async fn run_with_log(
    b: &Backend,
    (id, tenant_name, thread): (&str, &str, &str),
    started_at: i64,
    n: usize,
    status: RunStatus,
) -> RunRecord {
    let run = RunKey::new(tenant(tenant_name), RunId::parse(id).unwrap());
    b.stores.runs.create_or_resume(new_run(id, tenant_name, thread, started_at)).await.unwrap();
    b.stores.events.append(&run, FIRST_EPOCH, &chunks(id, n)).await.unwrap();
    if status.is_terminal() {
        let finish = RunFinish {
            session_id: Some(format!("session-of-{id}")),
            status,
            error: (status != RunStatus::Completed)
                .then(|| RunError { code: "BOOM".into(), message: format!("{id} broke") }),
            usage: Some(serde_json::json!({"input_tokens": n})),
            finished_at: Timestamp::from_millis(started_at + 500),
        };
        b.stores.runs.finish(&run, FIRST_EPOCH, finish).await.unwrap();
        b.stores.events.close(&run).await.unwrap();
    }
    b.stores.runs.get(&run).await.unwrap()
}

/// How many runs the tenant has, across threads.
async fn run_count(b: &Backend, t: &Tenant) -> usize {
    b.stores.runs.list_recent(t, 10_000).await.unwrap().len()
}

async fn checkpoints_fork_copies_the_conversation_up_to_the_checkpoint(b: &Backend) {
    let cps = b.stores.checkpoints.as_ref();
    let acme = tenant("acme");
    let now = Timestamp::now().as_millis();
    let done = run_with_log(b, ("src-done", "acme", "src"), now - 3_000, 5, RunStatus::Completed).await;
    let failed = run_with_log(b, ("src-failed", "acme", "src"), now - 2_000, 3, RunStatus::Failed).await;
    let going = run_with_log(b, ("src-going", "acme", "src"), now - 1_000, 2, RunStatus::Running).await;
    // Another tenant's run of a thread of the same name, with the same run id
    // as one of this thread's (run ids are per tenant), is not this thread's.
    run_with_log(b, ("src-done", "globex", "src"), now - 3_000, 1, RunStatus::Completed).await;
    let checkpoint = save(b, &acme, "src", "mid", &["a"]).await;
    // Started after the checkpoint was written: not part of it.
    run_with_log(b, ("src-later", "acme", "src"), now + 60_000, 4, RunStatus::Completed).await;

    let fork = cps.fork(&acme, "src", &checkpoint.checkpoint_id, "dst").await.unwrap();
    let copies = b.stores.runs.list_by_thread(&acme, "dst").await.unwrap();
    assert_eq!(copies.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(), fork.runs);
    let sources: Vec<Option<&str>> =
        copies.iter().map(|r| r.forked_from_run.as_ref().map(RunId::as_str)).collect();
    assert_eq!(
        sources,
        [Some("src-done"), Some("src-failed")],
        "ended runs up to the checkpoint, oldest first"
    );
    for (copy, source) in copies.iter().zip([&done, &failed]) {
        assert_ne!(copy.run_id, source.run_id, "a fresh id");
        assert_eq!((copy.thread_id.as_str(), &copy.tenant), ("dst", &acme));
        assert_eq!(
            (copy.status, copy.started_at, copy.finished_at, &copy.error, &copy.usage, &copy.spec),
            (
                source.status,
                source.started_at,
                source.finished_at,
                &source.error,
                &source.usage,
                &source.spec
            )
        );
        // The harness session goes with the conversation: the forked
        // thread's next run continues it.
        assert_eq!(copy.session_id, source.session_id);
        assert!(copy.session_id.is_some());
        assert_eq!((copy.sandbox_key.as_deref(), copy.detached_since), (None, None));
        assert!(copy.log_closed && !copy.cancel_requested);
        assert_ne!(copy.sentinel_key, source.sentinel_key, "a fresh sentinel key");
        assert_eq!(copy.sentinel_key.expose().len(), 64);
        let (copied, original) = (
            b.stores.events.snapshot(&copy.key()).await.unwrap(),
            b.stores.events.snapshot(&source.key()).await.unwrap(),
        );
        assert_eq!(copied.chunks, original.chunks, "the same log: offsets, epochs, kinds, payloads, times");
        assert!(copied.closed);
        // A tailing read of the copy replays the log and ends.
        let read: Vec<StoredChunk> = b
            .stores
            .events
            .read(&copy.key(), &Offset::start())
            .await
            .unwrap()
            .map(|c| c.unwrap())
            .collect()
            .await;
        assert_eq!(read, original.chunks);
        let theirs = b.stores.runs.get(&RunKey::new(tenant("globex"), copy.run_id.clone())).await;
        assert!(matches!(theirs, Err(Error::NotFound(_))), "{theirs:?}");
    }
    assert_eq!(b.stores.runs.active_run(&acme, "dst").await.unwrap(), None);
    let untouched = b.stores.runs.get(&going.key()).await.unwrap();
    assert_eq!(untouched, going, "the source is not changed");

    // A fork of the fork copies the copies, naming them.
    let again = cps.fork(&acme, "dst", &fork.checkpoint.checkpoint_id, "dst2").await.unwrap();
    let second: Vec<RunRecord> = b.stores.runs.list_by_thread(&acme, "dst2").await.unwrap();
    assert_eq!(second.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(), again.runs);
    assert_eq!(second.iter().map(|r| r.forked_from_run.clone().unwrap()).collect::<Vec<_>>(), fork.runs,);

    // Refused forks copy nothing: into a thread with runs, into one with a
    // checkpoint, and another tenant's checkpoint.
    let before = (run_count(b, &acme).await, run_count(b, &tenant("globex")).await);
    let err = cps.fork(&acme, "src", &checkpoint.checkpoint_id, "dst").await.unwrap_err();
    assert!(matches!(err, Error::NotEmpty(_)), "{err:?}");
    save(b, &acme, "has-checkpoint", "x", &["b"]).await;
    let err = cps.fork(&acme, "src", &checkpoint.checkpoint_id, "has-checkpoint").await.unwrap_err();
    assert!(matches!(err, Error::NotEmpty(_)), "{err:?}");
    let err = cps.fork(&tenant("globex"), "src", &checkpoint.checkpoint_id, "theirs").await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert_eq!((run_count(b, &acme).await, run_count(b, &tenant("globex")).await), before);
    assert!(b.stores.runs.list_by_thread(&acme, "has-checkpoint").await.unwrap().is_empty());
    assert_eq!(b.stores.runs.list_by_thread(&acme, "dst").await.unwrap(), copies);
}

async fn checkpoints_sweep_spares_referenced_and_pinned_blobs(b: &Backend) {
    let cps = b.stores.checkpoints.as_ref();
    let acme = tenant("acme");
    save(b, &acme, "t", "one", &["kept"]).await;
    cps.pin_blobs(&acme, "save-1", &[sha(b"pinned")]).await.unwrap();
    let stored = keys(&acme, &[sha(b"kept"), sha(b"pinned"), sha(b"garbage")]);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let delete = move |keys: Vec<BlobKey>| {
        let record = record.clone();
        async move {
            let n = keys.len() as u64;
            record.lock().unwrap().extend(keys);
            Ok(n)
        }
        .boxed()
    };
    assert_eq!(
        cps.sweep(stored.clone(), Duration::from_secs(3600), &delete).await.unwrap(),
        keys(&acme, &[sha(b"garbage")])
    );
    assert_eq!(*seen.lock().unwrap(), keys(&acme, &[sha(b"garbage")]));
    // An expired pin protects nothing; an unpinned blob neither.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(cps.sweep(stored.clone(), Duration::from_millis(1), &delete).await.unwrap().len(), 2);
    cps.pin_blobs(&acme, "save-2", &[sha(b"pinned")]).await.unwrap();
    cps.unpin("save-2").await.unwrap();
    let swept = cps.sweep(stored, Duration::from_secs(3600), &delete).await.unwrap();
    assert!(swept.contains(&BlobKey::new(&acme, sha(b"pinned"))));
}

/// One tenant's checkpoints and pins keep its own blobs only: the same
/// bytes stored by another tenant, unreferenced there, are garbage.
async fn checkpoints_sweep_decides_per_tenant(b: &Backend) {
    let cps = b.stores.checkpoints.as_ref();
    let (acme, globex) = (tenant("acme"), tenant("globex"));
    save(b, &acme, "t", "one", &["shared"]).await;
    cps.pin_blobs(&globex, "save-g", &[sha(b"pinned")]).await.unwrap();
    let stored = vec![
        BlobKey::new(&acme, sha(b"shared")),
        BlobKey::new(&globex, sha(b"shared")),
        BlobKey::new(&acme, sha(b"pinned")),
        BlobKey::new(&globex, sha(b"pinned")),
    ];
    let mut swept = cps.sweep(stored, Duration::from_secs(3600), &|_| async { Ok(0) }.boxed()).await.unwrap();
    swept.sort();
    assert_eq!(swept, [BlobKey::new(&acme, sha(b"pinned")), BlobKey::new(&globex, sha(b"shared"))]);
}

/// Garbage collection of one tenant's blob, through the real blob store,
/// leaves another tenant's copy of the same bytes, and the other way round.
async fn checkpoints_collecting_one_tenants_blob_leaves_anothers(b: &Backend) {
    let (acme, globex) = (tenant("acme"), tenant("globex"));
    let (blobs, cps) = (b.stores.blobs.clone(), b.stores.checkpoints.as_ref());
    let data = Bytes::from_static(b"both tenants wrote this");
    let h = sha(&data);
    for t in [&acme, &globex] {
        blobs.put(t, &h, data.clone()).await.unwrap();
    }
    let claim = cps.claim_writer(&globex, "t").await.unwrap();
    let mut new = new_checkpoint("g", &[]);
    new.blobs = vec![h.clone()];
    let theirs = cps.commit(&claim, new, "no-pin").await.unwrap();
    let delete = |keys: Vec<BlobKey>| {
        let blobs = blobs.clone();
        async move { blobs.delete(&keys).await }.boxed()
    };
    let swept = cps.sweep(blobs.list().await.unwrap(), Duration::from_secs(3600), &delete).await.unwrap();
    assert_eq!(swept, [BlobKey::new(&acme, &h)], "acme's is unreferenced");
    assert_eq!(blobs.missing(&acme, std::slice::from_ref(&h)).await.unwrap(), std::slice::from_ref(&h));
    assert_eq!(blobs.size(&globex, &h).await.unwrap(), data.len() as u64, "globex's stays");

    // acme stores it again and references it; globex drops its checkpoint.
    blobs.put(&acme, &h, data.clone()).await.unwrap();
    let claim = cps.claim_writer(&acme, "t").await.unwrap();
    let mut new = new_checkpoint("a", &[]);
    new.blobs = vec![h.clone()];
    cps.commit(&claim, new, "no-pin").await.unwrap();
    cps.delete(&globex, "t", &theirs.checkpoint_id).await.unwrap();
    let swept = cps.sweep(blobs.list().await.unwrap(), Duration::from_secs(3600), &delete).await.unwrap();
    assert_eq!(swept, [BlobKey::new(&globex, &h)]);
    assert_eq!(blobs.size(&acme, &h).await.unwrap(), data.len() as u64, "acme's stays");
}

/// A save (pin, ask what is missing, upload, commit) racing a sweep: the
/// committed checkpoint's blob is always there afterwards.
async fn checkpoints_sweep_racing_a_save_never_loses_a_committed_blob(b: &Backend) {
    let acme = tenant("acme");
    let blobs = b.stores.blobs.clone();
    let cps = b.stores.checkpoints.clone();
    for round in 0..20 {
        let data = format!("round {round}").into_bytes();
        let h = sha(&data);
        // Left unreferenced by an earlier, deleted checkpoint.
        blobs.put(&acme, &h, Bytes::from(data.clone())).await.unwrap();
        let saving = {
            let (blobs, cps, acme, h, data) =
                (blobs.clone(), cps.clone(), acme.clone(), h.clone(), data.clone());
            tokio::spawn(async move {
                let pin = format!("pin-{round}");
                let claim = cps.claim_writer(&acme, "gc").await.unwrap();
                cps.pin_blobs(&acme, &pin, std::slice::from_ref(&h)).await.unwrap();
                for missing in blobs.missing(&acme, std::slice::from_ref(&h)).await.unwrap() {
                    blobs.put(&acme, &missing, Bytes::from(data.clone())).await.unwrap();
                }
                let mut new = new_checkpoint("gc", &[]);
                new.blobs = vec![h];
                cps.commit(&claim, new, &pin).await.unwrap();
            })
        };
        let sweeping = {
            let (blobs, cps) = (blobs.clone(), cps.clone());
            tokio::spawn(async move {
                let stored = blobs.list().await.unwrap();
                let delete = |keys: Vec<BlobKey>| {
                    let blobs = blobs.clone();
                    async move { blobs.delete(&keys).await }.boxed()
                };
                cps.sweep(stored, Duration::from_secs(3600), &delete).await.unwrap()
            })
        };
        saving.await.unwrap();
        sweeping.await.unwrap();
        assert!(
            blobs.missing(&acme, std::slice::from_ref(&h)).await.unwrap().is_empty(),
            "round {round}: blob lost"
        );
        // Unreference it again for the next round.
        let head = cps.head(&acme, "gc").await.unwrap().unwrap();
        cps.delete(&acme, "gc", &head.checkpoint_id).await.unwrap();
    }
}

macro_rules! checkpoint_suite {
    ($($case:ident),* $(,)?) => {
        mod checkpoints_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(b) = super::Backend::sqlite().await else { return };
                    super::$case(&b).await;
                    b.finish().await;
                }
            )*
        }
        mod checkpoints_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(b) = super::Backend::postgres().await else { return };
                    super::$case(&b).await;
                    b.finish().await;
                }
            )*
        }
    };
}

checkpoint_suite!(
    checkpoints_commit_moves_the_head_and_lists_in_order,
    checkpoints_a_superseded_writer_is_fenced_and_a_moved_head_is_stale,
    checkpoints_racing_writers_one_wins,
    checkpoints_fork_copies_the_chosen_checkpoint_into_an_empty_thread,
    checkpoints_fork_copies_the_conversation_up_to_the_checkpoint,
    checkpoints_sweep_spares_referenced_and_pinned_blobs,
    checkpoints_sweep_decides_per_tenant,
    checkpoints_collecting_one_tenants_blob_leaves_anothers,
    checkpoints_sweep_racing_a_save_never_loses_a_committed_blob,
);
