//! When a schedule ticks: cron expressions in a time zone, fixed intervals,
//! one-off instants. Ticks are instants (epoch milliseconds); a zone only maps
//! a cron expression's wall-clock fields to instants.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;
use mongolock::ConfigError;

use crate::error::AgentError;

/// How many ticks one pass looks at, at most, before it stops (a guard against
/// a per-second expression with a long starting deadline).
pub(crate) const MAX_TICKS_PER_PASS: usize = 10_000;

/// The most tick ids a [`Overlap::Skip`](super::Overlap::Skip) check reads by
/// `_id`; past it (a schedule whose passes stopped for long), it reads the
/// schedule's kept ticks instead.
pub(crate) const MAX_KEYS_TO_CHECK: usize = 1_000;

/// A parsed tick rule.
#[derive(Debug, Clone)]
pub(crate) enum Ticks {
    /// A cron expression in a zone.
    Cron(Box<Cron>, Tz),
    /// Every `every_ms`, at `offset_ms` past each multiple since the epoch.
    Every { every_ms: i64, offset_ms: i64 },
    /// Once.
    At(i64),
}

/// Parses a cron expression: 5 fields (minute precision) or 6 with seconds
/// first, an optional year last, per croner's (OCPS) grammar.
pub(crate) fn parse_cron(expr: &str) -> Result<Cron, AgentError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expr)
        .map_err(|e| AgentError::Config(ConfigError::new(format!("cron expression {expr:?}: {e}")).with_source(e)))
}

/// Parses an IANA zone name (`"UTC"`, `"Europe/Berlin"`).
pub(crate) fn parse_zone(zone: &str) -> Result<Tz, AgentError> {
    zone.parse::<Tz>()
        .map_err(|e| AgentError::Config(ConfigError::new(format!("time zone {zone:?}: {e}")).with_source(e)))
}

fn instant(tz: Tz, secs: i64) -> Option<DateTime<Tz>> {
    DateTime::<Utc>::from_timestamp(secs, 0).map(|d| tz.from_utc_datetime(&d.naive_utc()))
}

impl Ticks {
    /// The first tick at or after `t` (epoch ms).
    pub(crate) fn next_at_or_after(&self, t: i64) -> Option<i64> {
        match self {
            Ticks::Cron(cron, tz) => {
                let secs = t.div_euclid(1000) + i64::from(t.rem_euclid(1000) != 0);
                let start = instant(*tz, secs)?;
                cron.find_next_occurrence(&start, true).ok().map(|d| d.timestamp_millis())
            }
            Ticks::Every { every_ms, offset_ms } => {
                let k = (t.checked_sub(*offset_ms)?).div_euclid(*every_ms);
                let at = offset_ms.checked_add(k.checked_mul(*every_ms)?)?;
                if at >= t {
                    Some(at)
                } else {
                    at.checked_add(*every_ms)
                }
            }
            Ticks::At(at) => (*at >= t).then_some(*at),
        }
    }

    /// The last tick at or before `t` (epoch ms).
    pub(crate) fn prev_at_or_before(&self, t: i64) -> Option<i64> {
        match self {
            Ticks::Cron(cron, tz) => {
                let start = instant(*tz, t.div_euclid(1000))?;
                cron.find_previous_occurrence(&start, true).ok().map(|d| d.timestamp_millis())
            }
            Ticks::Every { every_ms, offset_ms } => {
                let k = (t.checked_sub(*offset_ms)?).div_euclid(*every_ms);
                offset_ms.checked_add(k.checked_mul(*every_ms)?)
            }
            Ticks::At(at) => (*at <= t).then_some(*at),
        }
    }

    /// Ticks in `[from, to]`, oldest first, at most `limit`.
    pub(crate) fn between(&self, from: i64, to: i64, limit: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut at = from;
        while out.len() < limit {
            match self.next_at_or_after(at) {
                Some(t) if t <= to => {
                    out.push(t);
                    match t.checked_add(1) {
                        Some(n) => at = n,
                        None => break,
                    }
                }
                _ => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ms(s: &str) -> i64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis()
    }

    #[test]
    fn intervals_are_aligned_to_the_epoch_plus_offset() {
        let t = Ticks::Every { every_ms: 1_000, offset_ms: 250 };
        assert_eq!(t.next_at_or_after(1_250), Some(1_250));
        assert_eq!(t.next_at_or_after(1_251), Some(2_250));
        assert_eq!(t.prev_at_or_before(2_249), Some(1_250));
        assert_eq!(t.between(0, 3_250, 10), vec![250, 1_250, 2_250, 3_250]);
        assert_eq!(Ticks::At(5).between(0, 10, 10), vec![5]);
        assert_eq!(Ticks::At(5).next_at_or_after(6), None);
    }

    #[test]
    fn cron_in_a_zone_maps_wall_clock_to_instants() {
        let t = Ticks::Cron(Box::new(parse_cron("0 30 2 * * *").unwrap()), parse_zone("Europe/Berlin").unwrap());
        // Winter (UTC+1): 02:30 Berlin is 01:30 UTC.
        assert_eq!(t.next_at_or_after(ms("2026-01-10T00:00:00Z")), Some(ms("2026-01-10T01:30:00Z")));
        // A fractional start rounds up to the next whole second.
        assert_eq!(t.next_at_or_after(ms("2026-01-10T01:30:00Z") + 1), Some(ms("2026-01-11T01:30:00Z")));
        assert_eq!(t.prev_at_or_before(ms("2026-01-11T01:29:59Z")), Some(ms("2026-01-10T01:30:00Z")));
        assert!(parse_cron("61 * * * *").is_err());
        assert!(parse_zone("Mars/Olympus").is_err());
    }
}
