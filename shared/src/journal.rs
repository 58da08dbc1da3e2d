//! The run journal's on-disk format, shared by the sandbox agent (which writes
//! and reads journals) and the control plane (which derives keys and checks
//! what the agent reports).
//!
//! A journaled run has, in the journal dir:
//! - `<run_id>.ndjson`: the command's stdout, appended as written, followed by
//!   exactly one exit sentinel line written by the supervisor;
//! - `<run_id>.err`: the command's stderr;
//! - `<run_id>.lock`: held (`flock`) by the supervisor while it lives;
//! - `<run_id>.exit`: the exit code as decimal text, written after the
//!   sentinel (a hint for listings that have no key; never proof);
//! - `<run_id>.in`: stdin bytes given with the start request, until the
//!   command has opened them;
//! - `<run_id>.secrets`: the names (never the values) of the secrets the
//!   agent masks in the run's output, one a line; an agent that lacks one
//!   of their values refuses to serve the run;
//! - `<run_id>.cap`: the run's journal byte cap as decimal text, when it
//!   has one (written by the agent at start); no line that ends past it is
//!   served (the command cannot write past it, so only the last line, cut
//!   at the cap and closed by the supervisor's newline, can);
//! - `<run_id>.full`: written by the supervisor before the sentinel when the
//!   journal or the stderr sidecar reached the run's byte cap (it names
//!   which and the cap); a read that reaches the sentinel of such a run
//!   fails with `JOURNAL_FULL`.
//!
//! The sentinel is `{"__exit":N,"__nonce":"<32 lowercase hex>"}`. Its nonce is
//! HMAC-SHA256(key, run_id) truncated to 32 hex characters, so a command that
//! does not know the key cannot forge it. Without a key (compatibility mode)
//! the nonce is derived from the run id alone and is forgeable on purpose.

use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::ids::RunId;

/// Extension of the stdout journal.
pub const NDJSON_EXT: &str = "ndjson";
/// A journaled run whose argv starts with this name runs the sandbox
/// agent's own binary (wherever the provider put it), e.g. its `acp` mode.
pub const AGENT_PROGRAM: &str = "sandhold-agent";
/// Extension of the stderr sidecar.
pub const ERR_EXT: &str = "err";
/// Extension of the supervisor's lock file.
pub const LOCK_EXT: &str = "lock";
/// Extension of the exit-code hint.
pub const EXIT_EXT: &str = "exit";
/// Extension of the stdin file.
pub const STDIN_EXT: &str = "in";
/// Extension of the names of the secrets masked in a run's output.
pub const SECRETS_EXT: &str = "secrets";
/// Extension of a run's journal byte cap.
pub const CAP_EXT: &str = "cap";
/// Extension of the marker of a run stopped at its journal byte cap.
pub const FULL_EXT: &str = "full";
/// Extension of a run's model usage records (the egress broker's).
pub const USAGE_EXT: &str = "usage";
/// The names of every secret the agent was handed, in the journal dir (not
/// a run's file: no run file name starts with `.secret-names`).
pub const SANDBOX_SECRETS_FILE: &str = ".secret-names";

/// Length of the sentinel nonce in hex characters.
pub const NONCE_HEX_LEN: usize = 32;
/// Prefix of the compatibility (keyless) nonce derivation.
pub const COMPAT_NONCE_PREFIX: &str = "sandhold/journal-exit-sentinel/v1:";
/// How much of the stderr sidecar an exit message carries.
pub const STDERR_TAIL_BYTES: u64 = 4096;

/// The files of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalPaths {
    pub ndjson: PathBuf,
    pub err: PathBuf,
    pub lock: PathBuf,
    pub exit: PathBuf,
    pub stdin: PathBuf,
    pub secrets: PathBuf,
    pub cap: PathBuf,
    pub full: PathBuf,
    pub usage: PathBuf,
}

impl JournalPaths {
    pub fn new(dir: &Path, run_id: &RunId) -> Self {
        let file = |ext: &str| dir.join(format!("{}.{ext}", run_id.as_str()));
        Self {
            ndjson: file(NDJSON_EXT),
            err: file(ERR_EXT),
            lock: file(LOCK_EXT),
            exit: file(EXIT_EXT),
            stdin: file(STDIN_EXT),
            secrets: file(SECRETS_EXT),
            cap: file(CAP_EXT),
            full: file(FULL_EXT),
            usage: file(USAGE_EXT),
        }
    }

