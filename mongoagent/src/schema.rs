//! The task document's schema, in one place: its field names, the fields the
//! queue reserves for itself (and the one check of user data against them),
//! the pending marks of follow-ups, and the queries that define "not ended",
//! "ready", "lapsed" and the claim order.

use std::time::Duration;

use bson::{doc, Bson, Document};
use store_trait::{fields as reserved, Condition, Order, Query, Record};

use crate::error::AgentError;

/// Field names of a task document. The first seven are the original
/// `mongo_agent`'s, so queues written for it keep working.
pub mod fields {
    /// Which agent takes the task.
    pub const AGENT_NAME: &str = "agent_name";
    /// Whether the task waits to be processed.
    pub const READY: &str = "ready";
    /// When an agent registered itself on the task (store clock).
    pub const STARTED_AT: &str = "started_at";
    /// The host of the agent that took it.
    pub const AGENT_HOST: &str = "agent_host";
    /// Whether processing ended (completed or failed for good).
    pub const COMPLETE: &str = "complete";
    /// When processing ended (store clock).
    pub const COMPLETED_AT: &str = "completed_at";
    /// Whether processing ended in failure.
    pub const ERROR_ENCOUNTERED: &str = "error_encountered";
    /// Higher runs first (default 0; tasks without it run after those with it).
    pub const PRIORITY: &str = "priority";
    /// Not before this time (a date; missing means now).
    pub const RUN_AT: &str = "run_at";
    /// Set while an agent holds the task (its lease may have lapsed).
    pub const CLAIMED: &str = "claimed";
    /// How many times the task was claimed (the claim's fence).
    pub const ATTEMPTS: &str = "attempts";
    /// The last failure's message.
    pub const LAST_ERROR: &str = "last_error";
    /// A per-task override of the agent's attempt limit.
    pub const MAX_ATTEMPTS: &str = "max_attempts";
    /// Enqueuing two tasks with the same dedupe key yields one task.
    pub const DEDUPE_KEY: &str = "dedupe_key";
    /// The task whose handler produced this one.
    pub const PARENT: &str = "parent";
    /// On a follow-up: the task that waits for it to finish (fan-in).
    pub const JOIN: &str = "join";
    /// On a follow-up: which of the waiting task's rounds it belongs to.
    pub const JOIN_ROUND: &str = "join_round";
    /// On a task waiting for its follow-ups: the round it waits on.
    pub const WAITING: &str = "waiting";
    /// How many times the task's follow-ups all finished and it was made ready
    /// again (missing means 0).
    pub const ROUND: &str = "round";
    /// On a task a schedule enqueued: the schedule's name.
    pub const SCHEDULE: &str = "schedule";
    /// On a task a schedule enqueued: the tick it was enqueued for (a date).
    pub const SCHEDULED_FOR: &str = "scheduled_for";
    /// On a task of a schedule with [`crate::schedule::Overlap::Queue`]: held back (not
    /// ready) until the schedule's previous task ends.
    pub const OVERLAP_HELD: &str = "overlap_held";
    /// The fence from which attempts count (missing means 0): that of the run
    /// whose handler waited for follow-ups (a new round starts with a full set of
    /// attempts), or the one a requeue gave the task (so do requeued tasks).
    pub const ROUND_FENCE: &str = "round_fence";
    /// How far a running task got, as its handler last reported
    /// ([`Task::progress`](crate::Task::progress)): a number or a small document.
    pub const PROGRESS: &str = "progress";
    /// When the last progress was reported (store clock).
    pub const PROGRESS_AT: &str = "progress_at";
    /// Set when an operator cancelled the task ([`Queue::cancel`](crate::Queue::cancel)):
    /// it ended (`complete: true, error_encountered: true`) without a result.
    pub const CANCELLED: &str = "cancelled";
    /// How long one attempt of the task may run, in milliseconds
    /// ([`NewTask::timeout`](crate::NewTask::timeout)): overrides the agent's
    /// ([`AgentBuilder::timeout`](crate::AgentBuilder::timeout)).
    pub const TIMEOUT_MS: &str = "timeout_ms";
    /// How long the task's dedupe key blocks another task with it
    /// ([`DedupeScope`](crate::DedupeScope)): `until_ended`, `window`
    /// (until [`DEDUPE_UNTIL`]), or `debounce` (until the task is first
    /// claimed; a later debounced enqueue replaces its data meanwhile);
    /// missing, for ever.
    pub const DEDUPE_SCOPE: &str = "dedupe_scope";
    /// With a `window` scope: when the key stops blocking (store clock).
    pub const DEDUPE_UNTIL: &str = "dedupe_until";
    /// When a debounced enqueue last gave the waiting task its data and moved
    /// its start (store clock); missing until one did.
    pub const DEBOUNCED_AT: &str = "debounced_at";
    /// A dedupe key that no longer blocks, kept for the record: moved here
    /// from [`DEDUPE_KEY`] when a later task with the key was enqueued.
    pub const DEDUPE_RETIRED: &str = "dedupe_key_retired";
    /// Which group the task belongs to ([`NewTask::group`](crate::NewTask::group)):
    /// agents with a cap ([`AgentBuilder::group_concurrency`](crate::AgentBuilder::group_concurrency))
    /// run at most that many of a group's tasks at once, in the order of
    /// [`GROUP_SEQ`] (see [`crate::group`]).
    pub const GROUP_KEY: &str = "group_key";
    /// The task's place in its group: numbers grow with enqueue order.
    pub const GROUP_SEQ: &str = "group_seq";
    /// Set while a task of a group waits for its turn (not ready until then).
    pub const GROUP_HELD: &str = "group_held";
    /// On a grouped fan-in task ([`Outcome::then`](crate::Outcome::then))
    /// while it waits for its follow-ups: not yet its group's, so it takes no
    /// turn while they run; the follow-up that ends last makes it held in
    /// its group ([`GROUP_HELD`]), in its place ([`GROUP_SEQ`]).
    pub const GROUP_AFTER_WAIT: &str = "group_after_wait";
    /// On a grouped task cancelled while it ran: until when (store clock)
    /// its handler may still run, the end of the lease its claim had; its
    /// group's turn stays taken until then, or until its agent says the
    /// run ended.
    pub const GROUP_BUSY_UNTIL: &str = "group_busy_until";
    /// Beside [`GROUP_BUSY_UNTIL`]: the fence of the claim whose run was
    /// cancelled. Only the end of that run frees the turn early; a stale
    /// run of an older claim ending says nothing of it.
    pub const GROUP_BUSY_FENCE: &str = "group_busy_fence";
    /// The W3C trace context of the span that enqueued the task
    /// (`{traceparent, tracestate}`): its runs continue that trace (with the
    /// `otel` feature; the README's "Traces").
    pub const TRACE_CONTEXT: &str = "trace_context";
    /// The fence of the claim whose attempt timed out, while that attempt
    /// is the latest to have ended (the next outcome of another kind, or a
    /// requeue, removes it with [`TIMED_OUT_ATTEMPT`] and
    /// [`TIMED_OUT_AFTER_MS`]; read together as a
    /// [`TimedOutAttempt`](crate::TimedOutAttempt)). Written by the outcome
    /// write of an attempt whose handler stopped within the grace, or, for
    /// one whose handler ignored its cancellation past it, under that claim
    /// before it is left to lapse: so the next claim knows the attempt
    /// failed ("timed out after …") and, with no attempts left, fails the
    /// task for good without running it again.
    pub const TIMED_OUT_FENCE: &str = "timed_out_fence";
    /// The attempt that timed out (see [`TIMED_OUT_FENCE`]).
    pub const TIMED_OUT_ATTEMPT: &str = "timed_out_attempt";
    /// The timeout that attempt ran under, in milliseconds (see
    /// [`TIMED_OUT_FENCE`]).
    pub const TIMED_OUT_AFTER_MS: &str = "timed_out_after_ms";
    /// On a follow-up that waits for its parent's fenced outcome write
    /// before it exists for anyone: the fence of the parent's claim that
    /// enqueued it. A document with it is no task yet (inert, and removed
    /// with a stale run's other follow-ups).
    pub const PENDING_PARENT_FENCE: &str = "pending_parent_fence";

