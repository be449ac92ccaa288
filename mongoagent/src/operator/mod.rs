//! An operator's actions on tasks: [`Queue::requeue`], [`Queue::requeue_ids`],
//! [`Queue::cancel`], [`Queue::cancel_ids`] and [`Queue::delete`] return one of these, which
//! runs when awaited, as the `mongodb` driver's actions do. Each can be made a
//! dry run first ([`Requeue::dry_run`]…): it then only lists the ids it would
//! touch, read as the real run reads them.
//!
//! ```
//! # async fn ops(q: mongoagent::Queue<store_memory::MemoryStore>) -> Result<(), mongoagent::AgentError> {
//! use bson::doc;
//! let would = q.requeue(doc! {"agent_name": "resize"}).dry_run(true).await?;
//! let done = q.requeue(doc! {"agent_name": "resize"}).await?;
//! let gone = q.delete(doc! {"agent_name": "resize"}).force(true).await?;
//! # let _ = (would, done, gone); Ok(()) }
//! ```
//!
//! # Cancel safety
//!
//! Cancel-safe in effect: each task is changed by its own conditional write;
//! a dropped action has touched some of them, and running it again touches
//! the rest.

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use bson::{doc, Document};
use store_trait::{fields as reserved, Condition, Key, Query, Record, Store};

use crate::error::AgentError;
use crate::queue::Queue;

mod cancel;
mod pause;
mod requeue;

type Running<'a> = Pin<Box<dyn Future<Output = Result<Vec<Key>, AgentError>> + Send + 'a>>;

/// [`Queue::requeue`] or [`Queue::requeue_ids`], run when awaited; resolves to the ids requeued (or,
/// with [`Requeue::dry_run`], those it would requeue).
#[derive(Debug)]
#[must_use = "an action does nothing until awaited"]
pub struct Requeue<'a, S> {
    queue: &'a Queue<S>,
    which: Which,
    dry_run: bool,
}

impl<S> Requeue<'_, S> {
    /// With `true`, only lists the tasks it would requeue (like
    /// [`std::fs::OpenOptions`], a setter takes the value: `--dry-run` flags
    /// pass straight through).
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }
}

impl<'a, S: Store + Clone + 'a> IntoFuture for Requeue<'a, S> {
    type Output = Result<Vec<Key>, AgentError>;
    type IntoFuture = Running<'a>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let mut out = Vec::new();
            for filter in self.which.filters() {
                out.extend(self.queue.requeue_matching(filter, self.dry_run).await?);
            }
            Ok(out)
        })
    }
}

/// Which tasks a [`Requeue`] or a [`Cancel`] is for.
#[derive(Debug)]
enum Which {
    Matching(Document),
    Ids(Vec<Key>),
}

impl Which {
    /// The equality filters to run the action with, one after the other: the
    /// filter, or one `_id` filter per id (each still under the action's own
    /// condition, so an id the operator saw that has since changed state is
    /// passed over).
    fn filters(self) -> Vec<Document> {
        match self {
            Which::Matching(filter) => vec![filter],
            Which::Ids(ids) => ids.into_iter().map(|id| doc! { reserved::ID: id.as_bson().clone() }).collect(),
        }
    }
}

/// [`Queue::cancel`] or [`Queue::cancel_ids`], run when awaited; resolves to
/// the ids cancelled (or, with [`Cancel::dry_run`], those it would cancel).
#[derive(Debug)]
#[must_use = "an action does nothing until awaited"]
pub struct Cancel<'a, S> {
    queue: &'a Queue<S>,
    which: Which,
    dry_run: bool,
}

impl<S> Cancel<'_, S> {
    /// With `true`, only lists the tasks it would cancel.
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }
}

impl<'a, S: Store + Clone + 'a> IntoFuture for Cancel<'a, S> {
    type Output = Result<Vec<Key>, AgentError>;
    type IntoFuture = Running<'a>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let mut out = Vec::new();
            for filter in self.which.filters() {
                out.extend(self.queue.cancel_matching(filter, self.dry_run).await?);
            }
            Ok(out)
        })
    }
}

/// [`Queue::delete`], run when awaited; resolves to the ids deleted (or,
/// with [`Delete::dry_run`], those it would delete).
#[derive(Debug)]
#[must_use = "an action does nothing until awaited"]
pub struct Delete<'a, S> {
    queue: &'a Queue<S>,
    filter: Document,
    force: bool,
    dry_run: bool,
}

