//! Store time, lease lengths, and the one clock abstraction.

use std::fmt;
use std::time::Duration;

use crate::StoreError;

/// A point in time on the **store's** clock, in milliseconds since the Unix epoch.
///
/// Leases are always granted and checked on this clock (the server's `$$NOW` for
/// MongoDB), never on a client's wall clock, so a client whose clock is off by an
/// hour behaves exactly like the rest.
///
/// ```
/// use store_trait::{StoreTime, Ttl};
/// use std::time::Duration;
///
/// let t = StoreTime::from_millis(1_000);
/// let ttl = Ttl::new(Duration::from_millis(500)).unwrap();
/// assert_eq!(t.plus(ttl).as_millis(), 1_500);
/// assert_eq!(t.until(t.plus(ttl)), Duration::from_millis(500));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StoreTime(i64);

impl StoreTime {
    /// A store time from epoch milliseconds.
    pub const fn from_millis(ms: i64) -> Self {
        StoreTime(ms)
    }

    /// Epoch milliseconds.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This time plus a lease length.
    #[must_use]
    pub fn plus(self, ttl: Ttl) -> StoreTime {
        StoreTime(self.0.saturating_add(ttl.as_millis()))
    }

    /// How long from `self` until `later`; zero when `later` is not after `self`.
    pub fn until(self, later: StoreTime) -> Duration {
        let ms = later.0.saturating_sub(self.0);
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }

    /// The same instant as a BSON date.
    pub fn to_bson_datetime(self) -> bson::DateTime {
        bson::DateTime::from_millis(self.0)
    }
}

impl fmt::Display for StoreTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_bson_datetime(), f)
    }
}

/// A validated lease length: at least one millisecond and at most [`Ttl::MAX`].
///
/// Zero, negative, NaN and absurdly large values are rejected with
/// [`StoreError::InvalidInput`], so a typo can never create a lock that is free
/// at once or held for a century.
///
/// ```
/// use store_trait::Ttl;
/// use std::time::Duration;
///
/// assert!(Ttl::new(Duration::from_secs(15)).is_ok());
/// assert!(Ttl::new(Duration::ZERO).is_err());
/// assert!(Ttl::from_secs_f64(-1.0).is_err());
/// assert!(Ttl::from_secs_f64(f64::NAN).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// The longest lease accepted: 366 days.
    pub const MAX: Duration = Duration::from_secs(366 * 24 * 3600);

    /// Validates a lease length.
    pub fn new(d: Duration) -> Result<Ttl, StoreError> {
        if d < Duration::from_millis(1) {
            return Err(StoreError::invalid("ttl", format!("{d:?} is shorter than 1 ms")));
        }
        if d > Self::MAX {
            return Err(StoreError::invalid("ttl", format!("{d:?} is longer than the maximum of 366 days")));
        }
        Ok(Ttl(d))
    }

    /// Validates a lease length given in (possibly fractional) seconds, as the
    /// Python originals take it.
    pub fn from_secs_f64(secs: f64) -> Result<Ttl, StoreError> {
        if !secs.is_finite() || secs <= 0.0 {
            return Err(StoreError::invalid("ttl", format!("{secs} s is not a positive number of seconds")));
        }
        if secs > Self::MAX.as_secs_f64() {
            return Err(StoreError::invalid("ttl", format!("{secs} s is longer than the maximum of 366 days")));
        }
        let d = Duration::try_from_secs_f64(secs).map_err(|e| StoreError::invalid("ttl", format!("{secs} s: {e}")))?;
        Ttl::new(d)
    }

    /// Whole milliseconds (at least 1).
    pub fn as_millis(self) -> i64 {
        i64::try_from(self.0.as_millis()).unwrap_or(i64::MAX).max(1)
    }

    /// The length as a `Duration`.
    pub fn as_duration(self) -> Duration {
        self.0
    }
}

impl TryFrom<Duration> for Ttl {
    type Error = StoreError;
    fn try_from(d: Duration) -> Result<Ttl, StoreError> {
        Ttl::new(d)
    }
}

