//! Keeping the in-process backend's memory bounded: expired locks are dropped, and the fence
//! counters of released keys forgotten, each at amortized O(1) per acquire.

use super::entries::{find_lock, take_lock};
use super::store::State;

/// How many fence counters (slots of `keys`) are kept beyond those of held keys; see
/// [`MemoryBackend`](super::MemoryBackend). Small, so that the table stays in cache: each
/// acquire of a fresh key touches a random slot, and under an HTTP server's load a table of
/// 256 counters already missed the cache there (the hottest instruction of acquire in a CPU
/// profile; a third as much time with 32).
pub(super) const KEPT_FENCES: usize = 32;

impl State {
    /// Forgets the fence counters of released keys once the table holds [`KEPT_FENCES`]
    /// counters and twice the held keys at least.
    #[inline]
    pub(super) fn forget_fences_if_due(&mut self) {
        if self.keys.len() >= KEPT_FENCES.max(2 * self.ids.len()) {
            self.forget_fences();
        }
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
    #[inline]
    pub(super) fn sweep_if_due(&mut self, now: u64) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{AcquireOutcome, Lease};
    use crate::error::LockError;

    fn lease(outcome: Result<AcquireOutcome, LockError>) -> Lease {
        outcome.unwrap().lease().expect("acquired")
    }

    #[test]
    fn fence_memory_is_bounded_and_fences_still_only_grow() {
        let mut state = State::default();
        let now = 1_000_000;
        let take = |state: &mut State, key: &str| lease(state.acquire_free(key, 60_000, now));
        // Released after two rounds, then its counter is forgotten among many fresh keys.
        for round in 1..=2 {
            let job = take(&mut state, "job");
            assert_eq!(job.fence.get(), round);
            assert!(state.release(&job.lock_id, now).0.is_released());
        }
        // Held throughout: its counter is never forgotten.
        let held = take(&mut state, "held");
        for i in 0..3 * KEPT_FENCES {
            let fresh = take(&mut state, &format!("idempotency:{i}"));
            assert!(state.release(&fresh.lock_id, now).0.is_released());
            assert!(state.keys.len() <= KEPT_FENCES, "{}", state.keys.len());
        }
        assert!(state.forgotten >= 2, "counters were forgotten");
        // A forgotten key goes on above everything it had.
        let job = take(&mut state, "job");
        assert!(job.fence.get() > 2, "{}", job.fence.get());
        assert!(state.release(&job.lock_id, now).0.is_released());
        let again = take(&mut state, "job");
        assert_eq!(again.fence.get(), job.fence.get() + 1, "remembered again");
        assert!(state.release(&again.lock_id, now).0.is_released());
        // The held key kept its own counter, and so its place in the sequence.
        assert!(state.release(&held.lock_id, now).0.is_released());
        assert_eq!(take(&mut state, "held").fence.get(), held.fence.get() + 1);
        // A key never seen before starts above every forgotten counter.
        assert!(take(&mut state, "new").fence.get() > state.forgotten);
    }

    #[test]
    fn held_keys_keep_their_counters_however_many_there_are() {
        let mut state = State::default();
        let now = 1_000_000;
        let held: Vec<_> = (0..2 * KEPT_FENCES)
            .map(|i| lease(state.acquire_free(&format!("held:{i}"), 60_000, now)))
            .collect();
        assert!(held.iter().all(|lease| lease.fence.get() == 1));
        for (i, first) in held.iter().enumerate() {
            assert!(state.release(&first.lock_id, now).0.is_released());
            let next = lease(state.acquire_free(&format!("held:{i}"), 60_000, now));
            assert_eq!(next.fence.get(), 2, "held:{i}");
        }
        assert_eq!(state.keys.len(), 2 * KEPT_FENCES);
    }

    #[test]
    fn abandoned_locks_are_swept_while_live_locks_stay() {
        let mut state = State::default();
        let start = 1_000_000;
        let live: Vec<_> = (0..10)
            .map(|i| lease(state.acquire_free(&format!("live:{i}"), 3_600_000, start)))
            .collect();
        // 200,000 locks abandoned by their holders, each expired soon after.
        let mut most_stored = 0;
        for i in 0..200_000 {
            let now = start + i;
            lease(state.acquire_free(&format!("abandoned:{i}"), 1, now));
            most_stored = most_stored.max(state.stored_locks());
        }
        assert!(
            most_stored <= 2 * (10 + 1024) + 1,
            "{most_stored} locks stored"
        );
        for lease in &live {
            assert!(
                state
                    .extend(&lease.lock_id, start + 200_000, |_| start
                        + 200_000
                        + 60_000)
                    .expires_at_ms()
                    .is_some()
            );
        }
    }

    #[test]
    fn the_sweep_drops_expired_locks_and_keeps_live_locks_and_fences_growing() {
        let mut state = State::default();
        let now = 1_000_000;
        let live = lease(state.acquire_free("live", 60_000, now));
        // Abandoned by their holders: never released.
        for i in 0..1100 {
            lease(state.acquire_free(&format!("abandoned:{i}"), 10, now));
        }
        assert_eq!(state.ids.len(), 1101);
        // Past expiry and tolerance, as many acquisitions as locks are held bring a sweep.
        let later = now + 5_000;
        for i in 0..1100 {
            let fresh = lease(state.acquire_free(&format!("fresh:{i}"), 60_000, later));
            assert!(state.release(&fresh.lock_id, later).0.is_released());
        }
        assert_eq!(state.ids.len(), 1, "only the live lock is left");
        assert_eq!(state.stored_locks(), 1);
        assert!(
            state
                .extend(&live.lock_id, later, |_| later + 60_000)
                .expires_at_ms()
                .is_some()
        );
        assert!(
            state
                .acquire_free("live", 60_000, later)
                .unwrap()
                .is_contended()
        );
        // Its counter may have been forgotten with the lock; its fences still only grow.
        let again = lease(state.acquire_free("abandoned:0", 10, later));
        assert!(again.fence.get() >= 2, "{}", again.fence.get());
    }
}
