//! The backend conformance suite: the lock contract, checked against a live backend.
//!
//! Every built-in backend runs it (the in-memory one, and PostgreSQL, Redis and the Firestore
//! emulator against real servers); run it on your own [`LockBackend`] the same way. Each check
//! is an async function that panics on a violation; [`conformance_tests!`](crate::conformance_tests)
//! turns them all into `#[tokio::test]`s:
//!
//! ```
//! // tests/memory.rs (needs tokio with "macros" and "rt-multi-thread" as a dev-dependency);
//! // for your backend, build it in the async block instead.
//! syncguard::conformance_tests!(async { syncguard::MemoryBackend::new() });
//! # fn main() {}
//! ```
//!
//! Checks use random keys, so they can share one store and run concurrently. Some wait for
//! real expiry (the 1 s tolerance included), so the suite takes a few seconds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until, timeout};

mod entry_points;
mod faulty;
pub mod history;
mod holders;
mod lease_safety;
mod min_hold;
mod waiting;

pub use entry_points::{
    acquire_waits_only_when_asked, errors_name_the_lock, handle_agrees_with_the_guard,
    try_acquire_on_a_held_key_changes_nothing,
};

pub use faulty::FaultyBackend;
pub use holders::{
    a_lock_without_holder_is_not_reentered, bad_holders_change_nothing,
    extend_by_adds_to_the_expiry, holders_are_reentrant_and_exclusive,
};
pub use lease_safety::{
    a_manual_extend_waits_for_the_heartbeats, a_stalled_holder_learns_of_its_loss,
    huge_durations_never_overflow, work_that_outlived_its_lease_is_not_a_success,
};
pub use min_hold::{expire_at_sets_a_fixed_expiry, min_hold_keeps_a_released_lock};
pub use waiting::{
    a_cancelled_wait_leaves_nothing_behind, a_waiter_whose_turn_comes_waits_for_the_release,
    waiters_take_turns_in_arrival_order, waiters_wake_on_release, waiters_wake_when_the_lease_ends,
};

use crate::backend::{
    AcquireOutcome, ExtendOutcome, Lease, LockBackend, Lookup, NotHeldReason, ReleaseOutcome,
};
use crate::key::hash_key;
use crate::time::{TIME_TOLERANCE_MS, now_ms};
use crate::{
    ErrorCode, LockError, LockId, LockOptions, LostReason, OnLost, RetryPolicy, get_by_id,
    get_by_id_raw, get_by_key, get_by_key_raw, owns,
};

/// Generates one `#[tokio::test]` per conformance check, each on the backend that `$make`
/// (an expression evaluating to a future of the backend) creates.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            lifecycle, contention, expiry_honours_tolerance, extend_sets_authoritative_expiry,
            ownership_is_verified, fences_are_monotonic_per_key, fences_survive_expiry,
            lookups_are_sanitized, invalid_input_changes_nothing, keys_are_nfc_normalized,
            mutual_exclusion, heartbeat_keeps_short_ttl_lock, lock_removed_behind_back_is_lost,
            with_lock_cancels_work_on_loss, capabilities_declare_fencing,
            huge_durations_never_overflow, a_manual_extend_waits_for_the_heartbeats,
            a_stalled_holder_learns_of_its_loss, work_that_outlived_its_lease_is_not_a_success,
            try_acquire_on_a_held_key_changes_nothing, acquire_waits_only_when_asked,
            errors_name_the_lock, handle_agrees_with_the_guard,
            holders_are_reentrant_and_exclusive, a_lock_without_holder_is_not_reentered,
            extend_by_adds_to_the_expiry, bad_holders_change_nothing,
            waiters_wake_on_release, waiters_wake_when_the_lease_ends,
            waiters_take_turns_in_arrival_order, a_cancelled_wait_leaves_nothing_behind,
            a_waiter_whose_turn_comes_waits_for_the_release, min_hold_keeps_a_released_lock,
            expire_at_sets_a_fixed_expiry
        );
    };
    (@each $make:expr; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let backend = $make.await;
                $crate::conformance::$check(backend).await;
            }
        )*
    };
}