/// The one clock abstraction.
///
/// Product crates never read `SystemTime` directly, and leases never depend on a
/// client's wall clock: all waiting is done on `tokio::time`, whose monotonic
/// instants a paused test runtime controls. A client's wall clock is read for
/// diagnostics (the measured offset to the store clock) and for one safety check:
/// when it advances well beyond its [`Clock::monotonic`] companion, time passed
/// that the monotonic clock did not see (a host suspend), and a lease holder gives
/// up. A backend whose store clock is local (the in-memory store) takes a `Clock`
/// too.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current wall-clock time as this clock sees it.
    fn now(&self) -> StoreTime;

    /// A reading of the monotonic clock this wall clock is compared with to find
    /// time that passed unseen. The monotonic clock stops while the host is
    /// suspended (Linux `CLOCK_MONOTONIC`, which tokio's `Instant` follows); the
    /// wall clock does not. Only differences of two readings of the same clock
    /// mean anything.
    ///
    /// The default is tokio's clock, right for clocks that follow it (such as
    /// [`TokioClock`] and `store_test::TestClock`, a test's).
    fn monotonic(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> StoreTime {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        StoreTime(ms)
    }

    /// The operating system's monotonic clock (not tokio's, which a paused test
    /// runtime replaces with virtual time that has nothing to do with this wall
    /// clock). Outside such tests the two are the same clock.
    fn monotonic(&self) -> tokio::time::Instant {
        tokio::time::Instant::from_std(std::time::Instant::now())
    }
}

/// A clock that follows `tokio::time`: it starts at a fixed epoch time and
/// advances exactly as `tokio::time::Instant` does, so under a paused test
/// runtime (`#[tokio::test(start_paused = true)]`) it moves only when the test
/// advances time or every task sleeps.
///
/// An offset makes a clock that is deliberately wrong, for clock-skew tests.
///
/// ```
/// use store_trait::{Clock, TokioClock};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let clock = TokioClock::starting_at(store_trait::StoreTime::from_millis(0));
/// assert!(clock.now().as_millis() < 1_000);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin: tokio::time::Instant,
    origin_ms: i64,
}

impl TokioClock {
    /// A clock reading `start` now, and advancing with tokio time.
    pub fn starting_at(start: StoreTime) -> Self {
        TokioClock { origin: tokio::time::Instant::now(), origin_ms: start.as_millis() }
    }

    /// A clock reading the system time now (plus `offset_ms`, which may be
    /// negative), advancing with tokio time.
    pub fn from_system_with_offset(offset_ms: i64) -> Self {
        Self::starting_at(StoreTime(SystemClock.now().0.saturating_add(offset_ms)))
    }
}

impl Clock for TokioClock {
    fn now(&self) -> StoreTime {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        let ms = i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX);
        StoreTime(self.origin_ms.saturating_add(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert!(Ttl::new(Duration::from_micros(999)).is_err());
        assert_eq!(Ttl::new(Duration::from_millis(1)).unwrap().as_millis(), 1);
        assert!(Ttl::new(Ttl::MAX).is_ok());
        assert!(Ttl::new(Ttl::MAX + Duration::from_millis(1)).is_err());
        assert!(Ttl::from_secs_f64(f64::INFINITY).is_err());
        assert!(Ttl::from_secs_f64(1e300).is_err());
        assert_eq!(Ttl::from_secs_f64(0.25).unwrap().as_millis(), 250);
    }

    #[test]
    fn until_saturates() {
        let a = StoreTime::from_millis(10);
        assert_eq!(a.until(StoreTime::from_millis(5)), Duration::ZERO);
        assert_eq!(StoreTime::from_millis(i64::MAX).plus(Ttl::new(Ttl::MAX).unwrap()).as_millis(), i64::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let c = TokioClock::starting_at(StoreTime::from_millis(100));
        assert_eq!(c.now().as_millis(), 100);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(c.now().as_millis(), 2_100);
    }

    #[tokio::test(start_paused = true)]
    async fn system_clock_pairs_with_the_os_monotonic_clock() {
        // Under paused tokio time, tokio's clock moves without the OS clocks: the
        // system clock's companion is the OS monotonic clock, so a suspend check
        // comparing the two sees nothing.
        let (wall, mono) = (SystemClock.now(), SystemClock.monotonic());
        tokio::time::advance(Duration::from_secs(3_600)).await;
        let (wall2, mono2) = (SystemClock.now(), SystemClock.monotonic());
        let mono_ms = i64::try_from(mono2.duration_since(mono).as_millis()).unwrap();
        assert!((wall2.as_millis() - wall.as_millis() - mono_ms).abs() < 1_000);
        assert!(mono_ms < 60_000, "not tokio's virtual hour");
    }
}
