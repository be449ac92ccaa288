//! `lock`, `elect` and `agent`: coordination for shell scripts and other languages.
//!
//! Each runs its command under a supervisor ([`crate::supervise`]): the whole
//! process tree is stopped when the lease is at risk or lost, on SIGTERM/SIGINT,
//! and when the runner dies; the lock, the leadership or the task's outcome is
//! let go of only once that tree is gone.

use std::time::Duration;

use bson::{Bson, Document};
use mongoagent::{fields, Agent, AgentBuilder, AgentCounters, NewTask, Outcome, Task};
use mongoelector::Elector;
use mongolock::{Acquire, Lock};
use store_mongo::MongoStore;
use tokio_util::sync::CancellationToken;

use crate::args::Command;
use crate::error::{CliError, Lost};
use crate::supervise::{self, exit_code, Spec, Standby, Stops, Why};

fn secs(what: &str, s: f64) -> Result<Duration, CliError> {
    crate::args::seconds(what, s, false)
}

/// What the three runners share: the lease, the grace period that fits it, and
/// the command. Checked before connecting, so bad options fail fast (status 2).
#[derive(Debug)]
pub(crate) struct Run<'a> {
    ttl: Duration,
    grace: Duration,
    pass_env: bool,
    cmd: &'a [String],
}

impl<'a> Run<'a> {
    /// The checked run of `command` under a lease of `ttl` seconds (set by
    /// `--ttl`, which errors name).
    pub(crate) fn of(command: &'a Command, ttl: f64) -> Result<Self, CliError> {
        let Command { grace, pass_env, cmd, .. } = command;
        let ttl = secs("ttl", ttl)?;
        let grace = supervise::grace("ttl", ttl, *grace)?;
        let pass_env = *pass_env;
        if cmd.is_empty() {
            return Err(CliError::invalid("no command given"));
        }
        Ok(Run { ttl, grace, pass_env, cmd })
    }

