//! The lease deadline, told by the runner to its supervisor, so that the
//! supervisor stops the command by itself when the runner cannot (stopped by
//! SIGSTOP or Ctrl-Z, or hung) before the lease can lapse on the server.
//!
//! The runner passes the read end of a pipe to the supervisor (an inherited
//! file descriptor, `--deadline-fd`) and writes one line per confirmed renewal:
//! the lease's local deadline as an absolute `CLOCK_MONOTONIC` time in
//! microseconds (runner and supervisor share that clock, and an absolute time
//! does not go late while a message waits in the pipe). The supervisor sends
//! SIGTERM to the tree the grace period before that deadline (less
//! [`ALLOWANCE`]) and SIGKILL at it, unless a later deadline arrives first.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::time::{clock_gettime, ClockId};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::unix::pipe;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::adopted::Live;

/// How much earlier than the runner's local deadline the supervisor acts: it
/// comes first, and its SIGKILL is in before the runner's own.
pub(crate) const ALLOWANCE: Duration = Duration::from_millis(10);

/// How often the runner looks for a renewal to pass on (a read of the lease's
/// state; a message goes out only when the deadline moved on).
const POLL: Duration = Duration::from_millis(20);

/// Only one supervisor is spawned at a time: the read end of its pipe is
/// inheritable only meanwhile, so no other child gets it.
static SPAWN: Mutex<()> = Mutex::new(());

/// Now on `CLOCK_MONOTONIC`, the clock of [`std::time::Instant`] on Linux.
fn monotonic_now() -> Duration {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map(Duration::from).unwrap_or_default()
}

/// What the runner passed on, and whether the supervisor's own timer may have
/// fired (then the command was stopped because of the lease).
#[derive(Debug, Default)]
struct Sent {
    deadline: Option<Duration>,
    supervisor_acted: bool,
}

impl Sent {
    /// Whether the supervisor, holding the last deadline sent, sends SIGTERM
    /// (or sent it already) by `now`.
    fn check(&mut self, now: Duration, grace: Duration) {
        if self.deadline.is_some_and(|d| now + ALLOWANCE + grace >= d) {
            self.supervisor_acted = true;
        }
    }
}

/// The runner's end: passes each confirmed renewal's deadline on.
#[derive(Debug)]
pub(crate) struct Feed {
    sent: Arc<Mutex<Sent>>,
    grace: Duration,
    task: JoinHandle<()>,
}

/// A pipe made for a supervisor not spawned yet.
#[derive(Debug)]
pub(crate) struct Prepared {
    read: OwnedFd,
    write: std::fs::File,
    validity: mongolock::Validity,
    grace: Duration,
    sent: Arc<Mutex<Sent>>,
}

impl Prepared {
    /// A pipe for `validity`'s deadlines; the first is in it at once, before
    /// the supervisor starts.
    pub(crate) fn new(validity: mongolock::Validity, grace: Duration) -> std::io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let mut write = std::fs::File::from(write);
        let sent = Arc::new(Mutex::new(Sent::default()));
        send(&mut write, &validity, &sent, grace);
        Ok(Prepared { read, write, validity, grace, sent })
    }

    /// The number of the read end, for the supervisor's `--deadline-fd`.
    pub(crate) fn fd(&self) -> i32 {
        self.read.as_raw_fd()
    }
}

impl Feed {
    /// Spawns `cmd` (the supervisor, given `--deadline-fd` [`Prepared::fd`])
    /// with the read end, and passes each renewal's deadline on until dropped.
    pub(crate) fn spawn(cmd: &mut tokio::process::Command, prepared: Prepared) -> std::io::Result<(Spawned, Self)> {
        let Prepared { read, mut write, validity, grace, sent } = prepared;
        let child = spawn_with(cmd, Some(read))?;
        let task = tokio::spawn({
            let sent = sent.clone();
            async move {
                loop {
                    tokio::time::sleep(POLL).await;
                    send(&mut write, &validity, &sent, grace);
                }
            }
        });
        Ok((child, Feed { sent, grace, task }))
    }

