//! The runners supervise their command's whole process tree: it dies with the
//! runner (even by SIGKILL), is stopped before the lease can lapse, and is gone
//! before the lock is free, even when the runner is stopped (SIGSTOP, or SIGTSTP
//! to its process group); `agent` gives it SIGTERM when the claim is at risk,
//! caps the output it keeps and does not wait for a daemon holding stdout; a
//! second SIGINT ends the runner at once; connection variables are not passed on.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{env, lines, signal, wait_until, Env, BIN};

/// Whether a process exists and has not ended (a zombie has ended).
pub(super) fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().to_owned()))
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// The pid a command wrote to `path`, once it is there.
fn pid_in(path: &Path) -> String {
    wait_until(&format!("a pid in {}", path.display()), Duration::from_secs(30), || {
        lines(path).first().is_some_and(|l| !l.trim().is_empty())
    });
    lines(path)[0].trim().to_owned()
}

/// Waits for `child` to exit; kills it and fails when it takes longer than `limit`.
fn exits_within(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn held(e: &Env, key: &str) -> bool {
    e.json(&["locks"]).as_array().unwrap().iter().any(|l| l["key"] == key && l["held"] == true)
}

fn with_option(uri: &str, option: &str) -> String {
    let sep = if uri.contains('?') {
        "&"
    } else if uri.matches('/').count() >= 3 {
        "?"
    } else {
        "/?"
    };
    format!("{uri}{sep}{option}")
}

/// A `failCommand` failpoint that holds every `findAndModify` of one client
/// (by application name) for 4 s, once `block` sets it; off again when
/// dropped. One test at a time sets it (the server has one): the admin client
/// is held alone from `prepare` on.
struct BlockedRenewals {
    rt: tokio::runtime::Runtime,
    admin: store_test::mongo::AdminClient,
}

impl BlockedRenewals {
    /// `None` (reported) when the server has no failpoints.
    fn prepare(test: &str) -> Option<Self> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let admin = rt.block_on(store_test::mongo::admin_client(test))?;
        Some(BlockedRenewals { rt, admin })
    }

    fn block(&self, app: &str) {
        let data = bson::doc! { "failCommands": ["findAndModify"], "blockConnection": true, "blockTimeMS": 4000, "appName": app };
        let on = bson::doc! { "configureFailPoint": "failCommand", "mode": "alwaysOn", "data": data };
        self.rt.block_on(async { self.admin.database("admin").run_command(on).await }).unwrap();
    }
}

impl Drop for BlockedRenewals {
    fn drop(&mut self) {
        let off = bson::doc! { "configureFailPoint": "failCommand", "mode": "off" };
        let _ = self.rt.block_on(async { self.admin.database("admin").run_command(off).await });
    }
}

#[test]
fn the_grandchild_dies_when_the_runner_is_sigkilled() {
    let Some(e) = env("supervise_sigkill") else { return };
    let gc = e.file("grandchild");
    let script = format!("sleep 1000 & echo $! > {}; wait", gc.display());
    let mut runner = e.spawn(&["elect", "k", "--ttl", "2", "--", "sh", "-c", &script]);
    let grandchild = pid_in(&gc);
    assert!(alive(&grandchild));
    signal(&runner, "-KILL");
    let _ = runner.wait();
    wait_until("the grandchild to die with the runner", Duration::from_secs(15), || !alive(&grandchild));
}

