//! `min_hold` (ShedLock's `lockAtLeastFor`): a release before the minimum hold is over leaves
//! the lock to expire then; after it, a release frees the key at once.

use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::unique_key;
use crate::backend::LockBackend;
use crate::{LockOptions, RetryPolicy};

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
