//! One concept, one name (`/work/shared/style.md`, 20): the names a concept
//! was retired from stay out of the product's Rust sources, and a builder
//! method stores into the field of its own name.
//!
//! What may still say a retired name: a `#[doc(alias = ...)]` line (the
//! seed's names are search terms), the seed's own names where a doc quotes
//! its API ([`SEED_NAMES`]), and the lines in [`ALLOWED`], each with its reason.
//! The Python half of the binding (`python/mongoelector/`) is the seed's
//! compatibility layer and is not read.

use std::path::{Path, PathBuf};

use super::tests::{root, rust_files, SHIPPED};

/// A retired name and what replaced it.
struct Retired {
    /// The name, lower case.
    name: &'static str,
    /// What to say instead.
    instead: &'static str,
    /// A whole word (letters and digits around it end it; `_` does too, so
    /// `last_token` holds the word `token`), or anywhere (`masters`, `on_master`).
    word: bool,
    /// A whole identifier: `_` does not end it (`step_down` is no `step`).
    ident: bool,
    /// Only where the line also holds this (the fence is the concept `token`
    /// was retired from; a dashboard token or a `CancellationToken` stays).
    with: Option<&'static str>,
    /// Only in files under these directories (relative to the root), when not empty.
    under: &'static [&'static str],
    /// Only in code: comments may use it (mongolock's comments speak of a
    /// leadership term).
    code_only: bool,
}

const fn retired(name: &'static str, instead: &'static str) -> Retired {
    Retired { name, instead, word: true, ident: false, with: None, under: &[], code_only: false }
}

/// The retired names.
const RETIRED: &[Retired] = &[
    // A fencing number is a fence.
    retired("fencing token", "fence"),
    retired("fencing tokens", "fences"),
    retired("claim token", "the claim's fence"),
    retired("term token", "the term's fence"),
    retired("lock token", "the lock's fence"),
    retired("lock tokens", "the lock's fences"),
    Retired { with: Some("fence"), ..retired("token", "fence") },
    Retired { with: Some("fence"), ..retired("tokens", "fences") },
    // Who leads is the leader.
    Retired { word: false, ..retired("master", "leader") },
    // The elector's periodic round.
    retired("ticker", "round"),
    Retired { under: &["mongoelector/src"], ..retired("tick", "round") },
    Retired { under: &["mongoelector/src"], ..retired("ticks", "rounds") },
    Retired { ident: true, code_only: true, ..retired("last_poll", "last_round") },
    Retired { under: &["mongoelector/src"], ..retired("main loop", "campaign") },
    Retired { under: &["mongoelector/src"], ..retired("main_loop", "campaign::run") },
    // A claim or lease whose time passed has lapsed.
    retired("stuck", "lapsed"),
    // mongolock's `KeptLease` is a kept lease; a term is the elector's.
    Retired { under: &["mongolock/src"], code_only: true, ident: true, ..retired("term", "kept") },
    // A lock waiter's re-check interval is its poll interval.
    Retired {
        under: &["mongolock/src", "mongoelector/src"],
        code_only: true,
        ident: true,
        ..retired("step", "poll_interval")
    },
];

/// The seed's names, which docs quote as its API (the Python `MongoElector`'s
/// `ismaster`, its `onmaster` callback, …); the Rust API gives them as doc aliases.
const SEED_NAMES: &[&str] = &[
    "onmasterloss",
    "onmaster",
    "ismaster",
    "is_master",
    "master_exists",
    "on_master_loss",
    "on_master",
    "while_master",
];

/// Phrases that hold a retired name for another concept: a
/// `CancellationToken` is a cancellation token, never a fence's.
const OTHER_CONCEPTS: &[&str] = &["cancellation token", "cancellationtoken"];

/// Lines that may say a retired name, by file and a part of the line.
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "mongocoord/src/dashboard/routes.rs",
        r#""stuck""#,
        "a task list's state filter still reads `stuck`, lapsed's former name, from saved links",
    ),
    (
        "mongoelector/src/status.rs",
        r#"LAST_ROUND: &str = "last_poll""#,
        "status documents store a node's last round under the seed's name, as every one written so far has it",
    ),
];

/// The Rust sources the product is made of, its tests included, the lab's, and
/// the test support's.
fn sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for c in SHIPPED.iter().chain(&["lab", "store-test"]) {
        rust_files(&root().join(c).join("src"), &mut files);
        rust_files(&root().join(c).join("tests"), &mut files);
    }
    rust_files(&root().join("python/src"), &mut files);
    files
}

/// Where `name` occurs in `line` (lower case) as `r` asks.
fn occurs(line: &str, r: &Retired) -> bool {
    let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || (r.ident && c == '_')));
    line.match_indices(r.name).any(|(at, _)| {
        !r.word || (boundary(line[..at].chars().next_back()) && boundary(line[at + r.name.len()..].chars().next()))
    })
}

/// The retired names in one file's text, as `path:line: message`.
fn retired_names_in(path: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.contains("doc(alias") || ALLOWED.iter().any(|(f, part, _)| path.ends_with(f) && line.contains(part)) {
            continue;
        }
        let mut lower = line.to_lowercase();
        for other in SEED_NAMES.iter().chain(OTHER_CONCEPTS) {
            lower = lower.replace(other, "");
        }
        let code = lower.split("//").next().unwrap_or("");
        for r in RETIRED {
            let here = r.under.is_empty() || r.under.iter().any(|d| path.starts_with(d));
            let text = if r.code_only { code } else { &lower };
            if here && r.with.is_none_or(|w| text.contains(w)) && occurs(text, r) {
                out.push(format!("{path}:{}: `{}` is retired: say `{}` ({})", i + 1, r.name, r.instead, line.trim()));
            }
        }
    }
    out
}