/// Renewals stop being confirmed (the server holds them): each command's whole
/// tree, one that ignores SIGTERM included, is killed before the lease can lapse
/// on the server, so before anyone else could take the lock.
#[test]
fn a_lost_lease_stops_the_whole_tree_before_the_lock_is_free() {
    let Some(e) = env("supervise_lost") else { return };
    let Some(blocked) = BlockedRenewals::prepare("supervise_lost") else { return };
    let app = "cli-supervise-lost";
    let uri = with_option(&e.uri, &format!("appName={app}"));
    let (gc, stubborn, term_log) = (e.file("grandchild"), e.file("stubborn"), e.file("term"));
    let daemon = format!("sleep 1000 & echo $! > {}; wait", gc.display());
    let ignores_term = format!(
        "trap 'echo term >> {}' TERM; echo $$ > {}; while :; do sleep 0.2; done",
        term_log.display(),
        stubborn.display()
    );
    let start = |key: &str, lease: &[&str], script: &str| {
        Command::new(BIN)
            .args(["--uri", &uri, "--db", &e.db, "lock", key])
            .args(lease)
            .args(["--", "sh", "-c", script])
            .env_remove("MONGODB_URI")
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    };
    // The default grace period (a quarter of the ttl), and a long one, so that
    // SIGTERM surely comes well before SIGKILL on a busy machine.
    let mut runners =
        [start("daemon", &["--ttl", "2"], &daemon), start("stubborn", &["--ttl", "3", "--grace", "1"], &ignores_term)];
    let (gc, stubborn) = (pid_in(&gc), pid_in(&stubborn));
    wait_until("both locks held", Duration::from_secs(20), || held(&e, "daemon") && held(&e, "stubborn"));
    assert!(alive(&gc) && alive(&stubborn));
    blocked.block(app);
    for (key, pid, what) in [
        ("daemon", &gc, "the grandchild in the background"),
        ("stubborn", &stubborn, "the command that ignores SIGTERM"),
    ] {
        wait_until(&format!("lock {key} to lapse"), Duration::from_secs(30), || !held(&e, key));
        assert!(!alive(pid), "{what} outlived the lease");
    }
    assert!(!lines(&term_log).is_empty(), "SIGTERM came first, while the lease was at risk");
    for r in &mut runners {
        assert_eq!(exits_within(r, Duration::from_secs(30), "a runner").code(), Some(75));
    }
}

#[test]
fn a_grace_period_that_cannot_fit_the_lease_is_rejected() {
    let Some(e) = env("supervise_grace") else { return };
    for args in [
        &["lock", "k", "--ttl", "2", "--grace", "1.2", "--", "true"][..],
        &["elect", "k", "--ttl", "2", "--grace", "5", "--", "true"],
        &["agent", "a", "--queue", "q", "--ttl", "3", "--grace", "1.7", "--", "true"],
    ] {
        let out = e.run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--grace") && err.contains("does not fit"), "{args:?}: {err}");
    }
    let fits = e.run(&["lock", "k", "--ttl", "2", "--grace", "1.1", "--", "sh", "-c", "exit 3"]);
    assert_eq!(fits.status.code(), Some(3), "{}", String::from_utf8_lossy(&fits.stderr));
}

#[test]
fn agent_fails_a_task_whose_stdout_is_too_long() {
    let Some(e) = env("supervise_stdout_cap") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "chatty", "{}"]);
    // 3 MB, then it would go on for a long time.
    let script = "head -c 3000000 /dev/zero; sleep 1000";
    let mut agent = e.spawn(&[
        "agent",
        "chatty",
        "--queue",
        "jobs",
        "--max-tasks",
        "1",
        "--max-attempts",
        "1",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(exits_within(&mut agent, Duration::from_secs(60), "the agent").success());
    let task = e.json(&["tasks", "--queue", "jobs", "--list"]);
    let error = task[0]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("more than 1048576 bytes to stdout"), "{task}");
}

#[test]
fn agent_does_not_wait_for_a_daemon_holding_stdout() {
    let Some(e) = env("supervise_daemon") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "spawner", "{}"]);
    let daemon = e.file("daemon");
    let script = format!(r#"cat > /dev/null; sleep 1000 & echo $! > {}; echo '{{"done": 1}}'"#, daemon.display());
    let mut agent = e.spawn(&["agent", "spawner", "--queue", "jobs", "--max-tasks", "1", "--", "sh", "-c", &script]);
    assert!(exits_within(&mut agent, Duration::from_secs(60), "the agent").success());
    let task = e.json(&["tasks", "--queue", "jobs", "--list"]);
    assert_eq!((&task[0]["complete"], &task[0]["done"]), (&serde_json::json!(true), &serde_json::json!(1)), "{task}");
    assert!(!alive(&pid_in(&daemon)), "the daemon was stopped with its task");
}

