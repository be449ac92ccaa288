//! Running a command under a lease: it gets the fencing token in its
//! environment, is stopped (SIGTERM, then SIGKILL after a grace period) when the
//! lease is lost, and never outlives the runner, even if the runner is killed
//! with SIGKILL (a parent-death signal, through util-linux's `setpriv`).

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

/// How long a terminated command gets between SIGTERM and SIGKILL.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

/// What a supervised command did.
#[derive(Debug)]
pub(crate) struct Finished {
    /// Its exit status.
    pub(crate) status: ExitStatus,
    /// Whether it was stopped because `stop` fired.
    pub(crate) stopped: bool,
    /// Its standard output, when captured.
    pub(crate) stdout: Vec<u8>,
    /// The end of its standard error, when captured.
    pub(crate) stderr_tail: String,
}

fn setpriv() -> Option<&'static str> {
    ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| std::path::Path::new(p).exists())
}

/// Runs `argv` with extra environment; feeds `stdin` and captures output when
/// asked; stops it when `stop` fires.
pub(crate) async fn run(
    argv: &[String],
    env: &[(&str, String)],
    stdin: Option<Vec<u8>>,
    capture: bool,
    stop: &CancellationToken,
) -> std::io::Result<Finished> {
    let (program, args) = argv.split_first().ok_or_else(|| std::io::Error::other("no command given"))?;
    let mut cmd = match setpriv() {
        // The command dies with the runner: no orphan goes on acting as leader.
        Some(sp) => {
            let mut c = Command::new(sp);
            c.args(["--pdeathsig", "KILL", "--"]).arg(program).args(args);
            c
        }
        None => {
            tracing::warn!("setpriv not found: the command may outlive this runner if it is killed");
            let mut c = Command::new(program);
            c.args(args);
            c
        }
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::inherit() });
    if capture {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    cmd.kill_on_drop(true);
    let mut child = cmd.spawn()?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::spawn(async move {
            let _ = pipe.write_all(&data).await;
        });
    }
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let out_task = tokio::spawn(async move {
        let mut buf = Vec::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.read_to_end(&mut buf).await;
        }
        buf
    });
    let err_task = tokio::spawn(async move {
        let mut buf = Vec::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_end(&mut buf).await;
        }
        buf
    });
    let mut stopped = false;
    let status = tokio::select! {
        s = child.wait() => s?,
        _ = stop.cancelled() => {
            stopped = true;
            terminate(&mut child).await?
        }
    };
    let stdout = out_task.await.unwrap_or_default();
    let stderr = err_task.await.unwrap_or_default();
    let tail = String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(500)..]).into_owned();
    Ok(Finished { status, stopped, stdout, stderr_tail: tail })
}

/// SIGTERM, then SIGKILL after [`GRACE`].
async fn terminate(child: &mut tokio::process::Child) -> std::io::Result<ExitStatus> {
    if let Some(pid) = child.id() {
        // Without `unsafe` there is no `kill(2)`; the `kill` utility sends SIGTERM.
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
    }
    match tokio::time::timeout(GRACE, child.wait()).await {
        Ok(s) => s,
        Err(_) => {
            child.start_kill()?;
            child.wait().await
        }
    }
}

/// A shell-style exit code: the command's code, or 128 + the signal.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}

/// Fires on SIGTERM or SIGINT.
pub(crate) fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        t.cancel();
    });
    token
}
