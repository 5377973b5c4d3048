//! What user input can and cannot do: prefixes are validated before any I/O, user keys never
//! reach another key's index or fence counter, and data of the wrong type or shape under a
//! lock key is an invalid argument, not a crash.

use std::error::Error as _;
use std::time::Duration;

use redis::AsyncCommands as _;
use syncguard::backend::LockBackend;
use syncguard::backend::key::make_storage_key;
use syncguard::redis::{RedisBackend, RedisConfig};
use syncguard::{ErrorCode, get_by_id, get_by_key};

use crate::{acquired, both_backends, raw, redis_url, unique};

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
        let err = RedisBackend::connect_with(unreachable, RedisConfig::new().with_prefix(prefix))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{prefix:?}: {err}");
        assert!(err.to_string().contains("accepted"), "{err}");
    }
    let manager = redis::aio::ConnectionManager::new(redis::Client::open(redis_url()).unwrap())
        .await
        .unwrap();
    let err = RedisBackend::new(manager, RedisConfig::new().with_prefix("a b")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let pool = deadpool_redis::Config::from_url(redis_url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let err = RedisBackend::new(pool, RedisConfig::new().with_prefix("")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);

    // A custom prefix is used for every key.
    let backend = RedisBackend::connect_with(
        &redis_url(),
        RedisConfig::new().with_prefix("sg-test:custom"),
    )
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