#[test]
fn a_second_sigint_ends_the_runner_at_once() {
    let Some(e) = env("supervise_second_sigint") else { return };
    let (pid, term_log) = (e.file("pid"), e.file("term"));
    let script = format!(
        "trap 'echo term >> {}' TERM; echo $$ > {}; while :; do sleep 0.2; done",
        term_log.display(),
        pid.display()
    );
    let mut runner = e.spawn(&["lock", "k", "--ttl", "60", "--grace", "20", "--", "sh", "-c", &script]);
    let pid = pid_in(&pid);
    signal(&runner, "-INT");
    wait_until("SIGTERM to reach the command", Duration::from_secs(20), || !lines(&term_log).is_empty());
    assert!(runner.try_wait().unwrap().is_none(), "the first SIGINT waits for the grace period");
    signal(&runner, "-INT");
    let status = exits_within(&mut runner, Duration::from_secs(8), "the runner after a second SIGINT");
    assert_eq!(status.code(), Some(130));
    wait_until("the command to die with the runner", Duration::from_secs(15), || !alive(&pid));
}

#[test]
fn connection_variables_are_passed_on_only_when_asked() {
    let Some(e) = env("supervise_env") else { return };
    let script = r#"echo "${MONGODB_URI-unset} ${MONGO_HOST-unset} ${MONGO_DB-unset} fence=${MONGOCOORD_FENCE-unset}""#;
    let run = |extra: &[&str]| {
        let args = [&["lock", "envk", "--ttl", "5"][..], extra, &["--", "sh", "-c", script]].concat();
        let out = e
            .cmd(&args)
            .env("MONGODB_URI", "mongodb://secret@h/")
            .env("MONGO_HOST", "h")
            .env("MONGO_DB", "d")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(run(&[]), "unset unset unset fence=1");
    assert_eq!(run(&["--pass-env"]), "mongodb://secret@h/ h d fence=2");
}

/// The command's parent is its supervisor, so `$PPID` cannot tell runners
/// apart; `$MONGOCOORD_RUNNER_PID` does (the bench's election trials use it).
#[test]
fn the_command_is_told_its_runners_pid() {
    let Some(e) = env("supervise_runner_pid") else { return };
    let script = r#"echo "$MONGOCOORD_RUNNER_PID $PPID""#;
    let mut runner = e.cmd(&["elect", "pidk", "--ttl", "5", "--", "sh", "-c", script]);
    let child = runner.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let runner_pid = child.id().to_string();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let (told, parent) = text.trim().split_once(' ').unwrap();
    assert_eq!(told, runner_pid);
    assert_ne!(parent, runner_pid, "the command's parent is the supervisor");
}

/// The state letter of a process in `/proc/PID/stat` (`T` when stopped).
fn state(pid: &str) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())
}

/// The parent of a process.
fn parent_of(pid: &str) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(1).unwrap().to_owned()
}

/// `lock k --ttl 2 -- CMD` whose command writes its pid and its background
/// grandchild's, run in a process group of its own (the test's is not touched).
/// Returns the runner and the pids of the command and the grandchild.
fn locked_tree(e: &Env) -> (Child, String, String) {
    let (main, gc) = (e.file("main"), e.file("grandchild"));
    let script = format!("echo $$ > {}; sleep 1000 & echo $! > {}; wait", main.display(), gc.display());
    let runner = {
        use std::os::unix::process::CommandExt;
        e.cmd(&["lock", "k", "--ttl", "2", "--", "sh", "-c", &script]).stdin(Stdio::null()).process_group(0).spawn()
    }
    .unwrap();
    let (main, gc) = (pid_in(&main), pid_in(&gc));
    wait_until("the lock held", Duration::from_secs(20), || held(e, "k"));
    assert!(alive(&main) && alive(&gc));
    (runner, main, gc)
}

