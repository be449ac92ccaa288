//! A change subscription that comes back after its stream ends.

use std::time::Duration;

use tokio::time::Instant;

use crate::{ChangeEvent, ChangeFilter, ChangeKind, ChangeStream, Collection, Key, Store, StoreError};

/// Change notifications for a collection (or one document of it) that survive
/// the stream ending: after a failure (a server restart, a dropped
/// connection), it subscribes again at most once per `retry`, and reports a
/// [`ChangeKind::Resync`] when it is back, since changes may have been missed.
/// On a store without change notifications it stays silent, so a caller's poll
/// timer does the work.
///
/// ```
/// use std::time::Duration;
/// use store_trait::{helpers::Watcher, Collection, Store};
///
/// async fn wait_for_work<S: Store>(store: S) {
///     let tasks = Collection::new("tasks").unwrap();
///     let mut changes = Watcher::open(store, tasks, None, Duration::from_secs(1)).await;
///     loop {
///         tokio::select! {
///             ev = changes.changed() => println!("{ev:?}: re-read"),
///             _ = tokio::time::sleep(Duration::from_secs(5)) => println!("poll anyway"),
///         }
///     }
/// }
/// ```
pub struct Watcher<S> {
    store: S,
    coll: Collection,
    key: Option<Key>,
    filter: Option<ChangeFilter>,
    stream: Option<ChangeStream>,
    retry: Duration,
    retry_at: Option<Instant>,
    unsupported: bool,
    skip_renewals: bool,
    /// With a filter: the one document whose changes are delivered, matched
    /// on this side ([`Watcher::only`]).
    only: Option<Key>,
}

