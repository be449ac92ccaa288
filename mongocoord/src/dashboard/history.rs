//! The events each task went through while this dashboard has been running,
//! for the task detail page: one `Queue::events` feed per queue for the whole
//! server (never one per tab), kept in memory and bounded.
//!
//! The book holds at most [`PER_TASK`] events of each task and the events of
//! at most [`TASKS`] tasks (the task with the oldest latest event is
//! forgotten first). A feed that fell behind (`Resync`) or had to start again
//! leaves a gap, which the page shows: the events around it may be missing.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mongoagent::{EventFilter, Queue, QueueEvent};
use mongolock::unstable::Backoff;
use parking_lot::Mutex;
use serde::Serialize;
use store_trait::Store;
use tokio_util::sync::CancellationToken;

/// The events kept per task (the latest).
pub(crate) const PER_TASK: usize = 50;
/// The tasks whose events are kept.
pub(crate) const TASKS: usize = 10_000;
/// The bytes the kept events may take, about (their details as JSON, their
/// time and the task's key): events carry errors and progress documents of
/// any size, so a count alone does not bound the book's memory.
pub(crate) const MAX_BYTES: usize = 32 << 20;

/// About how many bytes `seen` of the task `key` takes in the book.
fn size_of(key: &(String, String), seen: &Seen) -> usize {
    let details = serde_json::to_string(&seen.details).map_or(0, |d| d.len());
    details + seen.at.len() + key.0.len() + key.1.len() + 64
}

/// One event as the dashboard saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Seen {
    /// When the dashboard received it (its host's clock, RFC 3339): events
    /// are read after the change, so this is at or after the change.
    pub(crate) at: String,
    /// The event's name (`claimed`, `completed`, …).
    pub(crate) event: &'static str,
    /// The task's fence at the event.
    pub(crate) fence: u64,
    /// What the event carries (attempt, error, progress, round).
    pub(crate) details: serde_json::Value,
}

/// What the page shows of one task.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct TaskHistory {
    /// When the feeds started: nothing before is known.
    pub(crate) since: String,
    /// The task's events, oldest first.
    pub(crate) events: Vec<Seen>,
    /// Earlier events were dropped ([`PER_TASK`]).
    pub(crate) truncated: bool,
    /// When the queue's feed lost events, if it did.
    pub(crate) gaps: Vec<String>,
}

#[derive(Debug, Default)]
struct TaskEvents {
    events: VecDeque<Seen>,
    /// Earlier events were dropped.
    truncated: bool,
    /// The number of its latest event in the book.
    last: u64,
    /// The bytes its events take ([`size_of`]).
    bytes: usize,
}

#[derive(Debug, Default)]
struct Book {
    /// By `(queue, task id)`.
    tasks: HashMap<(String, String), TaskEvents>,
    /// Each task by the number of its latest event: the first is the one
    /// forgotten when the book is full.
    latest: BTreeMap<u64, (String, String)>,
    /// Events numbered so far.
    count: u64,
    /// By queue: when its feed lost events (the latest few).
    gaps: HashMap<String, VecDeque<String>>,
    /// The bytes every kept event takes ([`size_of`]).
    bytes: usize,
    /// The most [`Book::bytes`] may be before tasks are forgotten (0:
    /// [`MAX_BYTES`]).
    max_bytes: usize,
}

impl Book {
    fn add(&mut self, queue: &str, task: String, seen: Seen) {
        self.count += 1;
        let key = (queue.to_owned(), task);
        let size = size_of(&key, &seen);
        let t = self.tasks.entry(key.clone()).or_default();
        t.events.push_back(seen);
        t.bytes += size;
        self.bytes += size;
        if t.events.len() > PER_TASK {
            if let Some(old) = t.events.pop_front() {
                let freed = size_of(&key, &old);
                t.bytes -= freed;
                self.bytes -= freed;
            }
            t.truncated = true;
        }
        self.latest.remove(&t.last);
        t.last = self.count;
        self.latest.insert(self.count, key);
        let max_bytes = if self.max_bytes == 0 { MAX_BYTES } else { self.max_bytes };
        // The tasks whose last event came first are forgotten, whole.
        while self.tasks.len() > TASKS || self.bytes > max_bytes {
            let Some((_, first)) = self.latest.pop_first() else { break };
            if let Some(t) = self.tasks.remove(&first) {
                self.bytes -= t.bytes;
            }
        }
    }

    fn gap(&mut self, queue: &str, at: String) {
        let g = self.gaps.entry(queue.to_owned()).or_default();
        g.push_back(at);
        if g.len() > 10 {
            g.pop_front();
        }
    }
}

/// The feeds and their book; the feeds stop when it is dropped.
#[derive(Debug)]
pub(crate) struct History {
    book: Arc<Mutex<Book>>,
    since: String,
    stop: CancellationToken,
}

