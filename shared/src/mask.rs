//! Masking secret values in what leaves a sandbox: every occurrence of a
//! value (or of one of its escaped forms, [`encoded_forms`]) becomes the
//! marker `[secret:NAME]`, in stream order.
//!
//! [`Masks`] holds the values; [`MaskStream`] masks a byte stream chunk by
//! chunk with the same result whatever the chunking: it holds back only the
//! tail that could still begin a value (the longest suffix that is a proper
//! prefix of one), and flushes it at the end. Newlines are ignored while
//! matching, so a value a command prints across two lines (or a multi-line
//! value, a PEM key) is masked too; the newlines inside a masked stretch go
//! with it. Overlapping or adjacent occurrences become one marker, named
//! after the value that starts it (the longest one starting there).
//!
//! [`LineMasker`] is the form for journals: complete lines in (each with the
//! raw offset just past its newline), masked complete lines out, each with
//! the raw offset a reader resumes from. A reader that starts at such an
//! offset gets the same bytes as one that read from the start.

use std::fmt;

use aho_corasick::AhoCorasick;

use crate::error::Error;

/// Shorter values are refused where they are declared: masking them would
/// shred ordinary text.
pub const MIN_SECRET_LEN: usize = 8;
/// Longer values are refused where they are declared (they bound what a
/// masker holds back).
pub const MAX_SECRET_LEN: usize = 64 << 10;

/// What replaces an occurrence of the secret `name`.
pub fn marker(name: &str) -> String {
    format!("[secret:{name}]")
}

/// Why `value` cannot be a secret value, if it cannot.
pub fn refusal(value: &str) -> Option<String> {
    if value.len() < MIN_SECRET_LEN {
        Some(format!(
            "a secret value must be at least {MIN_SECRET_LEN} bytes long (got {}): masking a shorter one would shred ordinary text",
            value.len()
        ))
    } else if value.len() > MAX_SECRET_LEN {
        Some(format!("a secret value must be at most {MAX_SECRET_LEN} bytes long (got {})", value.len()))
    } else {
        None
    }
}

/// `value` and the forms it takes once written into a config file or a
/// script: inside a JSON string (serde's escaping, and `\uXXXX` for every
/// non-ASCII character), a TOML basic string, a shell single-quoted string
/// (`'` as `'\''`) and a shell double-quoted string. Without the quotes
/// around them; only the forms that differ from the value.
pub fn encoded_forms(value: &str) -> Vec<String> {
    let json = serde_json::to_string(value).expect("a string serializes");
    let json = json[1..json.len() - 1].to_string();
    let mut json_ascii = String::new();
    for c in json.chars() {
        if c.is_ascii() {
            json_ascii.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                json_ascii.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    let mut toml = String::new();
    for c in value.chars() {
        match c {
            '"' => toml.push_str("\\\""),
            '\\' => toml.push_str("\\\\"),
            '\u{8}' => toml.push_str("\\b"),
            '\t' => toml.push_str("\\t"),
            '\n' => toml.push_str("\\n"),
            '\u{c}' => toml.push_str("\\f"),
            '\r' => toml.push_str("\\r"),
            c if c.is_control() => toml.push_str(&format!("\\u{:04X}", c as u32)),
            c => toml.push(c),
        }
    }
    let single = value.replace('\'', r"'\''");
    let mut double = String::new();
    for c in value.chars() {
        if matches!(c, '"' | '\\' | '$' | '`') {
            double.push('\\');
        }
        double.push(c);
    }
    let mut forms = vec![value.to_string()];
    for f in [json, json_ascii, toml, single, double] {
        if !forms.contains(&f) {
            forms.push(f);
        }
    }
    forms
}

/// A set of named secret values and the matcher over their forms. Its
/// `Debug` shows the names, never a value.
#[derive(Clone, Default)]
pub struct Masks {
    /// Secret names, for the markers.
    names: Vec<String>,
    /// Patterns (forms without newlines) and the name each belongs to.
    patterns: Vec<(Vec<u8>, usize)>,
    matcher: Option<AhoCorasick>,
}

impl fmt::Debug for Masks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masks").field("names", &self.names).finish_non_exhaustive()
    }
}

