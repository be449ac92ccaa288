//! Traces over OTLP: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, `mongocoord
//! enqueue` and `mongocoord agent` export their spans to a collector (here a
//! minimal OTLP/HTTP receiver in the test, decoding what it gets), the run
//! continues the enqueue's trace across the two processes, and the task's
//! command gets the run's `TRACEPARENT`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use super::{env, wait_until};

/// An OTLP/HTTP receiver: the bodies of the requests to `/v1/traces`.
pub(super) fn collector() -> (String, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let bodies = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let bodies = bodies.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                // One request after another on a kept-alive connection.
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let traces = line.starts_with("POST /v1/traces ");
                    let mut length = 0;
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap();
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    if traces {
                        bodies.lock().unwrap().push(body);
                    }
                    let reply = "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
                    if conn.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, got)
}

pub(super) fn spans(bodies: &Mutex<Vec<Vec<u8>>>) -> Vec<Span> {
    let bodies = bodies.lock().unwrap();
    let mut out = Vec::new();
    for b in bodies.iter() {
        let req = ExportTraceServiceRequest::decode(b.as_slice()).unwrap();
        for rs in req.resource_spans {
            for ss in rs.scope_spans {
                out.extend(ss.spans);
            }
        }
    }
    out
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn a_tasks_run_continues_its_enqueues_trace_across_processes() {
    let Some(e) = env("otel_trace") else { return };
    let (url, bodies) = collector();
    let out = e
        .cmd(&["enqueue", "--queue", "jobs", "--agent", "traced", r#"{"n": 1}"#])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen = e.file("traceparent");
    let script = format!("echo \"$TRACEPARENT\" > {}", seen.display());
    let out = e
        .cmd(&["agent", "traced", "--queue", "jobs", "--max-tasks", "1", "--", "sh", "-c", &script])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Each process sent its spans before it exited.
    wait_until("the spans", Duration::from_secs(10), || spans(&bodies).iter().any(|s| s.name == "mongoagent.run"));
    let all = spans(&bodies);
    let named = |n: &str| all.iter().find(|s| s.name == n).unwrap_or_else(|| panic!("no {n} span in {all:?}"));
    let (enqueue, run, complete) = (named("mongoagent.enqueue"), named("mongoagent.run"), named("mongoagent.complete"));
    assert_eq!(run.trace_id, enqueue.trace_id, "the run continues the enqueue's trace");
    assert_eq!(run.parent_span_id, enqueue.span_id, "under the enqueue");
    assert_eq!(complete.parent_span_id, run.span_id);
    let claim = named("mongoagent.claim");
    assert!(run.links.iter().any(|l| l.span_id == claim.span_id), "the run links to its claim");
    let traceparent = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(
        traceparent.trim(),
        format!("00-{}-{}-01", hex(&run.trace_id), hex(&run.span_id)),
        "the command continues the run's trace"
    );
}

#[test]
fn a_malformed_endpoint_is_a_usage_error() {
    let Some(e) = env("otel_bad_endpoint") else { return };
    let out = e
        .cmd(&["enqueue", "--queue", "jobs", "--agent", "traced", "{}"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("OTEL_EXPORTER_OTLP"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