    /// The fields the queue keeps for itself: the store's (`_id`, the lease,
    /// `fence`, `rev`, `last_op`, `gc_at`), the task's bookkeeping above, and
    /// those of follow-ups pending their parent's outcome. A new task's data, a
    /// follow-up's, and a handler's merge may set none of them
    /// ([`AgentError::ReservedField`](crate::AgentError::ReservedField)); the
    /// [`NewTask`](crate::NewTask) methods set those a producer may choose.
    pub const RESERVED: [&str; 51] = [
        store_trait::fields::ID,
        store_trait::fields::LEASE_OWNER,
        store_trait::fields::LEASE_SINCE,
        store_trait::fields::LEASE_UNTIL,
        store_trait::fields::FENCE,
        store_trait::fields::REV,
        store_trait::fields::LAST_OP,
        store_trait::fields::GC_AT,
        AGENT_NAME,
        READY,
        STARTED_AT,
        AGENT_HOST,
        COMPLETE,
        COMPLETED_AT,
        ERROR_ENCOUNTERED,
        PRIORITY,
        RUN_AT,
        CLAIMED,
        ATTEMPTS,
        LAST_ERROR,
        MAX_ATTEMPTS,
        DEDUPE_KEY,
        PARENT,
        JOIN,
        JOIN_ROUND,
        WAITING,
        ROUND,
        SCHEDULE,
        SCHEDULED_FOR,
        OVERLAP_HELD,
        ROUND_FENCE,
        PROGRESS,
        PROGRESS_AT,
        CANCELLED,
        TIMEOUT_MS,
        DEDUPE_SCOPE,
        DEDUPE_UNTIL,
        DEBOUNCED_AT,
        DEDUPE_RETIRED,
        TIMED_OUT_FENCE,
        TIMED_OUT_ATTEMPT,
        TIMED_OUT_AFTER_MS,
        GROUP_KEY,
        GROUP_SEQ,
        GROUP_HELD,
        GROUP_AFTER_WAIT,
        GROUP_BUSY_UNTIL,
        GROUP_BUSY_FENCE,
        TRACE_CONTEXT,
        super::pending::FENCE,
        super::pending::FIELDS,
    ];

