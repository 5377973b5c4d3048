//! Failovers of a Sentinel group of the test's own, followed by a backend made before them,
//! without a restart: its connection, its release subscriber, and waiting for the replica.

use std::time::Duration;

use redis::AsyncCommands as _;
use syncguard::backend::{Lease, LockBackend};
use syncguard::redis::{RedisBackend, RedisConfig};
use syncguard::{LockOptions, RetryPolicy};
use tokio::time::{Instant, sleep};

use crate::sentinels::{SentinelGroup, is_primary};
use crate::{acquired, unique};

const TTL: Duration = Duration::from_secs(30);

/// Acquires `key` (free) through `backend`, trying again while the backend finds the new
/// primary; fails after `within`. A refused attempt may have left the key held until its
/// release in the background (an acquire the replica did not acknowledge): contended, it
/// tries again too.
async fn acquired_after_failover(backend: &RedisBackend, key: &str, within: Duration) -> Lease {
    let deadline = Instant::now() + within;
    loop {
        match backend.acquire(key, TTL).await {
            Ok(outcome) => {
                if let Some(lease) = outcome.lease() {
                    return lease;
                }
                assert!(
                    Instant::now() < deadline,
                    "{key:?} still contended after {within:?}"
                );
            }
            Err(error) => {
                assert!(error.is_retryable(), "{error}");
                assert!(
                    Instant::now() < deadline,
                    "still failing {within:?} after the failover: {error}"
                );
            }
        }
        sleep(Duration::from_millis(50)).await;
    }
}

/// The lease of one acquire and release of `key` (free): its fence is the key's last.
async fn taken_and_released(backend: &RedisBackend, key: &str) -> Lease {
    let lease = acquired(backend, key, TTL).await;
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    lease
}

/// What the server on `port` holds under `key`'s lock key.
async fn stored_on(port: u16, backend: &RedisBackend, key: &str) -> Option<String> {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    conn.get(backend.lock_key(key).unwrap()).await.unwrap()
}

/// `SENTINEL FAILOVER`: the backend goes on with the new primary, where its new locks are
/// written; a lock taken before is still held there by its holder, and released by it; the
/// fence counter goes on from where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_is_followed_without_a_restart() {
    let group = SentinelGroup::start().await;
    let backend = RedisBackend::connect(&group.url()).await.unwrap();
    let held_key = unique("held");
    let held = acquired(&backend, &held_key, TTL).await;
    let cycled = unique("cycled");
    let before = taken_and_released(&backend, &cycled).await;

    let new_primary = group.failover().await;
    // The old primary still accepts writes until the Sentinels demote it, a second or more
    // later; the backend leaves it when a Sentinel announces the switch, at once, so that no
    // grant after the switch lands there.
    let mut on_the_old_primary = 0;
    let after = loop {
        let lease = acquired_after_failover(&backend, &cycled, Duration::from_secs(20)).await;
        if stored_on(new_primary, &backend, &cycled)
            .await
            .is_some_and(|stored| stored.contains(&lease.lock_id.to_string()))
        {
            break lease;
        }
        on_the_old_primary += 1;
    };
    assert_eq!(
        on_the_old_primary, 0,
        "grants on the old primary after the Sentinels switched"
    );
    assert!(
        after.fence > before.fence,
        "fences keep increasing after the failover"
    );
    assert!(backend.is_locked(&held_key).await.unwrap());
    assert!(backend.release(&held.lock_id).await.unwrap().is_released());
    assert!(!backend.is_locked(&held_key).await.unwrap());
}

