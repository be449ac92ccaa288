//! The supervisor process (`mongocoord supervise`, hidden): started by a runner,
//! it starts the command in a new process group and stays its parent, so that
//! the command's whole tree ends with it and with the runner.
//!
//! - It is a child subreaper: a descendant whose parent dies (a daemon that
//!   double-forks, say) becomes its child rather than init's, so it is found and
//!   reaped.
//! - Its parent-death signal is SIGUSR2, and once the command runs it checks
//!   its parent right after setting it (the runner may have died before) and
//!   every half second: when the runner dies, however it dies, it SIGKILLs the
//!   group and every descendant, reaps them, and exits.
//! - With `--control-fd`, it waits for the runner's word to start the command
//!   (it may be started ahead: [`super::Standby`]), and exits quietly if the
//!   runner closes the pipe first, or dies; signals are dropped meanwhile, and
//!   those pending at the word too. Then the pipe carries the runner's stops
//!   (`term`, `kill`) and the lease's deadline after each renewal
//!   ([`super::control`]), which it enforces by itself: SIGTERM the grace
//!   period before it, SIGKILL at it, unless a later one comes first. So a
//!   runner that is stopped (SIGSTOP, Ctrl-Z) or hung, and cannot renew or
//!   signal, does not leave the command running past its lease.
//! - Once the command runs, SIGTERM (from anyone but the runner, which asks
//!   in the pipe) is passed on to the group and to every descendant that left
//!   it; SIGKILL follows after the grace period unless the tree is gone by
//!   then. SIGUSR1 kills the tree at once. A supervisor that does not end the
//!   tree when the runner asks (stopped, or hung) is killed by the runner,
//!   which then kills the tree ([`super::adopted`]).
//! - When the main process exits, whatever it left running gets SIGTERM, then
//!   SIGKILL after the grace period.
//! - It runs in its own process group (the runner starts it so), so a Ctrl-Z
//!   to the runner's group does not stop it.
//! - It handles every signal a handler can be set for ([`ignore_the_rest`]:
//!   SIGQUIT, SIGALRM, SIGXCPU, SIGTSTP, real-time signals, ...), so none of
//!   them ends or stops it before its tree; should one that cannot be handled
//!   come (SIGKILL; SIGSEGV, SIGILL or SIGFPE sent by `kill`), the runner kills
//!   the tree itself ([`super::adopted`]).
//! - Its process name is [`NAME`], not `mongocoord`, so that an operator's
//!   `pkill mongocoord` (meant for runners, whose supervisors then kill their
//!   trees) does not kill it too.
//!
//! It exits once no descendant is left, with the main process's exit code (128 +
//! the signal that ended it); 127 or 126 when the command could not be started,
//! as a shell does.

use std::time::Duration;

use futures::FutureExt;
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::unistd::{getppid, Pid};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use super::control::{Control, Stop, Word};
use super::tree::{Left, Tree};
use crate::error::CliError;

/// The supervisor's parent-death signal.
pub(crate) const PARENT_DIED: Signal = Signal::SIGUSR2;
/// What a runner sends as it drops a supervisor, to have the tree killed at
/// once (it asks for its other stops in the control pipe).
pub(crate) const KILL_NOW: Signal = Signal::SIGUSR1;

/// The supervisor's process name, its comm (which `pkill` and `pgrep` match,
/// by a regular expression, against at most 15 bytes) and its `argv[0]`: it
/// does not contain `mongocoord`, so neither `pkill mongocoord` nor `pkill -x
/// mongocoord` hits a supervisor (only `pkill -f` with its arguments would).
pub(crate) const NAME: &str = "mcoord-sup";

/// [`NAME`] as `prctl` takes it.
const NAME_C: &std::ffi::CStr = c"mcoord-sup";

/// The signals the supervisor acts on (or looks at its parent on).
const HANDLED: [Signal; 6] = [Signal::SIGCHLD, Signal::SIGTERM, KILL_NOW, PARENT_DIED, Signal::SIGINT, Signal::SIGHUP];