/// A stopped runner can neither renew nor signal: its supervisor, told the
/// lease's deadline after each renewal, kills the whole tree by itself before
/// the lease lapses on the server. Continued, the runner reports the lock lost.
#[test]
fn a_stopped_runners_command_is_killed_before_its_lease_lapses() {
    let Some(e) = env("supervise_sigstop") else { return };
    let (mut runner, main, gc) = locked_tree(&e);
    signal(&runner, "-STOP");
    wait_until("the runner stopped", Duration::from_secs(10), || state(&runner.id().to_string()) == Some('T'));
    wait_until("the lease to lapse on the server", Duration::from_secs(30), || !held(&e, "k"));
    assert!(!alive(&main), "the command outlived the lease");
    assert!(!alive(&gc), "the grandchild outlived the lease");
    signal(&runner, "-CONT");
    let status = exits_within(&mut runner, Duration::from_secs(30), "the runner, continued");
    assert_eq!(status.code(), Some(75), "the lock was lost");
}

/// A stopped supervisor acts on nothing: the runner, stopping the command
/// (SIGTERM, then SIGKILL after the grace period), kills the supervisor once
/// it has not exited a moment after the kill, and then the tree itself, before
/// it lets the lock go.
#[test]
fn a_stopped_supervisor_is_killed_by_its_runner_with_the_tree() {
    let Some(e) = env("supervise_stopped_supervisor") else { return };
    let (mut runner, main, gc) = locked_tree(&e);
    let supervisor = parent_of(&main);
    assert!(Command::new("kill").args(["-STOP", &supervisor]).status().unwrap().success());
    wait_until("the supervisor stopped", Duration::from_secs(10), || state(&supervisor) == Some('T'));
    signal(&runner, "-TERM");
    let status = exits_within(&mut runner, Duration::from_secs(20), "the runner, its supervisor stopped");
    assert_eq!(status.code(), Some(137), "the command's tree was killed: {status:?}");
    assert!(!alive(&supervisor), "the stopped supervisor was killed");
    assert!(!alive(&main) && !alive(&gc), "the tree was killed with it");
    assert!(!held(&e, "k"), "the lock is free");
}

/// Ctrl-Z (SIGTSTP to the runner's process group) stops the runner, not its
/// supervisor, which still stops the command before the lease can lapse.
#[test]
fn a_sigtstp_to_the_runners_group_does_not_stop_the_supervisor() {
    let Some(e) = env("supervise_sigtstp") else { return };
    let (mut runner, main, gc) = locked_tree(&e);
    let supervisor = parent_of(&main);
    let group = format!("-{}", runner.id());
    assert!(Command::new("kill").args(["-TSTP", "--", &group]).status().unwrap().success());
    wait_until("the runner stopped", Duration::from_secs(10), || state(&runner.id().to_string()) == Some('T'));
    assert_ne!(state(&supervisor), Some('T'), "the supervisor was stopped with the runner");
    wait_until("the lease to lapse on the server", Duration::from_secs(30), || !held(&e, "k"));
    assert!(!alive(&main) && !alive(&gc), "the command outlived the lease");
    assert!(Command::new("kill").args(["-CONT", "--", &group]).status().unwrap().success());
    let status = exits_within(&mut runner, Duration::from_secs(30), "the runner, continued");
    assert_eq!(status.code(), Some(75), "the lock was lost");
}