    fn spec(&self, env: Vec<(&'static str, String)>, stdin: Option<Vec<u8>>, capture: bool) -> Spec<'a> {
        Spec { argv: self.cmd, env, stdin, capture, grace: self.grace, pass_env: self.pass_env, unset: &[] }
    }

    /// The command could not be run under its supervisor.
    fn cannot_run(&self, e: std::io::Error) -> CliError {
        CliError::io(format!("cannot run {:?}", self.cmd[0]), e)
    }
}

/// `mongocoord lock KEY -- CMD`: the command's exit status; a lock not
/// acquired within `timeout` is [`mongolock::LockError::Timeout`] (status 74), a lock
/// lost while the command ran [`CliError::LockLost`] (status 75).
pub(crate) async fn lock(
    store: MongoStore,
    key: &str,
    collection: &str,
    timeout: Option<f64>,
    run: &Run<'_>,
) -> Result<u8, CliError> {
    let lock = Lock::builder(store, key).collection(collection).ttl(run.ttl).build()?;
    let signal = supervise::on_signal();
    // The supervisor starts while the lock is waited for, not after.
    let standby = Standby::start(run.spec(vec![("MONGOCOORD_KEY", key.to_owned())], None, false));
    let mut opts = Acquire::new().auto_renew();
    if let Some(t) = timeout {
        opts = opts.timeout(secs("timeout", t)?);
    }
    let guard = tokio::select! {
        r = lock.acquire_with(opts) => r?,
        _ = signal.cancelled() => return Ok(130),
    };
    tracing::info!(key, fence = guard.fence(), "lock acquired; running the command");
    let mut stops = Stops::new();
    stops.terminate_on(&signal, Why::Signal);
    stops.lease(guard.validity(), run.grace);
    let done = standby.run(vec![("MONGOCOORD_FENCE", guard.fence().to_string())], &stops).await;
    drop(stops);
    // The command's whole tree is gone (or was never started): only now is the
    // lock let go of.
    let was_lost = guard.is_lost();
    let released = guard.release().await;
    let done = done.map_err(|e| run.cannot_run(e))?;
    let lost = |how| Err(CliError::LockLost { key: key.to_owned(), how });
    match done.stopped {
        Some(Why::LeaseLost) => return lost(Lost::Killed),
        Some(Why::LeaseAtRisk) => return lost(Lost::AtRisk),
        _ if was_lost => return lost(Lost::AfterTheCommand),
        _ => {}
    }
    if let Err(source) = released {
        return Err(CliError::Release { key: key.to_owned(), source });
    }
    if done.stopped == Some(Why::SupervisorKilled) {
        eprintln!("mongocoord: lock {key}: the command's supervisor was killed; its process tree was killed first");
    }
    Ok(exit_code(done.status))
}

/// `mongocoord elect KEY -- CMD`.
pub(crate) async fn elect(store: MongoStore, key: &str, run: &Run<'_>) -> Result<u8, CliError> {
    let elector = Elector::builder(store, key).ttl(run.ttl).build()?;
    // Each term's supervisor starts while this node waits to lead, so that a
    // handover does not wait for it.
    let standby = || Standby::start(run.spec(vec![("MONGOCOORD_KEY", key.to_owned())], None, false));
    let mut first = Some(standby());
    elector.start()?;
    let signal = supervise::on_signal();
    let mut leadership = elector.leadership();
    loop {
        let waiting = first.take().unwrap_or_else(standby);
        let term = loop {
            if let Some(t) = elector.term_cancellation() {
                break t;
            }
            tokio::select! {
                _ = signal.cancelled() => {
                    elector.stop().await;
                    return Ok(0);
                }
                r = leadership.changed() => if r.is_err() { return Err(CliError::Stopped("elector")) },
            }
        };
        // The fence and the validity are the term's only if it is still on
        // after both are read: a term ends (its token cancelled) before the
        // next can begin.
        let (fence, validity) = match (elector.node_status().fence, elector.term_validity()) {
            (Some(fence), Some(v)) if !term.is_cancelled() => (fence, v),
            _ => {
                eprintln!(
                    "mongocoord: leadership of {key} ended as it began; the command was not started; campaigning again"
                );
                continue;
            }
        };
        eprintln!("mongocoord: elected leader of {key} (term {fence})");
        let mut stops = Stops::new();
        stops.terminate_on(&signal, Why::Signal);
        stops.kill_on(&term, Why::LeaseLost);
        stops.lease(validity, run.grace);
        let done = waiting.run(vec![("MONGOCOORD_FENCE", fence.to_string())], &stops).await;
        drop(stops);
        // The command's whole tree is gone: only now is leadership let go of.
        if signal.is_cancelled() {
            // Release at once so a peer takes over within milliseconds.
            elector.stop().await;
            return Ok(0);
        }
        let done = match done {
            Ok(d) => d,
            Err(e) => {
                elector.stop().await;
                return Err(run.cannot_run(e));
            }
        };
        match done.stopped {
            None => {
                // The command ended by itself: give up leadership and report its status.
                elector.stop().await;
                return Ok(exit_code(done.status));
            }
            Some(Why::SupervisorKilled) => {
                // The tree is gone; this runner ends as if the command had.
                eprintln!("mongocoord: the command's supervisor was killed; its process tree was killed first");
                elector.stop().await;
                return Ok(exit_code(done.status));
            }
            Some(Why::LeaseAtRisk) => {
                // The term may yet be renewed: it is given up, so that the
                // next command runs in a term (and under a fence) of its own.
                // Only this term: one won since (the loss came after the risk)
                // is the next command's.
                eprintln!("mongocoord: leadership of {key} could not be renewed in time; the command was stopped");
                if !term.is_cancelled() {
                    tokio::select! {
                        _ = elector.release() => {}
                        _ = signal.cancelled() => {
                            elector.stop().await;
                            return Ok(0);
                        }
                    }
                }
            }
            Some(_) => eprintln!("mongocoord: leadership of {key} lost; the command was killed; campaigning again"),
        }
    }
}

/// Options of `mongocoord agent`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AgentOpts {
    pub(crate) concurrency: usize,
    /// Tasks claimed ahead of free slots, at most (`None`: the default).
    pub(crate) prefetch: Option<usize>,
    pub(crate) max_attempts: u32,
    pub(crate) max_tasks: Option<u64>,
    /// How long one run of a task's command may take, unless the task says.
    pub(crate) timeout: Option<Duration>,
    /// The agent name's cluster-wide limits, if any.
    pub(crate) limits: Option<crate::args::Limits>,
    /// How long ended tasks are kept before the server deletes them
    /// (`None`: for ever).
    pub(crate) retain: Option<Duration>,
}

/// The task as JSON for the command's stdin (relaxed extended JSON).
pub(crate) fn task_json(task: &Task) -> Vec<u8> {
    let mut d = Document::new();
    d.insert("_id", task.id().as_bson().clone());
    d.extend(task.data().clone());
    Bson::Document(d).into_relaxed_extjson().to_string().into_bytes()
}

/// Reads the command's stdout: empty, or a JSON object whose `follow_ups` array
/// holds tasks to enqueue (each with an `agent_name`, and a `group_key` to
/// put it in a group, as `enqueue --group` does; both reserved names, never
/// task data) and whose other fields are merged into the task.
pub(crate) fn parse_output(stdout: &[u8]) -> Result<Outcome, CliError> {
    let text = String::from_utf8_lossy(stdout);
    if text.trim().is_empty() {
        return Ok(Outcome::done());
    }
    let value: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|source| CliError::Json { what: "stdout is not JSON".into(), source })?;
    let serde_json::Value::Object(mut map) = value else {
        return Err(CliError::invalid("stdout is not a JSON object"));
    };
    let follow_ups = map.remove("follow_ups");
    let merge =
        Document::try_from(map).map_err(|source| CliError::Bson { what: "stdout cannot be stored".into(), source })?;
    let mut outcome = Outcome::done_with(merge);
    if let Some(v) = follow_ups {
        let serde_json::Value::Array(items) = v else { return Err(CliError::invalid("follow_ups must be an array")) };
        for item in items {
            let serde_json::Value::Object(mut m) = item else {
                return Err(CliError::invalid("each follow-up must be an object"));
            };
            let Some(serde_json::Value::String(agent)) = m.remove(fields::AGENT_NAME) else {
                return Err(CliError::invalid("each follow-up needs an agent_name string"));
            };
            let group = match m.remove(fields::GROUP_KEY) {
                None => None,
                Some(serde_json::Value::String(g)) => Some(g),
                Some(_) => return Err(CliError::invalid("a follow-up's group_key must be a string")),
            };
            let data =
                Document::try_from(m).map_err(|source| CliError::Bson { what: "bad follow-up".into(), source })?;
            let task = NewTask::new(agent, data);
            outcome = outcome.follow_up(match group {
                Some(g) => task.group(g),
                None => task,
            });
        }
    }
    Ok(outcome)
}

