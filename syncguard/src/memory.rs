//! The in-process backend.

use std::collections::HashMap;
use std::collections::hash_map::{Entry, RandomState};
use std::hash::{BuildHasher as _, BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseOutcome, TimeAuthority,
};
use crate::key::normalize_key;
use crate::time::{is_live, now_ms, ttl_millis};
use crate::{Fence, LockError, LockId};

/// Locks within one process: the embedded default backend.
///
/// It implements the whole contract, fences included: each key keeps its own counter, which
/// survives release and expiry for the life of the backend. That also means memory grows with
/// the number of *distinct* keys ever locked (the key and about 100 bytes each); held locks
/// cost about 100 bytes more. Time authority is the local clock.
///
/// Clones share the same locks, so clone it freely into tasks. Locks are not shared between
/// processes: use PostgreSQL, Redis or Firestore for that.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let guard = syncguard::acquire(&backend, &LockOptions::new("report:daily")).await?;
/// println!("holding with fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// Per key ever locked: the fence counter and the current (possibly expired) lock, by the
    /// keyed hash of the key. Each operation hashes its key once (with the std's
    /// `RandomState`, as a `HashMap<String, _>` would, so clients cannot aim collisions); the
    /// table and the index below keep that hash, so that resizing, release and extend never
    /// hash a key again.
    slots: HashMap<u64, Bucket, BuildHasherDefault<KnownHash>>,
    /// Reverse index lock id → hash of its key, for release, extend and lookup by id. It only
    /// holds the ids of locks still in `slots` (possibly expired).
    ids: HashMap<LockId, u64, BuildHasherDefault<LockIdHasher>>,
    key_hasher: RandomState,
    /// Acquisitions since the last sweep of expired locks.
    since_sweep: usize,
}

/// The slots of the keys that share one hash: `first`, and more only if distinct keys
/// collide on all 64 bits (an empty `Vec` allocates nothing).
struct Bucket {
    first: Slot,
    collided: Vec<Slot>,
}

struct Slot {
    key: Box<str>,
    fence: u64,
    lock: Option<Held>,
}

struct Held {
    lock_id: LockId,
    expires_at_ms: u64,
    acquired_at_ms: u64,
    fence: Fence,
}

/// The hasher of `State::slots`, whose keys already are hashes.
#[derive(Default)]
struct KnownHash(u64);

impl Hasher for KnownHash {
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); fold anything else all the same.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Hashes the lock ids of the reverse index. Every id in it was drawn from a CSPRNG here, so
/// its bytes are already uniformly random and folding them spreads the table as well as
/// SipHash would, at a fraction of the cost.
#[derive(Default)]
struct LockIdHasher(u64);

impl Hasher for LockIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0_u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn finish(&self) -> u64 {
        // The multiplications mix upwards; fold the high half into the low bits, which pick
        // the bucket.
        self.0 ^ (self.0 >> 32)
    }
}

impl Bucket {
    fn new(key: &str) -> Self {
        Self {
            first: Slot::new(key),
            collided: Vec::new(),
        }
    }

    fn slots(&self) -> impl Iterator<Item = &Slot> {
        std::iter::once(&self.first).chain(&self.collided)
    }

    /// The slot of `key`, added if the key is new.
    fn slot_of(&mut self, key: &str) -> &mut Slot {
        if *self.first.key == *key {
            return &mut self.first;
        }
        match self.collided.iter().position(|slot| *slot.key == *key) {
            Some(index) => &mut self.collided[index],
            None => {
                self.collided.push(Slot::new(key));
                self.collided.last_mut().expect("pushed just above")
            }
        }
    }

    /// The slot whose lock `lock_id` holds (live or not).
    fn slot_held_by(&mut self, lock_id: &LockId) -> Option<&mut Slot> {
        std::iter::once(&mut self.first)
            .chain(&mut self.collided)
            .find(|slot| slot.is_held_by(lock_id))
    }
}

impl Slot {
    fn new(key: &str) -> Self {
        Self {
            key: key.into(),
            fence: 0,
            lock: None,
        }
    }

    fn is_held_by(&self, lock_id: &LockId) -> bool {
        self.lock
            .as_ref()
            .is_some_and(|held| held.lock_id == *lock_id)
    }

    fn live_lock(&self, now: u64) -> Option<&Held> {
        self.lock
            .as_ref()
            .filter(|held| is_live(held.expires_at_ms, now))
    }
}