/// `agent`: a claim whose renewals stop being confirmed gives the command
/// SIGTERM first, while it is at risk, then kills it before it is lost.
#[test]
fn agent_gives_the_command_sigterm_when_its_claim_is_at_risk() {
    let Some(e) = env("supervise_agent_at_risk") else { return };
    let Some(blocked) = BlockedRenewals::prepare("supervise_agent_at_risk") else { return };
    let app = "cli-supervise-agent-at-risk";
    let uri = with_option(&e.uri, &format!("appName={app}"));
    e.json(&["enqueue", "--queue", "jobs", "--agent", "slow", "{}"]);
    let (pid, term_log) = (e.file("pid"), e.file("term"));
    let script = format!(
        "cat > /dev/null; trap 'echo term >> {}' TERM; echo $$ > {}; while :; do sleep 0.2; done",
        term_log.display(),
        pid.display()
    );
    let mut agent = Command::new(BIN)
        .args(["--uri", &uri, "--db", &e.db, "agent", "slow", "--queue", "jobs", "--ttl", "3", "--grace", "1"])
        .args(["--max-tasks", "1", "--max-attempts", "1", "--", "sh", "-c", &script])
        .env_remove("MONGODB_URI")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = pid_in(&pid);
    blocked.block(app);
    wait_until("the command to be stopped", Duration::from_secs(30), || !alive(&pid));
    assert!(!lines(&term_log).is_empty(), "SIGTERM came first, while the claim was at risk");
    drop(blocked);
    assert!(exits_within(&mut agent, Duration::from_secs(60), "the agent").success());
}

/// A shell loop that writes to `out` each pid listed in the files `pid_files`
/// whose process still runs (a zombie has ended): run by a second holder as it
/// starts, it says whether the first holder's tree outlived its lease.
fn still_running(pid_files: &[&Path], out: &Path) -> String {
    let files: Vec<String> = pid_files.iter().map(|p| p.display().to_string()).collect();
    format!(
        "for p in $(cat {} 2>/dev/null); do \
           if [ -r /proc/$p/status ] && ! grep -q '^State:[[:space:]]*Z' /proc/$p/status; then echo $p; fi; \
         done > {}.tmp; mv {1}.tmp {1}",
        files.join(" "),
        out.display()
    )
}

/// This process's blocked and ignored signals, as `/proc/self/status` shows them.
fn signal_masks() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = |name: &str| {
        let line = status.lines().find_map(|l| l.strip_prefix(name)).unwrap();
        u64::from_str_radix(line.trim(), 16).unwrap()
    };
    (mask("SigBlk:"), mask("SigIgn:"))
}

/// SIGKILLs each listed process that still runs, and returns their pids: what
/// a test left behind should not outlive it.
fn kill_leftovers(pids: &[&str]) -> Vec<String> {
    let left: Vec<String> = pids.iter().filter(|p| alive(p)).map(|p| (*p).to_owned()).collect();
    for p in &left {
        let _ = Command::new("kill").args(["-KILL", p]).status();
    }
    left
}