    /// Every file a run may own, for deletion.
    pub fn all(&self) -> [&Path; 9] {
        [
            &self.ndjson,
            &self.err,
            &self.lock,
            &self.exit,
            &self.stdin,
            &self.secrets,
            &self.cap,
            &self.full,
            &self.usage,
        ]
    }
}

/// The journal byte cap recorded at `path` (`<run_id>.cap`); `None`: the
/// run has none.
pub fn read_cap(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok().filter(|c| *c > 0)
}

/// The run id of a journal file name (`<run_id>.ndjson`), if it is one.
pub fn run_id_of_journal_file(name: &str) -> Option<RunId> {
    let stem = name.strip_suffix(NDJSON_EXT)?.strip_suffix('.')?;
    RunId::parse(stem).ok()
}

/// The sentinel nonce of `run_id`: keyed when `key` is non-empty, the
/// compatibility derivation otherwise.
pub fn nonce(key: &[u8], run_id: &RunId) -> String {
    let digest: Vec<u8> = if key.is_empty() {
        let mut h = Sha256::new();
        h.update(COMPAT_NONCE_PREFIX.as_bytes());
        h.update(run_id.as_str().as_bytes());
        h.finalize().to_vec()
    } else {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("hmac accepts any key length");
        mac.update(run_id.as_str().as_bytes());
        mac.finalize().into_bytes().to_vec()
    };
    let mut hex = hex::encode(digest);
    hex.truncate(NONCE_HEX_LEN);
    hex
}

/// The exact sentinel line (with its newline) the supervisor appends.
pub fn sentinel_line(exit_code: i32, nonce: &str) -> String {
    format!("{{\"__exit\":{exit_code},\"__nonce\":\"{nonce}\"}}\n")
}

/// The exit code of `line` (without its newline) if it is a sentinel: it
/// starts as the supervisor writes it (`{"__exit":`), and is a JSON object
/// with exactly the keys `__exit` (an integer that fits an i32) and `__nonce`
/// (equal to `nonce`). Anything else, including `1.5`, `"0"`, `null` and
/// `true`, is an ordinary line.
pub fn parse_sentinel(line: &[u8], nonce: &str) -> Option<i32> {
    // Cheap pre-filter: almost every line is not a sentinel, and the
    // supervisor always writes `__exit` first.
    let trimmed = line.strip_suffix(b"\r").unwrap_or(line);
    if trimmed.len() > 128 || !trimmed.starts_with(SENTINEL_PREFIX) {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(trimmed).ok()?;
    let obj = value.as_object()?;
    if obj.len() != 2 {
        return None;
    }
    let exit = obj.get("__exit")?;
    let given = obj.get("__nonce")?.as_str()?;
    if !(exit.is_i64() || exit.is_u64()) {
        return None;
    }
    let code = i32::try_from(exit.as_i64()?).ok()?;
    if !crate::secret::constant_time_eq(given.as_bytes(), nonce.as_bytes()) {
        return None;
    }
    Some(code)
}

/// How every sentinel line starts (the supervisor writes `__exit` first).
const SENTINEL_PREFIX: &[u8] = b"{\"__exit\":";

/// A valid sentinel found in a journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    /// Byte offset where the sentinel line starts.
    pub line_start: u64,
    /// Byte offset just past its newline (or the end of data when the line
    /// has none).
    pub line_end: u64,
}

/// Scan `data` (the bytes of a journal starting at absolute offset `base`)
/// from the end backwards for the last valid sentinel. The last line may lack
/// its newline: the supervisor writes the sentinel in one `write`, so a
/// sentinel-shaped last line is complete.
pub fn find_exit(data: &[u8], base: u64, nonce: &str) -> Option<Exit> {
    let mut end = data.len();
    while end > 0 {
        // `end` is the exclusive end of a line including its newline, if any.
        let content_end = if data[end - 1] == b'\n' { end - 1 } else { end };
        let start = data[..content_end].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if let Some(code) = parse_sentinel(&data[start..content_end], nonce) {
            return Some(Exit { code, line_start: base + start as u64, line_end: base + end as u64 });
        }
        end = start;
    }
    None
}

