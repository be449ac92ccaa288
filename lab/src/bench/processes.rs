//! Agent processes on one queue: the orchestrator's side
//! ([`queue_processes_run`]) and the process's (`lab bench-agent`,
//! [`bench_agent`]), and the line protocol between them: `ready`, then `go`,
//! then stdin closed, then one report line.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use mongoagent::{fields, Agent, Outcome, Task};
use parking_lot::Mutex;
use store_mongo::MongoStore;

use super::counted::{counted_store, Counts};
use super::queue::{preload, QueueRun};
use crate::error::LabError;

/// `n` agent processes (`lab bench-agent`, one agent each, concurrency 4) process
/// `tasks` trivial tasks from `coll`. Each connects and builds its agent, says
/// `ready`, starts on `go`, and stops when its stdin closes, reporting the
/// commands it sent from `go` on and when its handler last ran. The clock
/// runs from `go` to the last handler start of any process (on the system
/// clock the processes share), as in-process runs and Agenda's stop at the
/// last handler; a count of completed tasks, polled every 250 ms and not
/// counted, only tells when all are done.
pub(super) async fn queue_processes_run(
    uri: &str,
    db: &str,
    store: &MongoStore,
    tasks: u32,
    coll: &str,
    n: usize,
) -> Result<QueueRun, LabError> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    preload(store, tasks, coll).await?;
    let exe = std::env::current_exe().map_err(|e| LabError::io("cannot find the lab's own binary", e))?;
    let mut procs = Vec::new();
    for _ in 0..n {
        let mut child = tokio::process::Command::new(&exe)
            .env("MONGODB_URI", uri)
            .args(["--db", db, "bench-agent", "--coll", coll])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| LabError::io("cannot start a bench agent", e))?;
        let stdin = child.stdin.take().ok_or_else(|| LabError::Broken("bench agent without stdin".into()))?;
        let stdout = child.stdout.take().ok_or_else(|| LabError::Broken("bench agent without stdout".into()))?;
        let stdout = BufReader::new(stdout).lines();
        procs.push((child, Some(stdin), stdout));
    }
    for (_, _, out) in &mut procs {
        match tokio::time::timeout(Duration::from_secs(60), out.next_line()).await {
            Ok(Ok(Some(l))) if l == "ready" => {}
            other => return Err(LabError::Unreadable(format!("bench agent did not get ready: {other:?}"))),
        }
    }
    let c = store.database().collection::<bson::Document>(coll);
    let start = Instant::now();
    let start_ns = unix_ns();
    for (_, stdin, _) in &mut procs {
        if let Some(s) = stdin.as_mut() {
            let go = async {
                s.write_all(b"go\n").await?;
                s.flush().await
            };
            go.await.map_err(|e| LabError::io("cannot tell a bench agent to go", e))?;
        }
    }
    let limit = Duration::from_secs(1800);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let n = c.count_documents(doc! {fields::AGENT_NAME: "bench", fields::COMPLETE: true}).await?;
        if n >= u64::from(tasks) {
            break;
        }
        if start.elapsed() > limit {
            return Err(LabError::timed_out("queue processes did not finish", limit));
        }
    }
    let (mut counts, mut completed, mut last_ns) = (Counts::default(), 0_u64, 0_u128);
    for (_, stdin, _) in &mut procs {
        drop(stdin.take());
    }
    for (child, _, out) in &mut procs {
        let limit = Duration::from_secs(60);
        let line = tokio::time::timeout(limit, out.next_line())
            .await
            .map_err(|_| LabError::timed_out("bench agent did not stop", limit))?
            .map_err(|e| LabError::io("cannot read a bench agent's report", e))?
            .ok_or_else(|| LabError::Unreadable("bench agent ended without a report".into()))?;
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next(), words.next(), words.next()) {
            (Some("commands"), Some(c), Some("completed"), Some(d), Some("last_ns"), Some(t)) => {
                let number = |e| LabError::Number { what: format!("bench agent reported {line:?}"), source: e };
                last_ns = last_ns.max(t.parse::<u128>().map_err(number)?);
                let by_kind = Counts::parse_words(words)?;
                if by_kind.total != c.parse::<u64>().map_err(number)? {
                    return Err(LabError::Unreadable(format!(
                        "bench agent reported {line:?}: the breakdown does not add up"
                    )));
                }
                counts.add(&by_kind);
                completed += d.parse::<u64>().map_err(number)?;
            }
            _ => return Err(LabError::Unreadable(format!("bench agent reported {line:?}"))),
        }
        // Its report was its last word: it exits next, or is killed.
        if tokio::time::timeout(Duration::from_secs(30), child.wait()).await.is_err() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
    if completed != u64::from(tasks) {
        return Err(LabError::Completions { run: "queue processes", completed, tasks: u64::from(tasks) });
    }
    if last_ns <= start_ns {
        return Err(LabError::Broken("queue processes: no handler ran after go".into()));
    }
    let rate = f64::from(tasks) / ((last_ns - start_ns) as f64 / 1e9);
    Ok(QueueRun { rate, commands_per_task: counts.total as f64 / f64::from(tasks), counts })
}

/// The system clock in nanoseconds since the Unix epoch: what processes on
/// one machine compare times on.
fn unix_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// `lab bench-agent`: one agent (concurrency 4, a trivial handler) on `coll`
/// for the orchestrator in [`queue_processes_run`]. Prints `ready`, starts
/// on a `go` line, stops when stdin closes, then prints
/// `commands C completed N last_ns T` (commands sent since `go`, and when its
/// handler last ran, in nanoseconds since the Unix epoch) and the commands
/// by kind.
pub(crate) async fn bench_agent(uri: &str, db: &str, coll: &str) -> Result<u8, LabError> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let (store, commands) = counted_store(uri, db).await?;
    let agent =
        Agent::builder(store, "bench", coll).concurrency(4).poll_interval(Duration::from_millis(200)).build()?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    println!("ready");
    let stdin = |e| LabError::io("bench-agent: cannot read stdin", e);
    match lines.next_line().await.map_err(stdin)? {
        Some(l) if l.trim() == "go" => {}
        other => return Err(LabError::Unreadable(format!("bench-agent: expected go, got {other:?}"))),
    }
    let c0 = commands.snapshot();
    let last = Arc::new(Mutex::new(0_u128));
    let worker = tokio::spawn({
        let (agent, last) = (agent.clone(), last.clone());
        async move {
            agent
                .work(move |_t: Task| {
                    let last = last.clone();
                    async move {
                        let now = unix_ns();
                        let mut l = last.lock();
                        *l = (*l).max(now);
                        Outcome::done()
                    }
                })
                .await
        }
    });
    while lines.next_line().await.map_err(stdin)?.is_some() {}
    agent.shutdown();
    let log = worker.await.map_err(|e| LabError::join("bench-agent: its agent stopped", e))??;
    let used = commands.snapshot().since(&c0);
    let last_ns = *last.lock();
    println!("commands {} completed {} last_ns {last_ns} {}", used.total, log.completed, used.words());
    Ok(0)
}