/// The supervisor blocks or handles every signal it can: a command that sends
/// its supervisor SIGQUIT, SIGALRM, SIGXCPU, SIGPWR or a real-time signal (each of which
/// ended it, and freed the lock beside a running tree) runs on to its end, and
/// SIGUSR1, the runner's own word, has the tree killed. Either way a second
/// `lock` gets the lock only once the first command's whole tree is gone.
#[test]
fn a_signal_to_the_supervisor_does_not_free_the_lock_before_the_tree_is_gone() {
    let Some(e) = env("supervise_signals") else { return };
    // The signal, and the first runner's status: the command's own, or 137 when
    // the signal had its tree killed. 36 is SIGRTMIN+2 (glibc keeps 32 and 33).
    let cases = [("QUIT", 0), ("ALRM", 0), ("XCPU", 0), ("PWR", 0), ("36", 0), ("USR1", 137)];
    let files =
        |sig: &str| (e.file(&format!("{sig}-main")), e.file(&format!("{sig}-gc")), e.file(&format!("{sig}-2nd")));
    let mut firsts: Vec<Child> = cases
        .iter()
        .map(|(sig, _)| {
            let (main, gc, _) = files(sig);
            let masks = e.file(&format!("{sig}-masks"));
            // Its masks read by `grep` as it replaces the shell, outside the
            // shell's own wait (which blocks every signal meanwhile).
            let script = format!(
                "echo $$ > {}; sleep 6 & echo $! > {}; kill -{sig} $PPID; wait; \
                 exec grep -E '^Sig(Blk|Ign)' /proc/self/status > {}",
                main.display(),
                gc.display(),
                masks.display()
            );
            e.spawn(&["lock", &format!("k{sig}"), "--ttl", "5", "--", "sh", "-c", &script])
        })
        .collect();
    let mut tree_pids = Vec::new();
    let mut seconds: Vec<Child> = cases
        .iter()
        .map(|(sig, _)| {
            let (main, gc, second) = files(sig);
            tree_pids.extend([pid_in(&main), pid_in(&gc)]);
            let check = still_running(&[&main, &gc], &second);
            e.spawn(&["lock", &format!("k{sig}"), "--ttl", "5", "--timeout", "60", "--", "sh", "-c", &check])
        })
        .collect();
    // Every case is looked at before the test fails, so a failure names them all.
    let mut wrong = Vec::new();
    let ours = signal_masks();
    for (((sig, code), first), second) in cases.iter().zip(&mut firsts).zip(&mut seconds) {
        let status = exits_within(second, Duration::from_secs(90), "the second holder");
        assert!(status.success(), "SIG{sig}: the second holder: {status}");
        let overlap = lines(&files(sig).2);
        if !overlap.is_empty() {
            wrong.push(format!("SIG{sig}: the first command's tree ran beside the second holder: {overlap:?}"));
        }
        let status = exits_within(first, Duration::from_secs(30), "the first holder");
        if status.code() != Some(*code) {
            wrong.push(format!("SIG{sig}: the first holder: {status}, not {code}"));
        }
        // The command starts with the signals this test blocks, and ignores no
        // more than it does (the supervisor's handlers go back to the default
        // at exec); 32 and 33, the C library's own, come ignored from its
        // posix_spawn. SIGUSR1 had it killed before it could tell.
        let masks = lines(&e.file(&format!("{sig}-masks")));
        let mask = |i: usize| masks.get(i).and_then(|l| u64::from_str_radix(l.split(':').nth(1)?.trim(), 16).ok());
        let told = (mask(0), mask(1));
        let as_ours = told.0 == Some(ours.0) && told.1.is_some_and(|ign| ign & !(ours.1 | 0x1_8000_0000) == 0);
        if *code == 0 && !as_ours {
            wrong.push(format!("SIG{sig}: the command's signal masks: {masks:?}, this test's {ours:x?}"));
        }
    }
    let pids: Vec<&str> = tree_pids.iter().map(String::as_str).collect();
    let left = kill_leftovers(&pids);
    assert!(wrong.is_empty() && left.is_empty(), "{wrong:#?}; left running: {left:?}");
}

/// SIGKILL cannot be blocked: when the supervisor gets it, the runner (a child
/// subreaper too) adopts the tree, kills the command's group and every
/// descendant, a daemon in a session of its own included, and reaps them
/// before it frees the lock. The supervisor's process name is not
/// `mongocoord`, so `pkill mongocoord`, meant for runners, spares it.
#[test]
fn a_sigkilled_supervisors_tree_is_killed_before_the_lock_is_free() {
    let Some(e) = env("supervise_supervisor_sigkill") else { return };
    let (main, gc, daemon, second) = (e.file("main"), e.file("gc"), e.file("daemon"), e.file("second"));
    let script = format!(
        "echo $$ > {}; (setsid sh -c 'echo $$ > {}; exec sleep 60' &); sleep 60 & echo $! > {}; wait",
        main.display(),
        daemon.display(),
        gc.display()
    );
    let mut first = e.spawn(&["lock", "k", "--ttl", "5", "--", "sh", "-c", &script]);
    let pids = [pid_in(&main), pid_in(&gc), pid_in(&daemon)];
    wait_until("the lock held", Duration::from_secs(20), || held(&e, "k"));
    let supervisor = parent_of(&pids[0]);
    assert_eq!(parent_of(&pids[2]), supervisor, "the daemon was adopted by the supervisor");
    let comm = std::fs::read_to_string(format!("/proc/{supervisor}/comm")).unwrap();
    assert!(!comm.contains("mongocoord"), "the supervisor's process name: {comm}");
    let pgrep = Command::new("pgrep").args(["-x", "mongocoord"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&pgrep.stdout).lines().any(|p| p == supervisor), "pgrep -x mongocoord");
    assert!(Command::new("kill").args(["-KILL", &supervisor]).status().unwrap().success());
    let check = still_running(&[&main, &gc, &daemon], &second);
    let mut next = e.spawn(&["lock", "k", "--ttl", "5", "--timeout", "60", "--", "sh", "-c", &check]);
    assert!(exits_within(&mut next, Duration::from_secs(90), "the second holder").success());
    let overlap = lines(&second);
    let status = exits_within(&mut first, Duration::from_secs(30), "the first holder");
    let left = kill_leftovers(&[&pids[0], &pids[1], &pids[2]]);
    assert!(overlap.is_empty(), "the first command's tree ran beside the second holder: {overlap:?}");
    assert!(left.is_empty(), "outlived the killed supervisor: {left:?}");
    assert_eq!(status.code(), Some(137), "the first holder reports the supervisor's SIGKILL");
}