impl MemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the maps half-updated (every mutation completes
        // before any call that could panic), so a poisoned lock is safe to keep using.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies `view` to the live lock the query names, if any.
    fn find_live<R>(
        &self,
        query: Lookup<'_>,
        view: impl FnOnce(&str, &Held) -> R,
    ) -> Result<Option<R>, LockError> {
        let now = now_ms();
        let state = self.state();
        let slot = match query {
            Lookup::Key(key) => {
                let key = normalize_key(key)?;
                let hash = state.key_hasher.hash_one(&*key);
                state
                    .slots
                    .get(&hash)
                    .and_then(|bucket| bucket.slots().find(|slot| *slot.key == *key))
            }
            Lookup::LockId(lock_id) => state
                .ids
                .get(lock_id)
                .and_then(|hash| state.slots.get(hash))
                .and_then(|bucket| bucket.slots().find(|slot| slot.is_held_by(lock_id))),
        };
        Ok(slot.and_then(|slot| Some(view(&slot.key, slot.live_lock(now)?))))
    }
}

impl State {
    fn acquire(&mut self, key: &str, ttl_ms: u64, now: u64) -> Result<AcquireOutcome, LockError> {
        let hash = self.key_hasher.hash_one(key);
        self.acquire_hashed(key, hash, ttl_ms, now)
    }

    /// [`acquire`](Self::acquire) with the key's hash already computed.
    fn acquire_hashed(
        &mut self,
        key: &str,
        hash: u64,
        ttl_ms: u64,
        now: u64,
    ) -> Result<AcquireOutcome, LockError> {
        self.sweep_if_due(now);
        let slot = match self.slots.entry(hash) {
            Entry::Occupied(bucket) => bucket.into_mut().slot_of(key),
            Entry::Vacant(bucket) => &mut bucket.insert(Bucket::new(key)).first,
        };
        if slot.live_lock(now).is_some() {
            return Ok(AcquireOutcome::Contended);
        }
        let fence = Fence::new(slot.fence + 1)?;
        slot.fence = fence.get();
        let lock_id = LockId::generate();
        let expires_at_ms = now + ttl_ms;
        let previous = slot.lock.replace(Held {
            lock_id: lock_id.clone(),
            expires_at_ms,
            acquired_at_ms: now,
            fence,
        });
        if let Some(previous) = previous {
            self.ids.remove(&previous.lock_id);
        }
        self.ids.insert(lock_id.clone(), hash);
        self.since_sweep += 1;
        Ok(AcquireOutcome::Acquired(Lease::new(
            lock_id,
            expires_at_ms,
            fence,
        )))
    }

    fn release(&mut self, lock_id: &LockId, now: u64) -> ReleaseOutcome {
        // Every outcome drops the index entry: take it out at once.
        let Some(hash) = self.ids.remove(lock_id) else {
            return ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound));
        };
        match self.held_slot(hash, lock_id, now) {
            Ok(slot) => {
                slot.lock = None;
                ReleaseOutcome::Released
            }
            Err(reason) => ReleaseOutcome::NotHeld(Some(reason)),
        }
    }

    fn extend(&mut self, lock_id: &LockId, ttl_ms: u64, now: u64) -> ExtendOutcome {
        let Some(&hash) = self.ids.get(lock_id) else {
            return ExtendOutcome::NotHeld(Some(NotHeldReason::NotFound));
        };
        match self.held_slot(hash, lock_id, now) {
            Ok(slot) => {
                let held = slot.lock.as_mut().expect("held_slot returns a held lock");
                held.expires_at_ms = now + ttl_ms;
                ExtendOutcome::Extended {
                    expires_at_ms: held.expires_at_ms,
                }
            }
            Err(reason) => ExtendOutcome::NotHeld(Some(reason)),
        }
    }

    /// The slot whose lock `lock_id` holds, if that lock is live; otherwise why not, after
    /// dropping what no longer leads to a live lock (the expired lock, the index entry).
    /// `hash` comes from the index; the slot is found by its lock id, an explicit ownership
    /// check.
    fn held_slot(
        &mut self,
        hash: u64,
        lock_id: &LockId,
        now: u64,
    ) -> Result<&mut Slot, NotHeldReason> {
        let owned = self
            .slots
            .get_mut(&hash)
            .and_then(|bucket| bucket.slot_held_by(lock_id));
        let Some(slot) = owned else {
            self.ids.remove(lock_id);
            return Err(NotHeldReason::NotFound);
        };
        if slot.live_lock(now).is_some() {
            return Ok(slot);
        }
        slot.lock = None;
        self.ids.remove(lock_id);
        Err(NotHeldReason::Expired)
    }

    /// Drops expired locks (never fence counters) once enough acquisitions have happened, so
    /// that abandoned locks do not pile up. It visits the held locks only, at most once per
    /// as many acquisitions: amortized O(1) per acquire.
    fn sweep_if_due(&mut self, now: u64) {
        if self.since_sweep < self.ids.len().max(1024) {
            return;
        }
        self.since_sweep = 0;
        let slots = &mut self.slots;
        self.ids.retain(|lock_id, hash| {
            let Some(slot) = slots
                .get_mut(hash)
                .and_then(|bucket| bucket.slot_held_by(lock_id))
            else {
                return false;
            };
            if slot.live_lock(now).is_some() {
                return true;
            }
            slot.lock = None;
            false
        });
    }
}

