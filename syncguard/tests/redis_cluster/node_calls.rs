//! Node calls on a private cluster: concurrent operations on locks in many slots go out one
//! call per primary (counted by the primaries' `INFO commandstats`), and after a slot moved
//! behind the backend's back, the operations a node no longer serves are refused there
//! unrun, sent again to the slot's new primary and succeed; the backend's map then follows.
//! While a slot is half-migrated, a node call never grants on the importing node a lock that
//! still lives on the source.

use std::sync::Arc;
use std::time::Duration;

use syncguard::LockId;
use syncguard::backend::LockBackend;
use syncguard::redis::{RedisBackend, RedisConfig};

use crate::cluster::{Node, RedisCluster};

const TTL: Duration = Duration::from_secs(30);
/// Locks held at once: enough that each batch holds locks of every primary.
const KEYS: usize = 240;

/// Calls of the batch function, and the commands that it ran on keys their node did not serve
/// (`rejected_calls` of the commands but FCALL, whose own are redirections), summed over
/// `nodes`.
async fn calls_and_rejections(cluster: &RedisCluster, nodes: &[Node]) -> (u64, u64) {
    let (mut calls, mut rejected) = (0, 0);
    for &node in nodes {
        let stats: String = cluster
            .query(node, redis::cmd("INFO").arg("commandstats"))
            .await
            .unwrap();
        for line in stats.lines() {
            let field = |name: &str| {
                line.split(',')
                    .find_map(|part| part.split_once(name).map(|(_, n)| n.to_owned()))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("cmdstat_fcall:") {
                calls += field("calls=");
            } else {
                rejected += field("rejected_calls=");
            }
        }
    }
    (calls, rejected)
}

async fn reset_stats(cluster: &RedisCluster, nodes: &[Node]) {
    for &node in nodes {
        let _: () = cluster
            .query(node, redis::cmd("CONFIG").arg("RESETSTAT"))
            .await
            .unwrap();
    }
}

/// Extends every lock at once; each must still be held.
async fn extend_all(backend: &Arc<RedisBackend>, locks: &[(String, LockId)]) {
    let tasks: Vec<_> = locks
        .iter()
        .map(|(key, lock_id)| {
            let backend = Arc::clone(backend);
            let (key, lock_id) = (key.clone(), lock_id.clone());
            tokio::spawn(async move {
                let extended = backend.extend(&lock_id, TTL).await;
                match extended {
                    Ok(extended) if extended.expires_at_ms().is_some() => Ok(()),
                    other => Err(format!("extend {key}: {other:?}")),
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for task in tasks {
        if let Err(failure) = task.await.unwrap() {
            failures.push(failure);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_go_one_call_per_node_and_follow_a_moved_slot() {
    let cluster = RedisCluster::start(3, 0).await;
    let primaries = cluster.primaries().await;
    let config = RedisConfig::new().with_operation_timeout(Duration::from_secs(5));
    let backend = Arc::new(
        RedisBackend::connect_with(&cluster.url(), config)
            .await
            .unwrap(),
    );
    // The backend reads the slot map on its first batches.
    let _ = backend.acquire("warm-up:a", TTL).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Many locks at once: one call per primary and batch, not one per lock.
    reset_stats(&cluster, &primaries).await;
    let run = LockId::generate();
    let acquires: Vec<_> = (0..KEYS)
        .map(|n| {
            let backend = Arc::clone(&backend);
            let key = format!("node-calls:{run}:{n}");
            tokio::spawn(async move {
                let lease = backend.acquire(&key, TTL).await.unwrap().lease();
                (key, lease.expect("a fresh key is free").lock_id)
            })
        })
        .collect();
    let mut locks = Vec::new();
    for task in acquires {
        locks.push(task.await.unwrap());
    }
    extend_all(&backend, &locks).await;
    let (calls, rejected) = calls_and_rejections(&cluster, &primaries).await;
    let operations = 2 * KEYS as u64;
    // One call per lock would be `operations` calls (and more); per node, a few per batch.
    assert!(
        calls * 2 <= operations,
        "{calls} calls for {operations} operations: batches were not sent per node"
    );
    assert_eq!(rejected, 0, "a fresh map sends nothing to the wrong node");

    // A slot with a held lock moves to another primary behind the backend's back: the node
    // the map names refuses its operations unrun, they are sent again to the new primary.
    // One from the middle: the first extend of a round goes alone, routed by its own key.
    let (moved_key, moved_id) = locks[KEYS / 2].clone();
    let slot = cluster
        .slot_of(&backend.lock_key(&moved_key).unwrap())
        .await;
    let source = cluster.owner_of_slot(slot).await;
    let target = *primaries.iter().find(|node| **node != source).unwrap();
    cluster.migrate_slot(slot, target).await;
    reset_stats(&cluster, &primaries).await;
    extend_all(&backend, &locks).await;
    let (_, rejected) = calls_and_rejections(&cluster, &primaries).await;
    assert!(
        rejected > 0,
        "the operations of the moved slot went to its old primary first"
    );
    let found = backend
        .lookup(syncguard::backend::Lookup::LockId(&moved_id))
        .await
        .unwrap();
    assert!(found.is_some(), "the moved lock is held on its new primary");

    // The map was read again: the next round goes straight to the slot's new primary.
    tokio::time::sleep(Duration::from_millis(300)).await;
    reset_stats(&cluster, &primaries).await;
    extend_all(&backend, &locks).await;
    let (_, rejected) = calls_and_rejections(&cluster, &primaries).await;
    assert_eq!(rejected, 0, "the map follows the moved slot");

    let releases: Vec<_> = locks
        .into_iter()
        .map(|(key, lock_id)| {
            let backend = Arc::clone(&backend);
            tokio::spawn(async move {
                let released = backend.release(&lock_id).await.unwrap();
                assert!(released.is_released(), "{key} released");
            })
        })
        .collect();
    for task in releases {
        task.await.unwrap();
    }
}

/// Two keys whose locks share a hash slot, found among fresh keys by `CLUSTER KEYSLOT`.
async fn two_keys_of_one_slot(cluster: &RedisCluster, backend: &RedisBackend) -> (String, String) {
    let run = LockId::generate();
    let keys: Vec<String> = (0..20_000).map(|n| format!("pair:{run}:{n}")).collect();
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(backend.lock_key(key).unwrap());
    }
    let node = cluster.primaries().await[0];
    let slots: Vec<u16> = pipe
        .query_async(&mut cluster.connect(node).await)
        .await
        .unwrap();
    let mut first_of_slot = std::collections::HashMap::new();
    for (key, slot) in keys.into_iter().zip(slots) {
        if let Some(first) = first_of_slot.insert(slot, key.clone()) {
            return (first, key);
        }
    }
    panic!("no two of 20,000 keys share a slot");
}

/// While a slot is being migrated, a node call that holds an acquire of a key that has left
/// the source (so that a call declaring it would be sent on to the target with `ASK`) and an
/// acquire of a held key still on the source never grants the held key: the call runs on the
/// source only, and the first acquire alone is sent on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_call_never_takes_a_held_lock_of_a_slot_being_migrated() {
    let cluster = RedisCluster::start(3, 0).await;
    let config = RedisConfig::new().with_operation_timeout(Duration::from_secs(5));
    let holder = RedisBackend::connect_with(&cluster.url(), config.clone())
        .await
        .unwrap();
    let rival = Arc::new(
        RedisBackend::connect_with(&cluster.url(), config)
            .await
            .unwrap(),
    );
    let (away, held) = two_keys_of_one_slot(&cluster, &holder).await;
    let lease = holder
        .acquire(&held, TTL)
        .await
        .unwrap()
        .lease()
        .expect("a fresh key is free");
    let slot = cluster.slot_of(&holder.lock_key(&held).unwrap()).await;
    let source = cluster.owner_of_slot(slot).await;
    let primaries = cluster.primaries().await;
    let target = *primaries.iter().find(|node| **node != source).unwrap();
    // The rival's map knows the slot's primary (its first batches read it).
    let _ = rival.acquire("warm-up:a", TTL).await.unwrap();
    let _ = tokio::join!(
        rival.acquire("warm-up:b", TTL),
        rival.acquire("warm-up:c", TTL)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    let migration = cluster.begin_migration(slot, target).await;
    let mut granted_away = 0;
    for _ in 0..10 {
        // Batched: the key not on the source first, the held key after it.
        let attempts: Vec<_> = [&away, &held, &away, &held, &away, &held]
            .into_iter()
            .map(|key| {
                let rival = Arc::clone(&rival);
                let key = key.clone();
                tokio::spawn(async move { (rival.acquire(&key, TTL).await, key) })
            })
            .collect();
        for attempt in attempts {
            let (outcome, key) = attempt.await.unwrap();
            match outcome {
                Ok(syncguard::backend::AcquireOutcome::Acquired(_)) => {
                    assert_ne!(key, held, "a held lock was granted on the importing node");
                    granted_away += 1;
                }
                Ok(_) => {}
                // Sent on while the slot moves: a new lock's two keys are refused by the
                // target (TRYAGAIN) until the migration ends; refused, not granted.
                Err(error) => assert!(error.is_retryable(), "{key}: {error}"),
            }
        }
    }
    assert!(
        granted_away <= 1,
        "the free key granted {granted_away} times"
    );
    migration.finish().await;
    let found = rival
        .lookup(syncguard::backend::Lookup::LockId(&lease.lock_id))
        .await
        .unwrap();
    assert_eq!(found.expect("still held").fence, lease.fence);
}
