//! Reading lifecycle events from two successive snapshots of one task
//! document: the one reading of the queue's fields that the event stream
//! shares (what each transition writes is in `task.rs`, `agent/finish.rs`,
//! `agent/run.rs` (a timeout), `agent/fan_in.rs`, `cancel.rs` and `queue.rs`).

use bson::Bson;
use store_trait::{Record, StoreTime};

use super::EventKind;
use crate::schema::TimedOutAttempt;
use crate::schema::{fields, pending};

/// Where a task is, as far as its events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// A follow-up not yet activated: it does not exist for anyone yet.
    Pending,
    /// Enqueued, not claimed (ready, delayed, held back, or not ready).
    Queued,
    /// Claimed (its lease may have lapsed).
    Running,
    /// Waiting for its follow-ups (fan-in), in this round.
    Waiting(i64),
    /// Completed.
    Completed,
    /// Failed for good.
    Failed,
    /// Cancelled by an operator.
    Cancelled,
}

impl Phase {
    pub(super) fn ended(self) -> bool {
        matches!(self, Phase::Completed | Phase::Failed | Phase::Cancelled)
    }
}

/// What the stream remembers of a task between two reads of it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TaskState {
    pub(super) rev: u64,
    pub(super) fence: u64,
    pub(super) phase: Phase,
    /// The attempt the last outcome write recorded (`attempts`).
    attempts: i64,
    /// How many times its follow-ups woke it (`round`).
    round: i64,
    round_fence: Option<i64>,
    progress_at: Option<StoreTime>,
    /// When a debounced enqueue last replaced its data.
    debounced_at: Option<StoreTime>,
    /// The running claim's lease end, as last read.
    pub(super) lease_until: Option<StoreTime>,
    /// `Lapsed` was reported for the claim with this fence.
    pub(super) lapsed: bool,
    pub(super) completed_at: Option<StoreTime>,
    /// The claim whose attempt the task records as timed out, if any.
    timed_out_fence: Option<u64>,
}

impl TaskState {
    /// Reads the fields that matter.
    pub(super) fn of(r: &Record) -> TaskState {
        let flag = |k: &str| r.get_bool(k) == Some(true);
        let phase = if r.data().contains_key(pending::FENCE) {
            Phase::Pending
        } else if flag(fields::COMPLETE) {
            if flag(fields::CANCELLED) {
                Phase::Cancelled
            } else if flag(fields::ERROR_ENCOUNTERED) {
                Phase::Failed
            } else {
                Phase::Completed
            }
        } else if let Some(round) = r.get_i64(fields::WAITING) {
            Phase::Waiting(round)
        } else if flag(fields::CLAIMED) {
            Phase::Running
        } else {
            Phase::Queued
        };
        TaskState {
            rev: r.rev(),
            fence: r.fence(),
            phase,
            attempts: r.get_i64(fields::ATTEMPTS).unwrap_or(0),
            round: r.get_i64(fields::ROUND).unwrap_or(0),
            round_fence: r.get_i64(fields::ROUND_FENCE),
            progress_at: r.get_time(fields::PROGRESS_AT),
            debounced_at: r.get_time(fields::DEBOUNCED_AT),
            lease_until: r.lease().map(|l| l.until),
            lapsed: false,
            completed_at: r.get_time(fields::COMPLETED_AT),
            timed_out_fence: TimedOutAttempt::of(r.data()).map(|t| t.fence),
        }
    }

    /// The state a task is read against when the stream has not seen it.
    fn unseen() -> TaskState {
        TaskState {
            rev: 0,
            fence: 0,
            phase: Phase::Queued,
            attempts: 0,
            round: 0,
            round_fence: None,
            progress_at: None,
            debounced_at: None,
            lease_until: None,
            lapsed: false,
            completed_at: None,
            timed_out_fence: None,
        }
    }
}

