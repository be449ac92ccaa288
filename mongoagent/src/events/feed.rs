//! The feed behind an [`EventStream`](super::EventStream): it follows the
//! queue's change notifications (or polls), reads each changed task, and
//! sends the events its change means into the subscriber's bounded buffer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use bson::{Bson, Document};
use store_trait::helpers::Watcher;
use store_trait::{
    ChangeEvent, ChangeKind, Collection, Condition, Key, Order, Query, Record, Store, StoreResult, StoreTime,
};
use tokio::sync::broadcast;

use super::derive::{transitions, Phase, TaskState};
use super::{EventFilter, EventKind, QueueEvent, TaskEvent};
use crate::error::AgentError;
use crate::schema::{fields, not_complete};

/// How many ended tasks a full read looks at (the latest by `completed_at`):
/// a poll that finds all of them new may have missed more, and says so with a
/// `Resync`.
const ENDED_PAGE: u32 = 1000;

/// How many notifications already waiting are taken together, each changed
/// task read once.
const COALESCE: usize = 256;

/// One task as the feed last read it.
struct Seen {
    key: Key,
    agent: String,
    state: TaskState,
}

pub(super) struct Feed<S> {
    store: S,
    coll: Collection,
    filter: EventFilter,
    tx: broadcast::Sender<QueueEvent>,
    watcher: Watcher<S>,
    /// Every live task read since the start, and the latest ended ones (by
    /// the debug form of its id, which tells an `ObjectId` from a string); a
    /// few dozen bytes each.
    tasks: HashMap<String, Seen>,
    /// The ended tasks in `tasks`, in the order they were read ended: beyond
    /// [`EventFilter::remember_ended`] the first are forgotten, so a long-lived
    /// feed's memory stays bounded (an id may appear twice if its task was
    /// requeued and ended again; a stale entry is skipped).
    ended: VecDeque<String>,
    /// Tasks that ended before this are not news when first read.
    since: StoreTime,
    /// The last forgotten task in the order they ended (end time, then id):
    /// a task read ended for the first time that comes no later is a
    /// forgotten one read again (the poll reads the latest ended ones).
    forgotten_until: Option<(StoreTime, String)>,
    /// A read failed, or notifications were missed: read everything next.
    needs_full: bool,
}

fn ident(key: &Key) -> String {
    format!("{:?}", key.as_bson())
}

impl<S: Store + Clone> Feed<S> {
    /// Subscribes, then reads the tasks silently, so no change after this
    /// returns is missed.
    pub(super) async fn start(
        store: S,
        coll: Collection,
        filter: EventFilter,
        tx: broadcast::Sender<QueueEvent>,
    ) -> Result<Self, AgentError> {
        let watcher = Watcher::open(store.clone(), coll.clone(), None, filter.poll_every).await.ignore_renewals();
        let since = store.now().await?;
        let mut feed = Feed {
            store,
            coll,
            filter,
            tx,
            watcher,
            tasks: HashMap::new(),
            ended: VecDeque::new(),
            since,
            forgotten_until: None,
            needs_full: false,
        };
        feed.full_read(true).await?;
        tracing::debug!(queue = %feed.coll, live = feed.watcher.is_live(), "event feed started");
        Ok(feed)
    }

