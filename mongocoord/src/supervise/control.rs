//! The control pipe from a runner to its supervisor: the word to start the
//! command, then the lease's deadline after each renewal.
//!
//! The runner passes the read end of a pipe to the supervisor (an inherited
//! file descriptor, `--control-fd`). A supervisor is started before its
//! command is due ([`super::Standby`]: an elector's follower, a lock's
//! waiter), so that its start (an exec, a runtime, its signal handlers) is not
//! on the path from election to command; it waits for the first line, `go`
//! and the command's last environment variables (the term's fence, known only
//! then) as JSON, and starts the command.
//!
//! Then, for a command under a lease, one line per confirmed renewal: the
//! lease's local deadline as an absolute `CLOCK_MONOTONIC` time in
//! microseconds (runner and supervisor share that clock, and an absolute time
//! does not go late while a message waits in the pipe), the first in the same
//! write as `go`. The supervisor sends SIGTERM to the tree the grace period
//! before that deadline (less [`ALLOWANCE`]) and SIGKILL at it, unless a
//! later deadline arrives first; so a runner that is stopped (SIGSTOP,
//! Ctrl-Z) or hung, and cannot renew or signal, does not leave the command
//! running past its lease.
//!
//! And the runner's own requests to stop the command: `term` (SIGTERM to the
//! tree, SIGKILL after the grace period) and `kill` (SIGKILL now). Told in
//! the pipe, they come after `go`, in order; a signal sent just after the
//! word could be taken with one that came before it, which the supervisor
//! drops at the word ([`super::supervisor`]). A line the pipe will not take
//! (the supervisor does not read) is asked again; the end of the pipe, the
//! runner gone or done with the command, is a kill.

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
pub(crate) const POLL: Duration = Duration::from_millis(20);

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

/// The runner's end once the word to start was given: passes each confirmed
/// renewal's deadline on.
#[derive(Debug)]
pub(crate) struct Feed {
    sent: Arc<Mutex<Sent>>,
    grace: Duration,
    task: Option<JoinHandle<()>>,
    write: Arc<Mutex<std::fs::File>>,
}

/// A request from the runner, after the word to start; a kill outranks a
/// termination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stop {
    /// SIGTERM to the tree, SIGKILL after the grace period.
    Term,
    /// SIGKILL to the tree now.
    Kill,
}

/// A control pipe made for a supervisor; its read end is inherited by the
/// supervisor when spawned ([`spawn`]).
#[derive(Debug)]
pub(crate) struct Pipe {
    read: Option<OwnedFd>,
    write: std::fs::File,
}

/// The longest `go` line: a pipe takes a write of up to `PIPE_BUF` (4 KiB on
/// Linux) whole or not at all, so the non-blocking write never splits it.
const GO_MAX: usize = 4096;