    /// Whether `name` is one of the [`RESERVED`] fields, or one of the
    /// pending-parent fields only the queue writes on a parent.
    pub fn is_reserved(name: &str) -> bool {
        RESERVED.contains(&name) || super::pending::PARENT.contains(&name)
    }
}

/// Follow-ups that wait for their parent's fenced outcome write before they
/// exist for anyone: the fields that mark them, and what activation does.
pub(crate) mod pending {
    use bson::{Bson, Document};
    use store_trait::{Condition, Mutation, Write};

    use super::fields;

    /// On a pending follow-up: the fence of the parent's claim that enqueued it.
    pub(crate) const FENCE: &str = fields::PENDING_PARENT_FENCE;
    /// On a pending follow-up: the fields activation sets (`ready`, and `join`,
    /// `join_round`, `waiting` where the follow-up has them).
    pub(crate) const FIELDS: &str = "pending_fields";
    /// On a parent whose outcome is written and whose follow-ups may still be
    /// pending: the fence they carry.
    pub(crate) const PARENT_FENCE: &str = "follow_ups_fence";
    /// On such a parent: how it ends once they are active (`complete`, `wait`).
    pub(crate) const PARENT_FINISH: &str = "follow_ups_finish";
    /// The fields only the queue writes on a parent (beside [`FENCE`] and
    /// [`FIELDS`] on its follow-ups; all four are reserved).
    pub(crate) const PARENT: [&str; 2] = [PARENT_FENCE, PARENT_FINISH];

    /// Turns a follow-up's document into its pending form. A grouped one,
    /// numbered already, is not held yet: its group's agents do not see it
    /// until it is activated.
    pub(crate) fn stash(mut d: Document, fence: i64) -> Document {
        let mut stashed = Document::new();
        for f in [fields::READY, fields::JOIN, fields::JOIN_ROUND, fields::WAITING, fields::GROUP_HELD] {
            if let Some(v) = d.remove(f) {
                stashed.insert(f, v);
            }
        }
        d.insert(fields::READY, false);
        d.insert(FENCE, fence);
        d.insert(FIELDS, stashed);
        d
    }

