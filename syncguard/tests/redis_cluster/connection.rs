//! Reaching a cluster: `redis-cluster://` URLs and their refusals before any I/O, a cluster
//! connection of the user's own, and a plain `redis://` URL to one node of a cluster, which
//! fails with a message that says what to use instead.

use std::time::Duration;

use redis::cluster::ClusterClient;
use syncguard::backend::LockBackend;
use syncguard::redis::{ConnectionMode, RedisBackend, RedisConfig, RedisLayout};
use syncguard::{ErrorCode, LockOptions};

use crate::{cluster_backend, seed_nodes, unique};

/// A cluster URL nobody listens on: a refusal that comes back as `InvalidArgument` (not as a
/// connection failure) was made before any I/O.
const NOWHERE: &str = "redis-cluster://127.0.0.1:1,127.0.0.1:2";

#[tokio::test]
async fn bad_cluster_urls_and_settings_are_refused_before_any_io() {
    let cases = [
        (
            NOWHERE,
            RedisConfig::new().with_layout(RedisLayout::Reference),
            "with_layout",
        ),
        (
            NOWHERE,
            RedisConfig::new().with_connection_mode(ConnectionMode::Pool { max_size: 4 }),
            "with_connection_mode",
        ),
        (
            NOWHERE,
            RedisConfig::new().with_reconnect_retries(5),
            "with_reconnect_retries",
        ),
        (
            NOWHERE,
            RedisConfig::new().with_wait_for_replicas(1, Duration::from_millis(100)),
            "with_wait_for_replicas",
        ),
        ("redis-cluster://", RedisConfig::new(), "redis-cluster://"),
        (
            "redis-cluster://127.0.0.1:1,,127.0.0.1:2",
            RedisConfig::new(),
            "empty node",
        ),
        (
            "redis-cluster://127.0.0.1:1/3",
            RedisConfig::new(),
            "database 0",
        ),
        (
            "redis-cluster://127.0.0.1:1",
            RedisConfig::new().with_prefix("{pinned}"),
            "prefix",
        ),
    ];
    for (url, config, named) in cases {
        let error = RedisBackend::connect_with(url, config).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{url}: {error}");
        assert!(error.to_string().contains(named), "{url}: {error}");
    }
    let unreachable = RedisBackend::connect_with(
        NOWHERE,
        RedisConfig::new().with_connect_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            unreachable.code(),
            ErrorCode::ServiceUnavailable | ErrorCode::NetworkTimeout
        ),
        "{unreachable}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_url_uses_the_cluster_layout() {
    let backend = cluster_backend().await;
    assert_eq!(backend.layout(), RedisLayout::Cluster);
    let key = unique("url");
    let guard = syncguard::acquire(&backend, &key, &LockOptions::default())
        .await
        .unwrap();
    assert_eq!(
        backend.lock_key_of(guard.lock_id()),
        Some(backend.lock_key(&key).unwrap())
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connection_of_yours_runs_the_cluster_layout() {
    let client = ClusterClient::new(seed_nodes()).unwrap();
    let connection = client.get_async_connection().await.unwrap();
    let refused = RedisBackend::new(
        connection.clone(),
        RedisConfig::new().with_layout(RedisLayout::Reference),
    )
    .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InvalidArgument);
    assert!(refused.to_string().contains("with_layout"), "{refused}");

    let backend = RedisBackend::new(connection, RedisConfig::new()).unwrap();
    assert_eq!(backend.layout(), RedisLayout::Cluster);
    let key = unique("yours");
    let lease = backend
        .acquire(&key, Duration::from_secs(10))
        .await
        .unwrap()
        .lease()
        .expect("free");
    assert!(backend.is_locked(&key).await.unwrap());
    assert!(backend.release(&lease.lock_id).await.unwrap().is_released());
}

/// `redis://` to one node of a cluster: the reference layout's keys span slots, and the node
/// refuses them; the error says to use a cluster URL (it said "unexpected Redis error").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_url_to_a_cluster_node_says_to_use_a_cluster_url() {
    let node = seed_nodes().remove(0);
    let backend = RedisBackend::connect(&node).await.unwrap();
    let mut messages = Vec::new();
    for n in 0..8 {
        let error = backend
            .acquire(&unique(&format!("plain-{n}")), Duration::from_secs(10))
            .await
            .unwrap_err();
        messages.push(error.to_string());
    }
    assert!(
        messages
            .iter()
            .all(|message| message.contains("redis-cluster://")),
        "{messages:#?}"
    );
}
