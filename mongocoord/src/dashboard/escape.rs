//! Text made safe for the markup it goes into: element content and quoted
//! attributes ([`esc`]), query strings ([`url`]), a table cell ([`cell`]).
//! Every page and form escapes through here.

use std::fmt::Write as _;

use serde_json::Value;

/// Text made safe for HTML element content and quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A query-string component.
pub(crate) fn url(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(char::from(b)),
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// A JSON value as the text of a table cell: `-` for null, escaped.
pub(crate) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => esc(s),
        other => esc(&other.to_string()),
    }
}
