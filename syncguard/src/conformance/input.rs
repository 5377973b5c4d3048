//! Input: invalid arguments refused before anything changes, keys NFC-normalized.

use std::time::Duration;

use super::support::{acquired, assert_code, assert_contended, unique_key};
use crate::backend::{LockBackend, Lookup};
use crate::error::ErrorCode;
use crate::inspect::get_by_key;
use crate::lock_id::LockId;

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
    let raw = get_by_key(&backend, &decomposed)
        .await
        .unwrap()
        .map(crate::backend::LockInfo::reveal)
        .unwrap();
    assert_eq!(raw.key, composed, "stored in NFC");
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}
