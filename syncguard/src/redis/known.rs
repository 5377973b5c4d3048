//! The lock keys of the locks a backend took itself, by lock id, so that their release and
//! extend read the lock directly instead of first reading the reverse index (one Redis command
//! fewer per operation, the index holding that same key anyway).
//!
//! Entries end with the release, or are swept once their lock cannot be live any more; a lock
//! id not found here (taken by another process, or swept) goes through the index as in the
//! reference.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::time::TIME_TOLERANCE_MS;
use crate::lock_id::LockId;

/// A sweep of dead entries runs when the map has doubled since the last one, from this size.
const FIRST_SWEEP: usize = 1024;

#[derive(Default)]
pub(crate) struct KnownKeys {
    inner: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    keys: HashMap<LockId, Entry>,
    sweep_at: usize,
}

struct Entry {
    lock_key: String,
    /// After this the lock has expired (local clock, with the tolerance and a second to spare).
    dead_after: Instant,
}

fn dead_after(ttl: Duration) -> Instant {
    Instant::now() + ttl + Duration::from_millis(TIME_TOLERANCE_MS + 1000)
}

impl KnownKeys {
    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a lock just taken.
    pub(crate) fn insert(&self, lock_id: LockId, lock_key: String, ttl: Duration) {
        let mut known = self.lock();
        if known.keys.len() >= known.sweep_at.max(FIRST_SWEEP) {
            let now = Instant::now();
            known.keys.retain(|_, entry| entry.dead_after > now);
            known.sweep_at = known.keys.len() * 2;
        }
        let entry = Entry {
            lock_key,
            dead_after: dead_after(ttl),
        };
        known.keys.insert(lock_id, entry);
    }

    /// The lock key of `lock_id`, forgotten (for a release).
    pub(crate) fn take(&self, lock_id: &LockId) -> Option<String> {
        self.lock().keys.remove(lock_id).map(|entry| entry.lock_key)
    }

    /// The lock key of `lock_id` (for an extend).
    pub(crate) fn get(&self, lock_id: &LockId) -> Option<String> {
        self.lock()
            .keys
            .get(lock_id)
            .map(|entry| entry.lock_key.clone())
    }

    /// After an extend: the lock lives `ttl` longer, or (`None`) is gone.
    pub(crate) fn extended(&self, lock_id: &LockId, ttl: Option<Duration>) {
        let mut known = self.lock();
        match ttl {
            Some(ttl) => {
                if let Some(entry) = known.keys.get_mut(lock_id) {
                    entry.dead_after = dead_after(ttl);
                }
            }
            None => {
                known.keys.remove(lock_id);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_live_until_released_or_dead() {
        let known = KnownKeys::default();
        let id = LockId::generate();
        known.insert(id.clone(), "syncguard:a".into(), Duration::from_secs(30));
        assert_eq!(known.get(&id).as_deref(), Some("syncguard:a"));
        known.extended(&id, Some(Duration::from_secs(60)));
        assert_eq!(known.take(&id).as_deref(), Some("syncguard:a"));
        assert_eq!(known.take(&id), None);

        let gone = LockId::generate();
        known.insert(gone.clone(), "syncguard:b".into(), Duration::from_secs(30));
        known.extended(&gone, None);
        assert_eq!(known.get(&gone), None);
    }

    #[test]
    fn dead_entries_are_swept() {
        let known = KnownKeys::default();
        // Entries whose lock is long dead (a zero ttl still gets the tolerance, so backdate).
        for i in 0..FIRST_SWEEP {
            known.insert(LockId::generate(), format!("k{i}"), Duration::ZERO);
        }
        for entry in known.lock().keys.values_mut() {
            entry.dead_after = Instant::now() - Duration::from_secs(1);
        }
        let live = LockId::generate();
        known.insert(live.clone(), "live".into(), Duration::from_secs(30));
        assert_eq!(known.len(), 1, "the dead entries were swept");
        assert_eq!(known.get(&live).as_deref(), Some("live"));
    }
}
