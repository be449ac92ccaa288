//! Validated document keys and collection names.

use std::fmt;

use bson::Bson;

use crate::StoreError;

/// The id (`_id`) of a document: a non-empty string, an `ObjectId`, or an integer.
///
/// Locks and elections use string keys. Task queues also accept the `ObjectId`
/// and integer ids that documents written by other tools (the original
/// `mongo_agent`) carry.
///
/// ```
/// use store_trait::Key;
///
/// let k = Key::new("scheduler").unwrap();
/// assert_eq!(k.to_string(), "scheduler");
/// assert!(Key::new("").is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Key(Bson);

impl Key {
    /// The longest string key accepted, in bytes.
    pub const MAX_LEN: usize = 1024;

    /// A string key: non-empty, at most [`Key::MAX_LEN`] bytes, without NUL.
    pub fn new(s: impl Into<String>) -> Result<Key, StoreError> {
        let s = s.into();
        if s.is_empty() {
            return Err(StoreError::invalid("key", "a key must not be empty"));
        }
        if s.len() > Self::MAX_LEN {
            return Err(StoreError::invalid("key", format!("{} bytes is longer than {}", s.len(), Self::MAX_LEN)));
        }
        if s.contains('\0') {
            return Err(StoreError::invalid("key", "a key must not contain NUL"));
        }
        Ok(Key(Bson::String(s)))
    }

    /// A key from a BSON `_id` value; strings are validated as in [`Key::new`].
    pub fn from_bson(b: Bson) -> Result<Key, StoreError> {
        match b {
            Bson::String(s) => Key::new(s),
            Bson::ObjectId(_) | Bson::Int32(_) | Bson::Int64(_) => Ok(Key(b)),
            other => Err(StoreError::invalid(
                "key",
                format!("an _id must be a string, ObjectId or integer, not {:?}", other.element_type()),
            )),
        }
    }

    /// A fresh, unique `ObjectId` key.
    pub fn generate() -> Key {
        Key(Bson::ObjectId(bson::oid::ObjectId::new()))
    }

    /// The key as BSON (the `_id` value).
    pub fn as_bson(&self) -> &Bson {
        &self.0
    }

    /// The key as a string slice, when it is a string key.
    pub fn as_str(&self) -> Option<&str> {
        match &self.0 {
            Bson::String(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Bson::String(s) => f.write_str(s),
            Bson::ObjectId(o) => write!(f, "{o}"),
            other => write!(f, "{other}"),
        }
    }
}

impl TryFrom<&str> for Key {
    type Error = StoreError;
    fn try_from(s: &str) -> Result<Key, StoreError> {
        Key::new(s)
    }
}

/// A validated collection name.
///
/// ```
/// use store_trait::Collection;
///
/// assert!(Collection::new("mongolocker").is_ok());
/// assert!(Collection::new("").is_err());
/// assert!(Collection::new("a$b").is_err());
/// assert!(Collection::new("system.users").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Collection(String);

impl Collection {
    /// Validates a collection name: non-empty, at most 120 bytes, without `$` or
    /// NUL, not starting with `system.` or `.`.
    pub fn new(name: impl Into<String>) -> Result<Collection, StoreError> {
        let name = name.into();
        let bad = |reason: &str| Err(StoreError::invalid("collection name", format!("{name:?}: {reason}")));
        if name.is_empty() {
            return bad("must not be empty");
        }
        if name.len() > 120 {
            return bad("longer than 120 bytes");
        }
        if name.contains('$') || name.contains('\0') {
            return bad("must not contain '$' or NUL");
        }
        if name.starts_with("system.") || name.starts_with('.') || name.ends_with('.') {
            return bad("reserved or malformed name");
        }
        Ok(Collection(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Collection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a user field name: non-empty, no leading `$`, no `.`, no NUL, and not
/// one of the [reserved](crate::fields) names.
pub fn check_field_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() || name.starts_with('$') || name.contains('.') || name.contains('\0') {
        return Err(StoreError::invalid("field name", format!("{name:?} is not a plain top-level field name")));
    }
    if crate::fields::is_reserved(name) {
        return Err(StoreError::invalid("field name", format!("{name:?} is reserved by the store")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert!(Key::new("a\0b").is_err());
        assert!(Key::new("x".repeat(1025)).is_err());
        assert!(Key::new("x".repeat(1024)).is_ok());
        assert!(Key::from_bson(Bson::Double(1.0)).is_err());
        assert!(Key::from_bson(Bson::Int64(7)).is_ok());
        assert_ne!(Key::generate(), Key::generate());
    }

    #[test]
    fn field_names() {
        assert!(check_field_name("ready").is_ok());
        assert!(check_field_name("$set").is_err());
        assert!(check_field_name("a.b").is_err());
        assert!(check_field_name("lease_owner").is_err());
        assert!(check_field_name("").is_err());
    }

    /// Each rule of a collection name rejects its case; a plain name passes.
    #[test]
    fn collection_names() {
        assert!(Collection::new("mongolocker").is_ok());
        assert!(Collection::new("a.b").is_ok());
        for bad in ["", "a$b", "a\0b", "system.locks", ".a", "a."] {
            assert!(Collection::new(bad).is_err(), "{bad:?}");
        }
        assert!(Collection::new("x".repeat(121)).is_err());
        assert!(Collection::new("x".repeat(120)).is_ok());
    }
}
