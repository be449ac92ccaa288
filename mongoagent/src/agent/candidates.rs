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
//! conflicts by retrying them; and a write found by `_id` is lighter than one
//! found by filter and sort (the measurements: docs/performance.md,
//! "Constants and what chose them").
//!
//! Order: a claimer takes its list in claim order until it loses a candidate
//! (another claimer took it, or it was cancelled or rescheduled since the
//! read); then it moves to a random place in its list and walks on from
//! there, and so after every loss (a list read after a list with a loss
//! starts at a random place too), so racing claimers walk apart over the
//! window instead of meeting at its head or at each other's keys. So a
//! claimer that loses no candidate claims exactly in claim order; one that
//! does, within its window, for about a list's life. A list is read again when spent, after
//! [`MAX_AGE`], or after [`MISSES`] claims in a row that got none of their
//! keys, so a task enqueued ahead of it waits at most that long.

use std::collections::VecDeque;
use std::time::Duration;

use store_trait::Key;
use tokio::time::Instant;

/// The oldest a list of candidates is claimed from: how long a task enqueued
/// ahead of the list (a higher priority, an earlier due time) may wait behind
/// it. Shorter lists cost more list reads per task (docs/performance.md,
/// "Constants and what chose them").
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
    /// Move to a random place before the next take (a loss just now, or in
    /// the last list).
    jump: bool,
    /// A loss since the last read.
    lost: bool,
    misses_in_a_row: u32,
    /// Claim the head by query instead of reading a list: no list was read
    /// yet, or the last read came back short of its window (fewer ready tasks
    /// than a window: light load, where claimers do not race for the head, and
    /// an idle agent's pickup costs one round trip, not two).
    head_first: bool,
    /// How many candidates the last read found (0 once a claim of the head
    /// found none after it).
    seen: usize,
    rng: fastrand::Rng,
}

impl Candidates {
    /// An empty list; `seed` makes its random places reproducible.
    pub(crate) fn new(seed: u64) -> Self {
        Candidates {
            keys: VecDeque::new(),
            read_at: None,
            jump: false,
            lost: false,
            misses_in_a_row: 0,
            head_first: true,
            seen: 0,
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
    /// got none leaves the queue as light as it was. True for the first that
    /// got none after a list read that found some: tasks may remain (another
    /// claimer's write won, or the server gave up on a write conflict, as
    /// SecantusDB does), so the claimer tries again soon instead of idling
    /// (`Claims::outrun`): the idle watch passes over other claimers' claims.
    pub(crate) fn head_claimed(&mut self, got: usize) -> bool {
        if got > 0 {
            self.head_first = false;
            return false;
        }
        std::mem::take(&mut self.seen) > 0
    }

    /// Replaces the list with `keys`, read in claim order just now with a
    /// window of `window`.
    pub(crate) fn refill(&mut self, keys: Vec<Key>, window: u32) {
        self.head_first = u32::try_from(keys.len()).is_ok_and(|n| n < window);
        self.seen = keys.len();
        self.jump = self.lost;
        self.lost = false;
        self.misses_in_a_row = 0;
        self.keys = keys.into();
        self.read_at = Some(Instant::now());
    }

    /// Takes up to `n` candidates off the list: consecutive keys from where
    /// the last take ended (at first the front), or after a loss from a
    /// random place (wrapping).
    pub(crate) fn take(&mut self, n: usize) -> Vec<Key> {
        let n = n.min(self.keys.len());
        if std::mem::take(&mut self.jump) && self.keys.len() > n {
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
            self.jump = true;
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
    async fn in_order_until_a_loss_then_a_walk_from_a_random_place() {
        let mut c = Candidates::new(7);
        assert!(c.needs_read());
        c.refill(keys(40), 64);
        assert!(!c.needs_read());
        assert_eq!(c.take(2), keys(2));
        c.claimed(2, 2);
        assert_eq!(c.take(1), vec![Key::new("k2").unwrap()]);
        c.claimed(1, 0);
        // Lost one: the next take comes from a random place, and the takes
        // after it walk on from there (wrapping), until the next loss.
        let jumped = c.take(1);
        let at: usize = jumped[0].to_string()[1..].parse().unwrap();
        let mut walk = Vec::new();
        for _ in 0..4 {
            walk.extend(c.take(1));
            c.claimed(1, 1);
        }
        let expected: Vec<Key> =
            (1..5).map(|i| 3 + (at - 3 + i) % 37).map(|i| Key::new(format!("k{i}")).unwrap()).collect();
        assert_eq!(walk, expected, "a walk from k{at}");
        // Several seeds: the jump lands anywhere, not at the next key.
        let places: std::collections::HashSet<String> = (0..8)
            .map(|seed| {
                let mut c = Candidates::new(seed);
                c.refill(keys(40), 64);
                let _ = c.take(1);
                c.claimed(1, 0);
                c.take(1)[0].to_string()
            })
            .collect();
        assert!(places.len() > 2, "jumps to {places:?}");
        // The next list starts at a random place too (this one had a loss);
        // one after a clean list starts at its front.
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
        assert!(!c.head_claimed(0), "nothing read, nothing found: idle");
        assert!(c.head_first(), "nothing ready: still light");
        assert!(!c.head_claimed(1));
        assert!(!c.head_first(), "a task taken: read a list next");
        c.refill(keys(64), 64);
        assert!(!c.head_first(), "a full window: lists");
        c.refill(keys(10), 64);
        assert!(c.head_first(), "a short window: the head again");
        assert!(c.head_claimed(0), "none, after a read found ten: try again soon");
        assert!(!c.head_claimed(0), "none again: idle");
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