/// `mongocoord agent NAME --queue QUEUE -- CMD`.
pub(crate) async fn agent(
    store: MongoStore,
    name: &str,
    queue: &str,
    o: AgentOpts,
    run: &Run<'_>,
) -> Result<u8, CliError> {
    let agent = agent_builder(store, name, queue, o, run).build()?;
    let signal = supervise::on_signal();
    let log = work_tasks(&agent, run, &signal, std::sync::Arc::new(|_: &Task| Vec::new())).await?;
    eprintln!(
        "mongocoord: agent {name}: {} processed, {} completed, {} failed for good, {} retried",
        log.tasks_processed, log.completed, log.failed_permanently, log.retried
    );
    Ok(0)
}

/// How much longer than the grace period the agent waits for a timed-out
/// command's handler: the supervisor's SIGKILL, and the tree's reaping.
const TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// The agent of the `agent` and `cron` runners: the claim lease is the
/// runner's lease, and the drain on shutdown outlasts stopping a command.
pub(crate) fn agent_builder(
    store: MongoStore,
    name: &str,
    queue: &str,
    o: AgentOpts,
    run: &Run<'_>,
) -> AgentBuilder<MongoStore> {
    let mut b = Agent::builder(store, name, queue)
        .concurrency(o.concurrency)
        .max_attempts(o.max_attempts)
        .ttl(run.ttl)
        .poll_interval(Duration::from_secs(5))
        // On shutdown the handlers stop their commands (SIGTERM, SIGKILL after
        // the grace period) and record the outcome. The drain never gives up
        // on them: a handler dropped half-way would let its claim go while
        // the command's tree may live (a supervisor its own command stopped
        // cannot kill it), so the runner waits, renewing; a second
        // SIGTERM/SIGINT still ends it at once.
        .drain_timeout(mongoagent::mongolock::MAX_INTERVAL)
        // A timed-out command gets SIGTERM, then SIGKILL after the grace
        // period; the agent waits for that before it gives up on the handler.
        .timeout_grace(run.grace + TIMEOUT_MARGIN);
    if let Some(t) = o.timeout {
        b = b.timeout(t);
    }
    if let Some(n) = o.max_tasks {
        b = b.process_while(move |log| log.tasks_processed < n);
    }
    if let Some(n) = o.prefetch {
        b = b.prefetch(n);
    }
    if let Some(d) = o.retain {
        b = b.retain_finished(d);
    }
    if let Some(n) = o.limits.and_then(|l| l.global_concurrency) {
        b = b.global_concurrency(n);
    }
    if let Some(r) = o.limits.and_then(|l| l.rate) {
        b = b.rate_limit(r.n, r.per);
    }
    if let Some(n) = o.limits.and_then(|l| l.group_concurrency) {
        b = b.group_concurrency(usize::try_from(n).unwrap_or(usize::MAX));
    }
    b
}

