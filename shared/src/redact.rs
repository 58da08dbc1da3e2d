//! Keeping secret values out of what leaves a sandbox or the server.
//!
//! One [`Redactor`] per set of secret values, in two forms:
//!
//! - bytes ([`Redactor::apply`], or [`Redactor::stream`] chunk by chunk):
//!   every occurrence, overlapping ones included, becomes zero bytes of the
//!   same length, so sizes and offsets hold (snapshot blobs and their
//!   hashes);
//! - text ([`Redactor::redact`]): every occurrence becomes `[redacted]`,
//!   longest value first, so a secret containing another is replaced whole
//!   (progress lines, error messages: a setup step may well echo a token it
//!   was given).

use std::fmt;

use aho_corasick::AhoCorasick;

use crate::error::Error;
use crate::mask::encoded_forms;
use crate::secret::Secret;

/// What [`Redactor::redact`] puts in place of a secret value.
pub const REDACTED: &str = "[redacted]";

/// Replaces every occurrence of any of a set of values. Empty values are
/// ignored. Its `Debug` shows how many values it holds, never them.
#[derive(Clone, Default)]
pub struct Redactor {
    /// The values, longest first (the text form).
    values: Vec<String>,
    matcher: Option<AhoCorasick>,
    /// Longest value minus one: what a match may still need of the next
    /// chunk, so that much is held back between chunks.
    hold: usize,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor").field("values", &self.values.len()).finish_non_exhaustive()
    }
}

impl Redactor {
    /// Every value and its escaped forms ([`encoded_forms`]): a config
    /// file holds a value with a `"` or `\\` escaped.
    pub fn new(given: &[String]) -> Result<Self, Error> {
        let mut values: Vec<String> = Vec::new();
        for form in given.iter().filter(|v| !v.is_empty()).flat_map(|v| encoded_forms(v)) {
            if !values.contains(&form) {
                values.push(form);
            }
        }
        if values.is_empty() {
            return Ok(Self::default());
        }
        // Longest first, so a secret containing another is replaced whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        let hold = values.iter().map(String::len).max().unwrap_or(1) - 1;
        let matcher = AhoCorasick::new(&values)
            .map_err(|e| Error::internal(format!("building the secret matcher: {e}")))?;
        Ok(Self { values, matcher: Some(matcher), hold })
    }

    /// A redactor of the values of `secrets`.
    pub fn from_secrets<'a>(secrets: impl IntoIterator<Item = &'a Secret>) -> Result<Self, Error> {
        let values: Vec<String> = secrets.into_iter().map(|s| s.expose().to_string()).collect();
        Self::new(&values)
    }

    /// `text` with every secret value replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), REDACTED);
            }
        }
        out
    }

    /// The most bytes a [`Zeroing`] pass holds back between chunks.
    pub fn hold(&self) -> usize {
        self.hold
    }

    /// A zeroing pass over one file; `all` zeroes every byte.
    pub fn stream(&self, all: bool) -> Zeroing<'_> {
        Zeroing { redactor: self, all, held: Vec::new(), held_zero: Vec::new() }
    }

    /// `data` zeroed in one go.
    pub fn apply(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        let mut z = self.stream(false);
        z.push(data, &mut out);
        z.finish(&mut out);
        out
    }
}

/// One file's pass through a [`Redactor`]: feed chunks, collect output.
/// Searches the original bytes (so overlapping values are all found) and
/// holds back the tail a match could still extend into.
pub struct Zeroing<'a> {
    redactor: &'a Redactor,
    all: bool,
    held: Vec<u8>,
    held_zero: Vec<bool>,
}

impl Zeroing<'_> {
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.all {
            out.resize(out.len() + chunk.len(), 0);
            return;
        }
        let Some(matcher) = &self.redactor.matcher else {
            out.extend_from_slice(chunk);
            return;
        };
        let mut window = std::mem::take(&mut self.held);
        window.extend_from_slice(chunk);
        let mut zero = std::mem::take(&mut self.held_zero);
        zero.resize(window.len(), false);
        for m in matcher.find_overlapping_iter(&window) {
            zero[m.start()..m.end()].fill(true);
        }
        let emit = window.len() - self.redactor.hold.min(window.len());
        out.extend(window[..emit].iter().zip(&zero[..emit]).map(|(b, z)| if *z { 0 } else { *b }));
        self.held = window[emit..].to_vec();
        self.held_zero = zero[emit..].to_vec();
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let held = std::mem::take(&mut self.held);
        let zero = std::mem::take(&mut self.held_zero);
        out.extend(
            held.iter()
                .zip(zero.iter().chain(std::iter::repeat(&false)))
                .map(|(b, z)| if *z { 0 } else { *b }),
        );
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn zeroing_replaces_every_occurrence_including_overlaps() {
        let r = Redactor::new(&["abc".into(), "cde".into(), String::new()]).unwrap();
        assert_eq!(r.apply(b"xxabcdexx"), b"xx\0\0\0\0\0xx");
        assert_eq!(r.apply(b"abcabc"), vec![0u8; 6]);
        assert_eq!(r.apply(b"nothing"), b"nothing");
        let none = Redactor::new(&[]).unwrap();
        assert_eq!(none.apply(b"abc"), b"abc");
    }

    proptest! {
        /// Chunk boundaries never change the result: a value split across
        /// two reads is zeroed like one inside a single read.
        #[test]
        fn chunking_does_not_matter(
            data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'c')], 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let r = Redactor::new(&["abca".into(), "bb".into(), "cab".into()]).unwrap();
            let whole = r.apply(&data);
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= data.len()).collect();
            cuts.sort();
            let mut out = Vec::new();
            let mut z = r.stream(false);
            let mut from = 0;
            for c in cuts {
                z.push(&data[from..c], &mut out);
                from = c;
            }
            z.push(&data[from..], &mut out);
            z.finish(&mut out);
            prop_assert_eq!(out, whole);
        }
    }

    #[test]
    fn secret_values_are_redacted_longest_first() {
        let secrets = [Secret::new("tok"), Secret::new("tok-long")];
        let r = Redactor::from_secrets(&secrets).unwrap();
        assert_eq!(r.redact("x tok-long y tok z"), "x [redacted] y [redacted] z");
    }

    #[test]
    fn escaped_forms_are_zeroed_too() {
        let value = r#"quo"te\back"#.to_string();
        let r = Redactor::new(std::slice::from_ref(&value)).unwrap();
        let json = serde_json::to_string(&value).unwrap();
        let zeroed = r.apply(json.as_bytes());
        assert_eq!(zeroed.iter().filter(|b| **b == 0).count(), json.len() - 2, "{zeroed:?}");
        assert_eq!(r.apply(value.as_bytes()), vec![0u8; value.len()]);
    }

    #[test]
    fn debug_never_shows_a_value() {
        let r = Redactor::new(&["hunter2-value".into()]).unwrap();
        let shown = format!("{r:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(Redactor::default().redact("hunter2"), "hunter2");
    }
}
