//! Waiting for replicas (`RedisConfig::with_wait_for_replicas`), against a primary of the
//! test's own with one replica: a grant counts only once the replica has it, one the replica
//! did not acknowledge in time is refused and released, and releases never wait.

use std::time::Duration;

use redis::AsyncCommands as _;
use syncguard::ErrorCode;
use syncguard::backend::{Lease, LockBackend};
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use tokio::time::{Instant, sleep};

use crate::servers::RedisServer;
use crate::{acquired, raw, unique};

const TTL: Duration = Duration::from_secs(30);

/// A backend on `primary` whose acquires and extends wait for one replica, at most `wait`.
async fn waiting_backend(
    primary: &RedisServer,
    mode: ConnectionMode,
    wait: Duration,
) -> RedisBackend {
    RedisBackend::connect_with(
        &primary.url(),
        RedisConfig::new()
            .with_connection_mode(mode)
            .with_operation_timeout(wait + Duration::from_secs(3))
            .with_wait_for_replicas(1, wait),
    )
    .await
    .expect("connect, waiting for one replica")
}

/// Asserts that the replica has `key` locked by `lease`.
async fn assert_on_replica(
    replica: &RedisServer,
    backend: &RedisBackend,
    key: &str,
    lease: &Lease,
) {
    let (lock, _) = on_replica(replica, backend, key).await;
    let lock = lock.unwrap_or_else(|| panic!("the replica has no lock on {key:?}"));
    assert!(lock.contains(&lease.lock_id.to_string()), "{lock}");
}

/// What the replica holds under `key`'s lock key and fence counter.
async fn on_replica(
    replica: &RedisServer,
    backend: &RedisBackend,
    key: &str,
) -> (Option<String>, Option<String>) {
    let mut conn = raw(&replica.url()).await;
    let lock: Option<String> = conn.get(backend.lock_key(key).unwrap()).await.unwrap();
    let fence: Option<String> = conn.get(backend.fence_key(key).unwrap()).await.unwrap();
    (lock, fence)
}

/// The moment an acquire or extend returns, the replica has it: the lock's record with its
/// lock id and new expiry, and the fence counter at the lease's fence. In both connection
/// modes, for a lone caller and for callers batched together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_or_extend_returns_once_the_replica_has_it() {
    let primary = RedisServer::start("everysec").await;
    let replica = RedisServer::start_replica_of(&primary).await;
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 4 },
    ] {
        let backend = waiting_backend(&primary, mode, Duration::from_millis(300)).await;
        let key = unique("replicated");
        let lease = acquired(&backend, &key, TTL).await;
        let (lock, fence) = on_replica(&replica, &backend, &key).await;
        let lock = lock.expect("the replica has the lock as soon as the acquire returned");
        assert!(lock.contains(&lease.lock_id.to_string()), "{lock}");
        assert_eq!(
            fence.as_deref().map(str::parse::<u64>),
            Some(Ok(lease.fence.get()))
        );

        let extended = backend
            .extend(&lease.lock_id, Duration::from_secs(60))
            .await
            .unwrap();
        let expires = extended.expires_at_ms().expect("extended");
        let (lock, _) = on_replica(&replica, &backend, &key).await;
        assert!(
            lock.unwrap()
                .contains(&format!("\"expiresAtMs\":{expires}")),
            "the replica has the extended expiry as soon as the extend returned"
        );

        // Sixteen callers at once: batched calls wait as one.
        let mut callers = tokio::task::JoinSet::new();
        for i in 0..16 {
            let backend = backend.clone();
            callers.spawn(async move {
                let key = unique(&format!("batched-{i}"));
                let lease = acquired(&backend, &key, TTL).await;
                (key, lease)
            });
        }
        while let Some(joined) = callers.join_next().await {
            let (key, lease) = joined.unwrap();
            assert_on_replica(&replica, &backend, &key, &lease).await;
        }
    }
}

/// A replica that lags (stopped for a moment) holds the acquire back until it has caught up:
/// the caller is not told "acquired" while the only copy of the grant is the primary's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_waits_while_the_replica_lags() {
    let primary = RedisServer::start("everysec").await;
    let replica = RedisServer::start_replica_of(&primary).await;
    let backend = waiting_backend(
        &primary,
        ConnectionMode::Multiplexed,
        Duration::from_secs(8),
    )
    .await;
    let key = unique("lagging");
    replica.pause();
    let acquire = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move { backend.acquire(&key, TTL).await }
    });
    sleep(Duration::from_millis(500)).await;
    assert!(
        !acquire.is_finished(),
        "the acquire returned while the replica had nothing"
    );
    replica.resume();
    let lease = acquire
        .await
        .unwrap()
        .unwrap()
        .lease()
        .expect("acquired once the replica caught up");
    assert_on_replica(&replica, &backend, &key, &lease).await;
}

