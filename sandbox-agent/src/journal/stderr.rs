//! The stderr sidecar (`<run_id>.err`) as `Follow` serves it beside the
//! journal: complete lines, masked and capped like the journal's, each
//! tagged `stderr` with the offset just past it in the sidecar.
//!
//! Unlike the journal, the sidecar has no sentinel and no harness reads it
//! as events, so what would end a journal read only costs a line here: a
//! line longer than [`shared::journal::MAX_LINE`] is skipped, and at the run's exit
//! the last line is served even without its newline.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use shared::journal::LineSplitter;
use shared::mask::{LineMasker, Masks};
use shared::proto::agent::v1::JournalLine;

/// Bytes read from the sidecar per pass: a follow serves the journal
/// between two passes, so a flood of stderr cannot starve it.
const READ_BYTES: usize = 256 << 10;

/// A reader of one run's stderr sidecar from a line start.
pub struct Sidecar<'a> {
    path: PathBuf,
    /// Opened at the first pass that finds it (the supervisor creates it).
    file: Option<std::fs::File>,
    /// Next byte to read.
    read_pos: u64,
    splitter: LineSplitter,
    masker: Option<LineMasker<'a>>,
    cap: Option<u64>,
}

impl<'a> Sidecar<'a> {
    pub fn new(path: PathBuf, from: u64, masks: Option<&'a Masks>, cap: Option<u64>) -> Self {
        Self {
            path,
            file: None,
            read_pos: from,
            splitter: LineSplitter::new(from),
            masker: masks.map(|m| LineMasker::new(m, from)),
            cap,
        }
    }

    /// The lines completed since the last pass (one bounded read).
    pub fn read(&mut self) -> std::io::Result<Vec<JournalLine>> {
        let mut out = Vec::new();
        self.pass(&mut out)?;
        Ok(out)
    }

    /// The command exited: everything left, the last line without its
    /// newline included, and what the masker held back.
    pub fn finish(&mut self) -> std::io::Result<Vec<JournalLine>> {
        let mut out = Vec::new();
        while self.pass(&mut out)? > 0 {}
        let pending = self.splitter.pending().to_vec();
        if !pending.is_empty() && !self.past_cap(self.read_pos) {
            let end = self.read_pos;
            match self.masker.as_mut() {
                None => out.push(line(pending, end)),
                // The masker counts a newline the sidecar does not have.
                Some(m) => out.extend(m.push(&pending).into_iter().map(|(d, e)| line(d, e.min(end)))),
            }
        }
        if let Some(m) = self.masker.as_mut() {
            out.extend(m.finish().into_iter().map(|(d, e)| line(d, e.min(self.read_pos))));
        }
        Ok(out)
    }

    /// One read; returns how many bytes it read.
    fn pass(&mut self, out: &mut Vec<JournalLine>) -> std::io::Result<usize> {
        if self.file.is_none() {
            match std::fs::File::open(&self.path) {
                Ok(f) => self.file = Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
                Err(e) => return Err(e),
            }
        }
        let Some(file) = &self.file else { return Ok(0) };
        // Only what was written since the last pass: a follow passes on
        // every wake-up of its journal, and zeroing a whole READ_BYTES
        // buffer each time was an eighth of the machine's CPU with 100
        // runs at a model's pace (`perf`, scale bench).
        let written = file.metadata()?.len().saturating_sub(self.read_pos);
        if written == 0 {
            return Ok(0);
        }
        let mut buf = vec![0u8; (written as usize).min(READ_BYTES)];
        let n = file.read_at(&mut buf, self.read_pos)?;
        if n == 0 {
            return Ok(0);
        }
        self.read_pos += n as u64;
        for (bytes, end_offset) in self.splitter.push(&buf[..n]) {
            if self.past_cap(end_offset) {
                continue;
            }
            match self.masker.as_mut() {
                None => out.push(line(bytes, end_offset)),
                Some(m) => out.extend(m.push(&bytes).into_iter().map(|(d, e)| line(d, e))),
            }
        }
        Ok(n)
    }

    /// A line ending past the run's cap is the one the cap cut (the
    /// supervisor closed it): never served, as in the journal.
    fn past_cap(&self, end_offset: u64) -> bool {
        self.cap.is_some_and(|cap| end_offset > cap)
    }
}

fn line(data: Vec<u8>, end_offset: u64) -> JournalLine {
    JournalLine { data, end_offset, sealed: false, stderr: true }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn texts(lines: &[JournalLine]) -> Vec<(String, u64)> {
        assert!(lines.iter().all(|l| l.stderr && !l.sealed));
        lines.iter().map(|l| (String::from_utf8_lossy(&l.data).into_owned(), l.end_offset)).collect()
    }

    fn append(path: &std::path::Path, bytes: &[u8]) {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        f.write_all(bytes).unwrap();
    }

    #[test]
    fn serves_complete_lines_with_their_offsets_and_resumes_from_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.err");
        let mut side = Sidecar::new(path.clone(), 0, None, None);
        assert!(side.read().unwrap().is_empty(), "no sidecar yet: nothing, no error");
        append(&path, b"warn\npart");
        assert_eq!(texts(&side.read().unwrap()), [("warn".to_string(), 5)]);
        append(&path, b"ial\nlast");
        assert_eq!(texts(&side.read().unwrap()), [("partial".to_string(), 13)]);
        // At the exit the last line comes without its newline.
        assert_eq!(texts(&side.finish().unwrap()), [("last".to_string(), 17)]);

        // A successor resumes at a stderr line's end: nothing twice.
        let mut again = Sidecar::new(path, 5, None, None);
        assert_eq!(texts(&again.finish().unwrap()), [("partial".to_string(), 13), ("last".to_string(), 17)]);
    }

    #[test]
    fn masks_secret_values_even_across_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.err");
        let masks = Masks::new([("TOK", "s3cr3t-value-123")]).unwrap();
        let mut side = Sidecar::new(path.clone(), 0, Some(&masks), None);
        append(&path, b"token s3cr3t-val");
        let mut seen = side.read().unwrap();
        append(&path, b"ue-123 leaked\nnext\n");
        seen.extend(side.read().unwrap());
        seen.extend(side.finish().unwrap());
        let all = texts(&seen);
        assert_eq!(all[0], ("token [secret:TOK] leaked".to_string(), 30));
        assert_eq!(all[1], ("next".to_string(), 35));
        assert!(all.iter().all(|(t, _)| !t.contains("s3cr3t")), "{all:?}");
    }

    #[test]
    fn lines_past_the_cap_and_overlong_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.err");
        let mut long = vec![b'x'; shared::journal::MAX_LINE + 1];
        long.push(b'\n');
        append(&path, &long);
        append(&path, b"after\n");
        let after_end = long.len() as u64 + 6;
        append(&path, b"cut by the cap\n");
        let mut side = Sidecar::new(path, 0, None, Some(after_end + 3));
        assert_eq!(texts(&side.finish().unwrap()), [("after".to_string(), after_end)]);
    }
}
