//! Zeroing a file's secret values as it is read, for capture and blob
//! reads alike. The [`Redactor`] itself is the workspace's one, in
//! `shared::redact`.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use shared::error::Error;
pub use shared::redact::{Redactor, Zeroing};

use crate::confine::io_error;

/// Bytes read from a file at a time (and the largest blob message).
const CHUNK: usize = 1 << 20;

/// Open a regular file without following a symlink.
fn open_regular(abs: &Path, path: &str) -> Result<std::fs::File, Error> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(abs)
        .map_err(|e| io_error(e, path))
}

/// Feed a file through the zeroing pass; `sink` sees each output chunk.
/// Returns the size of the output.
pub(super) fn zero_file(
    abs: &Path,
    path: &str,
    redactor: &Redactor,
    all: bool,
    mut sink: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<u64, Error> {
    let mut file = open_regular(abs, path)?;
    let mut zeroing = redactor.stream(all);
    let mut size = 0u64;
    // Sized for the file (one byte more, so the second read sees its end):
    // a workspace is mostly small files, and a zeroed 1 MiB buffer per file
    // cost more than reading it.
    let len = file.metadata().map_or(CHUNK as u64, |m| m.len());
    let chunk = usize::try_from(len).unwrap_or(CHUNK).saturating_add(1).min(CHUNK);
    let mut buf = vec![0u8; chunk];
    let mut out = Vec::with_capacity(chunk + redactor.hold());
    loop {
        let n = file.read(&mut buf).map_err(|e| io_error(e, path))?;
        if n == 0 {
            zeroing.finish(&mut out);
        } else {
            zeroing.push(&buf[..n], &mut out);
        }
        if !out.is_empty() {
            size += out.len() as u64;
            sink(&out)?;
            out.clear();
        }
        if n == 0 {
            break;
        }
    }
    Ok(size)
}
