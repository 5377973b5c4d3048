//! Keys on which a plain acquire was refused lately, so that the next acquire of such a key
//! goes straight to the acquire function.
//!
//! A plain acquire first tries the statement for a key without a row (`statements.rs`), which
//! takes a free key for far less server work than the function; on a key whose lock is held
//! it takes nothing, and the function must run after it: two round trips. Waiters polling a
//! held key, and callers that skip work another process is doing, try the same held key again
//! and again; for a while after a refusal their acquires skip the first statement. Which
//! statement runs first never changes the outcome, only its cost.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a refusal sends the key's acquires straight to the function.
const REMEMBERED_FOR: Duration = Duration::from_secs(1);
/// At most this many keys are remembered; beyond it, the oldest are forgotten.
const MOST_KEYS: usize = 1024;

#[derive(Default)]
pub(super) struct RecentlyRefused {
    /// Storage key → when an acquire of it was last refused.
    keys: Mutex<HashMap<String, Instant>>,
}

impl RecentlyRefused {
    /// Whether an acquire of `storage_key` was refused within the last [`REMEMBERED_FOR`].
    pub(super) fn contains(&self, storage_key: &str) -> bool {
        let keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        keys.get(storage_key)
            .is_some_and(|refused| refused.elapsed() < REMEMBERED_FOR)
    }

    /// An acquire of `storage_key` was refused now.
    pub(super) fn refused(&self, storage_key: &str) {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if keys.len() >= MOST_KEYS && !keys.contains_key(storage_key) {
            keys.retain(|_, refused| refused.elapsed() < REMEMBERED_FOR);
            if keys.len() >= MOST_KEYS {
                // All fresh: a refusal storm over many keys; forgetting them costs each at
                // most one more round trip.
                keys.clear();
            }
        }
        keys.insert(storage_key.to_owned(), Instant::now());
    }

    /// An acquire of `storage_key` took the lock: its next acquire likely finds it free.
    pub(super) fn taken(&self, storage_key: &str) {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !keys.is_empty() {
            keys.remove(storage_key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_key_is_remembered_until_taken() {
        let refused = RecentlyRefused::default();
        assert!(!refused.contains("a"));
        refused.refused("a");
        assert!(refused.contains("a"));
        assert!(!refused.contains("b"));
        refused.taken("a");
        assert!(!refused.contains("a"));
    }

    #[test]
    fn at_most_the_bound_of_keys_is_kept() {
        let refused = RecentlyRefused::default();
        for n in 0..MOST_KEYS * 3 {
            refused.refused(&format!("key {n}"));
        }
        let kept = refused.keys.lock().unwrap().len();
        assert!(kept <= MOST_KEYS, "{kept} keys kept");
        assert!(refused.contains(&format!("key {}", MOST_KEYS * 3 - 1)));
    }
}
