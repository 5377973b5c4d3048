//! The in-process backend.

use std::collections::HashMap;
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
/// the number of *distinct* keys ever locked (the key and 8 bytes each); held locks cost about
/// 150 bytes more. Time authority is the local clock.
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
    /// Per key: the fence counter and the current (possibly expired) lock.
    keys: HashMap<String, Slot>,
    /// Reverse index lock id → key, for release, extend and lookup by id.
    ids: HashMap<LockId, String>,
    /// Acquisitions since the last sweep of expired locks.
    since_sweep: usize,
}

#[derive(Default)]
struct Slot {
    fence: u64,
    lock: Option<Held>,
}

struct Held {
    lock_id: LockId,
    expires_at_ms: u64,
    acquired_at_ms: u64,
    fence: Fence,
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

    fn acquire_now(&self, key: &str, ttl: Duration) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?.into_owned();
        let ttl_ms = ttl_millis(ttl)?;
        let now = now_ms();
        let mut guard = self.state();
        let state = &mut *guard;
        state.sweep_if_due(now);
        let slot = state.keys.entry(key.clone()).or_default();
        if let Some(held) = &slot.lock
            && is_live(held.expires_at_ms, now)
        {
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
            state.ids.remove(&previous.lock_id);
        }
        state.ids.insert(lock_id.clone(), key);
        state.since_sweep += 1;
        Ok(AcquireOutcome::Acquired(Lease::new(
            lock_id,
            expires_at_ms,
            fence,
        )))
    }

    /// Finds the live lock of `lock_id` and applies `mutate` to it, or says why there is none.
    /// Resolving, checking and mutating happen under one mutex: no other operation can slip
    /// in between.
    fn with_held<T>(
        &self,
        lock_id: &LockId,
        mutate: impl FnOnce(&mut State, &str, u64) -> T,
    ) -> Result<T, NotHeldReason> {
        let now = now_ms();
        let mut guard = self.state();
        let state = &mut *guard;
        let Some(key) = state.ids.get(lock_id).cloned() else {
            return Err(NotHeldReason::NotFound);
        };
        let held = state.keys.get(&key).and_then(|slot| slot.lock.as_ref());
        match held {
            // Explicit ownership check, even though the index points here (defence in depth).
            Some(held) if held.lock_id == *lock_id => {
                if is_live(held.expires_at_ms, now) {
                    Ok(mutate(state, &key, now))
                } else {
                    state.remove_lock(&key);
                    Err(NotHeldReason::Expired)
                }
            }
            _ => {
                state.ids.remove(lock_id);
                Err(NotHeldReason::NotFound)
            }
        }
    }

    /// Applies `view` to the live lock the query names, if any.
    fn find_live<R>(
        &self,
        query: Lookup<'_>,
        view: impl FnOnce(&str, &Held) -> R,
    ) -> Result<Option<R>, LockError> {
        let now = now_ms();
        let state = self.state();
        let normalized;
        let key: &str = match query {
            Lookup::Key(key) => {
                normalized = normalize_key(key)?;
                &normalized
            }
            Lookup::LockId(lock_id) => match state.ids.get(lock_id) {
                Some(key) => key,
                None => return Ok(None),
            },
        };
        let found = state
            .keys
            .get(key)
            .and_then(|slot| slot.lock.as_ref())
            .filter(|held| is_live(held.expires_at_ms, now))
            .filter(|held| match query {
                Lookup::LockId(lock_id) => held.lock_id == *lock_id,
                Lookup::Key(_) => true,
            })
            .map(|held| view(key, held));
        Ok(found)
    }
}

impl State {
    fn remove_lock(&mut self, key: &str) {
        if let Some(held) = self.keys.get_mut(key).and_then(|slot| slot.lock.take()) {
            self.ids.remove(&held.lock_id);
        }
    }

    /// Drops expired locks (never fence counters) once enough acquisitions have happened, so
    /// that abandoned locks do not pile up; amortized O(1) per acquire.
    fn sweep_if_due(&mut self, now: u64) {
        if self.since_sweep < self.ids.len().max(1024) {
            return;
        }
        self.since_sweep = 0;
        let ids = &mut self.ids;
        for slot in self.keys.values_mut() {
            if slot
                .lock
                .as_ref()
                .is_some_and(|held| !is_live(held.expires_at_ms, now))
            {
                if let Some(held) = slot.lock.take() {
                    ids.remove(&held.lock_id);
                }
            }
        }
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
        let outcome = match self.with_held(lock_id, |state, key, _| state.remove_lock(key)) {
            Ok(()) => ReleaseOutcome::Released,
            Err(reason) => ReleaseOutcome::NotHeld(Some(reason)),
        };
        Box::pin(async move { Ok(outcome) })
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let outcome = ttl_millis(ttl).map(|ttl_ms| {
            let extended = self.with_held(lock_id, |state, key, now| {
                let held = state
                    .keys
                    .get_mut(key)
                    .and_then(|slot| slot.lock.as_mut())
                    .expect("with_held found this lock");
                held.expires_at_ms = now + ttl_ms;
                held.expires_at_ms
            });
            match extended {
                Ok(expires_at_ms) => ExtendOutcome::Extended { expires_at_ms },
                Err(reason) => ExtendOutcome::NotHeld(Some(reason)),
            }
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
            .field("keys", &state.keys.len())
            .finish()
    }
}
