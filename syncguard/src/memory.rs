//! The in-process backend.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
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
/// It implements the whole contract, fences included: each key's fences only grow, across
/// release and expiry, for the life of the backend. Memory stays bounded however many
/// distinct keys are locked (a fresh idempotency key per request, say):
///
/// - The fence counters of held keys, and of up to 32 other recently locked keys, are kept,
///   so their fences go 1, 2, 3, ...
/// - Beyond that, the counters of released keys are forgotten, and a forgotten (or new) key
///   goes on from above every fence a forgotten key ever had: still strictly increasing for
///   that key, with a gap.
///
/// Counters are kept under a 64-bit keyed hash of the key, not the key itself (two keys whose
/// hashes collide, which clients cannot aim for, would share a counter: their fences still
/// only grow, with gaps). A key costs about 150 bytes while its counter is kept (its lock
/// shares the slot, keys up to 62 bytes inline), and a held lock about 40 bytes more.
/// Time authority is the local clock.
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
    /// The fence counter and the stored locks (live, or expired and not yet dropped) of the
    /// keys locked lately, by the keyed hash of the key: one table, so that an acquisition
    /// touches one slot. Each operation hashes its key once (with the std's `RandomState`, as
    /// a `HashMap<String, _>` would), and the index below keeps that hash, so that resizing,
    /// release and extend never hash a key again.
    keys: ByHash<Slot>,
    /// At least every fence a forgotten counter reached: a key without a slot in `keys` starts
    /// above it. 0 until counters are first forgotten, so new keys start at 1.
    forgotten: u64,
    /// Reverse index lock id → hash of its key, for release, extend and lookup by id. It holds
    /// the ids of the locks stored in `keys`, and only those.
    ids: HashMap<LockId, u64, BuildHasherDefault<LockIdHasher>>,
    key_hasher: RandomState,
    /// Acquisitions since the last sweep of expired locks.
    since_sweep: usize,
    /// Locks the last sweep left stored (live then).
    kept_by_sweep: usize,
}

/// How many fence counters (slots of `keys`) are kept beyond those of held keys; see
/// [`MemoryBackend`]. Small, so that the table stays in cache: each acquire of a fresh key
/// touches a random slot, and under an HTTP server's load a table of 256 counters already
/// missed the cache there (the hottest instruction of acquire in a CPU profile; a third as
/// much time with 32).
const KEPT_FENCES: usize = 32;

/// A table keyed by hashes computed beforehand.
type ByHash<V> = HashMap<u64, V, BuildHasherDefault<KnownHash>>;

/// What one hash holds: the last fence of its key, and its stored lock in `first`. Distinct
/// keys that collide on all 64 bits share the counter and store their further locks in
/// `collided` (an empty `Vec` allocates nothing), which is empty whenever `first` is.
struct Slot {
    fence: u64,
    first: Option<Held>,
    collided: Vec<Held>,
}

struct Held {
    key: StoredKey,
    lock_id: LockId,
    expires_at_ms: u64,
    acquired_at_ms: u64,
    fence: Fence,
}

/// A held lock's key: inline up to [`INLINE_KEY`] bytes (an idempotency key with its prefix
/// fits), which spares an allocation and a free per lock; on the heap beyond.
enum StoredKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<str>),
}

const INLINE_KEY: usize = 62;

impl StoredKey {
    fn new(key: &str) -> Self {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..key.len()].copy_from_slice(key.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(key.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(key) => key.as_bytes(),
        }
    }

    /// Whether this is `key` (compared as bytes: no UTF-8 check on the hot path).
    fn is(&self, key: &str) -> bool {
        self.as_bytes() == key.as_bytes()
    }

