//! Running a command under a lease, with its whole process tree.
//!
//! The runner does not start the command itself: it starts a supervisor, this
//! same binary as `mongocoord supervise` (module `supervisor`), which starts the
//! command in a new process group, is a child subreaper, and kills the whole tree
//! when the runner dies, even by SIGKILL. The runner stops the command through
//! it: SIGTERM to the group, then SIGKILL after the grace period, or SIGKILL at
//! once; it learns that the tree is gone (and reaped) when the supervisor exits,
//! and only then releases the lock, the leadership, or records a task's outcome.
//!
//! The supervisor handles every signal it can (module `supervisor`), so only
//! SIGKILL (or SIGSEGV, SIGILL, SIGFPE), or a crash of its own, ends it before
//! its tree. Then the runner, a child subreaper too, adopts what is left of the
//! tree, kills it and reaps it before it lets anything go ([`adopted`]).
//!
//! [`Stops`] says when to stop: on a signal, when the lease's confirmed time
//! drops below the grace period ([`mongolock::Validity::expiring`]), and at the
//! latest when the lease counts as lost.

mod adopted;
mod capture;
mod control;
mod supervisor;
mod timing;
mod tree;

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) use capture::{Captured, STDOUT_LIMIT};
pub(crate) use supervisor::{before_runtime as before_supervisor_runtime, run as supervisor};
pub(crate) use timing::grace;

/// How long output is still read after the supervisor exited. Every process that
/// could write to the pipes is gone by then (the runner kills what a killed
/// supervisor left), unless a descendant escaped the tree with them.
const DRAIN: Duration = Duration::from_secs(1);

/// How long a supervisor told to kill the command's tree may take to exit
/// before the runner kills it, and with it the tree (it is the subreaper the
/// tree comes back to, [`adopted`]), when the lease is lost: a supervisor that
/// is hung acts on nothing, not even its own deadline, and the lease lapses on
/// the server a safety margin (a tenth of the ttl, from 5 ms to 2 s) after it
/// counts as lost here; this fits that margin from a ttl of 1 s up. One that
/// is stopped (SIGSTOP) is killed at once. A running supervisor may take
/// longer than this (a large process's exit, a process in uninterruptible
/// sleep): the runner then goes on killing the tree itself, to the same end.
const UNHEEDED_LEASE_LOST: Duration = Duration::from_millis(100);

/// The same, for a kill that is not about the lease (the grace period after
/// a stop asked for ran out).
const UNHEEDED: Duration = Duration::from_secs(1);

/// What to run, and how.
#[derive(Debug, Clone)]
pub(crate) struct Spec<'a> {
    /// The command and its arguments.
    pub(crate) argv: &'a [String],
    /// Extra environment (`MONGOCOORD_FENCE`, ...).
    pub(crate) env: Vec<(&'static str, String)>,
    /// Fed to the command's stdin (else it inherits the runner's).
    pub(crate) stdin: Option<Vec<u8>>,
    /// Capture stdout (up to [`STDOUT_LIMIT`]) and the end of stderr.
    pub(crate) capture: bool,
    /// Between SIGTERM and SIGKILL.
    pub(crate) grace: Duration,
    /// Keep the runner's `MONGO_*` / `MONGODB_*` variables in the command's environment.
    pub(crate) pass_env: bool,
    /// Variables of the runner's environment the command does not inherit
    /// (a task's command is handed its run's trace, never the runner's).
    pub(crate) unset: &'static [&'static str],
}

/// Why a command was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// The runner got SIGTERM or SIGINT.
    Signal,
    /// The lease's confirmed time fell below the grace period.
    LeaseAtRisk,
    /// The lease was lost.
    LeaseLost,
    /// The task's execution timeout passed.
    TimedOut,
    /// Its stdout went past [`STDOUT_LIMIT`].
    Output,
    /// Its supervisor was killed (SIGKILL): the runner killed the tree itself.
    SupervisorKilled,
}

/// When to stop a command: gracefully (SIGTERM, then SIGKILL after the grace
/// period) or at once (SIGKILL). The first reason is kept. Dropping it stops the
/// watchers it started.
#[derive(Debug, Default)]
pub(crate) struct Stops {
    terminate: CancellationToken,
    kill: CancellationToken,
    why: Arc<Mutex<Option<Why>>>,
    watchers: Vec<JoinHandle<()>>,
    /// The lease and the grace period, told to the supervisor as well.
    lease: Option<(mongolock::Validity, Duration)>,
}

