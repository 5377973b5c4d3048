//! The Redis backend when the network fails: an acquire whose answer never came may be
//! applied later, and must not leave a lock that nobody holds. Against the real server
//! `bash scripts/test-all.sh` starts (`SYNCGUARD_TEST_REDIS_URL`), through a TCP proxy of the
//! test's own that holds the traffic as a partition or a paused server would.

use std::time::Duration;

use syncguard::backend::LockBackend;
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig};
use syncguard::{ErrorCode, LockId};
use tokio::time::{Instant, sleep};

#[path = "support/proxy.rs"]
mod proxy;
use proxy::Proxy;

#[path = "support/min_hold_partition.rs"]
mod min_hold_partition;

#[path = "support/urls.rs"]
mod urls;
use urls::redis_url;

/// `host:port` of the test server.
fn server_addr() -> String {
    redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_and_was_applied_later_is_released() {
    a_lost_acquire_is_released(None).await;
}

/// The same for an acquire as a holder that nobody claimed (its release would leave the lock
/// to a re-entry or an extend of its lock id, see `holders::an_orphan_release_leaves_a_claimed_lock`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_as_that_timed_out_and_was_applied_later_is_released() {
    a_lost_acquire_is_released(Some("client-a")).await;
}

async fn a_lost_acquire_is_released(holder: Option<&str>) {
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { max_size: 4 },
    ] {
        let proxy = Proxy::start(&server_addr()).await;
        let backend = RedisBackend::connect_with(
            &format!("redis://{}", proxy.addr()),
            RedisConfig::new()
                .with_connection_mode(mode)
                .with_operation_timeout(Duration::from_millis(300)),
        )
        .await
        .expect("connect through the proxy");
        let observer = RedisBackend::connect(&redis_url()).await.unwrap();
        let key = format!("redis-faults:orphan:{}", LockId::generate());
        // Warm the connection (scripts loaded), so that the acquire is one request.
        assert!(!backend.is_locked(&key).await.unwrap());

        proxy.stall();
        let ttl = Duration::from_secs(60);
        let error = match holder {
            None => backend.acquire(&key, ttl).await,
            Some(holder) => backend.acquire_as(&key, ttl, holder).await,
        }
        .unwrap_err();
        assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{mode:?}: {error}");
        // Redis gets the held request now, and applies it: the lock is taken, for nobody.
        proxy.resume();

        // On the multiplexed connection the held request was sent, and Redis applied it when
        // it came through (the key's fence counter moved). (A pool checks a connection with a
        // PING before use, which the partition held up: its acquire was never sent.)
        let deadline = Instant::now() + Duration::from_secs(10);
        if mode == ConnectionMode::Multiplexed {
            assert!(
                landed(&backend, &key, deadline).await,
                "the held acquire never landed"
            );
        }
        // Either way no lock is left that nobody holds: released once the connection answered
        // again, long before its 60 s ttl.
        sleep(Duration::from_millis(200)).await;
        until_released(
            &observer,
            &key,
            deadline,
            &format!("{mode:?}: the orphan lock"),
        )
        .await;
        // The backend works on.
        let lease = backend
            .acquire(&key, Duration::from_secs(60))
            .await
            .unwrap()
            .lease()
            .expect("the key is free");
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
}