/// A key no other check (or earlier run) uses.
pub fn unique_key(label: &str) -> String {
    format!("conformance:{label}:{}", LockId::generate())
}

pub(crate) async fn acquired<B: LockBackend>(backend: &B, key: &str, ttl: Duration) -> Lease {
    match backend.acquire(key, ttl).await {
        Ok(outcome) => match outcome.lease() {
            Some(lease) => lease,
            None => panic!("expected to acquire {key:?}, it is contended"),
        },
        Err(error) => panic!("expected to acquire {key:?}, got {error}"),
    }
}

pub(crate) async fn assert_contended<B: LockBackend>(backend: &B, key: &str) {
    let outcome = backend
        .acquire(key, Duration::from_secs(10))
        .await
        .expect("acquire");
    assert!(
        outcome.is_contended(),
        "{key:?} should be held: {outcome:?}"
    );
}

pub(crate) fn assert_code<T: std::fmt::Debug>(
    result: Result<T, LockError>,
    code: ErrorCode,
    what: &str,
) {
    match result {
        Err(error) => assert_eq!(error.code(), code, "{what}: {error}"),
        Ok(value) => panic!("{what}: expected {code} error, got {value:?}"),
    }
}

/// Acquire, inspect, extend, release, and the lock is gone; a second release does nothing.
pub async fn lifecycle<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("lifecycle");
    let before = now_ms();
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert!(
        lease.expires_at_ms >= before + 29_000,
        "expiry should be about now + ttl: {lease:?}"
    );
    assert!(backend.is_locked(&key).await.unwrap());

    let by_key = get_by_key(&backend, &key)
        .await
        .unwrap()
        .expect("live lock");
    let by_id = get_by_id(&backend, &lease.lock_id)
        .await
        .unwrap()
        .expect("live lock");
    assert_eq!(by_key, by_id);
    assert_eq!(by_key.fence, lease.fence);
    assert_eq!(by_key.expires_at_ms, lease.expires_at_ms);
    assert!(by_key.acquired_at_ms <= by_key.expires_at_ms);
    assert!(owns(&backend, &lease.lock_id).await.unwrap());

    let extended = backend
        .extend(&lease.lock_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(extended, ExtendOutcome::Extended { .. }));

    assert_eq!(
        backend.release(&lease.lock_id).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(!backend.is_locked(&key).await.unwrap());
    assert!(get_by_key(&backend, &key).await.unwrap().is_none());
    assert!(get_by_id(&backend, &lease.lock_id).await.unwrap().is_none());
    assert!(!owns(&backend, &lease.lock_id).await.unwrap());

    let again = backend.release(&lease.lock_id).await.unwrap();
    assert!(!again.is_released(), "second release must fail: {again:?}");
    let extend_gone = backend
        .extend(&lease.lock_id, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        extend_gone.expires_at_ms().is_none(),
        "a released lock must not be extended"
    );
}

/// A held key refuses other acquirers until it is released; then it is free again.
pub async fn contention<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("contention");
    let other = unique_key("contention-other");
    let first = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert_contended(&backend, &key).await;
    // Other keys are unaffected.
    let unrelated = acquired(&backend, &other, Duration::from_secs(30)).await;
    assert_eq!(
        backend.release(&first.lock_id).await.unwrap(),
        ReleaseOutcome::Released
    );
    let second = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert!(second.fence > first.fence);
    assert_ne!(second.lock_id, first.lock_id);
    for lease in [second, unrelated] {
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
}

