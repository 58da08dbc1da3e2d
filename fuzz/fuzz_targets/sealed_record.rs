//! Sealed request records: a journal line the run wrote opens only when its
//! MAC holds under the run's key, and what opens parses or is refused (no
//! panic on any bytes). A record that parses seals and reopens to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::ids::RunId;
use shared::requests::{open, parse, seal};

const KEY: &[u8] = b"fuzz-key-0123456789abcdef0123456";

fuzz_target!(|line: &[u8]| {
    let run = RunId::parse("run-fuzz").unwrap();
    // Arbitrary bytes under a key the input cannot know: never a record.
    if let Some(body) = open(KEY, &run, line) {
        // Only reachable by an input that carries a valid MAC: our own seal.
        assert!(line.ends_with(b"\"}"));
        let _ = parse(body);
    }
    // The body as a record: what parses seals, and reopens to the same.
    if let Some(record) = parse(line) {
        let sealed = seal(KEY, &run, &record);
        let body = open(KEY, &run, sealed.strip_suffix(b"\n").unwrap()).expect("a sealed line opens");
        assert_eq!(parse(body), Some(record.clone()));
        // Another run's key does not open it.
        let other = RunId::parse("run-other").unwrap();
        assert!(open(KEY, &other, sealed.strip_suffix(b"\n").unwrap()).is_none());
    }
});
