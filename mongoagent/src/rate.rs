//! The cluster-wide rate limit of an agent name: at most `n` task starts in
//! any window of `per`, across every process, on the store's clock.
//!
//! One control document per agent name and limit in the queue's control
//! collection (`<queue>_control`, `_id` `rate:<agent>:<n>/<per ms>`) holds a
//! ring of `n` slots (a sliding-window log): slot `i` holds the store time at
//! which the start that last took it leaves the window, and `next` counts the
//! starts so far. Start number `k` takes slot `k mod n`, whose previous start
//! was number `k - n`, the oldest of the last `n`: it may go only once that
//! one has left the window. So a start is ONE conditional write: "`next` is
//! still `k` and slot `k mod n` is due" (`Condition::FieldEq`,
//! `Condition::DueBy`, judged on the store clock), which increments `next`
//! and sets the slot to store-now plus `per` (`Mutation::set_time_after`).
//! A rejected write returns the document: `next` moved on (another start
//! came first: try again at once with the new `k`), or the slot's time, which
//! is how long to wait. A burst beyond the limit waits; it never fails.

use std::time::Duration;

use bson::Bson;
use mongolock::unstable::Backoff;
use mongolock::ConfigError;
use store_trait::{Collection, Condition, Key, Mutation, Record, Store, StoreTime, Write, WriteOutcome};
use tokio_util::sync::CancellationToken;

use crate::error::AgentError;

/// The count of starts so far.
const NEXT: &str = "next";

/// At most `n` task starts per `per`, for every process of an agent name
/// ([`AgentBuilder::rate_limit`](crate::AgentBuilder::rate_limit)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    n: u32,
    per: Duration,
}

/// The largest `n` of a rate limit: every start slot is a field of one
/// control document, which must stay small.
pub const MAX_RATE_STARTS: u32 = 10_000;

impl RateLimit {
    /// At most `n` starts in any window of `per`. `n` between 1 and
    /// [`MAX_RATE_STARTS`]; `per` at least a millisecond and at most a year.
    pub fn new(n: u32, per: Duration) -> Result<RateLimit, AgentError> {
        if n == 0 || n > MAX_RATE_STARTS {
            return Err(AgentError::Config(
                format!("a rate limit allows 1 to {MAX_RATE_STARTS} starts, not {n}").into(),
            ));
        }
        if per < Duration::from_millis(1) || per > Duration::from_secs(366 * 24 * 3600) {
            return Err(AgentError::Config(
                format!("a rate limit's interval must be 1 ms to a year, not {per:?}").into(),
            ));
        }
        Ok(RateLimit { n, per })
    }

    /// The starts allowed per interval.
    pub fn starts(&self) -> u32 {
        self.n
    }

    /// The interval.
    pub fn per(&self) -> Duration {
        self.per
    }

    fn per_ms(&self) -> i64 {
        // At most a year in milliseconds: checked by `new`.
        i64::try_from(self.per.as_millis()).unwrap_or(i64::MAX)
    }
}

/// The starts of one agent name under a [`RateLimit`]: the control document
/// and the last `next` seen.
#[derive(Debug)]
pub(crate) struct RateGate<S> {
    store: S,
    coll: Collection,
    key: Key,
    limit: RateLimit,
    /// `next` as last seen: a start by this process is usually the next one.
    seen: parking_lot::Mutex<i64>,
}

impl<S: Store + Clone> RateGate<S> {
    pub(crate) fn new(store: S, coll: Collection, agent: &str, limit: RateLimit) -> Result<Self, AgentError> {
        let key = Key::new(format!("rate:{agent}:{}/{}", limit.n, limit.per_ms()))
            .map_err(|e| AgentError::Config(ConfigError::caused_by(e)))?;
        Ok(RateGate { store, coll, key, limit, seen: parking_lot::Mutex::new(0) })
    }

