//! Numbers from the command line, checked: a typo such as `--delay 1e20` is a
//! clear error (exit status 2), never a panic.

use std::time::Duration;

use crate::error::CliError;

/// The longest duration any option accepts: a year, as for lease lengths.
pub(crate) const MAX_SECONDS: f64 = 366.0 * 24.0 * 3600.0;

/// `s` seconds for option `--what`: finite, not negative (zero only when
/// `zero_ok`), at most [`MAX_SECONDS`].
pub(crate) fn seconds(what: &str, s: f64, zero_ok: bool) -> Result<Duration, CliError> {
    let ok = s.is_finite() && (s > 0.0 || (zero_ok && s == 0.0)) && s <= MAX_SECONDS;
    // A positive value below a nanosecond would become zero.
    let d = if ok { Duration::try_from_secs_f64(s).ok().filter(|d| zero_ok || !d.is_zero()) } else { None };
    d.ok_or_else(|| {
        let least = if zero_ok { "zero or more" } else { "a positive number of" };
        // `1e300` as typed, not three hundred digits.
        let typed = if s.abs() < 1e12 { format!("{s}") } else { format!("{s:e}") };
        CliError::invalid(format!("--{what} must be {least} seconds, at most a year (31,622,400), not {typed}"))
    })
}

/// A rate limit from the command line: `N/SECONDS`, at most N task starts in
/// any window of SECONDS (`--rate 100/60`, `--rate 5/0.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    pub(crate) n: u32,
    pub(crate) per: Duration,
}

/// Parses `--rate N/SECONDS` strictly: N a whole number from 1 to
/// [`mongoagent::MAX_RATE_STARTS`] in plain digits, SECONDS as [`seconds`]
/// (positive, at most a year); nothing else around them.
pub(crate) fn rate(s: &str) -> Result<Rate, CliError> {
    let usage = || CliError::invalid(format!("--rate must be N/SECONDS (such as 100/60), not {s:?}"));
    let (n, per) = s.split_once('/').ok_or_else(usage)?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return Err(usage());
    }
    let max = mongoagent::MAX_RATE_STARTS;
    let n: u32 = n
        .parse()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| CliError::invalid(format!("--rate allows 1 to {max} starts per interval, not {n}")))?;
    if per.is_empty() || !per.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(usage());
    }
    let secs: f64 = per.parse().map_err(|_| usage())?;
    let per = seconds("rate's SECONDS", secs, false)?;
    if per < Duration::from_millis(1) {
        return Err(CliError::invalid(format!("--rate's interval must be at least a millisecond, not {secs} s")));
    }
    Ok(Rate { n, per })
}

/// The cluster-wide limits of an agent name (`mongocoord agent`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct Limits {
    /// At most N tasks of this agent name run at once across every process
    /// (permits of a semaphore; every process of the name gives the same N).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) global_concurrency: Option<u32>,
    /// At most N task starts of this agent name in any window of SECONDS,
    /// across every process, on the server's clock (a burst waits): N/SECONDS,
    /// such as 100/60.
    #[arg(long, value_name = "N/SECONDS", value_parser = rate)]
    pub(crate) rate: Option<Rate>,
    /// At most N tasks of one group (`enqueue --group`) run at once across
    /// every process, started in enqueue order; 1: one at a time, in order.
    /// Without it, this agent lets no grouped task through (it may run one
    /// another agent let through)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) group_concurrency: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(seconds("delay", 1.5, false).ok(), Some(Duration::from_millis(1500)));
        assert_eq!(seconds("delay", 0.0, true).ok(), Some(Duration::ZERO));
        assert!(seconds("delay", 1e300, false).is_err_and(|e| e.to_string().ends_with("not 1e300")));
        for bad in [0.0, -1.0, 1e20, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, MAX_SECONDS * 1.01] {
            assert!(seconds("delay", bad, false).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(rate("100/60").ok(), Some(Rate { n: 100, per: Duration::from_secs(60) }));
        assert_eq!(rate("5/0.5").ok(), Some(Rate { n: 5, per: Duration::from_millis(500) }));
        for bad in [
            "",
            "100",
            "100/",
            "/60",
            "0/60",
            "-1/60",
            "+1/60",
            "1e3/60",
            "1/-2",
            "1/0",
            "1/0.0001",
            "1/nan",
            "1/inf",
            " 1/60",
            "1/60 ",
            "1/60/2",
            "10001/60",
            "99999999999/1",
            "1/1e20",
            "1/99999999999",
        ] {
            assert!(rate(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        /// Whatever a user types as a rate gives a checked rate or an error.
        #[test]
        fn rates_never_panic(s in "\\PC{0,12}") {
            if let Ok(r) = rate(&s) {
                prop_assert!(r.n >= 1 && !r.per.is_zero());
            }
        }

        /// Any number a user can type gives a duration in range or an error.
        #[test]
        fn never_panics(s in proptest::num::f64::ANY, zero_ok: bool) {
            match seconds("x", s, zero_ok) {
                Ok(d) => prop_assert!(d.as_secs_f64() <= MAX_SECONDS && (zero_ok || !d.is_zero())),
                Err(e) => prop_assert!(e.to_string().starts_with("--x must be")),
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
