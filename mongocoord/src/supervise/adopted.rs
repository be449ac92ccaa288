//! The runner's side of a supervisor that died: what is left of its command's
//! tree is killed and reaped by the runner itself before the lease is let go.
//!
//! The supervisor handles every signal it can, so only SIGKILL (or SIGSEGV,
//! SIGILL, SIGFPE, or a crash of its own) ends it early. Then its children (the
//! command's main process, and the descendants it had adopted as a subreaper)
//! are re-parented
//! to the nearest subreaper above it, and the runner is one
//! ([`become_subreaper`]): they become the runner's children, and a descendant
//! whose parent dies later comes to the runner too. So the orphaned tree is
//! exactly the runner's children that are not its live supervisors, and their
//! descendants; the runner starts no other process, and the children it had
//! before its first supervisor (inherited across an `exec`) are left alone. Nothing has to be learnt
//! from the dead supervisor (the command's process group, the descendants that
//! left it): `/proc` shows the whole of it, and the runner can confirm it gone,
//! which a `killpg` from a recorded group id alone could not.
//!
//! The runner reaps only these adopted children, each by its pid, never with
//! `waitpid(-1)`, which would take the exit status of a supervisor from the
//! runtime that waits for it.

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::prctl;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use parking_lot::Mutex;

use super::tree::{descendants_in, processes};

/// The supervisors started and not yet known to be reaped, by pid. Every other
/// child of the runner is an orphan of a dead supervisor. It is held while a
/// supervisor is spawned and recorded, and while the orphans are found and
/// killed, so a supervisor just started is never taken for an orphan.
static SUPERVISORS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// The longest pause between two rounds of killing, while some orphan lingers
/// (a process in uninterruptible sleep does not die of SIGKILL until it wakes).
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// How often a runner that cannot confirm the tree gone says so.
const COMPLAIN_EVERY: Duration = Duration::from_secs(10);

/// The runner's children from before its first supervisor: processes it
/// inherited (`sh -c 'log-shipper & exec mongocoord agent …'` leaves the
/// shipper a child of the runner), never part of a command's tree, never
/// killed. A child that exits stays a zombie until reaped, and only the
/// orphans are reaped here, so such a pid is not reused while listed.
static INHERITED: Mutex<Option<Vec<i32>>> = Mutex::new(None);

/// Makes this process (the runner) a child subreaper, so that the tree of a
/// supervisor that dies comes back to it rather than to init; the children
/// it has then are its own, not any command's ([`INHERITED`]).
pub(crate) fn become_subreaper() -> std::io::Result<()> {
    let mut inherited = INHERITED.lock();
    if inherited.is_none() {
        let me = std::process::id();
        *inherited = Some(if has_no_child() {
            Vec::new()
        } else {
            processes().into_iter().filter(|p| u32::try_from(p.ppid).is_ok_and(|pp| pp == me)).map(|p| p.pid).collect()
        });
    }
    prctl::set_child_subreaper(true).map_err(std::io::Error::from)
}

/// A supervisor the runner started, counted as live until dropped (after it was
/// reaped, or when the runner gives up waiting for it).
#[derive(Debug)]
pub(crate) struct Live(i32);

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = SUPERVISORS.lock();
        if let Some(i) = live.iter().position(|&p| p == self.0) {
            live.swap_remove(i);
        }
    }
}

/// Spawns `cmd` (a supervisor) and records it as live, as one step with respect
/// to [`kill_orphans`].
pub(crate) fn spawn(cmd: &mut tokio::process::Command) -> std::io::Result<(tokio::process::Child, Live)> {
    let mut live = SUPERVISORS.lock();
    let child = cmd.spawn()?;
    let pid = child.id().and_then(|id| i32::try_from(id).ok()).ok_or_else(|| std::io::Error::other("bad pid"))?;
    live.push(pid);
    Ok((child, Live(pid)))
}

/// Whether this process has no child at all, running or ended: the
/// kernel's answer, exact (`waitid` with `WNOWAIT` reaps nothing).
fn has_no_child() -> bool {
    use nix::sys::wait::{waitid, Id};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    matches!(waitid(Id::All, flags), Err(Errno::ECHILD))
}

/// One round: SIGKILL to every orphan, its process group when it leads one, and
/// its descendants; then reaps the orphans that ended. Returns how many
/// orphans were found (0: none is left, the tree is confirmed gone).
pub(crate) fn kill_round() -> usize {
    let me = std::process::id();
    let orphans = {
        let live = SUPERVISORS.lock();
        let inherited = INHERITED.lock().clone().unwrap_or_default();
        // Where this process can have no child but an orphan, the kernel
        // says at once whether it has any. Anywhere else, every process is
        // read: a zero here lets the lease go, and only a reading of /proc
        // by pid is exact while children come and go (the kernel's lists
        // of children may skip one that stays while another is reaped).
        if live.is_empty() && inherited.is_empty() && has_no_child() {
            return 0;
        }
        let procs = processes();
        let orphans: Vec<i32> = procs
            .iter()
            .filter(|p| u32::try_from(p.ppid).is_ok_and(|pp| pp == me))
            .filter(|p| !live.contains(&p.pid) && !inherited.contains(&p.pid))
            .map(|p| p.pid)
            .collect();
        for &pid in &orphans {
            // An orphan is this process's child, not reaped yet: its pid, and so
            // the id of the group it leads, cannot have been reused.
            if procs.iter().any(|p| p.pid == pid && p.pgrp == pid) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            for d in descendants_in(&procs, pid) {
                let _ = kill(Pid::from_raw(d.pid), Signal::SIGKILL);
            }
        }
        orphans
    };
    for &pid in &orphans {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => {}
            Ok(status) => tracing::debug!(pid, ?status, "an orphan of the command's supervisor reaped"),
            Err(e) => tracing::warn!(pid, error = %e, "waitpid failed"),
        }
    }
    orphans.len()
}

/// Kills and reaps whatever the runner's dead supervisors left running, until
/// none of it is left. It does not give up: the caller holds the lease (and
/// keeps renewing it) until this returns, since letting go while a process of
/// the tree may live would let a second holder run beside it. Returns how many
/// orphans the first round found.
///
/// # Cancel safety
///
/// Cancel-safe: each round is whole; dropped, the remaining orphans are found by
/// the next call.
pub(crate) async fn kill_orphans() -> usize {
    let first = kill_round();
    if first == 0 {
        return 0;
    }
    tracing::warn!(orphans = first, "the command's supervisor died and left its tree: killing it");
    let (start, mut pause, mut complained) = (tokio::time::Instant::now(), Duration::from_millis(2), Duration::ZERO);
    loop {
        tokio::time::sleep(pause).await;
        let left = kill_round();
        if left == 0 {
            return first;
        }
        pause = (pause * 2).min(MAX_PAUSE);
        let waited = start.elapsed();
        if waited >= complained + COMPLAIN_EVERY {
            complained = waited;
            tracing::warn!(left, ?waited, "processes of the command's tree do not die yet: the lease is kept");
        }
    }
}
