//! Packs: the small blobs of one save in one file, so the first save of a
//! tree of small files makes a few files durable instead of one per blob
//! (each durable file creation is a journal commit the save waits on).
//!
//! A pack is `<tenant dir>/packs/<id>.pack`: the blobs' bytes one after
//! another, then an index (per blob its SHA-256, offset and length), then
//! a trailer (magic, entry count, the index's offset). It is written
//! unnamed (or under a temp name), made durable, and only then linked in
//! by name, so a pack that exists is whole and a crash leaves none half
//! made. A pack never changes. Blobs collected from it are listed in
//! `<id>.dead` (replaced whole, by rename); a pack whose blobs are all dead
//! is removed, and one whose bytes are half dead is rewritten with its
//! live blobs (the new pack linked before the old one goes, so a crash
//! between leaves a blob twice, never nowhere).
//!
//! Readers keep each tenant's [`TenantPacks`] (which pack holds which live
//! blob) and read a tenant's directory again whenever an answer depends on
//! it being current: before saying which blobs are missing, on a blob not
//! found, and on a pack gone since (another process may share the
//! directory). Pack indexes are read once: a pack never changes.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::file::TempBlob;
use super::io;
use crate::store::{Error, Result};

/// The directory of a tenant's packs, under its blob directory.
pub(super) const PACKS: &str = "packs";

/// A blob's name, as bytes.
pub(super) type Hash = [u8; 32];

const MAGIC: &[u8; 8] = b"SHPACK01";
/// An index entry: hash, offset, length.
const ENTRY: usize = 32 + 8 + 8;
/// Magic, entry count, the index's offset.
const TRAILER: usize = 8 + 8 + 8;
/// What the writer gathers before one positional write of it.
const WRITE_BUFFER: usize = 4 << 20;

/// The hash named by a checked hex SHA-256.
pub(super) fn hash_of(sha256: &str) -> Hash {
    let mut out = [0u8; 32];
    hex::decode_to_slice(sha256, &mut out).expect("names are checked hex SHA-256");
    out
}

/// One blob in a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    hash: Hash,
    offset: u64,
    len: u64,
}

/// A pack's index, as read from its file.
#[derive(Debug)]
struct PackIndex {
    entries: Vec<Entry>,
    /// The bytes of all its blobs.
    data: u64,
}

/// Where a live blob is.
#[derive(Debug, Clone)]
pub(super) struct Location {
    pub pack: Arc<Path>,
    pub offset: u64,
    pub len: u64,
}

/// Identifies one version of a dead list (replaced by rename: a new inode).
type FileId = (u64, u64, u64);

fn file_id(meta: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino(), meta.len())
}

/// One tenant's packs, as last read from its directory.
#[derive(Debug, Default)]
pub(super) struct TenantPacks {
    packs: HashMap<String, Arc<PackIndex>>,
    dead: HashMap<String, (FileId, Arc<HashSet<Hash>>)>,
    live: HashMap<Hash, Location>,
}

impl TenantPacks {
    /// Where the live blob `hash` is, if a pack holds it.
    pub fn get(&self, hash: &Hash) -> Option<&Location> {
        self.live.get(hash)
    }

    /// Whether it has a pack (live blobs or not).
    pub fn has_packs(&self) -> bool {
        !self.packs.is_empty()
    }

    /// Every live blob, with its length.
    pub fn live(&self) -> impl Iterator<Item = (&Hash, u64)> {
        self.live.iter().map(|(h, l)| (h, l.len))
    }
}