/// Whether the first acquire of `key` (whose fence counter nobody moved before) lands on the
/// server by `deadline`: its fence counter reaches 1. Polled directly, not through `backend`.
async fn landed(backend: &RedisBackend, key: &str, deadline: Instant) -> bool {
    let fence_key = backend.fence_key(key).unwrap();
    let mut raw = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    loop {
        let counter: Option<u64> = redis::AsyncCommands::get(&mut raw, &fence_key)
            .await
            .unwrap();
        if counter == Some(1) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `key` is free, failing the test if it is still locked at `deadline`.
async fn until_released(observer: &RedisBackend, key: &str, deadline: Instant, what: &str) {
    while observer.is_locked(key).await.unwrap() {
        assert!(Instant::now() < deadline, "{what} is still held");
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_min_hold_release_landing_late_keeps_nothing_past_min_hold() {
    let proxy = Proxy::start(&server_addr()).await;
    let cut_off = RedisBackend::connect_with(
        &format!("redis://{}", proxy.addr()),
        RedisConfig::new().with_operation_timeout(Duration::from_millis(300)),
    )
    .await
    .expect("connect through the proxy");
    let direct = RedisBackend::connect(&redis_url()).await.unwrap();
    let key = format!("redis-faults:min-hold:{}", LockId::generate());
    // Warm the connection (scripts loaded), so that each operation is one request.
    assert!(!cut_off.is_locked(&key).await.unwrap());
    min_hold_partition::a_min_hold_release_landing_late_keeps_nothing_past_min_hold(
        cut_off,
        direct,
        &proxy,
        &key,
        Duration::from_secs(5),
        true,
    )
    .await;
}

/// The operation timeout holds on a connection of yours, whatever its own timeouts: a
/// `ConnectionManager` that would wait for ever (no response timeout) behind a stalled
/// network still answers within it, and the acquire it cut short is let go once the network
/// heals. Before, a backend on such a connection waited as long as the network held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operation_timeout_holds_on_a_connection_of_yours() {
    use syncguard::redis::redis;

    let proxy = Proxy::start(&server_addr()).await;
    let client = redis::Client::open(format!("redis://{}", proxy.addr())).unwrap();
    let patient = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    let manager = redis::aio::ConnectionManager::new_with_config(client, patient)
        .await
        .expect("a connection through the proxy");
    let timeout = Duration::from_millis(300);
    let backend =
        RedisBackend::new(manager, RedisConfig::new().with_operation_timeout(timeout)).unwrap();
    let observer = RedisBackend::connect(&redis_url()).await.unwrap();
    let key = format!("redis-faults:yours:{}", LockId::generate());
    // Warm the connection (scripts loaded), so that the acquire is one request.
    assert!(!backend.is_locked(&key).await.unwrap());

    proxy.stall();
    let started = Instant::now();
    let acquired = tokio::time::timeout(
        Duration::from_secs(10),
        backend.acquire(&key, Duration::from_secs(60)),
    )
    .await
    .expect("the acquire returned within its operation timeout, not after 10 s");
    let took = started.elapsed();
    let error = acquired.expect_err("nothing answers while the network is stalled");
    assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}");
    assert!(took < timeout + Duration::from_secs(2), "took {took:?}");

    // Healed: the held acquire lands (its fence counter moves: the loop below sees a lock
    // that was there, not one that never came), and is released as one in doubt, long
    // before its 60 s ttl.
    proxy.resume();
    let deadline = Instant::now() + Duration::from_secs(20);
    assert!(
        landed(&backend, &key, deadline).await,
        "the held acquire never landed"
    );
    until_released(&observer, &key, deadline, "the acquire in doubt").await;
}

/// A backend on a deadpool-redis pool of the user's without timeouts, whose connections have
/// no response timeout either (set by a `post_create` hook), through `proxy`; its four idle
/// connections are stranded (they never answer and never close), new ones go through.
async fn stranded_backend(proxy: &Proxy) -> RedisBackend {
    use syncguard::redis::deadpool_redis::{Hook, Manager, Pool};
    use syncguard::redis::redis::aio::MultiplexedConnection;

    let patient = Hook::sync_fn(|conn: &mut MultiplexedConnection, _| {
        conn.set_response_timeout(Duration::from_secs(24 * 3600));
        Ok(())
    });
    let manager = Manager::new(format!("redis://{}", proxy.addr())).unwrap();
    let pool = Pool::builder(manager)
        .max_size(16)
        .post_create(patient)
        .build()
        .unwrap();
    let config = RedisConfig::new().with_operation_timeout(Duration::from_millis(300));
    let backend = RedisBackend::new(pool.clone(), config).unwrap();
    backend.load_scripts().await.unwrap();
    // Four connections open at once (held together), then idle in the pool: the next calls
    // take them.
    let mut opened = Vec::new();
    for _ in 0..4 {
        opened.push(pool.get().await.unwrap());
    }
    drop(opened);
    proxy.strand();
    backend
}

/// The orphan releases are not held by a connection that never answers either: the release
/// task gives up a call after the operation timeout and sends it again, over a connection
/// that works. Before, it waited on a stranded connection for good, and a lock that an acquire
/// left for nobody stayed until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_answers_does_not_hold_the_orphan_releases() {
    let proxy = Proxy::start(&server_addr()).await;
    let backend = stranded_backend(&proxy).await;
    let observer = RedisBackend::connect(&redis_url()).await.unwrap();
    let ttl = Duration::from_secs(60);
    // A lone acquire takes a stranded connection and times out; in doubt, it is handed to
    // the release task, whose first call takes another stranded connection.
    let error = backend
        .acquire(
            &format!("redis-faults:stranded:{}", LockId::generate()),
            ttl,
        )
        .await
        .expect_err("a stranded connection never answers");
    assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}");

    // Acquires whose callers give up after a moment, until one of them lands all the same:
    // a lock nobody holds, which the release task must release long before its ttl.
    let deadline = Instant::now() + Duration::from_secs(20);
    let waits = (0..8).map(|doubling| Duration::from_micros(100 << doubling));
    let key = 'landed: loop {
        for wait in waits.clone() {
            assert!(
                Instant::now() < deadline,
                "no acquire landed after its caller gave up"
            );
            let key = format!("redis-faults:stranded-orphan:{}", LockId::generate());
            match tokio::time::timeout(wait, backend.acquire(&key, ttl)).await {
                Err(_gave_up) => {
                    let soon = Instant::now() + Duration::from_millis(500);
                    if landed(&backend, &key, soon).await {
                        break 'landed key;
                    }
                }
                // Answered in time: it leaves nothing behind once released (a release that
                // takes a stranded connection times out, and its lock expires with the test).
                Ok(Ok(acquired)) => {
                    let lease = acquired.lease().expect("a fresh key is free");
                    let _ = backend.release(&lease.lock_id).await;
                }
                Ok(Err(error)) => assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}"),
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    until_released(&observer, &key, deadline, "the lock nobody holds").await;
}

/// A connection of yours that never answers cannot hold the backend: the backend gives up a
/// batch call after the operation timeout, which frees its slot (two are on the wire at most)
/// and the orphan releases, and calls go on over the connections that work. Here a
/// deadpool-redis pool without timeouts, whose connections have no response timeout either,
/// holds connections that went half-open (stranded by the proxy: they never answer and never
/// close); new connections go through. Before, a batch call on a stranded connection waited
/// for it for good: once both slots were taken so, every later call timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_answers_does_not_hold_the_backend() {
    let proxy = Proxy::start(&server_addr()).await;
    let backend = stranded_backend(&proxy).await;
    let observer = RedisBackend::connect(&redis_url()).await.unwrap();
    // Rounds of concurrent acquires (so that they batch): the first rounds' calls take the
    // stranded connections, and time out; a later round goes through a new connection.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut leases, mut timed_out) = (Vec::new(), Vec::new());
    for round in 1.. {
        assert!(
            Instant::now() < deadline,
            "no acquire went through in {round} rounds: the stranded connections hold the backend"
        );
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let backend = backend.clone();
            let key = format!("redis-faults:stranded:{}", LockId::generate());
            calls.spawn(async move {
                let acquired = tokio::time::timeout(
                    Duration::from_secs(5),
                    backend.acquire(&key, Duration::from_secs(60)),
                )
                .await
                .expect("an acquire returned within its operation timeout, not after 5 s");
                (key, acquired)
            });
        }
        while let Some(call) = calls.join_next().await {
            match call.unwrap() {
                (_, Ok(acquired)) => leases.push(acquired.lease().expect("a fresh key is free")),
                (key, Err(error)) => {
                    assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}");
                    timed_out.push(key);
                }
            }
        }
        if !leases.is_empty() {
            break;
        }
    }

    // The backend works on (a call may still take a stranded connection left idle in the
    // pool, and time out), and leaves no lock that nobody holds: any acquire that timed out
    // and landed all the same is released, long before its 60 s ttl.
    let deadline = Instant::now() + Duration::from_secs(15);
    for lease in leases {
        loop {
            match backend.release(&lease.lock_id).await {
                Ok(released) => {
                    assert!(released.is_released());
                    break;
                }
                Err(error) => {
                    assert_eq!(error.code(), ErrorCode::NetworkTimeout, "{error}");
                    assert!(Instant::now() < deadline, "the release never went through");
                }
            }
        }
    }
    for key in timed_out {
        until_released(&observer, &key, deadline, "an acquire that timed out").await;
    }
}