impl<S> Delete<'_, S> {
    /// With `true`, deletes matching tasks whether or not they have ended: a
    /// running task's holder then finds its outcome rejected (the document is
    /// gone).
    pub fn force(mut self, yes: bool) -> Self {
        self.force = yes;
        self
    }

    /// With `true`, only lists the tasks it would delete.
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }
}

impl<'a, S: Store + Clone + 'a> IntoFuture for Delete<'a, S> {
    type Output = Result<Vec<Key>, AgentError>;
    type IntoFuture = Running<'a>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.queue.delete_matching(self.filter, self.force, self.dry_run).await })
    }
}

impl<S: Store + Clone> Queue<S> {
    /// Makes tasks matching an equality `filter` that failed for good (not
    /// those [cancelled](Queue::cancel)), or whose claim lapsed before they ended,
    /// ready again: their attempts start over, and the fence grows, so the
    /// lapsed claim's holder can write nothing more. Awaited, it returns their
    /// ids; [`Requeue::dry_run`] only lists them.
    ///
    /// # Cancel safety
    ///
    /// See [the module](crate::operator#cancel-safety): running it again
    /// requeues the rest.
    pub fn requeue(&self, filter: Document) -> Requeue<'_, S> {
        Requeue { queue: self, which: Which::Matching(filter), dry_run: false }
    }

    /// As [`Queue::requeue`], for the tasks with these ids: those still
    /// failed for good or lapsed are requeued, the others (missing, cancelled,
    /// picked up or ended since) are passed over. What a confirmation acts
    /// on: the ids its preview listed, never a filter read again.
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::requeue`].
    pub fn requeue_ids(&self, ids: &[Key]) -> Requeue<'_, S> {
        Requeue { queue: self, which: Which::Ids(ids.to_vec()), dry_run: false }
    }

    /// Cancels the tasks matching an equality `filter` that have not ended: a
    /// pending task ends at once; a running one ends too, and its run loses
    /// its claim. Each becomes final with `complete: true, cancelled: true,
    /// error_encountered: true, last_error: "cancelled"` (so
    /// [`Queue::requeue`] leaves it alone). Awaited, it returns the ids
    /// cancelled; [`Cancel::dry_run`] only lists them.
    ///
    /// Each cancel is one write conditional on the task's fence and on its not
    /// having ended; it releases the lease and bumps the fence. So **the fence
    /// decides** between a cancel and a completion: whichever writes first
    /// wins, the other is rejected; exactly one final state. The running
    /// holder's next renewal fails, its [`Task::cancellation`](crate::Task::cancellation)
    /// fires, and its late outcome or progress is rejected (counted as stale).
    ///
    /// Tasks in a fan-in step (waiting for follow-ups, or a follow-up something
    /// waits for) are not cancelled: they are left to their agents.
    ///
    /// # Cancel safety
    ///
    /// See [the module](crate::operator#cancel-safety): running it again
    /// cancels the rest.
    pub fn cancel(&self, filter: Document) -> Cancel<'_, S> {
        Cancel { queue: self, which: Which::Matching(filter), dry_run: false }
    }

    /// As [`Queue::cancel`], for the tasks with these ids (missing or ended
    /// ones are passed over).
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::cancel`].
    pub fn cancel_ids(&self, ids: &[Key]) -> Cancel<'_, S> {
        Cancel { queue: self, which: Which::Ids(ids.to_vec()), dry_run: false }
    }

    /// Deletes the tasks matching an equality `filter` that have ended
    /// (`complete: true`); [`Delete::force`] deletes any of them, running or
    /// not. Awaited, it returns the ids deleted; [`Delete::dry_run`] only
    /// lists them.
    ///
    /// # Cancel safety
    ///
    /// See [the module](crate::operator#cancel-safety): running it again
    /// deletes the rest.
    pub fn delete(&self, filter: Document) -> Delete<'_, S> {
        Delete { queue: self, filter, force: false, dry_run: false }
    }
}

impl<S: Store + Clone> Queue<S> {
    /// The tasks matching `filter` and `which` that the store can read, for an
    /// operator action (`what` names it in the log): another program's document
    /// the store cannot read is left alone, with a warning.
    pub(crate) async fn readable_matches(
        &self,
        filter: Document,
        which: Condition,
        what: &str,
    ) -> Result<Vec<Record>, AgentError> {
        let found = self.store.find_each(&self.coll, &Query::eq(filter).when(which)).await?;
        Ok(found
            .into_iter()
            .filter_map(|r| {
                r.inspect_err(|e| tracing::warn!(queue = %self.coll, error = %e, action = what, "skipped a document it cannot read"))
                    .ok()
            })
            .collect())
    }
}