/// Read `dir` (a tenant's packs directory) again, reusing the indexes of
/// `previous` for the packs still there. Blocking.
pub(super) fn scan(dir: &Path, previous: Option<&TenantPacks>) -> Result<TenantPacks> {
    let mut out = TenantPacks::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = name.strip_suffix(".pack") {
            let known = previous.and_then(|p| p.packs.get(id)).cloned();
            let index = match known {
                Some(index) => index,
                None => match read_index(&entry.path()) {
                    Ok(index) => Arc::new(index),
                    // Gone since the listing (collected meanwhile).
                    Err(Error::NotFound(_)) => continue,
                    Err(e) => {
                        // Its blobs are missing to saves, which store them again.
                        tracing::warn!(pack = %entry.path().display(), error = %e, "a snapshot blob pack is unreadable; skipped");
                        continue;
                    }
                },
            };
            out.packs.insert(id.to_string(), index);
        } else if let Some(id) = name.strip_suffix(".dead") {
            let Ok(meta) = entry.metadata() else { continue };
            let fid = file_id(&meta);
            let known = previous.and_then(|p| p.dead.get(id)).filter(|(known, _)| *known == fid);
            let dead = match known {
                Some((_, dead)) => dead.clone(),
                None => match std::fs::read(entry.path()) {
                    Ok(bytes) => {
                        Arc::new(bytes.chunks_exact(32).map(|h| h.try_into().expect("32 bytes")).collect())
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io(&entry.path(), e)),
                },
            };
            out.dead.insert(id.to_string(), (fid, dead));
        }
    }
    for (id, index) in &out.packs {
        let dead = out.dead.get(id).map(|(_, d)| d.as_ref());
        let pack: Arc<Path> = Arc::from(dir.join(format!("{id}.pack")));
        for e in &index.entries {
            if dead.is_some_and(|d| d.contains(&e.hash)) {
                continue;
            }
            let at = Location { pack: pack.clone(), offset: e.offset, len: e.len };
            out.live.entry(e.hash).or_insert(at);
        }
    }
    Ok(out)
}

/// The pack at `path`, opened; [`Error::NotFound`] when it is gone
/// (collected since it was listed or looked up).
fn open(path: &Path) -> Result<std::fs::File> {
    std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(format!("pack {}", path.display())),
        _ => io(path, e),
    })
}

fn read_index(path: &Path) -> Result<PackIndex> {
    let file = open(path)?;
    let size = file.metadata().map_err(|e| io(path, e))?.len();
    let corrupt = |what: &str| Error::Corrupt(format!("pack {}: {what}", path.display()));
    if size < TRAILER as u64 {
        return Err(corrupt("shorter than its trailer"));
    }
    let mut trailer = [0u8; TRAILER];
    file.read_exact_at(&mut trailer, size - TRAILER as u64).map_err(|e| io(path, e))?;
    let word = |i: usize| u64::from_le_bytes(trailer[i..i + 8].try_into().expect("8 bytes"));
    if &trailer[..8] != MAGIC {
        return Err(corrupt("no pack trailer"));
    }
    let (count, index_at) = (word(8), word(16));
    let index_len = count.checked_mul(ENTRY as u64).ok_or_else(|| corrupt("entry count"))?;
    if index_at.checked_add(index_len).and_then(|end| end.checked_add(TRAILER as u64)) != Some(size) {
        return Err(corrupt("the index does not end at the trailer"));
    }
    let mut raw = vec![0u8; index_len as usize];
    file.read_exact_at(&mut raw, index_at).map_err(|e| io(path, e))?;
    let mut entries = Vec::with_capacity(count as usize);
    let mut data = 0u64;
    for e in raw.chunks_exact(ENTRY) {
        let num = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
        let entry = Entry { hash: e[..32].try_into().expect("32 bytes"), offset: num(32), len: num(40) };
        if entry.offset.checked_add(entry.len).is_none_or(|end| end > index_at) {
            return Err(corrupt("an entry past the blobs"));
        }
        data += entry.len;
        entries.push(entry);
    }
    Ok(PackIndex { entries, data })
}

/// The bytes of the blob at `at`. [`Error::NotFound`] when its pack is
/// gone (collected since it was looked up). Blocking.
pub(super) fn read(at: &Location) -> Result<Bytes> {
    let file = open(&at.pack)?;
    let mut buf = vec![0u8; at.len as usize];
    file.read_exact_at(&mut buf, at.offset).map_err(|e| io(&at.pack, e))?;
    Ok(Bytes::from(buf))
}