impl Pipe {
    /// A new pipe, both ends close-on-exec; the write end does not block.
    pub(crate) fn new() -> std::io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        Ok(Pipe { read: Some(read), write: std::fs::File::from(write) })
    }

    /// The number of the read end, for the supervisor's `--control-fd`.
    pub(crate) fn fd(&self) -> i32 {
        self.read.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Tells the supervisor to start its command with `env` added, and (with
    /// `lease`: its validity and the grace period) passes each renewal's
    /// deadline on from now until the [`Feed`] is dropped. Fails with
    /// `BrokenPipe` when the supervisor is gone (it exited before the word).
    pub(crate) fn go(
        mut self,
        env: &[(&'static str, String)],
        lease: Option<(mongolock::Validity, Duration)>,
    ) -> std::io::Result<Feed> {
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let json = serde_json::to_string(&pairs).map_err(std::io::Error::other)?;
        let mut line = format!("go {json}\n");
        let sent = Arc::new(Mutex::new(Sent::default()));
        if let Some((validity, _)) = &lease {
            let now = monotonic_now();
            let deadline = now + validity.remaining();
            line.push_str(&format!("{}\n", deadline.as_micros()));
            sent.lock().deadline = Some(deadline);
        }
        if line.len() > GO_MAX {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the command's variables are too long"));
        }
        self.write.write_all(line.as_bytes())?;
        let grace = lease.as_ref().map_or(Duration::ZERO, |(_, g)| *g);
        let write = Arc::new(Mutex::new(self.write));
        let task = lease.map(|(validity, grace)| {
            let (sent, write) = (sent.clone(), write.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(POLL).await;
                    send(&mut write.lock(), &validity, &sent, grace);
                }
            })
        });
        Ok(Feed { sent, grace, task, write })
    }
}

impl Feed {
    /// Tells the supervisor to stop the command; false if the pipe did not
    /// take it (the supervisor is gone, or does not read and its pipe is
    /// full), and the caller asks again later.
    pub(crate) fn stop(&self, how: Stop) -> bool {
        let line: &[u8] = match how {
            Stop::Term => b"term\n",
            Stop::Kill => b"kill\n",
        };
        self.write.lock().write_all(line).is_ok()
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
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// A supervisor just spawned, counted as live until the [`Live`] is dropped.
pub(crate) type Spawned = (tokio::process::Child, Live);

/// Spawns `cmd` (the supervisor, given `--control-fd` [`Pipe::fd`]) with the
/// pipe's read end inherited (not close-on-exec), and closes that end here.
/// Every supervisor is spawned through here, so none inherits another's pipe,
/// and each is recorded as live ([`super::adopted::spawn`]).
pub(crate) fn spawn(cmd: &mut tokio::process::Command, pipe: &mut Pipe) -> std::io::Result<Spawned> {
    let _one_at_a_time = SPAWN.lock();
    let fd = pipe.read.take().ok_or_else(|| std::io::Error::other("the control pipe was handed on already"))?;
    fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
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
    // Non-blocking: a supervisor that does not read misses deadlines (the last
    // it read, an earlier one, stays in force), and a line is shorter than
    // PIPE_BUF, so it is written whole or not at all.
    if write.write_all(format!("{}\n", deadline.as_micros()).as_bytes()).is_ok() {
        tracing::trace!(remaining = ?deadline.saturating_sub(now), "lease deadline passed on to the supervisor");
        sent.deadline = Some(deadline);
    }
}

/// The supervisor's end: the word to start, then the deadlines the runner
/// sends.
pub(crate) struct Control(Option<Lines<BufReader<pipe::Receiver>>>);

impl Control {
    /// No pipe: the command starts at once, and no deadline is ever received.
    pub(crate) fn none() -> Self {
        Control(None)
    }

    /// Opens the inherited pipe `fd` (anew, close-on-exec) and closes `fd`, so
    /// that the command does not inherit it.
    pub(crate) fn open(fd: i32) -> std::io::Result<Self> {
        let receiver = pipe::OpenOptions::new().open_receiver(format!("/proc/self/fd/{fd}"))?;
        nix::unistd::close(fd)?;
        Ok(Control(Some(BufReader::new(receiver).lines())))
    }

    /// Waits for the word to start: the variables to add to the command's
    /// environment, or `None` if the runner closed the pipe without it (it
    /// no longer needs this supervisor). At once, with no variable, without a
    /// pipe.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe ([`Lines::next_line`] is).
    pub(crate) async fn go(&mut self) -> std::io::Result<Option<Vec<(String, String)>>> {
        let Some(lines) = &mut self.0 else { return Ok(Some(Vec::new())) };
        let Some(line) = lines.next_line().await? else { return Ok(None) };
        let json = line.strip_prefix("go ").ok_or_else(|| bad(&line))?;
        serde_json::from_str(json).map(Some).map_err(|_| bad(&line))
    }

    /// The runner's next word after `go`: a deadline (as an instant of this
    /// process's clock less [`ALLOWANCE`]) or a request to stop; a kill when
    /// the runner's end is closed, and pending forever after that.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe ([`Lines::next_line`] is).
    pub(crate) async fn next(&mut self) -> Word {
        loop {
            let Some(lines) = &mut self.0 else { return std::future::pending().await };
            match lines.next_line().await {
                Ok(Some(line)) => match line.trim() {
                    "term" => return Word::Stop(Stop::Term),
                    "kill" => return Word::Stop(Stop::Kill),
                    other => {
                        let Ok(micros) = other.parse::<u64>() else {
                            tracing::warn!(line, "not a word of the runner's: ignored");
                            continue;
                        };
                        let left = Duration::from_micros(micros).saturating_sub(monotonic_now());
                        return Word::Deadline(Instant::now() + left.saturating_sub(ALLOWANCE));
                    }
                },
                // Only the runner holds the write end, and it closes it only
                // once this process exited, or when it died or gave up the
                // command: kill the tree.
                Ok(None) | Err(_) => {
                    self.0 = None;
                    return Word::Stop(Stop::Kill);
                }
            }
        }
    }
}

/// What the runner says after `go`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Word {
    /// The lease's deadline, after a renewal.
    Deadline(Instant),
    /// Stop the command.
    Stop(Stop),
}

fn bad(line: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not the word to start: {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    /// A pipe and the supervisor's end of it.
    fn both() -> (Pipe, Control) {
        let mut pipe = Pipe::new().unwrap();
        let fd = pipe.read.take().unwrap().into_raw_fd();
        (pipe, Control::open(fd).unwrap())
    }

    #[tokio::test]
    async fn the_word_to_start_carries_the_variables_whole() {
        let (pipe, mut control) = both();
        let env = vec![("MONGOCOORD_FENCE", "7".to_owned()), ("ODD", "a\nb \"c\" = ü".to_owned())];
        let _feed = pipe.go(&env, None).unwrap();
        let got = control.go().await.unwrap().unwrap();
        let want: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_pipe_closed_without_the_word_lets_the_supervisor_go() {
        let (pipe, mut control) = both();
        drop(pipe);
        assert!(control.go().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn variables_too_long_for_one_write_are_refused() {
        let (pipe, _control) = both();
        let env = vec![("LONG", "x".repeat(GO_MAX))];
        let e = pipe.go(&env, None).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }

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
