//! Helpers built on the [`Store`](crate::Store) contract, not part of it: they
//! use only its public operations, so every backend gets them for free.

mod watcher;

pub use watcher::Watcher;