impl Masks {
    /// Masks of `(name, value)` pairs (a name may come with several
    /// values). Empty values are ignored.
    pub fn new<N: AsRef<str>, V: AsRef<str>>(named: impl IntoIterator<Item = (N, V)>) -> Result<Self, Error> {
        let mut masks = Self::default();
        for (name, value) in named {
            let (name, value) = (name.as_ref(), value.as_ref());
            if value.is_empty() {
                continue;
            }
            let index = match masks.names.iter().position(|n| n == name) {
                Some(i) => i,
                None => {
                    masks.names.push(name.to_string());
                    masks.names.len() - 1
                }
            };
            for form in encoded_forms(value) {
                let pattern: Vec<u8> = form.bytes().filter(|b| *b != b'\n').collect();
                if !pattern.is_empty() && !masks.patterns.iter().any(|(p, _)| *p == pattern) {
                    masks.patterns.push((pattern, index));
                }
            }
        }
        if !masks.patterns.is_empty() {
            let matcher = AhoCorasick::new(masks.patterns.iter().map(|(p, _)| p))
                .map_err(|e| Error::internal(format!("building the secret matcher: {e}")))?;
            masks.matcher = Some(matcher);
        }
        Ok(masks)
    }

    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// The names of the secrets masked.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The length of the longest pattern (what a scan overlaps reads by).
    pub fn longest(&self) -> usize {
        self.patterns.iter().map(|(p, _)| p.len()).max().unwrap_or(0)
    }

    /// The names of the secrets occurring in `data` (newlines not ignored).
    pub fn names_in(&self, data: &[u8]) -> Vec<String> {
        let Some(matcher) = &self.matcher else { return Vec::new() };
        let mut found: Vec<usize> =
            matcher.find_overlapping_iter(data).map(|m| self.patterns[m.pattern().as_usize()].1).collect();
        found.sort_unstable();
        found.dedup();
        found.into_iter().map(|i| self.names[i].clone()).collect()
    }

    /// A streaming pass starting at raw offset `offset`.
    pub fn stream(&self, offset: u64) -> MaskStream<'_> {
        MaskStream { masks: self, base: offset, pending: Vec::new(), in_run: false }
    }

    /// `data` masked in one go.
    pub fn mask_bytes(&self, data: &[u8]) -> Vec<u8> {
        if self.is_empty() {
            return data.to_vec();
        }
        let mut out = Vec::with_capacity(data.len());
        let mut stream = self.stream(0);
        stream.push(data, &mut out, &mut Vec::new());
        stream.finish(&mut out, &mut Vec::new());
        out
    }

    /// `text` masked in one go.
    pub fn mask(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_string();
        }
        String::from_utf8_lossy(&self.mask_bytes(text.as_bytes())).into_owned()
    }

    /// The longest view position from which `view[s..]` is a proper prefix
    /// of a pattern: a match may still start there.
    fn hold_from(&self, view: &[u8]) -> usize {
        let mut from = view.len();
        for (p, _) in &self.patterns {
            let earliest = view.len().saturating_sub(p.len() - 1);
            for s in earliest..from {
                let tail = &view[s..];
                if tail[0] == p[0] && p.starts_with(tail) {
                    from = s;
                    break;
                }
            }
        }
        from
    }
}

/// One raw byte not yet emitted, with what masking decided about it so far.
#[derive(Clone, Copy)]
struct Pending {
    byte: u8,
    masked: bool,
    /// The name (and length) of the longest match starting at this byte.
    starts: Option<(usize, usize)>,
}

/// A masking pass over one stream; see the module docs.
pub struct MaskStream<'a> {
    masks: &'a Masks,
    /// Raw offset of `pending[0]`.
    base: u64,
    pending: Vec<Pending>,
    /// The last byte emitted was masked: a masked byte that follows
    /// continues its marker.
    in_run: bool,
}

impl MaskStream<'_> {
    /// Feed raw bytes; masked output is appended to `out`. For every
    /// unmasked newline emitted, `ends` gets (length of `out` just past it,
    /// raw offset just past it).
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>, ends: &mut Vec<(usize, u64)>) {
        self.pending.extend(chunk.iter().map(|&byte| Pending { byte, masked: false, starts: None }));
        let Some(matcher) = &self.masks.matcher else {
            let n = self.pending.len();
            self.emit(n, out, ends);
            return;
        };
        // Match on the bytes without their newlines.
        let (view, at): (Vec<u8>, Vec<usize>) = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.byte != b'\n')
            .map(|(i, p)| (p.byte, i))
            .unzip();
        for m in matcher.find_overlapping_iter(&view) {
            let (start, end) = (at[m.start()], at[m.end() - 1]);
            for p in &mut self.pending[start..=end] {
                p.masked = true;
            }
            let len = m.end() - m.start();
            let name = self.masks.patterns[m.pattern().as_usize()].1;
            // The longest match starting here names the marker.
            let first = &mut self.pending[start];
            if first.starts.is_none_or(|(_, l)| len > l) {
                first.starts = Some((name, len));
            }
        }
        let hold = self.masks.hold_from(&view);
        let keep = if hold < view.len() { at[hold] } else { self.pending.len() };
        self.emit(keep, out, ends);
    }

    /// No more input: emit everything held back.
    pub fn finish(&mut self, out: &mut Vec<u8>, ends: &mut Vec<(usize, u64)>) {
        let n = self.pending.len();
        self.emit(n, out, ends);
    }

    fn emit(&mut self, n: usize, out: &mut Vec<u8>, ends: &mut Vec<(usize, u64)>) {
        for (i, p) in self.pending.drain(..n).enumerate() {
            if p.masked {
                if !self.in_run {
                    let name = p.starts.map_or("", |(i, _)| self.masks.names[i].as_str());
                    out.extend_from_slice(marker(name).as_bytes());
                }
                self.in_run = true;
                continue;
            }
            self.in_run = false;
            out.push(p.byte);
            if p.byte == b'\n' {
                ends.push((out.len(), self.base + i as u64 + 1));
            }
        }
        self.base += n as u64;
    }
}