impl Stops {
    /// Nothing stops the command yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn note(why: &Mutex<Option<Why>>, reason: Why) {
        why.lock().get_or_insert(reason);
    }

    fn watch(&mut self, fire: impl std::future::Future<Output = Why> + Send + 'static, hard: bool) {
        let (why, token) = (self.why.clone(), if hard { self.kill.clone() } else { self.terminate.clone() });
        self.watchers.push(tokio::spawn(async move {
            let reason = fire.await;
            Self::note(&why, reason);
            token.cancel();
        }));
    }

    /// Stops gracefully when `token` is cancelled.
    pub(crate) fn terminate_on(&mut self, token: &CancellationToken, why: Why) {
        let t = token.clone();
        self.watch(
            async move {
                t.cancelled().await;
                why
            },
            false,
        );
    }

    /// Stops at once when `token` is cancelled.
    pub(crate) fn kill_on(&mut self, token: &CancellationToken, why: Why) {
        let t = token.clone();
        self.watch(
            async move {
                t.cancelled().await;
                why
            },
            true,
        );
    }

    /// Stops gracefully once less than `grace` of the lease is confirmed, and at
    /// once when it counts as lost (its local deadline, which comes before the
    /// lease can lapse on the server). The supervisor is told each renewal and
    /// does the same by itself, a little earlier, should the runner be stopped
    /// or hung ([`control`]).
    pub(crate) fn lease(&mut self, validity: mongolock::Validity, grace: Duration) {
        self.lease = Some((validity.clone(), grace));
        let v = validity.clone();
        self.watch(
            async move {
                v.expiring(grace).await;
                if v.is_lost() {
                    Why::LeaseLost
                } else {
                    Why::LeaseAtRisk
                }
            },
            false,
        );
        self.watch(
            async move {
                validity.expiring(Duration::ZERO).await;
                Why::LeaseLost
            },
            true,
        );
    }

    fn why(&self) -> Option<Why> {
        *self.why.lock()
    }

    /// A stop already due (the term ended, the lease is at risk, the runner
    /// was told to stop): the command is not started at all, and this is
    /// what it did.
    fn not_started(&self) -> Option<Finished> {
        use std::os::unix::process::ExitStatusExt;
        let why = self.due()?;
        Self::note(&self.why, why);
        tracing::info!(?why, "the command is not started: its stop is due already");
        let sig = if why == Why::Signal { Signal::SIGTERM } else { Signal::SIGKILL };
        let status = ExitStatus::from_raw(sig as i32);
        Some(Finished { status, stopped: Some(why), stdout: Captured::default(), stderr: Captured::default() })
    }

    /// Why the command must stop already, before it starts: a stop asked
    /// for, or a lease with less than the grace period confirmed.
    fn due(&self) -> Option<Why> {
        if self.kill.is_cancelled() || self.terminate.is_cancelled() {
            return Some(self.why().unwrap_or(Why::Signal));
        }
        let (validity, grace) = self.lease.as_ref()?;
        if validity.is_lost() {
            Some(Why::LeaseLost)
        } else if validity.remaining() <= *grace {
            Some(Why::LeaseAtRisk)
        } else {
            None
        }
    }
}

impl Drop for Stops {
    fn drop(&mut self) {
        for w in &self.watchers {
            w.abort();
        }
    }
}

/// What a supervised command did. Its whole process tree is gone and reaped.
#[derive(Debug)]
pub(crate) struct Finished {
    /// The main process's exit status (as the supervisor reports it).
    pub(crate) status: ExitStatus,
    /// Why it was stopped, if it was.
    pub(crate) stopped: Option<Why>,
    /// Its stdout, when captured.
    pub(crate) stdout: Captured,
    /// The end of its stderr, when captured.
    pub(crate) stderr: Captured,
}

impl Finished {
    /// The end of stderr as text.
    pub(crate) fn stderr_tail(&self) -> String {
        String::from_utf8_lossy(&self.stderr.bytes).trim().to_owned()
    }
}

