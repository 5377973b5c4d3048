//! Where and how the backend stores a lock, checked against what the reference writes: the
//! three keys and their names, the JSON byte for byte (after acquire and after extend), the
//! TTLs, fences that count acquisitions only, the reverse index that lets any process
//! release or extend by lock id, and the mark a refusal adds for the release to publish.

use std::time::Duration;

use redis::AsyncCommands as _;
use redis::aio::MultiplexedConnection;
use syncguard::backend::key::{make_fence_key, make_storage_key};
use syncguard::backend::{
    AcquireOutcome, ExtendOutcome, LockBackend, NotHeldReason, ReleaseOutcome,
};
use syncguard::redis::{RedisBackend, RedisConfig};

use crate::{acquired, both_backends, manager_backend, raw, redis_url, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_is_byte_compatible_with_the_reference() {
    let url = redis_url();
    let mut conn = raw(&url).await;
    for backend in both_backends().await {
        // A slash (cjson escapes it), non-ASCII text and a decomposed accent (stored in NFC).
        let key = format!("{}:caf\u{65}\u{301}/€", unique("layout"));
        let nfc = syncguard::backend::key::normalize_key(&key)
            .unwrap()
            .into_owned();
        let lease = acquired(&backend, &key, Duration::from_secs(30)).await;

        let lock_key = make_storage_key("syncguard", &nfc, 1000, 26).unwrap();
        let index_key = make_storage_key(
            "syncguard",
            &format!("id:{}", lease.lock_id.as_str()),
            1000,
            26,
        )
        .unwrap();
        let fence_key = make_fence_key("syncguard", &lock_key, 1000, 26).unwrap();
        assert_eq!(lock_key, format!("syncguard:{nfc}"));
        assert_eq!(index_key, format!("syncguard:id:{}", lease.lock_id));
        assert_eq!(fence_key, format!("syncguard:fence:syncguard:{nfc}"));
        assert_eq!(backend.lock_key(&key).unwrap(), lock_key);
        assert_eq!(backend.fence_key(&key).unwrap(), fence_key);
        assert_eq!(backend.index_key(&lease.lock_id).unwrap(), index_key);

        let json: Vec<u8> = conn.get(&lock_key).await.unwrap();
        let index: String = conn.get(&index_key).await.unwrap();
        let counter: String = conn.get(&fence_key).await.unwrap();
        assert_eq!(index, lock_key, "the index holds the full lock key");
        assert_eq!(counter, "1", "a plain INCR counter");
        assert_eq!(lease.fence.to_string(), "000000000000001");

        let data: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let object = data.as_object().unwrap();
        assert_eq!(object.len(), 5, "{data}");
        assert_eq!(object["lockId"], lease.lock_id.as_str());
        assert_eq!(object["expiresAtMs"], lease.expires_at_ms);
        assert_eq!(object["key"], nfc.as_str());
        assert_eq!(object["fence"], "000000000000001");
        let acquired_at = object["acquiredAtMs"].as_u64().unwrap();
        assert_eq!(lease.expires_at_ms - acquired_at, 30_000);

        // Byte for byte: what the reference's acquire script encodes for the same values
        // (same table constructor order, same cjson), computed by the server itself.
        let reference: Vec<u8> = crate::eval(
            "return cjson.encode({lockId=ARGV[1], expiresAtMs=tonumber(ARGV[2]), \
             acquiredAtMs=tonumber(ARGV[3]), key=ARGV[4], fence=ARGV[5]})",
            &[],
        )
        .arg(lease.lock_id.as_str())
        .arg(lease.expires_at_ms)
        .arg(acquired_at)
        .arg(&nfc)
        .arg(lease.fence.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&json),
            String::from_utf8_lossy(&reference)
        );
        assert!(
            String::from_utf8_lossy(&json).contains("\\/"),
            "cjson escapes '/'"
        );

        // Nothing else was written for this key.
        let pattern = format!("*{}*", &nfc[..nfc.find(":caf").unwrap()]);
        let mut written: Vec<String> = conn.keys(&pattern).await.unwrap();
        written.sort();
        let mut expected = vec![lock_key.clone(), fence_key.clone()];
        expected.sort();
        assert_eq!(written, expected);

        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        let gone: Option<String> = conn.get(&lock_key).await.unwrap();
        let index_gone: Option<String> = conn.get(&index_key).await.unwrap();
        assert!(gone.is_none() && index_gone.is_none());
        let counter: String = conn.get(&fence_key).await.unwrap();
        assert_eq!(counter, "1", "release leaves the fence counter");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_keys_share_the_ttl_and_fences_have_none() {
    let mut conn = raw(&redis_url()).await;
    for backend in both_backends().await {
        let key = unique("ttl");
        let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
        let lock_key = backend.lock_key(&key).unwrap();
        let index_key = backend.index_key(&lease.lock_id).unwrap();
        let fence_key = backend.fence_key(&key).unwrap();

        let check = async |conn: &mut MultiplexedConnection, ttl_ms: i64| {
            let (lock_ttl, index_ttl, fence_ttl): (i64, i64, i64) = redis::pipe()
                .pttl(&lock_key)
                .pttl(&index_key)
                .pttl(&fence_key)
                .query_async(conn)
                .await
                .unwrap();
            // ttl + the 1 s tolerance, minus the time since the write.
            let full = ttl_ms + 1000;
            assert!(
                lock_ttl <= full && lock_ttl > full - 2000,
                "{lock_ttl} vs {full}"
            );
            assert!(
                lock_ttl.abs_diff(index_ttl) <= 5,
                "lock {lock_ttl} index {index_ttl}"
            );
            assert_eq!(fence_ttl, -1, "fence keys never expire");
        };
        check(&mut conn, 30_000).await;
        let extended = backend
            .extend(&lease.lock_id, Duration::from_secs(90))
            .await
            .unwrap();
        assert!(extended.expires_at_ms().is_some());
        check(&mut conn, 90_000).await;
        let extended = backend
            .extend(&lease.lock_id, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(extended.expires_at_ms().is_some());
        check(&mut conn, 5_000).await;
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        let fence_ttl: i64 = conn.pttl(&fence_key).await.unwrap();
        assert_eq!(fence_ttl, -1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_the_json_layout() {
    let mut conn = raw(&redis_url()).await;
    let backend = manager_backend().await;
    let key = unique("extend-json");
    let lease = acquired(&backend, &key, Duration::from_secs(10)).await;
    let expires = backend
        .extend(&lease.lock_id, Duration::from_secs(20))
        .await
        .unwrap()
        .expires_at_ms()
        .unwrap();
    let json: String = conn.get(backend.lock_key(&key).unwrap()).await.unwrap();
    let data: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(data["expiresAtMs"], expires);
    assert_eq!(data["lockId"], lease.lock_id.as_str());
    assert_eq!(data["fence"], lease.fence.to_string());
    assert_eq!(data["key"], key.as_str());
    assert_eq!(
        data["acquiredAtMs"].as_u64().unwrap() + 10_000,
        lease.expires_at_ms
    );
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// A lock id this backend did not hand out (another process took the lock) goes through the
/// reverse index, as in the reference; the owner's shortcut and the index agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_taken_elsewhere_are_released_and_extended_by_lock_id() {
    let [taker, other] = both_backends().await;
    let key = unique("elsewhere");
    let lease = acquired(&taker, &key, Duration::from_secs(30)).await;
    let extended = other
        .extend(&lease.lock_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(extended.expires_at_ms().is_some());
    assert!(other.release(&lease.lock_id).await.unwrap().is_released());
    assert!(!taker.is_locked(&key).await.unwrap());
    // The taker's own shortcut now finds the lock gone, and says so.
    assert_eq!(
        taker.release(&lease.lock_id).await.unwrap(),
        ReleaseOutcome::NotHeld(Some(NotHeldReason::NotFound))
    );
    let again = acquired(&taker, &key, Duration::from_secs(30)).await;
    assert_eq!(
        taker
            .extend(&lease.lock_id, Duration::from_secs(30))
            .await
            .unwrap(),
        ExtendOutcome::NotHeld(Some(NotHeldReason::NotFound)),
        "a stale lock id cannot extend the key's new lock"
    );
    assert!(taker.release(&again.lock_id).await.unwrap().is_released());
}

/// Fences count acquisitions, as in the reference: contended attempts do not use one up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_attempts_use_no_fence() {
    let backend = manager_backend().await;
    let key = unique("gaps");
    let first = acquired(&backend, &key, Duration::from_secs(30)).await;
    for _ in 0..3 {
        assert!(matches!(
            backend.acquire(&key, Duration::from_secs(30)).await,
            Ok(AcquireOutcome::Contended(_))
        ));
    }
    assert!(backend.release(&first.lock_id).await.unwrap().is_released());
    let second = acquired(&backend, &key, Duration::from_secs(30)).await;
    assert_eq!(first.fence.to_string(), "000000000000001");
    assert_eq!(second.fence.to_string(), "000000000000002");
    assert!(
        backend
            .release(&second.lock_id)
            .await
            .unwrap()
            .is_released()
    );
}

/// A refused acquire marks the live lock for its release to publish: the reference's bytes
/// plus a last field `"contended":true`, written once per hold, the key's TTL kept; an extend
/// and a re-entry keep it; a backend without release notifications does not mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_marks_the_lock_once_and_the_mark_stays_with_the_hold() {
    let mut conn = raw(&redis_url()).await;
    let backend = manager_backend().await;
    let ttl = Duration::from_secs(30);
    let key = unique("marked");
    let lock_key = backend.lock_key(&key).unwrap();
    let lease = acquired(&backend, &key, ttl).await;
    let unmarked: String = conn.get(&lock_key).await.unwrap();
    let ttl_before: i64 = conn.pttl(&lock_key).await.unwrap();

    for _ in 0..2 {
        assert!(backend.acquire(&key, ttl).await.unwrap().is_contended());
        let json: String = conn.get(&lock_key).await.unwrap();
        let expected = format!(
            "{},\"contended\":true}}",
            unmarked.strip_suffix('}').unwrap()
        );
        assert_eq!(json, expected, "marked once, the rest byte for byte");
    }
    let ttl_after: i64 = conn.pttl(&lock_key).await.unwrap();
    assert!(
        ttl_after > 0 && ttl_after <= ttl_before,
        "the TTL is kept: {ttl_before} then {ttl_after}"
    );
    let extended = backend.extend(&lease.lock_id, ttl).await.unwrap();
    let json: String = conn.get(&lock_key).await.unwrap();
    assert!(json.ends_with(",\"contended\":true}"), "{json}");
    let data: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(data["expiresAtMs"], extended.expires_at_ms().unwrap());
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());

    // Re-entered by its holder, a marked lock stays marked (its waiter still waits).
    let holder_key = unique("marked-holder");
    let holder_lock = backend.lock_key(&holder_key).unwrap();
    let as_holder = async |holder: &str| backend.acquire_as(&holder_key, ttl, holder).await;
    let held = as_holder("worker-1").await.unwrap().lease().unwrap();
    assert!(as_holder("worker-2").await.unwrap().is_contended());
    let again = as_holder("worker-1").await.unwrap().lease().unwrap();
    assert_eq!(again.lock_id, held.lock_id);
    let json: String = conn.get(&holder_lock).await.unwrap();
    assert!(json.ends_with(",\"contended\":true}"), "{json}");
    assert!(backend.release(&held.lock_id).await.unwrap().is_released());

    // Without release notifications nothing is published, so nothing is marked.
    let quiet = RedisBackend::connect_with(
        &redis_url(),
        RedisConfig::new().with_release_notifications(false),
    )
    .await
    .unwrap();
    let lease = acquired(&backend, &key, ttl).await;
    let before: String = conn.get(&lock_key).await.unwrap();
    assert!(quiet.acquire(&key, ttl).await.unwrap().is_contended());
    let after: String = conn.get(&lock_key).await.unwrap();
    assert_eq!(after, before);
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}