/// Bytes one read of a [`Run`] spans at most.
const RUN_BYTES: u64 = 4 << 20;
/// A gap between two blobs of a [`Run`] that is read through, not skipped.
const RUN_GAP: u64 = 64 << 10;

/// Packed blobs read together, by one read of the span they are in: of
/// one pack, in offset order.
#[derive(Debug)]
pub(super) struct Run {
    pack: Arc<Path>,
    /// Name, offset, length.
    blobs: Vec<(String, u64, u64)>,
}

impl Run {
    /// The names of its blobs.
    pub fn names(&self) -> Vec<String> {
        self.blobs.iter().map(|(name, _, _)| name.clone()).collect()
    }

    /// From the first blob's offset to the last one's end.
    fn span(&self) -> (u64, u64) {
        let start = self.blobs.first().map_or(0, |b| b.1);
        (start, self.blobs.last().map_or(start, |b| b.1 + b.2))
    }

    /// Whether a blob at `at` is read as part of this run.
    fn takes(&self, at: &Location) -> bool {
        let (start, end) = self.span();
        self.pack == at.pack
            && at.offset >= end
            && at.offset - end <= RUN_GAP
            && at.offset + at.len - start <= RUN_BYTES
    }
}

/// The `located` blobs (each name with where it is) in runs: by pack, by
/// offset, each a span of up to [`RUN_BYTES`] with gaps of up to
/// [`RUN_GAP`] (a pack's blobs were written one after another, so a
/// restore of a save reads its pack from start to end).
pub(super) fn runs(mut located: Vec<(String, Location)>) -> Vec<Run> {
    located.sort_by(|a, b| (&a.1.pack, a.1.offset).cmp(&(&b.1.pack, b.1.offset)));
    let mut out: Vec<Run> = Vec::new();
    for (name, at) in located {
        match out.last_mut() {
            Some(run) if run.takes(&at) => run.blobs.push((name, at.offset, at.len)),
            _ => out.push(Run { pack: at.pack.clone(), blobs: vec![(name, at.offset, at.len)] }),
        }
    }
    out
}

/// The bytes of every blob of `run`, in its order, by one read (each a
/// slice of it). [`Error::NotFound`] when its pack is gone. Blocking.
pub(super) fn read_run(run: &Run) -> Result<Vec<(String, Bytes)>> {
    let file = open(&run.pack)?;
    let (start, end) = run.span();
    let mut buf = vec![0u8; (end - start) as usize];
    file.read_exact_at(&mut buf, start).map_err(|e| io(&run.pack, e))?;
    let buf = Bytes::from(buf);
    let slice = |offset: u64, len: u64| buf.slice((offset - start) as usize..(offset - start + len) as usize);
    Ok(run.blobs.iter().map(|(name, offset, len)| (name.clone(), slice(*offset, *len))).collect())
}

/// What [`PackWriter::append`] did with a blob.
pub(super) enum Appended {
    /// This pack holds it already.
    Duplicate,
    /// Held in the write buffer.
    Held,
    /// The buffer was full: write these bytes at this offset
    /// ([`PackWriter::write_at`]) before the blob counts as written.
    Write(Vec<u8>, u64),
}

/// A pack being written: blobs are appended in any order by concurrent
/// uploads (each given its offset under a lock, its bytes gathered and
/// written by position), and [`PackWriter::seal`] writes the index and
/// links the pack in. Dropped unsealed, nothing of it stays.
pub(super) struct PackWriter {
    dir: PathBuf,
    temp: TempBlob,
    state: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    next: u64,
    buffer: Vec<u8>,
    buffer_at: u64,
    entries: Vec<Entry>,
    held: HashSet<Hash>,
}

impl PackWriter {
    /// A pack to be linked into `dir` (a tenant's packs directory, created
    /// by the caller with `temp` in it or under the store's temp dir).
    pub fn new(dir: PathBuf, temp: TempBlob) -> Self {
        Self { dir, temp, state: Mutex::new(Pending::default()) }
    }

