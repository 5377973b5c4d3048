// The conformance suite's tests hold the cluster connection's futures several layers deep.
#![recursion_limit = "256"]
//! The Redis backend on a Redis Cluster.

mod batching;
mod conformance;
mod connection;

use syncguard::redis::RedisBackend;

/// The `redis-cluster://` URL of the shared cluster `bash scripts/test-all.sh` starts.
pub(crate) fn cluster_url() -> String {
    std::env::var("SYNCGUARD_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        panic!(
            "SYNCGUARD_TEST_REDIS_CLUSTER_URL is not set: run `bash scripts/test-all.sh`, which \
             installs redis-server and starts a 3-primary, 3-replica cluster, or \
             `bash scripts/with-services.sh cargo test ...`"
        )
    })
}

/// A backend on the shared cluster, with the default configuration.
pub(crate) async fn cluster_backend() -> RedisBackend {
    RedisBackend::connect(&cluster_url())
        .await
        .expect("connect to the cluster")
}

/// The seed nodes of the shared cluster, as plain `redis://` URLs.
pub(crate) fn seed_nodes() -> Vec<String> {
    let url = cluster_url();
    let (_, nodes) = url.split_once("://").expect("a URL");
    nodes
        .trim_end_matches('/')
        .split(',')
        .map(|node| format!("redis://{node}"))
        .collect()
}

/// A key of its own for each test run.
pub(crate) fn unique(label: &str) -> String {
    format!("{label}:{}", syncguard::LockId::generate())
}
