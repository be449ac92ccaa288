//! A supervisor's process tree: every descendant found through `/proc`,
//! signalled, and reaped (the supervisor is a child subreaper, so a descendant
//! whose parent dies becomes its child). The runner reads `/proc` the same way
//! for what a dead supervisor left ([`super::adopted`]).
//!
//! To signal a tree, the supervisor walks it from its root through each
//! process's list of children (`/proc/PID/task/TID/children`), so a stop
//! reads the tree's own processes only and costs as much on a machine
//! running thousands of processes as on an idle one (every process's `stat`
//! is read where the kernel keeps no such lists). The walk may miss a
//! process while the tree changes and is repeated until it finds nothing new;
//! that is enough for a SIGTERM, and SIGKILL goes on until `waitpid` says no
//! descendant is left, which is exact. What confirms a tree gone before a
//! lease is let go never relies on the walk ([`super::adopted`]).

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Proc {
    pub(super) pid: i32,
    pub(super) ppid: i32,
    pub(super) pgrp: i32,
}

/// Reads pid, parent and process group from the text of `/proc/PID/stat`. The
/// command name (in parentheses) may hold spaces and parentheses, so the fields
/// are read after its last `)`.
fn parse_stat(stat: &str) -> Option<Proc> {
    let (head, tail) = stat.rsplit_once(')')?;
    let pid = head.split_whitespace().next()?.parse().ok()?;
    let mut fields = tail.split_whitespace();
    let _state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Proc { pid, ppid, pgrp })
}

/// Every process `/proc` shows.
pub(super) fn processes() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| {
        let e = e.ok()?;
        e.file_name().to_str()?.parse::<i32>().ok()?;
        parse_stat(&std::fs::read_to_string(e.path().join("stat")).ok()?)
    })
    .collect()
}

/// Whether this kernel lists each thread's children in
/// `/proc/PID/task/TID/children`.
fn children_files() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let me = std::process::id();
        std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists()
    })
}

/// Whether `pid` is stopped (SIGSTOP, or traced), as `/proc/PID/stat`'s
/// state field says; not if it is gone.
pub(super) fn is_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, tail)| tail.split_whitespace().next().map(str::to_owned)))
        .is_some_and(|state| state == "T" || state == "t")
}

/// One process as `/proc/PID/stat` shows it, if it is still there.
fn stat_of(pid: i32) -> Option<Proc> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The children of `pid` (unreaped ones included), as its threads' lists
/// show them while they are read (see [`descendants`]).
fn children(pid: i32) -> Vec<Proc> {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut found = Vec::new();
    // A child is listed under the thread that started it (or that adopted it).
    for t in threads.flatten() {
        // A thread that ended meanwhile handed its children to another
        // thread of the process, perhaps one read already: the next pass
        // of the walk reads that one again.
        let Ok(list) = std::fs::read_to_string(t.path().join("children")) else { continue };
        for c in list.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
            // One reaped meanwhile is no child; one whose parent died
            // meanwhile was adopted by the root, where the next pass finds it.
            found.extend(stat_of(c).filter(|p| p.ppid == pid));
        }
    }
    found
}

/// How many times at most [`descendants`] walks a tree that keeps changing.
const MAX_PASSES: usize = 8;

/// Every descendant of `root`, parents before children. For signalling a
/// tree, not for confirming it gone: the kernel's lists are read one entry
/// at a time and may skip one while they change (a child reaped, a thread
/// ended, a parent dead and its child adopted by `root` after `root`'s list
/// was read), so the walk is repeated until a pass finds nothing new.
pub(super) fn descendants(root: i32) -> Vec<Proc> {
    if !children_files() {
        return descendants_in(&processes(), root);
    }
    let mut found: Vec<Proc> = Vec::new();
    for _ in 0..MAX_PASSES {
        let before = found.len();
        let mut frontier = vec![root];
        while let Some(parent) = frontier.pop() {
            for p in children(parent) {
                frontier.push(p.pid);
                if p.pid != root && !found.iter().any(|f| f.pid == p.pid) {
                    found.push(p);
                }
            }
        }
        if found.len() == before {
            break;
        }
    }
    found
}

/// Every descendant of `root` in `procs`, parents before children.
pub(super) fn descendants_in(procs: &[Proc], root: i32) -> Vec<Proc> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in procs.iter().filter(|p| p.ppid == parent && p.pid != root) {
            if !found.iter().any(|f: &Proc| f.pid == p.pid) {
                found.push(*p);
                frontier.push(p.pid);
            }
        }
    }
    found
}

