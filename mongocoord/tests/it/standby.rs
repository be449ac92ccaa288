//! Supervisors started ahead: an `elect` follower and a `lock` waiting for its
//! lock keep their command's supervisor running, with no tree, until they may
//! start the command. It goes when the runner goes, however it goes; a signal
//! to it does not stop the command it starts later; and one that was killed is
//! replaced, so the command still runs, with the fence of its own term.

use std::process::Command;
use std::time::Duration;

use super::supervise::alive;
use super::{env, lines, signal, wait_until};

/// The pids of `pid`'s children.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .flat_map(|t| {
            let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            list.split_whitespace().filter_map(|c| c.parse().ok()).collect::<Vec<u32>>()
        })
        .collect()
}

/// The supervisor `runner` started ahead: its one child, named `mcoord-sup`,
/// once it is there.
fn supervisor_ahead(runner: u32) -> u32 {
    let find = || {
        children(runner)
            .into_iter()
            .find(|c| std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|n| n.trim() == "mcoord-sup"))
    };
    wait_until("the supervisor started ahead", Duration::from_secs(30), || find().is_some());
    find().unwrap()
}

fn kill(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

#[test]
fn a_followers_supervisor_waits_without_a_tree_and_goes_with_it() {
    let Some(e) = env("standby_follower") else { return };
    let log = e.file("terms");
    let script = format!("echo $MONGOCOORD_FENCE $MONGOCOORD_KEY >> {}; exec sleep 300", log.display());
    let args = ["elect", "standby", "--ttl", "2", "--", "sh", "-c", script.as_str()];
    let mut leader = e.spawn(&args);
    wait_until("the first leader", Duration::from_secs(20), || lines(&log).len() == 1);
    let mut follower = e.spawn(&args);
    let ahead = supervisor_ahead(follower.id());
    assert!(children(ahead).is_empty(), "a supervisor ahead has no tree");
    // Every signal is dropped while it waits: it stays, and the command it
    // starts later is not stopped by one that came before.
    for sig in ["-TERM", "-USR1", "-INT", "-HUP", "-QUIT"] {
        kill(ahead, sig);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(&ahead.to_string()), "signals to a supervisor ahead do not end it");
    signal(&leader, "-TERM");
    assert!(leader.wait().unwrap().success());
    wait_until("the follower to lead", Duration::from_secs(20), || lines(&log).len() == 2);
    let terms: Vec<Vec<String>> =
        lines(&log).iter().map(|l| l.split_whitespace().map(str::to_owned).collect()).collect();
    assert_eq!(terms[1][1], "standby", "{terms:?}");
    assert!(terms[1][0].parse::<u64>().unwrap() > terms[0][0].parse::<u64>().unwrap(), "{terms:?}");
    // The command runs under the supervisor that waited, and is still running.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(children(ahead).len(), 1, "the command runs under the supervisor started ahead");
    // A follower stopped while it waits leaves no process behind ...
    let mut stopped = e.spawn(&args);
    let its = supervisor_ahead(stopped.id());
    signal(&stopped, "-TERM");
    assert!(stopped.wait().unwrap().success());
    wait_until("a stopped follower's supervisor to exit", Duration::from_secs(10), || !alive(&its.to_string()));
    // ... nor does one killed (the parent-death signal).
    let mut killed = e.spawn(&args);
    let its = supervisor_ahead(killed.id());
    signal(&killed, "-KILL");
    let _ = killed.wait();
    wait_until("a killed follower's supervisor to exit", Duration::from_secs(10), || !alive(&its.to_string()));
    signal(&follower, "-TERM");
    assert!(follower.wait().unwrap().success());
}

#[test]
fn a_waiters_killed_supervisor_is_replaced_when_the_lock_comes() {
    let Some(e) = env("standby_waiter") else { return };
    let (release, out) = (e.file("release"), e.file("out"));
    let hold = format!("while [ ! -e {} ]; do sleep 0.05; done", release.display());
    let mut holder = e.spawn(&["lock", "standby", "--", "sh", "-c", hold.as_str()]);
    wait_until("the holder", Duration::from_secs(20), || e.json(&["locks"]).as_array().is_some_and(|a| !a.is_empty()));
    let run = format!("echo $MONGOCOORD_FENCE $MONGOCOORD_KEY > {}", out.display());
    let mut waiter = e.spawn(&["lock", "standby", "--", "sh", "-c", run.as_str()]);
    let ahead = supervisor_ahead(waiter.id());
    kill(ahead, "-KILL");
    wait_until("the supervisor ahead to be gone", Duration::from_secs(10), || !alive(&ahead.to_string()));
    std::fs::write(&release, "").unwrap();
    assert!(holder.wait().unwrap().success());
    assert!(waiter.wait().unwrap().success(), "the waiter ran its command under a supervisor started anew");
    let got = lines(&out);
    assert_eq!(got.len(), 1, "{got:?}");
    let (fence, key) = got[0].split_once(' ').unwrap();
    assert!(fence.parse::<u64>().unwrap() >= 2, "{got:?}");
    assert_eq!(key, "standby");
}

/// A signal that reached the supervisor ahead just before the word to start
/// (stopped, it takes both at once when continued) does not stop the command
/// it then starts: the runner asks for its stops in the pipe, after the word.
#[test]
fn a_signal_pending_at_the_word_does_not_stop_the_command() {
    let Some(e) = env("standby_pending") else { return };
    for sig in ["-TERM", "-USR1"] {
        let (release, out) = (e.file(format!("release{sig}").as_str()), e.file(format!("out{sig}").as_str()));
        let hold = format!("while [ ! -e {} ]; do sleep 0.05; done", release.display());
        let mut holder = e.spawn(&["lock", "pending", "--", "sh", "-c", hold.as_str()]);
        let locks = || e.json(&["locks"]);
        wait_until("the holder", Duration::from_secs(20), || {
            locks().as_array().is_some_and(|a| a.iter().any(|l| l["held"] == true))
        });
        let run = format!("sleep 0.5; echo ran > {}", out.display());
        let mut waiter = e.spawn(&["lock", "pending", "--", "sh", "-c", run.as_str()]);
        let ahead = supervisor_ahead(waiter.id());
        kill(ahead, "-STOP");
        kill(ahead, sig);
        std::fs::write(&release, "").unwrap();
        assert!(holder.wait().unwrap().success());
        // The waiter holds the lock now, and has told the stopped supervisor to start.
        wait_until("the waiter to hold the lock", Duration::from_secs(20), || {
            locks().as_array().is_some_and(|a| a.iter().any(|l| l["held"] == true))
        });
        std::thread::sleep(Duration::from_millis(200));
        kill(ahead, "-CONT");
        let status = waiter.wait().unwrap();
        assert!(status.success(), "{sig}: {status:?}");
        assert_eq!(lines(&out), ["ran"], "{sig}: the command ran to its end");
    }
}
