//! Task documents: field names, new tasks, what a handler receives and returns.

use std::time::Duration;

use bson::{Bson, Document};

use crate::error::AgentError;
use crate::schema::fields;

mod claimed;
pub(crate) use claimed::TaskWrites;
pub use claimed::{Child, Task};

/// A task to enqueue.
///
/// ```
/// use mongoagent::NewTask;
/// use std::time::Duration;
///
/// let t = NewTask::new("thumbnailer", bson::doc! { "image": "cat.png" })
///     .priority(5)
///     .delay(Duration::from_secs(60))
///     .dedupe_key("cat.png");
/// # let _ = t;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    pub(crate) agent_name: String,
    pub(crate) data: Document,
    pub(crate) id: Option<Bson>,
    pub(crate) priority: i64,
    pub(crate) delay: Option<Duration>,
    pub(crate) dedupe_key: Option<String>,
    pub(crate) dedupe_scope: DedupeScope,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) parent: Option<Bson>,
    /// The task waiting for this one, and its round.
    pub(crate) join: Option<(Bson, i64)>,
    /// A fan-in task: enqueued waiting for the follow-ups joined to it (which
    /// are enqueued first), made ready when the last of them ends.
    pub(crate) fan_in: bool,
    /// Not before this instant (store clock).
    pub(crate) run_at: Option<store_trait::StoreTime>,
    /// The schedule and tick that enqueued it.
    pub(crate) schedule: Option<(String, store_trait::StoreTime)>,
    /// Held back by its schedule's overlap policy (enqueued not ready).
    pub(crate) held: bool,
    /// How long one attempt may run.
    pub(crate) timeout: Option<Duration>,
    /// The group it runs in, one of at most the agents' cap at a time.
    pub(crate) group: Option<String>,
}

impl NewTask {
    /// A task for `agent_name` carrying `data`: any plain top-level fields but
    /// the queue's own ([`fields::RESERVED`](crate::fields::RESERVED), `_id`
    /// included: use [`NewTask::id`]). A reserved field is refused at enqueue
    /// with [`AgentError::ReservedField`]; in a follow-up, it fails the
    /// handler's outcome for good.
    pub fn new(agent_name: impl Into<String>, data: Document) -> Self {
        NewTask {
            agent_name: agent_name.into(),
            data,
            id: None,
            priority: 0,
            delay: None,
            dedupe_key: None,
            dedupe_scope: DedupeScope::Forever,
            max_attempts: None,
            timeout: None,
            parent: None,
            join: None,
            fan_in: false,
            run_at: None,
            schedule: None,
            held: false,
            group: None,
        }
    }