    /// Waits until a start is allowed and takes it: one conditional write when
    /// the limit is not reached (and this process saw the last start); a write
    /// per start another process made in between; when the limit is reached,
    /// a wait until the oldest start in the window leaves it (read from the
    /// rejected write's document, measured from the store's clock), then the
    /// write again. Store errors are retried with the crate's [`Backoff`]
    /// while `stop` is not cancelled. `Ok(false)` when stopped before a start.
    pub(crate) async fn start(&self, stop: &CancellationToken) -> Result<bool, AgentError> {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        let mut failures = 0_u32;
        loop {
            if stop.is_cancelled() {
                return Ok(false);
            }
            let k = *self.seen.lock();
            let wait = match self.try_start(k).await {
                Ok(None) => return Ok(true),
                Ok(Some(wait)) => {
                    failures = 0;
                    backoff.reset();
                    wait
                }
                Err(e) if e.is_retryable() && failures < 8 => {
                    failures += 1;
                    backoff.next_delay()
                }
                Err(e) => return Err(e.into()),
            };
            if wait.is_zero() {
                continue;
            }
            tracing::debug!(key = %self.key, ?wait, "rate limit reached: waiting");
            tokio::select! {
                _ = stop.cancelled() => return Ok(false),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One conditional write for start number `k`: `None` when taken, else
    /// how long to wait before trying again (zero: another start came first).
    async fn try_start(&self, k: i64) -> Result<Option<Duration>, store_trait::StoreError> {
        let slot = self.slot(k);
        let count = if k == 0 {
            Condition::Exists(NEXT.into()).negate()
        } else {
            Condition::FieldEq(NEXT.into(), Bson::Int64(k))
        };
        let write = Write::new(
            count.and(Condition::DueBy(slot.clone())),
            Mutation::new().inc(NEXT, 1).set_time_after(slot, self.limit.per),
        );
        // Only the first start creates the document (a later count on an
        // absent document is rejected with nothing: the count is 0 again).
        let write = if k == 0 { write.upsert() } else { write };
        match self.store.write(&self.coll, &self.key, &write).await? {
            WriteOutcome::Applied(_) => {
                *self.seen.lock() = k.saturating_add(1);
                Ok(None)
            }
            WriteOutcome::Rejected(current) => {
                let now_next = current.as_ref().and_then(|r| r.get_i64(NEXT)).unwrap_or(0);
                *self.seen.lock() = now_next;
                if now_next != k {
                    return Ok(Some(Duration::ZERO));
                }
                // The window is full: wait until its oldest start leaves it.
                let Some(free_at) = current.as_ref().and_then(|r| self.slot_time(r, k)) else {
                    return Ok(Some(Duration::ZERO));
                };
                let now = self.store.now().await?;
                Ok(Some(now.until(free_at) + Duration::from_millis(1)))
            }
        }
    }

    fn slot(&self, k: i64) -> String {
        format!("s{}", k.rem_euclid(i64::from(self.limit.n)))
    }

    fn slot_time(&self, r: &Record, k: i64) -> Option<StoreTime> {
        r.get_time(&self.slot(k))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use store_memory::MemoryStore;
    use store_trait::{Collection, Store};
    use tokio_util::sync::CancellationToken;

    use super::{RateGate, RateLimit};

    #[tokio::test(start_paused = true)]
    async fn a_full_window_waits_for_its_oldest_start() {
        let store = MemoryStore::new();
        let coll = Collection::new("q_control").unwrap();
        let gate =
            RateGate::new(store.clone(), coll, "a", RateLimit::new(2, Duration::from_secs(60)).unwrap()).unwrap();
        let stop = CancellationToken::new();
        let t0 = store.now().await.unwrap();
        assert!(gate.start(&stop).await.unwrap());
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(gate.start(&stop).await.unwrap());
        assert_eq!(t0.until(store.now().await.unwrap()), Duration::from_secs(10));
        assert!(gate.start(&stop).await.unwrap());
        let waited = t0.until(store.now().await.unwrap());
        assert!(waited >= Duration::from_secs(60) && waited < Duration::from_secs(61), "{waited:?}");
        assert!(gate.start(&stop).await.unwrap());
        let waited = t0.until(store.now().await.unwrap());
        assert!(waited >= Duration::from_secs(70) && waited < Duration::from_secs(71), "{waited:?}");
    }
}
