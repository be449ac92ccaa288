//! Lifecycle events of a queue's tasks ([`Queue::events`]): read from the
//! store's change notifications, or by polling where it has none.
//!
//! A change notification only names the document that changed
//! ([`store_trait::ChangeEvent`] is a hint to re-read), so the stream reads
//! each changed task and tells what happened from the difference with what it
//! read before (`derive`); the feed that does so runs on its own task (`feed`).

mod derive;
mod feed;

use std::time::Duration;

use bson::Bson;
use store_trait::{Key, Store};
use tokio::sync::broadcast;

use crate::error::AgentError;
use crate::queue::Queue;

/// What happened to a task. Each names a transition of the task document;
/// see [`TaskEvent`] for what is reported when reads skip states.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EventKind {
    /// It exists and can be claimed (when due): enqueued, or a follow-up
    /// activated by its parent's outcome.
    Enqueued,
    /// A debounced enqueue gave it its data and moved its start
    /// ([`NewTask::debounce`](crate::task::NewTask::debounce)); it had not
    /// been claimed yet, and runs once, with the latest data.
    Debounced,
    /// An agent claimed it for this attempt of its round.
    Claimed {
        /// The attempt (1 for the first of a round).
        attempt: u64,
    },
    /// Its handler reported progress ([`Task::progress`](crate::Task::progress)).
    Progress {
        /// The value reported: a number or a small document.
        value: Bson,
    },
    /// It ended successfully.
    Completed,
    /// An attempt ran past its execution timeout
    /// ([`AgentBuilder::timeout`](crate::AgentBuilder::timeout),
    /// [`NewTask::timeout`](crate::NewTask::timeout)). What follows tells how
    /// the task goes on: `Retrying` or `Failed` when the handler stopped
    /// within the grace; when it did not, the claim is left to lapse
    /// (`Lapsed`), and the next claim (`Recovered`) runs the next attempt
    /// or, with none left, fails the task (`Failed`).
    TimedOut {
        /// The attempt that timed out.
        attempt: u64,
        /// The timeout it ran under.
        timeout: Duration,
    },
    /// A run failed and the task will be tried again (after a backoff).
    Retrying {
        /// The attempt that failed.
        attempt: u64,
        /// Its error.
        error: String,
    },
    /// It failed for good: `requeue` revives it.
    Failed {
        /// The last attempt.
        attempt: u64,
        /// The last error.
        error: String,
    },
    /// Its claim's lease lapsed without an outcome (the agent crashed or
    /// hung): it is claimable again.
    Lapsed,
    /// Another claim took it over after its lease lapsed.
    Recovered {
        /// The attempt of the new claim.
        attempt: u64,
    },
    /// An operator cancelled it ([`Queue::cancel`]).
    Cancelled,
    /// Its handler waits for its follow-ups to end (fan-in).
    Waiting {
        /// The round whose follow-ups it waits for.
        round: i64,
    },
    /// Its follow-ups all ended: it is ready to run again.
    Woken {
        /// The round it runs next.
        round: i64,
    },
    /// An operator made it ready again after it failed or its claim lapsed
    /// ([`Queue::requeue`]).
    Requeued,
    /// The document was deleted ([`Queue::delete`], or collected after it ended).
    Deleted,
}

impl EventKind {
    /// A short lower-case name (`"enqueued"`, `"claimed"`, `"timed_out"`, …),
    /// as the CLI prints it.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Enqueued => "enqueued",
            EventKind::Debounced => "debounced",
            EventKind::Claimed { .. } => "claimed",
            EventKind::Progress { .. } => "progress",
            EventKind::Completed => "completed",
            EventKind::TimedOut { .. } => "timed_out",
            EventKind::Retrying { .. } => "retrying",
            EventKind::Failed { .. } => "failed",
            EventKind::Lapsed => "lapsed",
            EventKind::Recovered { .. } => "recovered",
            EventKind::Cancelled => "cancelled",
            EventKind::Waiting { .. } => "waiting",
            EventKind::Woken { .. } => "woken",
            EventKind::Requeued => "requeued",
            EventKind::Deleted => "deleted",
        }
    }
}

/// One task's event.
///
/// The events of one task come in the order the task went through its
/// states. The stream reads a task after it changed, so a fast task may have
/// moved on by then: a step a later state proves (a run that recorded an
/// outcome was claimed; a woken task waited) is still reported, in its
/// place; a step that left no trace (a progress report overwritten before
/// the read) is not.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TaskEvent {
    /// The task's id.
    pub task: Key,
    /// The agent name it is for.
    pub agent: String,
    /// The task's fence when it was read (a claim's fence for `Claimed`).
    pub fence: u64,
    /// What happened.
    pub kind: EventKind,
}

