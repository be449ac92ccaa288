//! What an idle process costs, the figure that matters to whoever runs many
//! of them: `mongocoord agent` on an empty queue, an elector follower, a
//! `lock` waiting for a held lock, and `cron` between ticks, each a real CLI
//! process, measured side by side over a window after a warm-up. Each role
//! gets a fresh server of its own when the run has one to start (as each of
//! Agenda's settings does), else a database of its own on the run's server.
//!
//! - Commands: the driver's own command monitoring, through its tracing
//!   (`RUST_LOG=mongodb::command=debug`, one "Command started" line per
//!   command on the process's stderr). Server monitoring's heartbeats are not
//!   commands and are not counted, as in the queue figures.
//! - CPU: user plus system time from `/proc/PID/stat`.
//! - Memory: `VmRSS` from `/proc/PID/status` at the end of the window.
//!
//! Both are summed over the process and its descendants: a follower and a
//! waiter keep their command's supervisor started ahead, and that process is
//! part of what they cost. (RSS summed counts the pages they share, the
//! binary's, once per process: an upper bound.)

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::agenda::PeerServer;
use super::figures::{Figures, Section};
use crate::error::LabError;
use crate::server::Server;

/// The roles measured, with their figure names (`idle_<role>_*`).
pub(crate) const ROLES: [&str; 4] = ["agent", "follower", "waiter", "cron"];

