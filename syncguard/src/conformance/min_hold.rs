//! `min_hold` (ShedLock's `lockAtLeastFor`): a release before the minimum hold is over leaves
//! the lock to expire then; after it, a release frees the key at once.

use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::support::{acquired, assert_code, unique_key};
use crate::backend::LockBackend;
use crate::backend::time::now_ms;
use crate::error::ErrorCode;
use crate::inspect::get_by_key;
use crate::options::LockOptions;
use crate::retry::RetryPolicy;

/// An early release keeps the key held until the minimum hold is over (and reports a
/// release, not a loss); a late one frees it at once.
pub async fn min_hold_keeps_a_released_lock<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("min-hold");
    let min_hold = Duration::from_secs(2);
    let options = LockOptions::builder()
        .min_hold(min_hold)
        .retry(RetryPolicy::single_attempt())
        .build()
        .unwrap();
    let guard = crate::acquire(&backend, &key, &options).await.unwrap();
    let fence = guard.fence();
    let taken = Instant::now();
    assert!(
        guard.release().await.unwrap(),
        "a release within min_hold reports a release"
    );
    assert!(
        backend.is_locked(&key).await.unwrap(),
        "the key stays held until min_hold is over"
    );
    let plain = LockOptions::builder()
        .retry(RetryPolicy::single_attempt())
        .build()
        .unwrap();
    assert!(
        crate::try_acquire(&backend, &key, &plain)
            .await
            .unwrap()
            .is_none()
    );
    // Free once min_hold (and the 1 s tolerance) is over, with nobody releasing it.
    let waiting = plain
        .to_builder()
        .retry(RetryPolicy::wait_for(Duration::from_secs(20)))
        .build()
        .unwrap();
    let next = timeout(
        Duration::from_secs(20),
        crate::acquire(&backend, &key, &waiting),
    )
    .await
    .expect("the lock lapses after min_hold")
    .unwrap();
    assert!(
        taken.elapsed() >= min_hold - Duration::from_millis(100),
        "not before min_hold: {:?}",
        taken.elapsed()
    );
    assert!(next.fence() > fence);
    next.release().await.unwrap();

    // Held past its min_hold, a lock is released at once.
    let short = options
        .to_builder()
        .min_hold(Duration::from_millis(200))
        .build()
        .unwrap();
    let guard = crate::acquire(&backend, &key, &short).await.unwrap();
    sleep(Duration::from_millis(400)).await;
    assert!(guard.release().await.unwrap());
    assert!(!backend.is_locked(&key).await.unwrap());
}

/// `expire_at` sets the live lock's expiry to the time it names, later or earlier; a time
/// already past leaves the lock expired (the key free); it never revives an expired or
/// released lock, and refuses an expiry beyond the longest ttl, changing nothing.
pub async fn expire_at_sets_a_fixed_expiry<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("expire-at");
    let ttl = Duration::from_secs(30);
    let lease = acquired(&backend, &key, ttl).await;
    // The store's clock when it took the lock, whatever this process's clock says.
    let taken_ms = lease.expires_at_ms - 30_000;
    for at in [taken_ms + 60_000, taken_ms + 5_000] {
        let outcome = backend.expire_at(&lease.lock_id, at).await.unwrap();
        assert_eq!(outcome.expires_at_ms(), Some(at), "expire_at({at})");
        let info = get_by_key(&backend, &key).await.unwrap().expect("live");
        assert_eq!(info.expires_at_ms, at, "the stored expiry is the one set");
    }

    let far = now_ms() + 400 * 24 * 3_600_000;
    assert_code(
        backend.expire_at(&lease.lock_id, far).await,
        ErrorCode::InvalidArgument,
        "an expiry past the longest ttl",
    );
    let info = get_by_key(&backend, &key).await.unwrap().expect("live");
    assert_eq!(
        info.expires_at_ms,
        taken_ms + 5_000,
        "the refusal changed nothing"
    );

    // A time already past (tolerance included): the lock is over, the key free at once.
    let past = taken_ms.saturating_sub(10_000);
    let outcome = backend.expire_at(&lease.lock_id, past).await.unwrap();
    assert_eq!(outcome.expires_at_ms(), Some(past));
    assert!(!backend.is_locked(&key).await.unwrap());
    let next = acquired(&backend, &key, ttl).await;
    assert!(next.fence > lease.fence);
    let revived = backend
        .expire_at(&lease.lock_id, taken_ms + 60_000)
        .await
        .unwrap();
    assert!(
        revived.expires_at_ms().is_none(),
        "an expired lock is never revived: {revived:?}"
    );
    assert!(backend.release(&next.lock_id).await.unwrap().is_released());
    let released = backend
        .expire_at(&next.lock_id, taken_ms + 60_000)
        .await
        .unwrap();
    assert!(
        released.expires_at_ms().is_none(),
        "a released lock is never revived: {released:?}"
    );
    assert!(!backend.is_locked(&key).await.unwrap());
}