/// Names the supervisor's process [`NAME`]. Run on the main thread, whose name
/// is the process's comm, before the runtime's threads start.
pub(crate) fn before_runtime() -> Result<(), CliError> {
    prctl::set_name(NAME_C).map_err(CliError::ProcessName)
}

/// Sets a handler that does nothing for every signal but [`HANDLED`] that can
/// have one. A signal's default action (SIGQUIT, SIGALRM, SIGXCPU, SIGPWR,
/// real-time signals, ... end a process; SIGTSTP stops it) would orphan the
/// command's tree. A handler, not a blocked signal or an ignored one: the
/// command inherits the mask (the standard library passes it on) and ignored
/// signals, but every handler goes back to the default action at exec, so the
/// command starts as it would without a supervisor. A handler stays set for the
/// life of the process, whether or not its stream is read. Left out: SIGKILL
/// and SIGSTOP, which cannot be caught; SIGSEGV, SIGILL and SIGFPE, which the
/// runtime refuses (a handler that returns from a real fault would loop); and
/// SIGPIPE, which the standard library already ignores. Real-time numbers the C
/// library keeps for itself (32, 33) refuse a handler and are passed over.
fn ignore_the_rest() -> Result<Vec<tokio::signal::unix::Signal>, CliError> {
    let skip = [Signal::SIGKILL, Signal::SIGSTOP, Signal::SIGSEGV, Signal::SIGILL, Signal::SIGFPE, Signal::SIGPIPE];
    let mut streams = Vec::new();
    for n in 1..=64 {
        if skip.iter().chain(&HANDLED).any(|&s| s as i32 == n) {
            continue;
        }
        match signal(SignalKind::from_raw(n)) {
            Ok(s) => streams.push(s),
            // 1 to 31 are the standard signals: each must take.
            Err(e) if n < 32 => return Err(CliError::io(format!("cannot handle signal {n}"), e)),
            Err(e) => tracing::debug!(signal = n, error = %e, "no handler for this signal number"),
        }
    }
    Ok(streams)
}

/// How often the parent is checked besides the parent-death signal.
const PARENT_CHECK: Duration = Duration::from_millis(500);