/// A lock stays live for the 1 s tolerance past its expiry, then frees up; an expired lock can
/// neither be extended (no resurrection) nor released.
pub async fn expiry_honours_tolerance<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("expiry");
    let ttl = Duration::from_millis(300);
    let start = Instant::now();
    let lease = acquired(&backend, &key, ttl).await;

    // Past the expiry but well inside the tolerance: still held.
    sleep_until(start + ttl + Duration::from_millis(300)).await;
    assert!(
        backend.is_locked(&key).await.unwrap(),
        "inside the tolerance"
    );
    assert_contended(&backend, &key).await;

    // Well past expiry + tolerance: free.
    sleep_until(start + ttl + Duration::from_millis(TIME_TOLERANCE_MS + 1_000)).await;
    assert!(!backend.is_locked(&key).await.unwrap(), "after expiry");
    assert!(get_by_key(&backend, &key).await.unwrap().is_none());
    assert!(get_by_id(&backend, &lease.lock_id).await.unwrap().is_none());

    let extended = backend
        .extend(&lease.lock_id, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        matches!(extended, ExtendOutcome::NotHeld(None | Some(_))),
        "expired lock was revived: {extended:?}"
    );
    assert!(!backend.is_locked(&key).await.unwrap(), "no resurrection");
    let released = backend.release(&lease.lock_id).await.unwrap();
    assert!(!released.is_released());

    let next = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert!(next.fence > lease.fence);
    assert!(backend.release(&next.lock_id).await.unwrap().is_released());
}

/// Extend sets the expiry to now + ttl (it does not add), returns it, and lookups agree.
pub async fn extend_sets_authoritative_expiry<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("extend");
    let lease = acquired(&backend, &key, Duration::from_secs(10)).await;

    let before = now_ms();
    let long = backend
        .extend(&lease.lock_id, Duration::from_secs(120))
        .await
        .unwrap()
        .expires_at_ms()
        .expect("extended");
    assert!(long >= lease.expires_at_ms + 100_000, "{long} vs {lease:?}");
    // Server-time backends may differ from the local clock by a little.
    assert!(long.abs_diff(before + 120_000) < 5_000, "now + ttl");
    let info = get_by_id(&backend, &lease.lock_id).await.unwrap().unwrap();
    assert_eq!(info.expires_at_ms, long, "lookup shows the returned expiry");

    let short = backend
        .extend(&lease.lock_id, Duration::from_secs(5))
        .await
        .unwrap()
        .expires_at_ms()
        .expect("extended");
    assert!(short < long, "extend replaces the remaining time");
    assert!(short.abs_diff(now_ms() + 5_000) < 5_000);
    let info = get_by_key(&backend, &key).await.unwrap().unwrap();
    assert_eq!(info.expires_at_ms, short);
    assert_eq!(info.fence, lease.fence, "extend keeps the fence");

    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// Another lock id can neither release nor extend a lock; a stale id cannot touch its
/// successor's lock.
pub async fn ownership_is_verified<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("ownership");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let forged = LockId::generate();
    let released = backend.release(&forged).await.unwrap();
    assert!(!released.is_released());
    if let ReleaseOutcome::NotHeld(Some(reason)) = released {
        assert_eq!(reason, NotHeldReason::NotFound);
    }
    let extended = backend
        .extend(&forged, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(extended.expires_at_ms().is_none());

    let info = get_by_key(&backend, &key).await.unwrap().unwrap();
    assert_eq!(info.lock_id_hash, hash_key(lease.lock_id.as_str()));
    assert_eq!(info.expires_at_ms, lease.expires_at_ms, "untouched");

    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let successor = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert!(!backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(
        backend
            .extend(&lease.lock_id, Duration::from_secs(60))
            .await
            .unwrap()
            .expires_at_ms()
            .is_none()
    );
    let info = get_by_key(&backend, &key).await.unwrap().unwrap();
    assert_eq!(info.lock_id_hash, hash_key(successor.lock_id.as_str()));
    assert!(
        backend
            .release(&successor.lock_id)
            .await
            .unwrap()
            .is_released()
    );
}

/// Fences are 15 digits, start at 1 for a new key, and increase by acquisition of *that* key
/// only.
pub async fn fences_are_monotonic_per_key<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("fence-a");
    let other = unique_key("fence-b");
    let mut previous = None;
    for round in 0..5 {
        let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
        let text = lease.fence.to_string();
        assert_eq!(text.len(), 15, "{text}");
        assert!(text.bytes().all(|b| b.is_ascii_digit()));
        match previous {
            None => assert_eq!(text, "000000000000001", "first fence of a new key"),
            Some(previous) => {
                assert!(lease.fence > previous);
                assert!(text > previous.to_string(), "text order = numeric order");
                assert_eq!(
                    lease.fence.get(),
                    previous.get() + 1,
                    "acquiring {other:?} must not advance {key:?}'s counter"
                );
            }
        }
        previous = Some(lease.fence);
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        // Interleave another key: it has its own counter.
        let interleaved = acquired(&backend, &other, Duration::from_secs(30)).await;
        assert_eq!(interleaved.fence.get(), round + 1);
        assert!(
            backend
                .release(&interleaved.lock_id)
                .await
                .unwrap()
                .is_released()
        );
    }
}