    /// Whether a pending follow-up is a fan-in task (it waits for others, so it
    /// is activated after them).
    pub(crate) fn is_fan_in(d: &Document) -> bool {
        d.get_document(FIELDS).is_ok_and(|s| s.contains_key(fields::WAITING))
    }

    /// Whether a pending follow-up is grouped: held from its activation on.
    pub(crate) fn is_grouped(d: &Document) -> bool {
        d.get_document(FIELDS).is_ok_and(|s| s.contains_key(fields::GROUP_HELD))
    }

    /// The write that activates a pending follow-up of the claim with `fence`;
    /// idempotent (it applies only while the follow-up is pending with that fence).
    pub(crate) fn activation(d: &Document, fence: i64) -> Write {
        let stashed = d.get_document(FIELDS).cloned().unwrap_or_default();
        Write::new(
            Condition::FieldEq(FENCE.into(), Bson::Int64(fence)),
            Mutation::new().set_all(stashed).unset(FENCE).unset(FIELDS),
        )
    }

    /// How a task whose follow-ups are pending ends once they are active.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Finish {
        /// Completed.
        Complete,
        /// Completed, with a fan-in task after the follow-ups (`Outcome::then`).
        CompleteThen,
        /// Waiting for them (fan-in).
        Wait,
    }

    impl Finish {
        pub(crate) fn as_str(self) -> &'static str {
            match self {
                Finish::Complete => "complete",
                Finish::CompleteThen => "complete-then",
                Finish::Wait => "wait",
            }
        }

        /// The step a task records in [`PARENT_FINISH`].
        pub(crate) fn of(data: &Document) -> Finish {
            match data.get_str(PARENT_FINISH) {
                Ok("wait") => Finish::Wait,
                Ok("complete") => Finish::Complete,
                // Unknown: the safe choice also wakes a fan-in task if there is one.
                _ => Finish::CompleteThen,
            }
        }
    }
}

/// How many times the task's follow-ups all ended and it was made ready again.
pub(crate) fn task_round(record: &Record) -> i64 {
    record.get_i64(fields::ROUND).unwrap_or(0).max(0)
}

/// A task's latest attempt to have ended, when it timed out, as the task's
/// document records it ([`fields::TIMED_OUT_FENCE`],
/// [`fields::TIMED_OUT_ATTEMPT`], [`fields::TIMED_OUT_AFTER_MS`]): the one
/// reading of those fields, which the event stream
/// ([`EventKind::TimedOut`](crate::EventKind::TimedOut)) and the operator
/// views share. The mark stays until the task's next outcome of another kind
/// or a requeue; a handler that ignored its cancellation is aborted with
/// the mark written under its claim, which then lapses (so the task is
/// `running`, its lease lapsed, until it is claimed again).
///
/// ```
/// use std::time::Duration;
/// use mongoagent::TimedOutAttempt;
///
/// let task = bson::doc! { "timed_out_fence": 3_i64, "timed_out_attempt": 2_i64, "timed_out_after_ms": 1500_i64 };
/// let t = TimedOutAttempt::of(&task).unwrap();
/// assert_eq!((t.fence, t.attempt, t.after), (3, 2, Duration::from_millis(1500)));
/// assert_eq!(t.to_string(), "attempt 2 timed out after 1.5 s");
/// assert_eq!(TimedOutAttempt::of(&bson::doc! { "last_error": "timed out after 1.5 s" }), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimedOutAttempt {
    /// The fence of the claim that ran it.
    pub fence: u64,
    /// Which attempt it was (1 for the first of a round, as
    /// [`Task::attempt`](crate::Task::attempt)).
    pub attempt: u64,
    /// The timeout it ran under.
    pub after: Duration,
}

impl TimedOutAttempt {
    /// The timed-out attempt a task's fields record, if any. Numbers may be
    /// any BSON integer (or a whole double), as a document that went through
    /// JSON comes back; a mark missing a field, or with a negative one, is
    /// none.
    pub fn of(task: &Document) -> Option<TimedOutAttempt> {
        let int = |f: &str| match task.get(f)? {
            Bson::Int32(i) => u64::try_from(*i).ok(),
            Bson::Int64(i) => u64::try_from(*i).ok(),
            // Below 2^63, so the conversion is exact for every whole number here.
            Bson::Double(d) if d.fract() == 0.0 && (0.0..9.2e18).contains(d) => Some(*d as u64),
            _ => None,
        };
        Some(TimedOutAttempt {
            fence: int(fields::TIMED_OUT_FENCE)?,
            attempt: int(fields::TIMED_OUT_ATTEMPT)?,
            after: Duration::from_millis(int(fields::TIMED_OUT_AFTER_MS)?),
        })
    }
}

