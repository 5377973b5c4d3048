//! The cluster layout on one server: what it writes (two keys in one hash slot, no index),
//! that a lock id alone finds its lock from any backend, and how it sits beside the reference
//! layout. An acquire sent twice (as a client resending after a dropped connection does) is
//! answered as acquired both times, in either layout.

use std::time::Duration;

use redis::AsyncCommands as _;
use redis::Value;
use syncguard::backend::{AcquireOutcome, LockBackend, Lookup};
use syncguard::redis::{RedisBackend, RedisConfig, RedisLayout};
use syncguard::{ErrorCode, LockId};

use crate::{acquired, cluster_layout_backend, manager_backend, raw, redis_url, unique};

const TTL: Duration = Duration::from_secs(30);

/// What Redis Cluster hashes a key by: the text between its first `{` and the next `}` when
/// that is not empty, else the whole key.
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_layout_writes_two_keys_in_one_slot_and_no_index() {
    let mut conn = raw(&redis_url()).await;
    let backend = cluster_layout_backend().await;
    assert_eq!(backend.layout(), RedisLayout::Cluster);
    let key = unique("cluster-layout");
    let lease = acquired(&backend, &key, TTL).await;
    let lock_key = backend.lock_key(&key).unwrap();
    let fence_key = backend.fence_key(&key).unwrap();
    assert!(
        lock_key.starts_with("syncguard:{") && lock_key.ends_with('}'),
        "{lock_key}"
    );
    assert_eq!(fence_key, format!("{lock_key}:fence"));
    assert_eq!(hash_tag(&lock_key).len(), 11, "{lock_key}");
    assert_eq!(hash_tag(&lock_key), hash_tag(&fence_key), "one hash slot");
    assert_eq!(backend.lock_key_of(&lease.lock_id), Some(lock_key.clone()));
    let error = backend.index_key(&lease.lock_id).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument);

    // The record is the reference's JSON; nothing but the two keys was written.
    let json: String = conn.get(&lock_key).await.unwrap();
    let data: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(data["lockId"], lease.lock_id.as_str());
    assert_eq!(data["key"], key.as_str());
    assert_eq!(data["fence"], "000000000000001");
    let mut written: Vec<String> = conn
        .keys(format!("syncguard:{}*", &lock_key["syncguard:".len()..]))
        .await
        .unwrap();
    written.sort();
    assert_eq!(written, [lock_key.clone(), fence_key.clone()]);
    let index: Vec<String> = conn
        .keys(format!("*{}*", lease.lock_id.as_str()))
        .await
        .unwrap();
    assert!(index.is_empty(), "no key names the lock id: {index:?}");
    let (lock_ttl, fence_ttl): (i64, i64) = redis::pipe()
        .pttl(&lock_key)
        .pttl(&fence_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        lock_ttl > 29_000 && lock_ttl <= 31_000,
        "ttl + 1 s tolerance: {lock_ttl}"
    );
    assert_eq!(fence_ttl, -1, "fence counters never expire");

    // A release deletes the one lock key; the counter stays and goes on counting.
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    let gone: Option<String> = conn.get(&lock_key).await.unwrap();
    assert!(gone.is_none());
    let again = acquired(&backend, &key, TTL).await;
    assert_eq!(again.fence.to_string(), "000000000000002");
    assert!(backend.release(&again.lock_id).await.unwrap().is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_id_alone_finds_its_lock_from_any_backend() {
    let taker = cluster_layout_backend().await;
    // Another process: it never saw the acquire.
    let other = cluster_layout_backend().await;
    let key = unique("cluster-by-id");
    let lease = acquired(&taker, &key, TTL).await;

    let found = other
        .lookup(Lookup::LockId(&lease.lock_id))
        .await
        .unwrap()
        .expect("found by lock id");
    let found = found.reveal();
    assert_eq!(found.key, key);
    assert_eq!(found.info.fence, lease.fence);
    let extended = other
        .extend(&lease.lock_id, Duration::from_secs(60))
        .await
        .unwrap();
    let expires = extended
        .expires_at_ms()
        .expect("extended by another backend");
    assert!(expires >= lease.expires_at_ms + 29_000);
    assert!(other.release(&lease.lock_id).await.unwrap().is_released());
    assert!(!taker.is_locked(&key).await.unwrap());
    assert!(!taker.release(&lease.lock_id).await.unwrap().is_released());

    // A lock id of another key, or a made-up one, finds nothing and changes nothing.
    let held = acquired(&taker, &key, TTL).await;
    for stranger in [LockId::generate(), lease.lock_id.clone()] {
        assert!(
            other
                .lookup(Lookup::LockId(&stranger))
                .await
                .unwrap()
                .is_none()
        );
        assert!(!other.release(&stranger).await.unwrap().is_released());
        assert!(
            other
                .extend(&stranger, TTL)
                .await
                .unwrap()
                .expires_at_ms()
                .is_none()
        );
    }
    assert!(taker.is_locked(&key).await.unwrap());
    assert!(taker.release(&held.lock_id).await.unwrap().is_released());
}

/// The layouts store a key in different places: a reference-layout service (a TypeScript one,
/// or a Rust one with the default) and a cluster-layout one do not exclude each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_layouts_do_not_share_locks() {
    let reference = manager_backend().await;
    let cluster = cluster_layout_backend().await;
    let key = unique("two-layouts");
    let one = acquired(&reference, &key, TTL).await;
    let two = acquired(&cluster, &key, TTL).await;
    assert_ne!(
        reference.lock_key(&key).unwrap(),
        cluster.lock_key(&key).unwrap()
    );
    assert!(reference.release(&one.lock_id).await.unwrap().is_released());
    assert!(cluster.release(&two.lock_id).await.unwrap().is_released());
}

