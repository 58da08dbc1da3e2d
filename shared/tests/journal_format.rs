//! The journal format against golden files, and property tests of the line
//! splitter and the sentinel parser.

use std::path::PathBuf;

use proptest::prelude::*;
use shared::ids::RunId;
use shared::journal::{LineSplitter, find_exit, nonce, parse_sentinel, sentinel_line, split_lines};

const GOLDEN_RUN: &str = "golden-run";
const GOLDEN_KEY: &[u8] = b"golden-key";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// What a forward reader delivers: `<end offset>\t<line>` per line until the
/// first valid sentinel, then `exit\t<code|none>`.
fn render(data: &[u8], nonce: &str) -> String {
    let (lines, _) = split_lines(data, 0);
    let mut out = String::new();
    let mut exit = "none".to_string();
    for line in lines {
        if let Some(code) = parse_sentinel(line.bytes, nonce) {
            exit = code.to_string();
            break;
        }
        out.push_str(&format!("{}\t{}\n", line.end_offset, String::from_utf8_lossy(line.bytes)));
    }
    out.push_str(&format!("exit\t{exit}\n"));
    out
}

#[test]
fn golden_journals_read_as_recorded() {
    let run = RunId::parse(GOLDEN_RUN).unwrap();
    let keyed = nonce(GOLDEN_KEY, &run);
    let compat = nonce(b"", &run);
    // The nonces the golden files were written with; a change of derivation
    // breaks every journal already on disk.
    assert_eq!(keyed, "cb153c180562f36469cffae636cc7024");
    assert_eq!(compat, "cdae9cc54e13da1b8462dc773a799b21");

    let mut seen = 0;
    for entry in std::fs::read_dir(golden_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "ndjson") {
            continue;
        }
        let data = std::fs::read(&path).unwrap();
        for (label, n) in [("keyed", &keyed), ("compat", &compat)] {
            let expected_path = path.with_extension(format!("{label}.expected"));
            let expected = std::fs::read_to_string(&expected_path).unwrap();
            assert_eq!(render(&data, n), expected, "{}", expected_path.display());
            // The backwards scan agrees with the forward read.
            let want_exit = expected.lines().last().unwrap().strip_prefix("exit\t").unwrap();
            let got_exit = find_exit(&data, 0, n).map_or("none".to_string(), |e| e.code.to_string());
            assert_eq!(got_exit, want_exit, "{} ({label})", path.display());
            seen += 1;
        }
    }
    assert!(seen >= 14, "golden files missing ({seen})");
}

#[test]
fn golden_sentinel_bytes_are_stable() {
    let n = nonce(GOLDEN_KEY, &RunId::parse(GOLDEN_RUN).unwrap());
    let data = std::fs::read_to_string(golden_dir().join("finished.ndjson")).unwrap();
    assert!(data.ends_with(&sentinel_line(0, &n)));
    assert_eq!(sentinel_line(137, &n), "{\"__exit\":137,\"__nonce\":\"cb153c180562f36469cffae636cc7024\"}\n");
}

fn journal_bytes() -> impl Strategy<Value = Vec<u8>> {
    // Mostly short lines with multi-byte UTF-8 and arbitrary bytes.
    prop::collection::vec(
        prop_oneof![
            4 => Just(b'\n'),
            8 => any::<u8>(),
            4 => prop::sample::select(vec![b'{', b'}', b'"', b':']),
        ],
        0..400,
    )
}

proptest! {
    #[test]
    fn splitter_chunking_does_not_matter(data in journal_bytes(), cuts in prop::collection::vec(0usize..400, 0..20), base in 0u64..1_000_000) {
        let (whole, consumed) = split_lines(&data, base);
        let whole: Vec<(Vec<u8>, u64)> = whole.into_iter().map(|l| (l.bytes.to_vec(), l.end_offset)).collect();
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
        cuts.sort();
        let mut splitter = LineSplitter::new(base);
        let mut got = Vec::new();
        let mut prev = 0;
        for c in cuts.into_iter().chain(std::iter::once(data.len())) {
            got.extend(splitter.push(&data[prev..c]));
            prev = c;
        }
        prop_assert_eq!(&got, &whole);
        prop_assert_eq!(splitter.offset(), base + consumed as u64);
        prop_assert_eq!(splitter.pending(), &data[consumed..]);
        // Lines plus newlines plus the pending rest rebuild the input, and
        // each end offset points just past a newline.
        let mut rebuilt = Vec::new();
        for (bytes, end) in &whole {
            rebuilt.extend_from_slice(bytes);
            rebuilt.push(b'\n');
            prop_assert_eq!(*end, base + rebuilt.len() as u64);
            prop_assert_eq!(data[(*end - base - 1) as usize], b'\n');
        }
        rebuilt.extend_from_slice(&data[consumed..]);
        prop_assert_eq!(rebuilt, data);
    }

    #[test]
    fn parser_accepts_only_the_exact_sentinel(code in any::<i32>(), key in prop::collection::vec(any::<u8>(), 1..40), run in "[A-Za-z0-9._-]{1,40}") {
        prop_assume!(run != "." && run != "..");
        let run = RunId::parse(&run).unwrap();
        let n = nonce(&key, &run);
        let line = sentinel_line(code, &n);
        prop_assert_eq!(parse_sentinel(line.trim_end().as_bytes(), &n), Some(code));
        prop_assert_eq!(parse_sentinel(line.trim_end().as_bytes(), &nonce(b"", &run)), None);
        let float = format!("{{\"__exit\":{code}.0,\"__nonce\":\"{n}\"}}");
        prop_assert_eq!(parse_sentinel(float.as_bytes(), &n), None);
        let string = format!("{{\"__exit\":\"{code}\",\"__nonce\":\"{n}\"}}");
        prop_assert_eq!(parse_sentinel(string.as_bytes(), &n), None);
    }

    #[test]
    fn find_exit_ignores_noise_and_finds_the_appended_sentinel(noise in journal_bytes(), code in any::<i32>(), trailing in journal_bytes()) {
        let run = RunId::parse("prop-run").unwrap();
        let n = nonce(b"prop-key", &run);
        // Random noise holds no valid sentinel (it cannot know the nonce).
        prop_assert_eq!(find_exit(&noise, 0, &n), None);
        let mut data = noise.clone();
        if data.last().is_some_and(|b| *b != b'\n') {
            data.push(b'\n');
        }
        let start = data.len() as u64;
        data.extend_from_slice(sentinel_line(code, &n).as_bytes());
        let exit = find_exit(&data, 7, &n).unwrap();
        prop_assert_eq!(exit.code, code);
        prop_assert_eq!(exit.line_start, 7 + start);
        prop_assert_eq!(exit.line_end, 7 + data.len() as u64);
        // Output a descendant appended after the sentinel does not hide it.
        let mut more = data.clone();
        more.extend_from_slice(&trailing);
        prop_assert_eq!(find_exit(&more, 0, &n).map(|e| e.code), Some(code));
    }

    #[test]
    fn parser_never_panics(line in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_sentinel(&line, "cb153c180562f36469cffae636cc7024");
    }
}
