//! A lock held while its slot moves to another primary (`CLUSTER SETSLOT` and `MIGRATE`) and
//! while its primary fails over stays held, extendable and releasable by its lock id, and
//! exclusive; fences go on from where they were.

use std::time::Duration;

use syncguard::backend::{AcquireOutcome, LockBackend, Lookup};
use syncguard::redis::{RedisBackend, RedisConfig};

use crate::cluster::RedisCluster;

const TTL: Duration = Duration::from_secs(30);

fn contended(outcome: &AcquireOutcome) -> bool {
    matches!(outcome, AcquireOutcome::Contended(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_outlives_the_migration_and_the_failover_of_its_slot() {
    let cluster = RedisCluster::start(3, 1).await;
    // Timeouts long enough for a call that meets TRYAGAIN to be sent again until the
    // migration ends.
    let config = RedisConfig::new().with_operation_timeout(Duration::from_secs(5));
    let holder = RedisBackend::connect_with(&cluster.url(), config.clone())
        .await
        .unwrap();
    let other = RedisBackend::connect_with(&cluster.url(), config)
        .await
        .unwrap();
    let key = format!("moving:{}", syncguard::LockId::generate());
    let lease = holder
        .acquire(&key, TTL)
        .await
        .unwrap()
        .lease()
        .expect("free");
    let lock_key = holder.lock_key(&key).unwrap();
    let fence_key = holder.fence_key(&key).unwrap();
    let slot = cluster.slot_of(&lock_key).await;
    let source = cluster.owner_of_slot(slot).await;
    let target = cluster
        .primaries()
        .await
        .into_iter()
        .find(|node| *node != source)
        .unwrap();

    // Half-way: the lock key is on the target, the fence counter still on the source. The
    // holder's extend follows the ASK to the lock; a rival's acquire (which needs both keys)
    // is answered TRYAGAIN until the migration ends, and never granted.
    let migration = cluster.begin_migration(slot, target).await;
    migration.move_key(&lock_key).await;
    let extended = holder.extend(&lease.lock_id, TTL).await.unwrap();
    assert!(extended.expires_at_ms().is_some(), "extended half-way");
    let rival = tokio::spawn({
        let other = other.clone();
        let key = key.clone();
        async move { other.acquire(&key, TTL).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    migration.move_key(&fence_key).await;
    migration.finish().await;
    match rival.await.unwrap() {
        Ok(outcome) => assert!(contended(&outcome), "granted a held lock: {outcome:?}"),
        // Or it ran out of tries while the slot was moving: refused, not granted.
        Err(error) => assert!(error.is_retryable(), "{error}"),
    }
    assert_eq!(cluster.owner_of_slot(slot).await, target);

    // Moved: found by lock id from another backend, still exclusive.
    let found = other.lookup(Lookup::LockId(&lease.lock_id)).await.unwrap();
    assert_eq!(found.expect("held after the move").fence, lease.fence);
    assert!(contended(&other.acquire(&key, TTL).await.unwrap()));

    // Failed over: the replica of the target serves it now, with the lock.
    let replica = cluster.replicas_of(target).await[0];
    cluster.failover(replica).await;
    let extended = holder.extend(&lease.lock_id, TTL).await.unwrap();
    assert!(
        extended.expires_at_ms().is_some(),
        "extended after the failover"
    );
    assert!(contended(&other.acquire(&key, TTL).await.unwrap()));
    assert!(holder.release(&lease.lock_id).await.unwrap().is_released());

    // The counter moved with the lock: the next fence follows the first.
    let next = other
        .acquire(&key, TTL)
        .await
        .unwrap()
        .lease()
        .expect("free after the release");
    assert!(
        next.fence > lease.fence,
        "{} then {}",
        lease.fence,
        next.fence
    );
    assert!(other.release(&next.lock_id).await.unwrap().is_released());
}
