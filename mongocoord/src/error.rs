//! The command line's one error type, [`CliError`], and its exit statuses.
//!
//! Each variant keeps the error it came from (`source()`), so a caller can
//! tell a store fault from a refused argument by its type, not its message.
//! [`CliError::exit_code`] is the one place that decides the exit status of a
//! run that failed; outcomes that are no failure of the tool (the command's
//! own status, a question answered "no", a schedule that does not exist) are
//! `Ok` statuses of the subcommands instead.
//!
//! `main` prints one line, `mongocoord: {error}`: each message therefore says
//! what its source says too (as `StoreError::Backend` does), and nothing walks
//! the source chain to print it. That also keeps secrets out: the store
//! withholds a driver message that quotes a URI's secret, but only from its
//! own message, and the driver's error may still be a source below it.

use std::time::Duration;

use mongoagent::AgentError;
use mongoelector::ElectorError;
use mongolock::LockError;
use store_trait::StoreError;

/// Exit status when the process could not start (no runtime, or the
/// supervisor could not name itself).
pub(crate) const EXIT_FAILURE: u8 = 1;
/// Exit status for bad arguments or an unreachable server, and for any other
/// failure of the tool itself.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit status when the lock could not be acquired within `--timeout`, or a
/// task waited for (`enqueue --wait`) had not ended within `--wait-timeout`.
pub(crate) const EXIT_TIMEOUT: u8 = 74;
/// Exit status when the lock was lost while the command ran.
pub(crate) const EXIT_LOST: u8 = 75;

