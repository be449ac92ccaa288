//! The grace period between SIGTERM and SIGKILL, tied to the lease: the command
//! is told to stop when less than the grace period of the lease is confirmed, so
//! the grace period must end before the lease counts as lost, and that must not
//! happen in normal operation, between two renewals.

use std::time::Duration;

use mongolock::unstable::LeaseTiming;

use crate::error::CliError;

/// The longest default grace period.
const MAX_DEFAULT: Duration = Duration::from_secs(10);

/// When a lease of `ttl` is renewed and how long before it could lapse it counts
/// as lost: `mongolock`'s one set of rules ([`LeaseTiming`]), which the lock, the
/// elector and the agent's claims all use.
fn lease_timing(ttl: Duration) -> Option<(Duration, Duration)> {
    let t = LeaseTiming::new(ttl, None, None).ok()?;
    Some((t.renew_every(), t.safety_margin()))
}

/// The time a lease of `ttl` has left, at worst, just before a renewal: ttl minus
/// the safety margin minus the renew interval. `None` when there is none.
fn room(ttl: Duration) -> Option<Duration> {
    let (renew, margin) = lease_timing(ttl)?;
    ttl.checked_sub(margin)?.checked_sub(renew).filter(|r| !r.is_zero())
}

/// The grace period for a lease of `ttl` (`lease` names the option that set it, `--ttl`):
/// `given` seconds, checked to fit (renew interval + grace < ttl − safety margin),
/// or by default a quarter of the ttl, at most 10 s, which always fits.
pub(crate) fn grace(lease: &str, ttl: Duration, given: Option<f64>) -> Result<Duration, CliError> {
    let room = room(ttl).ok_or_else(|| CliError::invalid(format!("--{lease} {ttl:?} is too short for a lease")))?;
    let Some(g) = given else {
        return Ok((ttl / 4).min(MAX_DEFAULT).min(room / 2));
    };
    if !g.is_finite() || g < 0.0 {
        return Err(CliError::invalid(format!("--grace must be zero or a positive number of seconds, not {g}")));
    }
    let grace = Duration::try_from_secs_f64(g).map_err(|e| CliError::invalid(format!("--grace {g}: {e}")))?;
    if grace >= room {
        let (renew, margin) = lease_timing(ttl).unwrap_or_default();
        return Err(CliError::invalid(format!(
            "--grace {g} does not fit --{lease} {}: the lease is renewed every {:.3} s and counts as lost {:.3} s \
             before it could lapse, so the command must be stopped within {:.3} s of a renewal failing; give a \
             grace period below {:.3} s, or a longer --{lease}",
            ttl.as_secs_f64(),
            renew.as_secs_f64(),
            margin.as_secs_f64(),
            room.as_secs_f64(),
            room.as_secs_f64(),
        )));
    }
    Ok(grace)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::try_from_secs_f64(x).unwrap()
    }

    #[test]
    fn the_default_always_fits() {
        for ttl in [s(0.02), s(0.1), s(1.0), s(2.0), s(15.0), s(30.0), s(60.0), s(3600.0)] {
            let g = grace("ttl", ttl, None).unwrap();
            assert!(!g.is_zero() && g <= MAX_DEFAULT, "{ttl:?}: {g:?}");
            grace("ttl", ttl, Some(g.as_secs_f64())).unwrap();
        }
        assert_eq!(grace("ttl", s(2.0), None).unwrap(), s(0.5));
        assert_eq!(grace("ttl", s(60.0), None).unwrap(), s(10.0));
    }

    #[test]
    fn a_grace_that_cannot_fit_is_rejected() {
        // ttl 2 s: renewed every 0.667 s, lost 0.2 s early: 1.133 s of room.
        assert!(grace("ttl", s(2.0), Some(1.1)).is_ok());
        let e = grace("ttl", s(2.0), Some(1.2)).unwrap_err().to_string();
        assert!(e.contains("does not fit") && e.contains("below 1.133"), "{e}");
        assert!(grace("ttl", s(60.0), Some(38.0)).unwrap_err().to_string().contains("--ttl"));
        assert_eq!(grace("ttl", s(2.0), Some(0.0)).unwrap(), Duration::ZERO);
        assert!(grace("ttl", s(2.0), Some(-1.0)).is_err());
        assert!(grace("ttl", s(2.0), Some(f64::NAN)).is_err());
    }
}