impl TaskEvent {
    /// An event (for tests of code that consumes them).
    pub fn new(task: Key, agent: impl Into<String>, fence: u64, kind: EventKind) -> Self {
        TaskEvent { task, agent: agent.into(), fence, kind }
    }
}

/// An item of [`EventStream`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
// Nearly every item is a task's event; boxing it would cost an allocation per
// event to shrink the rare `Resync`.
#[allow(clippy::large_enum_variant)]
pub enum QueueEvent {
    /// A task's event.
    Task(TaskEvent),
    /// Events were lost: the subscriber fell behind by more than the buffer
    /// ([`EventFilter::buffer`]), or the poll could not tell everything that
    /// ended since its last look. Re-read the tasks ([`Queue::tasks`]) to
    /// know where they are; the stream goes on.
    Resync {
        /// How many events were dropped, when known.
        missed: u64,
    },
}

/// Which events [`Queue::events`] delivers, and how.
#[derive(Debug, Clone)]
pub struct EventFilter {
    pub(crate) agent: Option<String>,
    pub(crate) buffer: usize,
    pub(crate) poll_every: Duration,
    pub(crate) remember_ended: usize,
}

impl Default for EventFilter {
    fn default() -> Self {
        EventFilter { agent: None, buffer: 4096, poll_every: Duration::from_secs(1), remember_ended: 10_000 }
    }
}

impl EventFilter {
    /// The largest buffer [`EventFilter::buffer`] takes (a million events).
    pub const MAX_BUFFER: usize = 1 << 20;

    /// Every task of the queue.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only the tasks of this agent name.
    #[must_use]
    pub fn agent(mut self, name: impl Into<String>) -> Self {
        self.agent = Some(name.into());
        self
    }

    /// How many events wait for a slow subscriber before it gets a
    /// [`QueueEvent::Resync`] instead (default 4096; at least 1, at most
    /// [`EventFilter::MAX_BUFFER`]).
    #[must_use]
    pub fn buffer(mut self, events: usize) -> Self {
        self.buffer = events.clamp(1, Self::MAX_BUFFER);
        self
    }

    /// How often the tasks are read when the store has no change
    /// notifications (a standalone `mongod`), and how often running claims
    /// are checked for a lapsed lease (default 1 s; at least 10 ms).
    #[must_use]
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.poll_every = every.max(Duration::from_millis(10));
        self
    }

    /// How many ended tasks the feed keeps in memory (default 10,000; at
    /// least 1), so a feed that runs for months over millions of tasks stays
    /// small: live tasks are always kept, the tasks that ended first are
    /// forgotten first. A forgotten task is reported as new if it comes back
    /// (`Enqueued` where `Requeued` would have been), and its deletion is not
    /// reported. Keep it at 1,000 or more where the store has no change
    /// notifications: each poll reads the latest 1,000 ended tasks.
    #[must_use]
    pub fn remember_ended(mut self, tasks: usize) -> Self {
        self.remember_ended = tasks.max(1);
        self
    }
}

/// The events of a queue's tasks, from [`Queue::events`]. Dropping it stops
/// the feed.
#[derive(Debug)]
pub struct EventStream {
    rx: broadcast::Receiver<QueueEvent>,
    feed: tokio::task::JoinHandle<()>,
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.feed.abort();
    }
}

impl EventStream {
    /// The next event; `None` once the feed stopped (it stops only when the
    /// stream is dropped, or its task panicked).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, so it can be a `tokio::select!` branch: an event is taken
    /// from the buffer only when it is returned.
    pub async fn next(&mut self) -> Option<QueueEvent> {
        match self.rx.recv().await {
            Ok(ev) => Some(ev),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "event subscriber fell behind: resync");
                Some(QueueEvent::Resync { missed })
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl<S: Store + Clone> Queue<S> {
    /// A stream of the lifecycle events of this queue's tasks (those of
    /// `filter`), from now on: each task's events in order (see
    /// [`TaskEvent`]). Tasks are read once when it starts, silently; after
    /// that each change notification is followed by a read of the task that
    /// changed. Where the store has no notifications, the tasks are read every
    /// [`EventFilter::poll_every`]. A subscriber that falls behind gets a
    /// [`QueueEvent::Resync`] and the stream goes on; it is never dropped.
    ///
    /// A read the store fails is tried again on the next notification or
    /// poll, after a full read of the tasks.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops the subscription being made;
    /// nothing is written.
    pub async fn events(&self, filter: EventFilter) -> Result<EventStream, AgentError> {
        let (tx, rx) = broadcast::channel(filter.buffer);
        let feed = feed::Feed::start(self.store.clone(), self.coll.clone(), filter, tx).await?;
        Ok(EventStream { rx, feed: tokio::spawn(feed.run()) })
    }
}