    fn to_owned_string(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

/// The hasher of the tables whose keys already are hashes.
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

impl Slot {
    fn locks(&self) -> impl Iterator<Item = &Held> {
        self.first.iter().chain(&self.collided)
    }

    fn locks_mut(&mut self) -> impl Iterator<Item = &mut Held> {
        self.first.iter_mut().chain(&mut self.collided)
    }

    fn store(&mut self, held: Held) {
        match self.first {
            None => self.first = Some(held),
            Some(_) => self.collided.push(held),
        }
    }
}

impl Held {
    fn is_live(&self, now: u64) -> bool {
        is_live(self.expires_at_ms, now)
    }
}

/// The stored lock under `hash` that `is_it` picks (by key, or by lock id: an explicit
/// ownership check even though the index points here).
fn find_lock(
    keys: &mut ByHash<Slot>,
    hash: u64,
    is_it: impl Fn(&Held) -> bool,
) -> Option<&mut Held> {
    keys.get_mut(&hash)?.locks_mut().find(|held| is_it(held))
}

/// Removes the stored lock `lock_id` holds under `hash` (not its index entry); the slot keeps
/// the fence counter.
fn take_lock(keys: &mut ByHash<Slot>, hash: u64, lock_id: &LockId) -> Option<Held> {
    let slot = keys.get_mut(&hash)?;
    if slot
        .first
        .as_ref()
        .is_some_and(|held| held.lock_id == *lock_id)
    {
        let next = slot.collided.pop();
        return std::mem::replace(&mut slot.first, next);
    }
    let index = slot
        .collided
        .iter()
        .position(|held| held.lock_id == *lock_id)?;
    Some(slot.collided.swap_remove(index))
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

    /// What both `acquire` and `try_acquire_now` answer: nothing here waits.
    fn acquire_now(&self, key: &str, ttl: Duration) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?;
        let ttl_ms = ttl_millis(ttl)?;
        let now = now_ms();
        self.state().acquire(&key, ttl_ms, now)
    }

    /// What both `release` and `try_release_now` answer.
    fn release_now(&self, lock_id: &LockId) -> ReleaseOutcome {
        let now = now_ms();
        self.state().release(lock_id, now)
    }

    /// Applies `view` to the live lock the query names, if any.
    fn find_live<R>(
        &self,
        query: Lookup<'_>,
        view: impl FnOnce(&Held) -> R,
    ) -> Result<Option<R>, LockError> {
        let now = now_ms();
        let state = self.state();
        let found = match query {
            Lookup::Key(key) => {
                let key = normalize_key(key)?;
                let hash = state.key_hasher.hash_one(&*key);
                state
                    .keys
                    .get(&hash)
                    .and_then(|slot| slot.locks().find(|held| held.key.is(&key)))
            }
            Lookup::LockId(lock_id) => state
                .ids
                .get(lock_id)
                .and_then(|hash| state.keys.get(hash))
                .and_then(|slot| slot.locks().find(|held| held.lock_id == *lock_id)),
        };
        Ok(found.filter(|held| held.is_live(now)).map(view))
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
        if self.keys.len() >= KEPT_FENCES.max(2 * self.ids.len()) {
            self.forget_fences();
        }
        // One lookup of the key's hash serves the check, the fence and the insertion.
        let forgotten = self.forgotten;
        let slot = self.keys.entry(hash).or_insert_with(|| Slot {
            fence: forgotten,
            first: None,
            collided: Vec::new(),
        });
        if slot
            .locks()
            .any(|held| held.key.is(key) && held.is_live(now))
        {
            return Ok(AcquireOutcome::Contended);
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

    fn release(&mut self, lock_id: &LockId, now: u64) -> ReleaseOutcome {
        // Every outcome drops the index entry and the stored lock.
        let Some(hash) = self.ids.remove(lock_id) else {
            return ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound));
        };
        match take_lock(&mut self.keys, hash, lock_id) {
            Some(held) if held.is_live(now) => ReleaseOutcome::Released,
            Some(_) => ReleaseOutcome::NotHeld(Some(NotHeldReason::Expired)),
            None => ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound)),
        }
    }

    fn extend(&mut self, lock_id: &LockId, ttl_ms: u64, now: u64) -> ExtendOutcome {
        let Some(&hash) = self.ids.get(lock_id) else {
            return ExtendOutcome::NotHeld(Some(NotHeldReason::NotFound));
        };
        let reason = match find_lock(&mut self.keys, hash, |held| held.lock_id == *lock_id) {
            Some(held) if held.is_live(now) => {
                held.expires_at_ms = now + ttl_ms;
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

    /// Forgets the fence counters of the keys that hold no stored lock, keeping their highest
    /// value in `forgotten`. It runs when the table has grown to twice the held keys at least,
    /// so at most once per as many acquisitions as it visits counters: amortized O(1).
    #[cold]
    #[inline(never)]
    fn forget_fences(&mut self) {
        let mut forgotten = self.forgotten;
        self.keys.retain(|_, slot| {
            let held = slot.first.is_some();
            if !held {
                forgotten = forgotten.max(slot.fence);
            }
            held
        });
        self.forgotten = forgotten;
    }

    /// Drops expired locks (never fence counters) once enough acquisitions have happened, so
    /// that abandoned locks do not pile up: stored locks stay below twice the live ones plus
    /// 1,024. It visits the stored locks only, which are at most the locks the last sweep
    /// kept plus the acquisitions since, so a sweep after as many acquisitions as it kept
    /// locks is amortized O(1) per acquire. (Counting every stored lock instead would let
    /// abandoned locks postpone their own sweep forever.)
    fn sweep_if_due(&mut self, now: u64) {
        if self.since_sweep >= self.kept_by_sweep.max(1024) {
            self.sweep(now);
        }
    }

    // Out of line, as is `forget_fences`: rare work that would only crowd acquire's code.
    #[cold]
    #[inline(never)]
    fn sweep(&mut self, now: u64) {
        self.since_sweep = 0;
        let keys = &mut self.keys;
        self.ids.retain(|lock_id, &mut hash| {
            match find_lock(keys, hash, |held| held.lock_id == *lock_id) {
                Some(held) if held.is_live(now) => true,
                Some(_) => {
                    take_lock(keys, hash, lock_id);
                    false
                }
                None => false,
            }
        });
        self.kept_by_sweep = self.ids.len();
    }
}

impl LockBackend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        let outcome = self.acquire_now(key, ttl);
        Box::pin(async move { outcome })
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        let outcome = self.release_now(lock_id);
        Box::pin(async move { Ok(outcome) })
    }

    fn try_acquire_now(
        &self,
        key: &str,
        ttl: Duration,
    ) -> Option<Result<AcquireOutcome, LockError>> {
        Some(self.acquire_now(key, ttl))
    }

    fn try_release_now(&self, lock_id: &LockId) -> Option<Result<ReleaseOutcome, LockError>> {
        Some(Ok(self.release_now(lock_id)))
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
            .find_live(Lookup::Key(key), |_| ())
            .map(|found| found.is_some());
        Box::pin(async move { locked })
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        let info = self.find_live(query, |held| {
            LockInfo::new(
                held.key.to_owned_string(),
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
            .field("fence_counters", &state.keys.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl State {
        fn stored_locks(&self) -> usize {
            self.keys.values().map(|slot| slot.locks().count()).sum()
        }
    }

    fn lease(outcome: Result<AcquireOutcome, LockError>) -> Lease {
        outcome.unwrap().lease().expect("acquired")
    }

    #[test]
    fn keys_whose_hashes_collide_keep_their_own_locks() {
        let mut state = State::default();
        let now = 1_000_000;
        let contended = |state: &mut State, key| {
            state
                .acquire_hashed(key, 7, 10_000, now)
                .unwrap()
                .is_contended()
        };
        let a = lease(state.acquire_hashed("a", 7, 10_000, now));
        let b = lease(state.acquire_hashed("b", 7, 10_000, now));
        // One counter for the hash: each key's fences still only grow.
        assert_eq!((a.fence.get(), b.fence.get()), (1, 2));
        assert!(contended(&mut state, "a"));
        assert!(matches!(
            state.extend(&b.lock_id, 20_000, now),
            ExtendOutcome::Extended { expires_at_ms } if expires_at_ms == now + 20_000
        ));
        assert!(state.release(&a.lock_id, now).is_released());
        assert!(!state.release(&a.lock_id, now).is_released());
        // "a" is free again and "b" still held, whichever of them comes first in the bucket.
        let a = lease(state.acquire_hashed("a", 7, 10_000, now));
        assert_eq!(a.fence.get(), 3);
        assert!(contended(&mut state, "b"));
        assert!(state.release(&b.lock_id, now).is_released());
        assert!(contended(&mut state, "a"));
        assert!(state.release(&a.lock_id, now).is_released());
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
            let held = lease(state.acquire(key, 10_000, now));
            assert!(state.acquire(key, 10_000, now).unwrap().is_contended());
            // A key that only starts the same is another lock.
            lease(state.acquire(&format!("{key}!"), 10_000, now));
            let hash = state.key_hasher.hash_one(key.as_str());
            let stored = find_lock(&mut state.keys, hash, |held| held.key.is(key)).unwrap();
            assert_eq!(stored.key.to_owned_string(), *key);
            assert!(state.release(&held.lock_id, now).is_released());
        }
    }

    #[test]
    fn released_keys_keep_only_their_counter() {
        let mut state = State::default();
        let now = 1_000_000;
        for round in 1..=3 {
            let held = lease(state.acquire("job", 10_000, now));
            assert_eq!(held.fence.get(), round);
            assert!(state.release(&held.lock_id, now).is_released());
        }
        assert!(state.ids.is_empty() && state.stored_locks() == 0);
        assert_eq!(state.keys.len(), 1);
    }

    #[test]
    fn fence_memory_is_bounded_and_fences_still_only_grow() {
        let mut state = State::default();
        let now = 1_000_000;
        let take = |state: &mut State, key: &str| lease(state.acquire(key, 60_000, now));
        // Released after two rounds, then its counter is forgotten among many fresh keys.
        for round in 1..=2 {
            let job = take(&mut state, "job");
            assert_eq!(job.fence.get(), round);
            assert!(state.release(&job.lock_id, now).is_released());
        }
        // Held throughout: its counter is never forgotten.
        let held = take(&mut state, "held");
        for i in 0..3 * KEPT_FENCES {
            let fresh = take(&mut state, &format!("idempotency:{i}"));
            assert!(state.release(&fresh.lock_id, now).is_released());
            assert!(state.keys.len() <= KEPT_FENCES, "{}", state.keys.len());
        }
        assert!(state.forgotten >= 2, "counters were forgotten");
        // A forgotten key goes on above everything it had.
        let job = take(&mut state, "job");
        assert!(job.fence.get() > 2, "{}", job.fence.get());
        assert!(state.release(&job.lock_id, now).is_released());
        let again = take(&mut state, "job");
        assert_eq!(again.fence.get(), job.fence.get() + 1, "remembered again");
        assert!(state.release(&again.lock_id, now).is_released());
        // The held key kept its own counter, and so its place in the sequence.
        assert!(state.release(&held.lock_id, now).is_released());
        assert_eq!(take(&mut state, "held").fence.get(), held.fence.get() + 1);
        // A key never seen before starts above every forgotten counter.
        assert!(take(&mut state, "new").fence.get() > state.forgotten);
    }

    #[test]
    fn held_keys_keep_their_counters_however_many_there_are() {
        let mut state = State::default();
        let now = 1_000_000;
        let held: Vec<_> = (0..2 * KEPT_FENCES)
            .map(|i| lease(state.acquire(&format!("held:{i}"), 60_000, now)))
            .collect();
        assert!(held.iter().all(|lease| lease.fence.get() == 1));
        for (i, first) in held.iter().enumerate() {
            assert!(state.release(&first.lock_id, now).is_released());
            let next = lease(state.acquire(&format!("held:{i}"), 60_000, now));
            assert_eq!(next.fence.get(), 2, "held:{i}");
        }
        assert_eq!(state.keys.len(), 2 * KEPT_FENCES);
    }

    #[test]
    fn abandoned_locks_are_swept_while_live_locks_stay() {
        let mut state = State::default();
        let start = 1_000_000;
        let live: Vec<_> = (0..10)
            .map(|i| lease(state.acquire(&format!("live:{i}"), 3_600_000, start)))
            .collect();
        // 200,000 locks abandoned by their holders, each expired soon after.
        let mut most_stored = 0;
        for i in 0..200_000 {
            let now = start + i;
            lease(state.acquire(&format!("abandoned:{i}"), 1, now));
            most_stored = most_stored.max(state.stored_locks());
        }
        assert!(
            most_stored <= 2 * (10 + 1024) + 1,
            "{most_stored} locks stored"
        );
        for lease in &live {
            assert!(
                state
                    .extend(&lease.lock_id, 60_000, start + 200_000)
                    .expires_at_ms()
                    .is_some()
            );
        }
    }

    #[test]
    fn the_sweep_drops_expired_locks_and_keeps_live_locks_and_fences_growing() {
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
        assert_eq!(state.stored_locks(), 1);
        assert!(
            state
                .extend(&live.lock_id, 60_000, later)
                .expires_at_ms()
                .is_some()
        );
        assert!(state.acquire("live", 60_000, later).unwrap().is_contended());
        // Its counter may have been forgotten with the lock; its fences still only grow.
        let again = lease(state.acquire("abandoned:0", 10, later));
        assert!(again.fence.get() >= 2, "{}", again.fence.get());
    }
}