/// The events between `old` (`None`: not seen before) and `new`, in the
/// order they happened. A step that no read showed is reported when a later
/// state proves it (a run that recorded an outcome was claimed); others that
/// left no trace (a progress report overwritten before it was read) are not.
/// `new` is updated with what the stream must remember (`lapsed`).
pub(super) fn transitions(old: Option<&TaskState>, new: &mut TaskState, r: &Record) -> Vec<EventKind> {
    let mut out = Vec::new();
    if new.phase == Phase::Pending {
        return out;
    }
    let fresh = old.is_none_or(|o| o.phase == Phase::Pending);
    let unseen = TaskState::unseen();
    let base = if fresh { &unseen } else { old.unwrap_or(&unseen) };
    if fresh {
        out.push(EventKind::Enqueued);
    }
    let attempt = crate::task::attempt(r);
    let error = || r.get_str(fields::LAST_ERROR).unwrap_or_default().to_owned();
    let requeued_now = new.fence > base.fence
        && new.round_fence == i64::try_from(new.fence).ok()
        && new.phase == Phase::Queued
        && new.round == base.round;
    if !fresh && ((base.phase.ended() && !new.phase.ended()) || requeued_now) {
        out.push(EventKind::Requeued);
    }
    // A debounce replaces the data of a task never claimed: told before any
    // claim (a read that shows the mark for the first time proves one).
    if new.debounced_at.is_some() && new.debounced_at != base.debounced_at {
        out.push(EventKind::Debounced);
    }
    // A timed-out attempt recorded since `old` (the mark names its claim):
    // told after that claim and before what its failure led to.
    let mut timed_out = TimedOutAttempt::of(r.data())
        .filter(|t| Some(t.fence) != base.timed_out_fence)
        .map(|t| (t.fence, EventKind::TimedOut { attempt: t.attempt, timeout: t.after }));
    // The claim `old` showed (running, its outcome not yet written).
    out.extend(take_if(&mut timed_out, |f| f <= base.fence));
    // An outcome of a run was recorded since `old`: a retry (the attempt count
    // moved while the task lives on), a wait for follow-ups, or the end.
    let waiting_before = matches!(base.phase, Phase::Waiting(_));
    let woke = new.round > base.round;
    let waited = match (base.phase, new.phase) {
        (Phase::Waiting(v), Phase::Waiting(w)) => v != w,
        (Phase::Waiting(_), _) => false,
        (_, Phase::Waiting(_)) => true,
        _ => woke,
    };
    let retried = new.attempts != base.attempts && !new.phase.ended() && !waited;
    let ended = new.phase.ended() && new.phase != Phase::Cancelled && !base.phase.ended();
    let outcome = retried || waited || ended;
    // Whose outcome: the claim `old` showed running, or one no read showed.
    let old_run = base.phase == Phase::Running;
    let new_claim = new.phase == Phase::Running && new.fence > base.fence;
    if old_run && new_claim && !outcome {
        // Claimed again without an outcome: the old claim's lease lapsed.
        if !base.lapsed {
            out.push(EventKind::Lapsed);
        }
        // A claim in between, which no read showed, timed out and lapsed.
        out.extend(take_if(&mut timed_out, |f| f < new.fence));
        out.push(EventKind::Recovered { attempt });
    } else {
        // A task waiting for its follow-ups was woken before anything else.
        if waiting_before && woke {
            out.push(EventKind::Woken { round: new.round });
        }
        let unseen_run = outcome && new.fence > base.fence && !old_run && (new.phase != Phase::Running || new_claim);
        if unseen_run {
            out.push(EventKind::Claimed { attempt: attempt_of(new, attempt, new_claim) });
        }
        // The claim `old` showed ended without a trace, and a later one
        // recorded the outcome: after a lapse, a recovery.
        if old_run && new.fence > base.fence && outcome && new.phase != Phase::Running {
            out.push(if base.lapsed { EventKind::Recovered { attempt } } else { EventKind::Claimed { attempt } });
        }
        if outcome && new.progress_at != base.progress_at && !new_claim {
            push_progress(&mut out, r);
        }
        // The run whose outcome this is, or one before the claim running now.
        if outcome {
            out.extend(take_if(&mut timed_out, |f| !(new_claim && f == new.fence)));
        }
        if retried {
            out.push(EventKind::Retrying { attempt: u64::try_from(new.attempts).unwrap_or(0), error: error() });
        }
        if waited {
            let round = if let Phase::Waiting(w) = new.phase { w } else { new.round.saturating_sub(1) };
            out.push(EventKind::Waiting { round });
        }
        if woke && !waiting_before {
            out.push(EventKind::Woken { round: new.round });
        }
        if new_claim {
            out.push(EventKind::Claimed { attempt });
        }
    }
    if new.progress_at != base.progress_at && (!outcome || new_claim) {
        push_progress(&mut out, r);
    }
    // The claim running now timed out (its handler was abandoned).
    if new_claim {
        out.extend(take_if(&mut timed_out, |f| f == new.fence));
    }
    if new.phase != base.phase || fresh {
        match new.phase {
            Phase::Completed => out.push(EventKind::Completed),
            Phase::Failed => out.push(EventKind::Failed { attempt, error: error() }),
            Phase::Cancelled => out.push(EventKind::Cancelled),
            _ => {}
        }
    }
    // Remember a reported lapse while the same claim stands.
    new.lapsed = base.lapsed && new.fence == base.fence && new.phase == Phase::Running;
    out
}