    /// An explicit id (default: a fresh `ObjectId`).
    #[must_use]
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(Bson::String(id.into()));
        self
    }

    /// Priority: higher runs first (default 0).
    #[must_use]
    pub fn priority(mut self, p: i64) -> Self {
        self.priority = p;
        self
    }

    /// Not before `d` from now (store clock).
    #[must_use]
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = Some(d);
        self
    }

    /// Not before the instant `at` on the store clock. With [`NewTask::delay`]
    /// too, the later of the two applies.
    #[must_use]
    pub fn run_at(mut self, at: store_trait::StoreTime) -> Self {
        self.run_at = Some(at);
        self
    }

    /// Enqueuing another task with the same key is a no-op reported as a duplicate.
    #[must_use]
    pub fn dedupe_key(mut self, k: impl Into<String>) -> Self {
        self.dedupe_key = Some(k.into());
        self
    }

    /// How long this task's [`dedupe_key`](Self::dedupe_key) blocks another
    /// task with the same key (default [`DedupeScope::Forever`]). A later
    /// enqueue whose key is blocked is a duplicate and returns the task that
    /// holds the key; once the key no longer blocks, that enqueue moves the
    /// key off the old task (to `dedupe_key_retired`) and inserts the new one,
    /// atomically under racing producers. Follow-ups keep the for-ever rule.
    ///
    /// ```
    /// use mongoagent::{DedupeScope, NewTask};
    /// use std::time::Duration;
    ///
    /// let t = NewTask::new("sync", bson::doc! {}).dedupe_key("account-7").dedupe_scope(DedupeScope::UntilEnded);
    /// let w = NewTask::new("mail", bson::doc! {}).dedupe_key("digest").dedupe_scope(DedupeScope::For(Duration::from_secs(3600)));
    /// # let _ = (t, w);
    /// ```
    #[must_use]
    pub fn dedupe_scope(mut self, scope: DedupeScope) -> Self {
        self.dedupe_scope = scope;
        self
    }

    /// Debounces this task by its [`dedupe_key`](Self::dedupe_key):
    /// shorthand for [`dedupe_scope`](Self::dedupe_scope)`(`[`DedupeScope::Debounce`]`(d))`.
    /// The task starts `d` after the latest enqueue with its key (store
    /// clock); each later debounced enqueue while it has never been claimed
    /// replaces its data and options and pushes its start again, and returns
    /// its id as a duplicate (`(id, false)`). Once it has been claimed
    /// (running, retried, ended), a later enqueue inserts a new task, so the
    /// latest data is never lost. The new task is not ordered after the
    /// claimed one: it may run beside it, or before its retry.
    ///
    /// ```
    /// use mongoagent::NewTask;
    /// use std::time::Duration;
    ///
    /// // Reindex a document once edits have paused for five seconds, with the latest edit.
    /// let t = NewTask::new("reindex", bson::doc! { "doc": 42, "edit": 7 })
    ///     .dedupe_key("reindex/42")
    ///     .debounce(Duration::from_secs(5));
    /// # let _ = t;
    /// ```
    #[must_use]
    pub fn debounce(self, d: Duration) -> Self {
        self.dedupe_scope(DedupeScope::Debounce(d))
    }

    /// Overrides the agent's attempt limit for this task.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// How long one attempt of this task may run, overriding the agent's
    /// [`AgentBuilder::timeout`](crate::AgentBuilder::timeout): when it
    /// passes, the handler's [`Task::cancellation`] fires and the attempt
    /// fails with "timed out after …" (the retry policy applies). From 1 ms to
    /// [`MAX_TIMEOUT`](crate::MAX_TIMEOUT); else the enqueue is
    /// [`AgentError::InvalidTask`].
    ///
    /// ```
    /// use mongoagent::NewTask;
    /// use std::time::Duration;
    ///
    /// let t = NewTask::new("render", bson::doc! {}).timeout(Duration::from_secs(30));
    /// # let _ = t;
    /// ```
    #[must_use]
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Puts the task in group `key`: agents of its name built with a cap
    /// ([`AgentBuilder::group_concurrency`](crate::AgentBuilder::group_concurrency))
    /// run at most that many of the group's tasks at once, across the
    /// cluster, and start them in enqueue order; other groups run beside
    /// it. With a cap of 1, a group's tasks run one at a time, in order
    /// (a retry runs before the next task; a delayed task holds its turn
    /// until it is due). See [`crate::group`] for the design and its cost.
    ///
    /// A grouped task waits (not ready) until an agent with a cap lets it
    /// through: enqueued for agents without one, it does not run.
    ///
    /// A follow-up ([`Outcome::follow_up`](crate::Outcome::follow_up)) takes
    /// its place in its group when its parent's outcome is written, behind
    /// the tasks enqueued before. A task that waits for its follow-ups
    /// keeps its group's turn while it waits, so none of them may be in its
    /// own group (the outcome fails for good, saying so). A debounced task
    /// ([`NewTask::debounce`]) keeps the place of its burst's first enqueue;
    /// a debounced enqueue of its key in another group is
    /// [`AgentError::KeyHeldByAnother`].
    ///
    /// A fan-in task ([`Outcome::then`](crate::Outcome::then)) is numbered
    /// in its group when its parent returns it, takes no turn while its
    /// follow-ups run, and waits for its group's turn, in that place, once
    /// they have all ended. A schedule's ticks may be grouped too
    /// ([`Schedule::new`](crate::schedule::Schedule::new)).
    ///
    /// The key is 1 to [`MAX_GROUP_LEN`](crate::group::MAX_GROUP_LEN) bytes.
    ///
    /// ```
    /// use mongoagent::NewTask;
    ///
    /// // One customer's orders run one at a time, in order.
    /// let t = NewTask::new("orders", bson::doc! { "order": 17 }).group("customer-42");
    /// # let _ = t;
    /// ```
    #[must_use]
    pub fn group(mut self, key: impl Into<String>) -> Self {
        self.group = Some(key.into());
        self
    }

    /// How long after its enqueue (store clock) the task starts, if not at
    /// once: its delay, and for a debounced task the later of the delay and
    /// the debounce.
    pub(crate) fn starts_after(&self) -> Option<Duration> {
        match (self.delay, self.dedupe_scope.debounce()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// The document to insert (`run_at` is added by the queue, on the store clock).
    pub(crate) fn to_document(&self) -> Result<Document, AgentError> {
        if self.agent_name.is_empty() {
            return Err(AgentError::InvalidTask("a task needs a non-empty agent_name".into()));
        }
        if self.dedupe_key.as_deref() == Some("") {
            return Err(AgentError::InvalidTask("a dedupe key must not be empty".into()));
        }
        // As for the agent name's control document, whose key it becomes.
        if self.agent_name.len() > store_trait::Key::MAX_LEN {
            return Err(AgentError::InvalidTask(format!(
                "agent_name is {} bytes, longer than {}",
                self.agent_name.len(),
                store_trait::Key::MAX_LEN
            )));
        }
        crate::schema::check_user_fields(&self.data)?;
        if self.max_attempts == Some(0) {
            return Err(AgentError::InvalidTask("max_attempts must be at least 1".into()));
        }
        let timeout = self.timeout.map(timeout_ms).transpose()?;
        if let Some(g) = &self.group {
            crate::group::check(&self.agent_name, g)?;
            // Unreachable through a schedule, which refuses the pair: its
            // ticks already wait for their group's turn, in order.
            if self.held {
                return Err(AgentError::InvalidTask(
                    "a grouped tick cannot also be held by its schedule's Overlap::Queue".into(),
                ));
            }
        }
        let mut d = Document::new();
        if let Some(id) = &self.id {
            d.insert("_id", id.clone());
        }
        d.insert(fields::AGENT_NAME, self.agent_name.as_str());
        d.insert(fields::READY, !self.fan_in && !self.held && self.group.is_none());
        if let Some(g) = &self.group {
            // Numbered (`group_seq`) by the queue as it enqueues. A fan-in
            // task is held in its group once its follow-ups have ended.
            d.insert(fields::GROUP_KEY, g.as_str());
            d.insert(if self.fan_in { fields::GROUP_AFTER_WAIT } else { fields::GROUP_HELD }, true);
        }
        if self.held {
            d.insert(fields::OVERLAP_HELD, true);
        }
        if self.fan_in {
            d.insert(fields::WAITING, 0_i64);
        }
        d.insert(fields::PRIORITY, self.priority);
        if let Some(k) = &self.dedupe_key {
            d.insert(fields::DEDUPE_KEY, k.as_str());
        }
        match (&self.dedupe_key, self.dedupe_scope) {
            (_, DedupeScope::Forever) => {}
            (None, _) => return Err(AgentError::InvalidTask("a dedupe scope needs a dedupe key".into())),
            (Some(_), DedupeScope::UntilEnded) => {
                d.insert(fields::DEDUPE_SCOPE, "until_ended");
            }
            (Some(_), DedupeScope::For(w)) => {
                timeout_ms(w).map_err(|_| {
                    AgentError::InvalidTask(format!("a dedupe window must be from 1 ms to a year, not {w:?}"))
                })?;
                // `dedupe_until` is set by the queue, on the store clock.
                d.insert(fields::DEDUPE_SCOPE, "window");
            }
            (Some(_), DedupeScope::Debounce(w)) => {
                timeout_ms(w).map_err(|_| {
                    AgentError::InvalidTask(format!("a debounce must be from 1 ms to a year, not {w:?}"))
                })?;
                // A later enqueue replaces this task's data where it stands,
                // or inserts another task: one id cannot name both.
                if self.id.is_some() {
                    return Err(AgentError::InvalidTask(
                        "a debounced task cannot have an explicit id, nor be a follow-up (whose id derives from its parent): its key may move on to a new task".into(),
                    ));
                }
                // Its start is the latest enqueue plus the debounce, on the
                // store clock; an absolute time would not move with it.
                if self.run_at.is_some() {
                    return Err(AgentError::InvalidTask(
                        "a debounced task starts a debounce after its latest enqueue: use delay, not run_at".into(),
                    ));
                }
                d.insert(fields::DEDUPE_SCOPE, DEBOUNCE);
            }
        }
        if let Some(n) = self.max_attempts {
            d.insert(fields::MAX_ATTEMPTS, i64::from(n));
        }
        if let Some(ms) = timeout {
            d.insert(fields::TIMEOUT_MS, ms);
        }
        if let Some(p) = &self.parent {
            d.insert(fields::PARENT, p.clone());
        }
        if let Some((waiter, round)) = &self.join {
            d.insert(fields::JOIN, waiter.clone());
            d.insert(fields::JOIN_ROUND, *round);
        }
        if let Some(at) = self.run_at {
            d.insert(fields::RUN_AT, at.to_bson_datetime());
        }
        if let Some((name, tick)) = &self.schedule {
            d.insert(fields::SCHEDULE, name.as_str());
            d.insert(fields::SCHEDULED_FOR, tick.to_bson_datetime());
        }
        d.extend(self.data.clone());
        Ok(d)
    }
}

/// How long a task's dedupe key blocks another task with the same key
/// ([`NewTask::dedupe_scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DedupeScope {
    /// For as long as the task's document exists.
    #[default]
    Forever,
    /// While the task has not ended: pending, waiting, running or retried.
    /// Once it completed or failed for good, the key is free.
    UntilEnded,
    /// For this long after the task was enqueued (store clock), ended or not.
    For(Duration),
    /// Debounce ([`NewTask::debounce`]): while the task has never been
    /// claimed, a later enqueue with this scope, the same key and the same
    /// agent name replaces its data and options (not its id) and moves its
    /// start to this long after that enqueue (store clock), so it runs once,
    /// with the latest data. Once it has been claimed (running, waiting to be
    /// retried, ended), the key is free and the next enqueue inserts a new
    /// task. An enqueue of another scope finds the key held while the task
    /// has never been claimed (a duplicate); a debounced enqueue for another
    /// agent name, or one that finds the key held by a task of another scope
    /// that still blocks it, is [`AgentError::KeyHeldByAnother`]: its data
    /// would not run.
    Debounce(Duration),
}

