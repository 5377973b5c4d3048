//! The operations (acquire, also as a holder; release; extend, also by an amount; lookups),
//! each planned from its reads and committed by [`transact`](FirestoreBackend::transact), and
//! the [`LockBackend`] implementation on top.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use super::documents::{
    FenceDocument, Found, LockDocument, MAX_EXPIRES_MS, Millis, document_ids, parse_fence,
};
use super::error::map_error;
use super::in_doubt::AcquireInDoubt;
use super::transaction::Write;
use super::{FirestoreBackend, GATES};
use crate::backend::key::{hash_key, normalize_key};
use crate::backend::time::{check_expiry, is_live, now_ms, ttl_millis};
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseNotifier, ReleaseOutcome, TimeAuthority, check_holder,
};
use crate::error::LockError;
use crate::fence::Fence;
use crate::lock_id::LockId;

/// What release and extend found for a lock id.
enum Resolved {
    /// Exactly one live document carries the lock id.
    Held(Found<LockDocument>),
    /// Why there is nothing to act on.
    NotHeld(Option<NotHeldReason>),
}

impl FirestoreBackend {
    /// Picks the one live document of `lock_id` among `found`, checking ownership (ADR-003)
    /// and refusing to act on live duplicates.
    fn resolve(found: Vec<Found<LockDocument>>, lock_id: &LockId, now: u64) -> Resolved {
        let owned: Vec<_> = found
            .into_iter()
            .filter(|found| found.data.lock_id == lock_id.as_str())
            .collect();
        if owned.is_empty() {
            return Resolved::NotHeld(Some(NotHeldReason::NotFound));
        }
        let total = owned.len();
        let mut live: Vec<_> = owned
            .into_iter()
            .filter(|found| is_live(found.data.expires_at_ms.0, now))
            .collect();
        if total > 1 {
            tracing::warn!(
                lock_id_hash = %hash_key(lock_id.as_str()),
                documents = total,
                live = live.len(),
                "syncguard: several Firestore lock documents carry one lock id; acting only if \
                 exactly one of them is live"
            );
        }
        match live.len() {
            0 => Resolved::NotHeld(Some(NotHeldReason::Expired)),
            1 => Resolved::Held(live.pop().expect("one live document")),
            _ => Resolved::NotHeld(None),
        }
    }

