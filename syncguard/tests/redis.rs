//! The Redis backend against a real redis-server: the conformance suite in both connection
//! modes, the storage layout byte for byte, TTLs, key-collision safety, script-cache loss,
//! error mapping, and a server restart with AOF persistence.
//!
//! Needs `SYNCGUARD_TEST_REDIS_URL` (a server these tests may write to) and
//! `SYNCGUARD_REDIS_SERVER_BIN` (to start private servers); `bash scripts/test-all.sh` or
//! `bash scripts/with-services.sh cargo test -p syncguard --features redis,conformance --test redis`
//! installs redis-server if missing and sets both.

use std::error::Error as _;
use std::future::Future as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::AsyncCommands as _;
use redis::aio::MultiplexedConnection;
use syncguard::key::{make_fence_key, make_storage_key};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use syncguard::{
    AcquireOutcome, ErrorCode, ExtendOutcome, Lease, LockBackend, LockId, NotHeldReason,
    ReleaseOutcome, get_by_id, get_by_key, get_by_key_raw,
};
use tokio::time::{Instant, sleep};

#[path = "support/servers.rs"]
mod servers;
use servers::{RedisServer, free_port};

const HOW_TO_RUN: &str = "run `bash scripts/test-all.sh`, or `bash scripts/with-services.sh \
    cargo test -p syncguard --features redis,conformance --test redis` (it installs \
    redis-server if missing and starts it)";

fn redis_url() -> String {
    std::env::var("SYNCGUARD_TEST_REDIS_URL")
        .unwrap_or_else(|_| panic!("SYNCGUARD_TEST_REDIS_URL is not set: {HOW_TO_RUN}"))
}

async fn manager_backend() -> RedisBackend {
    RedisBackend::connect(&redis_url())
        .await
        .expect("connect (multiplexed)")
}

async fn pool_backend() -> RedisBackend {
    RedisBackend::builder(&redis_url())
        .mode(ConnectionMode::Pool { max_size: 16 })
        .build()
        .await
        .expect("connect (pool)")
}

async fn both_backends() -> [RedisBackend; 2] {
    [manager_backend().await, pool_backend().await]
}

mod manager {
    syncguard::conformance_tests!(async { super::manager_backend().await });
}

mod pool {
    syncguard::conformance_tests!(async { super::pool_backend().await });
}

/// A plain connection, to look at what the backend wrote.
async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("plain connection")
}

async fn acquired(backend: &RedisBackend, key: &str, ttl: Duration) -> Lease {
    match backend.acquire(key, ttl).await {
        Ok(AcquireOutcome::Acquired(lease)) => lease,
        other => panic!("expected to acquire {key:?}, got {other:?}"),
    }
}