/// Variables that tell how to reach the server; not passed on without `--pass-env`.
fn is_connection_var(name: &std::ffi::OsStr) -> bool {
    name.to_str().is_some_and(|n| n.starts_with("MONGO_") || n.starts_with("MONGODB_"))
}

/// This binary: `/proc/self/exe` still names it if the file was replaced since.
fn this_binary() -> std::io::Result<std::path::PathBuf> {
    let proc = std::path::Path::new("/proc/self/exe");
    if proc.exists() {
        Ok(proc.to_owned())
    } else {
        std::env::current_exe()
    }
}

/// The supervisor process, as the runner holds it. Dropped before it exited (a
/// drain timeout aborting a task, say), it has the tree killed.
#[derive(Debug)]
struct Job {
    child: tokio::process::Child,
    /// Counts it as live, not as an orphan to kill, until it was reaped.
    live: Option<adopted::Live>,
}

impl Job {
    /// When the supervisor, just told to kill the tree, must have exited:
    /// now if it is stopped (it acts on nothing until continued), else after
    /// [`UNHEEDED_LEASE_LOST`] or [`UNHEEDED`].
    fn heed_by(&self, stops: &Stops) -> Instant {
        let stopped = self.child.id().and_then(|id| i32::try_from(id).ok()).is_some_and(tree::is_stopped);
        let lost = stops.lease.as_ref().is_some_and(|(v, _)| v.is_lost());
        Instant::now()
            + match (stopped, lost) {
                (true, _) => Duration::ZERO,
                (false, true) => UNHEEDED_LEASE_LOST,
                (false, false) => UNHEEDED,
            }
    }

    fn send(&self, sig: Signal) {
        // `id` is `None` once the supervisor was reaped: its pid may be reused.
        if let Some(pid) = self.child.id().and_then(|id| i32::try_from(id).ok()) {
            let _ = kill(Pid::from_raw(pid), sig);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.send(supervisor::KILL_NOW);
    }
}

/// Runs `spec` under a supervisor until its whole tree is gone, stopping it as
/// `stops` says.
pub(crate) async fn run(spec: Spec<'_>, stops: &Stops) -> std::io::Result<Finished> {
    if let Some(finished) = stops.not_started() {
        return Ok(finished);
    }
    Standby::start(spec).run(Vec::new(), stops).await
}

/// A supervisor started ahead of its command, waiting for the word to start it
/// ([`control`]): a runner that will run the command when elected, or when a
/// lock is free, starts one while it waits, so that the supervisor's own start
/// (an exec of this binary, a runtime, its signal handlers: most of a
/// handover's time) is not between the election and the command. Dropped
/// without [`run`](Self::run), it exits (its pipe closes) and has no tree.
#[derive(Debug)]
pub(crate) struct Standby<'a> {
    spec: Spec<'a>,
    started: Option<(Job, control::Pipe)>,
}

impl<'a> Standby<'a> {
    /// Starts a supervisor for `spec`. One that cannot be started now is
    /// started by [`run`](Self::run), which reports why it cannot.
    pub(crate) fn start(spec: Spec<'a>) -> Self {
        let started = match spawn(&spec) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::debug!(error = %e, "cannot start a supervisor ahead; one is started with the command");
                None
            }
        };
        Standby { spec, started }
    }

    /// Starts the command with `env` added to the spec's environment, and
    /// runs it until its whole tree is gone, stopping it as `stops` says. A
    /// supervisor that ended while it waited (it was killed) is replaced.
    pub(crate) async fn run(mut self, env: Vec<(&'static str, String)>, stops: &Stops) -> std::io::Result<Finished> {
        if let Some(finished) = stops.not_started() {
            return Ok(finished);
        }
        let lease = || stops.lease.clone();
        let given = match self.started.take() {
            Some((mut job, pipe)) => match job.child.try_wait() {
                Ok(None) => pipe.go(&env, lease()).map(|feed| (job, feed)).ok(),
                _ => None,
            },
            None => None,
        };
        if given.is_none() {
            tracing::debug!("no supervisor waits for this command: one is started with it");
        }
        let (mut job, feed) = match given {
            Some(given) => given,
            None => {
                let (job, pipe) = spawn(&self.spec)?;
                (job, pipe.go(&env, lease())?)
            }
        };
        supervise(&mut self.spec, &mut job, feed, stops).await
    }
}