/// The command's process tree as seen from its supervisor.
#[derive(Debug)]
pub(crate) struct Tree {
    /// This process (the subreaper).
    me: i32,
    /// The command's main process, also its process group's id.
    main: Pid,
    /// The main process's status once reaped: its exit code, or 128 + signal.
    main_status: Option<u8>,
}

/// Whether any child is left after reaping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// Some child still runs.
    Some,
    /// No child is left: the whole tree is gone and reaped.
    None,
}

impl Tree {
    /// The tree of the command whose main process (and process group leader) is `main`.
    pub(crate) fn new(main: Pid) -> Self {
        Tree { me: nix::unistd::getpid().as_raw(), main, main_status: None }
    }

    /// The main process's status once it was reaped.
    pub(crate) fn main_status(&self) -> Option<u8> {
        self.main_status
    }

    /// Sends `sig` to the command's process group and to every descendant that
    /// left it (a new group or session), each once.
    pub(crate) fn signal(&self, sig: Signal) {
        let group = self.main.as_raw();
        // While the main process is unreaped its pid cannot name another group;
        // after that, the members still alive are found among the descendants.
        let group_alive = self.main_status.is_none();
        if group_alive {
            let _ = killpg(self.main, sig);
        }
        for p in descendants(self.me) {
            if !group_alive || p.pgrp != group {
                let _ = kill(Pid::from_raw(p.pid), sig);
            }
        }
    }

    /// Reaps every child that ended (descendants are re-parented here when their
    /// parent dies) and tells whether any is left.
    pub(crate) fn reap(&mut self) -> Left {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return Left::Some,
                Ok(WaitStatus::Exited(pid, code)) => {
                    if pid == self.main {
                        self.main_status = Some(u8::try_from(code).unwrap_or(1));
                    }
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    if pid == self.main {
                        self.main_status = Some(u8::try_from(128 + sig as i32).unwrap_or(1));
                    }
                }
                Ok(_) | Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => return Left::None,
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid failed");
                    return Left::Some;
                }
            }
        }
    }

    /// SIGKILLs the group and every descendant, again and again, until all are
    /// reaped: a process forked before its parent died is found in the next round.
    pub(crate) async fn kill_all(&mut self) {
        loop {
            self.signal(Signal::SIGKILL);
            if self.reap() == Left::None {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        let p = parse_stat("4242 (sh) S 17 4242 17 0 -1 4194560 1 0 0 0").unwrap();
        assert_eq!(p, Proc { pid: 4242, ppid: 17, pgrp: 4242 });
        let odd = parse_stat("77 (a) b (c)) R 5 9 9 0").unwrap();
        assert_eq!(odd, Proc { pid: 77, ppid: 5, pgrp: 9 });
        assert!(parse_stat("garbage").is_none());
    }

    /// The walk through the children lists finds what a scan of every
    /// process finds: a child, and its children.
    #[test]
    fn a_tree_walked_from_its_root_is_the_tree_a_scan_finds() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & echo started; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(sh.stdout.take().unwrap()), &mut line).unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        let sh_pid = i32::try_from(sh.id()).unwrap();
        let pids = |v: Vec<Proc>| {
            let mut v: Vec<i32> = v.iter().map(|p| p.pid).collect();
            v.sort_unstable();
            v
        };
        let walked = pids(descendants(sh_pid));
        let scanned = pids(descendants_in(&processes(), sh_pid));
        assert!(descendants(me).iter().any(|p| p.pid == sh_pid && p.ppid == me));
        for p in &walked {
            let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
        }
        let _ = kill(Pid::from_raw(sh_pid), Signal::SIGKILL);
        let _ = sh.wait();
        assert_eq!(walked.len(), 2, "the two sleeps: {walked:?}");
        assert_eq!(walked, scanned);
    }

    #[test]
    fn descendants_include_grandchildren_and_leave_others() {
        let p = |pid, ppid| Proc { pid, ppid, pgrp: 0 };
        let procs = [p(1, 0), p(10, 1), p(11, 10), p(12, 11), p(13, 10), p(20, 1), p(21, 20)];
        let mut d: Vec<i32> = descendants_in(&procs, 10).iter().map(|p| p.pid).collect();
        d.sort_unstable();
        assert_eq!(d, [11, 12, 13]);
        assert!(descendants_in(&procs, 12).is_empty());
    }
}
