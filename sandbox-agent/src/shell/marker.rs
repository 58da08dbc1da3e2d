//! The marker protocol over the shell's pipes: the line each command is
//! sent as, its status line on fd 3 and the end markers on stdout and
//! stderr (see the `shell` module for why it is built so).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use shared::proto::agent::v1::OutputStream;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::sync::mpsc;

/// One of the shell's two output streams, as an index.
pub(super) fn stream_index(stream: OutputStream) -> usize {
    match stream {
        OutputStream::Stderr => 1,
        _ => 0,
    }
}

#[derive(Debug)]
pub(super) enum ShellEvent {
    Output(OutputStream, Bytes),
    /// The command's end marker went past on this stream.
    Marker(OutputStream),
    /// The stream closed (the shell is gone).
    Eof(OutputStream),
}

/// The command currently owning an output stream of the shell.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) nonce: Arc<str>,
    pub(super) marker: Arc<[u8]>,
    pub(super) tx: mpsc::Sender<ShellEvent>,
}

pub(super) type SlotCell = Arc<Mutex<Option<Slot>>>;

pub(super) fn lock_slot(cell: &SlotCell) -> std::sync::MutexGuard<'_, Option<Slot>> {
    cell.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh nonce (tags the command's status line) and end marker.
pub(super) fn fresh_marker() -> (Arc<str>, Arc<[u8]>) {
    let nonce: Arc<str> = random_hex().into();
    let marker: Arc<[u8]> = format!("__sandhold_end_{nonce}__").into_bytes().into();
    (nonce, marker)
}

/// The line that runs `command` in the shell itself, then reports its
/// status tagged with `nonce` on fd 3 and prints `marker` on stdout and
/// stderr.
pub(super) fn command_line(command: &str, nonce: &str, marker: &[u8]) -> String {
    let marker_str = std::str::from_utf8(marker).unwrap_or_default();
    format!(
        "{{ command eval {}; }} </dev/null 3>&-; command printf '%s %d\\n' {nonce} \"$?\" >&3; \
         command printf '%s' {marker_str}; command printf '%s' {marker_str} >&2\n",
        sh_quote(command)
    )
}

/// Quote `s` as one single-quoted shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn random_hex() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Status lines `<nonce> <code>` from the shell's fd 3.
pub(super) async fn read_status(pipe: tokio::net::unix::pipe::Receiver, tx: mpsc::Sender<(String, i32)>) {
    let mut lines = tokio::io::BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some((nonce, code)) = line.split_once(' ') else { continue };
        let Ok(code) = code.trim().parse() else { continue };
        if tx.send((nonce.to_owned(), code)).await.is_err() {
            return;
        }
    }
}

/// Where `needle` starts in `haystack`. Every byte a command prints goes
/// through this: a naive window compare was most of the agent's time on
/// bulk output.
pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// Length of the longest suffix of `buf` that is a proper prefix of
/// `marker`: bytes that may be the start of a marker split across reads.
pub(super) fn partial_marker_len(buf: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(buf.len() + 1)).rev().find(|k| buf.ends_with(&marker[..*k])).unwrap_or(0)
}

/// Read one of the shell's output streams for as long as the shell lives,
/// handing bytes to the command that owns the stream, up to its marker.
/// Bytes nobody owns (a background job between commands) are dropped, so
/// such a job never blocks on a full pipe.
pub(super) async fn read_output(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    stream: OutputStream,
    cell: SlotCell,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_nonce: Option<Arc<str>> = None;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = reader.read(&mut buf).await.unwrap_or(0);
        let slot = lock_slot(&cell).clone();
        if n == 0 {
            if let Some(slot) = slot {
                if pending_nonce.as_ref() == Some(&slot.nonce) && !pending.is_empty() {
                    let _ = slot
                        .tx
                        .send(ShellEvent::Output(stream, Bytes::from(std::mem::take(&mut pending))))
                        .await;
                }
                let _ = slot.tx.send(ShellEvent::Eof(stream)).await;
            }
            return;
        }
        let Some(slot) = slot else {
            pending.clear();
            continue;
        };
        if pending_nonce.as_ref() != Some(&slot.nonce) {
            pending.clear();
            pending_nonce = Some(slot.nonce.clone());
        }
        pending.extend_from_slice(&buf[..n]);
        if let Some(pos) = find(&pending, &slot.marker) {
            if pos > 0 {
                let _ =
                    slot.tx.send(ShellEvent::Output(stream, Bytes::copy_from_slice(&pending[..pos]))).await;
            }
            let _ = slot.tx.send(ShellEvent::Marker(stream)).await;
            let mut current = lock_slot(&cell);
            if current.as_ref().is_some_and(|s| s.nonce == slot.nonce) {
                *current = None;
            }
            pending.clear();
        } else {
            let emit = pending.len() - partial_marker_len(&pending, &slot.marker);
            if emit > 0 {
                let data = Bytes::copy_from_slice(&pending[..emit]);
                pending.drain(..emit);
                let _ = slot.tx.send(ShellEvent::Output(stream, data)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("printf '%s' {}", sh_quote("a'b\"c$d`e\\f")))
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"a'b\"c$d`e\\f");
    }

    #[test]
    fn partial_marker_suffixes() {
        let m = b"__end_x__";
        assert_eq!(partial_marker_len(b"hello", m), 0);
        assert_eq!(partial_marker_len(b"hello_", m), 1);
        assert_eq!(partial_marker_len(b"hello__end", m), 5);
        assert_eq!(partial_marker_len(b"__end_x_", m), 8);
        assert_eq!(find(b"ab__end_x__cd", m), Some(2));
    }
}