    /// Runs until the subscriber is gone.
    pub(super) async fn run(mut self) {
        let mut tick = tokio::time::interval(self.filter.poll_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        while self.tx.receiver_count() > 0 {
            tokio::select! {
                ev = self.watcher.changed() => {
                    let mut keys = Vec::new();
                    self.take(ev, &mut keys);
                    for _ in 0..COALESCE {
                        match tokio::time::timeout(Duration::ZERO, self.watcher.changed()).await {
                            Ok(ev) => self.take(ev, &mut keys),
                            Err(_) => break,
                        }
                    }
                    if !self.needs_full {
                        let mut done = HashSet::new();
                        for key in keys {
                            if done.insert(ident(&key)) {
                                let read = self.read_one(&key).await;
                                self.note(read);
                            }
                        }
                    }
                }
                _ = tick.tick() => {
                    if !self.watcher.is_live() {
                        self.needs_full = true;
                    }
                    let lapses = self.check_lapses().await;
                    self.note(lapses);
                }
            }
            if self.needs_full {
                self.needs_full = false;
                let read = self.full_read(false).await;
                self.note(read);
            }
        }
        tracing::debug!(queue = %self.coll, "event feed stopped: no subscriber");
    }

    /// A failed read is made good by a full read on the next turn.
    fn note<T>(&mut self, r: Result<T, AgentError>) {
        if let Err(e) = r {
            tracing::warn!(queue = %self.coll, error = %e, "event feed: a read failed; reading everything again");
            self.needs_full = true;
        }
    }

    fn take(&mut self, ev: ChangeEvent, keys: &mut Vec<Key>) {
        match (ev.kind, ev.key) {
            (ChangeKind::Resync, _) | (_, None) => self.needs_full = true,
            (ChangeKind::Renewed, _) => {}
            (_, Some(key)) => keys.push(key),
        }
    }

    fn send(&self, ev: QueueEvent) {
        // An error means the subscriber is gone: `run` stops.
        let _ = self.tx.send(ev);
    }

    /// The tasks of the filter.
    fn query(&self) -> Query {
        let mut d = Document::new();
        if let Some(a) = &self.filter.agent {
            d.insert(fields::AGENT_NAME, a.as_str());
        }
        Query::eq(d)
    }

    /// Reads one task and reports what changed (or that it is gone).
    async fn read_one(&mut self, key: &Key) -> Result<(), AgentError> {
        match self.store.get(&self.coll, key).await?.record {
            Some(r) => {
                self.apply(r, false);
            }
            None => {
                if let Some(gone) = self.tasks.remove(&ident(key)) {
                    let kind = EventKind::Deleted;
                    let ev = TaskEvent::new(gone.key, gone.agent, gone.state.fence, kind);
                    self.send(QueueEvent::Task(ev));
                }
            }
        }
        Ok(())
    }

    /// Remembers `r` and reports its events; whether it was news (new or
    /// changed since the last read).
    fn apply(&mut self, r: Record, silent: bool) -> bool {
        let Some(agent) = r.get_str(fields::AGENT_NAME) else { return false };
        if self.filter.agent.as_deref().is_some_and(|a| a != agent) {
            return false;
        }
        let id = ident(r.key());
        let old = self.tasks.get(&id).map(|s| &s.state);
        // Reads may overtake each other's notifications: never go back.
        if old.is_some_and(|o| r.rev() <= o.rev) {
            return false;
        }
        let was_ended = old.is_some_and(|o| o.phase.ended());
        let mut new = TaskState::of(&r);
        let first_read_ended = old.is_none() && new.phase.ended();
        // A forgotten task read again (the poll reads the latest ended ones)
        // is neither news nor remembered again. Tasks are forgotten in the
        // order they ended, so one never read that ended before the last one
        // forgotten could only come from a gap, which a full read covers.
        if first_read_ended
            && self.forgotten_until.as_ref().is_some_and(|f| (new.completed_at.unwrap_or_default(), &id) <= (f.0, &f.1))
        {
            return false;
        }
        let old_news = first_read_ended && new.completed_at.is_some_and(|c| c < self.since);
        let kinds = if silent || old_news { Vec::new() } else { transitions(old, &mut new, &r) };
        for kind in kinds {
            let ev = TaskEvent::new(r.key().clone(), agent, new.fence, kind);
            self.send(QueueEvent::Task(ev));
        }
        let now_ended = new.phase.ended();
        let seen = Seen { key: r.key().clone(), agent: agent.to_owned(), state: new };
        if now_ended && !was_ended {
            self.ended.push_back(id.clone());
        }
        self.tasks.insert(id, seen);
        self.forget_old_ended();
        true
    }

    /// Forgets the earliest ended tasks beyond [`EventFilter::remember_ended`].
    fn forget_old_ended(&mut self) {
        while self.ended.len() > self.filter.remember_ended {
            let Some(id) = self.ended.pop_front() else { break };
            // Requeued since (not ended now): it stays, as a live task.
            if self.tasks.get(&id).is_some_and(|s| s.state.phase.ended()) {
                if let Some(gone) = self.tasks.remove(&id) {
                    let end = (gone.state.completed_at.unwrap_or_default(), id);
                    if self.forgotten_until.as_ref().is_none_or(|f| *f < end) {
                        self.forgotten_until = Some(end);
                    }
                }
            }
        }
    }

    /// Reads every live task, the latest ended ones, and the live tasks it
    /// knew that neither read returned (ended earlier, or deleted).
    async fn full_read(&mut self, silent: bool) -> Result<(), AgentError> {
        let live = self.store.find_each(&self.coll, &self.query().when(not_complete())).await?;
        let ended = self
            .query()
            .when(Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)))
            .sort(fields::COMPLETED_AT, Order::Desc)
            .limit(ENDED_PAGE);
        let ended = self.store.find_each(&self.coll, &ended).await?;
        let full_page = ended.len() >= ENDED_PAGE as usize;
        let mut read = HashSet::new();
        for r in live.into_iter().filter_map(StoreResult::ok) {
            read.insert(ident(r.key()));
            self.apply(r, silent);
        }
        let mut news = 0;
        // In the order they ended (then by id, as `forgotten_until`), so the
        // first to end are the first forgotten.
        let mut ended: Vec<Record> = ended.into_iter().filter_map(StoreResult::ok).collect();
        ended.sort_by_cached_key(|r| (r.get_time(fields::COMPLETED_AT).unwrap_or_default(), ident(r.key())));
        for r in ended {
            read.insert(ident(r.key()));
            news += usize::from(self.apply(r, silent));
        }
        if !silent && full_page && news >= ENDED_PAGE as usize {
            tracing::warn!(queue = %self.coll, "event feed: more tasks ended than one poll reads: resync");
            self.send(QueueEvent::Resync { missed: 0 });
        }
        let unread: Vec<Key> = self
            .tasks
            .iter()
            .filter(|(id, s)| !s.state.phase.ended() && !read.contains(*id))
            .map(|(_, s)| s.key.clone())
            .collect();
        for key in unread {
            self.read_one(&key).await?;
        }
        Ok(())
    }

    /// Running claims whose lease, as last read, has run out on the store's
    /// clock are read again; still lapsed, they are reported `Lapsed` (once).
    async fn check_lapses(&mut self) -> Result<(), AgentError> {
        let running = |s: &Seen| s.state.phase == Phase::Running && !s.state.lapsed;
        if !self.tasks.values().any(running) {
            return Ok(());
        }
        let now = self.store.now().await?;
        let out = |s: &Seen| s.state.lease_until.is_none_or(|u| u <= now);
        let due: Vec<Key> = self.tasks.values().filter(|s| running(s) && out(s)).map(|s| s.key.clone()).collect();
        for key in due {
            self.read_one(&key).await?;
            let Some(s) = self.tasks.get_mut(&ident(&key)) else { continue };
            if s.state.phase == Phase::Running && !s.state.lapsed && s.state.lease_until.is_none_or(|u| u <= now) {
                s.state.lapsed = true;
                let ev = TaskEvent::new(key, s.agent.clone(), s.state.fence, EventKind::Lapsed);
                tracing::info!(queue = %self.coll, task = %ev.task, fence = ev.fence, "task claim lapsed");
                self.send(QueueEvent::Task(ev));
            }
        }
        Ok(())
    }
}