impl std::fmt::Display for TimedOutAttempt {
    /// "attempt 2 timed out after 1.5 s".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "attempt {} timed out after {}", self.attempt, timed_out::seconds(self.after))
    }
}

/// The writes of the timed-out mark ([`TimedOutAttempt`]), and the error a
/// timed-out attempt fails with.
pub(crate) mod timed_out {
    use std::time::Duration;

    use bson::Document;
    use store_trait::Mutation;

    use super::fields;

    /// The error of an attempt that timed out: "timed out after 300 ms".
    pub(crate) fn error(limit: Duration) -> String {
        format!("timed out after {}", seconds(limit))
    }

    /// A duration as an operator reads it: "1.5 s", "300 s", "250 ms".
    pub(crate) fn seconds(d: Duration) -> String {
        if d < Duration::from_secs(1) {
            format!("{} ms", d.as_millis())
        } else {
            format!("{} s", d.as_secs_f64())
        }
    }

    /// `m`, recording that the attempt of the claim with `fence` timed out
    /// after `limit`.
    pub(crate) fn mark(m: Mutation, fence: u64, attempt: u64, limit: Duration) -> Mutation {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        m.set(fields::TIMED_OUT_FENCE, int(fence))
            .set(fields::TIMED_OUT_ATTEMPT, int(attempt))
            .set(fields::TIMED_OUT_AFTER_MS, i64::try_from(limit.as_millis()).unwrap_or(i64::MAX))
    }

    /// `m`, removing the mark of an earlier attempt from a task whose fields
    /// are `data`, when it has one: so the mark always tells of the latest
    /// attempt to have ended, and a write of a task that never timed out
    /// stays as it was.
    pub(crate) fn clear(m: Mutation, data: &Document) -> Mutation {
        if !data.contains_key(fields::TIMED_OUT_FENCE) {
            return m;
        }
        m.unset(fields::TIMED_OUT_FENCE).unset(fields::TIMED_OUT_ATTEMPT).unset(fields::TIMED_OUT_AFTER_MS)
    }
}

/// Tasks that have not ended (`complete` is not `true`).
pub(crate) fn not_complete() -> Condition {
    Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)).negate()
}

/// Ready tasks of `agent` that are due and not held: the common claim. The
/// equality prefix (`agent_name`, `ready`) is what the claim index serves, so
/// finished tasks, however many, are never scanned. (A task waiting for its
/// follow-ups can be made ready by the last one while its own agent still holds
/// it for a moment; it is claimable once that agent lets go.)
pub(crate) fn ready_tasks(agent: &str) -> Query {
    claim_order(
        Query::eq(doc! { fields::AGENT_NAME: agent, fields::READY: true })
            .when(not_complete().and(Condition::DueBy(fields::RUN_AT.into())).and(Condition::Free)),
    )
}

/// Tasks of `agent` claimed by an agent whose lease lapsed (crashed or hung):
/// claimable again. This includes tasks whose outcome was recorded but whose
/// fan-in step was not (the agent died in between): claiming one finishes that
/// step. Served by the `recover` index (`agent_name`, `claimed`).
pub(crate) fn lapsed_tasks(agent: &str) -> Query {
    claim_order(Query::eq(doc! { fields::AGENT_NAME: agent, fields::CLAIMED: true }).when(Condition::Free))
}

/// The ready task of `agent` that becomes due next (a delayed task, or one
/// waiting to be retried): what an idle agent's timer waits for.
pub(crate) fn next_due(agent: &str) -> Query {
    Query::eq(doc! { fields::AGENT_NAME: agent, fields::READY: true })
        .when(not_complete())
        .when(Condition::DueBy(fields::RUN_AT.into()).negate())
        .sort(fields::RUN_AT, Order::Asc)
        .limit(1)
}

