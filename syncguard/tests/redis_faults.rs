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
        let fence_key = backend.fence_key(&key).unwrap();
        let mut raw = redis::Client::open(redis_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        if mode == ConnectionMode::Multiplexed {
            loop {
                let counter: Option<u64> = redis::AsyncCommands::get(&mut raw, &fence_key)
                    .await
                    .unwrap();
                if counter == Some(1) {
                    break;
                }
                assert!(Instant::now() < deadline, "the held acquire never landed");
                sleep(Duration::from_millis(10)).await;
            }
        }
        // Either way no lock is left that nobody holds: released once the connection answered
        // again, long before its 60 s ttl.
        sleep(Duration::from_millis(200)).await;
        while observer.is_locked(&key).await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "{mode:?}: the orphan lock is still held"
            );
            sleep(Duration::from_millis(20)).await;
        }
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

    // Healed: the held acquire lands, and is released as one in doubt.
    proxy.resume();
    let deadline = Instant::now() + Duration::from_secs(20);
    while observer.is_locked(&key).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the acquire in doubt is still held"
        );
        sleep(Duration::from_millis(20)).await;
    }
}