fn unique(label: &str) -> String {
    format!("redis-test:{label}:{}", LockId::generate())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_is_byte_compatible_with_the_reference() {
    let url = redis_url();
    let mut conn = raw(&url).await;
    for backend in both_backends().await {
        // A slash (cjson escapes it), non-ASCII text and a decomposed accent (stored in NFC).
        let key = format!("{}:caf\u{65}\u{301}/€", unique("layout"));
        let nfc = syncguard::key::normalize_key(&key).unwrap().into_owned();
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
        let reference: Vec<u8> = redis::Script::new(
            "return cjson.encode({lockId=ARGV[1], expiresAtMs=tonumber(ARGV[2]), \
             acquiredAtMs=tonumber(ARGV[3]), key=ARGV[4], fence=ARGV[5]})",
        )
        .arg(lease.lock_id.as_str())
        .arg(lease.expires_at_ms)
        .arg(acquired_at)
        .arg(&nfc)
        .arg(lease.fence.to_string())
        .invoke_async(&mut conn)
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
async fn user_keys_cannot_reach_index_or_fence_keys() {
    let mut conn = raw(&redis_url()).await;
    for backend in both_backends().await {
        let x = unique("victim");
        let victim = acquired(&backend, &x, Duration::from_secs(30)).await;
        let x_lock = backend.lock_key(&x).unwrap();
        let x_fence = backend.fence_key(&x).unwrap();
        let x_index = backend.index_key(&victim.lock_id).unwrap();

        // With the reference layout, these user keys would land on x's fence counter and on
        // x's index key.
        let fence_attack = format!("fence:{x_lock}");
        let index_attack = format!("id:{}", victim.lock_id);
        assert_eq!(
            make_storage_key("syncguard", &fence_attack, 1000, 26).unwrap(),
            x_fence
        );
        assert_eq!(
            make_storage_key("syncguard", &index_attack, 1000, 26).unwrap(),
            x_index
        );
        // Here they are hashed instead, to a 22-character name with no colon.
        let mut attack_leases = Vec::new();
        for attack in [&fence_attack, &index_attack] {
            let stored = backend.lock_key(attack).unwrap();
            assert_ne!(stored, x_fence);
            assert_ne!(stored, x_index);
            assert_eq!(stored.len(), "syncguard:".len() + 22, "{stored}");
            let lease = acquired(&backend, attack, Duration::from_secs(30)).await;
            assert!(backend.is_locked(attack).await.unwrap());
            attack_leases.push(lease);
        }
        // A user key equal to a hashed name is itself hashed: no collision with the key that
        // hashed there.
        let hashed_name = backend.lock_key(&fence_attack).unwrap()["syncguard:".len()..].to_owned();
        let stored = backend.lock_key(&hashed_name).unwrap();
        assert_ne!(stored, backend.lock_key(&fence_attack).unwrap());
        let lease = acquired(&backend, &hashed_name, Duration::from_secs(30)).await;
        attack_leases.push(lease);

        // x's counter, index and lock are untouched, with no TTL on the counter.
        let counter: String = conn.get(&x_fence).await.unwrap();
        assert_eq!(counter, "1");
        let fence_ttl: i64 = conn.pttl(&x_fence).await.unwrap();
        assert_eq!(fence_ttl, -1);
        let index: String = conn.get(&x_index).await.unwrap();
        assert_eq!(index, x_lock);
        let info = get_by_id(&backend, &victim.lock_id).await.unwrap().unwrap();
        assert_eq!(info.fence, victim.fence);

        // Each attack key has its own fence counter, starting at 1.
        for lease in &attack_leases {
            assert_eq!(lease.fence.get(), 1);
            assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        }
        assert!(
            backend
                .release(&victim.lock_id)
                .await
                .unwrap()
                .is_released()
        );
        let next = acquired(&backend, &x, Duration::from_secs(30)).await;
        assert_eq!(next.fence.get(), 2, "x's counter went on from 1");
        assert!(backend.release(&next.lock_id).await.unwrap().is_released());

        // Ordinary keys, even close to the reserved shapes, stay where the reference puts them.
        for key in [
            "job:42",
            "idx:1",
            "fencing:2",
            "a:id:b",
            "fence",
            "AAAAAAAAAAAAAAAAAAAAAB",
        ] {
            assert_eq!(
                backend.lock_key(key).unwrap(),
                make_storage_key("syncguard", key, 1000, 26).unwrap(),
                "{key}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_prefixes_are_rejected_before_any_io() {
    let unreachable = "redis://127.0.0.1:1";
    let too_long = "p".repeat(129);
    for prefix in [
        "",
        "  ",
        too_long.as_str(),
        "a:",
        ":a",
        "a::b",
        "a b",
        "locks*",
        "a:fence",
        "id",
        "{tag}",
    ] {
        let err = RedisBackend::builder(unreachable)
            .prefix(prefix)
            .build()
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{prefix:?}: {err}");
        assert!(err.to_string().contains("accepted"), "{err}");
    }
    let manager = redis::aio::ConnectionManager::new(redis::Client::open(redis_url()).unwrap())
        .await
        .unwrap();
    let err = RedisBackend::from_connection_manager(manager, RedisConfig::new().with_prefix("a b"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let pool = deadpool_redis::Config::from_url(redis_url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let err = RedisBackend::from_pool(pool, RedisConfig::new().with_prefix("")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);

    // A custom prefix is used for every key.
    let backend = RedisBackend::builder(&redis_url())
        .prefix("sg-test:custom")
        .build()
        .await
        .unwrap();
    let key = unique("prefixed");
    let lease = acquired(&backend, &key, Duration::from_secs(30)).await;
    let mut conn = raw(&redis_url()).await;
    let index: String = conn
        .get(format!("sg-test:custom:id:{}", lease.lock_id))
        .await
        .unwrap();
    assert_eq!(index, format!("sg-test:custom:{key}"));
    let counter: String = conn
        .get(format!("sg-test:custom:fence:sg-test:custom:{key}"))
        .await
        .unwrap();
    assert_eq!(counter, "1");
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

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
    let cleaner = RedisBackend::builder(&url)
        .cleanup_in_is_locked(true)
        .build()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_mid_run_is_recovered() {
    let url = redis_url();
    for backend in both_backends().await {
        let stop = Instant::now() + Duration::from_secs(2);
        let cycles = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..16)
            .map(|worker| {
                let backend = backend.clone();
                let cycles = Arc::clone(&cycles);
                tokio::spawn(async move {
                    let key = unique(&format!("flush-{worker}"));
                    while Instant::now() < stop {
                        let lease = acquired(&backend, &key, Duration::from_secs(10)).await;
                        assert!(backend.is_locked(&key).await.unwrap());
                        let extended = backend
                            .extend(&lease.lock_id, Duration::from_secs(10))
                            .await
                            .unwrap();
                        assert!(extended.expires_at_ms().is_some());
                        assert!(get_by_key_raw(&backend, &key).await.unwrap().is_some());
                        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let mut conn = raw(&url).await;
        let mut flushes = 0;
        while Instant::now() < stop {
            sleep(Duration::from_millis(50)).await;
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .unwrap();
            flushes += 1;
        }
        for worker in workers {
            worker.await.expect("a worker failed across SCRIPT FLUSH");
        }
        assert!(flushes >= 10);
        assert!(cycles.load(Ordering::Relaxed) > 100, "too few cycles");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_data_and_wrong_types_are_invalid_argument() {
    let mut conn = raw(&redis_url()).await;
    for backend in both_backends().await {
        let hash_key = unique("wrongtype");
        let _: () = conn
            .hset(backend.lock_key(&hash_key).unwrap(), "field", "value")
            .await
            .unwrap();
        let err = backend
            .acquire(&hash_key, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
        assert!(err.source().is_some(), "the redis error is kept");
        assert!(
            err.source().unwrap().to_string().contains("WRONGTYPE"),
            "{:?}",
            err.source()
        );

        let junk_key = unique("junk");
        let _: () = conn
            .set_ex(backend.lock_key(&junk_key).unwrap(), "not json", 60)
            .await
            .unwrap();
        for result in [
            backend
                .acquire(&junk_key, Duration::from_secs(1))
                .await
                .map(|_| ()),
            backend.is_locked(&junk_key).await.map(|_| ()),
            get_by_key(&backend, &junk_key).await.map(|_| ()),
        ] {
            let err = result.unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
            assert!(err.source().is_some());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_credentials_and_permissions_are_auth_failed() {
    let url = redis_url();
    let mut conn = raw(&url).await;
    let user = format!("sg-test-{}", std::process::id());
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("reset")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("+@connection")
        .query_async(&mut conn)
        .await
        .unwrap();
    let with_user =
        |password: &str| url.replacen("redis://", &format!("redis://{user}:{password}@"), 1);

    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 2 },
    ] {
        let err = RedisBackend::builder(&with_user("wrong"))
            .mode(mode)
            .build()
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::AuthFailed, "{mode:?}: {err}");
        assert!(err.source().is_some());

        // Authenticated, but without permission to run scripts.
        let err = RedisBackend::builder(&with_user("secret"))
            .mode(mode)
            .build()
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::AuthFailed, "{mode:?}: {err}");
        let source = err.source().unwrap().downcast_ref::<redis::RedisError>();
        assert_eq!(source.and_then(|e| e.code()), Some("NOPERM"), "{err:?}");
    }
    // The same on the hot path (EVALSHA refused), with a connection the caller made.
    let client = redis::Client::open(with_user("secret")).unwrap();
    let manager = redis::aio::ConnectionManager::new(client).await.unwrap();
    let backend = RedisBackend::from_connection_manager(manager, RedisConfig::new()).unwrap();
    let err = backend
        .acquire(&unique("noperm"), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AuthFailed, "{err}");
    let _: () = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_service_unavailable() {
    let port = free_port();
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 2 },
    ] {
        let err = RedisBackend::builder(&format!("redis://127.0.0.1:{port}"))
            .mode(mode)
            .reconnect_retries(0)
            .build()
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ServiceUnavailable, "{mode:?}: {err}");
        assert!(err.is_retryable());
        assert!(err.source().is_some());
    }
}

/// Retries `acquire` until the server answers again, checking every failure is a mapped,
/// retryable connection error.
async fn acquire_when_back(backend: &RedisBackend, key: &str) -> Lease {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match backend.acquire(key, Duration::from_secs(30)).await {
            Ok(AcquireOutcome::Acquired(lease)) => return lease,
            Ok(AcquireOutcome::Contended) => panic!("{key} contended after restart"),
            Err(err) => {
                assert!(
                    matches!(
                        err.code(),
                        ErrorCode::ServiceUnavailable | ErrorCode::NetworkTimeout
                    ),
                    "unexpected error while the server restarts: {err}"
                );
                assert!(
                    Instant::now() < deadline,
                    "no recovery after restart: {err}"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_gives_mapped_errors_then_recovers_and_fences_persist_with_aof() {
    let mut server = RedisServer::start("everysec").await;
    let manager = RedisBackend::builder(&server.url())
        .reconnect_retries(1)
        .build()
        .await
        .unwrap();
    let pool = RedisBackend::builder(&server.url())
        .mode(ConnectionMode::Pool { max_size: 4 })
        .build()
        .await
        .unwrap();
    let backends = [("multiplexed", manager), ("pool", pool)];
    let key = unique("restart");
    let mut last = 0;
    for (_, backend) in &backends {
        for _ in 0..3 {
            let lease = acquired(backend, &key, Duration::from_secs(30)).await;
            assert!(lease.fence.get() > last);
            last = lease.fence.get();
            assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
        }
    }
    assert_eq!(last, 6);

    server.stop().await;
    for (mode, backend) in &backends {
        let err = backend
            .acquire(&key, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ServiceUnavailable, "{mode}: {err}");
        assert!(err.is_retryable());
        assert!(err.source().is_some(), "{mode}: the redis error is kept");
        let err = backend.is_locked(&key).await.unwrap_err();
        assert!(
            matches!(
                err.code(),
                ErrorCode::ServiceUnavailable | ErrorCode::NetworkTimeout
            ),
            "{mode}: {err}"
        );
    }

    // Same directory, same port: the AOF brings the counters back, the script cache is empty
    // (the first calls get NOSCRIPT and recover on their own).
    server.launch().await;
    for (mode, backend) in &backends {
        let lease = acquire_when_back(backend, &key).await;
        assert!(
            lease.fence.get() > last,
            "{mode}: fence {} after restart, {last} before",
            lease.fence
        );
        last = lease.fence.get();
        assert!(backend.is_locked(&key).await.unwrap());
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
    assert_eq!(last, 8, "fences went on from 6");

    // A server that stops answering (CLIENT PAUSE) gives NetworkTimeout.
    let slow = RedisBackend::builder(&server.url())
        .response_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let mut conn = raw(&server.url()).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("ALL")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = slow.is_locked(&key).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NetworkTimeout, "{err}");
    assert!(err.source().is_some());
    sleep(Duration::from_millis(1600)).await;
    assert!(
        !slow.is_locked(&key).await.unwrap(),
        "recovered after the pause"
    );
    server.stop().await;
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

/// Concurrent calls share script calls (batches); each still gets its own answer, and a call
/// that meets a wrong type fails alone, having changed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_batched_together_answer_separately() {
    let mut conn = raw(&redis_url()).await;
    for backend in both_backends().await {
        let bad = unique("batch-bad");
        let _: () = conn
            .hset(backend.lock_key(&bad).unwrap(), "field", "value")
            .await
            .unwrap();
        let held = unique("batch-held");
        let holder = acquired(&backend, &held, Duration::from_secs(30)).await;
        let keys: Vec<String> = (0..40).map(|_| unique("batch")).collect();

        // 40 free keys, one held key and one wrong-type key, all at once.
        let mut calls = tokio::task::JoinSet::new();
        for key in keys.iter().chain([&held, &bad]) {
            let (backend, key) = (backend.clone(), key.clone());
            calls.spawn(async move {
                let outcome = backend.acquire(&key, Duration::from_secs(30)).await;
                (key, outcome)
            });
        }
        let mut leases = Vec::new();
        while let Some(joined) = calls.join_next().await {
            let (key, outcome) = joined.unwrap();
            if key == bad {
                let err = outcome.unwrap_err();
                assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
                assert!(err.source().unwrap().to_string().contains("WRONGTYPE"));
            } else if key == held {
                assert!(matches!(outcome, Ok(AcquireOutcome::Contended)));
            } else {
                match outcome {
                    Ok(AcquireOutcome::Acquired(lease)) => leases.push((key, lease)),
                    other => panic!("{key}: {other:?}"),
                }
            }
        }
        assert_eq!(leases.len(), keys.len());
        let kind: String = redis::cmd("TYPE")
            .arg(backend.lock_key(&bad).unwrap())
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kind, "hash", "the failed call wrote nothing");

        // Releases and extends, concurrently, each answered for its own lock.
        let mut calls = tokio::task::JoinSet::new();
        for (i, (key, lease)) in leases.into_iter().enumerate() {
            let backend = backend.clone();
            calls.spawn(async move {
                if i % 2 == 0 {
                    let released = backend.release(&lease.lock_id).await.unwrap();
                    assert!(released.is_released(), "{key}");
                    assert!(!backend.is_locked(&key).await.unwrap());
                } else {
                    let extended = backend
                        .extend(&lease.lock_id, Duration::from_secs(60))
                        .await
                        .unwrap();
                    let info = get_by_id(&backend, &lease.lock_id).await.unwrap().unwrap();
                    assert_eq!(Some(info.expires_at_ms), extended.expires_at_ms(), "{key}");
                    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
                }
            });
        }
        while let Some(joined) = calls.join_next().await {
            joined.unwrap();
        }
        assert!(
            backend
                .release(&holder.lock_id)
                .await
                .unwrap()
                .is_released()
        );
    }
}

/// An acquire whose caller gave up (its future dropped) after the call was queued does not
/// leave the lock held for its ttl: the batch task releases what nobody will.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_acquires_do_not_leave_locks_held() {
    let backend = manager_backend().await;
    let keys: Vec<String> = (0..50).map(|_| unique("abandoned")).collect();
    for key in &keys {
        // Polled once (the call is queued), then dropped before the reply.
        let mut attempt = std::pin::pin!(backend.acquire(key, Duration::from_secs(60)));
        let polled = attempt
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        assert!(polled.is_pending(), "no reply can have come yet");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = raw(&redis_url()).await;
    for key in &keys {
        loop {
            // The call ran (its fence was used), and its lock was let go.
            let fence: Option<String> = conn.get(backend.fence_key(key).unwrap()).await.unwrap();
            if fence.is_some() && !backend.is_locked(key).await.unwrap() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key} still held by an abandoned acquire"
            );
            sleep(Duration::from_millis(20)).await;
        }
        let lease = acquired(&backend, key, Duration::from_secs(5)).await;
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
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
            Ok(AcquireOutcome::Contended)
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