/// A lock that expired (rather than being released) does not reset its key's fence.
pub async fn fences_survive_expiry<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("fence-expiry");
    let first = acquired(&backend, &key, Duration::from_millis(100)).await;
    sleep(Duration::from_millis(100 + TIME_TOLERANCE_MS + 800)).await;
    let second = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert!(second.fence > first.fence);
    assert!(
        backend
            .release(&second.lock_id)
            .await
            .unwrap()
            .is_released()
    );
    let third = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert!(third.fence > second.fence);
    assert!(backend.release(&third.lock_id).await.unwrap().is_released());
}

/// Lookups return hashes, never raw identifiers; the raw helpers add them; missing locks give
/// `None`.
pub async fn lookups_are_sanitized<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("lookup");
    assert!(get_by_key(&backend, &key).await.unwrap().is_none());
    assert!(
        get_by_id(&backend, &LockId::generate())
            .await
            .unwrap()
            .is_none()
    );

    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let info = get_by_key(&backend, &key).await.unwrap().unwrap();
    assert_eq!(info.key_hash, hash_key(&key));
    assert_eq!(info.lock_id_hash, hash_key(lease.lock_id.as_str()));
    assert_eq!(info.key_hash.len(), 24);
    let printed = format!("{info:?}");
    assert!(!printed.contains(&key), "Debug leaks the key: {printed}");
    assert!(
        !printed.contains(lease.lock_id.as_str()),
        "Debug leaks the lock id"
    );

    let raw = get_by_key_raw(&backend, &key).await.unwrap().unwrap();
    assert_eq!(raw.key, key);
    assert_eq!(raw.lock_id, lease.lock_id);
    assert_eq!(raw.info, info);
    let raw = get_by_id_raw(&backend, &lease.lock_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(raw.key, key);

    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(get_by_key_raw(&backend, &key).await.unwrap().is_none());
}

/// Bad input gives `InvalidArgument` before any change: empty and 513-byte keys, malformed
/// lock ids, zero ttls. A 512-byte key is accepted.
pub async fn invalid_input_changes_nothing<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("invalid");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let before = get_by_key(&backend, &key).await.unwrap().unwrap();

    let too_long = "k".repeat(513);
    // NUL is refused by every backend alike (PostgreSQL cannot store it in text).
    for bad in ["", too_long.as_str(), "job:\0:1", "\0", "ключ\0"] {
        assert_code(
            backend.acquire(bad, Duration::from_secs(1)).await,
            ErrorCode::InvalidArgument,
            "acquire with a bad key",
        );
        assert_code(
            backend.is_locked(bad).await,
            ErrorCode::InvalidArgument,
            "is_locked with a bad key",
        );
        assert_code(
            backend.lookup(Lookup::Key(bad)).await,
            ErrorCode::InvalidArgument,
            "lookup with a bad key",
        );
    }
    assert_code(
        backend.acquire(&key, Duration::ZERO).await,
        ErrorCode::InvalidArgument,
        "acquire with a zero ttl",
    );
    assert_code(
        backend.extend(&lease.lock_id, Duration::ZERO).await,
        ErrorCode::InvalidArgument,
        "extend with a zero ttl",
    );
    for bad in [
        "",
        "short",
        "AAAAAAAAAAAAAAAAAAAAA=",
        "AAAAAAAAAAAAAAAAAAAAA+B",
    ] {
        assert_code(LockId::parse(bad), ErrorCode::InvalidArgument, "lock id");
    }
    let after = get_by_key(&backend, &key).await.unwrap().unwrap();
    assert_eq!(after, before, "bad input changed the lock");
    assert!(!backend.is_locked(&too_long[..512]).await.unwrap());

    let max_key = format!("{key}:{}", "m".repeat(512 - key.len() - 1));
    assert_eq!(max_key.len(), 512);
    let max_lease = acquired(&backend, &max_key, Duration::from_secs(30)).await;
    assert!(backend.is_locked(&max_key).await.unwrap());
    for lease in [max_lease, lease] {
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
}