/// `kill -9` of the primary: the Sentinels promote the replica, and the backend acquires again
/// on it. The killed server, restarted, comes back as a primary of its own until the Sentinels
/// turn it into a replica: the backend never writes to it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_followed() {
    let mut group = SentinelGroup::start().await;
    let backend = RedisBackend::connect(&group.url()).await.unwrap();
    let key = unique("killed");
    let before = taken_and_released(&backend, &key).await;
    // Replicated before the kill: the replica has the fence counter.
    sleep(Duration::from_millis(200)).await;

    let old_primary = group.primary_port().await;
    let replica = group.other_than(old_primary);
    group.server(old_primary).kill();
    let killed = Instant::now();
    let after = acquired_after_failover(&backend, &key, Duration::from_secs(40)).await;
    let recovered = killed.elapsed();
    assert!(
        after.fence > before.fence,
        "fences keep increasing after the failover"
    );
    assert!(
        is_primary(replica).await,
        "acquired on the promoted replica"
    );
    assert!(stored_on(replica, &backend, &key).await.is_some());
    eprintln!("acquired again {recovered:?} after the primary was killed");

    // The killed server restarts with its old data, a primary until the Sentinels demote it.
    group.server(old_primary).launch().await;
    let probe = unique("after-restart");
    let lease = acquired_after_failover(&backend, &probe, Duration::from_secs(20)).await;
    group
        .wait_for_primary(replica, Duration::from_secs(30))
        .await;
    assert!(
        stored_on(replica, &backend, &probe).await.is_some(),
        "written to the primary the Sentinels name, not to the restarted server"
    );
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// A waiter of a backend whose release subscriber was subscribed on the old primary is woken
/// by a release on the new one: it waits a moment after the release, not the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_on_release_after_a_failover() {
    let group = SentinelGroup::start().await;
    let holder = RedisBackend::connect(&group.url()).await.unwrap();
    let waiter = RedisBackend::connect(&group.url()).await.unwrap();
    let options = LockOptions::builder()
        .ttl(TTL)
        .retry(RetryPolicy::wait_for(Duration::from_secs(25)))
        .build()
        .unwrap();

    // Before the failover: the waiter's subscriber is running, on the old primary.
    let warm = unique("warm");
    let lease = acquired(&holder, &warm, TTL).await;
    let waiting = tokio::spawn({
        let (waiter, warm, options) = (waiter.clone(), warm.clone(), options.clone());
        async move { syncguard::acquire(&waiter, &warm, &options).await }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(holder.release(&lease.lock_id).await.unwrap().is_released());
    waiting
        .await
        .unwrap()
        .expect("woken before the failover")
        .release()
        .await
        .unwrap();

    group.failover().await;
    let key = unique("after-failover");
    let lease = acquired_after_failover(&holder, &key, Duration::from_secs(20)).await;
    let waiting = tokio::spawn({
        let (waiter, key, options) = (waiter.clone(), key.clone(), options.clone());
        async move { syncguard::acquire(&waiter, &key, &options).await }
    });
    // Long enough for the waiter to be refused and to wait for the release (without a notice,
    // it would look again only near the holder's ttl).
    sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    assert!(holder.release(&lease.lock_id).await.unwrap().is_released());
    let guard = waiting.await.unwrap().expect("woken after the failover");
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woken {:?} after the release (the ttl is {TTL:?})",
        released.elapsed()
    );
    guard.release().await.unwrap();
}

/// Waiting for the replica through Sentinel: the replica has each grant when it returns, and
/// after a failover the backend waits for the new primary's replica (the old primary, turned
/// into one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_replica_follows_the_failover() {
    let group = SentinelGroup::start().await;
    let backend = RedisBackend::connect_with(
        &group.url(),
        RedisConfig::new()
            .with_operation_timeout(Duration::from_secs(3))
            .with_wait_for_replicas(1, Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let primary = group.primary_port().await;
    let key = unique("waited");
    let lease = acquired(&backend, &key, TTL).await;
    assert!(
        stored_on(group.other_than(primary), &backend, &key)
            .await
            .is_some_and(|stored| stored.contains(&lease.lock_id.to_string())),
        "the replica has the grant the moment it returned"
    );

    let new_primary = group.failover().await;
    let key = unique("waited-after");
    // The old primary needs a moment to follow the new one as its replica.
    let lease_after = acquired_after_failover(&backend, &key, Duration::from_secs(30)).await;
    assert!(
        stored_on(group.other_than(new_primary), &backend, &key)
            .await
            .is_some_and(|stored| stored.contains(&lease_after.lock_id.to_string())),
        "the new primary's replica has the grant the moment it returned"
    );
}