    /// One acquire; with a `holder` (`acquire_as`), stored with the lock and re-entrant by
    /// that holder (see [holders](super#holders)).
    async fn acquire_once(
        &self,
        key: &str,
        ttl: Duration,
        holder: Option<&str>,
    ) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?.into_owned();
        let ttl_ms = ttl_millis(ttl)?;
        if let Some(holder) = holder {
            check_holder(holder)?;
        }
        let (lock_doc, fence_doc) = document_ids(&key)?;
        // A plain read first: while the key is held by someone else (the common case under
        // contention) the answer is Contended at once, without waiting for a turn. The read
        // saw a live lock during this call, which is all Contended claims.
        let seen = self
            .read_lock(&self.db, &lock_doc)
            .await
            .map_err(map_error)?;
        if let Some(lock) = seen
            && is_live(lock.expires_at_ms.0, now_ms())
            && !lock.reentered_by(holder)
        {
            return Ok(AcquireOutcome::contended(Some(lock.expires_at_ms.0)));
        }
        let mut hasher = std::hash::DefaultHasher::new();
        lock_doc.hash(&mut hasher);
        let gate = &self.gates[(hasher.finish() % GATES as u64) as usize];
        let _turn = gate.lock().await;
        // One lock id for every run of the transaction (a run is repeated only after its
        // commit was refused whole), so that an acquire in doubt is released by it.
        let lock_id = LockId::generate();
        let in_doubt = holder
            .is_none()
            .then(|| AcquireInDoubt::new(self, &lock_id, ttl));
        let (key, lock_doc, fence_doc, new_id) = (&key, &lock_doc, &fence_doc, &lock_id);
        let outcome = self
            .transact_tracking_commit(false, |reader| async move {
                let (current, lock_unchanged) =
                    Self::read::<LockDocument>(&reader, self.config.lock_collection(), lock_doc)
                        .await?;
                if let Some(current) = current
                    && is_live(current.expires_at_ms.0, now_ms())
                {
                    if !current.reentered_by(holder) {
                        let held_until = Some(current.expires_at_ms.0);
                        return Ok((AcquireOutcome::contended(held_until), Vec::new()));
                    }
                    // Re-entered by its holder: a fresh lease (from a time taken after the read),
                    // the same lock id and fence; the fence counter is left alone.
                    let lock_id = current.parsed_lock_id()?;
                    let fence = current.parsed_fence()?;
                    let now = now_ms();
                    let expires_at_ms = now + ttl_ms;
                    let renewed = LockDocument {
                        expires_at_ms: Millis(expires_at_ms),
                        acquired_at_ms: Millis(now),
                        ..current
                    };
                    let writes = vec![Write::UpdateLock(
                        lock_doc.clone(),
                        renewed,
                        &["expiresAtMs", "acquiredAtMs"],
                        lock_unchanged,
                    )];
                    let lease = Lease::new(lock_id, expires_at_ms, fence);
                    return Ok((AcquireOutcome::Acquired(lease), writes));
                }
                let (counter, fence_unchanged) =
                    Self::read::<FenceDocument>(&reader, self.config.fence_collection(), fence_doc)
                        .await?;
                // The authoritative time of this acquisition, taken after its reads and before the
                // commit that writes it.
                let now = now_ms();
                let previous = match &counter {
                    Some(counter) => parse_fence(&counter.fence)?,
                    None => 0,
                };
                let fence = Fence::new(previous.saturating_add(1))?;
                let fence_text = format!("{:015}", fence.get());
                let lock_id = new_id.clone();
                let expires_at_ms = now + ttl_ms;
                let writes = vec![
                    Write::SetFence(
                        fence_doc.clone(),
                        FenceDocument {
                            fence: fence_text.clone(),
                            key_debug: Some(key.clone()),
                        },
                        fence_unchanged,
                    ),
                    // The whole document: a holder only when given, none left from an expired lock.
                    Write::SetLock(
                        lock_doc.clone(),
                        LockDocument {
                            lock_id: lock_id.as_str().to_owned(),
                            expires_at_ms: Millis(expires_at_ms),
                            acquired_at_ms: Millis(now),
                            key: key.clone(),
                            fence: fence_text,
                            holder: holder.map(str::to_owned),
                        },
                        lock_unchanged,
                    ),
                ];
                let lease = Lease::new(lock_id, expires_at_ms, fence);
                Ok((AcquireOutcome::Acquired(lease), writes))
            })
            .await;
        if let Some(in_doubt) = in_doubt {
            match &outcome {
                Ok(_) => in_doubt.settle(),
                Err(failure) => in_doubt.settle_unless_sent(failure),
            }
        }
        Ok(outcome?)
    }

    async fn release_once(&self, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        let (outcome, released_key) = self
            .transact(true, |reader| async move {
                let found = self.query_lock_id(&reader, lock_id).await?;
                let now = now_ms();
                Ok(match Self::resolve(found, lock_id, now) {
                    Resolved::Held(held) => (
                        (ReleaseOutcome::Released, Some(held.data.key)),
                        vec![Write::DeleteLock(held.id, held.unchanged)],
                    ),
                    Resolved::NotHeld(reason) => {
                        ((ReleaseOutcome::NotHeld(reason), None), Vec::new())
                    }
                })
            })
            .await?;
        if let Some(key) = released_key {
            self.notifier.released(&key);
        }
        Ok(outcome)
    }

    /// One extend, to the expiry `expiry` makes of the current one and the time (its amount
    /// checked by the caller).
    async fn extend_once(
        &self,
        lock_id: &LockId,
        expiry: Result<impl Fn(u64, u64) -> u64 + Copy, LockError>,
    ) -> Result<ExtendOutcome, LockError> {
        let expiry = expiry?;
        self.transact(true, |reader| async move {
            let found = self.query_lock_id(&reader, lock_id).await?;
            let now = now_ms();
            Ok(match Self::resolve(found, lock_id, now) {
                Resolved::Held(mut held) => {
                    // Set on the live lock only (resolve refused an expired one).
                    let expires_at_ms = expiry(held.data.expires_at_ms.0, now);
                    held.data.expires_at_ms = Millis(expires_at_ms);
                    (
                        ExtendOutcome::Extended { expires_at_ms },
                        vec![Write::UpdateLock(
                            held.id,
                            held.data,
                            &["expiresAtMs"],
                            held.unchanged,
                        )],
                    )
                }
                Resolved::NotHeld(reason) => (ExtendOutcome::NotHeld(reason), Vec::new()),
            })
        })
        .await
    }

    /// The live lock document on `key`, by direct read.
    async fn live_by_key(&self, key: &str) -> Result<Option<LockDocument>, LockError> {
        let key = normalize_key(key)?;
        let (lock_doc, _) = document_ids(&key)?;
        let found = self
            .read_lock(&self.db, &lock_doc)
            .await
            .map_err(map_error)?;
        let now = now_ms();
        Ok(found.filter(|data| is_live(data.expires_at_ms.0, now)))
    }

    async fn lookup_once(&self, query: Lookup<'_>) -> Result<Option<LockInfo>, LockError> {
        let found = match query {
            Lookup::Key(key) => self.live_by_key(key).await?,
            Lookup::LockId(lock_id) => {
                self.transact(true, |reader| async move {
                    let found = self.query_lock_id(&reader, lock_id).await?;
                    let now = now_ms();
                    Ok(match Self::resolve(found, lock_id, now) {
                        Resolved::Held(held) => (Some(held.data), Vec::new()),
                        Resolved::NotHeld(_) => (None, Vec::new()),
                    })
                })
                .await?
            }
        };
        found.map(LockDocument::into_info).transpose()
    }
}

