//! How a lease is kept: its length, how often its holder renews it, and how
//! long before it could lapse the holder is told it is lost. One set of rules
//! for locks, semaphores, leadership terms and task claims.

use std::time::Duration;

use store_trait::Ttl;

use crate::error::{ConfigError, LockError};

/// The longest poll interval or renewal interval accepted (a year): longer
/// values are typos, and would overflow the clock arithmetic of a waiter.
pub const MAX_INTERVAL: Duration = Ttl::MAX;

/// The lease length unless configured otherwise (as in `MongoLocker`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);

/// A validated lease timing: `renew_every + safety_margin < ttl`, all positive.
///
/// ```
/// use mongolock::unstable::LeaseTiming;
/// use std::time::Duration;
///
/// let t = LeaseTiming::new(Duration::from_secs(30), None, None).unwrap();
/// assert_eq!(t.renew_every(), Duration::from_secs(10));
/// assert_eq!(t.safety_margin(), Duration::from_secs(2));
/// assert!(LeaseTiming::new(Duration::from_millis(1), None, None).is_err(), "no room for a margin");
/// assert!(LeaseTiming::new(Duration::MAX, None, None).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    ttl: Ttl,
    renew_every: Duration,
    margin: Duration,
}

impl LeaseTiming {
    /// A lease of `ttl`, renewed every `renew_every` (default a third of the
    /// ttl), reported lost `margin` before it could lapse (default a tenth of
    /// the ttl, between 5 ms and 2 s).
    pub fn new(ttl: Duration, renew_every: Option<Duration>, margin: Option<Duration>) -> Result<Self, LockError> {
        let ttl = Ttl::new(ttl).map_err(|e| LockError::Config(ConfigError::caused_by(e)))?;
        let d = ttl.as_duration();
        let margin = margin.unwrap_or_else(|| (d / 10).clamp(Duration::from_millis(5), Duration::from_secs(2)));
        if margin.is_zero() || margin >= d {
            return Err(LockError::Config(
                format!("safety margin {margin:?} must be positive and below the ttl {d:?}").into(),
            ));
        }
        let renew_every = renew_every.unwrap_or(d / 3);
        // `margin < d` and `renew_every` is checked against `d - margin`: no overflow.
        if renew_every.is_zero() || renew_every >= d - margin {
            return Err(LockError::Config(
                format!("renew interval {renew_every:?} plus safety margin {margin:?} must be below the ttl {d:?}")
                    .into(),
            ));
        }
        Ok(LeaseTiming { ttl, renew_every, margin })
    }

    /// The lease length.
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// How often the holder renews.
    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }

    /// How long before the lease could lapse its holder is told it lost it.
    pub fn safety_margin(&self) -> Duration {
        self.margin
    }
}

/// Checks a user-given interval (a poll interval, a drain timeout, a backoff):
/// positive and at most [`MAX_INTERVAL`].
pub fn check_interval(what: &str, d: Duration) -> Result<Duration, LockError> {
    if d.is_zero() || d > MAX_INTERVAL {
        return Err(LockError::Config(format!("{what} must be positive and at most a year, not {d:?}").into()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extremes_are_rejected_not_panicking() {
        for ttl in [Duration::ZERO, Duration::from_nanos(1), Duration::from_millis(5), Duration::MAX] {
            assert!(LeaseTiming::new(ttl, None, None).is_err(), "{ttl:?}");
        }
        let s = Duration::from_secs(1);
        assert!(LeaseTiming::new(s, Some(Duration::MAX), None).is_err());
        assert!(LeaseTiming::new(s, None, Some(Duration::MAX)).is_err());
        assert!(LeaseTiming::new(s, Some(Duration::ZERO), None).is_err());
        assert!(LeaseTiming::new(s, None, Some(Duration::ZERO)).is_err());
        assert!(LeaseTiming::new(Ttl::MAX, None, None).is_ok());
        assert!(check_interval("poll_interval", Duration::MAX).is_err());
        assert!(check_interval("poll_interval", Duration::ZERO).is_err());
    }
}
