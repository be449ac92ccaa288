//! How the orchestrator starts its child processes: with no standard
//! streams, or with their tracing going to a file, and killed if their handle
//! is dropped (the driver's processes never outlive the run).

use std::path::Path;
use std::process::Stdio;

use crate::error::LabError;

/// Starts a child process as [`spawn_quiet`] does, its tracing (the agents'
/// and the leases' state changes, every warning) going to `trace`: what a
/// failed run's post-mortem reads.
pub(super) fn spawn_traced(mut c: tokio::process::Command, trace: &Path) -> Result<tokio::process::Child, LabError> {
    let file =
        std::fs::File::create(trace).map_err(|e| LabError::io(format!("cannot create {}", trace.display()), e))?;
    c.env("RUST_LOG", "warn,mongoagent=info,mongolock=info").env("NO_COLOR", "1");
    spawn_with(c, file.into())
}

/// Starts a child process with no standard streams, killed if its handle is
/// dropped.
pub(super) fn spawn_quiet(c: tokio::process::Command) -> Result<tokio::process::Child, LabError> {
    spawn_with(c, Stdio::null())
}

fn spawn_with(mut c: tokio::process::Command, stderr: Stdio) -> Result<tokio::process::Child, LabError> {
    let program = c.as_std().get_program().to_string_lossy().into_owned();
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| LabError::io(format!("cannot start {program}"), e))
}
