//! Releasing several leases at once: a group commit of fenced release writes
//! (each with its own changes, fence and nonce) in one [`Store::write_many`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use store_trait::{BatchOutcome, Key, Mutation, Nonce, Store, Write};

use crate::error::LockError;

use crate::guard::LockGuard;

impl<S: Store + Clone> LockGuard<S> {
    /// Releases several locks, each applying its `changes` in the same atomic
    /// write as its release, fenced by its own acquisition's fence, exactly as
    /// [`LockGuard::release_with`] would one by one; one result per guard, in
    /// order (`Err(Lost)` for a guard whose lock was no longer held: nothing of
    /// it was changed). The guards that share the first guard's
    /// [`Leases`](crate::unstable::Leases) go to the store in one batch
    /// ([`Store::write_many`]: one command on MongoDB), retried with the same
    /// nonces after a transient error; any others are released one by one.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe, as [`LockGuard::release_with`]: the guards are consumed,
    /// and dropped half-way each release (with its changes) may or may not have
    /// been applied; an unapplied one leaves the lease to lapse at its expiry.
    pub async fn release_many(items: Vec<(LockGuard<S>, Mutation)>) -> Vec<Result<(), LockError>> {
        let mut results: Vec<Option<Result<(), LockError>>> = Vec::with_capacity(items.len());
        let mut batch: Vec<(usize, LockGuard<S>, Key, Write, Nonce)> = Vec::new();
        let mut alone: Vec<(usize, LockGuard<S>, Mutation)> = Vec::new();
        let leases = items.first().map(|(g, _)| g.kept.leases.clone());
        for (i, (guard, changes)) in items.into_iter().enumerate() {
            results.push(None);
            if let Err(e) = guard.check_gc(&changes) {
                results[i] = Some(Err(e));
                continue;
            }
            if !leases.as_ref().is_some_and(|l| Arc::ptr_eq(l, &guard.kept.leases)) {
                alone.push((i, guard, changes));
                continue;
            }
            let kept = &guard.kept;
            if kept.released.swap(true, Ordering::SeqCst) {
                results[i] = Some(Err(LockError::NotHeld { key: kept.key.to_string() }));
                continue;
            }
            // As `Term::release`: the keeper stops and work under the lock stops.
            kept.stop.cancel();
            kept.lost.cancel();
            kept.clear_current();
            let nonce = Nonce::generate();
            let write = Write::new(kept.fenced(), changes.release()).with_nonce(nonce.clone());
            let key = kept.key.clone();
            batch.push((i, guard, key, write, nonce));
        }
        if let (Some(leases), false) = (leases, batch.is_empty()) {
            let writes: Vec<(Key, Write)> = batch.iter().map(|(_, _, k, w, _)| (k.clone(), w.clone())).collect();
            let mut attempt = 0;
            let outcomes = loop {
                attempt += 1;
                match leases.store.write_many(&leases.coll, &writes).await {
                    Ok(o) => break Ok(o),
                    Err(e) if e.is_retryable() && attempt < 4 => {
                        tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                    }
                    Err(e) => break Err(e),
                }
            };
            match outcomes {
                Ok(outcomes) => {
                    for ((i, guard, _, _, nonce), outcome) in batch.iter().zip(outcomes) {
                        let kept = &guard.kept;
                        results[*i] = Some(match outcome {
                            BatchOutcome::Applied => Ok(()),
                            // An earlier attempt that reported an error was applied after all.
                            BatchOutcome::Rejected(Some(r))
                                if attempt > 1 && r.last_nonce() == Some(nonce.as_str()) =>
                            {
                                Ok(())
                            }
                            BatchOutcome::Rejected(current) => Err(kept.lost_error(current.as_deref())),
                            _ => Err(kept.lost_error(None)),
                        });
                        if results[*i].as_ref().is_some_and(Result::is_ok) {
                            tracing::info!(key = %kept.key, owner = %kept.owner, fence = kept.fence, "lock released");
                        }
                    }
                }
                Err(e) => {
                    // Each release is in doubt as the batch is: the same kind of
                    // error for each (the first carries the original).
                    let kind = e.fault_kind().unwrap_or(store_trait::FaultKind::Permanent);
                    let message = e.to_string();
                    let mut first = Some(e);
                    for (i, _, _, _, _) in &batch {
                        let e = first.take().unwrap_or_else(|| store_trait::StoreError::backend(kind, message.clone()));
                        results[*i] = Some(Err(e.into()));
                    }
                }
            }
        }
        for (i, guard, changes) in alone {
            results[i] = Some(guard.release_with(changes).await.map(drop));
        }
        results.into_iter().map(|r| r.unwrap_or_else(|| Err(LockError::NotHeld { key: String::new() }))).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use bson::doc;
    use store_memory::MemoryStore;
    use store_trait::{Claim, Collection, Condition, Key, Mutation, Query, Store, Ttl, Write};
    use tokio::time::Instant;

    use crate::error::LockError;
    use crate::guard::LockGuard;
    use crate::lease::Leases;

    /// One batch of three fenced releases: the one whose fence is stale (its
    /// document was taken over in between) is rejected and changes nothing;
    /// the other two apply with their changes.
    #[tokio::test(start_paused = true)]
    async fn a_stale_release_in_a_batch_is_rejected_alone() {
        let store = MemoryStore::new();
        let ttl = Duration::from_secs(30);
        let leases = Leases::builder(store.clone(), "jobs").ttl(ttl).allow_gc().build().unwrap();
        let coll = Collection::new("jobs").unwrap();
        let ids = ["a", "b", "c"];
        store.insert_many(&coll, ids.iter().map(|id| doc! { "_id": *id, "ready": true }).collect()).await.unwrap();
        let mut guards = Vec::new();
        for id in ids {
            let claim = Claim {
                query: Query::eq(doc! { "_id": id, "ready": true }),
                mutation: Mutation::new().grant(format!("w-{id}"), Ttl::new(ttl).unwrap()).bump_fence(),
            };
            let record = store.claim(&coll, &claim).await.unwrap().unwrap();
            guards.push(leases.keep(&record, Instant::now()).unwrap());
        }
        // "b" is taken over: its lease forced away and its fence bumped.
        let b = Key::new("b").unwrap();
        let take = Write::new(Condition::Always, Mutation::new().release().bump_fence());
        assert!(store.write(&coll, &b, &take).await.unwrap().is_applied());
        let items = guards.into_iter().map(|g| (g, Mutation::new().set("done", true))).collect();
        let results = LockGuard::release_many(items).await;
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(matches!(results[1], Err(LockError::Lost { .. })), "{results:?}");
        for id in ids {
            let r = store.get(&coll, &Key::new(id).unwrap()).await.unwrap().record.unwrap();
            assert_eq!(r.data().get_bool("done").is_ok(), id != "b", "{id}");
            assert!(r.lease().is_none(), "{id}");
        }
    }
}