    /// Add a verified blob.
    pub fn append(&self, hash: Hash, bytes: &[u8]) -> Appended {
        let mut p = self.state.lock().expect("pack state");
        if !p.held.insert(hash) {
            return Appended::Duplicate;
        }
        let entry = Entry { hash, offset: p.next, len: bytes.len() as u64 };
        p.entries.push(entry);
        p.next += entry.len;
        p.buffer.extend_from_slice(bytes);
        if p.buffer.len() < WRITE_BUFFER {
            return Appended::Held;
        }
        let at = p.buffer_at;
        p.buffer_at = p.next;
        Appended::Write(std::mem::take(&mut p.buffer), at)
    }

    /// Write what [`Appended::Write`] handed out. Blocking.
    pub fn write_at(&self, bytes: &[u8], at: u64) -> Result<()> {
        self.temp.file().write_all_at(bytes, at).map_err(|e| io(&self.dir, e))
    }

    /// [`PackWriter::append`], writing the buffer at once when it is full
    /// (for one writer; concurrent ones hand the write off). Blocking.
    pub fn add(&self, hash: Hash, bytes: &[u8]) -> Result<()> {
        match self.append(hash, bytes) {
            Appended::Write(buf, at) => self.write_at(&buf, at),
            Appended::Duplicate | Appended::Held => Ok(()),
        }
    }

    /// Write the rest, the index and the trailer, make the pack durable and
    /// link it in; its blobs exist from then on. Returns the pack's path,
    /// or none when it holds no blob (and nothing is linked). Blocking.
    pub fn seal(self) -> Result<Option<PathBuf>> {
        let Pending { next, buffer, buffer_at, entries, .. } = self.state.into_inner().expect("pack state");
        if entries.is_empty() {
            return Ok(None);
        }
        let mut tail = buffer;
        debug_assert_eq!(buffer_at + tail.len() as u64, next);
        tail.reserve(entries.len() * ENTRY + TRAILER);
        for e in &entries {
            tail.extend_from_slice(&e.hash);
            tail.extend_from_slice(&e.offset.to_le_bytes());
            tail.extend_from_slice(&e.len.to_le_bytes());
        }
        tail.extend_from_slice(MAGIC);
        tail.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        tail.extend_from_slice(&next.to_le_bytes());
        self.temp.file().write_all_at(&tail, buffer_at).map_err(|e| io(&self.dir, e))?;
        let path = self.dir.join(format!("{}.pack", uuid::Uuid::new_v4().simple()));
        if !self.temp.persist(&path)? {
            return Err(Error::Unavailable(format!("pack {} exists already", path.display())));
        }
        Ok(Some(path))
    }
}

/// Collect `kill` from the tenant's packs in `dir` (as `view` saw them;
/// temp files under `temp_dir`): every pack holding one of them (a blob
/// two saves stored at once is in two) gets it listed dead. A pack left
/// with nothing live is removed. One with half its bytes or more dead is
/// rewritten through `new_temp`: its live blobs go to a new pack, and it
/// is listed all dead, to be removed by the next collection: a copy of the
/// store taken meanwhile (a backup that listed the directory before the
/// new pack was there) still finds the live blobs in it. Returns the
/// blobs of `kill` that were live in a pack. Blocking.
pub(super) fn collect(
    dir: &Path,
    temp_dir: &Path,
    view: &TenantPacks,
    kill: &HashSet<Hash>,
    new_temp: &dyn Fn() -> Result<TempBlob>,
) -> Result<HashSet<Hash>> {
    let mut gone = HashSet::new();
    for (id, index) in &view.packs {
        let old_dead = view.dead.get(id).map(|(_, d)| d.as_ref());
        let is_dead = |h: &Hash| old_dead.is_some_and(|d| d.contains(h));
        let killed: Vec<&Entry> =
            index.entries.iter().filter(|e| kill.contains(&e.hash) && !is_dead(&e.hash)).collect();
        gone.extend(killed.iter().map(|e| e.hash));
        let dead_now = |e: &Entry| is_dead(&e.hash) || kill.contains(&e.hash);
        let live: Vec<&Entry> = index.entries.iter().filter(|e| !dead_now(e)).collect();
        let (pack, dead_file) = (dir.join(format!("{id}.pack")), dir.join(format!("{id}.dead")));
        if live.is_empty() {
            remove(&pack)?;
            remove(&dead_file)?;
            continue;
        }
        if killed.is_empty() {
            continue;
        }
        let live_bytes: u64 = live.iter().map(|e| e.len).sum();
        if live_bytes * 2 <= index.data {
            // Half dead or more: the live ones to a new pack first.
            let file = std::fs::File::open(&pack).map_err(|e| io(&pack, e))?;
            let writer = PackWriter::new(dir.to_path_buf(), new_temp()?);
            for e in &live {
                let mut bytes = vec![0u8; e.len as usize];
                file.read_exact_at(&mut bytes, e.offset).map_err(|err| io(&pack, err))?;
                writer.add(e.hash, &bytes)?;
            }
            writer.seal()?;
            let all: Vec<u8> = index.entries.iter().flat_map(|e| e.hash).collect();
            replace(temp_dir, &dead_file, &all)?;
            continue;
        }
        let dead: Vec<u8> = index.entries.iter().filter(|e| dead_now(e)).flat_map(|e| e.hash).collect();
        replace(temp_dir, &dead_file, &dead)?;
    }
    Ok(gone)
}

