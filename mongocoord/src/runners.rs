//! `lock`, `elect` and `agent`: coordination for shell scripts and other languages.

use std::time::Duration;

use bson::{Bson, Document};
use mongoagent::{Agent, NewTask, Outcome, Task};
use mongoelector::Elector;
use mongolock::{Acquire, Lock, LockError};
use store_mongo::MongoStore;
use tokio_util::sync::CancellationToken;

use crate::child::{self, exit_code};
use crate::{EXIT_LOST, EXIT_TIMEOUT};

fn secs(what: &str, s: f64) -> Result<Duration, String> {
    if !s.is_finite() || s <= 0.0 || s > 366.0 * 86400.0 {
        return Err(format!("--{what} must be a positive number of seconds, not {s}"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// `mongocoord lock KEY -- CMD`.
pub(crate) async fn lock(
    store: MongoStore,
    key: &str,
    collection: &str,
    ttl: f64,
    timeout: Option<f64>,
    cmd: &[String],
) -> Result<u8, String> {
    let lock =
        Lock::builder(store, key).collection(collection).ttl(secs("ttl", ttl)?).build().map_err(|e| e.to_string())?;
    let signal = child::on_signal();
    let mut opts = Acquire::new().auto_renew();
    if let Some(t) = timeout {
        opts = opts.timeout(secs("timeout", t)?);
    }
    let guard = tokio::select! {
        r = lock.acquire_with(opts) => match r {
            Ok(g) => g,
            Err(LockError::Timeout { .. }) => {
                eprintln!("mongocoord: timed out waiting for lock {key}");
                return Ok(EXIT_TIMEOUT);
            }
            Err(e) => return Err(e.to_string()),
        },
        _ = signal.cancelled() => return Ok(130),
    };
    tracing::info!(key, token = guard.token(), "lock acquired; running the command");
    let stop = CancellationToken::new();
    let lost = guard.lost_token();
    let watcher = {
        let (stop, signal) = (stop.clone(), signal.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = lost.cancelled() => {}
                _ = signal.cancelled() => {}
            }
            stop.cancel();
        })
    };
    let env = [("MONGOCOORD_FENCE", guard.token().to_string()), ("MONGOCOORD_KEY", key.to_owned())];
    let done = child::run(cmd, &env, None, false, &stop).await.map_err(|e| format!("cannot run {:?}: {e}", cmd[0]))?;
    watcher.abort();
    let was_lost = guard.is_lost();
    let released = guard.release().await;
    if was_lost || (done.stopped && !signal.is_cancelled()) {
        eprintln!("mongocoord: lock {key} was lost; the command was stopped");
        return Ok(EXIT_LOST);
    }
    if let Err(e) = released {
        eprintln!("mongocoord: lock {key}: {e}");
        return Ok(EXIT_LOST);
    }
    Ok(exit_code(done.status))
}

/// `mongocoord elect KEY -- CMD`.
pub(crate) async fn elect(store: MongoStore, key: &str, ttl: f64, cmd: &[String]) -> Result<u8, String> {
    let elector = Elector::builder(store, key).ttl(secs("ttl", ttl)?).build().map_err(|e| e.to_string())?;
    elector.start().map_err(|e| e.to_string())?;
    let signal = child::on_signal();
    let mut leadership = elector.leadership();
    loop {
        let term = loop {
            if let Some(t) = elector.term_token() {
                break t;
            }
            tokio::select! {
                _ = signal.cancelled() => {
                    elector.stop().await;
                    return Ok(0);
                }
                r = leadership.changed() => if r.is_err() { return Err("elector stopped".into()) },
            }
        };
        let token = elector.node_status().term_token.unwrap_or_default();
        eprintln!("mongocoord: elected leader of {key} (term {token})");
        let stop = CancellationToken::new();
        let watcher = {
            let (stop, signal, term) = (stop.clone(), signal.clone(), term.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = term.cancelled() => {}
                    _ = signal.cancelled() => {}
                }
                stop.cancel();
            })
        };
        let env = [("MONGOCOORD_FENCE", token.to_string()), ("MONGOCOORD_KEY", key.to_owned())];
        let done = child::run(cmd, &env, None, false, &stop).await;
        watcher.abort();
        if signal.is_cancelled() {
            // Release at once so a peer takes over within milliseconds.
            elector.stop().await;
            return Ok(0);
        }
        let done = match done {
            Ok(d) => d,
            Err(e) => {
                elector.stop().await;
                return Err(format!("cannot run {:?}: {e}", cmd[0]));
            }
        };
        if !done.stopped {
            // The command ended by itself: give up leadership and report its status.
            elector.stop().await;
            return Ok(exit_code(done.status));
        }
        eprintln!("mongocoord: leadership of {key} lost; the command was stopped; campaigning again");
    }
}