/// One complete line: its bytes without the newline and the absolute offset
/// just past the newline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    pub bytes: &'a [u8],
    pub end_offset: u64,
}

/// Split `data`, which starts at absolute offset `base`, into complete lines.
/// Returns the lines and how many bytes of `data` they consumed; the rest is
/// a partial line to keep until its newline arrives.
pub fn split_lines(data: &[u8], base: u64) -> (Vec<Line<'_>>, usize) {
    let mut lines = Vec::new();
    let mut start = 0;
    while let Some(i) = data[start..].iter().position(|&b| b == b'\n') {
        let end = start + i + 1;
        lines.push(Line { bytes: &data[start..end - 1], end_offset: base + end as u64 });
        start = end;
    }
    (lines, start)
}

/// The longest journal line the agent serves, newline excluded. A line is
/// one harness event; a longer one (a command printing megabytes without a
/// newline) ends the run with `LINE_TOO_LONG` rather than grow every
/// reader's buffer or exceed a gRPC message.
pub const MAX_LINE: usize = 1 << 20;

/// Incremental form of [`split_lines`] for a reader that receives a journal
/// in arbitrary chunks. It never holds more than [`MAX_LINE`] bytes: a
/// longer line is skipped to its newline, never handed out, and the first
/// one's start is kept in [`LineSplitter::overlong`].
#[derive(Debug, Default)]
pub struct LineSplitter {
    /// Absolute offset of the current (partial) line's first byte.
    offset: u64,
    /// The current line's bytes while it is at most `MAX_LINE` long.
    pending: Vec<u8>,
    /// The current line's length so far, kept or not.
    line_len: u64,
    overlong: Option<u64>,
}

impl LineSplitter {
    pub fn new(offset: u64) -> Self {
        Self { offset, ..Self::default() }
    }

    /// Absolute offset just past the last complete line (handed out or
    /// skipped).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes received but not yet part of a complete line (empty while an
    /// overlong line is being skipped).
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Where the first line longer than [`MAX_LINE`] starts, once one was
    /// seen (complete or not).
    pub fn overlong(&self) -> Option<u64> {
        self.overlong
    }

