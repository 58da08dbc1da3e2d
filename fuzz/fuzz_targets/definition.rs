//! The definition loader (`sandhold definition put FILE`, `run --definition`):
//! any text, as TOML, JSON or unnamed, is a definition with an id or an
//! error, never a panic.
#![no_main]

use control_plane::cli::definition_file::from_text;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u8, &str)| {
    let (which, text) = input;
    let ext = ["toml", "json", ""][usize::from(which) % 3];
    if let Ok(definition) = from_text(text, ext) {
        assert!(!definition.id.is_empty());
    }
});