impl Drop for History {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn now() -> String {
    bson::DateTime::from_system_time(SystemTime::now()).try_to_rfc3339_string().unwrap_or_default()
}

impl History {
    /// One feed per queue, polling every `poll` where the store has no change
    /// notifications.
    pub(crate) fn start<S: Store + Clone + 'static>(store: &S, queues: &[String], poll: Duration) -> History {
        let book = Arc::new(Mutex::new(Book::default()));
        let stop = CancellationToken::new();
        for q in queues {
            let feed = follow(store.clone(), q.clone(), poll, book.clone());
            tokio::spawn(stop.clone().run_until_cancelled_owned(feed));
        }
        History { book, since: now(), stop }
    }

    /// What the dashboard saw of task `id` of `queue`.
    pub(crate) fn of(&self, queue: &str, id: &str) -> TaskHistory {
        let book = self.book.lock();
        let key = (queue.to_owned(), id.to_owned());
        TaskHistory {
            since: self.since.clone(),
            events: book.tasks.get(&key).map(|t| t.events.iter().cloned().collect()).unwrap_or_default(),
            truncated: book.tasks.get(&key).is_some_and(|t| t.truncated),
            gaps: book.gaps.get(queue).map(|g| g.iter().cloned().collect()).unwrap_or_default(),
        }
    }
}

/// Follows one queue's events into the book; starts again (after a pause
/// that grows) when the feed cannot start or stops.
async fn follow<S: Store + Clone + 'static>(store: S, queue: String, poll: Duration, book: Arc<Mutex<Book>>) {
    let q = match Queue::new(store, &queue) {
        Ok(q) => q,
        Err(e) => {
            tracing::warn!(%queue, error = %e, "dashboard: no events for this queue");
            return;
        }
    };
    let mut backoff = Backoff::new(poll, Duration::from_secs(30));
    let mut first = true;
    loop {
        match q.events(EventFilter::all().poll_every(poll)).await {
            Ok(mut stream) => {
                if !first {
                    // Events between the lost feed and this one are unknown.
                    book.lock().gap(&queue, now());
                }
                backoff.reset();
                while let Some(ev) = stream.next().await {
                    match ev {
                        QueueEvent::Task(ev) => {
                            let seen = Seen {
                                at: now(),
                                event: ev.kind.name(),
                                fence: ev.fence,
                                details: crate::events::details(&ev.kind),
                            };
                            book.lock().add(&queue, ev.task.to_string(), seen);
                        }
                        QueueEvent::Resync { .. } => book.lock().gap(&queue, now()),
                        _ => {}
                    }
                }
                tracing::warn!(%queue, "dashboard: the event feed stopped; starting it again");
            }
            Err(e) => tracing::warn!(%queue, error = %e, "dashboard: the event feed cannot start; trying again"),
        }
        first = false;
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(event: &'static str) -> Seen {
        Seen { at: "t".into(), event, fence: 1, details: serde_json::json!({}) }
    }

    #[test]
    fn the_book_keeps_the_latest_events_of_the_latest_tasks() {
        let mut b = Book::default();
        for _ in 0..PER_TASK + 3 {
            b.add("q", "busy".into(), seen("progress"));
        }
        let key = ("q".to_owned(), "busy".to_owned());
        assert_eq!(b.tasks[&key].events.len(), PER_TASK);
        assert!(b.tasks[&key].truncated);
        for i in 0..TASKS {
            b.add("q", format!("t{i}"), seen("enqueued"));
        }
        // TASKS + 1 tasks had events: the one whose last event came first is gone.
        assert_eq!(b.tasks.len(), TASKS);
        assert!(!b.tasks.contains_key(&key));
        assert!(b.tasks.contains_key(&("q".to_owned(), "t0".to_owned())));
        // The same id in another queue is another task.
        b.add("other", "t1".into(), seen("claimed"));
        assert_eq!(b.tasks[&("q".to_owned(), "t1".to_owned())].events[0].event, "enqueued");
        assert_eq!(b.latest.len(), b.tasks.len());
    }

    /// Events are bounded in bytes too: a few tasks with large errors or
    /// progress documents cannot make the book grow past its budget, where
    /// a count alone let 10,000 tasks of 50 large events each stay.
    #[test]
    fn the_book_is_bounded_in_bytes() {
        let mut b = Book { max_bytes: 100_000, ..Book::default() };
        let big = |i: usize| Seen {
            at: "t".into(),
            event: "retrying",
            fence: 1,
            details: serde_json::json!({ "error": "x".repeat(10_000), "i": i }),
        };
        for i in 0..40 {
            b.add("q", format!("t{i}"), big(i));
            assert!(b.bytes <= 100_000, "{} bytes kept", b.bytes);
        }
        assert!(b.tasks.len() < 10 && b.tasks.contains_key(&("q".to_owned(), "t39".to_owned())));
        let counted: usize = b.tasks.values().map(|t| t.bytes).sum();
        assert_eq!(counted, b.bytes, "the total follows every task's events");
    }
}