    /// Feed `chunk`; returns the complete lines it finished, owned, each at
    /// most [`MAX_LINE`] long.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<(Vec<u8>, u64)> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while !rest.is_empty() {
            let (body, ended) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            rest = &rest[body.len() + usize::from(ended)..];
            self.line_len += body.len() as u64;
            if self.line_len > MAX_LINE as u64 {
                self.pending = Vec::new();
                self.overlong.get_or_insert(self.offset);
            } else {
                self.pending.extend_from_slice(body);
            }
            if ended {
                let end = self.offset + self.line_len + 1;
                if self.line_len <= MAX_LINE as u64 {
                    out.push((std::mem::take(&mut self.pending), end));
                }
                self.offset = end;
                self.line_len = 0;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RunId {
        RunId::parse(s).unwrap()
    }

    #[test]
    fn compat_nonce_is_the_documented_derivation() {
        let mut h = Sha256::new();
        h.update(b"sandhold/journal-exit-sentinel/v1:run-1");
        let want = &hex::encode(h.finalize())[..32];
        assert_eq!(nonce(b"", &id("run-1")), want);
    }

    #[test]
    fn keyed_nonce_is_hmac_and_differs_from_compat() {
        let n = nonce(b"k", &id("run-1"));
        assert_eq!(n.len(), NONCE_HEX_LEN);
        assert!(n.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(n, nonce(b"", &id("run-1")));
        assert_ne!(n, nonce(b"k2", &id("run-1")));
        assert_ne!(n, nonce(b"k", &id("run-2")));
        // RFC 4231 test case 2 (key "Jefe").
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn sentinel_round_trips_and_rejects_lookalikes() {
        let n = nonce(b"key", &id("r"));
        let line = sentinel_line(3, &n);
        assert_eq!(parse_sentinel(line.trim_end().as_bytes(), &n), Some(3));
        assert_eq!(parse_sentinel(sentinel_line(-1, &n).trim_end().as_bytes(), &n), Some(-1));
        let bad = [
            r#"{"__exit":0}"#.to_string(),
            format!(r#"{{"__exit":"0","__nonce":"{n}"}}"#),
            format!(r#"{{"__exit":null,"__nonce":"{n}"}}"#),
            format!(r#"{{"__exit":1.5,"__nonce":"{n}"}}"#),
            format!(r#"{{"__exit":1.0,"__nonce":"{n}"}}"#),
            format!(r#"{{"__exit":true,"__nonce":"{n}"}}"#),
            format!(r#"{{"__exit":99999999999,"__nonce":"{n}"}}"#),
            format!(r#"{{"__exit":0,"__nonce":"{n}","x":1}}"#),
            format!(r#"{{"__exit":0,"__nonce":"{}"}}"#, n.to_uppercase()),
            format!(r#"{{"__exit":0,"__nonce":"{}"}}"#, nonce(b"", &id("r"))),
            format!(r#"[{{"__exit":0,"__nonce":"{n}"}}]"#),
        ];
        for b in bad {
            assert_eq!(parse_sentinel(b.as_bytes(), &n), None, "{b}");
        }
    }

    #[test]
    fn find_exit_takes_the_last_valid_sentinel() {
        let n = nonce(b"key", &id("r"));
        let data = format!("a\n{}b\n{}{}", sentinel_line(1, &n), sentinel_line(2, &n), r#"{"__exit":7}"#);
        let exit = find_exit(data.as_bytes(), 100, &n).unwrap();
        assert_eq!(exit.code, 2);
        let start = data.find(&sentinel_line(2, &n)).unwrap() as u64;
        assert_eq!(exit.line_start, 100 + start);
        assert_eq!(exit.line_end, 100 + start + sentinel_line(2, &n).len() as u64);
        assert_eq!(find_exit(b"x\n{\"__exit\":0}\n", 0, &n), None);
        assert_eq!(find_exit(b"", 0, &n), None);
    }

    #[test]
    fn splitter_skips_an_overlong_line_holding_at_most_max_line() {
        let mut s = LineSplitter::new(5);
        assert_eq!(s.push(b"ok\n"), vec![(b"ok".to_vec(), 8)]);
        let piece = vec![b'x'; 64 * 1024];
        for _ in 0..(3 * MAX_LINE / piece.len()) {
            assert!(s.push(&piece).is_empty());
            assert!(s.pending().len() <= MAX_LINE);
        }
        assert_eq!(s.overlong(), Some(8));
        let long = 3 * MAX_LINE as u64;
        assert_eq!(s.push(b"\nnext\n"), vec![(b"next".to_vec(), 8 + long + 1 + 5)]);
        assert_eq!(s.offset(), 8 + long + 1 + 5);
        // A line of exactly MAX_LINE is still served; the first overlong
        // start is kept.
        let exact = vec![b'y'; MAX_LINE];
        let got = s.push(&[exact.as_slice(), b"\n"].concat());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.len(), MAX_LINE);
        assert_eq!(s.overlong(), Some(8));
    }

    #[test]
    fn splitter_withholds_partial_lines() {
        let mut s = LineSplitter::new(10);
        assert!(s.push(b"ab").is_empty());
        assert_eq!(s.push(b"c\nd"), vec![(b"abc".to_vec(), 14)]);
        assert_eq!(s.pending(), b"d");
        assert_eq!(s.push(b"\n\n"), vec![(b"d".to_vec(), 16), (b"".to_vec(), 17)]);
        assert_eq!(s.offset(), 17);
    }

    #[test]
    fn journal_file_names_map_back_to_run_ids() {
        assert_eq!(run_id_of_journal_file("r-1.ndjson"), Some(id("r-1")));
        assert_eq!(run_id_of_journal_file("a.b.ndjson"), Some(id("a.b")));
        assert_eq!(run_id_of_journal_file(".ndjson"), None);
        assert_eq!(run_id_of_journal_file("r-1.err"), None);
        assert_eq!(run_id_of_journal_file("..ndjson"), None);
        let p = JournalPaths::new(Path::new("/j"), &id("r"));
        assert_eq!(p.ndjson, Path::new("/j/r.ndjson"));
        assert_eq!(p.err, Path::new("/j/r.err"));
    }
}
