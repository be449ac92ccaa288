//! The agent's side of groups ([`crate::group`]), for an agent with a cap
//! ([`AgentBuilder::group_concurrency`](crate::AgentBuilder::group_concurrency)):
//! a task of a group it ends lets the group's next task through
//! ([`GroupCap::after_grouped`]), and a loop beside the work loop
//! ([`GroupCap::let_through_until`]) lets through what producers nudge, and
//! sweeps the name's active slots at its start, every
//! [`SWEEP`](crate::group::SWEEP), and whenever notifications may have been
//! missed.

use std::sync::Arc;
use std::time::Duration;

use bson::Bson;
use store_trait::helpers::Watcher;
use store_trait::{ChangeFilter, ChangeKind, Store, UpdateClause};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::processed::Processed;
use crate::group::{slot_fields, Groups, RunEnded, SWEEP};
use crate::schema::fields;

/// An agent's groups: the queue's slots and, with a cap, the cap; what the
/// agent does with them is here, on this type.
pub(super) struct GroupCap<S> {
    /// The agent name.
    name: String,
    /// The agent's poll interval: the sweep's pace without notifications.
    poll_interval: Duration,
    groups: Groups<S>,
    /// `None` for an agent without a cap: it lets nothing through, and
    /// nudges the capped agents when it ends a grouped task.
    pub(super) cap: Option<usize>,
    /// When `Agent::process` last swept (at most once per poll interval).
    swept: parking_lot::Mutex<Option<Instant>>,
    /// Whether `Agent::process`'s last claim found a task.
    busy: std::sync::atomic::AtomicBool,
}

impl<S> GroupCap<S> {
    /// The groups of agent `name`, which polls every `poll_interval`.
    pub(super) fn new(name: String, poll_interval: Duration, groups: Groups<S>, cap: Option<usize>) -> Self {
        let (swept, busy) = (parking_lot::Mutex::new(None), std::sync::atomic::AtomicBool::new(false));
        GroupCap { name, poll_interval, groups, cap, swept, busy }
    }
}

impl<S: Store + Clone> GroupCap<S> {
    /// After a run of a task of group `group` ended: when the task ended
    /// too, its turn frees, and the group's next task is let through at
    /// once (by an agent without a cap: the capped agents are nudged). A
    /// failure is logged: the sweep lets the task through later.
    /// `group`: the task's group and number in it; `fence`: the fence of
    /// the run's claim.
    pub(super) async fn after_grouped(&self, group: Option<(String, Option<i64>)>, fence: u64, processed: &Processed) {
        let Some((group, seq)) = group else { return };
        // The run ended (the task may have, or wait for follow-ups, or have
        // been cancelled under it: the settle reads it).
        let ran = match processed {
            Processed::Completed(k) | Processed::Failed(k) | Processed::Recovered(k) | Processed::Stale(k) => k,
            _ => return,
        };
        let done = match self.cap {
            Some(cap) => {
                let ended = RunEnded { task: ran, fence, seq };
                self.groups.let_through(&self.name, &group, cap, Some(ended)).await
            }
            None => self.groups.nudge(&self.name, &group).await,
        };
        if let Err(e) = done {
            tracing::warn!(agent = %self.name, group, error = %e, "letting the group's next task through failed; the sweep will");
        }
    }

    /// The loop that lets grouped tasks through, until `stop`: woken by
    /// producers' nudges on the slots of this agent's name, and sweeping
    /// them every [`SWEEP`] (every poll interval without notifications, and
    /// at once after a gap in them).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: each step is ([`Groups::let_through`]).
    pub(super) async fn let_through_until(self: Arc<Self>, stop: CancellationToken) {
        let GroupCap { groups, cap: Some(cap), name, .. } = &*self else { return };
        let cap = *cap;
        if let Err(e) = groups.ensure_indexes().await {
            tracing::warn!(agent = %name, error = %e, "creating the group slots' indexes failed");
        }
        let filter = ChangeFilter::new().inserts().update(UpdateClause::touches(slot_fields::ENQUEUED));
        let mut nudges =
            Watcher::open_filtered(groups.store().clone(), groups.slots().clone(), filter, self.poll_interval).await;
        let mut sweep_at = Instant::now();
        // The first sweep reads every active slot: nudges may have come before.
        let mut all = true;
        loop {
            if Instant::now() >= sweep_at {
                // Without notifications no nudge comes: every active slot.
                let every_slot = std::mem::take(&mut all) || !nudges.is_live();
                match groups.sweep(name, cap, every_slot).await {
                    Ok(n) => tracing::debug!(agent = %name, slots = n, "group slots swept"),
                    Err(e) => {
                        tracing::warn!(agent = %name, error = %e, "sweeping the group slots failed; trying again")
                    }
                }
                let every = if nudges.is_live() { SWEEP } else { self.poll_interval };
                sweep_at = Instant::now() + every;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(sweep_at) => {}
                ev = nudges.changed() => match (&ev.kind, &ev.key) {
                    // Nudges may have been missed: every active slot.
                    (ChangeKind::Resync, _) => (sweep_at, all) = (Instant::now(), true),
                    (_, Some(key)) => {
                        if let Some(group) = Groups::<S>::group_of(name, key) {
                            if let Err(e) = groups.let_through(name, group, cap, None).await {
                                tracing::warn!(agent = %name, group, error = %e, "letting a group's task through failed; the sweep will");
                            }
                        }
                    }
                    _ => {}
                },
            }
        }
    }

    /// For `Agent::process`, which has no loop beside it: sweeps the
    /// group slots when the last sweep is a poll interval old (or there
    /// was none), busy or not, or a loop that always finds work would
    /// never let a held task through. Every active slot when its last
    /// claim found nothing (no nudge reaches it); those not settled for
    /// [`SWEEP`](crate::group::SWEEP) when it found a task, so that a busy
    /// loop does not read every group per claim. Returns whether it swept.
    pub(super) async fn sweep_if_due(&self) -> bool {
        let Some(cap) = self.cap else { return false };
        {
            let mut swept = self.swept.lock();
            if swept.is_some_and(|t| t.elapsed() < self.poll_interval) {
                return false;
            }
            *swept = Some(Instant::now());
        }
        let all = !self.busy.load(std::sync::atomic::Ordering::Relaxed);
        match self.groups.sweep(&self.name, cap, all).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(agent = %self.name, error = %e, "sweeping the group slots failed");
                false
            }
        }
    }

    /// For `Agent::process`: whether its last claim found a task (its next
    /// sweep's extent).
    pub(super) fn claimed_for_process(&self, found: bool) {
        self.busy.store(found, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The group of a claimed task's document, if it has one, and its number
/// in it.
pub(super) fn group_of(data: &bson::Document) -> Option<(String, Option<i64>)> {
    match data.get(fields::GROUP_KEY) {
        Some(Bson::String(g)) => Some((g.clone(), data.get_i64(fields::GROUP_SEQ).ok())),
        _ => None,
    }
}