/// Everything a `mongocoord` subcommand can fail with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// Input that was refused before anything was done: an option out of
    /// range, a missing command, a selection given twice, JSON of the wrong
    /// shape. The message says which and why.
    #[error("{0}")]
    Invalid(String),
    /// JSON that could not be parsed; `what` says whose ("the filter is not
    /// valid JSON").
    #[error("{what}: {source}")]
    Json {
        /// What was read, and that it failed.
        what: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// JSON that cannot be stored as a BSON document (a number out of range,
    /// a malformed `$oid`); `what` says whose ("the task cannot be stored").
    #[error("{what}: {source}")]
    Bson {
        /// What was converted, and that it failed.
        what: String,
        /// The conversion's error.
        #[source]
        source: bson::error::Error,
    },
    /// A file, socket or process could not be used; `what` says which
    /// ("cannot read --uri-file PATH").
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A system call of the supervisor failed (`prctl`); `what` says which.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: nix::errno::Errno,
    },
    /// The trace exporter the environment asks for cannot be built (status 2).
    #[cfg(feature = "otel")]
    #[error("OTEL_EXPORTER_OTLP_*: {0}")]
    Telemetry(#[source] opentelemetry_otlp::ExporterBuildError),
    /// No runtime could be started (status 1).
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The supervisor could not name its process before its runtime started
    /// (status 1).
    #[error("cannot set the process name: {0}")]
    ProcessName(#[source] nix::errno::Errno),
    /// The server could not be used. `target` is the connection as it may be
    /// shown: the URI with its password and secret options hidden.
    #[error("cannot use {target}: {source}")]
    Connect {
        /// The redacted URI and the database.
        target: String,
        /// Why: an invalid URI, an unreachable server, refused credentials.
        #[source]
        source: StoreError,
    },
    /// The store failed, or refused a name (a collection, a key).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A lock failed; [`LockError::Timeout`] is status 74.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The elector failed.
    #[error(transparent)]
    Elector(#[from] ElectorError),
    /// A queue, agent or schedule operation failed.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The driver failed, on a call the store does not wrap (the demo's drop of
    /// its collections).
    #[error(transparent)]
    Driver(#[from] mongodb::error::Error),
    /// What a `cron` line defines (its schedule, its queue, its agent) was
    /// refused: the library's reason, without its "invalid agent
    /// configuration" prefix (the line is the configuration).
    #[error("{}", cron_line_reason(.0))]
    CronLine(#[source] AgentError),
    /// The scheduler of a `cron` line failed for good.
    #[error("the scheduler of {name} stopped: {source}")]
    Scheduler {
        /// The schedule's name.
        name: String,
        /// Why it stopped.
        #[source]
        source: AgentError,
    },
    /// A background task of the tool ended without its result (it panicked or
    /// was cancelled); `what` says which.
    #[error("{what}: {source}")]
    Join {
        /// The task, and that it stopped.
        what: String,
        /// The runtime's account of it.
        #[source]
        source: tokio::task::JoinError,
    },
    /// An error of reading something, with what was being read ("the
    /// confirmation's ids cannot be read").
    #[error("{what}: {source}")]
    Context {
        /// What was being read, and that it failed.
        what: String,
        /// Why.
        #[source]
        source: Box<CliError>,
    },
    /// Something the subcommand waits on ended before it did ("elector", "the
    /// event feed").
    #[error("{0} stopped")]
    Stopped(&'static str),
    /// The task asked for was found but cannot be read (another program's
    /// document, a field of the wrong type).
    #[error("the task cannot be read: {0}")]
    UnreadableTask(#[source] StoreError),
    /// No random bytes for the dashboard's token.
    #[error("no randomness for the dashboard token: {0}")]
    Random(#[source] getrandom::Error),
    /// The metrics could not be encoded.
    #[error("cannot encode the metrics: {0}")]
    Encode(#[source] std::fmt::Error),
    /// A task waited for (`enqueue --wait`) had not ended within
    /// `--wait-timeout` (status 74).
    #[error("task {task} has not ended after {after:?}")]
    NotEnded {
        /// The task's id.
        task: String,
        /// How long it was waited for.
        after: Duration,
    },
    /// The lock of `mongocoord lock` was lost while its command ran, or before
    /// it was released (status 75).
    #[error("lock {key} {how}")]
    LockLost {
        /// The lock's key.
        key: String,
        /// When it was found lost, and what became of the command.
        how: Lost,
    },
    /// Releasing the lock of `mongocoord lock` failed after its command ended:
    /// it may have been lost meanwhile (status 75).
    #[error("lock {key}: {source}")]
    Release {
        /// The lock's key.
        key: String,
        /// Why the release failed.
        #[source]
        source: LockError,
    },
}

/// When a lock was found lost while its command ran, and what became of the
/// command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// The lease was lost: the command was killed at once.
    Killed,
    /// The lease could not be renewed in time: the command was stopped
    /// (SIGTERM, then SIGKILL) before it could lapse.
    AtRisk,
    /// The command ended by itself, but the lease was lost by then.
    AfterTheCommand,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Lost::Killed => "was lost; the command was killed",
            Lost::AtRisk => "could not be renewed in time; the command was stopped",
            Lost::AfterTheCommand => "was lost",
        })
    }
}

/// Why a `cron` line was refused, as its error says it.
fn cron_line_reason(e: &AgentError) -> String {
    match e {
        AgentError::Config(c) => c.reason().to_owned(),
        other => other.to_string(),
    }
}

impl CliError {
    /// A refused input, with its message.
    pub(crate) fn invalid(message: impl Into<String>) -> CliError {
        CliError::Invalid(message.into())
    }

    /// This error, as the reason `what` failed.
    pub(crate) fn context(self, what: impl Into<String>) -> CliError {
        CliError::Context { what: what.into(), source: Box::new(self) }
    }

    /// A failed I/O operation, `what` saying which.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> CliError {
        CliError::Io { what: what.into(), source }
    }

    /// The process's exit status for this error: the one place that decides
    /// it. As documented (README, `mongocoord --help`): 74 when the lock was
    /// not acquired within `--timeout` or a waited-for task had not ended
    /// within `--wait-timeout`, 75 when the lock was lost while the command
    /// ran, 1 when the process could not start, and 2 for everything else:
    /// bad input, an unreachable server, any other failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Lock(LockError::Timeout { .. }) | CliError::NotEnded { .. } => EXIT_TIMEOUT,
            CliError::LockLost { .. } | CliError::Release { .. } => EXIT_LOST,
            CliError::Runtime(_) | CliError::ProcessName(_) => EXIT_FAILURE,
            _ => EXIT_USAGE,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::error::Error as _;

    use super::*;

    #[test]
    fn exit_codes() {
        let timeout = LockError::Timeout { key: "k".into(), waited: Duration::from_secs(1), holder: None };
        assert_eq!(CliError::from(timeout).exit_code(), EXIT_TIMEOUT);
        let not_ended = CliError::NotEnded { task: "t".into(), after: Duration::from_secs(1) };
        assert_eq!(not_ended.exit_code(), EXIT_TIMEOUT);
        assert_eq!(CliError::LockLost { key: "k".into(), how: Lost::Killed }.exit_code(), EXIT_LOST);
        let release = CliError::Release { key: "k".into(), source: LockError::NotHeld { key: "k".into() } };
        assert_eq!(release.exit_code(), EXIT_LOST);
        assert_eq!(CliError::Runtime(std::io::Error::other("x")).exit_code(), EXIT_FAILURE);
        assert_eq!(CliError::ProcessName(nix::errno::Errno::EPERM).exit_code(), EXIT_FAILURE);
        let subreaper = CliError::Os { what: "cannot become a child subreaper", source: nix::errno::Errno::EPERM };
        assert_eq!(subreaper.exit_code(), EXIT_USAGE);
        assert_eq!(CliError::invalid("--ttl must be …").exit_code(), EXIT_USAGE);
        let unreachable = StoreError::backend(store_trait::FaultKind::Unreachable, "no server");
        assert_eq!(CliError::Connect { target: "mongodb://h".into(), source: unreachable }.exit_code(), EXIT_USAGE);
        let held = LockError::NotHeld { key: "k".into() };
        assert_eq!(CliError::from(held).exit_code(), EXIT_USAGE, "only a timeout of a lock is 74");
    }

    #[test]
    fn messages_say_what_their_source_says_and_keep_it() {
        let e = CliError::Connect {
            target: "mongodb://h (database d)".into(),
            source: StoreError::backend(store_trait::FaultKind::Unreachable, "no server"),
        };
        assert_eq!(e.to_string(), "cannot use mongodb://h (database d): unreachable store fault: no server");
        assert!(e.source().unwrap().downcast_ref::<StoreError>().is_some());
        let json = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let e = CliError::Json { what: "the filter is not valid JSON".into(), source: json };
        assert!(e.to_string().starts_with("the filter is not valid JSON: EOF"), "{e}");
        assert!(e.source().unwrap().downcast_ref::<serde_json::Error>().is_some());
        let e = CliError::LockLost { key: "nightly".into(), how: Lost::AtRisk };
        assert_eq!(e.to_string(), "lock nightly could not be renewed in time; the command was stopped");
        let e = CliError::CronLine(AgentError::Config("time zone \"Mars\": unknown".into()));
        assert_eq!(e.to_string(), "time zone \"Mars\": unknown");
        assert!(e.source().unwrap().downcast_ref::<AgentError>().is_some());
    }
}
