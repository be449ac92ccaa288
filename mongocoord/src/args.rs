//! Numbers from the command line, checked: a typo such as `--delay 1e20` is a
//! clear error (exit status 2), never a panic.

use std::time::Duration;

/// The longest duration any option accepts: a year, as for lease lengths.
pub(crate) const MAX_SECONDS: f64 = 366.0 * 24.0 * 3600.0;

/// `s` seconds for option `--what`: finite, not negative (zero only when
/// `zero_ok`), at most [`MAX_SECONDS`].
pub(crate) fn seconds(what: &str, s: f64, zero_ok: bool) -> Result<Duration, String> {
    let ok = s.is_finite() && (s > 0.0 || (zero_ok && s == 0.0)) && s <= MAX_SECONDS;
    // A positive value below a nanosecond would become zero.
    let d = if ok { Duration::try_from_secs_f64(s).ok().filter(|d| zero_ok || !d.is_zero()) } else { None };
    d.ok_or_else(|| {
        let least = if zero_ok { "zero or more" } else { "a positive number of" };
        // `1e300` as typed, not three hundred digits.
        let typed = if s.abs() < 1e12 { format!("{s}") } else { format!("{s:e}") };
        format!("--{what} must be {least} seconds, at most a year (31,622,400), not {typed}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(seconds("delay", 1.5, false), Ok(Duration::from_millis(1500)));
        assert_eq!(seconds("delay", 0.0, true), Ok(Duration::ZERO));
        assert!(seconds("delay", 1e300, false).is_err_and(|e| e.ends_with("not 1e300")));
        for bad in [0.0, -1.0, 1e20, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, MAX_SECONDS * 1.01] {
            assert!(seconds("delay", bad, false).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Any number a user can type gives a duration in range or an error.
        #[test]
        fn never_panics(s in proptest::num::f64::ANY, zero_ok: bool) {
            match seconds("x", s, zero_ok) {
                Ok(d) => prop_assert!(d.as_secs_f64() <= MAX_SECONDS && (zero_ok || !d.is_zero())),
                Err(e) => prop_assert!(e.starts_with("--x must be")),
            }
        }
    }
}

/// The command a runner supervises, and how: the options `lock`, `elect`,
/// `agent` and `cron` share.
#[derive(Debug, clap::Args)]
pub(crate) struct Command {
    /// Seconds between SIGTERM and SIGKILL when CMD is stopped (default: a
    /// quarter of the ttl, at most 10). CMD gets SIGTERM once less than this
    /// much of the lease is confirmed; it must fit between two renewals. A lost
    /// lease kills CMD at once.
    #[arg(long)]
    pub(crate) grace: Option<f64>,
    /// Pass MONGO_* and MONGODB_* variables on to CMD (not by default).
    #[arg(long)]
    pub(crate) pass_env: bool,
    /// Serve this process's figures (task outcomes, claim latency, lease
    /// acquisitions and losses, term changes, change-stream resyncs) at
    /// http://ADDR/metrics, for Prometheus (for example 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_bind: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub(crate) cmd: Vec<String>,
}

impl Command {
    /// The checked run of this command under a lease of `ttl` seconds.
    pub(crate) fn run(&self, ttl: f64) -> Result<crate::runners::Run<'_>, String> {
        crate::runners::Run::new("ttl", ttl, self.grace, self.pass_env, &self.cmd)
    }
}