/// The attempt of a run whose claim no read showed: this claim's, or the one
/// before the claim now running.
fn attempt_of(new: &TaskState, attempt: u64, new_claim: bool) -> u64 {
    if new_claim {
        u64::try_from(new.attempts).unwrap_or(0).max(1)
    } else {
        attempt
    }
}

/// The event in `slot` when its claim's fence satisfies `whose`, taken out
/// of it so it is told once.
fn take_if(slot: &mut Option<(u64, EventKind)>, whose: impl Fn(u64) -> bool) -> Option<EventKind> {
    match slot {
        Some((f, _)) if whose(*f) => slot.take().map(|(_, ev)| ev),
        _ => None,
    }
}

fn push_progress(out: &mut Vec<EventKind>, r: &Record) {
    if let Some(value) = r.get(fields::PROGRESS).filter(|v| !matches!(v, Bson::Null)) {
        out.push(EventKind::Progress { value: value.clone() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Document};

    fn rec(rev: i64, fence: i64, extra: Document) -> Record {
        let mut d = doc! { "_id": "t", "rev": rev, "fence": fence, "agent_name": "a" };
        d.extend(extra);
        Record::from_document("tasks", d).unwrap()
    }

    fn step(old: Option<&TaskState>, r: &Record) -> (TaskState, Vec<&'static str>) {
        let mut new = TaskState::of(r);
        let kinds = transitions(old, &mut new, r).iter().map(EventKind::name).collect();
        (new, kinds)
    }

    fn at(ms: i64) -> bson::DateTime {
        bson::DateTime::from_millis(ms)
    }

    #[test]
    fn each_step_seen() {
        let (s, e) = step(None, &rec(1, 0, doc! {"ready": true}));
        assert_eq!(e, ["enqueued"]);
        let claimed = rec(2, 1, doc! {"ready": false, "claimed": true});
        let (s, e) = step(Some(&s), &claimed);
        assert_eq!(e, ["claimed"]);
        let (s, e) =
            step(Some(&s), &rec(3, 1, doc! {"ready": false, "claimed": true, "progress": 5, "progress_at": at(9)}));
        assert_eq!(e, ["progress"]);
        let done = doc! {"complete": true, "error_encountered": false, "claimed": false, "attempts": 1_i64,
        "progress": 5, "progress_at": at(9)};
        let (_, e) = step(Some(&s), &rec(4, 1, done));
        assert_eq!(e, ["completed"]);
    }

    #[test]
    fn each_debounce_is_told_before_the_claim() {
        let (s, e) = step(None, &rec(1, 0, doc! {"ready": true}));
        assert_eq!(e, ["enqueued"]);
        let (s, e) = step(Some(&s), &rec(2, 0, doc! {"ready": true, "debounced_at": at(5)}));
        assert_eq!(e, ["debounced"]);
        let (s, e) = step(Some(&s), &rec(3, 0, doc! {"ready": true, "debounced_at": at(5)}));
        assert!(e.is_empty(), "the same mark read again is no new debounce: {e:?}");
        // A second replace and the claim between two reads.
        let (_, e) = step(Some(&s), &rec(5, 1, doc! {"ready": false, "claimed": true, "debounced_at": at(8)}));
        assert_eq!(e, ["debounced", "claimed"]);
        // First seen after a replace: the mark proves one.
        let (_, e) = step(None, &rec(2, 0, doc! {"ready": true, "debounced_at": at(5)}));
        assert_eq!(e, ["enqueued", "debounced"]);
    }

    #[test]
    fn missed_steps_are_told_in_order() {
        let (s, _) = step(None, &rec(1, 0, doc! {"ready": true}));
        // A whole run between two reads: the claim is implied by the outcome.
        let done = doc! {"complete": true, "error_encountered": false, "attempts": 1_i64,
        "progress": 1, "progress_at": at(3)};
        let (_, e) = step(Some(&s), &rec(5, 1, done.clone()));
        assert_eq!(e, ["claimed", "progress", "completed"]);
        // Never seen at all.
        let (_, e) = step(None, &rec(5, 1, done));
        assert_eq!(e, ["enqueued", "claimed", "progress", "completed"]);
    }

    #[test]
    fn retries_lapses_and_requeues() {
        let (s, _) = step(None, &rec(1, 0, doc! {"ready": true}));
        let (s, _) = step(Some(&s), &rec(2, 1, doc! {"claimed": true}));
        // Retried and claimed again between two reads.
        let again = doc! {"claimed": true, "attempts": 1_i64, "last_error": "boom"};
        let (s, e) = step(Some(&s), &rec(4, 2, again));
        assert_eq!(e, ["retrying", "claimed"]);
        // Its lease lapsed and another agent took it over.
        let (s, e) = step(Some(&s), &rec(5, 3, doc! {"claimed": true, "attempts": 1_i64}));
        assert_eq!(e, ["lapsed", "recovered"]);
        let failed = doc! {"complete": true, "error_encountered": true, "attempts": 3_i64, "last_error": "x"};
        let (s, e) = step(Some(&s), &rec(6, 3, failed));
        assert_eq!(e, ["failed"]);
        let requeued = doc! {"ready": true, "complete": false, "attempts": 3_i64, "round_fence": 4_i64};
        let (_, e) = step(Some(&s), &rec(7, 4, requeued));
        assert_eq!(e, ["requeued"]);
    }

    /// The mark of a timed-out attempt: its claim's fence, the attempt, 300 ms.
    fn timed_out(fence: i64, attempt: i64) -> Document {
        doc! {"timed_out_fence": fence, "timed_out_attempt": attempt, "timed_out_after_ms": 300_i64}
    }

    #[test]
    fn a_timeout_is_told_before_its_retry_or_failure() {
        let (s, _) = step(None, &rec(1, 0, doc! {"ready": true}));
        let (s, _) = step(Some(&s), &rec(2, 1, doc! {"claimed": true}));
        let mut retry =
            doc! {"ready": true, "claimed": false, "attempts": 1_i64, "last_error": "timed out after 300 ms"};
        retry.extend(timed_out(1, 1));
        let (s, e) = step(Some(&s), &rec(3, 1, retry.clone()));
        assert_eq!(e, ["timed_out", "retrying"]);
        let mut again = retry.clone();
        again.extend(doc! {"ready": false, "claimed": true});
        let (s, e) = step(Some(&s), &rec(4, 2, again.clone()));
        assert_eq!(e, ["claimed"], "the same mark is not news");
        // The next outcome of another kind clears the mark.
        let (_, e) = step(Some(&s), &rec(5, 2, doc! {"complete": true, "error_encountered": false, "attempts": 2_i64}));
        assert_eq!(e, ["completed"]);
        // The whole attempt and the retry between two reads.
        let (q, _) = step(None, &rec(1, 0, doc! {"ready": true}));
        let (_, e) = step(Some(&q), &rec(4, 2, again));
        assert_eq!(e, ["claimed", "timed_out", "retrying", "claimed"]);
        // The last attempt: it failed for good.
        let (c, _) = step(Some(&q), &rec(2, 1, doc! {"claimed": true}));
        let mut failed =
            doc! {"complete": true, "error_encountered": true, "attempts": 1_i64, "last_error": "timed out"};
        failed.extend(timed_out(1, 1));
        let (_, e) = step(Some(&c), &rec(3, 1, failed.clone()));
        assert_eq!(e, ["timed_out", "failed"]);
        let (_, e) = step(Some(&q), &rec(3, 1, failed));
        assert_eq!(e, ["claimed", "timed_out", "failed"]);
        let (_, e) = step(None, &rec(1, 0, doc! {"ready": true}));
        assert_eq!(e, ["enqueued"]);
    }

    #[test]
    fn an_abandoned_timeout_is_told_before_its_lapse() {
        let (q, _) = step(None, &rec(1, 0, doc! {"ready": true}));
        let (c, _) = step(Some(&q), &rec(2, 1, doc! {"claimed": true}));
        // Marked under the claim, which is left to lapse.
        let mut held = doc! {"claimed": true, "last_error": "timed out after 300 ms"};
        held.extend(timed_out(1, 1));
        let (s, e) = step(Some(&c), &rec(3, 1, held.clone()));
        assert_eq!(e, ["timed_out"]);
        let mut next = held.clone();
        next.insert("attempts", 0_i64);
        let (_, e) = step(Some(&s), &rec(4, 2, next.clone()));
        assert_eq!(e, ["lapsed", "recovered"]);
        // The mark, the lapse and the next claim between two reads.
        let (_, e) = step(Some(&c), &rec(4, 2, next));
        assert_eq!(e, ["timed_out", "lapsed", "recovered"]);
        // A claim no read showed, marked already.
        let (_, e) = step(Some(&q), &rec(3, 1, held));
        assert_eq!(e, ["claimed", "timed_out"]);
        // With no attempt left, the next claim fails the task for good.
        let mut failed =
            doc! {"complete": true, "error_encountered": true, "attempts": 2_i64, "last_error": "timed out"};
        failed.extend(timed_out(1, 1));
        let (_, e) = step(Some(&q), &rec(5, 2, failed));
        assert_eq!(e, ["claimed", "timed_out", "failed"]);
        // Cancelled after a timeout no read showed: no run is told, nor its timeout.
        let mut cancelled = doc! {"complete": true, "cancelled": true, "error_encountered": true, "attempts": 1_i64};
        cancelled.extend(timed_out(1, 1));
        let (_, e) = step(Some(&q), &rec(5, 2, cancelled));
        assert_eq!(e, ["cancelled"]);
    }

    #[test]
    fn fan_in_and_cancel() {
        let (s, _) = step(None, &rec(1, 0, doc! {"ready": true}));
        let (s, _) = step(Some(&s), &rec(2, 1, doc! {"claimed": true}));
        let (s, e) = step(Some(&s), &rec(3, 1, doc! {"claimed": false, "waiting": 0_i64, "round_fence": 1_i64}));
        assert_eq!(e, ["waiting"]);
        let (s, e) = step(Some(&s), &rec(4, 1, doc! {"ready": true, "round": 1_i64, "round_fence": 1_i64}));
        assert_eq!(e, ["woken"]);
        let cancelled = doc! {"complete": true, "cancelled": true, "error_encountered": true, "round": 1_i64};
        let (_, e) = step(Some(&s), &rec(5, 2, cancelled));
        assert_eq!(e, ["cancelled"]);
        // A pending follow-up is nothing yet; activated, it is enqueued.
        let (s, e) = step(None, &rec(1, 0, doc! {"ready": false, "pending_parent_fence": 1_i64}));
        assert!(e.is_empty());
        let (_, e) = step(Some(&s), &rec(2, 0, doc! {"ready": true}));
        assert_eq!(e, ["enqueued"]);
    }
}