    /// Whether the supervisor's own deadline came (it sent SIGTERM): the
    /// runner's last word, once the supervisor exited.
    pub(crate) fn supervisor_acted(&self) -> bool {
        let mut sent = self.sent.lock();
        sent.check(monotonic_now(), self.grace);
        sent.supervisor_acted
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A supervisor just spawned, counted as live until the [`Live`] is dropped.
pub(crate) type Spawned = (tokio::process::Child, Live);

/// Spawns `cmd` with `fd` inherited (not close-on-exec), and closes `fd` here.
/// Every supervisor is spawned through here, so none inherits another's pipe,
/// and each is recorded as live ([`super::adopted::spawn`]).
pub(crate) fn spawn_with(cmd: &mut tokio::process::Command, fd: Option<OwnedFd>) -> std::io::Result<Spawned> {
    let _one_at_a_time = SPAWN.lock();
    if let Some(fd) = &fd {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
    }
    let spawned = super::adopted::spawn(cmd);
    drop(fd);
    spawned
}

/// Passes the lease's deadline on if it moved (a renewal was confirmed).
fn send(write: &mut std::fs::File, validity: &mongolock::Validity, sent: &Mutex<Sent>, grace: Duration) {
    let mut sent = sent.lock();
    let now = monotonic_now();
    sent.check(now, grace);
    let deadline = now + validity.remaining();
    if sent.deadline.is_some_and(|d| deadline <= d + Duration::from_millis(1)) {
        return;
    }
    // Non-blocking: a supervisor that does not read loses only messages, and a
    // line is shorter than PIPE_BUF, so it is written whole or not at all.
    if write.write_all(format!("{}\n", deadline.as_micros()).as_bytes()).is_ok() {
        tracing::trace!(remaining = ?deadline.saturating_sub(now), "lease deadline passed on to the supervisor");
        sent.deadline = Some(deadline);
    }
}

/// The supervisor's end: the deadlines the runner sends.
pub(crate) struct Deadlines(Option<Lines<BufReader<pipe::Receiver>>>);

impl Deadlines {
    /// No deadline: nothing is ever received.
    pub(crate) fn none() -> Self {
        Deadlines(None)
    }

    /// Opens the inherited pipe `fd` (anew, close-on-exec) and closes `fd`, so
    /// that the command does not inherit it.
    pub(crate) fn open(fd: i32) -> std::io::Result<Self> {
        let receiver = pipe::OpenOptions::new().open_receiver(format!("/proc/self/fd/{fd}"))?;
        nix::unistd::close(fd)?;
        Ok(Deadlines(Some(BufReader::new(receiver).lines())))
    }

    /// The next deadline, as an instant of this process's clock less
    /// [`ALLOWANCE`]. Pending forever once the runner's end is closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe ([`Lines::next_line`] is).
    pub(crate) async fn next(&mut self) -> Instant {
        loop {
            let Some(lines) = &mut self.0 else { return std::future::pending().await };
            match lines.next_line().await {
                Ok(Some(line)) => {
                    let Ok(micros) = line.trim().parse::<u64>() else {
                        tracing::warn!(line, "not a deadline: ignored");
                        continue;
                    };
                    let left = Duration::from_micros(micros).saturating_sub(monotonic_now());
                    return Instant::now() + left.saturating_sub(ALLOWANCE);
                }
                Ok(None) | Err(_) => self.0 = None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supervisor_counts_as_acting_from_the_grace_period_before_its_deadline() {
        let s = Duration::from_secs;
        let mut sent = Sent { deadline: Some(s(100)), supervisor_acted: false };
        sent.check(s(100) - s(2) - ALLOWANCE - Duration::from_millis(1), s(2));
        assert!(!sent.supervisor_acted);
        sent.check(s(100) - s(2) - ALLOWANCE, s(2));
        assert!(sent.supervisor_acted);
        let mut none = Sent::default();
        none.check(s(100), s(2));
        assert!(!none.supervisor_acted);
    }
}