/// The name of the batch function the backend loaded (`syncguard_<hash>`).
async fn batch_function(conn: &mut redis::aio::MultiplexedConnection) -> String {
    let names = crate::functions::libraries(conn).await;
    names
        .into_iter()
        .find(|name| name.starts_with("syncguard_"))
        .expect("the batch library is loaded")
}

/// A client that sends a call again after its connection dropped (redis-rs's cluster
/// connection does) may run an acquire twice: the second run must answer "acquired", with the
/// same fence, not "refused" for a lock its caller then never releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_sent_twice_is_acquired_both_times() {
    let mut conn = raw(&redis_url()).await;
    for layout in [RedisLayout::Reference, RedisLayout::Cluster] {
        let backend =
            RedisBackend::connect_with(&redis_url(), RedisConfig::new().with_layout(layout))
                .await
                .unwrap();
        let function = batch_function(&mut conn).await;
        let key = unique("resent");
        let lock_key = backend.lock_key(&key).unwrap();
        let fence_key = backend.fence_key(&key).unwrap();
        // A lock id of this key, never used for an acquire yet: in the cluster layout a lock
        // id starts with its key's tag, so take the id of a lock taken and released before.
        let probe = acquired(&backend, &key, TTL).await;
        assert!(backend.release(&probe.lock_id).await.unwrap().is_released());
        let lock_id = match layout {
            RedisLayout::Reference => LockId::generate(),
            _ => probe.lock_id,
        };
        let send = || {
            let mut call = redis::cmd("FCALL");
            call.arg(&function);
            match layout {
                RedisLayout::Reference => call
                    .arg(3)
                    .arg(&lock_key)
                    .arg(format!("syncguard:id:{lock_id}"))
                    .arg(&fence_key)
                    .arg(1000)
                    .arg("syncguard:id:"),
                _ => call.arg(2).arg(&lock_key).arg(&fence_key).arg(1000).arg(""),
            };
            call.arg("")
                .arg("A")
                .arg(lock_id.as_str())
                .arg(30_000)
                .arg(31_000)
                .arg(&key);
            call
        };
        let first: Vec<Value> = send().query_async(&mut conn).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second: Vec<Value> = send().query_async(&mut conn).await.unwrap();
        let fence = Value::BulkString(b"000000000000002".to_vec());
        assert_eq!(first[1], fence, "{layout:?}: {first:?}");
        assert_eq!(
            second[1], fence,
            "{layout:?}: the resend is acquired: {second:?}"
        );
        // One acquisition: the counter moved once, and the lease runs from the second call.
        let counter: String = conn.get(&fence_key).await.unwrap();
        assert_eq!(
            counter, "2",
            "{layout:?}: the probe's acquisition, and this one"
        );
        let info = syncguard::get_by_key(&backend, &key)
            .await
            .unwrap()
            .expect("held")
            .reveal();
        assert_eq!(info.lock_id, lock_id);
        let Value::Int(now) = second[0] else {
            panic!("batch time: {second:?}")
        };
        assert_eq!(
            info.info.expires_at_ms,
            u64::try_from(now).unwrap() + 30_000,
            "{layout:?}"
        );
        // And another lock id is refused, as ever.
        match backend.acquire(&key, TTL).await.unwrap() {
            AcquireOutcome::Contended { .. } => {}
            other => panic!("{layout:?}: expected contention, got {other:?}"),
        }
        assert!(
            backend.release(&lock_id).await.unwrap().is_released(),
            "{layout:?}"
        );
    }
}