/// A process of the measurement, stopped with SIGTERM (then SIGKILL) when
/// dropped, so no lease outlives the bench.
struct Proc(tokio::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id() {
            let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if matches!(self.0.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.start_kill();
    }
}

/// One idle process under measurement.
struct Measured {
    role: &'static str,
    proc: Proc,
    log: PathBuf,
}

/// A reading of one process: commands sent, CPU ticks used.
#[derive(Debug, Clone, Copy)]
struct Reading {
    commands: u64,
    ticks: u64,
}

/// Runs every role side by side for `window` after `warm_up`, and puts
/// `idle_<role>_{commands_per_min,cpu_s_per_min,rss_mb}`.
pub(super) async fn put_figures(
    f: &mut Figures,
    mongocoord: &Path,
    peer: &PeerServer<'_>,
    db: &str,
    dir: &Path,
    warm_up: Duration,
    window: Duration,
) -> Result<(), LabError> {
    if !Path::new("/proc/self/stat").exists() {
        f.skip(Section::Idle, "no /proc: CPU and memory are read from /proc/PID");
        return Ok(());
    }
    let tick_hz = clock_ticks_per_s().await;
    // A server per role where we can start one, else a database per role, so
    // that no role's writes land in another's collections. secantusd-py
    // answers a waiting change-stream `getMore` at every write anywhere on
    // the server, whatever the stream's filter and database
    // (docs/test-servers.md): on a shared server, each watching role's
    // figures would include the other roles' renewals, which `mongod` and
    // secantusd-rs never wake a stream for. The holder's and the leader's
    // renewals still land beside the waiter and the follower they exist for.
    let mut servers: Vec<Server> = Vec::new();
    let mut uris = Vec::new();
    for _ in ROLES {
        let (server, uri) = peer.get().await?;
        servers.extend(server);
        uris.push(uri);
    }
    let db_of = |role: &str| format!("{db}_idle_{role}");
    let uri_of = |role: &str| {
        let i = ROLES.iter().position(|r| *r == role).unwrap_or(0);
        uris[i].as_str()
    };
    let base = |role: &str, log: Option<&Path>| -> Result<tokio::process::Command, LabError> {
        let mut c = tokio::process::Command::new(mongocoord);
        c.env("MONGODB_URI", uri_of(role))
            .args(["--db", &db_of(role)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        match log {
            Some(path) => {
                let file = std::fs::File::create(path)
                    .map_err(|e| LabError::io(format!("cannot create {}", path.display()), e))?;
                c.env("RUST_LOG", "warn,mongodb::command=debug").stderr(file);
            }
            None => {
                c.stderr(Stdio::null());
            }
        }
        Ok(c)
    };
    let mark = |name: &str| dir.join(format!("idle-{name}.started"));
    let keep = |name: &str| format!("echo started > {}; exec sleep 100000", mark(name).display());

    // Something to wait for: a lock holder and an elected leader.
    let mut helpers = Vec::new();
    for (name, role, args) in
        [("holder", "waiter", ["lock", "bench-idle-lock"]), ("leader", "follower", ["elect", "bench-idle-elect"])]
    {
        let _ = std::fs::remove_file(mark(name));
        let mut c = base(role, None)?;
        c.args(args).args(["--", "sh", "-c", &keep(name)]);
        helpers.push(Proc(c.spawn().map_err(|e| LabError::io("cannot start mongocoord", e))?));
    }
    for name in ["holder", "leader"] {
        let t = Instant::now();
        let limit = Duration::from_secs(60);
        while !mark(name).exists() {
            if t.elapsed() > limit {
                return Err(LabError::timed_out(format!("idle: the {name} did not start"), limit));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let mut measured = Vec::new();
    for role in ROLES {
        let args: Vec<&str> = match role {
            "agent" => vec!["agent", "bench-idle", "--queue", "bench_idle", "--", "true"],
            "follower" => vec!["elect", "bench-idle-elect", "--", "true"],
            "waiter" => vec!["lock", "bench-idle-lock", "--", "true"],
            // The 29th of February: no tick within any window.
            _ => vec!["cron", "bench-idle-cron", "0 0 29 2 *", "--", "true"],
        };
        let log = dir.join(format!("idle-{role}.log"));
        let mut c = base(role, Some(&log))?;
        c.args(args);
        let proc = Proc(c.spawn().map_err(|e| LabError::io(format!("cannot start mongocoord {role}"), e))?);
        measured.push(Measured { role, proc, log });
    }
    started(&mut measured).await?;
    tokio::time::sleep(warm_up).await;
    let first: Vec<Reading> = measured.iter_mut().map(read).collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let last: Vec<Reading> = measured.iter_mut().map(read).collect::<Result<_, _>>()?;
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    for ((m, a), b) in measured.iter_mut().zip(&first).zip(&last) {
        let role = m.role;
        f.put(format!("idle_{role}_commands_per_min"), (b.commands - a.commands) as f64 / minutes);
        f.put(format!("idle_{role}_cpu_s_per_min"), (b.ticks - a.ticks) as f64 / tick_hz / minutes);
        f.put(format!("idle_{role}_rss_mb"), rss_mb(pid(m)?)?);
    }
    drop(measured);
    drop(helpers);
    drop(servers);
    Ok(())
}

/// Waits, up to a minute, until every role has sent a command: each sends
/// some as it starts (its indexes, its first look), so one that sends none
/// means the count is broken (the driver's log changed, say), and its zeros
/// would pass for a figure; a slow start on a loaded machine is waited for.
async fn started(measured: &mut [Measured]) -> Result<(), LabError> {
    let (t, limit) = (Instant::now(), Duration::from_secs(60));
    loop {
        let counts: Vec<Reading> = measured.iter_mut().map(read).collect::<Result<_, _>>()?;
        let Some((m, _)) = measured.iter().zip(&counts).find(|(_, r)| r.commands == 0) else { return Ok(()) };
        if t.elapsed() > limit {
            return Err(LabError::Broken(format!(
                "idle: no command counted in mongocoord {}'s first {limit:?} (see {}): the count reads the driver's \"Command started\" lines",
                m.role,
                m.log.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pid of a process still running.
fn pid(m: &mut Measured) -> Result<u32, LabError> {
    match (m.proc.0.try_wait(), m.proc.0.id()) {
        (Ok(None), Some(pid)) => Ok(pid),
        _ => Err(LabError::Broken(format!("idle: mongocoord {} has exited (see {})", m.role, m.log.display()))),
    }
}

/// Commands so far (lines of the driver's "Command started" event) and CPU
/// ticks (user plus system) of a measured process.
fn read(m: &mut Measured) -> Result<Reading, LabError> {
    let pid = pid(m)?;
    let log =
        std::fs::read_to_string(&m.log).map_err(|e| LabError::io(format!("cannot read {}", m.log.display()), e))?;
    let commands = log.lines().filter(|l| l.contains("Command started")).count() as u64;
    // The process itself must be readable; a descendant that just ended counts nothing.
    let mut ticks = cpu_ticks(pid)?;
    for p in &with_descendants(pid)[1..] {
        ticks += cpu_ticks(*p).unwrap_or(0);
    }
    Ok(Reading { commands, ticks })
}

/// `pid` and its descendants, from the kernel's lists of each thread's
/// children (a process that comes or goes meanwhile may be missed: an idle
/// process's tree does not change).
fn with_descendants(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            all.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    all
}

/// CPU ticks (user plus system) a process used so far.
fn cpu_ticks(pid: u32) -> Result<u64, LabError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| LabError::io(format!("cannot read /proc/{pid}/stat"), e))?;
    // Fields after the command name, which may itself hold spaces or ')':
    // state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| LabError::Unreadable(format!("/proc/{pid}/stat without a command name")))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| LabError::Unreadable(format!("/proc/{pid}/stat: no CPU times")))
    };
    Ok(tick(11)? + tick(12)?)
}

/// The resident memory of `pid` and its descendants, summed.
fn rss_mb(pid: u32) -> Result<f64, LabError> {
    let mut mb = process_rss_mb(pid)?;
    for p in &with_descendants(pid)[1..] {
        mb += process_rss_mb(*p).unwrap_or(0.0);
    }
    Ok(mb)
}

fn process_rss_mb(pid: u32) -> Result<f64, LabError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| LabError::io(format!("cannot read /proc/{pid}/status"), e))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .ok_or_else(|| LabError::Unreadable(format!("/proc/{pid}/status: no VmRSS")))?;
    Ok(kb / 1024.0)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
async fn clock_ticks_per_s() -> f64 {
    let out = tokio::process::Command::new("getconf").arg("CLK_TCK").output().await;
    out.ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok()).unwrap_or(100.0)
}
