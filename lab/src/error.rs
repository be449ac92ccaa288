//! The lab's one error type, [`LabError`], and the exit status of a run that
//! failed with it.
//!
//! Each variant keeps the error it came from (`source()`), so a caller can
//! tell a store fault from a refused argument or a broken promise by its type,
//! not its message. `main` prints one line, `lab: {error}`: each message
//! therefore says what its source says too, and what was being done.
//!
//! Outcomes that are no failure of the lab itself are `Ok` statuses instead:
//! a chaos run that found violations, a bench run that lost figures (both 1).

use std::time::Duration;

use mongoagent::AgentError;
use mongoelector::ElectorError;
use mongolock::LockError;
use store_mongo::mongodb;
use store_trait::StoreError;

/// Exit status of a run that failed with a [`LabError`]: bad arguments, an
/// unreachable server, or any other failure of the lab itself. `cargo xtask`
/// and CI read it; clap exits with it too on arguments it refuses.
pub(crate) const EXIT_FAILED: u8 = 2;

/// Everything a `lab` subcommand can fail with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LabError {
    /// An argument refused before anything ran (`--minutes` out of range,
    /// `--only cron` without `--mongocoord`); the message says which and why.
    #[error("{0}")]
    Invalid(String),
    /// Stopped before it ended, by a signal or by the end of the process
    /// that started it (which of them, as said); what it started is stopped.
    #[error("stopped ({0}); the servers and processes it started are stopped too")]
    Stopped(&'static str),
    /// The server could not be used. `target` is the connection as it may be
    /// shown: the URI with its secrets hidden, and the database.
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
    /// A lock failed.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// An elector failed.
    #[error(transparent)]
    Elector(#[from] ElectorError),
    /// A queue or an agent failed.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The driver failed, on a call the store does not wrap (the bench's raw
    /// loops, its counted clients, dropping its databases).
    #[error(transparent)]
    Driver(#[from] mongodb::error::Error),
    /// A file, a pipe or a process could not be used; `what` says which
    /// ("cannot start a bench agent").
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// JSON that could not be read or written; `what` says whose.
    #[error("{what}: {source}")]
    Json {
        /// What was read or written.
        what: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A field of a document that is missing or of the wrong type; `what`
    /// says whose.
    #[error("{what}: {source}")]
    Field {
        /// The document, or what was read from it.
        what: String,
        /// The accessor's error.
        #[source]
        source: bson::error::Error,
    },
    /// A number that could not be read; `what` says where it stood.
    #[error("{what}: {source}")]
    Number {
        /// What was read ("bench agent reported \"…\"").
        what: String,
        /// The parser's error.
        #[source]
        source: std::num::ParseIntError,
    },
    /// A task of the lab ended without its result (it panicked or was
    /// cancelled); `what` says which.
    #[error("{what}: {source}")]
    Join {
        /// The task, and that it stopped.
        what: String,
        /// The runtime's account of it.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The wall clock reads before the Unix epoch.
    #[error("the wall clock reads before 1970: {0}")]
    Clock(#[source] std::time::SystemTimeError),
    /// Something the run waits for did not happen in time; `what` says what
    /// did not happen ("no new leader").
    #[error("{what} within {}", Human(.limit))]
    TimedOut {
        /// What did not happen.
        what: String,
        /// How long it was waited for.
        limit: Duration,
    },
    /// A queue run ended with another number of completions than tasks.
    #[error("{run}: {completed} completions for {tasks} tasks")]
    Completions {
        /// Which run ("raw queue", "queue benchmark").
        run: &'static str,
        /// Completions counted.
        completed: u64,
        /// Tasks enqueued.
        tasks: u64,
    },
    /// A promise the bench relies on did not hold (an uncontended lock was
    /// held, a fenced completion matched no task); the message says which.
    #[error("{0}")]
    Broken(String),
    /// What a child process or a file said cannot be read (a report line, a
    /// leader's line, a JSON line without a figure); the message says whose
    /// and what.
    #[error("{0}")]
    Unreadable(String),
    /// Promised figures that a bench run did not give: each line says which,
    /// and why it is wrong.
    #[error("the bench did not give {} promised figures:\n  {}", .0.len(), .0.join("\n  "))]
    MissingFigures(Vec<String>),
    /// An error, with what was being done when it happened ("cannot list
    /// the databases").
    #[error("{what}: {source}")]
    Context {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: Box<LabError>,
    },
}

impl LabError {
    /// A refused argument, with its message.
    pub(crate) fn invalid(message: impl Into<String>) -> LabError {
        LabError::Invalid(message.into())
    }

    /// A failed I/O operation, `what` saying which.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> LabError {
        LabError::Io { what: what.into(), source }
    }

    /// A task that ended without its result, `what` saying which.
    pub(crate) fn join(what: impl Into<String>, source: tokio::task::JoinError) -> LabError {
        LabError::Join { what: what.into(), source }
    }

    /// `what` did not happen within `limit`.
    pub(crate) fn timed_out(what: impl Into<String>, limit: Duration) -> LabError {
        LabError::TimedOut { what: what.into(), limit }
    }

    /// This error, as the reason `what` failed.
    pub(crate) fn context(self, what: impl Into<String>) -> LabError {
        LabError::Context { what: what.into(), source: Box::new(self) }
    }
}

/// A limit as a person says it: whole minutes from two minutes on, else
/// seconds.
struct Human<'a>(&'a Duration);

impl std::fmt::Display for Human<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.0.as_secs();
        if secs >= 120 && secs % 60 == 0 && self.0.subsec_nanos() == 0 {
            write!(f, "{} minutes", secs / 60)
        } else if self.0.subsec_nanos() == 0 {
            write!(f, "{secs} s")
        } else {
            write!(f, "{:?}", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::error::Error as _;

    use super::*;

    #[test]
    fn messages_say_what_failed_and_keep_the_source() {
        let e = LabError::Connect {
            target: "mongodb://h (database d)".into(),
            source: StoreError::backend(store_trait::FaultKind::Unreachable, "no server"),
        };
        assert_eq!(e.to_string(), "cannot use mongodb://h (database d): unreachable store fault: no server");
        assert!(e.source().unwrap().downcast_ref::<StoreError>().is_some());

        let e = LabError::io("cannot start a bench agent", std::io::Error::other("no such file"));
        assert_eq!(e.to_string(), "cannot start a bench agent: no such file");
        assert!(e.source().unwrap().downcast_ref::<std::io::Error>().is_some());

        let number = "x".parse::<u64>().unwrap_err();
        let e = LabError::Number { what: "bench agent reported \"commands x\"".into(), source: number };
        assert!(e.to_string().starts_with("bench agent reported \"commands x\": invalid digit"), "{e}");

        let inner = LabError::from(StoreError::backend(store_trait::FaultKind::Unreachable, "gone"));
        let e = inner.context("cannot list the databases");
        assert_eq!(e.to_string(), "cannot list the databases: unreachable store fault: gone");
        assert_eq!(e.source().unwrap().to_string(), "unreachable store fault: gone");
    }

    #[test]
    fn limits_read_as_a_person_says_them() {
        let e = LabError::timed_out("queue processes did not finish", Duration::from_secs(1800));
        assert_eq!(e.to_string(), "queue processes did not finish within 30 minutes");
        let e = LabError::timed_out("no new leader", Duration::from_secs(120));
        assert_eq!(e.to_string(), "no new leader within 2 minutes");
        let e = LabError::timed_out("the holder did not start", Duration::from_secs(60));
        assert_eq!(e.to_string(), "the holder did not start within 60 s");
        let e = LabError::timed_out("node did not finish", Duration::from_millis(1500));
        assert_eq!(e.to_string(), "node did not finish within 1.5s");
    }

    #[test]
    fn missing_figures_are_listed_one_a_line() {
        let e = LabError::MissingFigures(vec!["a: missing".into(), "b = NaN (not finite)".into()]);
        assert_eq!(e.to_string(), "the bench did not give 2 promised figures:\n  a: missing\n  b = NaN (not finite)");
    }
}
