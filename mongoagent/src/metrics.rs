//! The figures `mongoagent` emits through the [`metrics`](https://docs.rs/metrics)
//! facade, so an application that installs a `metrics` recorder (a Prometheus
//! exporter, say) gets them without the CLI; without one they cost next to
//! nothing. Every name starts with `mongoagent_`; [`describe`] gives the
//! recorder their help texts. They are process-local: each process reports
//! what its agents did (and the cancels it made), and a scrape of every
//! process adds up to the cluster. The queue's depth by state is read from
//! the store instead (`mongocoord dashboard`'s `/metrics`, or
//! [`Queue::stats`](crate::Queue::stats)).
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | [`TASKS`] | counter | `queue`, `agent`, `outcome` | task outcomes recorded: `completed`, `retried` (failed, will be tried again), `failed_permanently`, `cancelled` ([`Queue::cancel`](crate::Queue::cancel)), `stale` (the claim was lost: not applied), `waiting` (for its follow-ups), `recovered` (a crashed agent's fan-in step finished) |
//! | [`CLAIM_SECONDS`] | histogram | `queue`, `agent` | the round trip of one claim (one task, or a batch), found or not |
//! | [`TIMEOUTS`] | counter | `queue`, `agent`, `ending` | attempts whose timeout passed: `stopped` (the handler ended within the grace; the attempt failed) or `abandoned` (it did not: its claim is left to lapse) |
//!
//! Each task lease is a lock's too: claims and lost claims also count in
//! `mongolock`'s figures ([`mongolock::metrics`]), under the queue's collection.

use store_trait::Collection;

/// `mongoagent_tasks_total{queue, agent, outcome}`: a task outcome this
/// process recorded (or a cancel it made).
pub const TASKS: &str = "mongoagent_tasks_total";

/// `mongoagent_claim_seconds{queue, agent}`: how long one claim's round
/// trip to the store took.
pub const CLAIM_SECONDS: &str = "mongoagent_claim_seconds";

/// `mongoagent_timeouts_total{queue, agent, ending}`: an attempt whose
/// execution timeout passed, by how it ended (`stopped`, `abandoned`).
pub const TIMEOUTS: &str = "mongoagent_timeouts_total";

/// Tells the installed recorder what each figure means (its help text). Call
/// it once after installing the recorder; figures are emitted without it too.
pub fn describe() {
    ::metrics::describe_counter!(TASKS, "Task outcomes recorded by this process, by queue, agent name and outcome");
    ::metrics::describe_counter!(TIMEOUTS, "Attempts whose execution timeout passed, by queue, agent name and ending");
    ::metrics::describe_histogram!(
        CLAIM_SECONDS,
        ::metrics::Unit::Seconds,
        "The round trip of one claim (one task or a batch), found or not"
    );
}

/// A task outcome this process recorded, by its `outcome` label
/// (`Processed::label`).
pub(crate) fn outcome(queue: &Collection, agent: &str, outcome: &'static str) {
    tasks(queue, agent, outcome);
}

pub(crate) fn cancelled(queue: &Collection, agent: Option<&str>) {
    tasks(queue, agent.unwrap_or(""), "cancelled");
}

fn tasks(queue: &Collection, agent: &str, outcome: &'static str) {
    ::metrics::counter!(TASKS, "queue" => queue.to_string(), "agent" => agent.to_owned(), "outcome" => outcome)
        .increment(1);
}

pub(crate) fn timed_out(queue: &Collection, agent: &str, ending: &'static str) {
    ::metrics::counter!(TIMEOUTS, "queue" => queue.to_string(), "agent" => agent.to_owned(), "ending" => ending)
        .increment(1);
}

pub(crate) fn claimed(queue: &Collection, agent: &str, took: std::time::Duration) {
    ::metrics::histogram!(CLAIM_SECONDS, "queue" => queue.to_string(), "agent" => agent.to_owned()).record(took);
}
