//! Exponential backoff: the one retry pacing of the toolkit (lock waiters and
//! keepers, elector rounds and campaigns, agents and schedulers).

use std::time::Duration;

/// Pauses between retries that double up to a maximum, and start over after a
/// success.
///
/// ```
/// use mongolock::unstable::Backoff;
/// use std::time::Duration;
///
/// let ms = Duration::from_millis;
/// let mut b = Backoff::new(ms(50), ms(300));
/// let pauses: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
/// assert_eq!(pauses, [ms(50), ms(100), ms(200), ms(300), ms(300)]);
/// b.reset();
/// assert_eq!(b.next_delay(), ms(50));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `max` (at least `first`).
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max: max.max(first), next: first }
    }

    /// The pause before the next retry; the one after it doubles.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        d
    }

    /// The pause [`Backoff::next_delay`] returns next, without moving on.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// After a success: the next pause is the first again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}