impl FirestoreBackend {
    /// `operation`, failed with [`ErrorCode::NetworkTimeout`](crate::ErrorCode::NetworkTimeout) when it does not end within the
    /// operation timeout. An acquire cut short lets go of its lock in the background
    /// (`in_doubt.rs`).
    async fn within_operation_timeout<T>(
        &self,
        operation: impl Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        let within = self.config.operation_timeout();
        tokio::time::timeout(within, operation)
            .await
            .unwrap_or_else(|_elapsed| {
                Err(LockError::network_timeout(format!(
                    "Firestore did not answer within the operation timeout ({within:?}); the \
                     operation may or may not have been applied"
                )))
            })
    }
}

impl LockBackend for FirestoreBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.within_operation_timeout(self.acquire_once(key, ttl, None)))
    }

    fn acquire_as<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.within_operation_timeout(self.acquire_once(key, ttl, Some(holder))))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(self.within_operation_timeout(self.release_once(lock_id)))
    }

    fn release_notifier(&self) -> Option<ReleaseNotifier> {
        Some(self.notifier.clone())
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let expiry = ttl_millis(ttl).map(|ttl_ms| move |_, now: u64| now + ttl_ms);
        Box::pin(self.within_operation_timeout(self.extend_once(lock_id, expiry)))
    }

    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let expiry = ttl_millis(by)
            .map(|by_ms| move |current: u64, _| current.saturating_add(by_ms).min(MAX_EXPIRES_MS));
        Box::pin(self.within_operation_timeout(self.extend_once(lock_id, expiry)))
    }

    fn expire_at<'a>(
        &'a self,
        lock_id: &'a LockId,
        expires_at_ms: u64,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let expiry = check_expiry(expires_at_ms).map(|at| move |_, _| at);
        Box::pin(self.within_operation_timeout(self.extend_once(lock_id, expiry)))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(
            self.within_operation_timeout(
                async move { Ok(self.live_by_key(key).await?.is_some()) },
            ),
        )
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(self.within_operation_timeout(self.lookup_once(query)))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("firestore", TimeAuthority::Client).with_holders()
    }
}

#[cfg(test)]
mod tests {
    use firestore::FirestoreWritePrecondition;

    use super::*;

    #[test]
    fn duplicates_are_never_acted_on_when_live() {
        let id = LockId::generate();
        let doc = |expires: u64| LockDocument {
            lock_id: id.as_str().to_owned(),
            expires_at_ms: Millis(expires),
            acquired_at_ms: Millis(0),
            key: "k".to_owned(),
            fence: "000000000000001".to_owned(),
            holder: None,
        };
        let now = 100_000;
        let found = |id: &str, data| Found {
            id: id.to_owned(),
            data,
            unchanged: FirestoreWritePrecondition::Exists(true),
        };
        let two_live = vec![found("a", doc(now + 10)), found("b", doc(now + 10))];
        assert!(matches!(
            FirestoreBackend::resolve(two_live, &id, now),
            Resolved::NotHeld(None)
        ));
        let one_live = vec![found("a", doc(1)), found("b", doc(now + 10))];
        assert!(matches!(
            FirestoreBackend::resolve(one_live, &id, now),
            Resolved::Held(ref held) if held.id == "b"
        ));
        let expired = vec![found("a", doc(1))];
        assert!(matches!(
            FirestoreBackend::resolve(expired, &id, now),
            Resolved::NotHeld(Some(NotHeldReason::Expired))
        ));
        let foreign = vec![found(
            "a",
            LockDocument {
                lock_id: LockId::generate().as_str().to_owned(),
                ..doc(now + 10)
            },
        )];
        assert!(matches!(
            FirestoreBackend::resolve(foreign, &id, now),
            Resolved::NotHeld(Some(NotHeldReason::NotFound))
        ));
    }
}