/// Extra environment for a task's command, from the task.
pub(crate) type TaskEnv = std::sync::Arc<dyn Fn(&Task) -> Vec<(&'static str, String)> + Send + Sync>;

/// Runs CMD for each task `agent` claims, under the supervision every runner
/// uses (its claim is its lease), until `signal` fires or the agent stops; the
/// one way a task's command is run (`agent`, `cron`). `env` adds variables to
/// `MONGOCOORD_TASK_ID` and `MONGOCOORD_FENCE`.
pub(crate) async fn work_tasks(
    agent: &Agent<MongoStore>,
    run: &Run<'_>,
    signal: &CancellationToken,
    env: TaskEnv,
) -> Result<AgentCounters, CliError> {
    {
        let (a, s) = (agent.clone(), signal.clone());
        tokio::spawn(async move {
            s.cancelled().await;
            a.shutdown();
        });
    }
    let (argv0, grace, pass_env) = (run.cmd[0].clone(), run.grace, run.pass_env);
    let argv = run.cmd.to_vec();
    let signal = signal.clone();
    let handler = move |task: Task| {
        let (argv, argv0, signal, env) = (argv.clone(), argv0.clone(), signal.clone(), env.clone());
        async move {
            let mut vars =
                vec![("MONGOCOORD_TASK_ID", task.id().to_string()), ("MONGOCOORD_FENCE", task.fence().to_string())];
            vars.extend(env(&task));
            // The command continues the run's trace (W3C `TRACEPARENT`), and
            // never the one the runner was handed.
            vars.extend(crate::telemetry::trace_env(&task));
            let unset = &["TRACEPARENT", "TRACESTATE"];
            let stdin = Some(task_json(&task));
            let spec = Spec { argv: &argv, env: vars, stdin, capture: true, grace, pass_env, unset };
            let mut stops = Stops::new();
            stops.terminate_on(&signal, Why::Signal);
            // SIGTERM when the claim is at risk, SIGKILL when it counts as lost (or
            // the agent stops waiting for the handler).
            stops.lease(task.validity().clone(), grace);
            // The task's cancellation: at its timeout, a graceful stop; for a
            // lost claim (or an agent that stops waiting), SIGKILL.
            let (timed_out, lost) = (CancellationToken::new(), CancellationToken::new());
            stops.terminate_on(&timed_out, Why::TimedOut);
            stops.kill_on(&lost, Why::LeaseLost);
            let watcher = {
                let task = task.clone();
                tokio::spawn(async move {
                    task.cancellation().cancelled().await;
                    if task.timed_out() {
                        timed_out.cancel()
                    } else {
                        lost.cancel()
                    }
                })
            };
            let done = supervise::run(spec, &stops).await;
            watcher.abort();
            drop(stops);
            task_outcome(&argv0, done)
        }
    };
    Ok(agent.work(handler).await?)
}

/// The outcome of a task whose command's tree is gone.
fn task_outcome(argv0: &str, done: std::io::Result<supervise::Finished>) -> Outcome {
    match done {
        Err(e) => Outcome::failed(format!("cannot run {argv0:?}: {e}")),
        // Too much output fails the task whether or not the command ended first.
        Ok(done) if done.stdout.overflow || done.stopped == Some(Why::Output) => Outcome::failed_permanently(format!(
            "the command wrote more than {} bytes to stdout (the limit)",
            supervise::STDOUT_LIMIT
        )),
        Ok(done) => match done.stopped {
            Some(Why::Signal | Why::Output) => Outcome::failed("stopped: the agent is shutting down"),
            Some(Why::LeaseLost | Why::LeaseAtRisk) => Outcome::failed("stopped: the claim was lost"),
            // The agent records "timed out after …" whatever this says.
            Some(Why::TimedOut) => Outcome::failed("stopped: timed out"),
            // Retried, as a crash would be, but only now that its tree is gone.
            Some(Why::SupervisorKilled) => {
                Outcome::failed("the command's supervisor was killed; its process tree was killed first")
            }
            None if done.status.success() => {
                // The task's error says what was wrong with the output.
                parse_output(&done.stdout.bytes).unwrap_or_else(|e| Outcome::failed_permanently(e.to_string()))
            }
            None => Outcome::failed(format!("exit status {}: {}", exit_code(done.status), done.stderr_tail())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs() {
        assert_eq!(parse_output(b"").unwrap(), Outcome::done());
        let o = parse_output(br#"{"rows": 3, "follow_ups": [{"agent_name": "load", "file": "x"}]}"#).unwrap();
        let Outcome::Complete { merge, follow_ups, .. } = o else { panic!("complete") };
        assert_eq!(merge.get_i64("rows").or_else(|_| merge.get_i32("rows").map(i64::from)).unwrap(), 3);
        assert_eq!(follow_ups.len(), 1);
        assert!(parse_output(b"[1]").is_err());
        assert!(parse_output(b"not json").is_err());
        assert!(parse_output(br#"{"follow_ups": [{"file": "x"}]}"#).is_err());
        let o = parse_output(br#"{"follow_ups": [{"agent_name": "load", "group_key": "c-1", "file": "x"}]}"#).unwrap();
        let Outcome::Complete { follow_ups, .. } = o else { panic!("complete") };
        let t = format!("{:?}", follow_ups[0]);
        assert!(t.contains(r#"group: Some("c-1")"#), "{t}");
        assert!(t.contains(r#"data: Document({"file": String("x")})"#), "the rest is the task's data: {t}");
        assert!(parse_output(br#"{"follow_ups": [{"agent_name": "load", "group_key": 7}]}"#).is_err());
    }

    #[test]
    fn too_much_output_fails_for_good_even_when_the_command_ended_first() {
        use std::os::unix::process::ExitStatusExt;
        let finished = |overflow, stopped| supervise::Finished {
            status: std::process::ExitStatus::from_raw(0),
            stopped,
            stdout: supervise::Captured { bytes: b"{}".to_vec(), overflow },
            stderr: supervise::Captured::default(),
        };
        assert_eq!(task_outcome("x", Ok(finished(false, None))), parse_output(b"{}").unwrap());
        for (overflow, stopped) in [(true, None), (true, Some(Why::Output)), (false, Some(Why::Output))] {
            let o = task_outcome("x", Ok(finished(overflow, stopped)));
            let Outcome::Fail { error, retry, .. } = o else { panic!("fails: {o:?}") };
            assert!(error.contains("more than 1048576 bytes to stdout"), "{error}");
            assert_eq!(retry, mongoagent::Retry::Never);
        }
        let lost = task_outcome("x", Ok(finished(false, Some(Why::LeaseLost))));
        assert!(matches!(lost, Outcome::Fail { retry: mongoagent::Retry::Policy, .. }), "{lost:?}");
    }

    #[test]
    fn durations() {
        assert!(secs("ttl", 0.0).is_err());
        assert!(secs("ttl", -1.0).is_err());
        assert!(secs("ttl", f64::NAN).is_err());
        assert_eq!(secs("ttl", 1.5).unwrap(), Duration::from_millis(1500));
    }
}
