//! Helpers built on the [`Store`](crate::Store) contract, not part of it: they
//! use only its public operations, so every backend gets them for free.

pub mod metrics;
mod watcher;

pub use watcher::Watcher;
