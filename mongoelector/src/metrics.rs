//! The figures `mongoelector` emits through the [`metrics`](https://docs.rs/metrics)
//! facade, so an application that installs a `metrics` recorder (a Prometheus
//! exporter, say) gets them without the CLI; without one they cost next to
//! nothing. Every name starts with `mongoelector_`; [`describe`] gives the
//! recorder their help texts. They are this process's view: each node reports
//! its own terms.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | [`TERM_CHANGES`] | counter | `election`, `change` (`won`, `ended`) | terms this node began and ended |
//! | [`LEADER`] | gauge | `election` | 1 while this node leads, else 0 |
//!
//! The lease under a term is a lock's: its acquisition and loss also count
//! in `mongolock`'s figures ([`mongolock::metrics`]).

/// `mongoelector_term_changes_total{election, change}`: this node won
/// (`change="won"`) or ended (`change="ended"`: lost, released or stopped) a
/// term.
pub const TERM_CHANGES: &str = "mongoelector_term_changes_total";

/// `mongoelector_leader{election}`: 1 while this node leads the election.
pub const LEADER: &str = "mongoelector_leader";

/// Tells the installed recorder what each figure means (its help text). Call
/// it once after installing the recorder; figures are emitted without it too.
pub fn describe() {
    ::metrics::describe_counter!(TERM_CHANGES, "Terms this node won or ended, by election");
    ::metrics::describe_gauge!(LEADER, "1 while this node leads the election");
}

/// A term of `election` began (`won`) or ended on this node.
pub(crate) fn term(election: &str, won: bool) {
    let change = if won { "won" } else { "ended" };
    ::metrics::counter!(TERM_CHANGES, "election" => election.to_owned(), "change" => change).increment(1);
    ::metrics::gauge!(LEADER, "election" => election.to_owned()).set(if won { 1.0 } else { 0.0 });
}
