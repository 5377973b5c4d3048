//! Lock data past its expiry: why a release or extend finds no lock (the scripts' codes), and
//! the opt-in cleanup in `is_locked`, which removes only long-expired lock data.

use std::time::Duration;

use redis::AsyncCommands as _;
use syncguard::backend::{ExtendOutcome, LockBackend, NotHeldReason, ReleaseOutcome};
use syncguard::redis::{RedisBackend, RedisConfig};
use syncguard::{LockId, get_by_key};

use crate::{acquired, both_backends, manager_backend, raw, redis_url, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_held_reasons_follow_the_script_codes() {
    for backend in both_backends().await {
        let key = unique("reasons");
        let forged = LockId::generate();
        assert_eq!(
            backend.release(&forged).await.unwrap(),
            ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound))
        );
        assert_eq!(
            backend
                .extend(&forged, Duration::from_secs(1))
                .await
                .unwrap(),
            ExtendOutcome::NotHeld(Some(NotHeldReason::NotFound))
        );
        let lease = acquired(&backend, &key, Duration::from_millis(50)).await;
        // Live for the tolerance, then past it while Redis still keeps the key a little
        // longer is impossible (PX = ttl + tolerance); so make it visibly expired by hand.
        let mut conn = raw(&redis_url()).await;
        let lock_key = backend.lock_key(&key).unwrap();
        let json: String = conn.get(&lock_key).await.unwrap();
        let mut data: serde_json::Value = serde_json::from_str(&json).unwrap();
        data["expiresAtMs"] = serde_json::json!(data["expiresAtMs"].as_u64().unwrap() - 10_000);
        let _: () = conn.set_ex(&lock_key, data.to_string(), 30).await.unwrap();
        assert!(!backend.is_locked(&key).await.unwrap());
        assert!(get_by_key(&backend, &key).await.unwrap().is_none());
        assert_eq!(
            backend
                .extend(&lease.lock_id, Duration::from_secs(10))
                .await
                .unwrap(),
            ExtendOutcome::NotHeld(Some(NotHeldReason::Expired))
        );
        // The expired data was removed by the failed extend: nothing left to release.
        assert_eq!(
            backend.release(&lease.lock_id).await.unwrap(),
            ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound))
        );
        let lease = acquired(&backend, &key, Duration::from_secs(10)).await;
        let json: String = conn.get(&lock_key).await.unwrap();
        let mut data: serde_json::Value = serde_json::from_str(&json).unwrap();
        data["expiresAtMs"] = serde_json::json!(data["expiresAtMs"].as_u64().unwrap() - 20_000);
        let _: () = conn.set_ex(&lock_key, data.to_string(), 30).await.unwrap();
        assert_eq!(
            backend.release(&lease.lock_id).await.unwrap(),
            ReleaseOutcome::NotHeld(Some(NotHeldReason::Expired))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_in_is_locked_removes_only_long_expired_lock_data() {
    let url = redis_url();
    let mut conn = raw(&url).await;
    let reader = manager_backend().await;
    let cleaner =
        RedisBackend::connect_with(&url, RedisConfig::new().with_cleanup_in_is_locked(true))
            .await
            .unwrap();
    let key = unique("cleanup");
    let lease = acquired(&reader, &key, Duration::from_secs(30)).await;
    let lock_key = reader.lock_key(&key).unwrap();
    let index_key = reader.index_key(&lease.lock_id).unwrap();
    let fence_key = reader.fence_key(&key).unwrap();
    let json: String = conn.get(&lock_key).await.unwrap();
    let mut data: serde_json::Value = serde_json::from_str(&json).unwrap();
    let expires = data["expiresAtMs"].as_u64().unwrap();

    // Expired past the tolerance, but within the 2 s guard: no cleanup.
    data["expiresAtMs"] = serde_json::json!(expires - 30_000 - 1_500);
    let _: () = conn.set_ex(&lock_key, data.to_string(), 60).await.unwrap();
    assert!(!reader.is_locked(&key).await.unwrap());
    assert!(!cleaner.is_locked(&key).await.unwrap());
    let exists: bool = conn.exists(&lock_key).await.unwrap();
    assert!(exists, "within the guard, cleanup waits");

    // Past the guard: the default backend only reads; the cleaning one deletes lock data only.
    data["expiresAtMs"] = serde_json::json!(expires - 30_000 - 5_000);
    let _: () = conn.set_ex(&lock_key, data.to_string(), 60).await.unwrap();
    assert!(!reader.is_locked(&key).await.unwrap());
    let exists: bool = conn.exists(&lock_key).await.unwrap();
    assert!(exists, "cleanup is off by default");
    assert!(!cleaner.is_locked(&key).await.unwrap());
    let (lock_left, index_left, fence_left): (bool, bool, String) = redis::pipe()
        .exists(&lock_key)
        .exists(&index_key)
        .get(&fence_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!lock_left && !index_left, "lock data cleaned up");
    assert_eq!(fence_left, "1", "the fence counter is never touched");
}