/// Spawns a supervisor for `spec`, waiting for the word on its control pipe.
fn spawn(spec: &Spec<'_>) -> std::io::Result<(Job, control::Pipe)> {
    if spec.argv.is_empty() {
        return Err(std::io::Error::other("no command given"));
    }
    // Should the supervisor die before its tree, the tree comes back here.
    adopted::become_subreaper()?;
    let mut pipe = control::Pipe::new()?;
    let mut cmd = tokio::process::Command::new(this_binary()?);
    // Its own process group: a Ctrl-Z or SIGSTOP to the runner's group does not
    // stop it, so it still enforces the lease's deadline. (Ctrl-C reaches the
    // runner, which tells it.) Its own name, so that `pkill mongocoord`, meant
    // for runners, does not hit it (it sets its comm too).
    cmd.arg0(supervisor::NAME)
        .process_group(0)
        .args(["supervise", "--parent", &std::process::id().to_string()])
        .args(["--grace-ms", &spec.grace.as_millis().to_string()])
        .args(["--control-fd", &pipe.fd().to_string()]);
    cmd.arg("--").args(spec.argv);
    if !spec.pass_env {
        for (name, _) in std::env::vars_os().filter(|(n, _)| is_connection_var(n)) {
            cmd.env_remove(name);
        }
    }
    // Which runner the command runs under, for scripts (and the bench) that
    // must tell runners apart: its parent is the supervisor, not the runner.
    cmd.env("MONGOCOORD_RUNNER_PID", std::process::id().to_string());
    for name in spec.unset {
        cmd.env_remove(name);
    }
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    cmd.stdin(if spec.stdin.is_some() { Stdio::piped() } else { Stdio::inherit() });
    if spec.capture {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let (child, live) = control::spawn(&mut cmd, &mut pipe)?;
    Ok((Job { child, live: Some(live) }, pipe))
}

/// The command, told to start through `feed`, run until its whole tree is gone
/// (its stdin payload is handed to it, not copied).
async fn supervise(
    spec: &mut Spec<'_>,
    job: &mut Job,
    feed: control::Feed,
    stops: &Stops,
) -> std::io::Result<Finished> {
    if let (Some(data), Some(mut pipe)) = (spec.stdin.take(), job.child.stdin.take()) {
        tokio::spawn(async move {
            let _ = pipe.write_all(&data).await;
        });
    }
    let overflow = CancellationToken::new();
    let stop_reading = CancellationToken::new();
    let read = |pipe: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>, keep, on_overflow| {
        let done = stop_reading.clone();
        tokio::spawn(async move {
            match pipe {
                Some(p) => capture::read(p, keep, on_overflow, done).await,
                None => Captured::default(),
            }
        })
    };
    let out =
        read(job.child.stdout.take().map(|p| Box::new(p) as _), capture::Keep::Head(STDOUT_LIMIT), overflow.clone());
    let err = read(
        job.child.stderr.take().map(|p| Box::new(p) as _),
        capture::Keep::Tail(capture::STDERR_TAIL),
        CancellationToken::new(),
    );
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    // A stop the pipe did not take (full: the supervisor does not read),
    // asked again until it does; a signal could come before the word and be
    // dropped with the stray ones.
    let mut unsent: Option<control::Stop> = None;
    // When a supervisor told to kill that has not exited is killed itself
    // (stopped, or hung), and the tree with it by this process.
    let mut unheeded_at: Option<Instant> = None;
    let ask = |how: control::Stop, unsent: &mut Option<control::Stop>| {
        if !feed.stop(how) {
            *unsent = Some(unsent.map_or(how, |u| u.max(how)));
        }
    };
    let status = loop {
        let graceful = kill_at.is_none() && !killed;
        tokio::select! {
            s = job.child.wait() => break s?,
            _ = stops.terminate.cancelled(), if graceful => {
                tracing::info!(why = ?stops.why(), grace = ?spec.grace, "stopping the command: SIGTERM to its process tree");
                ask(control::Stop::Term, &mut unsent);
                kill_at = Some(Instant::now() + spec.grace);
            }
            _ = overflow.cancelled(), if graceful => {
                Stops::note(&stops.why, Why::Output);
                tracing::info!(limit = STDOUT_LIMIT, "stopping the command: too much output");
                ask(control::Stop::Term, &mut unsent);
                kill_at = Some(Instant::now() + spec.grace);
            }
            _ = sleep_until(kill_at), if !killed => {
                tracing::info!("grace period over: SIGKILL to the command's process tree");
                ask(control::Stop::Kill, &mut unsent);
                killed = true;
                unheeded_at = Some(job.heed_by(stops));
            }
            _ = stops.kill.cancelled(), if !killed => {
                tracing::info!(why = ?stops.why(), "SIGKILL to the command's process tree");
                ask(control::Stop::Kill, &mut unsent);
                killed = true;
                unheeded_at = Some(job.heed_by(stops));
            }
            _ = tokio::time::sleep(control::POLL), if unsent.is_some() => {
                if let Some(how) = unsent.take() {
                    ask(how, &mut unsent);
                }
            }
            _ = sleep_until(unheeded_at) => {
                tracing::warn!("the supervisor has not ended the command's tree since it was told to kill it: the runner kills the supervisor, then the tree");
                job.send(Signal::SIGKILL);
                unheeded_at = None;
            }
        }
    };
    // Reaped: from now on a child of this process with its pid is an orphan.
    job.live = None;
    // Whether the supervisor's own deadline came, before the runner's.
    let supervisor_acted = feed.supervisor_acted();
    drop(feed);
    // A supervisor exits by itself only once its tree is reaped; one that was
    // killed (by SIGKILL, say) or crashed left it to this process. It is killed
    // and reaped here, before anything is let go; the lease is renewed meanwhile.
    let killed_by = {
        use std::os::unix::process::ExitStatusExt;
        status.signal()
    };
    if let Some(sig) = killed_by {
        tracing::warn!(signal = sig, "the command's supervisor was killed: the runner kills its tree");
    }
    // Orphans found here may be another command's, whose supervisor died too
    // (`agent --concurrency`): they are killed all the same, and that command's
    // runner waits for them as well.
    adopted::kill_orphans().await;
    if killed_by.is_some() {
        Stops::note(&stops.why, Why::SupervisorKilled);
    }
    let timer = {
        let stop_reading = stop_reading.clone();
        tokio::spawn(async move {
            tokio::time::sleep(DRAIN).await;
            stop_reading.cancel();
        })
    };
    let stdout = out.await.unwrap_or_default();
    let stderr = err.await.unwrap_or_default();
    timer.abort();
    let mut stopped = if kill_at.is_some() || killed || killed_by.is_some() {
        Some(stops.why().unwrap_or(Why::Signal))
    } else {
        None
    };
    if stopped.is_none() && supervisor_acted {
        // The supervisor stopped the tree on the lease's deadline before the
        // runner did (it acts a little earlier).
        let lost = stops.lease.as_ref().is_some_and(|(v, _)| v.is_lost());
        tracing::info!(lost, "the supervisor stopped the command: the lease was at risk");
        stopped = Some(if lost { Why::LeaseLost } else { Why::LeaseAtRisk });
    }
    Ok(Finished { status, stopped, stdout, stderr })
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A shell-style exit code: the command's code, or 128 + the signal.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}

/// Fires on the first SIGTERM or SIGINT. A second one ends the process at once
/// (status 128 + the signal); the supervisors then kill their trees, since
/// their parent died.
pub(crate) fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        let first = next_signal(&mut term, &mut int).await;
        tracing::info!(signal = %first, "stopping: the command gets SIGTERM, then SIGKILL after the grace period");
        t.cancel();
        let second = next_signal(&mut term, &mut int).await;
        eprintln!("mongocoord: second {second}: exiting now; the command's process tree is killed");
        // The supervisors kill their trees when this process dies; what a dead
        // supervisor left here gets SIGKILL now, as this process cannot wait.
        adopted::kill_round();
        std::process::exit(128 + second as i32);
    });
    token
}

async fn next_signal(term: &mut tokio::signal::unix::Signal, int: &mut tokio::signal::unix::Signal) -> Signal {
    tokio::select! {
        _ = term.recv() => Signal::SIGTERM,
        _ = int.recv() => Signal::SIGINT,
    }
}
