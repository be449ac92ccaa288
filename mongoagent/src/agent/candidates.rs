//! Candidates: the keys of ready tasks a claimer claims from. One `find` of
//! keys ([`Store::find_keys`](store_trait::Store::find_keys)) reads a window
//! of them in claim order; each claim then names the keys it wants
//! ([`Query::keys`](store_trait::Query::keys)) with the whole claim filter, so
//! a candidate another claimer took in between is passed over, never taken
//! twice.
//!
//! Under light load (no list read yet, or the last read came back shorter
//! than its window) a claim takes the head by query instead, in one round
//! trip, and a claim that got tasks that way is followed by a list read.
//!
//! Why: claimers on separate [`Queue`](crate::Queue)s (separate processes,
//! or agents built with `Agent::builder`) that each claim "the first ready
//! task" all write the same document, and the server resolves their write
//! conflicts by retrying them. Measured on SecantusDB (N=400, a claim and a
//! completion per task, four claimers): 12 tasks/s racing for the head of the
//! queue, 56 claiming by key from lists (one claimer: 39 and 112, since a
//! write found by `_id` is lighter than one found by filter and sort).
//!
//! Order: a claimer takes its list in claim order until it loses a candidate
//! (another claimer took it, or it was cancelled or rescheduled since the
//! read); from then on it takes candidates from random places in its lists,
//! until a list read after a list without a loss, so racing claimers spread
//! over the window instead of meeting at its head. So a claimer that loses
//! no candidate claims exactly in claim order; one that does, within its
//! window, for about a list's life. A list is read again when spent, after
//! [`MAX_AGE`], or after [`MISSES`] claims in a row that got none of their
//! keys, so a task enqueued ahead of it waits at most that long.

use std::collections::VecDeque;
use std::time::Duration;

use store_trait::Key;
use tokio::time::Instant;

/// The oldest a list of candidates is claimed from: how long a task enqueued
/// ahead of the list (a higher priority, an earlier due time) may wait behind
/// it. (Measured on SecantusDB, four racing agents: 500 ms cost 0.4 list
/// reads per task, a second 0.2, and 20 to 60 % more tasks per second.)
const MAX_AGE: Duration = Duration::from_millis(1000);

/// Claims in a row that got none of their keys, after which the list is
/// read again: others are taking it faster than this claimer.
const MISSES: u32 = 2;

/// Candidates read per free slot of the claimer (at least [`MIN_WINDOW`],
/// at most [`MAX_WINDOW`]): room for racing claimers to spread.
const PER_SLOT: usize = 8;
const MIN_WINDOW: usize = 64;
const MAX_WINDOW: usize = 1000;

/// One agent name's list of candidates on one queue (kept by the queue's
/// claim gate, so agents sharing a `Queue` share the list and never race
/// each other for its keys).
#[derive(Debug)]
pub(crate) struct Candidates {
    keys: VecDeque<Key>,
    read_at: Option<Instant>,
    /// Take from a random place (a loss in this list or the last one).
    spread: bool,
    /// A loss since the last read.
    lost: bool,
    misses_in_a_row: u32,
    /// Claim the head by query instead of reading a list: no list was read
    /// yet, or the last read came back short of its window (fewer ready tasks
    /// than a window: light load, where claimers do not race for the head, and
    /// an idle agent's pickup costs one round trip, not two).
    head_first: bool,
    rng: fastrand::Rng,
}

