//! The vocabulary of store operations: conditions, mutations, claims, queries.
//!
//! Every type here is plain data. The reference meaning of each one is the Rust
//! evaluator in [`crate::backend::semantics`]; the MongoDB backend compiles the same data
//! into one aggregation-pipeline update evaluated on the server clock.

mod change;
mod condition;
mod mutation;
mod query;
mod write;

pub use change::ChangeDetail;
pub use change::{ChangeEvent, ChangeFilter, ChangeKind, ChangeStream, UpdateClause};
pub use condition::Condition;
pub use mutation::{LeaseOp, Mutation};
pub use query::{Claim, IndexSpec, InsertOutcome, Order, Query};
pub use write::{BatchOutcome, DeleteOutcome, Nonce, Write, WriteOutcome};