/// Setters that store into a field of another name, each with its reason.
const OTHER_FIELD: &[(&str, &str, &str)] = &[
    ("store-trait/src/ops/mutation.rs", "grant", "a verb: it sets the mutation's lease operation to a grant"),
    ("store-trait/src/ops/mutation.rs", "gc_after", "it sets when the document is collected (`gc`)"),
    ("store-trait/src/ops/query.rs", "when", "a combinator: it adds a condition"),
    ("mongoelector/src/builder.rs", "on_leader_term", "`on_leader` and `on_leader_term` fill one slot"),
];

/// A builder method that stores its argument stores it into the field of its
/// own name (`with_` aside): `fn ttl(mut self, ttl: Duration) -> Self {
/// self.ttl = ttl; … }`, so the field a reader finds is the concept the caller
/// set. Handing the value to an inner builder's method of the same name is
/// fine; [`OTHER_FIELD`] lists the setters that are no plain setting.
fn builder_fields_in(path: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("pub fn ") else { continue };
        let Some((name, params)) = rest.split_once('(') else { continue };
        if OTHER_FIELD.iter().any(|(f, n, _)| path.ends_with(f) && *n == name) {
            continue;
        }
        let setting = name.strip_prefix("with_").unwrap_or(name);
        if !params.starts_with("mut self,") || !line.trim_end().ends_with("-> Self {") {
            continue;
        }
        let Some(store) = lines.get(i + 1).map(|l| l.trim()).filter(|l| l.starts_with("self.")) else { continue };
        let Some((lhs, rhs)) = store.split_once(" = ") else { continue };
        let field = lhs.rsplit('.').next().unwrap_or(lhs);
        if field != setting && !rhs.contains(&format!(".{name}(")) {
            out.push(format!("{path}:{}: `{name}` stores into `{field}`: name the field `{setting}`", i + 2));
        }
    }
    out
}

fn shown(f: &Path) -> String {
    f.strip_prefix(root()).unwrap_or(f).display().to_string()
}

#[test]
fn retired_names_stay_retired() {
    let files = sources();
    assert!(files.len() > 50, "found the sources");
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        found.extend(retired_names_in(&shown(f), &text));
    }
    assert!(found.is_empty(), "retired names:\n{}", found.join("\n"));
}

#[test]
fn builder_methods_store_into_fields_of_their_name() {
    let mut found = Vec::new();
    for f in sources() {
        let text = std::fs::read_to_string(&f).unwrap();
        found.extend(builder_fields_in(&shown(&f), &text));
    }
    assert!(found.is_empty(), "builder methods and their fields disagree:\n{}", found.join("\n"));
}

#[test]
fn the_checks_see_what_they_ban() {
    let hits = |path: &str, text: &str| retired_names_in(path, text).len();
    assert_eq!(hits("mongoagent/src/a.rs", "let token = guard.fence();"), 1);
    assert_eq!(hits("mongoagent/src/a.rs", "let last_token = 0; // the fence"), 1);
    assert_eq!(hits("mongocoord/src/a.rs", "token_file: PathBuf, // the dashboard's"), 0);
    assert_eq!(hits("mongoagent/src/a.rs", "/// the fencing token"), 1);
    assert_eq!(hits("mongoelector/tests/it/a.rs", "fn two_masters() {}"), 1);
    assert_eq!(hits("mongoelector/src/a.rs", "#[doc(alias = \"ismaster\")]"), 0);
    assert_eq!(hits("mongoelector/src/lib.rs", "//! | `ismaster`, `onmasterloss` | [`Elector::is_leader`] |"), 0);
    assert_eq!(hits("mongoelector/src/a.rs", "inner.callbacks.tick();"), 1);
    assert_eq!(hits("mongoagent/src/schedule/a.rs", "the next tick"), 0);
    assert_eq!(hits("mongoagent/src/a.rs", "pub stuck: u64,"), 1);
    assert_eq!(hits("mongolock/src/a.rs", "let term = Arc::new(kept);"), 1);
    assert_eq!(hits("mongolock/src/a.rs", "/// a leadership term's rounds"), 0);
    assert_eq!(hits("mongoelector/src/a.rs", "let term = self.live_term();"), 0);
    assert_eq!(hits("mongoelector/src/a.rs", "inner.step_down(\"lost\", false).await;"), 0);
    assert_eq!(hits("mongolock/src/a.rs", "self.step = every;"), 1);
    assert_eq!(hits("mongoelector/src/a.rs", "/// its fence, its cancellation token."), 0);
    let stores = |text: &str| builder_fields_in("a.rs", text).len();
    assert_eq!(stores("    pub fn ttl(mut self, d: Duration) -> Self {\n        self.lease = d;"), 1);
    assert_eq!(stores("    pub fn ttl(mut self, d: Duration) -> Self {\n        self.ttl = d;"), 0);
    assert_eq!(stores("    pub fn ttl(mut self, d: Duration) -> Self {\n        self.leases = self.leases.ttl(d);"), 0);
    assert_eq!(
        stores("    pub fn collection(mut self, n: &str) -> Self {\n        self.leases.collection = n.into();"),
        0
    );
    assert_eq!(stores("    pub fn with_nonce(mut self, n: Nonce) -> Self {\n        self.nonce = n;"), 0);
}
