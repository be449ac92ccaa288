//! Text from the database on an operator's terminal. Agent names, task ids,
//! lock keys and holders, election names and a failed command's stderr are
//! anyone's bytes: written raw, an escape sequence among them could retitle or
//! clear the terminal, or hide what follows, and a bidi control could make a
//! line read as something else. Every human-readable table and line goes
//! through [`safe`]; `--json` output is serde's, which escapes C0 controls,
//! and is left exact.

use std::borrow::Cow;

/// Whether `c` must not reach a terminal as itself: C0 and C1 controls and
/// DEL (ESC, CR, BEL, tab and line feed among them), the bidi embeddings,
/// overrides and isolates (U+202A–U+202E, U+2066–U+2069) and marks (U+200E,
/// U+200F, U+061C), and the line and paragraph separators.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
        || matches!(c, '\u{2028}' | '\u{2029}')
}

/// `s` with every character that must not reach a terminal as itself written
/// as a visible `\uXXXX` escape (ESC as `\u001b`, RLO as `\u202e`): the form
/// JSON uses, so a line of JSON stays JSON.
pub(crate) fn safe(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The most characters a table cell shows; a longer one is cut, ending in
/// `…` (`--json` has every value whole). Widths stay far below what
/// `format!` can pad.
const MAX_CELL: usize = 1000;

/// Prints a table of cells, each made [`safe`] and cut at [`MAX_CELL`]
/// characters, in columns two spaces apart.
pub(crate) fn print_table(header: &[&str], rows: &[Vec<String>]) {
    for l in table_lines(header, rows) {
        println!("{l}");
    }
}

/// The lines [`print_table`] prints.
fn table_lines(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let cut = |c: Cow<'_, str>| -> String {
        match c.char_indices().nth(MAX_CELL - 1) {
            Some((at, _)) if c.chars().count() > MAX_CELL => format!("{}…", &c[..at]),
            _ => c.into_owned(),
        }
    };
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| cut(safe(c))).collect()).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let padded = cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)));
        padded.collect::<Vec<_>>().join("  ")
    };
    let mut out = vec![line(header.to_vec()).trim_end().to_owned()];
    for r in &rows {
        out.push(line(r.iter().map(AsRef::as_ref).collect()).trim_end().to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell longer than [`MAX_CELL`] characters is cut (a wider one made
    /// `format!`'s padding panic past 65,535), and the columns still line up.
    #[test]
    fn long_cells_are_cut() {
        let long = "é".repeat(70_000);
        let lines = table_lines(&["NAME", "N"], &[vec![long, "1".into()], vec!["a".into(), "2".into()]]);
        let first = &lines[1];
        assert_eq!(first.chars().count(), MAX_CELL + 3, "{}", &first[first.len() - 10..]);
        assert!(first.ends_with("…  1"));
        assert_eq!(lines[2].find('2').map(|b| lines[2][..b].chars().count()), Some(MAX_CELL + 2));
    }

    #[test]
    fn controls_and_bidi_become_visible_escapes() {
        for (raw, shown) in [
            ("plain name, ünïcode", "plain name, ünïcode"),
            ("\x1b]0;pwned\x07", "\\u001b]0;pwned\\u0007"),
            ("\x1b[2J\r\n\t", "\\u001b[2J\\u000d\\u000a\\u0009"),
            ("del\x7f csi\u{9b}", "del\\u007f csi\\u009b"),
            ("a\u{202e}b\u{2066}c\u{2069}", "a\\u202eb\\u2066c\\u2069"),
        ] {
            assert_eq!(safe(raw), shown, "{raw:?}");
        }
        // A JSON line stays JSON: the escapes are JSON's.
        let line = serde_json::json!({ "agent": "a\u{202e}\u{7f}" }).to_string();
        let v: serde_json::Value = serde_json::from_str(&safe(&line)).unwrap();
        assert_eq!(v["agent"], "a\u{202e}\u{7f}");
    }
}
