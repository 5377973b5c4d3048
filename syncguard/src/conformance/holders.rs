//! Holders ([`LockBackend::acquire_as`], [`LockBackend::extend_by`]): re-entrant by holder,
//! exclusive against everyone else, extended by an amount; refused, changing nothing, by a
//! backend that does not store them.

use std::time::Duration;

use tokio::time::sleep;

use super::support::{acquired, assert_code, unique_key};
use crate::backend::time::TIME_TOLERANCE_MS;
use crate::backend::{ExtendOutcome, Lease, LockBackend, MAX_HOLDER_BYTES};
use crate::error::ErrorCode;
use crate::inspect::get_by_key;

async fn acquired_as<B: LockBackend>(backend: &B, key: &str, ttl: Duration, holder: &str) -> Lease {
    match backend.acquire_as(key, ttl, holder).await {
        Ok(outcome) => outcome
            .lease()
            .unwrap_or_else(|| panic!("{holder:?} should take {key:?}, it is contended")),
        Err(error) => panic!("{holder:?} should take {key:?}, got {error}"),
    }
}

/// A holder re-takes its own live lock (same lock id and fence, a fresh lease), nobody else
/// takes it (another holder, or an acquire without holder), and after the release the next
/// holder gets the next fence. A backend without holders refuses both operations and changes
/// nothing.
pub async fn holders_are_reentrant_and_exclusive<B: LockBackend + Clone + 'static>(backend: B) {
    let key = unique_key("holders");
    if !backend.capabilities().holders {
        let ttl = Duration::from_secs(10);
        assert_code(
            backend.acquire_as(&key, ttl, "client-a").await,
            ErrorCode::InvalidArgument,
            "acquire_as on a backend without holders",
        );
        assert!(!backend.is_locked(&key).await.unwrap(), "nothing was taken");
        let lease = acquired(&backend, &key, ttl).await;
        assert_code(
            backend.extend_by(&lease.lock_id, ttl).await,
            ErrorCode::InvalidArgument,
            "extend_by on a backend without holders",
        );
        let info = get_by_key(&backend, &key)
            .await
            .unwrap()
            .expect("still held");
        assert_eq!(info.expires_at_ms, lease.expires_at_ms, "expiry unchanged");
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        return;
    }

    let first = acquired_as(&backend, &key, Duration::from_secs(5), "client-a").await;
    let raw = get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(crate::backend::LockInfo::reveal)
        .expect("held");
    assert_eq!(raw.holder.as_deref(), Some("client-a"));
    assert_eq!(raw.lock_id, first.lock_id);
    assert!(
        !format!("{:?}", raw.info).contains("client-a"),
        "the sanitized view never shows the holder"
    );

    sleep(Duration::from_millis(20)).await;
    let again = acquired_as(&backend, &key, Duration::from_secs(60), "client-a").await;
    assert_eq!(again.lock_id, first.lock_id, "re-entered, not a new lock");
    assert_eq!(again.fence, first.fence, "re-entry keeps the fence");
    assert!(
        again.expires_at_ms >= first.expires_at_ms + 50_000,
        "a fresh lease of the new ttl: {} then {}",
        first.expires_at_ms,
        again.expires_at_ms
    );
    let info = get_by_key(&backend, &key).await.unwrap().expect("held");
    assert_eq!(info.expires_at_ms, again.expires_at_ms);
    assert!(
        info.acquired_at_ms + 60_000 >= again.expires_at_ms,
        "the acquisition time restarts with the lease: acquired {}, expires {}",
        info.acquired_at_ms,
        again.expires_at_ms
    );

    for other in ["client-b", "client-a ", "Client-a"] {
        let refused = backend
            .acquire_as(&key, Duration::from_secs(5), other)
            .await
            .expect("acquire_as");
        assert!(refused.is_contended(), "{other:?} is another holder");
    }
    assert!(
        backend
            .acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .is_contended()
    );
    let unchanged = get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(crate::backend::LockInfo::reveal)
        .expect("held");
    assert_eq!(unchanged.lock_id, first.lock_id);
    assert_eq!(unchanged.holder.as_deref(), Some("client-a"));

    assert!(backend.release(&first.lock_id).await.unwrap().is_released());
    let next = acquired_as(&backend, &key, Duration::from_secs(5), "client-b").await;
    assert_ne!(next.lock_id, first.lock_id);
    assert!(
        next.fence > first.fence,
        "the next holder gets the next fence"
    );
    assert!(backend.release(&next.lock_id).await.unwrap().is_released());
}