/// The stored name of [`DedupeScope::Debounce`].
pub(crate) const DEBOUNCE: &str = "debounce";

impl DedupeScope {
    /// How long after the enqueue a debounced task starts, if it is one.
    pub(crate) fn debounce(self) -> Option<Duration> {
        match self {
            DedupeScope::Debounce(d) => Some(d),
            _ => None,
        }
    }
}

/// The longest execution timeout a task or an agent may have: a year (366 days).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(366 * 24 * 3600);

/// A timeout in whole milliseconds, checked against [`MAX_TIMEOUT`].
pub(crate) fn timeout_ms(d: Duration) -> Result<i64, AgentError> {
    match i64::try_from(d.as_millis()) {
        Ok(ms) if ms >= 1 && d <= MAX_TIMEOUT => Ok(ms),
        _ => Err(AgentError::InvalidTask(format!("a timeout must be from 1 ms to a year, not {d:?}"))),
    }
}

/// The timeout a claim of `record` runs under: the task's own, else the
/// agent's. A stored value that is not a number from 1 ms to [`MAX_TIMEOUT`]
/// (written past the queue) is ignored.
pub(crate) fn timeout_of(record: &store_trait::Record, agent: Option<Duration>) -> Option<Duration> {
    let own = record
        .get_i64(fields::TIMEOUT_MS)
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
        .filter(|d| !d.is_zero() && *d <= MAX_TIMEOUT);
    own.or(agent)
}

