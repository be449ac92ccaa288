//! The one way a store call is bounded by a deadline without being dropped
//! half-way: the call runs on a task of its own, and only the wait for it is
//! bounded. Every deadline of the crate (an acquire's timeout, a renewal that
//! must be confirmed before its lease can lapse, a release) goes through here.

use store_trait::StoreError;
use tokio::time::Instant;

/// Runs a store call on its own task, so a deadline never drops a driver future
/// half-way (the driver's own advice); the call may still complete after the
/// deadline and its result is then ignored.
pub(crate) async fn spawn_with_deadline<T: Send + 'static>(
    deadline: Instant,
    fut: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Option<Result<T, StoreError>> {
    Some(on_own_task(Some(deadline), fut).await?.unwrap_or_else(|e| {
        Err(StoreError::backend(store_trait::FaultKind::Transient, format!("store call task failed: {e}")))
    }))
}

/// The one way a store call is bounded by a deadline: it runs on its own task,
/// waited for until `deadline` (when there is one); `None` when the deadline
/// passed first. The task is not cancelled, so a driver call is never dropped
/// half-way (the driver's own advice); its late result is ignored. A task that
/// failed (a panic, a runtime shutting down) is the `Err`.
pub(crate) async fn on_own_task<T: Send + 'static>(
    deadline: Option<Instant>,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<Result<T, tokio::task::JoinError>> {
    let task = tokio::spawn(fut);
    Some(match deadline {
        Some(d) => tokio::time::timeout_at(d, task).await.ok()?,
        None => task.await,
    })
}