/// Options of `mongocoord agent`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AgentOpts {
    pub(crate) concurrency: usize,
    pub(crate) max_attempts: u32,
    pub(crate) lease: f64,
    pub(crate) max_tasks: Option<u64>,
}

/// The task as JSON for the command's stdin (relaxed extended JSON).
pub(crate) fn task_json(task: &Task) -> Vec<u8> {
    let mut d = Document::new();
    d.insert("_id", task.id().as_bson().clone());
    d.extend(task.data().clone());
    Bson::Document(d).into_relaxed_extjson().to_string().into_bytes()
}

/// Reads the command's stdout: empty, or a JSON object whose `follow_ups` array
/// holds tasks to enqueue (each with an `agent_name`) and whose other fields are
/// merged into the task.
pub(crate) fn parse_output(stdout: &[u8]) -> Result<Outcome, String> {
    let text = String::from_utf8_lossy(stdout);
    if text.trim().is_empty() {
        return Ok(Outcome::done());
    }
    let value: serde_json::Value = serde_json::from_str(text.trim()).map_err(|e| format!("stdout is not JSON: {e}"))?;
    let serde_json::Value::Object(mut map) = value else { return Err("stdout is not a JSON object".into()) };
    let follow_ups = map.remove("follow_ups");
    let merge = Document::try_from(map).map_err(|e| format!("stdout cannot be stored: {e}"))?;
    let mut outcome = Outcome::done_with(merge);
    if let Some(v) = follow_ups {
        let serde_json::Value::Array(items) = v else { return Err("follow_ups must be an array".into()) };
        for item in items {
            let serde_json::Value::Object(mut m) = item else { return Err("each follow-up must be an object".into()) };
            let Some(serde_json::Value::String(agent)) = m.remove("agent_name") else {
                return Err("each follow-up needs an agent_name string".into());
            };
            let data = Document::try_from(m).map_err(|e| format!("bad follow-up: {e}"))?;
            outcome = outcome.follow_up(NewTask::new(agent, data));
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
    cmd: &[String],
) -> Result<u8, String> {
    let mut b = Agent::builder(store, name, queue)
        .concurrency(o.concurrency)
        .max_attempts(o.max_attempts)
        .lease(secs("lease", o.lease)?)
        .sleep_between(Duration::from_secs(5));
    if let Some(n) = o.max_tasks {
        b = b.process_while(move |log| log.tasks_processed < n);
    }
    let agent = b.build().map_err(|e| e.to_string())?;
    let signal = child::on_signal();
    {
        let (a, s) = (agent.clone(), signal.clone());
        tokio::spawn(async move {
            s.cancelled().await;
            a.shutdown();
        });
    }
    let argv = cmd.to_vec();
    let handler = move |task: Task| {
        let argv = argv.clone();
        async move {
            let input = task_json(&task);
            let env = [("MONGOCOORD_TASK_ID", task.id().to_string()), ("MONGOCOORD_FENCE", task.token().to_string())];
            match child::run(&argv, &env, Some(input), true, task.cancelled()).await {
                Err(e) => Outcome::failed(format!("cannot run {:?}: {e}", argv[0])),
                Ok(done) if done.stopped => {
                    Outcome::failed("stopped: the claim was lost or the agent is shutting down")
                }
                Ok(done) if done.status.success() => {
                    parse_output(&done.stdout).unwrap_or_else(Outcome::failed_permanently)
                }
                Ok(done) => {
                    Outcome::failed(format!("exit status {}: {}", exit_code(done.status), done.stderr_tail.trim()))
                }
            }
        }
    };
    let log = agent.work(handler).await.map_err(|e| e.to_string())?;
    eprintln!(
        "mongocoord: agent {name}: {} processed, {} completed, {} failed for good, {} retried",
        log.tasks_processed, log.completed, log.failed_permanently, log.retried
    );
    Ok(0)
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
    }

    #[test]
    fn durations() {
        assert!(secs("ttl", 0.0).is_err());
        assert!(secs("ttl", -1.0).is_err());
        assert!(secs("ttl", f64::NAN).is_err());
        assert_eq!(secs("ttl", 1.5).unwrap(), Duration::from_millis(1500));
    }
}
