//! The batch library and the scripts on a cluster: loaded on every primary when the backend
//! connects, and loaded again (on all of them) when a call finds them gone, as on a primary
//! that never had them.

use std::time::Duration;

use redis::Value;
use syncguard::backend::{LockBackend, Lookup};

use crate::urls::redis_cluster_nodes;
use crate::{cluster_backend, unique};

const TTL: Duration = Duration::from_secs(30);

/// The nodes of the shared cluster that are primaries now.
async fn primaries() -> Vec<redis::aio::MultiplexedConnection> {
    let mut primaries = Vec::new();
    for node in redis_cluster_nodes() {
        let mut conn = redis::Client::open(format!("redis://{node}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
        if role.first() == Some(&Value::BulkString(b"master".to_vec())) {
            primaries.push(conn);
        }
    }
    assert_eq!(primaries.len(), 3, "the shared cluster has 3 primaries");
    primaries
}

/// Whether the node has a syncguard batch library.
async fn has_library(conn: &mut redis::aio::MultiplexedConnection) -> bool {
    let list: Vec<Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("syncguard_*")
        .query_async(conn)
        .await
        .unwrap();
    !list.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_functions_and_scripts_are_loaded_again_on_every_primary() {
    let backend = cluster_backend().await;
    let mut primaries = primaries().await;
    for primary in &mut primaries {
        assert!(
            has_library(primary).await,
            "loaded when the backend connected"
        );
    }
    // Every primary loses both (a node that never had them looks the same); the flush
    // replicates to the replicas.
    for primary in &mut primaries {
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(primary)
            .await
            .unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(primary)
            .await
            .unwrap();
        assert!(!has_library(primary).await);
    }
    // Keys on every primary (30 keys miss one of three with a chance of 3 in 10^5): every
    // operation succeeds, the lookups by EVAL after NOSCRIPT.
    let run = unique("flushed");
    for n in 0..30 {
        let key = format!("{run}:{n}");
        let lease = backend
            .acquire(&key, TTL)
            .await
            .unwrap_or_else(|error| panic!("acquire {key}: {error}"))
            .lease()
            .expect("free");
        assert!(backend.is_locked(&key).await.unwrap());
        let found = backend
            .lookup(Lookup::LockId(&lease.lock_id))
            .await
            .unwrap();
        assert!(found.is_some(), "{key}");
        let extended = backend.extend(&lease.lock_id, TTL).await.unwrap();
        assert!(extended.expires_at_ms().is_some(), "{key}");
        assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
    }
    for primary in &mut primaries {
        assert!(has_library(primary).await, "loaded again on every primary");
    }
}