/// A lock taken without a holder is never re-entered by one, and shows no holder.
pub async fn a_lock_without_holder_is_not_reentered<B: LockBackend + Clone + 'static>(backend: B) {
    if !backend.capabilities().holders {
        return; // `holders_are_reentrant_and_exclusive` checks the refusal.
    }
    let key = unique_key("holderless");
    let lease = acquired(&backend, &key, Duration::from_secs(10)).await;
    let raw = get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(crate::backend::LockInfo::reveal)
        .expect("held");
    assert_eq!(raw.holder, None);
    let refused = backend
        .acquire_as(&key, Duration::from_secs(10), "anyone")
        .await
        .unwrap();
    assert!(refused.is_contended());
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// `extend_by` adds to the current expiry (not to now), on locks taken with or without a
/// holder, and never revives an expired or released lock.
pub async fn extend_by_adds_to_the_expiry<B: LockBackend + Clone + 'static>(backend: B) {
    if !backend.capabilities().holders {
        return; // `holders_are_reentrant_and_exclusive` checks the refusal.
    }
    let key = unique_key("extend-by");
    let lease = acquired_as(&backend, &key, Duration::from_secs(30), "client-a").await;
    let extended = backend
        .extend_by(&lease.lock_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        extended.expires_at_ms(),
        Some(lease.expires_at_ms + 60_000),
        "added to the expiry"
    );
    let info = get_by_key(&backend, &key).await.unwrap().expect("held");
    assert_eq!(info.expires_at_ms, lease.expires_at_ms + 60_000);
    assert_eq!(info.fence, lease.fence);
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let gone = backend
        .extend_by(&lease.lock_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        matches!(gone, ExtendOutcome::NotHeld(_)),
        "released: {gone:?}"
    );
    assert!(!backend.is_locked(&key).await.unwrap());

    // Without a holder, and once expired (past the tolerance): not revived.
    let plain_key = unique_key("extend-by-plain");
    let plain = acquired(&backend, &plain_key, Duration::from_secs(30)).await;
    let extended = backend
        .extend_by(&plain.lock_id, Duration::from_millis(1_500))
        .await
        .unwrap();
    assert_eq!(extended.expires_at_ms(), Some(plain.expires_at_ms + 1_500));
    assert!(backend.release(&plain.lock_id).await.unwrap().is_released());

    let short_key = unique_key("extend-by-expired");
    let short = acquired(&backend, &short_key, Duration::from_millis(50)).await;
    sleep(Duration::from_millis(50 + TIME_TOLERANCE_MS + 300)).await;
    let late = backend
        .extend_by(&short.lock_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        matches!(late, ExtendOutcome::NotHeld(_)),
        "expired: {late:?}"
    );
    assert!(!backend.is_locked(&short_key).await.unwrap(), "not revived");
}

/// Bad holders and amounts are refused before anything changes.
pub async fn bad_holders_change_nothing<B: LockBackend + Clone + 'static>(backend: B) {
    if !backend.capabilities().holders {
        return; // `holders_are_reentrant_and_exclusive` checks the refusal.
    }
    let key = unique_key("bad-holder");
    let too_long = "h".repeat(MAX_HOLDER_BYTES + 1);
    for holder in ["", "a\0b", too_long.as_str()] {
        assert_code(
            backend
                .acquire_as(&key, Duration::from_secs(10), holder)
                .await,
            ErrorCode::InvalidArgument,
            &format!("holder of {} bytes", holder.len()),
        );
        assert!(!backend.is_locked(&key).await.unwrap(), "nothing was taken");
    }
    let longest = "h".repeat(MAX_HOLDER_BYTES);
    let lease = acquired_as(&backend, &key, Duration::from_secs(10), &longest).await;
    let raw = get_by_key(&backend, &key)
        .await
        .unwrap()
        .map(crate::backend::LockInfo::reveal)
        .expect("held");
    assert_eq!(raw.holder.as_deref(), Some(longest.as_str()), "kept whole");
    for by in [Duration::ZERO, Duration::MAX] {
        assert_code(
            backend.extend_by(&lease.lock_id, by).await,
            ErrorCode::InvalidArgument,
            &format!("extend_by {by:?}"),
        );
    }
    let info = get_by_key(&backend, &key).await.unwrap().expect("held");
    assert_eq!(info.expires_at_ms, lease.expires_at_ms, "expiry unchanged");
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}
