//! The tables of the in-process backend, and the atomic steps on them: acquire, release and
//! extend, each done under the backend's one mutex.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher as _, BuildHasherDefault};

use super::entries::{ByHash, Held, LockIdHasher, Slot, StoredKey, find_lock, take_lock};
use crate::backend::{AcquireOutcome, ExtendOutcome, Lease, NotHeldReason, ReleaseOutcome};
use crate::error::LockError;
use crate::fence::Fence;
use crate::lock_id::LockId;

#[derive(Default)]
pub(super) struct State {
    /// The fence counter and the stored locks (live, or expired and not yet dropped) of the
    /// keys locked lately, by the keyed hash of the key: one table, so that an acquisition
    /// touches one slot. Each operation hashes its key once (with the std's `RandomState`, as
    /// a `HashMap<String, _>` would), and the index below keeps that hash, so that resizing,
    /// release and extend never hash a key again.
    pub(super) keys: ByHash<Slot>,
    /// At least every fence a forgotten counter reached: a key without a slot in `keys` starts
    /// above it. 0 until counters are first forgotten, so new keys start at 1.
    pub(super) forgotten: u64,
    /// Reverse index lock id → hash of its key, for release, extend and lookup by id. It holds
    /// the ids of the locks stored in `keys`, and only those.
    pub(super) ids: HashMap<LockId, u64, BuildHasherDefault<LockIdHasher>>,
    pub(super) key_hasher: RandomState,
    /// Acquisitions since the last sweep of expired locks.
    pub(super) since_sweep: usize,
    /// Locks the last sweep left stored (live then).
    pub(super) kept_by_sweep: usize,
}

impl State {
    /// Takes the lock on `key`; with a `holder`, also re-takes a live lock of that holder.
    pub(super) fn acquire(
        &mut self,
        key: &str,
        holder: Option<&str>,
        ttl_ms: u64,
        now: u64,
    ) -> Result<AcquireOutcome, LockError> {
        let hash = self.key_hasher.hash_one(key);
        self.acquire_hashed(key, holder, hash, ttl_ms, now)
    }

    /// [`acquire`](Self::acquire) with the key's hash already computed.
    fn acquire_hashed(
        &mut self,
        key: &str,
        holder: Option<&str>,
        hash: u64,
        ttl_ms: u64,
        now: u64,
    ) -> Result<AcquireOutcome, LockError> {
        self.sweep_if_due(now);
        self.forget_fences_if_due();
        // One lookup of the key's hash serves the check, the fence and the insertion.
        let forgotten = self.forgotten;
        let slot = self.keys.entry(hash).or_insert_with(|| Slot {
            fence: forgotten,
            first: None,
            collided: Vec::new(),
        });
        if let Some(live) = slot
            .locks_mut()
            .find(|held| held.key.is(key) && held.is_live(now))
        {
            // Re-entered by its holder: a fresh lease, the same lock id and fence.
            if holder.is_some() && live.holder.as_deref() == holder {
                live.expires_at_ms = now.saturating_add(ttl_ms);
                live.acquired_at_ms = now;
                return Ok(AcquireOutcome::Acquired(Lease::new(
                    live.lock_id.clone(),
                    live.expires_at_ms,
                    live.fence,
                )));
            }
            return Ok(AcquireOutcome::contended(Some(live.expires_at_ms)));
        }
        let fence = Fence::new(slot.fence + 1)?;
        slot.fence = fence.get();
        let lock_id = LockId::generate();
        let expires_at_ms = now + ttl_ms;
        let held = Held {
            key: StoredKey::new(key),
            lock_id: lock_id.clone(),
            expires_at_ms,
            acquired_at_ms: now,
            fence,
            holder: holder.map(Box::from),
        };
        let unstored = match slot.locks_mut().find(|stored| stored.key.is(key)) {
            // An expired lock on the key: replaced, with its index entry.
            Some(stored) => {
                let expired = std::mem::replace(stored, held);
                self.ids.remove(&expired.lock_id);
                None
            }
            None => Some(held),
        };
        if let Some(held) = unstored {
            slot.store(held);
        }
        self.ids.insert(lock_id.clone(), hash);
        self.since_sweep += 1;
        Ok(AcquireOutcome::Acquired(Lease::new(
            lock_id,
            expires_at_ms,
            fence,
        )))
    }