/// `agent`: a task whose supervisor is killed (SIGKILL) is failed and retried
/// only once its run's tree is gone, and one whose supervisor gets SIGQUIT runs
/// once, to its end. Each run records whether an earlier run of its task
/// still runs as it starts.
#[test]
fn agent_never_runs_a_task_again_while_an_earlier_run_lives() {
    let Some(e) = env("supervise_agent_retry") else { return };
    // The signal, and how many runs it takes: the first two runs signal their
    // supervisor, and a run that survives that ends the task.
    let cases = [("KILL", 3), ("QUIT", 1)];
    let files =
        |sig: &str| (e.file(&format!("{sig}-pids")), e.file(&format!("{sig}-runs")), e.file(&format!("{sig}-overlap")));
    let mut agents: Vec<Child> = cases
        .iter()
        .map(|(sig, _)| {
            let name = format!("sig{sig}");
            e.json(&["enqueue", "--queue", "jobs", "--agent", &name, "{}"]);
            let (pids, runs, overlap) = files(sig);
            let script = format!(
                "cat > /dev/null; {check}; cat {overlap}.now >> {overlap}; \
                 echo run >> {runs}; sleep 8 & echo \"$$ $!\" >> {pids}; \
                 if [ $(wc -l < {runs}) -le 2 ]; then kill -{sig} $PPID; fi; wait",
                check = still_running(&[&pids], &e.file(&format!("{sig}-overlap.now"))),
                overlap = overlap.display(),
                runs = runs.display(),
                pids = pids.display(),
            );
            e.spawn(&[
                "agent",
                &name,
                "--queue",
                "jobs",
                "--ttl",
                "5",
                "--max-attempts",
                "3",
                "--",
                "sh",
                "-c",
                &script,
            ])
        })
        .collect();
    let mut wrong = Vec::new();
    for (sig, runs) in cases {
        let name = format!("sig{sig}");
        let task = || e.json(&["tasks", "--queue", "jobs", "--agent", &name, "--list"])[0].clone();
        wait_until(&format!("the {name} task to end"), Duration::from_secs(90), || task()["complete"] == true);
        let (pids, run_log, overlap) = files(sig);
        let overlap = lines(&overlap);
        let pids: Vec<String> =
            lines(&pids).iter().flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>()).collect();
        let left = kill_leftovers(&pids.iter().map(String::as_str).collect::<Vec<_>>());
        let (ran, task) = (lines(&run_log).len(), task());
        for (bad, what) in [
            (!overlap.is_empty(), format!("a run started while an earlier one ran: {overlap:?}")),
            (!left.is_empty(), format!("runs outlived their task: {left:?}")),
            (ran != runs, format!("{ran} runs, not {runs}")),
            (task["error_encountered"] == true, format!("it failed: {task}")),
        ] {
            if bad {
                wrong.push(format!("SIG{sig}: {what}"));
            }
        }
    }
    for a in &mut agents {
        signal(a, "-TERM");
        assert!(exits_within(a, Duration::from_secs(30), "an agent").success());
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