/// With the replica stopped (SIGSTOP: its link stays open, it acknowledges nothing), an
/// acquire fails within the wait, saying why, and its lock does not stay taken on the
/// primary; a release does not wait at all; an extend fails and leaves the lock as it was.
/// Once the replica is back, acquires succeed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_the_replica_did_not_acknowledge_is_refused_and_released() {
    let primary = RedisServer::start("everysec").await;
    let replica = RedisServer::start_replica_of(&primary).await;
    let backend = waiting_backend(
        &primary,
        ConnectionMode::Multiplexed,
        Duration::from_millis(300),
    )
    .await;
    let plain = RedisBackend::connect(&primary.url()).await.unwrap();
    let held_key = unique("held");
    let held = acquired(&backend, &held_key, TTL).await;

    replica.pause();
    let key = unique("unacknowledged");
    let started = Instant::now();
    let error = backend
        .acquire(&key, TTL)
        .await
        .expect_err("no replica acknowledges");
    let took = started.elapsed();
    assert_eq!(error.code(), ErrorCode::ServiceUnavailable, "{error}");
    assert!(error.is_retryable());
    let message = error.to_string();
    assert!(
        message.contains("0 of the 1 replicas") && message.contains(&key),
        "{message}"
    );
    assert!(
        took >= Duration::from_millis(250),
        "it waited for the replica: {took:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "within the operation timeout: {took:?}"
    );
    // Released in the background: another caller gets it long before its ttl.
    let deadline = Instant::now() + Duration::from_secs(10);
    let taken = loop {
        if let Some(lease) = plain.acquire(&key, TTL).await.unwrap().lease() {
            break lease;
        }
        assert!(
            Instant::now() < deadline,
            "the refused grant was not released"
        );
        sleep(Duration::from_millis(50)).await;
    };
    assert!(
        taken.fence.get() >= 2,
        "the refused grant's fence stays spent"
    );

    let error = backend
        .extend(&held.lock_id, Duration::from_secs(90))
        .await
        .expect_err("the extension is not acknowledged");
    assert_eq!(error.code(), ErrorCode::ServiceUnavailable, "{error}");
    assert!(
        error.to_string().contains(&held.lock_id.to_string()),
        "{error}"
    );
    assert!(
        backend.is_locked(&held_key).await.unwrap(),
        "an unacknowledged extend releases nothing"
    );

    let started = Instant::now();
    assert!(backend.release(&held.lock_id).await.unwrap().is_released());
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "a release does not wait for replicas: {:?}",
        started.elapsed()
    );
    // Without the setting, the same primary grants at once.
    assert!(
        plain
            .acquire(&unique("plain"), TTL)
            .await
            .unwrap()
            .lease()
            .is_some()
    );

    replica.resume();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match backend.acquire(&unique("back"), TTL).await {
            Ok(outcome) => {
                assert!(outcome.lease().is_some(), "a fresh key was contended");
                break;
            }
            Err(error) => assert!(
                Instant::now() < deadline,
                "acquires still refused after the replica came back: {error}"
            ),
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// A setting that cannot work is refused when the backend is made, naming it, before any I/O.
#[tokio::test]
async fn a_bad_replica_setting_is_refused() {
    for (config, says) in [
        (
            RedisConfig::new().with_wait_for_replicas(0, Duration::from_millis(100)),
            "at least 1",
        ),
        (
            RedisConfig::new().with_wait_for_replicas(1, Duration::ZERO),
            "from 1 ms",
        ),
        (
            RedisConfig::new().with_wait_for_replicas(1, Duration::from_micros(999)),
            "from 1 ms",
        ),
        (
            RedisConfig::new()
                .with_operation_timeout(Duration::from_millis(500))
                .with_wait_for_replicas(1, Duration::from_millis(500)),
            "below the operation timeout",
        ),
    ] {
        // Nothing listens there: a refusal before any I/O is the only way to fail fast.
        let error = RedisBackend::connect_with("redis://127.0.0.1:1", config)
            .await
            .expect_err("refused");
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
        let message = error.to_string();
        assert!(
            message.contains("with_wait_for_replicas") && message.contains(says),
            "{message}"
        );
    }
}