    /// Releases the lock; the released lock comes back with a release (to announce it).
    pub(super) fn release(&mut self, lock_id: &LockId, now: u64) -> (ReleaseOutcome, Option<Held>) {
        // Every outcome drops the index entry and the stored lock.
        let Some(hash) = self.ids.remove(lock_id) else {
            return (ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound)), None);
        };
        match take_lock(&mut self.keys, hash, lock_id) {
            Some(held) if held.is_live(now) => (ReleaseOutcome::Released, Some(held)),
            Some(_) => (ReleaseOutcome::NotHeld(Some(NotHeldReason::Expired)), None),
            None => (ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound)), None),
        }
    }

    /// Sets the live lock's expiry to what `expiry` makes of the current one.
    pub(super) fn extend(
        &mut self,
        lock_id: &LockId,
        now: u64,
        expiry: impl FnOnce(u64) -> u64,
    ) -> ExtendOutcome {
        let Some(&hash) = self.ids.get(lock_id) else {
            return ExtendOutcome::NotHeld(Some(NotHeldReason::NotFound));
        };
        let reason = match find_lock(&mut self.keys, hash, |held| held.lock_id == *lock_id) {
            Some(held) if held.is_live(now) => {
                held.expires_at_ms = expiry(held.expires_at_ms);
                return ExtendOutcome::Extended {
                    expires_at_ms: held.expires_at_ms,
                };
            }
            // Never revived: dropped instead.
            Some(_) => {
                take_lock(&mut self.keys, hash, lock_id);
                NotHeldReason::Expired
            }
            None => NotHeldReason::NotFound,
        };
        self.ids.remove(lock_id);
        ExtendOutcome::NotHeld(Some(reason))
    }

    /// The lock stored for `key`, live or not.
    pub(super) fn by_key(&self, key: &str) -> Option<&Held> {
        let hash = self.key_hasher.hash_one(key);
        self.keys
            .get(&hash)
            .and_then(|slot| slot.locks().find(|held| held.key.is(key)))
    }

    /// The lock `lock_id` holds, live or not.
    pub(super) fn by_lock_id(&self, lock_id: &LockId) -> Option<&Held> {
        self.ids
            .get(lock_id)
            .and_then(|hash| self.keys.get(hash))
            .and_then(|slot| slot.locks().find(|held| held.lock_id == *lock_id))
    }
}

#[cfg(test)]
impl State {
    /// An acquire without holder.
    pub(super) fn acquire_free(
        &mut self,
        key: &str,
        ttl_ms: u64,
        now: u64,
    ) -> Result<AcquireOutcome, LockError> {
        self.acquire(key, None, ttl_ms, now)
    }

    pub(super) fn stored_locks(&self) -> usize {
        self.keys.values().map(|slot| slot.locks().count()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::entries::INLINE_KEY;
    use super::*;

    fn lease(outcome: Result<AcquireOutcome, LockError>) -> Lease {
        outcome.unwrap().lease().expect("acquired")
    }

    #[test]
    fn keys_whose_hashes_collide_keep_their_own_locks() {
        let mut state = State::default();
        let now = 1_000_000;
        let contended = |state: &mut State, key| {
            state
                .acquire_hashed(key, None, 7, 10_000, now)
                .unwrap()
                .is_contended()
        };
        let a = lease(state.acquire_hashed("a", None, 7, 10_000, now));
        let b = lease(state.acquire_hashed("b", None, 7, 10_000, now));
        // One counter for the hash: each key's fences still only grow.
        assert_eq!((a.fence.get(), b.fence.get()), (1, 2));
        assert!(contended(&mut state, "a"));
        assert!(matches!(
            state.extend(&b.lock_id, now, |_| now + 20_000),
            ExtendOutcome::Extended { expires_at_ms } if expires_at_ms == now + 20_000
        ));
        assert!(state.release(&a.lock_id, now).0.is_released());
        assert!(!state.release(&a.lock_id, now).0.is_released());
        // "a" is free again and "b" still held, whichever of them comes first in the bucket.
        let a = lease(state.acquire_hashed("a", None, 7, 10_000, now));
        assert_eq!(a.fence.get(), 3);
        assert!(contended(&mut state, "b"));
        assert!(state.release(&b.lock_id, now).0.is_released());
        assert!(contended(&mut state, "a"));
        assert!(state.release(&a.lock_id, now).0.is_released());
        assert!(state.ids.is_empty() && state.stored_locks() == 0);
    }

    #[test]
    fn short_and_long_keys_are_stored_whole() {
        let mut state = State::default();
        let now = 1_000_000;
        let keys = [
            "k".to_owned(),
            "é".repeat(INLINE_KEY / 2),       // inline, to the last byte
            "x".repeat(INLINE_KEY + 1),       // just too long to be inline
            format!("{}:ü", "y".repeat(300)), // longer than a u8 counts
        ];
        for key in &keys {
            let held = lease(state.acquire_free(key, 10_000, now));
            assert!(state.acquire_free(key, 10_000, now).unwrap().is_contended());
            // A key that only starts the same is another lock.
            lease(state.acquire_free(&format!("{key}!"), 10_000, now));
            let hash = state.key_hasher.hash_one(key.as_str());
            let stored = find_lock(&mut state.keys, hash, |held| held.key.is(key)).unwrap();
            assert_eq!(stored.key.to_owned_string(), *key);
            assert!(state.release(&held.lock_id, now).0.is_released());
        }
    }

    #[test]
    fn released_keys_keep_only_their_counter() {
        let mut state = State::default();
        let now = 1_000_000;
        for round in 1..=3 {
            let held = lease(state.acquire_free("job", 10_000, now));
            assert_eq!(held.fence.get(), round);
            assert!(state.release(&held.lock_id, now).0.is_released());
        }
        assert!(state.ids.is_empty() && state.stored_locks() == 0);
        assert_eq!(state.keys.len(), 1);
    }
}