/// The attempt a claim of `record` is: its fence counted from the fence the
/// current round (or the last requeue) started at.
pub(crate) fn attempt(record: &store_trait::Record) -> u64 {
    let from = record.get_i64(fields::ROUND_FENCE).and_then(|f| u64::try_from(f).ok()).unwrap_or(0);
    record.fence().saturating_sub(from).max(1)
}

/// The changes that give back a claim of `record` whose handler never started
/// (a `process_while` stop or a drain's end with tasks claimed ahead, a stop
/// while waiting for a start under the rate limit): the round's fence moves on
/// with the claim's, so the next claim is the same attempt as this one. A
/// give-back is not a try, and must not use up a task's retries. Nor is it a
/// crashed agent's claim: a task claimed to run is made ready and unclaimed
/// again, as it was (no view shows it lapsed); one claimed to finish a crashed
/// agent's fan-in step stays claimed, to be finished as a lapsed claim.
pub(crate) fn not_started(record: &store_trait::Record) -> store_trait::Mutation {
    let from = record.get_i64(fields::ROUND_FENCE).unwrap_or(0);
    let m = store_trait::Mutation::new().set(fields::ROUND_FENCE, from.saturating_add(1));
    let d = record.data();
    let mid_step = d.get_bool(fields::COMPLETE).ok() == Some(true)
        || d.contains_key(fields::WAITING)
        || d.contains_key(crate::schema::pending::PARENT_FENCE);
    if mid_step {
        // A crashed agent's fan-in step: claimed again as the lapsed claim it is.
        return m;
    }
    // Ready and unclaimed again, as before its claim: not a crashed agent's.
    m.set(fields::READY, true).set(fields::CLAIMED, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn new_task_documents() {
        let d = NewTask::new("a", doc! {"x": 1}).priority(3).dedupe_key("k").id("t1").to_document().unwrap();
        assert_eq!(
            d,
            doc! {"_id": "t1", "agent_name": "a", "ready": true, "priority": 3_i64, "dedupe_key": "k", "x": 1}
        );
        assert!(NewTask::new("", doc! {}).to_document().is_err());
        assert!(NewTask::new("a", doc! {"ready": false}).to_document().is_err());
        assert!(NewTask::new("a", doc! {}).max_attempts(0).to_document().is_err());
        assert!(NewTask::new("a", doc! {"schedule": "x"}).to_document().is_err());
        assert!(NewTask::new("a", doc! {"timeout_ms": 5}).to_document().is_err());
        assert!(NewTask::new("a", doc! {}).timeout(Duration::ZERO).to_document().is_err());
        assert!(NewTask::new("a", doc! {}).timeout(MAX_TIMEOUT + Duration::from_secs(1)).to_document().is_err());
        let d = NewTask::new("a", doc! {}).timeout(Duration::from_millis(1500)).to_document().unwrap();
        assert_eq!(d.get_i64("timeout_ms").unwrap(), 1500);
        let at = store_trait::StoreTime::from_millis(5_000);
        let d = NewTask::new("a", doc! {}).run_at(at).to_document().unwrap();
        assert_eq!(d.get_datetime("run_at").unwrap().timestamp_millis(), 5_000);
    }
}
