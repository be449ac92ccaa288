//! Second outside review of `mongocoord`'s traces (#33): a foreign
//! `tracestate` the command's environment cannot carry, where a long-running
//! agent handed a `TRACEPARENT` puts its claims, an agent SIGTERMed while
//! its exporter hangs, a command killed by a signal, and `TRACESTATE`
//! of 33 members or with a 600-byte member, and the command inheriting the
//! `TRACEPARENT`/`TRACESTATE` its `mongocoord` was started with.
//!
//! Each test says in its doc comment whether the attack HELD (the test
//! passes) or was FOUND (it failed before its fix, and passes now).

use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bson::{doc, Document};

use super::otel::{collector, hex, spans};
use super::review_otel::{black_hole, stderr, task};
use super::{env, wait_until};

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// FOUND, fixed (it failed before). Bad trace fields in a task document are "ignored as documented,
/// never … a lost task"; `TraceContext` says a malformed `tracestate` is
/// dropped and the `traceparent` kept. A foreign producer's task whose
/// `tracestate` value holds a NUL (not a W3C value: printable ASCII only)
/// is kept whole by `TraceContext`, handed to the command as `TRACESTATE`,
/// and `Command::env` with a NUL cannot spawn: every attempt fails with
/// "cannot run "sh": nul byte found in provided data", and the task fails
/// for good without its command ever running. A trace field decides
/// whether the task runs.
#[test]
fn a_foreign_tracestate_with_a_nul_does_not_keep_the_command_from_running() {
    let Some(e) = env("review_otel2_nul_state") else { return };
    e.insert_raw(
        "jobs",
        vec![doc! { "_id": "nul", "agent_name": "a", "ready": true,
        "trace_context": { "traceparent": format!("00-{TRACE}-b7ad6b7169203331-01"), "tracestate": "vendor=a\u{0}b" } }],
    );
    let stored = task(&e, "jobs", "nul");
    assert_eq!(
        stored.get_document("trace_context").unwrap().get_str("tracestate").ok(),
        Some("vendor=a\u{0}b"),
        "the server keeps the NUL (else the test is vacuous): {stored:?}"
    );
    let seen = e.file("ran");
    let script = format!("echo \"$TRACEPARENT\" > {}", seen.display());
    let out =
        e.run(&["agent", "a", "--queue", "jobs", "--max-tasks", "1", "--max-attempts", "1", "--", "sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d = task(&e, "jobs", "nul");
    assert!(
        seen.exists() && d.get_bool("error_encountered").ok() != Some(true),
        "the command never ran; the task: {:?}",
        d.get_str("last_error")
    );
    let tp = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(tp.trim().split('-').nth(1), Some(TRACE), "the traceparent is kept: {tp}");
}

/// FOUND, fixed (it failed before). A long-running `mongocoord agent` started with `TRACEPARENT` set
/// (by a traced script, a CI step, another task's command) and exporting:
/// its runs of untraced tasks are roots of their own traces, on purpose
/// ("a worker loop's span would otherwise hold every run it ever made",
/// `trace.rs`), and each run links to its claim; but the claim spans are
/// made from the global provider in the current OpenTelemetry context,
/// which `tracing-opentelemetry` (context activation, on by default) sets
/// to the whole command's `mongocoord` span: every claim the agent ever
/// makes lands in the launcher's trace, one trace growing for the agent's
/// lifetime, and unrelated to the tasks it claims. A claim should start
/// its own trace (a root, as the run's "receive" span it is linked from).
#[test]
fn a_long_running_agent_handed_a_traceparent_keeps_its_claims_out_of_that_trace() {
    let Some(e) = env("review_otel2_claims") else { return };
    for i in 0..3 {
        let id = format!("t{i}");
        e.json(&["enqueue", "--queue", "jobs", "--agent", "a", "--id", &id, "{}"]);
    }
    let (url, bodies) = collector();
    let handed = format!("00-{TRACE}-b7ad6b7169203331-01");
    let out = e
        .cmd(&[
            "agent",
            "a",
            "--queue",
            "jobs",
            "--max-tasks",
            "3",
            "--prefetch",
            "0",
            "--",
            "sh",
            "-c",
            "cat >/dev/null",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("TRACEPARENT", &handed)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until("three runs exported", Duration::from_secs(10), || {
        spans(&bodies).iter().filter(|s| s.name == "mongoagent.run").count() == 3
    });
    let all = spans(&bodies);
    let runs: Vec<_> = all.iter().filter(|s| s.name == "mongoagent.run").collect();
    for r in &runs {
        assert_ne!(hex(&r.trace_id), TRACE, "a run of an untraced task is its own root (as designed)");
    }
    let claims: Vec<_> = all.iter().filter(|s| s.name == "mongoagent.claim").collect();
    assert!(!claims.is_empty(), "claim spans exported");
    let in_launcher: Vec<String> =
        claims.iter().filter(|c| hex(&c.trace_id) == TRACE).map(|c| hex(&c.parent_span_id)).collect();
    assert!(
        in_launcher.is_empty(),
        "{} of {} claim spans are in the launcher's trace {TRACE} (parents {in_launcher:?}), while the runs linking to them are not",
        in_launcher.len(),
        claims.len()
    );
}

/// HELD if it passes. An agent exporting to a collector that never answers,
/// SIGTERMed while its task's command runs: it stops the command, exits 0
/// within a few seconds (the exporter's hung request does not hold it
/// up), and the task is not lost: a second agent (exporting nothing) runs
/// it to completion in the producer's trace.
#[test]
fn an_agent_sigtermed_while_its_exporter_hangs_exits_and_loses_nothing() {
    let Some(e) = env("review_otel2_sigterm") else { return };
    e.insert_raw(
        "jobs",
        vec![doc! { "_id": "long", "agent_name": "a", "ready": true,
        "trace_context": { "traceparent": format!("00-{TRACE}-b7ad6b7169203331-01") } }],
    );
    let started = e.file("started");
    let script = format!("cat >/dev/null; touch {}; exec sleep 60", started.display());
    let mut child = e
        .cmd(&["agent", "a", "--queue", "jobs", "--max-tasks", "1", "--grace", "1", "--", "sh", "-c", &script])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", black_hole())
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the command started", Duration::from_secs(20), || started.exists());
    // Let the batch processor start an export (hung on the black hole).
    std::thread::sleep(Duration::from_millis(300));
    let at = Instant::now();
    let st = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if at.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the agent did not exit within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = at.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    eprintln!("review_otel2: SIGTERM to exit with a hung exporter: {took:?}: {err}");
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(took < Duration::from_secs(6), "exit took {took:?}");
    let seen = e.file("traceparent");
    let script = format!("echo \"$TRACEPARENT\" > {}", seen.display());
    let out = e.run(&["agent", "a", "--queue", "jobs", "--max-tasks", "1", "--", "sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d = task(&e, "jobs", "long");
    assert_eq!(d.get_bool("complete").ok(), Some(true), "{d:?}");
    let tp = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(tp.trim().split('-').nth(1), Some(TRACE), "{tp}");
}

/// HELD if it passes. A command killed by a signal: the attempt's failure
/// is exported as a `mongoagent.fail` span with an error status under the
/// run, in the producer's trace, and the task is retried (not lost).
#[test]
fn a_command_killed_by_a_signal_is_a_fail_span_and_a_retry() {
    let Some(e) = env("review_otel2_signal") else { return };
    e.insert_raw(
        "jobs",
        vec![doc! { "_id": "killed", "agent_name": "a", "ready": true,
        "trace_context": { "traceparent": format!("00-{TRACE}-b7ad6b7169203331-01") } }],
    );
    let (url, bodies) = collector();
    let out = e
        .cmd(&["agent", "a", "--queue", "jobs", "--max-tasks", "1", "--", "sh", "-c", "cat >/dev/null; kill -KILL $$"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until("the fail span", Duration::from_secs(10), || spans(&bodies).iter().any(|s| s.name == "mongoagent.fail"));
    let all = spans(&bodies);
    let run = all.iter().find(|s| s.name == "mongoagent.run").unwrap();
    let fail = all.iter().find(|s| s.name == "mongoagent.fail").unwrap();
    assert_eq!(hex(&run.trace_id), TRACE);
    assert_eq!(fail.parent_span_id, run.span_id);
    let status = fail.status.as_ref().expect("a status");
    assert_eq!(status.code, 2, "error: {status:?}");
    let d = task(&e, "jobs", "killed");
    assert_eq!(d.get_bool("ready").ok(), Some(true), "retried: {d:?}");
    assert_eq!(
        d.get_document("trace_context").ok().and_then(|c| c.get_str("traceparent").ok()).map(|t| t.contains(TRACE)),
        Some(true)
    );
}

/// HELD if it passes. `TRACESTATE` of 33 members handed to `mongocoord
/// enqueue` (exporting nothing): the task stores the trace and the first 32
/// members (W3C's limit); with a 600-byte member (past the 256 a value may
/// have) the malformed `tracestate` is dropped and the `traceparent` kept;
/// non-UTF-8 `TRACEPARENT` is ignored. None fails the enqueue.
#[test]
fn tracestate_of_33_members_or_600_bytes_is_bounded_or_dropped() {
    use std::os::unix::ffi::OsStrExt as _;
    let Some(e) = env("review_otel2_tracestate") else { return };
    let parent = format!("00-{TRACE}-b7ad6b7169203331-01");
    let enqueue = |id: &str, parent: &std::ffi::OsStr, state: &str| {
        let out = e
            .cmd(&["enqueue", "--queue", "jobs", "--agent", "a", "--id", id, "{}"])
            .env("TRACEPARENT", parent)
            .env("TRACESTATE", state)
            .output()
            .unwrap();
        assert!(out.status.success(), "{id}: {}", stderr(&out));
        task(&e, "jobs", id)
    };
    let many: Vec<String> = (0..33).map(|i| format!("k{i}=v{i}")).collect();
    let d = enqueue("many", parent.as_ref(), &many.join(","));
    let cx = d.get_document("trace_context").unwrap();
    assert_eq!(cx.get_str("traceparent").ok(), Some(parent.as_str()));
    assert_eq!(cx.get_str("tracestate").ok(), Some(many[..32].join(",").as_str()), "{cx:?}");
    let d = enqueue("long", parent.as_ref(), &format!("vendor={}", "x".repeat(600)));
    let cx = d.get_document("trace_context").unwrap();
    assert_eq!(cx.get_str("traceparent").ok(), Some(parent.as_str()));
    assert!(cx.get("tracestate").is_none(), "{cx:?}");
    let mut bytes = parent.clone().into_bytes();
    bytes[10] = 0xff;
    let d = enqueue("bytes", std::ffi::OsStr::from_bytes(&bytes), "k=v");
    assert!(d.get("trace_context").is_none(), "{d:?}");
}

/// FOUND, fixed (it failed before). `mongocoord cron` started with `TRACEPARENT` set (a traced
/// deploy script, a CI step, a task's command that starts it), exporting
/// nothing. The tick tasks store no trace (HELD: the scheduler's enqueues
/// are outside the handed scope), yet every tick's command, for the
/// process's whole lifetime, gets the launcher's `TRACEPARENT`: `trace_env`
/// adds the variables only when the run has a trace, and otherwise the
/// command inherits `mongocoord`'s own environment, `TRACEPARENT` and
/// `TRACESTATE` included. Days of unrelated ticks' commands (and whatever
/// they enqueue with `mongocoord enqueue`) land in one stale trace. A
/// command of a task with no trace should get no `TRACEPARENT`.
#[test]
fn a_cron_ticks_command_is_not_handed_the_cron_processs_own_traceparent() {
    let Some(e) = env("review_otel2_cron") else { return };
    let ledger = e.file("ledger");
    let script = format!("cat >/dev/null; echo \"$TRACEPARENT\" >> {}", ledger.display());
    let mut p = e
        .cmd(&["cron", "tick", "--every", "1", "--", "sh", "-c", &script])
        .env("TRACEPARENT", format!("00-{TRACE}-b7ad6b7169203331-01"))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("two ticks", Duration::from_secs(30), || super::lines(&ledger).len() >= 2);
    let st = std::process::Command::new("kill").args(["-TERM", &p.id().to_string()]).status().unwrap();
    assert!(st.success());
    assert!(p.wait().unwrap().success());
    let ticks: Vec<Document> = e.raw("cron").into_iter().filter(|d| d.get_str("agent_name").is_ok()).collect();
    assert!(ticks.len() >= 2, "{ticks:?}");
    let in_launcher: Vec<String> = ticks
        .iter()
        .filter(|d| {
            d.get_document("trace_context")
                .ok()
                .and_then(|c| c.get_str("traceparent").ok())
                .is_some_and(|t| t.contains(TRACE))
        })
        .map(|d| d.get("_id").map(ToString::to_string).unwrap_or_default())
        .collect();
    let handed: Vec<String> = super::lines(&ledger).into_iter().filter(|l| l.contains(TRACE)).collect();
    assert!(
        in_launcher.is_empty() && handed.is_empty(),
        "ticks stored in the launcher's trace: {in_launcher:?}; tick commands handed it: {handed:?}"
    );
}

/// FOUND, fixed (it failed before). "A task's command gets `TRACEPARENT` and `TRACESTATE` (from the
/// run, …)": an exporting `mongocoord agent` started with `TRACEPARENT`
/// and `TRACESTATE=launcher=1` runs a task whose producer's trace carries
/// no `tracestate`. The command gets the run's `TRACEPARENT`, but
/// `TRACESTATE` is not set by `trace_env` when the run's is empty, so the
/// launcher's `launcher=1` is inherited and paired with the run's
/// `TRACEPARENT`: a trace state forged onto another trace (a vendor's
/// sampling or tenant decision of one trace applied to another). The
/// companion variable should be removed when there is no state to hand.
#[test]
fn a_commands_tracestate_is_the_runs_not_the_agents_launchers() {
    let Some(e) = env("review_otel2_state_mix") else { return };
    e.insert_raw(
        "jobs",
        vec![doc! { "_id": "plain", "agent_name": "a", "ready": true,
        "trace_context": { "traceparent": format!("00-{TRACE}-b7ad6b7169203331-01") } }],
    );
    let (url, _bodies) = collector();
    let seen = e.file("vars");
    let script = format!("cat >/dev/null; echo \"$TRACEPARENT|${{TRACESTATE-unset}}\" > {}", seen.display());
    let out = e
        .cmd(&["agent", "a", "--queue", "jobs", "--max-tasks", "1", "--", "sh", "-c", &script])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("TRACEPARENT", "00-11111111111111111111111111111111-2222222222222222-01")
        .env("TRACESTATE", "launcher=1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let vars = std::fs::read_to_string(&seen).unwrap();
    let (tp, ts) = vars.trim().split_once('|').unwrap();
    assert_eq!(tp.split('-').nth(1), Some(TRACE), "the run's trace: {vars}");
    assert_eq!(ts, "unset", "TRACESTATE handed with the run's TRACEPARENT: {vars:?}");
}

/// A collector that answers every connection with `reply`, then (if
/// `trickle`) a byte every 50 ms forever.
fn answering(reply: &'static [u8], trickle: bool) -> String {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = conn.read(&mut buf);
                if conn.write_all(reply).is_err() {
                    return;
                }
                if !trickle {
                    return;
                }
                loop {
                    std::thread::sleep(Duration::from_millis(50));
                    if conn.write_all(b"1\r\nx\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// HELD if it passes. A collector that answers garbage (bytes that are not
/// HTTP), a 200 whose protobuf body is garbage, a 500 with a body, or a
/// chunked 200 that trickles forever: `mongocoord enqueue` succeeds, stores
/// its task, and exits within 2 s of its time without a collector.
#[test]
fn a_collector_that_answers_garbage_neither_fails_nor_holds_up_a_command() {
    let Some(e) = env("review_otel2_garbage") else { return };
    let enqueue = |id: &str, url: Option<&str>| {
        let mut c = e.cmd(&["enqueue", "--queue", "jobs", "--agent", "g", "--id", id, "{}"]);
        if let Some(u) = url {
            c.env("OTEL_EXPORTER_OTLP_ENDPOINT", u);
        }
        let at = Instant::now();
        let out = c.stdin(Stdio::null()).output().unwrap();
        (at.elapsed(), out)
    };
    let (base, out) = enqueue("base", None);
    assert!(out.status.success(), "{}", stderr(&out));
    let cases: [(&str, &'static [u8], bool); 4] = [
        ("not_http", b"\x00\xffgarbage\r\n\r\n not http at all", false),
        ("bad_proto", b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 7\r\n\r\n\xff\xff\xff\xff\xff\xff\xff", false),
        ("error", b"HTTP/1.1 500 Oops\r\nContent-Length: 5\r\n\r\noops!", false),
        ("trickle", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", true),
    ];
    for (id, reply, trickle) in cases {
        let url = answering(reply, trickle);
        let (took, out) = enqueue(id, Some(&url));
        eprintln!("review_otel2: collector {id}: {took:?} (base {base:?}): {}", stderr(&out));
        assert!(out.status.success(), "{id}: {}", stderr(&out));
        assert!(took < base + Duration::from_secs(2), "{id}: exit delayed by {:?}", took.saturating_sub(base));
        task(&e, "jobs", id);
    }
}
