//! The observer: keeps the published leadership current, and reports new leaders
//! to `on_new_leader`.

use std::sync::Arc;

use store_trait::helpers::Watcher;
use store_trait::{ChangeFilter, Store};
use tokio_util::sync::CancellationToken;

use crate::inner::Inner;
use crate::leadership::Leadership;

/// Keeps the published leadership current: on change notifications for the key,
/// on local transitions, and every renew interval.
pub(crate) async fn observer<S: Store + Clone>(inner: Arc<Inner<S>>, stop: CancellationToken) {
    let (store, coll, key) = (inner.lock.store().clone(), inner.lock.collection().clone(), inner.lock.key().clone());
    // Re-subscribes by itself after the stream ends (a server restart).
    // Renewals change nothing it publishes that the timer below does not
    // refresh: the server keeps them back, and a backend that cannot is
    // filtered here.
    let mut events = Watcher::open_filtered(store, coll, ChangeFilter::lease_changes(), inner.renew_every)
        .await
        .only(key)
        .ignore_renewals();
    loop {
        inner.refresh().await;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = inner.changed.notified() => {}
            _ = tokio::time::sleep(inner.renew_every) => {}
            _ = events.changed() => {}
        }
    }
    inner.refresh().await;
}

impl<S: Store + Clone> Inner<S> {
    /// Reads who leads and publishes it if it changed; a new leader (another
    /// owner or term) is also handed to `on_new_leader`.
    async fn refresh(&self) {
        let leader = match self.lock.get_current().await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "cannot read leadership");
                return;
            }
        };
        let is_me = self.is_leader() && leader.as_ref().is_some_and(|l| self.identity.is_mine(&l.owner));
        let next = Leadership { leader, is_me };
        let mut new_leader = None;
        self.leadership.send_if_modified(|cur| {
            // Expiry moves with every renewal; publish changes of who and which term.
            let term = |l: &Leadership| l.leader.as_ref().map(|l| (l.owner.clone(), l.fence));
            let same_term = term(cur) == term(&next);
            let same = same_term && cur.is_me == next.is_me;
            if !same_term {
                new_leader = next.leader.clone();
            }
            *cur = next;
            !same
        });
        if let Some(l) = new_leader {
            tracing::debug!(key = %self.key, leader = %l.owner, fence = l.fence, "new leader observed");
            self.callbacks.new_leader(l);
        }
    }
}