impl Candidates {
    /// An empty list; `seed` makes its random places reproducible.
    pub(crate) fn new(seed: u64) -> Self {
        Candidates {
            keys: VecDeque::new(),
            read_at: None,
            spread: false,
            lost: false,
            misses_in_a_row: 0,
            head_first: true,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// How many candidates a claimer with `capacity` free slots reads.
    pub(crate) fn window(capacity: usize) -> u32 {
        let w = capacity.saturating_mul(PER_SLOT).clamp(MIN_WINDOW, MAX_WINDOW);
        u32::try_from(w).unwrap_or(u32::MAX)
    }

    /// Whether the list must be read before the next claim: spent, older than
    /// [`MAX_AGE`], or lost [`MISSES`] times in a row.
    pub(crate) fn needs_read(&self) -> bool {
        self.keys.is_empty() || self.misses_in_a_row >= MISSES || self.read_at.is_none_or(|at| at.elapsed() >= MAX_AGE)
    }

    /// Whether the next read should be a claim of the head by query instead.
    pub(crate) fn head_first(&self) -> bool {
        self.head_first
    }

    /// Records a claim of the head by query that got `got` tasks: one that
    /// got some is followed by a list read (the load may be rising); one that
    /// got none leaves the queue as light as it was.
    pub(crate) fn head_claimed(&mut self, got: usize) {
        if got > 0 {
            self.head_first = false;
        }
    }

    /// Replaces the list with `keys`, read in claim order just now with a
    /// window of `window`.
    pub(crate) fn refill(&mut self, keys: Vec<Key>, window: u32) {
        self.head_first = u32::try_from(keys.len()).is_ok_and(|n| n < window);
        self.spread = self.lost;
        self.lost = false;
        self.misses_in_a_row = 0;
        self.keys = keys.into();
        self.read_at = Some(Instant::now());
    }

    /// Takes up to `n` candidates off the list: from its front, or after a
    /// loss from a random place (consecutive keys from there, wrapping).
    pub(crate) fn take(&mut self, n: usize) -> Vec<Key> {
        let n = n.min(self.keys.len());
        if self.spread && self.keys.len() > n {
            let start = self.rng.usize(..self.keys.len());
            self.keys.rotate_left(start);
        }
        self.keys.drain(..n).collect()
    }

    /// Records a claim of `asked` candidates that got `got`: a shortfall is a
    /// loss to another claimer.
    pub(crate) fn claimed(&mut self, asked: usize, got: usize) {
        if got < asked {
            self.lost = true;
            self.spread = true;
        }
        if got == 0 && asked > 0 {
            self.misses_in_a_row = self.misses_in_a_row.saturating_add(1);
        } else if got > 0 {
            self.misses_in_a_row = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<Key> {
        (0..n).map(|i| Key::new(format!("k{i}")).unwrap()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn in_order_until_a_loss_then_spread_until_a_clean_list() {
        let mut c = Candidates::new(7);
        assert!(c.needs_read());
        c.refill(keys(40), 64);
        assert!(!c.needs_read());
        assert_eq!(c.take(2), keys(2));
        c.claimed(2, 2);
        assert_eq!(c.take(1), vec![Key::new("k2").unwrap()]);
        c.claimed(1, 0);
        // Lost one: the next takes come from random places.
        let spread: Vec<Key> = (0..5).flat_map(|_| c.take(1)).collect();
        assert_ne!(spread, keys(8)[3..].to_vec(), "still taken in order after a loss");
        // The next list is still spread (this one had a loss); one after a
        // clean list is in order again.
        c.refill(keys(40), 64);
        let _ = c.take(1);
        c.claimed(1, 1);
        c.refill(keys(40), 64);
        assert_eq!(c.take(3), keys(3));
    }

    #[test]
    fn the_head_first_under_light_load() {
        let mut c = Candidates::new(3);
        assert!(c.head_first(), "no list read yet");
        c.head_claimed(0);
        assert!(c.head_first(), "nothing ready: still light");
        c.head_claimed(1);
        assert!(!c.head_first(), "a task taken: read a list next");
        c.refill(keys(64), 64);
        assert!(!c.head_first(), "a full window: lists");
        c.refill(keys(10), 64);
        assert!(c.head_first(), "a short window: the head again");
    }

    #[tokio::test(start_paused = true)]
    async fn read_again_when_old_spent_or_missing() {
        let mut c = Candidates::new(1);
        c.refill(keys(3), 64);
        tokio::time::advance(MAX_AGE).await;
        assert!(c.needs_read(), "an old list");
        c.refill(keys(3), 64);
        for _ in 0..MISSES {
            assert!(!c.needs_read());
            let _ = c.take(1);
            c.claimed(1, 0);
        }
        assert!(c.needs_read(), "misses in a row");
        c.refill(keys(1), 64);
        let _ = c.take(5);
        assert!(c.needs_read(), "a spent list");
        assert_eq!(Candidates::window(1), MIN_WINDOW as u32);
        assert_eq!(Candidates::window(usize::MAX), MAX_WINDOW as u32);
    }
}
