//! The `mongocoord` command-line tool is the binary of this package; this
//! library target exists so that the examples in the README are compiled and
//! run as doctests (`cargo test --doc -p mongocoord`), and cannot drift from
//! the API.

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