impl LockBackend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        let outcome = normalize_key(key).and_then(|key| {
            let ttl_ms = ttl_millis(ttl)?;
            let now = now_ms();
            self.state().acquire(&key, ttl_ms, now)
        });
        Box::pin(async move { outcome })
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        let now = now_ms();
        let outcome = self.state().release(lock_id, now);
        Box::pin(async move { Ok(outcome) })
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let outcome = ttl_millis(ttl).map(|ttl_ms| {
            let now = now_ms();
            self.state().extend(lock_id, ttl_ms, now)
        });
        Box::pin(async move { outcome })
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        let locked = self
            .find_live(Lookup::Key(key), |_, _| ())
            .map(|found| found.is_some());
        Box::pin(async move { locked })
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        let info = self.find_live(query, |key, held| {
            LockInfo::new(
                key.to_owned(),
                held.lock_id.clone(),
                held.expires_at_ms,
                held.acquired_at_ms,
                held.fence,
            )
        });
        Box::pin(async move { info })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("memory", TimeAuthority::Client)
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("MemoryBackend")
            .field("held", &state.ids.len())
            .field(
                "keys",
                &state
                    .slots
                    .values()
                    .map(|bucket| bucket.slots().count())
                    .sum::<usize>(),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(outcome: Result<AcquireOutcome, LockError>) -> Lease {
        outcome.unwrap().lease().expect("acquired")
    }

    #[test]
    fn keys_whose_hashes_collide_keep_their_own_locks_and_fences() {
        let mut state = State::default();
        let now = 1_000_000;
        let a = lease(state.acquire_hashed("a", 7, 10_000, now));
        let b = lease(state.acquire_hashed("b", 7, 10_000, now));
        assert_eq!((a.fence.get(), b.fence.get()), (1, 1));
        assert!(
            state
                .acquire_hashed("a", 7, 10_000, now)
                .unwrap()
                .is_contended()
        );
        assert!(matches!(
            state.extend(&b.lock_id, 20_000, now),
            ExtendOutcome::Extended { expires_at_ms } if expires_at_ms == now + 20_000
        ));
        assert!(state.release(&a.lock_id, now).is_released());
        assert!(!state.release(&a.lock_id, now).is_released());
        // "a" is free again, "b" is still held.
        assert_eq!(
            lease(state.acquire_hashed("a", 7, 10_000, now)).fence.get(),
            2
        );
        assert!(
            state
                .acquire_hashed("b", 7, 10_000, now)
                .unwrap()
                .is_contended()
        );
        assert!(state.release(&b.lock_id, now).is_released());
        assert_eq!(state.slots[&7].slots().count(), 2);
    }

    #[test]
    fn the_sweep_drops_expired_locks_and_keeps_fences_and_live_locks() {
        let mut state = State::default();
        let now = 1_000_000;
        let live = lease(state.acquire("live", 60_000, now));
        // Abandoned by their holders: never released.
        for i in 0..1100 {
            lease(state.acquire(&format!("abandoned:{i}"), 10, now));
        }
        assert_eq!(state.ids.len(), 1101);
        // Past expiry and tolerance, as many acquisitions as locks are held bring a sweep.
        let later = now + 5_000;
        for i in 0..1100 {
            let fresh = lease(state.acquire(&format!("fresh:{i}"), 60_000, later));
            assert!(state.release(&fresh.lock_id, later).is_released());
        }
        assert_eq!(state.ids.len(), 1, "only the live lock is left");
        assert!(
            state
                .extend(&live.lock_id, 60_000, later)
                .expires_at_ms()
                .is_some()
        );
        assert!(state.acquire("live", 60_000, later).unwrap().is_contended());
        let again = lease(state.acquire("abandoned:0", 10, later));
        assert_eq!(again.fence.get(), 2, "the fence counter survives");
    }
}
