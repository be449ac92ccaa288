//! Driver errors mapped to the contract's classification: by kind and code,
//! never by message.

use mongodb::error::{Error as MongoError, ErrorKind, WriteFailure};
use store_trait::{Collection, FaultKind, StoreError};

/// Server error codes after which trying again may succeed.
const TRANSIENT_CODES: &[i32] = &[6, 7, 89, 91, 112, 189, 251, 9001, 10107, 11600, 11602, 13435, 13436, 262];
/// Server error codes meaning a deadline passed.
const TIMEOUT_CODES: &[i32] = &[50, 64];

pub(crate) fn classify_code(code: i32, e: &MongoError) -> FaultKind {
    if TIMEOUT_CODES.contains(&code) {
        FaultKind::Timeout
    } else if TRANSIENT_CODES.contains(&code)
        || e.contains_label("RetryableWriteError")
        || e.contains_label("TransientTransactionError")
    {
        FaultKind::Transient
    } else {
        FaultKind::Permanent
    }
}

pub(crate) fn duplicate(message: &str) -> StoreError {
    StoreError::DuplicateKey { collection: String::new(), key: message.to_owned() }
}

/// Maps a driver error to the contract's classification (by kind and code, never
/// by message).
pub(crate) fn map_err(e: MongoError) -> StoreError {
    let (kind, code, message) = match &*e.kind {
        ErrorKind::Command(c) if c.code == 11000 => return duplicate(&c.message),
        ErrorKind::Write(WriteFailure::WriteError(w)) if w.code == 11000 => return duplicate(&w.message),
        ErrorKind::Command(c) => (classify_code(c.code, &e), Some(c.code), c.message.clone()),
        ErrorKind::Write(WriteFailure::WriteError(w)) => (classify_code(w.code, &e), Some(w.code), w.message.clone()),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
            // The write was applied on the primary but not confirmed as asked.
            let kind = if TIMEOUT_CODES.contains(&w.code) { FaultKind::Timeout } else { FaultKind::Transient };
            (kind, Some(w.code), w.message.clone())
        }
        ErrorKind::ServerSelection { message, .. } => (FaultKind::Unreachable, None, message.clone()),
        ErrorKind::DnsResolve { message, .. } => (FaultKind::Unreachable, None, message.clone()),
        ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => (FaultKind::Timeout, None, io.to_string()),
        ErrorKind::Io(io) => (FaultKind::Transient, None, io.to_string()),
        ErrorKind::ConnectionPoolCleared { message, .. } => (FaultKind::Transient, None, message.clone()),
        ErrorKind::Shutdown => (FaultKind::Unreachable, None, "the client was shut down".into()),
        _ if e.contains_label("RetryableWriteError") => (FaultKind::Transient, None, describe(&e)),
        _ => (FaultKind::Permanent, None, describe(&e)),
    };
    StoreError::Backend { kind, code, message, source: Some(Box::new(e)) }
}

/// A driver error in one line: its kind's message, then its sources'. The
/// driver's own `Display` adds its labels and its sources' debug form
/// (`source: Some(Error { kind: Command(CommandError { … }) })`), which an
/// operator should not have to read.
fn describe(e: &MongoError) -> String {
    let mut out = e.kind.to_string();
    let mut next = std::error::Error::source(e);
    while let Some(s) = next {
        let part = match s.downcast_ref::<MongoError>() {
            Some(m) => m.kind.to_string(),
            None => s.to_string(),
        };
        if !out.contains(&part) {
            out.push_str(": ");
            out.push_str(&part);
        }
        next = s.source();
    }
    out
}

/// Adds the collection name to a duplicate-key error.
pub(crate) fn in_coll(coll: &Collection) -> impl Fn(StoreError) -> StoreError + '_ {
    move |e| match e {
        StoreError::DuplicateKey { key, .. } => StoreError::DuplicateKey { collection: coll.to_string(), key },
        other => other,
    }
}

pub(crate) fn is_change_streams_unsupported(e: &MongoError) -> bool {
    matches!(&*e.kind, ErrorKind::Command(c) if c.code == 40573 || c.code == 40324 || c.code == 136)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use bson::doc;
    use mongodb::error::{CommandError, WriteConcernError, WriteError};

    use super::*;

    /// An error the match does not name is told by its kind's message, not
    /// the driver's `Display` with its labels and debug dumps.
    #[test]
    fn other_errors_are_told_in_one_plain_line() {
        let e = MongoError::custom("refused");
        let shown = map_err(e).to_string();
        assert!(shown.contains("Custom user error"), "{shown}");
        for noise in ["Kind:", "labels", "source:", "server response"] {
            assert!(!shown.contains(noise), "{noise} in {shown}");
        }
    }

    fn command(code: i32) -> MongoError {
        let e: CommandError = bson::deserialize_from_document(doc! { "code": code, "errmsg": "m" }).unwrap();
        MongoError::from(ErrorKind::Command(e))
    }

    fn write_error(code: i32) -> MongoError {
        let e: WriteError = bson::deserialize_from_document(doc! { "code": code, "errmsg": "m" }).unwrap();
        MongoError::from(ErrorKind::Write(WriteFailure::WriteError(e)))
    }

    fn write_concern(code: i32) -> MongoError {
        let e: WriteConcernError = bson::deserialize_from_document(doc! { "code": code, "errmsg": "m" }).unwrap();
        MongoError::from(ErrorKind::Write(WriteFailure::WriteConcernError(e)))
    }

    fn io(kind: std::io::ErrorKind) -> MongoError {
        MongoError::from(ErrorKind::Io(Arc::new(std::io::Error::from(kind))))
    }

    /// The classification callers act on: retry (transient, unreachable),
    /// treat as in doubt (transient, timeout), give up (permanent), or a lost
    /// creation race (duplicate key), by kind and code.
    #[test]
    fn errors_are_classified_by_kind_and_code() {
        let kind = |e: MongoError| map_err(e).fault_kind();
        for code in [6, 7, 89, 91, 189, 262, 10107, 11600, 11602, 13435, 13436] {
            assert_eq!(kind(command(code)), Some(FaultKind::Transient), "command {code}");
            assert_eq!(kind(write_error(code)), Some(FaultKind::Transient), "write {code}");
        }
        for code in [50, 64] {
            assert_eq!(kind(command(code)), Some(FaultKind::Timeout), "command {code}");
            assert_eq!(kind(write_concern(code)), Some(FaultKind::Timeout), "write concern {code}");
        }
        for code in [2, 14, 13, 8000] {
            assert_eq!(kind(command(code)), Some(FaultKind::Permanent), "command {code}");
            assert_eq!(kind(write_error(code)), Some(FaultKind::Permanent), "write {code}");
        }
        // Applied on the primary, not confirmed as asked: in doubt, never "failed".
        assert_eq!(kind(write_concern(100)), Some(FaultKind::Transient));
        assert!(matches!(map_err(command(11000)), StoreError::DuplicateKey { .. }));
        assert!(matches!(map_err(write_error(11000)), StoreError::DuplicateKey { .. }));
        assert_eq!(kind(io(std::io::ErrorKind::TimedOut)), Some(FaultKind::Timeout));
        assert_eq!(kind(io(std::io::ErrorKind::ConnectionReset)), Some(FaultKind::Transient));
        assert_eq!(kind(MongoError::from(ErrorKind::Shutdown)), Some(FaultKind::Unreachable));
        for code in [40573, 40324, 136] {
            assert!(is_change_streams_unsupported(&command(code)), "{code}");
        }
        assert!(!is_change_streams_unsupported(&command(89)));
    }
}