/// The claimed task of `agent` whose lease lapses next: what an idle agent's
/// timer waits for too (its holder may crash).
pub(crate) fn next_lapse(agent: &str) -> Query {
    Query::eq(doc! { fields::AGENT_NAME: agent, fields::CLAIMED: true })
        .when(Condition::Free.negate())
        .sort(reserved::LEASE_UNTIL, Order::Asc)
        .limit(1)
}

/// The order of claims: priority, then due time, then insertion.
pub(crate) fn claim_order(q: Query) -> Query {
    q.sort(fields::PRIORITY, Order::Desc).sort(fields::RUN_AT, Order::Asc).sort(reserved::ID, Order::Asc)
}

/// The one check of user data (a new task's, a follow-up's, a handler's
/// merge) against the schema: every top-level field a plain name
/// (`store_trait::check_field_name`: not empty, no `$` prefix, no `.`, no NUL)
/// and none of the queue's own ([`fields::RESERVED`]).
pub(crate) fn check_user_fields(data: &Document) -> Result<(), AgentError> {
    for k in data.keys() {
        if fields::is_reserved(k) {
            return Err(AgentError::ReservedField { field: k.clone() });
        }
        store_trait::check_field_name(k)?;
    }
    check_depth(data)
}

/// How deep task data may nest: documents and arrays inside the task's
/// data, counting the data itself as one. Every reader of the queue (an
/// agent's claim, the views, an operator's command) decodes the whole
/// document recursively, so a task nested deeper than a reader's stack
/// allows would crash each of them in turn, for ever; MongoDB itself
/// refuses documents nested past 100 levels.
pub const MAX_DATA_DEPTH: usize = 32;

/// Refuses data nested deeper than [`MAX_DATA_DEPTH`], walking it without
/// recursion (so the check cannot overflow the stack it protects).
fn check_depth(data: &Document) -> Result<(), AgentError> {
    let mut stack: Vec<(&Bson, usize)> = data.values().map(|v| (v, 2)).collect();
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Bson>> = match v {
            Bson::Document(d) => Box::new(d.values()),
            Bson::Array(a) => Box::new(a.iter()),
            _ => continue,
        };
        if depth > MAX_DATA_DEPTH {
            return Err(AgentError::InvalidTask(format!(
                "task data nests deeper than {MAX_DATA_DEPTH} levels (documents and arrays)"
            )));
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// Every field the queue writes is reserved, the store's included; a
    /// near-reserved or operator-like name is refused as malformed.
    #[test]
    fn user_fields() {
        for f in fields::RESERVED.iter().chain(&pending::PARENT).chain(&store_trait::fields::ALL) {
            let e = check_user_fields(&doc! { *f: 1 }).unwrap_err();
            assert!(matches!(&e, AgentError::ReservedField { field } if field == f), "{f}: {e}");
        }
        for f in ["$set", "a.b", "", "x\0"] {
            let e = check_user_fields(&doc! { f: 1 }).unwrap_err();
            assert!(matches!(e, AgentError::Store(store_trait::StoreError::InvalidInput { .. })), "{f:?}: {e}");
        }
        check_user_fields(&doc! { "image": "cat.png", "ID": 1, "readyish": true }).unwrap();
    }

    /// Data nested to [`MAX_DATA_DEPTH`] passes, one level more is refused,
    /// through documents and arrays alike, and very deep data is refused
    /// without overflowing the stack.
    #[test]
    fn data_depth() {
        let nest = |levels: usize, array: bool| {
            let mut v = Bson::Int32(1);
            for _ in 1..levels {
                v = if array { Bson::Array(vec![v]) } else { Bson::Document(doc! { "a": v }) };
            }
            doc! { "a": v }
        };
        for array in [false, true] {
            check_user_fields(&nest(MAX_DATA_DEPTH, array)).unwrap();
            let e = check_user_fields(&nest(MAX_DATA_DEPTH + 1, array)).unwrap_err();
            assert!(matches!(e, AgentError::InvalidTask(_)), "{e}");
        }
        let mut deep = Bson::Int32(1);
        for _ in 0..100_000 {
            deep = Bson::Array(vec![deep]);
        }
        let data = doc! { "a": deep };
        assert!(check_user_fields(&data).is_err());
        // The deep value's own drop is recursive: leak it in the test.
        std::mem::forget(data);
    }
}
