//! Signals to the chaos run's processes, shared by the orchestrator
//! (`chaos/`) and its schedule (`cron.rs`): the signals a runner or its
//! supervisor may get, which of the two gets one, and the sending.

use std::process::Stdio;

/// What an operator, a crash or a command may send a runner or its
/// supervisor, caught or not: each must leave at most one holder whose
/// command runs. (`-36` is a real-time signal.)
pub(crate) const ANY_SIGNAL: [&str; 10] =
    ["-QUIT", "-ABRT", "-SEGV", "-ALRM", "-USR1", "-USR2", "-HUP", "-36", "-TERM", "-KILL"];

/// `pid`, or as often its supervisor (the runner's child while a command
/// runs; the runner itself when it has none).
pub(crate) fn runner_or_supervisor(pid: u32, rng: &mut fastrand::Rng) -> u32 {
    if rng.bool() {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(child) = children.split_whitespace().next().and_then(|c| c.parse().ok()) {
            return child;
        }
    }
    pid
}

/// A signal of [`ANY_SIGNAL`], picked by `rng`.
pub(crate) fn any_signal(rng: &mut fastrand::Rng) -> &'static str {
    ANY_SIGNAL[rng.usize(..ANY_SIGNAL.len())]
}

/// Sends `sig` (`-STOP`, `-KILL`, …) to `pid` with `kill`.
pub(crate) fn signal(pid: u32, sig: &str) {
    // The process may be gone already (killed while paused): that is fine.
    let _ = std::process::Command::new("kill").args([sig, &pid.to_string()]).stderr(Stdio::null()).status();
}
