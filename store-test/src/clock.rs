//! [`TestClock`]: a clock a test steps and skews.

use store_trait::{Clock, StoreError, StoreTime, SystemClock};

/// A clock for tests of clock trouble: it follows `tokio::time` like
/// [`TokioClock`](store_trait::TokioClock), but a test can make it **jump** (forward or back, as an NTP step
/// or a failover to a server whose clock is off does) and **run at another rate**
/// (a clock running fast or slow). Clones share one clock, so a test keeps a
/// handle after giving a clone to a store or a lock.
///
/// Deterministic under a paused runtime: the reading is a pure function of tokio
/// time and the jumps and rate changes made so far.
///
/// ```
/// use store_test::TestClock;
/// use store_trait::{Clock, StoreTime};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let clock = TestClock::starting_at(StoreTime::from_millis(1_000));
/// clock.jump(500);
/// assert_eq!(clock.now().as_millis(), 1_500);
/// clock.set_rate(2.0).unwrap();
/// tokio::time::advance(Duration::from_millis(100)).await;
/// assert_eq!(clock.now().as_millis(), 1_700);
/// clock.jump(-700);
/// assert_eq!(clock.now().as_millis(), 1_000);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TestClock {
    state: std::sync::Arc<parking_lot::Mutex<TestClockState>>,
}

#[derive(Debug)]
struct TestClockState {
    /// The tokio instant of the last jump or rate change.
    anchor: tokio::time::Instant,
    /// The reading at `anchor`.
    anchor_ms: i64,
    /// Clock milliseconds per million real milliseconds.
    rate_ppm: u64,
}

impl TestClockState {
    fn read(&self, at: tokio::time::Instant) -> i64 {
        let elapsed = at.saturating_duration_since(self.anchor).as_nanos();
        let scaled = elapsed.saturating_mul(u128::from(self.rate_ppm)) / 1_000_000 / 1_000_000;
        self.anchor_ms.saturating_add(i64::try_from(scaled).unwrap_or(i64::MAX))
    }

    /// Moves the anchor to now, so a change applies from now on only.
    fn reanchor(&mut self) {
        let now = tokio::time::Instant::now();
        self.anchor_ms = self.read(now);
        self.anchor = now;
    }
}

impl TestClock {
    /// The fastest rate [`TestClock::set_rate`] accepts.
    pub const MAX_RATE: f64 = 1_000.0;

    /// A clock reading `start` now and advancing with tokio time at rate 1.
    pub fn starting_at(start: StoreTime) -> Self {
        let state =
            TestClockState { anchor: tokio::time::Instant::now(), anchor_ms: start.as_millis(), rate_ppm: 1_000_000 };
        TestClock { state: std::sync::Arc::new(parking_lot::Mutex::new(state)) }
    }

    /// A clock reading the system time now (plus `offset_ms`, which may be
    /// negative), advancing with tokio time at rate 1.
    pub fn from_system_with_offset(offset_ms: i64) -> Self {
        Self::starting_at(StoreTime::from_millis(SystemClock.now().as_millis().saturating_add(offset_ms)))
    }

    fn state(&self) -> parking_lot::MutexGuard<'_, TestClockState> {
        // The state is two numbers updated together under the lock: a panic
        // elsewhere cannot leave it half-written.
        self.state.lock()
    }

    /// Steps the clock by `ms` milliseconds at once: forward when positive, back
    /// when negative. Tokio time does not move.
    pub fn jump(&self, ms: i64) {
        let mut st = self.state();
        st.reanchor();
        st.anchor_ms = st.anchor_ms.saturating_add(ms);
    }

    /// From now on, the clock advances `rate` milliseconds per millisecond of
    /// tokio time (1.0 is normal, 2.0 twice as fast, 0.0 stopped). Rejects a
    /// negative, non-finite or larger than [`TestClock::MAX_RATE`] rate with
    /// [`StoreError::InvalidInput`]; the rate is kept to a millionth.
    pub fn set_rate(&self, rate: f64) -> Result<(), StoreError> {
        if !rate.is_finite() || !(0.0..=Self::MAX_RATE).contains(&rate) {
            return Err(StoreError::invalid("rate", format!("{rate} is not between 0 and {}", Self::MAX_RATE)));
        }
        // In range, so the product is a whole number of ppm that fits a u64.
        let ppm = (rate * 1_000_000.0).round() as u64;
        let mut st = self.state();
        st.reanchor();
        st.rate_ppm = ppm;
        Ok(())
    }
}

impl Clock for TestClock {
    fn now(&self) -> StoreTime {
        StoreTime::from_millis(self.state().read(tokio::time::Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use store_trait::{Clock, StoreTime};

    use super::TestClock;

    #[tokio::test(start_paused = true)]
    async fn test_clock_jumps_and_runs_at_a_rate() {
        let c = TestClock::starting_at(StoreTime::from_millis(10_000));
        let shared = c.clone();
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert_eq!(c.now().as_millis(), 11_000);
        shared.jump(5_000);
        assert_eq!(c.now().as_millis(), 16_000, "clones share the clock");
        shared.jump(-8_000);
        assert_eq!(c.now().as_millis(), 8_000, "a jump back");
        c.set_rate(0.5).unwrap();
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert_eq!(c.now().as_millis(), 8_500, "half speed");
        c.set_rate(3.0).unwrap();
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert_eq!(c.now().as_millis(), 11_500, "a rate applies from its change on");
        c.set_rate(0.0).unwrap();
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert_eq!(c.now().as_millis(), 11_500, "stopped");
        for bad in [-1.0, f64::NAN, f64::INFINITY, TestClock::MAX_RATE * 2.0] {
            assert!(c.set_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(c.monotonic(), tokio::time::Instant::now(), "compared with tokio's clock");
    }
}