/// Remove the file at `path`; whether it was there.
pub(super) fn remove(path: &Path) -> Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(path, e)),
    }
}

/// Replace `path` with `bytes`, durably: a temp file in `temp_dir` (on
/// the same file system; a crash's leftover is swept with the store's
/// other temp files), synced, renamed over it, its directory synced.
fn replace(temp_dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let temp = temp_dir.join(uuid::Uuid::new_v4().simple().to_string());
    let written = (|| {
        let file = std::fs::File::create(&temp)?;
        file.write_all_at(bytes, 0)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        std::fs::File::open(path.parent().expect("a pack's directory"))?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map_err(|e| io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(dir: &Path) -> PackWriter {
        PackWriter::new(dir.to_path_buf(), TempBlob::unnamed(dir).unwrap())
    }

    fn h(n: u8) -> Hash {
        [n; 32]
    }

    #[test]
    fn a_sealed_pack_reads_back_every_blob_and_a_dropped_one_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(dir.path());
        let big = vec![9u8; WRITE_BUFFER + 10];
        let mut writes = Vec::new();
        for (n, bytes) in [(1u8, b"one".to_vec()), (2, big.clone()), (3, Vec::new()), (4, b"four".to_vec())] {
            if let Appended::Write(buf, at) = w.append(h(n), &bytes) {
                writes.push((buf, at));
            }
        }
        assert!(matches!(w.append(h(1), b"one"), Appended::Duplicate));
        assert_eq!(writes.len(), 1, "the buffer filled once");
        // Written out of order, as concurrent uploads may.
        for (buf, at) in writes.iter().rev() {
            w.write_at(buf, *at).unwrap();
        }
        let path = w.seal().unwrap().unwrap();
        let view = scan(dir.path(), None).unwrap();
        assert_eq!(read(view.get(&h(1)).unwrap()).unwrap(), &b"one"[..]);
        assert_eq!(read(view.get(&h(2)).unwrap()).unwrap(), big);
        assert_eq!(read(view.get(&h(3)).unwrap()).unwrap(), &b""[..]);
        assert_eq!(read(view.get(&h(4)).unwrap()).unwrap(), &b"four"[..]);
        assert_eq!(view.live().count(), 4);
        assert!(path.exists());

        let w = writer(dir.path());
        assert!(matches!(w.append(h(5), b"five"), Appended::Held));
        drop(w);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(names, [path], "nothing of the dropped pack");
        assert!(writer(dir.path()).seal().unwrap().is_none(), "an empty pack is not linked");
    }

    /// A restore's blobs of a pack are read a span at a time, in pack
    /// order whatever the order asked: neighbours together, a gap or the
    /// span's limit starting the next run; each blob its own bytes.
    #[test]
    fn runs_read_neighbours_together_and_each_blob_whole() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(dir.path());
        let mut blobs: Vec<(u8, Vec<u8>)> = (1..=3).map(|n| (n, vec![n; 100])).collect();
        // Not asked for: a gap past what a run reads through.
        blobs.push((4, vec![4; RUN_GAP as usize + 1]));
        blobs.push((5, vec![5; 10]));
        // 1 MiB each: the fourth would take its run past RUN_BYTES.
        blobs.extend((6..=10).map(|n| (n, vec![n; 1 << 20])));
        for (n, bytes) in &blobs {
            w.add(h(*n), bytes).unwrap();
        }
        let path = w.seal().unwrap().unwrap();
        let view = scan(dir.path(), None).unwrap();
        let name = |n: u8| hex::encode(h(n));
        let located = blobs.iter().rev().filter(|(n, _)| *n != 4);
        let runs = runs(located.map(|(n, _)| (name(*n), view.get(&h(*n)).unwrap().clone())).collect());
        let shape: Vec<Vec<String>> = runs.iter().map(Run::names).collect();
        let names = |ns: &[u8]| ns.iter().map(|n| name(*n)).collect::<Vec<_>>();
        assert_eq!(shape, [names(&[1, 2, 3]), names(&[5, 6, 7, 8]), names(&[9, 10])]);
        for run in &runs {
            for (sha256, bytes) in read_run(run).unwrap() {
                let (_, want) = blobs.iter().find(|(n, _)| name(*n) == sha256).unwrap();
                assert_eq!(bytes, want, "{sha256}");
            }
        }
        // Collected since: not found, for the reader to look again.
        std::fs::remove_file(path).unwrap();
        assert!(matches!(read_run(&runs[0]), Err(Error::NotFound(_))));
    }

    #[test]
    fn a_damaged_pack_is_refused_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(dir.path());
        w.append(h(1), b"one");
        let path = w.seal().unwrap().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(read_index(&path), Err(Error::Corrupt(_))));
        assert!(scan(dir.path(), None).unwrap().get(&h(1)).is_none());
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(read_index(&path), Err(Error::Corrupt(_))));
    }

    /// Dead lists first; past half dead, a new pack of the live ones; all
    /// dead, the pack goes. A blob in two packs goes only from both.
    #[test]
    fn collecting_lists_rewrites_and_removes() {
        let (dir, tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let new_temp = || TempBlob::unnamed(dir.path());
        let w = writer(dir.path());
        for n in 1..=4 {
            w.append(h(n), &[n; 100]);
        }
        let first = w.seal().unwrap().unwrap();
        let w = writer(dir.path());
        w.append(h(1), &[1; 100]);
        let second = w.seal().unwrap().unwrap();

        // One of four: listed dead, the pack stays.
        let view = scan(dir.path(), None).unwrap();
        let gone = collect(dir.path(), tmp.path(), &view, &[h(2)].into(), &new_temp).unwrap();
        assert_eq!(gone, [h(2)].into());
        let view = scan(dir.path(), Some(&view)).unwrap();
        assert!(view.get(&h(2)).is_none());
        assert!(first.exists() && first.with_extension("dead").exists());
        assert_eq!(view.live().count(), 3, "1 (in both packs), 3, 4");

        // Two of four dead: rewritten with the live ones, the old pack
        // listed all dead (removed by the next collection).
        let gone = collect(dir.path(), tmp.path(), &view, &[h(3), h(1)].into(), &new_temp).unwrap();
        assert_eq!(gone, [h(3), h(1)].into(), "blob 1 went from both packs");
        let view = scan(dir.path(), Some(&view)).unwrap();
        assert!(first.exists() && !second.exists());
        assert_eq!(view.packs.len(), 2);
        assert_eq!(read(view.get(&h(4)).unwrap()).unwrap(), &[4u8; 100][..]);
        assert_ne!(*view.get(&h(4)).unwrap().pack, *first, "read from the new pack");
        assert_eq!(view.live().count(), 1);

        // The last one: nothing left, the old pack gone too, no temp file.
        collect(dir.path(), tmp.path(), &view, &[h(4)].into(), &new_temp).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
