//! The operations' contract: a lock's life from acquire to release, contention, expiry with
//! its tolerance, authoritative extends, ownership, sanitized lookups, declared capabilities.

use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use super::support::{acquired, assert_contended, unique_key};
use crate::backend::key::hash_key;
use crate::backend::time::{TIME_TOLERANCE_MS, now_ms};
use crate::backend::{ExtendOutcome, LockBackend, NotHeldReason, ReleaseOutcome};
use crate::inspect::{get_by_id, get_by_key, owns};
use crate::lock_id::LockId;

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

    let raw = get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(crate::backend::LockInfo::reveal)
        .unwrap();
    assert_eq!(raw.key, key);
    assert_eq!(raw.lock_id, lease.lock_id);
    assert_eq!(raw.info, info);
    let raw = get_by_id(&backend, &lease.lock_id)
        .await
        .unwrap()
        .map(crate::backend::LockInfo::reveal)
        .unwrap();
    assert_eq!(raw.key, key);

    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    assert!(
        get_by_key(&backend, &key)
            .await
            .unwrap()
            .map(crate::backend::LockInfo::reveal)
            .is_none()
    );
}

/// The backend declares fencing and names itself.
pub async fn capabilities_declare_fencing<B: LockBackend + Clone + 'static>(backend: B) {
    let capabilities = backend.capabilities();
    assert!(capabilities.supports_fencing);
    assert!(!capabilities.backend.is_empty());
}