impl<S> std::fmt::Debug for Watcher<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("coll", &self.coll)
            .field("key", &self.key)
            .field("filter", &self.filter)
            .field("live", &self.stream.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Store> Watcher<S> {
    /// Subscribes now (so no change after this returns is missed, when the
    /// store has notifications). A failed subscription is tried again by
    /// [`Watcher::changed`] after `retry`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops the subscription being made, and
    /// nothing else was changed.
    pub async fn open(store: S, coll: Collection, key: Option<Key>, retry: Duration) -> Self {
        Self::start(store, coll, key, None, retry).await
    }

    /// Like [`Watcher::open`] for the whole collection, delivering only the
    /// changes `filter` lets through ([`Store::watch_filtered`]: decided on the
    /// server where the backend can). A filter the store rejects as invalid
    /// ([`ChangeFilter::validate`]) leaves the watcher silent, like a store
    /// without notifications: a caller's poll timer does the work.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, like [`Watcher::open`].
    pub async fn open_filtered(store: S, coll: Collection, filter: ChangeFilter, retry: Duration) -> Self {
        Self::start(store, coll, None, Some(filter), retry).await
    }

    async fn start(
        store: S,
        coll: Collection,
        key: Option<Key>,
        filter: Option<ChangeFilter>,
        retry: Duration,
    ) -> Self {
        let mut w = Watcher {
            store,
            coll,
            key,
            filter,
            stream: None,
            retry,
            retry_at: None,
            unsupported: false,
            skip_renewals: false,
            only: None,
        };
        w.subscribe().await;
        w
    }

    /// [`Watcher::changed`] passes over [`ChangeKind::Renewed`]: for watchers
    /// that care who holds what, not until when.
    #[must_use]
    pub fn ignore_renewals(mut self) -> Self {
        self.skip_renewals = true;
        self
    }

    /// Delivers the changes to the document `key` only (and resyncs), for a
    /// watcher opened with [`Watcher::open_filtered`]: the filter runs where
    /// the changes happen, the key here, so the watchers of many documents
    /// share one filtered subscription (on MongoDB, one change stream).
    ///
    /// ```
    /// use std::time::Duration;
    /// use store_trait::{helpers::Watcher, ChangeFilter, Collection, Key, Store};
    ///
    /// // Woken when the lease on "nightly" changes hands, not at its renewals.
    /// async fn wait_for_holder_change<S: Store>(store: S) {
    ///     let locks = Collection::new("locks").unwrap();
    ///     let mut w = Watcher::open_filtered(store, locks, ChangeFilter::lease_changes(), Duration::from_secs(1))
    ///         .await
    ///         .only(Key::new("nightly").unwrap());
    ///     let ev = w.changed().await;
    ///     println!("{ev:?}: re-read");
    /// }
    /// ```
    #[must_use]
    pub fn only(mut self, key: Key) -> Self {
        self.only = Some(key);
        self
    }

    /// Whether `ev` is for this watcher ([`Watcher::ignore_renewals`],
    /// [`Watcher::only`]).
    fn wanted(&self, ev: &ChangeEvent) -> bool {
        !(self.skip_renewals && ev.kind == ChangeKind::Renewed)
            && (ev.key.is_none() || self.only.is_none() || ev.key == self.only)
    }

    /// Whether a subscription is open right now.
    pub fn is_live(&self) -> bool {
        self.stream.is_some()
    }

    async fn subscribe(&mut self) -> bool {
        let subscribed = match &self.filter {
            Some(f) => self.store.watch_filtered(&self.coll, f).await,
            None => self.store.watch(&self.coll, self.key.as_ref()).await,
        };
        match subscribed {
            Ok(s) => {
                self.stream = Some(s);
                self.retry_at = None;
                true
            }
            // Never to be had: an invalid filter fails the same way every time.
            Err(StoreError::Unsupported { .. } | StoreError::InvalidInput { .. }) => {
                self.unsupported = true;
                false
            }
            Err(_) => {
                self.retry_at = Some(Instant::now() + self.retry);
                false
            }
        }
    }

    /// The next change. A `Resync` when the subscription ends (changes may
    /// have been missed); then pending while there is no subscription, until
    /// one can be made again (then another `Resync`); forever on a store
    /// without them.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, so it can be a `tokio::select!` branch: a notification is
    /// taken from the stream only when it is returned. Dropped while
    /// subscribing again, the subscription being made is dropped and the next
    /// call makes it at once (and reports the `Resync`).
    pub async fn changed(&mut self) -> ChangeEvent {
        loop {
            if let Some(s) = self.stream.as_mut() {
                // An error or the end: the backend dropped the subscription (it
                // logs why); subscribe again after `retry`.
                match std::future::poll_fn(|cx| s.as_mut().poll_next(cx)).await {
                    Some(Ok(ev)) if self.wanted(&ev) => return ev,
                    Some(Ok(_)) => continue,
                    _ => {}
                }
                // Lost: say so at once, so a caller that relied on
                // notifications falls back to its poll (`is_live` is false
                // now) instead of waiting for the next subscription.
                self.stream = None;
                self.retry_at = Some(Instant::now() + self.retry);
                return ChangeEvent { key: None, kind: ChangeKind::Resync };
            }
            match self.retry_at {
                Some(at) if !self.unsupported => tokio::time::sleep_until(at).await,
                _ => std::future::pending::<()>().await,
            }
            if self.subscribe().await {
                super::metrics::resync(&self.coll);
                return ChangeEvent { key: None, kind: ChangeKind::Resync };
            }
        }
    }

    /// Takes every notification already waiting, without blocking; true if
    /// there was any.
    pub fn drain_ready(&mut self) -> bool {
        self.drain_ready_with(|_| {})
    }

    /// Like [`Watcher::drain_ready`], showing each notification taken to `seen`.
    pub fn drain_ready_with(&mut self, mut seen: impl FnMut(&ChangeEvent)) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut any = false;
        loop {
            let Some(s) = self.stream.as_mut() else { return any };
            match s.as_mut().poll_next(&mut cx) {
                std::task::Poll::Ready(Some(Ok(ev))) => {
                    if self.wanted(&ev) {
                        seen(&ev);
                        any = true;
                    }
                }
                std::task::Poll::Ready(_) => {
                    self.stream = None;
                    self.retry_at = Some(Instant::now() + self.retry);
                    return any;
                }
                std::task::Poll::Pending => return any,
            }
        }
    }
}
