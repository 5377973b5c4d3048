//! Fencing tokens: increasing per key, across expiry.

use std::time::Duration;

use tokio::time::sleep;

use super::support::{acquired, unique_key};
use crate::backend::LockBackend;
use crate::backend::time::TIME_TOLERANCE_MS;

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