/// `mongocoord supervise --parent PID --grace-ms MS [--control-fd FD] -- CMD...`:
/// runs `argv` as described in the module documentation and returns the exit code.
pub(crate) async fn run(
    parent: i32,
    grace: Duration,
    control_fd: Option<i32>,
    argv: &[String],
) -> Result<u8, CliError> {
    let parent = Pid::from_raw(parent);
    let (program, args) = argv.split_first().ok_or_else(|| CliError::invalid("no command given"))?;
    prctl::set_child_subreaper(true)
        .map_err(|source| CliError::Os { what: "cannot become a child subreaper", source })?;
    // Handlers first, so that no signal takes its default action (which would
    // end this process and orphan the tree). Each listened-to signal is in
    // `HANDLED`; the rest do nothing.
    let _the_rest = ignore_the_rest()?;
    let listen = |kind: SignalKind| signal(kind).map_err(|e| CliError::io("cannot handle signals", e));
    let mut chld = listen(SignalKind::child())?;
    let mut term = listen(SignalKind::terminate())?;
    let mut kill_now = listen(SignalKind::from_raw(KILL_NOW as i32))?;
    let mut parent_died = listen(SignalKind::from_raw(PARENT_DIED as i32))?;
    // Interrupts and hangups from the terminal reach the runner (this process has
    // a group of its own); it decides. Here they only prompt a look at the parent.
    let mut int = listen(SignalKind::interrupt())?;
    let mut hup = listen(SignalKind::hangup())?;
    prctl::set_pdeathsig(PARENT_DIED)
        .map_err(|source| CliError::Os { what: "cannot set the parent-death signal", source })?;
    if getppid() != parent {
        // The runner died before the parent-death signal was set.
        return Ok(1);
    }
    // Before the command starts, so that it does not inherit the pipe.
    let mut control = match control_fd {
        Some(fd) => Control::open(fd).map_err(|e| CliError::io("cannot read the runner's control pipe", e))?,
        None => Control::none(),
    };
    // Started ahead, it waits for the word, without a timer: the end of the
    // pipe (whose write end only the runner holds) says that the runner let it
    // go or died, and the parent-death signal says the latter too. Signals
    // are dropped meanwhile, and those pending at the word with them: there
    // is no tree to stop, and one that came early must not stop the command
    // about to start. The runner asks for its stops in the pipe, after the
    // word ([`Word::Stop`]), and the pipe's end (the runner gone, or done
    // with this command) kills the tree, so nothing of its is lost.
    let env = loop {
        tokio::select! {
            biased;
            go = control.go() => match go {
                Ok(Some(env)) => break env,
                // The runner let this supervisor go.
                Ok(None) => return Ok(0),
                Err(e) => return Err(CliError::io("cannot read the runner's control pipe", e)),
            },
            _ = term.recv() => {}
            _ = kill_now.recv() => {}
            _ = parent_died.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {}
        }
        if getppid() != parent {
            return Ok(1);
        }
    };
    // A signal whose handler ran as the word came is in once the runtime has
    // polled its driver again, which it does before it resumes a task that
    // yielded.
    tokio::task::yield_now().await;
    for s in [&mut term, &mut kill_now, &mut int, &mut hup] {
        while let Some(Some(())) = s.recv().now_or_never() {}
    }
    let mut check = tokio::time::interval(PARENT_CHECK);
    let main = {
        use std::os::unix::process::CommandExt;
        match std::process::Command::new(program).args(args).envs(env).process_group(0).spawn() {
            Ok(child) => Pid::from_raw(
                i32::try_from(child.id())
                    .map_err(|e| CliError::io("bad pid", std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?,
            ),
            Err(e) => {
                eprintln!("mongocoord: cannot run {program:?}: {e}");
                return Ok(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 });
            }
        }
    };
    tracing::debug!(pid = main.as_raw(), ?program, "command started in its own process group");
    let mut tree = Tree::new(main);
    let mut kill_at: Option<Instant> = None;
    // The lease's deadline as the runner last told it.
    let mut lease: Option<Instant> = None;
    loop {
        let mut terminate = false;
        tokio::select! {
            _ = chld.recv() => {}
            _ = term.recv() => terminate = true,
            _ = kill_now.recv() => {
                tracing::debug!("told to kill the command's tree");
                break;
            }
            _ = parent_died.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {}
            _ = check.tick() => {}
            _ = sleep_until(kill_at) => {
                tracing::debug!("grace period over: killing the command's tree");
                break;
            }
            word = control.next() => match word {
                Word::Deadline(at) => lease = Some(at),
                Word::Stop(Stop::Term) => terminate = true,
                Word::Stop(Stop::Kill) => {
                    tracing::debug!("told to kill the command's tree");
                    break;
                }
            },
            _ = sleep_until(lease.map(|d| d.checked_sub(grace).unwrap_or(d))), if kill_at.is_none() => {
                tracing::info!("less than the grace period of the lease is left: SIGTERM to the command's tree");
                terminate = true;
            }
            _ = sleep_until(lease) => {
                tracing::warn!("the lease's deadline came: killing the command's tree");
                break;
            }
        }
        if getppid() != parent {
            tracing::warn!("the runner died: killing the command's tree");
            break;
        }
        if tree.reap() == Left::None {
            return Ok(tree.main_status().unwrap_or(1));
        }
        // Leftovers of a main process that ended are terminated like the rest.
        if (terminate || tree.main_status().is_some()) && kill_at.is_none() {
            tree.signal(Signal::SIGTERM);
            // Never past the lease's deadline.
            let after_grace = Instant::now() + grace;
            kill_at = Some(lease.map_or(after_grace, |d| d.min(after_grace)));
        }
    }
    tree.kill_all().await;
    Ok(tree.main_status().unwrap_or(128 + Signal::SIGKILL as u8))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_prctl_sets_is_the_name() {
        assert_eq!(NAME_C.to_str(), Ok(NAME));
    }
}
