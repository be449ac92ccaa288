//! The [`Claimer`]: an agent's claims, and everything they are decided by:
//! which tasks are claimable and in which order, the agent name's list of
//! candidates behind the claim gate it shares with the agents on clones of
//! its queue (`candidates.rs`), the pause state, the cluster-wide limits
//! (`limits.rs`), and the claim itself (one `Store::claim`, whose lease the
//! agent's `Leases` then keeps as a lock guard).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bson::Bson;
use mongolock::unstable::Leases;
use mongolock::{Identity, LockGuard};
use parking_lot::Mutex;
use store_trait::{
    fields as reserved, ChangeEvent, ChangeFilter, ChangeKind, Claim, Key, Mutation, Query, Record, Store, Ttl,
    UpdateClause,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::candidates::Candidates;
use super::limits::{Limits, Permit};
use crate::control::{ControlView, ControlWatch, CONTROL_REFRESH};
use crate::error::AgentError;
use crate::queue::Queue;
use crate::schema::{fields, lapsed_tasks, ready_tasks};

/// The claim gate of the agents on clones of one queue: they claim one at a
/// time, each agent name from its one list of candidates, so they never race
/// each other for a key. Kept in the queue's [`Shared`](crate::shared::Shared).
#[derive(Default)]
struct ClaimGate(tokio::sync::Mutex<HashMap<String, Candidates>>);

/// An agent's claims. Built once per agent; its methods are the only way
/// the agent takes tasks.
pub(super) struct Claimer<S: Store + Clone> {
    store: S,
    queue: Queue<S>,
    name: String,
    identity: Identity,
    ttl: Ttl,
    /// Keeps every claim's lease: built once per agent, used by every claim.
    leases: Leases<S>,
    /// Numbers the claims: each claim's owner, and every sixteenth claim's
    /// look at lapsed tasks first.
    seq: AtomicU64,
    /// What the agent last saw of its pause state, and when: without the
    /// queue's control notifications it reads its control document again
    /// after [`CONTROL_REFRESH`].
    paused: Mutex<Option<(Instant, bool)>>,
    gate: Arc<ClaimGate>,
    control: Arc<ControlWatch>,
    /// The agent's stop: it ends a wait for the claim gate.
    shutdown: CancellationToken,
    /// The cluster-wide limits of the agent name (permits, starts per interval).
    pub(super) limits: Limits<S>,
    /// Where claim spans come from (the `otel` feature).
    tracer: crate::trace::ClaimTracer,
}

/// The changes that may make a task claimable, which wake an idle agent
/// ([`Store::watch_filtered`]; on MongoDB filtered on the server): a task
/// inserted, one made ready (a retry, a fan-in's activation, a requeue, a
/// schedule's held task let go), a lease let go without the task ending in the
/// same write (a claim given back, a waiting task released), a due time moved.
/// Claims, renewals, progress and completions (two of a task's three events)
/// never leave the server, except the releases that let a lease go apart from
/// `complete: true`: a follow-up's completion that still tells its waiter, a
/// recovered fan-in step, a waiting task let go with follow-ups still open
/// (they wake idle agents into a claim). A lapsed lease
/// is no change at all: the idle agent's timer covers it (`Agent::idle_wait`),
/// and so it covers anything another program does that this filter does not
/// foresee.
pub(crate) fn claimable_changes() -> ChangeFilter {
    ChangeFilter::new()
        .inserts()
        .update(UpdateClause::sets(fields::READY, true))
        .update(UpdateClause::sets(reserved::LEASE_OWNER, Bson::Null).unless_sets(fields::COMPLETE, true))
        .update(UpdateClause::touches(fields::RUN_AT))
}

/// Under a global concurrency: the changes that may make a task claimable
/// ([`claimable_changes`]), and those that may free a permit of the name's
/// semaphore, a task ending anywhere (its outcome sets `complete: true`).
/// Renewals and progress reports still never leave the server. A permit
/// whose holder crashed frees with no change at all: the limited agent polls
/// (`poll_interval`) for it.
pub(crate) fn claimable_or_freeing_changes() -> ChangeFilter {
    claimable_changes().update(UpdateClause::sets(fields::COMPLETE, true))
}

/// A claimed task with its lease.
pub(super) struct Claimed<S: Store + Clone> {
    pub(super) guard: LockGuard<S>,
    pub(super) record: Record,
    /// The permit of the agent name's global concurrency it runs under, if limited.
    pub(super) permit: Option<Permit<S>>,
    /// The claim it came from, for its run's trace.
    pub(super) trace: crate::trace::ClaimTrace,
}

/// What one claim call got: its tasks, and whether it gave up with ready
/// tasks likely left (`outrun`): other claimers took every candidate it read,
/// or its claim of the head found none right after a list read found some
/// (`Candidates::head_claimed`). Since the idle watch passes over other
/// claimers' claims ([`claimable_changes`]), no change need come to say so:
/// the work loop tries again after a backoff instead of idling.
///
/// And whether they came from a backlog (`backlog`): claimed by key from a
/// list of candidates whose read filled its window, so more tasks are ready
/// than a window holds; only then does the agent claim ahead of its free
/// slots (`ahead.rs`).
pub(super) struct Claims<S: Store + Clone> {
    pub(super) tasks: Vec<Claimed<S>>,
    pub(super) outrun: bool,
    pub(super) backlog: bool,
}

impl<S: Store + Clone> Claims<S> {
    /// Nothing claimed, and nothing left to try soon.
    pub(super) fn none() -> Self {
        Claims { tasks: Vec::new(), outrun: false, backlog: false }
    }

    /// These tasks claimed.
    fn got(tasks: Vec<Claimed<S>>) -> Self {
        Claims { tasks, outrun: false, backlog: false }
    }
}

/// The least free capacity claimed with one batch ([`Store::claim_many`]):
/// a batch by query costs three commands on MongoDB (candidates, one
/// conditional update, the read back) whatever its size, a single claim one;
/// from three free slots on a batch costs no more commands than single
/// claims, and takes one turn instead of one per task. (A batch of named
/// keys costs two: the keys are its candidates.)
pub(super) const BATCH_FROM: usize = 3;

/// How one claim call takes its tasks.
#[derive(Debug, Clone, Copy)]
pub(super) enum Take {
    /// One `Store::claim`.
    One,
    /// One `Store::claim_many` of at most this many.
    Batch(usize),
}

impl Take {
    /// For a claim by query with `capacity` free slots: a batch from
    /// [`BATCH_FROM`] on.
    fn for_query(capacity: usize) -> Take {
        if capacity >= BATCH_FROM {
            Take::Batch(capacity)
        } else {
            Take::One
        }
    }

    /// For a claim of `n` named keys: every key is tried (a batch costs two
    /// commands then, whatever its size), so a shortfall is a loss, never a
    /// key left untried.
    fn for_keys(n: usize) -> Take {
        if n >= 2 {
            Take::Batch(n)
        } else {
            Take::One
        }
    }

    /// How many tasks it takes at most.
    fn count(self) -> usize {
        match self {
            Take::One => 1,
            Take::Batch(n) => n,
        }
    }
}

/// What woke an idle agent ([`claimable_changes`]): the keys of the tasks
/// inserted meanwhile, which its next claim tries first, by key and in claim
/// order (the event carries the key; a task of another name or one already
/// taken is a miss, found by `_id`); and whether anything else changed too.
///
/// Woken by inserts alone, an agent whose keyed claim missed claims nothing
/// else: its last claim found nothing claimable, and an insert makes only
/// itself claimable. So a burst of idle agents woken by one insert costs one
/// light command each, not a claim by the queue's filter and sort each. That
/// premise holds only after a claim that saw the whole queue; so the usual
/// claim follows after a pause (the last claim saw nothing while paused), and
/// under a global concurrency limit (the last claim may have found no permit,
/// and permits free without a queue event: [`Claimer::claim`]).
/// The pause state as one claim sees it.
#[derive(Debug, Clone, Copy)]
struct Pause {
    /// What the agent had seen before this claim (`None`: nothing yet).
    was: Option<bool>,
    /// Paused now.
    now: bool,
}

#[derive(Debug, Default)]
pub(super) struct Woken {
    /// Keys of inserted documents, in the order of their events (at most
    /// [`WOKEN_KEYS`]).
    pub(super) inserted: Vec<Key>,
    /// Whether a change other than an insert came too, or more inserts than
    /// kept: then the usual claim follows the keyed one.
    pub(super) other: bool,
}

/// Inserted keys a wake-up keeps for its keyed claim.
const WOKEN_KEYS: usize = 64;

impl Woken {
    /// Notes `ev`: an insert's key; anything else, and inserts past
    /// [`WOKEN_KEYS`], as other.
    pub(super) fn saw(&mut self, ev: &ChangeEvent) {
        match (&ev.kind, &ev.key) {
            (ChangeKind::Insert, Some(k)) if self.inserted.len() < WOKEN_KEYS => self.inserted.push(k.clone()),
            _ => self.other = true,
        }
    }

    /// The same wake-up, with the usual claim to follow the keyed one.
    pub(super) fn then_claim_as_usual(self) -> Self {
        Woken { other: true, ..self }
    }
}

/// Reads of a candidate list per claim, at most.
const READS: u32 = 2;

impl<S: Store + Clone> Claimer<S> {
    /// The claimer of agent `name` on `queue`, its leases kept for `ttl`.
    pub(super) fn new(
        queue: Queue<S>,
        name: String,
        identity: Identity,
        ttl: Ttl,
        leases: Leases<S>,
        limits: Limits<S>,
        shutdown: CancellationToken,
    ) -> Self {
        Claimer {
            store: queue.store.clone(),
            gate: queue.shared.get::<ClaimGate>(),
            control: queue.shared.get::<ControlWatch>(),
            queue,
            name,
            identity,
            ttl,
            leases,
            seq: AtomicU64::new(1),
            paused: Mutex::new(None),
            limits,
            shutdown,
            tracer: crate::trace::ClaimTracer::default(),
        }
    }

    /// Its claim spans from `tracer` (the `otel` feature).
    pub(super) fn with_tracer(mut self, tracer: crate::trace::ClaimTracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// Gives a task's permit back once the task has ended
    /// ([`Limits::give_back`]); `stopping`: the agent stops, so no next claim
    /// will take it.
    pub(super) async fn give_back(&self, permit: Option<Permit<S>>, stopping: bool) {
        self.limits.give_back(&self.name, permit, stopping).await;
    }

    /// Releases the permits kept for a next claim that is not coming.
    pub(super) async fn release_pooled(&self) {
        self.limits.release_pooled(&self.name).await;
    }

    /// A view of what the queue's control task reads, which keeps it
    /// running while the agent idles (see [`crate::control`]).
    pub(super) fn control_view(&self) -> tokio::sync::watch::Receiver<ControlView> {
        self.control.view(&self.store, self.queue.control_collection())
    }

    /// The pause state this agent last saw, if it looked yet.
    pub(super) fn seen_paused(&self) -> Option<bool> {
        self.paused.lock().map(|(_, paused)| paused)
    }

    /// Claims up to `capacity` tasks: the tasks inserted while it was idle
    /// first, by key (`woken`: [`Woken`]); then ready tasks, by key from the
    /// agent name's list of candidates (`candidates.rs`); tasks whose claim
    /// lapsed (a crashed agent's) when no task is ready, and first on every
    /// sixteenth claim, so recovery never starves under load. One round trip
    /// for one task (and one `find` of keys per list); a batch
    /// ([`BATCH_FROM`] or more free slots) in two by key (three by query),
    /// each task's claim fenced and leased on its own.
    ///
    /// Within the agent name's cluster-wide limits: with a global
    /// concurrency, first `min(capacity, free permits)` permits in one batch
    /// (none: nothing is claimed; one only after a claim that found
    /// nothing), then at most as many tasks (permits left over go back at
    /// once). (A rate limit's start is taken by each task just before its
    /// handler runs: [`Limits::rate_start`].)
    ///
    /// The pause state is read once, when it is this agent's turn at the
    /// claim gate, right before the claim's commands (a claim whose commands
    /// are slow may still take tasks for as long as they take; the bound of
    /// a pause runs to the read).
    pub(super) async fn claim(&self, capacity: usize, woken: Option<Woken>) -> Result<Claims<S>, AgentError> {
        // Permits are taken before the turn at the gate, so that a slow
        // control collection of one limited name never holds up the other
        // names claiming through clones of the queue; and none is taken for
        // a name already known paused (what the agent last saw, no read).
        let permits = if self.limits.is_global() {
            if self.known_paused() {
                self.release_pooled().await;
                return Ok(Claims::none());
            }
            match self.limits.acquire(&self.name, capacity).await? {
                Some(p) if p.is_empty() => {
                    tracing::debug!(agent = %self.name, "no free permit of the global concurrency: not claiming");
                    return Ok(Claims::none());
                }
                p => p,
            }
        } else {
            None
        };
        // Agents sharing a `Queue` take turns, and share their name's list of
        // candidates (`candidates.rs`): they never race each other for a key.
        // A stop ends the wait for a turn (the permits go back).
        let mut lists = tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => {
                self.limits.release(&self.name, permits.unwrap_or_default()).await;
                return Ok(Claims::none());
            }
            lists = self.gate.0.lock() => lists,
        };
        // The pause state is read at this agent's turn, right before the
        // claim's commands: a turn or a permit waited for is no time for a
        // pause to go unseen in.
        let Pause { was, now } = self.paused().await?;
        let was_paused = was.unwrap_or(true);
        if now {
            drop(lists);
            self.limits.release(&self.name, permits.unwrap_or_default()).await;
            self.release_pooled().await;
            return Ok(Claims::none());
        }
        let list = lists.entry(self.name.clone()).or_insert_with(|| Candidates::new(self.seed()));
        let Some(mut permits) = permits else {
            return self.claim_unlimited(list, capacity, woken, was_paused).await;
        };
        // Dropped on an error: the permits are released in the background.
        // Its last claim may have found no permit, not no task: a keyed
        // claim of inserted tasks never stands for the usual one here.
        let woken = woken.map(Woken::then_claim_as_usual);
        let mut claimed = self.claim_unlimited(list, permits.len(), woken, was_paused).await?;
        drop(lists);
        self.limits.claimed(claimed.tasks.len());
        let spare = permits.split_off(claimed.tasks.len().min(permits.len()));
        self.limits.release(&self.name, spare).await;
        for (c, p) in claimed.tasks.iter_mut().zip(permits) {
            c.permit = Some(p);
        }
        Ok(claimed)
    }

    /// Whether the agent already knows its name paused, without a read: the
    /// control task's view, or its own last read, either younger than
    /// [`CONTROL_REFRESH`].
    fn known_paused(&self) -> bool {
        match self.control.peek() {
            Some((_, names)) => names.contains(&self.name),
            None => (*self.paused.lock()).is_some_and(|(at, paused)| paused && at.elapsed() < CONTROL_REFRESH),
        }
    }

    /// [`Claimer::claim`] once its turn, the pause state and the limits
    /// allowed it `capacity` tasks.
    async fn claim_unlimited(
        &self,
        list: &mut Candidates,
        capacity: usize,
        woken: Option<Woken>,
        was_paused: bool,
    ) -> Result<Claims<S>, AgentError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if let Some(Woken { inserted: keys, other }) = woken.filter(|w| !w.inserted.is_empty()) {
            // More keys than slots: the store picks among them in claim order.
            let take = if keys.len() > capacity { Take::for_query(capacity) } else { Take::for_keys(keys.len()) };
            let got = self.claim_from(&ready_tasks(&self.name).keys(keys), seq, take).await?;
            // Not after a pause: the claims while paused saw nothing.
            if !got.is_empty() || !(other || was_paused) {
                return Ok(Claims::got(got));
            }
        }
        let lapsed = lapsed_tasks(&self.name);
        if seq % 16 == 0 {
            let got = self.claim_from(&lapsed, seq, Take::for_query(capacity)).await?;
            if !got.is_empty() {
                return Ok(Claims::got(got));
            }
        }
        let ready = self.claim_ready(list, seq, capacity).await?;
        if !ready.tasks.is_empty() || seq % 16 == 0 {
            return Ok(ready);
        }
        let tasks = self.claim_from(&lapsed, seq, Take::for_query(capacity)).await?;
        Ok(Claims { outrun: ready.outrun && tasks.is_empty(), tasks, backlog: false })
    }

    /// Claims ready tasks by key from `list`, reading it again when it needs
    /// it (at most [`READS`] times per call: a claimer that keeps losing its
    /// candidates gives up, [`Claims::outrun`], and tries again after a backoff).
    async fn claim_ready(&self, list: &mut Candidates, seq: u64, capacity: usize) -> Result<Claims<S>, AgentError> {
        let ready = ready_tasks(&self.name);
        let mut reads = 0;
        loop {
            if list.needs_read() {
                if list.head_first() {
                    let tasks = self.claim_from(&ready, seq, Take::for_query(capacity)).await?;
                    let outrun = list.head_claimed(tasks.len());
                    return Ok(Claims { tasks, outrun, backlog: false });
                }
                if reads == READS {
                    return Ok(Claims { tasks: Vec::new(), outrun: true, backlog: false });
                }
                reads += 1;
                let window = Candidates::window(capacity);
                // A failed read leaves the list as it was: still to be read.
                let keys = self.store.find_keys(&self.queue.coll, &ready.clone().limit(window)).await?;
                list.refill(keys, window);
            }
            let keys = list.take(Take::for_query(capacity).count());
            if keys.is_empty() {
                return Ok(Claims::none());
            }
            let asked = keys.len();
            let got = self.claim_from(&ready.clone().keys(keys), seq, Take::for_keys(asked)).await?;
            list.claimed(asked, got.len());
            if !got.is_empty() {
                // A list read that filled its window: a backlog.
                return Ok(Claims { tasks: got, outrun: false, backlog: !list.head_first() });
            }
        }
    }

    /// The seed of this agent's random places in its candidate lists: its
    /// identity and name, so a run is reproducible and agents differ.
    fn seed(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.identity.to_string(), &self.name).hash(&mut h);
        h.finish()
    }

    /// Whether this agent's name is paused on its queue ([`Queue::set_paused`]):
    /// what the queue's control task last read while its subscription is live
    /// (an agent of the queue is idle; no read here) and that read is younger
    /// than [`CONTROL_REFRESH`]; else the agent's own read of its
    /// control document, at most [`CONTROL_REFRESH`] old. With it, what the
    /// agent had seen before: both from one look at its cache, so a claim
    /// acts on one view of the pause.
    async fn paused(&self) -> Result<Pause, AgentError> {
        let cached = *self.paused.lock();
        let was = cached.map(|(_, paused)| paused);
        let view = self.control.peek();
        // Stamped with when the read behind the answer was sent, not when
        // it was looked at: an answer is trusted for `CONTROL_REFRESH` from
        // the read, so that the bound holds from the pause's write.
        let (read_at, paused) = match view {
            Some((at, names)) => (at, names.contains(&self.name)),
            None => match cached {
                Some((at, paused)) if at.elapsed() < CONTROL_REFRESH => return Ok(Pause { was, now: paused }),
                _ => {
                    let sent = Instant::now();
                    let paused = self.queue.is_paused(&self.name).await?;
                    if paused {
                        // So that the resume reaches this agent while it idles.
                        self.control.needed();
                    }
                    (sent, paused)
                }
            },
        };
        if cached.map_or(paused, |(_, was)| was != paused) {
            tracing::info!(agent = %self.name, paused, "agent pause state seen");
        }
        *self.paused.lock() = Some((read_at, paused));
        Ok(Pause { was, now: paused })
    }

    async fn claim_from(&self, query: &Query, seq: u64, take: Take) -> Result<Vec<Claimed<S>>, AgentError> {
        // One owner per call: a batch's tasks share it, each with its own fence.
        let owner = format!("{}/{}/{}", self.identity, self.name, seq);
        let claim = Claim {
            query: query.clone(),
            mutation: Mutation::new()
                .grant(owner, self.ttl)
                .bump_fence()
                .set(fields::READY, false)
                .set(fields::CLAIMED, true)
                .set(fields::AGENT_HOST, self.identity.host())
                .set_now(fields::STARTED_AT)
                // A running task is never collected, whatever marked it before.
                .clear_gc(),
        };
        let sent = Instant::now();
        let records = match take {
            Take::Batch(n) => self.store.claim_many(&self.queue.coll, &claim, n).await?,
            Take::One => self.store.claim(&self.queue.coll, &claim).await?.into_iter().collect(),
        };
        crate::metrics::claimed(&self.queue.coll, &self.name, sent.elapsed());
        let trace = self.tracer.claimed(self.queue.coll.as_str(), &self.name, records.len(), sent);
        let mut claimed = Vec::with_capacity(records.len());
        for record in records {
            // Kept like a lock's acquisition, by the agent's one `Leases`.
            let guard = self.leases.keep(&record, sent)?;
            tracing::debug!(agent = %self.name, task = %record.key(), fence = record.fence(), "task claimed");
            claimed.push(Claimed { guard, record, permit: None, trace: trace.clone() });
        }
        if !claimed.is_empty() {
            self.control.needed();
        }
        Ok(claimed)
    }
}