/// Masks a journal line by line; see the module docs.
pub struct LineMasker<'a> {
    stream: MaskStream<'a>,
    /// Masked output not yet ending in a newline.
    partial: Vec<u8>,
}

impl<'a> LineMasker<'a> {
    /// A pass over the journal from raw offset `from` (a line start).
    pub fn new(masks: &'a Masks, from: u64) -> Self {
        Self { stream: masks.stream(from), partial: Vec::new() }
    }

    /// Feed one complete raw line (without its newline); returns the masked
    /// lines it completed, each with the raw offset just past it.
    pub fn push(&mut self, line: &[u8]) -> Vec<(Vec<u8>, u64)> {
        let mut ends = Vec::new();
        self.stream.push(line, &mut self.partial, &mut ends);
        self.stream.push(b"\n", &mut self.partial, &mut ends);
        self.lines(ends)
    }

    /// The end of the journal's output: the lines held back.
    pub fn finish(&mut self) -> Vec<(Vec<u8>, u64)> {
        let mut ends = Vec::new();
        self.stream.finish(&mut self.partial, &mut ends);
        self.lines(ends)
    }

    fn lines(&mut self, ends: Vec<(usize, u64)>) -> Vec<(Vec<u8>, u64)> {
        let mut out = Vec::with_capacity(ends.len());
        let mut from = 0;
        for (end, raw_end) in ends {
            out.push((self.partial[from..end - 1].to_vec(), raw_end));
            from = end;
        }
        self.partial.drain(..from);
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn masks(pairs: &[(&str, &str)]) -> Masks {
        Masks::new(pairs.iter().copied()).unwrap()
    }

    fn streamed(m: &Masks, data: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut s = m.stream(0);
        let mut from = 0;
        for &c in cuts {
            s.push(&data[from..c], &mut out, &mut Vec::new());
            from = c;
        }
        s.push(&data[from..], &mut out, &mut Vec::new());
        s.finish(&mut out, &mut Vec::new());
        out
    }

    #[test]
    fn a_value_becomes_its_marker() {
        let m = masks(&[("TOK", "supersecretvalue123")]);
        assert_eq!(m.mask("the token is supersecretvalue123!"), "the token is [secret:TOK]!");
        assert_eq!(m.mask("twice supersecretvalue123supersecretvalue123."), "twice [secret:TOK].");
        assert_eq!(m.mask("nothing here"), "nothing here");
        assert_eq!(Masks::default().mask("supersecretvalue123"), "supersecretvalue123");
    }

    #[test]
    fn a_value_split_across_reads_is_masked() {
        let m = masks(&[("TOK", "supersecretvalue123")]);
        let data = b"a supersecretvalue123 b";
        for cut in 0..=data.len() {
            assert_eq!(streamed(&m, data, &[cut]), b"a [secret:TOK] b", "cut at {cut}");
        }
        assert_eq!(streamed(&m, data, &[3, 5, 9, 12, 20]), b"a [secret:TOK] b");
    }

    #[test]
    fn a_value_split_across_lines_is_masked_and_the_lines_join() {
        let m = masks(&[("TOK", "supersecretvalue123")]);
        assert_eq!(m.mask("x supersec\nretvalue123 y\nz\n"), "x [secret:TOK] y\nz\n");
    }

    #[test]
    fn overlapping_values_become_one_marker_named_by_the_longest_first() {
        let m = masks(&[("A", "abcdefgh"), ("B", "efghijkl"), ("LONG", "abcdefghXYZ12345")]);
        // A and B overlap: neither survives, one marker.
        assert_eq!(m.mask("-abcdefghijkl-"), "-[secret:A]-");
        // LONG contains A: the longest match starting there names it.
        assert_eq!(m.mask("-abcdefghXYZ12345-"), "-[secret:LONG]-");
        assert_eq!(m.mask("-efghijkl-abcdefgh-"), "-[secret:B]-[secret:A]-");
    }

    #[test]
    fn the_held_back_tail_is_flushed_at_the_end() {
        let m = masks(&[("TOK", "supersecretvalue123")]);
        let mut out = Vec::new();
        let mut s = m.stream(0);
        s.push(b"ends with supersec", &mut out, &mut Vec::new());
        // "supersec" could still begin the value: held back.
        assert_eq!(out, b"ends with ");
        s.finish(&mut out, &mut Vec::new());
        assert_eq!(out, b"ends with supersec");
    }

    #[test]
    fn escaped_forms_are_masked() {
        let value = r#"quo"te\back'slash$x"#;
        let m = masks(&[("K", value)]);
        let json = serde_json::to_string(value).unwrap();
        assert_eq!(m.mask(&format!("{{\"h\":{json}}}")), "{\"h\":\"[secret:K]\"}");
        assert_eq!(m.mask(r#"key = "quo\"te\\back'slash$x""#), r#"key = "[secret:K]""#);
        assert_eq!(m.mask(r#"X='quo"te\back'\''slash$x'"#), "X='[secret:K]'");
        assert_eq!(m.mask(r#"X="quo\"te\\back'slash\$x""#), "X=\"[secret:K]\"");
        let unicode = masks(&[("U", "pässwörd-123")]);
        assert_eq!(unicode.mask(r#""p\u00e4ssw\u00f6rd-123""#), "\"[secret:U]\"");
    }

    #[test]
    fn journal_lines_keep_their_raw_offsets() {
        let m = masks(&[("TOK", "supersecretvalue123")]);
        let mut lm = LineMasker::new(&m, 100);
        // Raw: "a supersec\n" (100..111), "retvalue123 b\n" (111..125), "c\n" (125..127)
        assert_eq!(lm.push(b"a supersec"), vec![]);
        assert_eq!(lm.push(b"retvalue123 b"), vec![(b"a [secret:TOK] b".to_vec(), 125)]);
        assert_eq!(lm.push(b"c"), vec![(b"c".to_vec(), 127)]);
        assert!(lm.finish().is_empty());
        let mut held = LineMasker::new(&m, 0);
        assert_eq!(held.push(b"tail super"), vec![]);
        assert_eq!(held.finish(), vec![(b"tail super".to_vec(), 11)]);
    }

    #[test]
    fn declared_values_have_a_minimum_length() {
        assert!(refusal("short").unwrap().contains("at least 8 bytes"));
        assert!(refusal("12345678").is_none());
        assert!(refusal(&"x".repeat(MAX_SECRET_LEN + 1)).is_some());
    }

    #[test]
    fn debug_shows_names_only() {
        let m = masks(&[("TOK", "hunter2-value")]);
        let shown = format!("{m:?}");
        assert!(shown.contains("TOK") && !shown.contains("hunter2"), "{shown}");
    }

    proptest! {
        /// Chunk boundaries never change the result, and no value survives.
        #[test]
        fn chunking_does_not_matter(
            data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'c'), Just(b'\n')], 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let m = masks(&[("X", "abcabcab"), ("Y", "bbbbbbbb"), ("Z", "cabcabca")]);
            let whole = m.mask_bytes(&data);
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= data.len()).collect();
            cuts.sort();
            prop_assert_eq!(&streamed(&m, &data, &cuts), &whole);
            let joined: Vec<u8> = whole.iter().copied().filter(|b| *b != b'\n').collect();
            for v in [&b"abcabcab"[..], b"bbbbbbbb", b"cabcabca"] {
                prop_assert!(!joined.windows(v.len()).any(|w| w == v));
            }
        }

        /// A line reader resuming at any offset it was given sees what one
        /// reading from the start sees.
        #[test]
        fn resuming_at_a_returned_offset_is_the_same(
            data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'\n')], 0..200),
        ) {
            let m = masks(&[("X", "abababab"), ("Y", "bbaabbaa")]);
            let (lines, _) = crate::journal::split_lines(&data, 0);
            let run = |from: u64| {
                let mut lm = LineMasker::new(&m, from);
                let mut out = Vec::new();
                for l in lines.iter().filter(|l| l.end_offset - l.bytes.len() as u64 > from) {
                    out.extend(lm.push(l.bytes));
                }
                out.extend(lm.finish());
                out
            };
            let all = run(0);
            for (i, (_, end)) in all.iter().enumerate() {
                prop_assert_eq!(&run(*end), &all[i + 1..].to_vec());
            }
        }
    }
}
