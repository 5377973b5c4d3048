//! A guard on the backend: the heartbeat keeps a short lease, a lock removed behind its back
//! is lost, and `with_lock` cancels the work on loss.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::support::{assert_contended, unique_key};
use crate::backend::LockBackend;
use crate::backend::time::TIME_TOLERANCE_MS;
use crate::error::{ErrorCode, LockError, LostReason};
use crate::options::{LockOptions, OnLost};
use crate::retry::RetryPolicy;

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
    assert_eq!(reason, LostReason::TtlElapsed, "the heartbeat was off");
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
    assert_eq!(
        notified.as_ref().map_err(LockError::lost_reason).err(),
        Some(Some(LostReason::NotHeld)),
        "{notified:?}"
    );
}
