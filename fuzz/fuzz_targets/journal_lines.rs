//! The journal line reader: whatever bytes a command prints, and however a
//! reader receives them, the incremental splitter hands out exactly the
//! complete lines the one-shot split finds (short ones; an overlong one is
//! skipped and remembered), at the same offsets, and a sentinel is only ever
//! what the supervisor writes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::journal::{LineSplitter, MAX_LINE, find_exit, parse_sentinel, sentinel_line, split_lines};

const NONCE: &str = "0123456789abcdef0123456789abcdef";

fuzz_target!(|input: (Vec<u8>, Vec<u8>, u32)| {
    let (data, cuts, base) = input;
    let base = u64::from(base);
    let (whole, consumed) = split_lines(&data, base);
    assert!(consumed <= data.len());
    assert!(!data[consumed..].contains(&b'\n'));

    // Feed the same bytes in the pieces `cuts` describes.
    let mut splitter = LineSplitter::new(base);
    let mut got = Vec::new();
    let mut rest = &data[..];
    for cut in cuts {
        let n = (cut as usize).min(rest.len());
        got.extend(splitter.push(&rest[..n]));
        rest = &rest[n..];
    }
    got.extend(splitter.push(rest));
    let expected: Vec<(Vec<u8>, u64)> = whole
        .iter()
        .filter(|l| l.bytes.len() <= MAX_LINE)
        .map(|l| (l.bytes.to_vec(), l.end_offset))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(splitter.offset(), base + consumed as u64);

    // A sentinel is the supervisor's exact line, nothing else.
    for line in &whole {
        if let Some(code) = parse_sentinel(line.bytes, NONCE) {
            assert_eq!(sentinel_line(code, NONCE).trim_end().as_bytes(), line.bytes.strip_suffix(b"\r").unwrap_or(line.bytes));
        }
    }
    if let Some(exit) = find_exit(&data, base, NONCE) {
        assert!(exit.line_start >= base && exit.line_end <= base + data.len() as u64);
        let bytes = &data[(exit.line_start - base) as usize..(exit.line_end - base) as usize];
        let content = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        assert_eq!(parse_sentinel(content, NONCE), Some(exit.code));
    }
});