/// Composed and decomposed spellings of a key name the same lock.
pub async fn keys_are_nfc_normalized<B: LockBackend + Clone + 'static>(backend: B) {
    let base = unique_key("nfc");
    let composed = format!("{base}:caf\u{e9}");
    let decomposed = format!("{base}:cafe\u{301}");
    let lease = acquired(&backend, &composed, Duration::from_secs(30)).await;
    assert!(backend.is_locked(&decomposed).await.unwrap());
    assert_contended(&backend, &decomposed).await;
    let raw = get_by_key_raw(&backend, &decomposed)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(raw.key, composed, "stored in NFC");
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// 64 tasks hammer one key for 3 s: never two holders at once, fences unique and increasing
/// in holding order, every release succeeds.
pub async fn mutual_exclusion<B: LockBackend + Clone + 'static>(backend: B) {
    mutual_exclusion_with(backend, 64, Duration::from_secs(3)).await;
}

/// [`mutual_exclusion`] with a chosen number of tasks and duration.
pub async fn mutual_exclusion_with<B: LockBackend + Clone + 'static>(
    backend: B,
    tasks: usize,
    duration: Duration,
) {
    let key = unique_key("exclusion");
    let history = Arc::new(history::History::new());
    let failed_releases = Arc::new(AtomicUsize::new(0));
    let end = Instant::now() + duration;
    let workers: Vec<_> = (0..tasks)
        .map(|worker| {
            let (backend, key) = (backend.clone(), key.clone());
            let (history, failed_releases) = (Arc::clone(&history), Arc::clone(&failed_releases));
            tokio::spawn(async move {
                while Instant::now() < end {
                    let outcome = backend.acquire(&key, Duration::from_secs(30)).await;
                    let Ok(AcquireOutcome::Acquired(lease)) = outcome else {
                        assert!(outcome.expect("acquire failed").is_contended());
                        sleep(Duration::from_millis(1)).await;
                        continue;
                    };
                    // Acts on the resource twice, well within the 30 s lease.
                    let acquired = Instant::now();
                    tokio::task::yield_now().await;
                    let actions = vec![acquired, Instant::now()];
                    if !backend.release(&lease.lock_id).await.unwrap().is_released() {
                        failed_releases.fetch_add(1, Ordering::SeqCst);
                    }
                    history.record(history::Hold {
                        holder: format!("task {worker}"),
                        fence: lease.fence,
                        acquired,
                        actions,
                        lost: None,
                    });
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker panicked");
    }

    let checked = history
        .check()
        .unwrap_or_else(|violations| panic!("{violations}"));
    assert!(
        checked.holds >= 10,
        "only {} acquisitions in {duration:?}",
        checked.holds
    );
    assert_eq!(failed_releases.load(Ordering::SeqCst), 0);
}

/// The guard's heartbeat keeps a 900 ms lock through 5 ttls while others are refused; without
/// it the same lock expires and is reported lost. (The ttl leaves each extend 600 ms, for slow
/// backends such as an emulator on a loaded machine.)
pub async fn heartbeat_keeps_short_ttl_lock<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("heartbeat");
    let ttl = Duration::from_millis(900);
    let options = LockOptions::builder().ttl(ttl).build().unwrap();
    let guard = crate::acquire(&backend, &key, &options).await.unwrap();
    let first_expiry = guard.expires_at_ms();
    let end = Instant::now() + ttl * 5;
    while Instant::now() < end {
        assert_contended(&backend, &key).await;
        assert!(!guard.is_lost(), "lost: {:?}", guard.lost_reason());
        sleep(Duration::from_millis(100)).await;
    }
    assert!(guard.expires_at_ms() > first_expiry + 2_500, "extended");
    assert!(guard.release().await.unwrap(), "still held at the end");

    let unkept_options = options.to_builder().heartbeat(false).build().unwrap();
    let unkept = crate::acquire(&backend, &key, &unkept_options)
        .await
        .unwrap();
    let reason = timeout(Duration::from_secs(10), unkept.lost())
        .await
        .expect("an unextended lock must be reported lost");
    assert_eq!(reason, LostReason::LeaseExpired);
    sleep(Duration::from_millis(TIME_TOLERANCE_MS + 500)).await;
    assert!(!backend.is_locked(&key).await.unwrap());
}

/// A lock released behind its holder's back (here by another client using its lock id) is
/// reported lost to the holder, by await, poll and token.
pub async fn lock_removed_behind_back_is_lost<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("removed");
    let options = LockOptions::builder()
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let guard = crate::acquire(&backend, &key, &options).await.unwrap();
    let token = guard.lost_token();
    assert!(!guard.is_lost());
    assert!(
        backend
            .release(guard.lock_id())
            .await
            .unwrap()
            .is_released()
    );
    let reason = timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("loss must be detected by the next heartbeat");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(guard.is_lost());
    assert!(token.is_cancelled());
    assert!(!guard.release().await.unwrap(), "nothing left to release");
}

/// [`with_lock`](crate::with_lock) drops the work and returns `LockLost` when the lock is
/// lost, and releases the lock when the work ends with an error.
pub async fn with_lock_cancels_work_on_loss<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("with-lock");
    let options = LockOptions::builder()
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let thief = backend.clone();
    let result = timeout(
        Duration::from_secs(20),
        crate::with_lock(&backend, &key, &options, async |guard| {
            assert!(thief.release(guard.lock_id()).await?.is_released());
            sleep(Duration::from_secs(3600)).await;
            Ok::<_, LockError>("finished")
        }),
    )
    .await
    .expect("the work should have been cancelled");
    let error = result.unwrap_err();
    assert!(error.is_lock_lost(), "{error}");

    let failing: Result<(), LockError> = crate::with_lock(&backend, &key, &options, async |_| {
        Err(LockError::internal("work failed"))
    })
    .await;
    assert_eq!(failing.unwrap_err().code(), ErrorCode::Internal);
    assert!(
        !backend.is_locked(&key).await.unwrap(),
        "released after an error"
    );

    // With `OnLost::Notify` the work runs on and sees the loss; its result is still not
    // reported as a success made under the lock.
    let seen = Arc::new(Mutex::new(None));
    let notify = options
        .to_builder()
        .on_lost(OnLost::Notify)
        .retry(RetryPolicy::single_attempt())
        .build()
        .unwrap();
    let notified = crate::with_lock(&backend, &key, &notify, async |guard| {
        assert!(thief.release(guard.lock_id()).await?.is_released());
        *seen.lock().unwrap() = Some(guard.lost().await);
        Ok::<_, LockError>("finished")
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), Some(LostReason::NotHeld));
    assert!(
        matches!(
            notified,
            Err(LockError::LockLost {
                reason: LostReason::NotHeld,
                ..
            })
        ),
        "{notified:?}"
    );
}

/// The backend declares fencing and names itself.
pub async fn capabilities_declare_fencing<B: LockBackend + Clone + 'static>(backend: B) {
    let capabilities = backend.capabilities();
    assert!(capabilities.supports_fencing);
    assert!(!capabilities.backend.is_empty());
}
